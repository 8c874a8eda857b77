//! How many members a pool should hold: what the creates of the recent past would have needed.
//!
//! A member takes a while to make (a restore and a warm-up, ~0.3 s under TCG, longer when the
//! CPUs are busy). The creates that arrive while one is being made can only be served by
//! members that are ready already, so a pool wants at least as many as the most creates seen
//! within one make time, plus one for the create that comes next; at a steady rate it also
//! wants the members that rate consumes during a make. Both come from the takes of the last
//! window (a minute by default): a burst raises the pool for that long, and a pool nobody uses
//! shrinks back to its floor once the window has passed.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Takes remembered per pool at most (a window at a high rate keeps the newest).
const MAX_TAKES: usize = 4096;

/// Weight of a new sample in the moving averages of make and restore times.
const EWMA_WEIGHT: f64 = 0.25;

/// What a member is assumed to take to make before one was measured.
const INITIAL_MAKE: Duration = Duration::from_millis(300);

/// The shortest span the burst measure looks at: takes closer together than this are one
/// burst even when members are made faster.
const MIN_SPAN: Duration = Duration::from_millis(100);

/// A pool's recent demand and how fast its members are made.
#[derive(Debug, Default)]
pub(crate) struct Demand {
    /// When creates asked the pool for a member (served or not), oldest first.
    takes: VecDeque<Instant>,
    /// Moving average of the time to make a member.
    make: Option<Duration>,
    /// Moving average of a create's restore when the pool had nothing to give.
    cold: Option<Duration>,
}

fn ewma(old: Option<Duration>, sample: Duration) -> Duration {
    match old {
        None => sample,
        Some(o) => o.mul_f64(1.0 - EWMA_WEIGHT) + sample.mul_f64(EWMA_WEIGHT),
    }
}

impl Demand {
    /// A create asked for a member at `now`.
    pub fn take(&mut self, now: Instant) {
        if self.takes.len() == MAX_TAKES {
            self.takes.pop_front();
        }
        self.takes.push_back(now);
    }

    /// A member was made in `took`.
    pub fn made(&mut self, took: Duration) {
        self.make = Some(ewma(self.make, took));
    }

    /// A create found nothing to take and restored in `took`.
    pub fn restored(&mut self, took: Duration) {
        self.cold = Some(ewma(self.cold, took));
    }

    /// The expected time to make a member.
    pub fn make_time(&self) -> Duration {
        self.make.unwrap_or(INITIAL_MAKE)
    }

    /// The expected time of a restore from scratch (a member's make time until one was seen).
    pub fn restore_time(&self) -> Duration {
        self.cold.unwrap_or_else(|| self.make_time())
    }

    /// Whether a create asked within `window` of `now`.
    pub fn is_recent(&mut self, now: Instant, window: Duration) -> bool {
        self.forget(now, window);
        !self.takes.is_empty()
    }

    fn forget(&mut self, now: Instant, window: Duration) {
        while self
            .takes
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) > window)
        {
            self.takes.pop_front();
        }
    }

    /// Members the takes of the last `window` call for (zero without takes in it).
    pub fn wanted(&mut self, now: Instant, window: Duration) -> usize {
        self.forget(now, window);
        if self.takes.is_empty() {
            return 0;
        }
        let span = self.make_time().max(MIN_SPAN);
        // The most takes within any one make time (two pointers over the sorted instants).
        let (mut peak, mut lo) = (0, 0);
        for hi in 0..self.takes.len() {
            while self.takes[hi].duration_since(self.takes[lo]) > span {
                lo += 1;
            }
            peak = peak.max(hi - lo + 1);
        }
        // At the window's mean rate, the members consumed during one make.
        let rate = self.takes.len() as f64 / window.as_secs_f64().max(1.0);
        let steady = (rate * span.as_secs_f64()).ceil() as usize;
        peak.max(steady) + 1
    }
}

/// A pool's size: what demand calls for, at least `floor`, at most `ceiling` (which never
/// goes under the floor: the floor is the operator's own number).
pub(crate) fn target(floor: usize, ceiling: usize, wanted: usize) -> usize {
    wanted.min(ceiling).max(floor)
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Duration = Duration::from_secs(60);

    fn at(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    #[test]
    fn no_takes_want_nothing() {
        let mut d = Demand::default();
        assert_eq!(d.wanted(Instant::now(), WINDOW), 0);
    }

    #[test]
    fn a_burst_wants_one_member_per_create_and_one_more() {
        let t0 = Instant::now();
        let mut d = Demand::default();
        d.made(Duration::from_millis(300));
        for i in 0..20 {
            d.take(at(t0, i * 5));
        }
        assert_eq!(d.wanted(at(t0, 200), WINDOW), 21);
        // Clamped by the ceiling, never under the floor.
        assert_eq!(target(2, 16, d.wanted(at(t0, 200), WINDOW)), 16);
        assert_eq!(target(2, 16, 0), 2);
        assert_eq!(target(4, 2, 21), 4);
    }

    #[test]
    fn a_steady_rate_wants_what_one_make_time_consumes() {
        let t0 = Instant::now();
        let mut d = Demand::default();
        d.made(Duration::from_millis(600));
        // Two a second, evenly: one or two within any 600 ms.
        for i in 0..120 {
            d.take(at(t0, i * 500));
        }
        let now = at(t0, 60_000);
        assert_eq!(d.wanted(now, WINDOW), 3);
        // Slower makes want more for the same rate.
        d.made(Duration::from_secs(10));
        d.made(Duration::from_secs(10));
        d.made(Duration::from_secs(10));
        let w = d.wanted(now, WINDOW);
        assert!(w > 3, "{w}");
    }

    #[test]
    fn demand_is_forgotten_after_the_window() {
        let t0 = Instant::now();
        let mut d = Demand::default();
        for i in 0..10 {
            d.take(at(t0, i));
        }
        assert!(d.wanted(at(t0, 1_000), WINDOW) > 10);
        assert!(d.is_recent(at(t0, 59_000), WINDOW));
        assert_eq!(d.wanted(at(t0, 61_000), WINDOW), 0);
        assert!(!d.is_recent(at(t0, 61_000), WINDOW));
    }

    #[test]
    fn make_and_restore_times_are_moving_averages() {
        let mut d = Demand::default();
        assert_eq!(d.make_time(), INITIAL_MAKE);
        d.made(Duration::from_millis(400));
        assert_eq!(d.make_time(), Duration::from_millis(400));
        assert_eq!(d.restore_time(), Duration::from_millis(400));
        d.made(Duration::from_millis(800));
        assert_eq!(d.make_time(), Duration::from_millis(500));
        d.restored(Duration::from_millis(200));
        assert_eq!(d.restore_time(), Duration::from_millis(200));
    }

    #[test]
    fn memory_of_takes_is_bounded() {
        let t0 = Instant::now();
        let mut d = Demand::default();
        for i in 0..(MAX_TAKES as u64 * 2) {
            d.take(at(t0, i));
        }
        assert_eq!(d.takes.len(), MAX_TAKES);
    }
}
