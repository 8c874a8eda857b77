//! Templates being prepared: a stock template whose root image is still being built on this
//! node (the `desktop` image of `space up`, built in the background on the first start). A
//! request for such a template gets [`crate::NodeError::TemplateNotReady`] with how far the
//! preparation is, instead of "no template" or a wait.

use std::time::{Duration, Instant};

use super::Node;

/// How far one preparation is.
#[derive(Debug, Clone)]
pub struct Preparing {
    /// When it started.
    pub since: Instant,
    /// What it does now, for people (the last progress line of the build).
    pub step: String,
    /// About how long a cold preparation takes, for the message.
    pub expected: Duration,
    /// Why it failed, once it has.
    pub failed: Option<String>,
}

impl Preparing {
    /// A preparation starting now that takes about `expected`.
    pub fn new(step: impl Into<String>, expected: Duration) -> Preparing {
        Preparing {
            since: Instant::now(),
            step: step.into(),
            expected,
            failed: None,
        }
    }

    /// What a request for template `name` is told.
    pub fn describe(&self, name: &str) -> String {
        let secs = self.since.elapsed().as_secs();
        match &self.failed {
            Some(why) => format!(
                "template {name} could not be prepared on this node: {why} (the next start of \
                 the node tries again)"
            ),
            None => format!(
                "template {name} is being prepared on this node: {} ({} min {} s so far; a \
                 first preparation takes about {} min); try again then",
                self.step,
                secs / 60,
                secs % 60,
                self.expected.as_secs().div_ceil(60)
            ),
        }
    }
}

impl Node {
    /// Records that template `name` is being prepared (or how far it is now).
    pub fn set_preparing(&self, name: &str, state: Preparing) {
        self.inner
            .preparing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_owned(), state);
    }

    /// Updates the step of a preparation under way.
    pub fn preparing_step(&self, name: &str, step: impl Into<String>) {
        let mut all = self
            .inner
            .preparing
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(p) = all.get_mut(name) {
            p.step = step.into();
        }
    }

    /// Records that the preparation of `name` failed, with why.
    pub fn preparing_failed(&self, name: &str, why: impl Into<String>) {
        let mut all = self
            .inner
            .preparing
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(p) = all.get_mut(name) {
            p.failed = Some(why.into());
        }
    }

    /// Ends the preparation of `name` (its template exists now).
    pub fn prepared(&self, name: &str) {
        self.inner
            .preparing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
    }

    /// The preparation of `name`, if one is recorded.
    pub fn preparation(&self, name: &str) -> Option<Preparing> {
        self.inner
            .preparing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_says_how_far_and_how_long() {
        let mut p = Preparing::new("installing packages", Duration::from_secs(450));
        let m = p.describe("desktop");
        assert!(
            m.contains("being prepared") && m.contains("installing packages"),
            "{m}"
        );
        assert!(m.contains("about 8 min"), "{m}");
        p.failed = Some("apt-get failed".into());
        let m = p.describe("desktop");
        assert!(
            m.contains("could not be prepared") && m.contains("apt-get failed"),
            "{m}"
        );
    }
}
