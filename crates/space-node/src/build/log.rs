//! A build's log: what its steps print, kept in memory while the build runs and for a while
//! after, read from an offset so a follower can poll it and see every byte once.

use std::sync::Mutex;

pub use space_node_api::template::LogChunk;

/// The most of a log kept; older bytes are dropped (a reader is told how many).
pub const MAX_LOG_BYTES: usize = 4 << 20;

#[derive(Default)]
struct Inner {
    text: String,
    /// Bytes dropped from the front.
    dropped: u64,
    done: bool,
}

/// A build's log.
#[derive(Default)]
pub struct BuildLog {
    inner: Mutex<Inner>,
    changed: tokio::sync::Notify,
}

impl std::fmt::Debug for BuildLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BuildLog").finish_non_exhaustive()
    }
}

impl BuildLog {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends text (a line gets its newline here when it lacks one).
    pub fn line(&self, text: impl AsRef<str>) {
        let text = text.as_ref();
        let mut s = text.to_owned();
        if !s.ends_with('\n') {
            s.push('\n');
        }
        self.write(&s);
    }

    /// Appends raw output.
    pub fn write(&self, text: &str) {
        {
            let mut g = self.lock();
            if g.done {
                return;
            }
            g.text.push_str(text);
            if g.text.len() > MAX_LOG_BYTES {
                let mut cut = g.text.len() - MAX_LOG_BYTES / 2;
                while !g.text.is_char_boundary(cut) {
                    cut += 1;
                }
                g.text.drain(..cut);
                g.dropped += cut as u64;
            }
        }
        self.changed.notify_waiters();
    }

    /// Marks the log complete.
    pub fn finish(&self) {
        self.lock().done = true;
        self.changed.notify_waiters();
    }

    /// Everything from byte `from` on.
    pub fn read(&self, from: u64) -> LogChunk {
        let g = self.lock();
        let end = g.dropped + g.text.len() as u64;
        let mut at = from.clamp(g.dropped, end) - g.dropped;
        while !g.text.is_char_boundary(at as usize) {
            at += 1;
        }
        LogChunk {
            text: g.text[at as usize..].to_owned(),
            next: end,
            done: g.done,
        }
    }

    /// Waits until the log has bytes past `from` or is complete, at most `limit`.
    pub async fn wait(&self, from: u64, limit: std::time::Duration) {
        let changed = self.changed.notified();
        {
            let g = self.lock();
            if g.done || g.dropped + g.text.len() as u64 > from {
                return;
            }
        }
        let _ = tokio::time::timeout(limit, changed).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readers_see_every_byte_once_and_the_end() {
        let log = BuildLog::default();
        log.line("step 1");
        let a = log.read(0);
        assert_eq!((a.text.as_str(), a.next, a.done), ("step 1\n", 7, false));
        log.write("out");
        let b = log.read(a.next);
        assert_eq!(b.text, "out");
        log.finish();
        log.line("ignored");
        let c = log.read(b.next);
        assert_eq!((c.text.as_str(), c.done), ("", true));
        // A reader past the end or before the start is clamped.
        assert_eq!(log.read(1000).text, "");
        assert_eq!(log.read(0).text, "step 1\nout");
    }

    #[test]
    fn a_long_log_keeps_its_tail() {
        let log = BuildLog::default();
        let line = "é".repeat(1000);
        for _ in 0..(MAX_LOG_BYTES / 2000 + 10) {
            log.line(&line);
        }
        let all = log.read(0);
        assert!(all.text.len() <= MAX_LOG_BYTES);
        assert!(all.next > MAX_LOG_BYTES as u64);
        assert!(all.text.ends_with(&format!("{line}\n")));
    }
}
