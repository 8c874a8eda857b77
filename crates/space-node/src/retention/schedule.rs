//! The rolling snapshot schedule: which snapshot of a running sandbox is due now, and when
//! to ask again.

use super::*;

/// Intervals of the rolling snapshots of a running sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RollingSchedule {
    /// A disk snapshot is due this long after the last snapshot of the disk, if the disk was
    /// written since. Default 60 s.
    pub disk_interval: Duration,
    /// A full snapshot is due this long after the last one, whatever happened. Default
    /// 10 min.
    pub full_interval: Duration,
}

/// Default of [`RollingSchedule::disk_interval`].
pub const DEFAULT_DISK_INTERVAL: Duration = Duration::from_secs(60);
/// Default of [`RollingSchedule::full_interval`].
pub const DEFAULT_FULL_INTERVAL: Duration = Duration::from_secs(600);
/// Intervals shorter than this are taken as this, so a misconfiguration cannot spin.
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);

impl Default for RollingSchedule {
    fn default() -> Self {
        RollingSchedule {
            disk_interval: DEFAULT_DISK_INTERVAL,
            full_interval: DEFAULT_FULL_INTERVAL,
        }
    }
}

/// What the schedule looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScheduleInput {
    /// Now, milliseconds since the Unix epoch.
    pub now_unix_ms: u64,
    /// The last disk snapshot; `None` if none yet.
    pub last_disk_unix_ms: Option<u64>,
    /// The last full snapshot; `None` if none yet.
    pub last_full_unix_ms: Option<u64>,
    /// Whether the disk was written since the last snapshot that holds it (disk or full:
    /// a full snapshot holds the disk too, so taking one clears this).
    pub disk_changed: bool,
}

/// Which snapshot is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// Nothing now.
    None,
    /// A disk snapshot.
    Disk,
    /// A full snapshot (it holds the disk too, so it also satisfies a due disk snapshot).
    Full,
}

/// The answer of [`RollingSchedule::step`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScheduleStep {
    /// What to take now.
    pub due: Due,
    /// When to ask again: `now` if something is due (take it, then ask again with the new
    /// times), else the earliest time something can become due.
    pub next_check_unix_ms: u64,
}

impl ScheduleStep {
    /// How long to wait from `now_unix_ms` until [`ScheduleStep::next_check_unix_ms`].
    pub fn wait_from(&self, now_unix_ms: u64) -> Duration {
        Duration::from_millis(self.next_check_unix_ms.saturating_sub(now_unix_ms))
    }
}

