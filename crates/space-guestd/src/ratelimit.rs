//! Rate limiting for log lines the host can trigger. Under emulation every console byte is a
//! trap into the VMM, so a host (or a bug) that provokes one error per request must not be able
//! to turn the console into the bottleneck.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Allows `burst` lines per `window`; counts what it drops and reports the count with the next
/// line it allows.
pub struct RateLimiter {
    burst: u32,
    window: Duration,
    state: Mutex<State>,
}

struct State {
    window_start: Instant,
    used: u32,
    dropped: u64,
}

impl RateLimiter {
    pub fn new(burst: u32, window: Duration) -> RateLimiter {
        RateLimiter {
            burst,
            window,
            state: Mutex::new(State {
                window_start: Instant::now(),
                used: 0,
                dropped: 0,
            }),
        }
    }

    /// `Some(dropped_since_last)` if a line may be logged now, `None` if it must be dropped.
    pub fn check(&self) -> Option<u64> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if now.duration_since(s.window_start) >= self.window {
            s.window_start = now;
            s.used = 0;
        }
        if s.used < self.burst {
            s.used += 1;
            Some(std::mem::take(&mut s.dropped))
        } else {
            s.dropped += 1;
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_within_window_and_reports_drops() {
        let rl = RateLimiter::new(2, Duration::from_millis(50));
        assert_eq!(rl.check(), Some(0));
        assert_eq!(rl.check(), Some(0));
        assert_eq!(rl.check(), None);
        assert_eq!(rl.check(), None);
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(rl.check(), Some(2));
    }
}
