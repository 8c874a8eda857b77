//! Progress notifications for calls that take a while: when the client asked for progress
//! (a `progressToken` in the request's `_meta`), one notification a second carries the
//! seconds elapsed and what the tool last said it was doing.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::model::{ProgressNotificationParam, ProgressToken};
use rmcp::{Peer, RoleServer};

/// How often a notification goes out.
const EVERY: Duration = Duration::from_secs(1);

/// What a running tool is doing, in a few words, for its next notification.
#[derive(Debug, Clone, Default)]
pub struct Status(Arc<Mutex<String>>);

impl Status {
    /// Replaces the status line.
    pub fn set(&self, line: String) {
        if let Ok(mut s) = self.0.lock() {
            *s = line;
        }
    }

    fn get(&self) -> String {
        self.0.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

/// Runs `work`, notifying `to` (a peer and its token) every second until it ends.
pub async fn reporting<F: Future>(
    to: Option<(Peer<RoleServer>, ProgressToken)>,
    tool: &str,
    status: &Status,
    work: F,
) -> F::Output {
    let Some((peer, token)) = to else {
        return work.await;
    };
    let started = Instant::now();
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + EVERY, EVERY);
    tokio::pin!(work);
    loop {
        tokio::select! {
            out = &mut work => return out,
            _ = tick.tick() => {
                let secs = started.elapsed().as_secs_f64();
                let line = status.get();
                let message = if line.is_empty() {
                    format!("{tool}: {} s", secs as u64)
                } else {
                    format!("{tool}: {line}")
                };
                let note = ProgressNotificationParam::new(token.clone(), secs).with_message(message);
                if let Err(e) = peer.notify_progress(note).await {
                    tracing::debug!(error = %e, "a progress notification was not delivered");
                }
            }
        }
    }
}