impl RollingSchedule {
    /// What is due at `input.now_unix_ms` and when to ask again.
    ///
    /// - Full is due when there is no full snapshot yet, or the last one is
    ///   [`RollingSchedule::full_interval`] old or older.
    /// - Disk is due when the disk changed and there is no snapshot of the disk yet, or the
    ///   later of the last disk and the last full snapshot is
    ///   [`RollingSchedule::disk_interval`] old or older.
    /// - Full wins over Disk. A last time after now (the clock went back) counts as due, so
    ///   the schedule anchors again on the clock as it is.
    /// - Nothing due: ask again at the next full time or the next disk time, whichever is
    ///   first. The next disk time is `last + disk_interval` if that is still ahead, else one
    ///   `disk_interval` from now (the disk may be written at any moment; a change waits at
    ///   most one interval to be captured).
    pub fn step(&self, input: &ScheduleInput) -> ScheduleStep {
        let now = input.now_unix_ms;
        let disk_iv = ms(self.disk_interval.max(MIN_INTERVAL));
        let full_iv = ms(self.full_interval.max(MIN_INTERVAL));
        let elapsed = |last: u64, iv: u64| last > now || now - last >= iv;

        let full_due = match input.last_full_unix_ms {
            None => true,
            Some(t) => elapsed(t, full_iv),
        };
        let last_disk = match (input.last_disk_unix_ms, input.last_full_unix_ms) {
            (Some(d), Some(f)) => Some(d.max(f)),
            (d, f) => d.or(f),
        };
        let disk_due = input.disk_changed
            && match last_disk {
                None => true,
                Some(t) => elapsed(t, disk_iv),
            };

        let due = if full_due {
            Due::Full
        } else if disk_due {
            Due::Disk
        } else {
            Due::None
        };
        let next_check_unix_ms = match due {
            Due::Full | Due::Disk => now,
            Due::None => {
                // Not due, so the last full snapshot exists and is not in the future.
                let full_at = input
                    .last_full_unix_ms
                    .map_or(now, |t| t.saturating_add(full_iv));
                let disk_at = match last_disk.map(|t| t.saturating_add(disk_iv)) {
                    Some(t) if t > now => t,
                    _ => now.saturating_add(disk_iv),
                };
                full_at.min(disk_at)
            }
        };
        ScheduleStep {
            due,
            next_check_unix_ms,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::Rng;
    use super::*;

    /// 2024-05-01T00:00:00Z, a UTC midnight.
    const T0: u64 = 1_714_521_600_000;

    fn input(now: u64, disk: Option<u64>, full: Option<u64>, changed: bool) -> ScheduleInput {
        ScheduleInput {
            now_unix_ms: now,
            last_disk_unix_ms: disk,
            last_full_unix_ms: full,
            disk_changed: changed,
        }
    }

    fn step(i: ScheduleInput) -> ScheduleStep {
        RollingSchedule::default().step(&i)
    }

    const S: u64 = 1000;

    #[test]
    fn schedule_first_snapshot_is_full() {
        let now = T0;
        for changed in [false, true] {
            let s = step(input(now, None, None, changed));
            assert_eq!(s.due, Due::Full);
            assert_eq!(s.next_check_unix_ms, now);
            assert_eq!(s.wait_from(now), Duration::ZERO);
        }
        // A disk snapshot but no full one yet: full.
        assert_eq!(step(input(now, Some(now - S), None, true)).due, Due::Full);
    }

    #[test]
    fn schedule_full_every_interval_and_wins_over_disk() {
        let now = T0;
        let s = step(input(now, Some(now - 90 * S), Some(now - 600 * S), true));
        assert_eq!(s.due, Due::Full);
        let s = step(input(now, Some(now - 5 * S), Some(now - 601 * S), false));
        assert_eq!(s.due, Due::Full);
        // One millisecond early: not yet; check again exactly then (disk clean and recent).
        let s = step(input(
            now,
            Some(now - 5 * S),
            Some(now - 600 * S + 1),
            false,
        ));
        assert_eq!(s.due, Due::None);
        assert_eq!(s.next_check_unix_ms, now + 1);
    }

    #[test]
    fn schedule_disk_when_changed_and_interval_passed() {
        let now = T0;
        let s = step(input(now, Some(now - 60 * S), Some(now - 300 * S), true));
        assert_eq!(s.due, Due::Disk);
        assert_eq!(s.next_check_unix_ms, now);
        // No disk snapshot yet, a recent full one: counted from the full one.
        let s = step(input(now, None, Some(now - 60 * S), true));
        assert_eq!(s.due, Due::Disk);
        let s = step(input(now, None, Some(now - 59 * S), true));
        assert_eq!(s.due, Due::None);
        assert_eq!(s.next_check_unix_ms, now + S);
    }

    #[test]
    fn schedule_changed_but_too_soon() {
        let now = T0;
        let s = step(input(now, Some(now - 20 * S), Some(now - 300 * S), true));
        assert_eq!(s.due, Due::None);
        assert_eq!(s.next_check_unix_ms, now + 40 * S);
        assert_eq!(s.wait_from(now), Duration::from_secs(40));
    }

    #[test]
    fn schedule_full_snapshot_counts_as_a_disk_snapshot() {
        let now = T0;
        // The full snapshot 10 s ago holds the disk; the disk snapshot is older.
        let s = step(input(now, Some(now - 100 * S), Some(now - 10 * S), true));
        assert_eq!(s.due, Due::None);
        assert_eq!(s.next_check_unix_ms, now + 50 * S);
    }

    #[test]
    fn schedule_unchanged_disk_polls_every_interval() {
        let now = T0;
        // Interval long passed: a change now would be due at once; look again in 60 s.
        let s = step(input(now, Some(now - 500 * S), Some(now - 300 * S), false));
        assert_eq!(s.due, Due::None);
        assert_eq!(s.next_check_unix_ms, now + 60 * S);
        // Interval not passed: look again when it does.
        let s = step(input(now, Some(now - 15 * S), Some(now - 300 * S), false));
        assert_eq!(s.next_check_unix_ms, now + 45 * S);
    }

    #[test]
    fn schedule_next_full_can_come_first() {
        let now = T0;
        let s = step(input(now, Some(now - 10 * S), Some(now - 590 * S), true));
        assert_eq!(s.due, Due::None);
        assert_eq!(s.next_check_unix_ms, now + 10 * S);
    }

    #[test]
    fn schedule_clock_went_back() {
        let now = T0;
        // Last full snapshot after now: due, to anchor again on the clock as it is.
        let s = step(input(now, Some(now - 10 * S), Some(now + 3600 * S), false));
        assert_eq!(s.due, Due::Full);
        // Last disk snapshot after now, disk changed: disk due.
        let s = step(input(now, Some(now + 30 * S), Some(now - 10 * S), true));
        assert_eq!(s.due, Due::Disk);
        // ... not when the disk did not change.
        let s = step(input(now, Some(now + 30 * S), Some(now - 10 * S), false));
        assert_eq!(s.due, Due::None);
        assert!(s.next_check_unix_ms > now);
    }

    #[test]
    fn schedule_intervals_are_configurable_and_floored() {
        let now = T0;
        let sched = RollingSchedule {
            disk_interval: Duration::from_secs(5),
            full_interval: Duration::from_secs(3600),
        };
        let s = sched.step(&input(now, Some(now - 5 * S), Some(now - 601 * S), true));
        assert_eq!(s.due, Due::Disk);
        let zero = RollingSchedule {
            disk_interval: Duration::ZERO,
            full_interval: Duration::ZERO,
        };
        let s = zero.step(&input(now, Some(now - 1), Some(now - 1), true));
        assert_eq!(s.due, Due::None);
        assert_eq!(s.next_check_unix_ms, now - 1 + ms(MIN_INTERVAL));
    }

    /// The scheduler loop around [`RollingSchedule::step`] over three hours of random disk
    /// writes: full snapshots exactly every 10 min, disk snapshots never closer than 60 s
    /// to the previous snapshot of the disk, every write captured within 60 s, no spinning.
    #[test]
    fn schedule_drives_a_simulated_sandbox() {
        let sched = RollingSchedule::default();
        let mut rng = Rng(42);
        let start = T0;
        let end = start + 3 * 3600 * S;
        // Writes at half-second offsets, in quiet and busy stretches.
        let mut writes = Vec::new();
        let mut t = start + 500;
        while t < end {
            writes.push(t);
            t += S * if rng.chance(70) {
                rng.below(20)
            } else {
                rng.below(900)
            } + S;
        }
        let (mut last_disk, mut last_full): (Option<u64>, Option<u64>) = (None, None);
        let mut captured_until = start; // writes up to here are in a snapshot
        let mut taken: Vec<(u64, Due)> = Vec::new();
        let mut now = start;
        let mut steps = 0;
        while now < end {
            steps += 1;
            assert!(steps < 100_000, "spinning");
            let changed = writes.iter().any(|&w| w > captured_until && w <= now);
            let s = sched.step(&input(now, last_disk, last_full, changed));
            match s.due {
                Due::None => {
                    assert!(s.next_check_unix_ms > now);
                    now = s.next_check_unix_ms;
                }
                Due::Disk => {
                    last_disk = Some(now);
                    captured_until = now;
                    taken.push((now, Due::Disk));
                }
                Due::Full => {
                    last_full = Some(now);
                    captured_until = now;
                    taken.push((now, Due::Full));
                }
            }
        }
        let fulls: Vec<u64> = taken
            .iter()
            .filter(|t| t.1 == Due::Full)
            .map(|t| t.0)
            .collect();
        assert_eq!(fulls.len(), 18);
        assert!(fulls.windows(2).all(|w| w[1] - w[0] == 600 * S));
        for w in taken.windows(2) {
            if w[1].1 == Due::Disk {
                assert!(w[1].0 - w[0].0 >= 60 * S, "{w:?}");
            }
        }
        for &w in &writes {
            if let Some(&(at, _)) = taken.iter().find(|t| t.0 > w) {
                assert!(at - w <= 60 * S, "write at {w} captured at {at}");
            }
        }
    }
}
