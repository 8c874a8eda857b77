//! Snapshot retention and the rolling snapshot schedule: pure functions of their inputs.
//!
//! - [`RetentionPolicy::plan`] takes the snapshots of one sandbox and the current time and
//!   says, for each one, whether to keep or delete it and why.
//! - [`RollingSchedule::step`] takes the times of the last snapshots, whether the disk was
//!   written since, and the current time, and says which snapshot is due now and when to ask
//!   again.
//!
//! Neither reads a clock or touches a file, so the node's scheduler and pruner are thin loops
//! around them and every rule is tested on synthetic timestamps. Times are milliseconds since
//! the Unix epoch (as in [`SnapshotRecord::created_unix_ms`]); [`unix_ms`] converts a
//! [`SystemTime`]. `docs/retention.md` explains the choices.
//!
//! # Retention, in order of precedence
//!
//! Let `age = now - t`. For each snapshot, the first rule that applies decides:
//!
//! 1. **pinned** (taken on request): kept until deleted explicitly;
//! 2. **in use** (the restore point of a suspended sandbox, a fork's source while it is
//!    made): kept;
//! 3. timestamp **in the future** (`t > now`, clock skew): kept and flagged;
//! 4. the **newest** snapshot with `t <= now`, of any kind: kept;
//! 5. the newest **full** snapshot with `t <= now` of a **live** sandbox: kept (crash
//!    recovery restores it);
//! 6. `age < keep_all_for` (1 h): kept;
//! 7. `age >= max_age` (7 d): deleted;
//! 8. the **representative of its bucket**: kept. A bucket is a UTC clock hour while
//!    `age < hourly_for` (24 h), else a UTC calendar day. Its representative is its newest
//!    snapshot, of either kind (the state the bucket ended in);
//! 9. a full snapshot among the `old_full_snapshots` (2) newest full snapshots with
//!    `keep_all_for <= age < max_age`: kept;
//! 10. anything else: deleted, naming the representative of its bucket.
//!
//! Only snapshots that are not pinned, not in use and not in the future take part in rules
//! 8 and 9 ("competing" snapshots). Buckets are half-open, `[start, start + width)`; ties on
//! the timestamp are broken by the greater id.

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::ids::SnapshotId;
use crate::record::{SnapshotKind, SnapshotReason, SnapshotRecord};

const HOUR_MS: u64 = 3_600_000;
const DAY_MS: u64 = 24 * HOUR_MS;

/// Milliseconds since the Unix epoch; times before it are 0.
pub fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map(ms).unwrap_or(0)
}

/// A duration in whole milliseconds, saturating.
fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

// ---------------------------------------------------------------------------------------------
// Retention
// ---------------------------------------------------------------------------------------------

/// What retention needs to know about one snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotInfo<I> {
    /// Its id; ids are unique per sandbox (an id listed twice is one snapshot).
    pub id: I,
    /// When it was taken, milliseconds since the Unix epoch.
    pub at_unix_ms: u64,
    /// Disk only or full.
    pub kind: SnapshotKind,
    /// Taken on request: kept until deleted explicitly, whatever its age.
    pub pinned: bool,
    /// Needed by the sandbox right now (the restore point of a suspended sandbox, the source
    /// of a fork being made): kept while set.
    pub in_use: bool,
}

impl<I> SnapshotInfo<I> {
    /// A snapshot that is neither pinned nor in use.
    pub fn new(id: I, at_unix_ms: u64, kind: SnapshotKind) -> Self {
        SnapshotInfo {
            id,
            at_unix_ms,
            kind,
            pinned: false,
            in_use: false,
        }
    }

    /// Sets [`SnapshotInfo::pinned`].
    pub fn with_pinned(mut self, pinned: bool) -> Self {
        self.pinned = pinned;
        self
    }

    /// Sets [`SnapshotInfo::in_use`].
    pub fn with_in_use(mut self, in_use: bool) -> Self {
        self.in_use = in_use;
        self
    }
}

impl SnapshotInfo<SnapshotId> {
    /// From a sandbox's record of the snapshot: pinned when it was taken on request
    /// ([`SnapshotReason::Request`]); not in use (the caller sets that for the restore point).
    pub fn from_record(rec: &SnapshotRecord) -> Self {
        SnapshotInfo::new(rec.id.clone(), rec.created_unix_ms, rec.kind)
            .with_pinned(rec.reason == SnapshotReason::Request)
    }
}

/// Whether the sandbox can still run (anything but terminated): then crash recovery needs its
/// newest full snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// Running, paused, suspended or failed.
    Live,
    /// Killed; its snapshots stay for rollback into a new sandbox or inspection.
    Terminated,
}

/// How long snapshots are kept and how densely. See the module documentation for the rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetentionPolicy {
    /// Everything younger than this is kept. Default 1 hour.
    pub keep_all_for: Duration,
    /// Up to this age, one snapshot per UTC hour is kept; beyond it, one per UTC day.
    /// Default 24 hours.
    pub hourly_for: Duration,
    /// Snapshots this old or older are deleted (unless pinned, in use or the newest ones).
    /// Default 7 days.
    pub max_age: Duration,
    /// How many of the newest full snapshots older than [`RetentionPolicy::keep_all_for`] are
    /// kept besides the hourly and daily representatives. Default 2.
    pub old_full_snapshots: usize,
}

/// Default of [`RetentionPolicy::keep_all_for`].
pub const DEFAULT_KEEP_ALL_FOR: Duration = Duration::from_secs(3600);
/// Default of [`RetentionPolicy::hourly_for`].
pub const DEFAULT_HOURLY_FOR: Duration = Duration::from_secs(24 * 3600);
/// Default of [`RetentionPolicy::max_age`].
pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(7 * 24 * 3600);
/// Default of [`RetentionPolicy::old_full_snapshots`].
pub const DEFAULT_OLD_FULL_SNAPSHOTS: usize = 2;

impl Default for RetentionPolicy {
    fn default() -> Self {
        RetentionPolicy {
            keep_all_for: DEFAULT_KEEP_ALL_FOR,
            hourly_for: DEFAULT_HOURLY_FOR,
            max_age: DEFAULT_MAX_AGE,
            old_full_snapshots: DEFAULT_OLD_FULL_SNAPSHOTS,
        }
    }
}

/// The width of a thinning bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Period {
    /// A UTC clock hour.
    Hour,
    /// A UTC calendar day.
    Day,
}

impl Period {
    fn width_ms(self) -> u64 {
        match self {
            Period::Hour => HOUR_MS,
            Period::Day => DAY_MS,
        }
    }

    /// Lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            Period::Hour => "hour",
            Period::Day => "day",
        }
    }
}

/// A thinning bucket: `[start, start + width)`, aligned to the Unix epoch (so to UTC).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Bucket {
    /// Hour or day.
    pub period: Period,
    /// Its first millisecond.
    pub start_unix_ms: u64,
}

impl Bucket {
    fn of(period: Period, at_unix_ms: u64) -> Self {
        let w = period.width_ms();
        Bucket {
            period,
            start_unix_ms: at_unix_ms / w * w,
        }
    }
}

impl fmt::Display for Bucket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the {} from {}",
            self.period.as_str(),
            Utc(self.start_unix_ms)
        )
    }
}

/// Why a snapshot is kept or deleted. `by` names the snapshot kept in its place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason<I> {
    /// Kept: taken on request, kept until deleted explicitly.
    Pinned,
    /// Kept: the sandbox needs it.
    InUse,
    /// Kept: its timestamp is this far ahead of now (clock skew).
    FutureTimestamp {
        /// Milliseconds ahead.
        ahead_ms: u64,
    },
    /// Kept: the newest snapshot of the sandbox.
    Newest,
    /// Kept: the newest full snapshot of a live sandbox, for crash recovery.
    NewestFull,
    /// Kept: younger than [`RetentionPolicy::keep_all_for`].
    Recent {
        /// Its age in milliseconds.
        age_ms: u64,
    },
    /// Kept: the representative of its hourly or daily bucket.
    Representative {
        /// The bucket.
        bucket: Bucket,
    },
    /// Kept: the `rank`-th newest (1-based) full snapshot older than
    /// [`RetentionPolicy::keep_all_for`].
    RecentFull {
        /// 1 is the newest.
        rank: usize,
    },
    /// Deleted: as old as [`RetentionPolicy::max_age`] or older.
    Expired {
        /// Its age in milliseconds.
        age_ms: u64,
    },
    /// Deleted: its bucket is represented by another, newer snapshot, which is kept.
    Superseded {
        /// The bucket.
        bucket: Bucket,
        /// The representative, which is kept.
        by: I,
    },
}

impl<I> Reason<I> {
    /// Whether the snapshot is kept.
    pub fn keeps(&self) -> bool {
        !matches!(self, Reason::Expired { .. } | Reason::Superseded { .. })
    }
}

impl<I: fmt::Display> fmt::Display for Reason<I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Pinned => {
                f.write_str("pinned: taken on request, kept until deleted explicitly")
            }
            Reason::InUse => f.write_str("in use by the sandbox"),
            Reason::FutureTimestamp { ahead_ms } => {
                write!(
                    f,
                    "timestamp {} in the future (clock skew)",
                    Human(*ahead_ms)
                )
            }
            Reason::Newest => f.write_str("newest snapshot"),
            Reason::NewestFull => {
                f.write_str("newest full snapshot of a live sandbox (crash recovery)")
            }
            Reason::Recent { age_ms } => write!(f, "recent ({} old)", Human(*age_ms)),
            Reason::Representative { bucket } => write!(f, "represents {bucket}"),
            Reason::RecentFull { rank } => {
                write!(f, "full snapshot #{rank} beyond the keep-all window")
            }
            Reason::Expired { age_ms } => {
                write!(
                    f,
                    "expired ({} old, beyond the maximum age)",
                    Human(*age_ms)
                )
            }
            Reason::Superseded { bucket, by } => write!(f, "{bucket} is represented by {by}"),
        }
    }
}

/// The verdict on one snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision<I> {
    /// The snapshot.
    pub id: I,
    /// Its timestamp (the newest one given, if it was listed more than once).
    pub at_unix_ms: u64,
    /// Its kind ([`SnapshotKind::Full`] if any listing said so).
    pub kind: SnapshotKind,
    /// Keep or delete, and why.
    pub reason: Reason<I>,
    /// Its timestamp is after `now` (also set when another reason, such as pinned, keeps it).
    pub future_timestamp: bool,
    /// How many more times than once the id was listed (0 normally).
    pub duplicates: usize,
}

impl<I> Decision<I> {
    /// Whether the snapshot is kept.
    pub fn keep(&self) -> bool {
        self.reason.keeps()
    }
}

impl<I: fmt::Display> fmt::Display for Decision<I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} ({}, {}): {}",
            if self.keep() { "keep" } else { "delete" },
            self.id,
            self.kind.as_str(),
            Utc(self.at_unix_ms),
            self.reason
        )?;
        if self.future_timestamp && !matches!(self.reason, Reason::FutureTimestamp { .. }) {
            f.write_str("; timestamp in the future")?;
        }
        if self.duplicates > 0 {
            write!(f, "; listed {} times", self.duplicates + 1)?;
        }
        Ok(())
    }
}

/// The verdicts on all snapshots of one sandbox, newest first (timestamp, then id,
/// descending), one per distinct id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan<I> {
    /// One per distinct id, newest first.
    pub decisions: Vec<Decision<I>>,
}

impl<I> Plan<I> {
    /// The snapshots to keep, newest first.
    pub fn kept(&self) -> impl Iterator<Item = &Decision<I>> {
        self.decisions.iter().filter(|d| d.keep())
    }

    /// The snapshots to delete, newest first.
    pub fn deleted(&self) -> impl Iterator<Item = &Decision<I>> {
        self.decisions.iter().filter(|d| !d.keep())
    }

    /// The ids to delete, newest first.
    pub fn to_delete(&self) -> Vec<&I> {
        self.deleted().map(|d| &d.id).collect()
    }
}

/// One distinct snapshot, after merging repeated ids.
struct Entry<'a, I> {
    id: &'a I,
    at: u64,
    full: bool,
    pinned: bool,
    in_use: bool,
    duplicates: usize,
}

impl RetentionPolicy {
    /// Decides, for each snapshot of one sandbox, whether to keep or delete it at time
    /// `now_unix_ms`. Deterministic, independent of the input order. An id listed more than
    /// once is one snapshot: its newest timestamp, full if any listing is full, pinned or in
    /// use if any listing is.
    pub fn plan<I: Ord + Clone>(
        &self,
        snapshots: &[SnapshotInfo<I>],
        now_unix_ms: u64,
        liveness: Liveness,
    ) -> Plan<I> {
        // One entry per id, merged conservatively (keeping more, never less).
        let mut by_id: BTreeMap<&I, Entry<'_, I>> = BTreeMap::new();
        for s in snapshots {
            let full = s.kind == SnapshotKind::Full;
            by_id
                .entry(&s.id)
                .and_modify(|e| {
                    e.at = e.at.max(s.at_unix_ms);
                    e.full |= full;
                    e.pinned |= s.pinned;
                    e.in_use |= s.in_use;
                    e.duplicates += 1;
                })
                .or_insert(Entry {
                    id: &s.id,
                    at: s.at_unix_ms,
                    full,
                    pinned: s.pinned,
                    in_use: s.in_use,
                    duplicates: 0,
                });
        }
        let mut entries: Vec<Entry<'_, I>> = by_id.into_values().collect();
        entries.sort_by(|a, b| b.at.cmp(&a.at).then_with(|| b.id.cmp(a.id)));

        let now = now_unix_ms;
        let keep_all = ms(self.keep_all_for);
        let hourly = ms(self.hourly_for);
        let max_age = ms(self.max_age);
        let future = |e: &Entry<'_, I>| e.at > now;
        let competing = |e: &Entry<'_, I>| !future(e) && !e.pinned && !e.in_use;
        let period_of = |age: u64| {
            if age < hourly {
                Period::Hour
            } else {
                Period::Day
            }
        };

        let newest = entries.iter().position(|e| !future(e));
        let newest_full = match liveness {
            Liveness::Live => entries.iter().position(|e| !future(e) && e.full),
            Liveness::Terminated => None,
        };

        // The representative (index into `entries`) of every hour and day that holds a
        // competing snapshot. Entries are newest first, so the first one seen is the newest.
        let mut buckets: BTreeMap<(Period, u64), usize> = BTreeMap::new();
        for (i, e) in entries.iter().enumerate() {
            if !competing(e) {
                continue;
            }
            for period in [Period::Hour, Period::Day] {
                buckets
                    .entry((period, Bucket::of(period, e.at).start_unix_ms))
                    .or_insert(i);
            }
        }

        // Ranks of the competing full snapshots in [keep_all, max_age).
        let mut full_rank: BTreeMap<usize, usize> = BTreeMap::new();
        let old_fulls = entries.iter().enumerate().filter(|(_, e)| {
            let age = now.saturating_sub(e.at);
            competing(e) && e.full && age >= keep_all && age < max_age
        });
        for (rank, (i, _)) in old_fulls.take(self.old_full_snapshots).enumerate() {
            full_rank.insert(i, rank + 1);
        }

        let decisions = entries
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let age = now.saturating_sub(e.at);
                let reason = if e.pinned {
                    Reason::Pinned
                } else if e.in_use {
                    Reason::InUse
                } else if future(e) {
                    Reason::FutureTimestamp {
                        ahead_ms: e.at - now,
                    }
                } else if newest == Some(i) {
                    Reason::Newest
                } else if newest_full == Some(i) {
                    Reason::NewestFull
                } else if age < keep_all {
                    Reason::Recent { age_ms: age }
                } else if age >= max_age {
                    Reason::Expired { age_ms: age }
                } else {
                    let bucket = Bucket::of(period_of(age), e.at);
                    let rep = *buckets
                        .get(&(bucket.period, bucket.start_unix_ms))
                        .expect("a competing snapshot's bucket has a representative");
                    if rep == i {
                        Reason::Representative { bucket }
                    } else if let Some(&rank) = full_rank.get(&i) {
                        Reason::RecentFull { rank }
                    } else {
                        Reason::Superseded {
                            bucket,
                            by: entries[rep].id.clone(),
                        }
                    }
                };
                Decision {
                    id: e.id.clone(),
                    at_unix_ms: e.at,
                    kind: if e.full {
                        SnapshotKind::Full
                    } else {
                        SnapshotKind::Disk
                    },
                    reason,
                    future_timestamp: future(e),
                    duplicates: e.duplicates,
                }
            })
            .collect();
        Plan { decisions }
    }
}

// ---------------------------------------------------------------------------------------------
// Rolling schedule
// ---------------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------------
// Formatting for logs
// ---------------------------------------------------------------------------------------------

/// A duration in milliseconds, compactly: `950ms`, `42s`, `1h`, `2d3h`, `1h0m5s`.
struct Human(u64);

impl fmt::Display for Human {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0;
        if ms < 1000 {
            return write!(f, "{ms}ms");
        }
        let secs = ms / 1000;
        let parts = [
            (secs / 86_400, "d"),
            (secs / 3600 % 24, "h"),
            (secs / 60 % 60, "m"),
            (secs % 60, "s"),
        ];
        let first = parts.iter().position(|p| p.0 > 0).unwrap_or(3);
        let last = parts.iter().rposition(|p| p.0 > 0).unwrap_or(3);
        for (n, unit) in &parts[first..=last] {
            write!(f, "{n}{unit}")?;
        }
        Ok(())
    }
}

/// A Unix time in milliseconds as UTC, ISO 8601: `2024-05-01T13:00:00Z` (with `.mmm` when
/// the milliseconds are not zero).
struct Utc(u64);

impl fmt::Display for Utc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secs = self.0 / 1000;
        let (y, m, d) = civil_date(secs / 86_400);
        let tod = secs % 86_400;
        write!(
            f,
            "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}",
            tod / 3600,
            tod / 60 % 60,
            tod % 60
        )?;
        let millis = self.0 % 1000;
        if millis > 0 {
            write!(f, ".{millis:03}")?;
        }
        f.write_str("Z")
    }
}

/// The proleptic Gregorian date of a day counted from 1970-01-01. Works in 400-year eras
/// (146 097 days) of years starting on March 1st, so the leap day ends its year.
fn civil_date(days: u64) -> (u64, u64, u64) {
    let shifted = days + 719_468; // days from 0000-03-01 to 1970-01-01
    let era = shifted / 146_097;
    let day_of_era = shifted % 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = era * 400 + year_of_era + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: u64 = 60_000;
    /// 2024-05-01T00:00:00Z, a UTC midnight.
    const T0: u64 = 1_714_521_600_000;

    /// Whether `t` is a multiple of `step`.
    fn on_grid(t: u64, step: u64) -> bool {
        t / step * step == t
    }

    fn disk(id: u64, at: u64) -> SnapshotInfo<u64> {
        SnapshotInfo::new(id, at, SnapshotKind::Disk)
    }

    fn full(id: u64, at: u64) -> SnapshotInfo<u64> {
        SnapshotInfo::new(id, at, SnapshotKind::Full)
    }

    /// One snapshot per minute, ages `0..count` minutes before `now`; id = timestamp. Full
    /// when the timestamp is on a multiple of `full_every` minutes, else disk.
    fn per_minute(now: u64, count: u64, full_every: Option<u64>) -> Vec<SnapshotInfo<u64>> {
        (0..count)
            .map(|k| {
                let at = now - k * MIN;
                match full_every {
                    Some(n) if on_grid(at, n * MIN) => full(at, at),
                    _ => disk(at, at),
                }
            })
            .collect()
    }

    fn decision(plan: &Plan<u64>, id: u64) -> &Decision<u64> {
        plan.decisions
            .iter()
            .find(|d| d.id == id)
            .unwrap_or_else(|| panic!("no decision for {id}"))
    }

    fn reason(plan: &Plan<u64>, id: u64) -> Reason<u64> {
        decision(plan, id).reason.clone()
    }

    /// Counts by reason: newest, newest full, recent, hourly, daily, recent full, pinned,
    /// in use, future, expired, superseded.
    #[derive(Debug, Default, PartialEq, Eq)]
    struct Counts {
        newest: usize,
        newest_full: usize,
        recent: usize,
        hourly: usize,
        daily: usize,
        recent_full: usize,
        pinned: usize,
        in_use: usize,
        future: usize,
        expired: usize,
        superseded: usize,
    }

    fn counts<I>(plan: &Plan<I>) -> Counts {
        let mut c = Counts::default();
        for d in &plan.decisions {
            match &d.reason {
                Reason::Newest => c.newest += 1,
                Reason::NewestFull => c.newest_full += 1,
                Reason::Recent { .. } => c.recent += 1,
                Reason::Representative { bucket } => match bucket.period {
                    Period::Hour => c.hourly += 1,
                    Period::Day => c.daily += 1,
                },
                Reason::RecentFull { .. } => c.recent_full += 1,
                Reason::Pinned => c.pinned += 1,
                Reason::InUse => c.in_use += 1,
                Reason::FutureTimestamp { .. } => c.future += 1,
                Reason::Expired { .. } => c.expired += 1,
                Reason::Superseded { .. } => c.superseded += 1,
            }
        }
        c
    }

    /// Ages in minutes of the snapshots kept for `pred`, youngest first.
    fn kept_ages(plan: &Plan<u64>, now: u64, pred: impl Fn(&Reason<u64>) -> bool) -> Vec<u64> {
        plan.kept()
            .filter(|d| pred(&d.reason))
            .map(|d| (now - d.at_unix_ms) / MIN)
            .collect()
    }

    fn is_period(r: &Reason<u64>, p: Period) -> bool {
        matches!(r, Reason::Representative { bucket } if bucket.period == p)
    }

    #[test]
    fn empty_input_gives_empty_plan() {
        let plan = RetentionPolicy::default().plan::<u64>(&[], T0, Liveness::Live);
        assert!(plan.decisions.is_empty());
        assert!(plan.to_delete().is_empty());
    }

    /// One disk snapshot per minute for 8 days, `now` on a UTC midnight (so on an hour).
    ///
    /// Age k minutes. Keep-all: k < 60 (k = 60 is exactly one hour: not recent). Hour bucket
    /// `H-j` holds k = 60(j-1)+1 ..= 60j; its newest is k = 60(j-1)+1. `H-1`'s newest (k = 1) is
    /// still recent, so the hourly tier (60 <= k < 1440) keeps k = 61, 121, ..., 1381: 23.
    /// Day `D-j` holds k = 1440(j-1)+1 ..= 1440j; `D-1`'s newest (k = 1) is recent, so the daily
    /// tier (1440 <= k < 10080) keeps k = 1441, 2881, ..., 8641: 6. k >= 10080 is expired.
    #[test]
    fn per_minute_for_eight_days_aligned_now() {
        let now = T0;
        let snaps = per_minute(now, 8 * 1440, None);
        let plan = RetentionPolicy::default().plan(&snaps, now, Liveness::Live);
        let c = counts(&plan);
        assert_eq!(
            c,
            Counts {
                newest: 1,
                recent: 59,
                hourly: 23,
                daily: 6,
                expired: 1440,
                superseded: 8 * 1440 - 89 - 1440,
                ..Counts::default()
            }
        );
        assert_eq!(plan.kept().count(), 89);
        let hourly: Vec<u64> = (1..=23).map(|j| 60 * j + 1).collect();
        assert_eq!(
            kept_ages(&plan, now, |r| is_period(r, Period::Hour)),
            hourly
        );
        let daily: Vec<u64> = (1..=6).map(|j| 1440 * j + 1).collect();
        assert_eq!(kept_ages(&plan, now, |r| is_period(r, Period::Day)), daily);
        assert_eq!(
            kept_ages(&plan, now, |_| true)[..60],
            (0..60).collect::<Vec<_>>()
        );
        // The hourly-tier members of H-1 and the daily-tier members of D-1 name the recent
        // snapshot that represents their bucket.
        assert_eq!(
            reason(&plan, now - 60 * MIN),
            Reason::Superseded {
                bucket: Bucket::of(Period::Hour, now - MIN),
                by: now - MIN
            }
        );
        assert_eq!(
            reason(&plan, now - 1440 * MIN),
            Reason::Superseded {
                bucket: Bucket::of(Period::Day, now - MIN),
                by: now - MIN
            }
        );
    }

    /// Same with `now` at 12:30 UTC. Hour buckets hold k = 60j-29 ..= 60j+30 (j >= 1), newest
    /// k = 60j-29: k = 31 is recent, so the hourly tier keeps k = 91, 151, ..., 1411 (23).
    /// Day `D-j` holds k = 1440(j-1)+751 ..= 1440j+750; `D-1`'s newest (k = 751) is an hourly
    /// representative, so the daily tier keeps k = 2191, 3631, 5071, 6511, 7951, 9391 (6);
    /// `D-8` starts at k = 10831, past 7 days.
    #[test]
    fn per_minute_for_eight_days_unaligned_now() {
        let now = T0 + 12 * 60 * MIN + 30 * MIN;
        let snaps = per_minute(now, 8 * 1440, None);
        let plan = RetentionPolicy::default().plan(&snaps, now, Liveness::Live);
        let c = counts(&plan);
        assert_eq!((c.newest, c.recent, c.hourly, c.daily), (1, 59, 23, 6));
        assert_eq!(plan.kept().count(), 89);
        let hourly: Vec<u64> = (0..23).map(|m| 91 + 60 * m).collect();
        assert_eq!(
            kept_ages(&plan, now, |r| is_period(r, Period::Hour)),
            hourly
        );
        assert_eq!(
            kept_ages(&plan, now, |r| is_period(r, Period::Day)),
            vec![2191, 3631, 5071, 6511, 7951, 9391]
        );
        // Daily-tier members of D-1 point at its newest, kept as an hourly representative.
        let by = now - 751 * MIN;
        assert!(
            matches!(reason(&plan, by), Reason::Representative { bucket } if bucket.period == Period::Hour)
        );
        assert_eq!(
            reason(&plan, now - 2000 * MIN),
            Reason::Superseded {
                bucket: Bucket::of(Period::Day, by),
                by
            }
        );
    }

    /// A disk snapshot per minute and a full one every 10 minutes (instead of that minute's
    /// disk one). The last hour keeps all 6 full snapshots; the buckets are represented by
    /// disk snapshots (minute 59 of each hour and of each day's last hour); besides them only
    /// the 2 newest full snapshots older than an hour stay (ages 60 and 70 min).
    #[test]
    fn full_snapshots_beyond_the_last_hour_are_capped() {
        let now = T0;
        let snaps = per_minute(now, 8 * 1440, Some(10));
        let plan = RetentionPolicy::default().plan(&snaps, now, Liveness::Live);
        let c = counts(&plan);
        assert_eq!(
            (c.newest, c.recent, c.hourly, c.daily, c.recent_full),
            (1, 59, 23, 6, 2)
        );
        assert_eq!(plan.kept().count(), 91);
        let fulls: Vec<u64> = plan
            .kept()
            .filter(|d| d.kind == SnapshotKind::Full)
            .map(|d| (now - d.at_unix_ms) / MIN)
            .collect();
        assert_eq!(fulls, vec![0, 10, 20, 30, 40, 50, 60, 70]);
        assert_eq!(
            reason(&plan, now - 60 * MIN),
            Reason::RecentFull { rank: 1 }
        );
        assert_eq!(
            reason(&plan, now - 70 * MIN),
            Reason::RecentFull { rank: 2 }
        );
        assert!(matches!(
            reason(&plan, now - 80 * MIN),
            Reason::Superseded { by, .. } if by == now - 61 * MIN
        ));
        // The newest full snapshot is also the newest snapshot: "newest" wins.
        assert_eq!(reason(&plan, now), Reason::Newest);
        // With no cap on old full snapshots, none beyond the hour except those two.
        let none = RetentionPolicy {
            old_full_snapshots: 0,
            ..RetentionPolicy::default()
        };
        let plan = none.plan(&snaps, now, Liveness::Live);
        assert_eq!(plan.kept().count(), 89);
    }

    /// When the disk was idle only full snapshots exist; then a bucket is represented by its
    /// newest full snapshot, so the hourly and daily history stays complete. Aligned `now`,
    /// a full snapshot every 10 min: recent k = 0..=50 (6); hour `H-1` (k = 10..=60) has a
    /// recent representative, so k = 60 stays only as old full #1; `H-2..H-24` keep
    /// k = 70, 130, ..., 1390 (23; k = 70 is also old full #2 but reported as representative);
    /// days `D-2..D-7` keep k = 1450, ..., 8650 (6). 36 in all.
    #[test]
    fn idle_disk_keeps_full_snapshots_as_representatives() {
        let now = T0;
        let snaps: Vec<_> = (0..8 * 144).map(|k| full(k, now - 10 * k * MIN)).collect();
        let plan = RetentionPolicy::default().plan(&snaps, now, Liveness::Live);
        let c = counts(&plan);
        assert_eq!(
            (c.newest, c.recent, c.recent_full, c.hourly, c.daily),
            (1, 5, 1, 23, 6)
        );
        assert_eq!(plan.kept().count(), 36);
        assert_eq!(reason(&plan, 6), Reason::RecentFull { rank: 1 });
        assert!(matches!(reason(&plan, 7), Reason::Representative { .. }));
    }

    /// The newest snapshot of a bucket represents it whatever its kind: a full snapshot
    /// holds the disk too, and it is the state the bucket ended in.
    #[test]
    fn newest_of_either_kind_represents_a_bucket() {
        let now = T0 + 10 * 60 * MIN;
        let hour = now - 3 * 60 * MIN; // 07:00
        let snaps = vec![
            disk(1, hour + 30 * MIN),
            full(2, hour + 50 * MIN),
            disk(3, hour + 40 * MIN),
            full(4, hour - 10 * MIN),
            disk(5, hour - 20 * MIN),
            disk(9, now),
        ];
        let policy = RetentionPolicy {
            old_full_snapshots: 0,
            ..RetentionPolicy::default()
        };
        let plan = policy.plan(&snaps, now, Liveness::Terminated);
        let bucket = Bucket::of(Period::Hour, hour);
        assert_eq!(reason(&plan, 2), Reason::Representative { bucket });
        assert_eq!(reason(&plan, 1), Reason::Superseded { bucket, by: 2 });
        assert_eq!(reason(&plan, 3), Reason::Superseded { bucket, by: 2 });
        let before = Bucket::of(Period::Hour, hour - MIN);
        assert_eq!(reason(&plan, 4), Reason::Representative { bucket: before });
        assert_eq!(
            reason(&plan, 5),
            Reason::Superseded {
                bucket: before,
                by: 4
            }
        );
        assert_eq!(reason(&plan, 9), Reason::Newest);
    }

    /// A live sandbox keeps its newest full snapshot whatever the rules say: here it is three
    /// days old, not its day's representative, and no old full snapshot is kept otherwise.
    #[test]
    fn newest_full_of_a_live_sandbox_is_kept() {
        let now = T0 + 9 * 60 * MIN;
        let mut snaps = per_minute(now, 8 * 1440, None);
        let old_full = now - (3 * 1440 + 30) * MIN - 30_000;
        snaps.push(full(old_full, old_full));
        let strict = RetentionPolicy {
            old_full_snapshots: 0,
            ..RetentionPolicy::default()
        };
        let live = strict.plan(&snaps, now, Liveness::Live);
        assert_eq!(reason(&live, old_full), Reason::NewestFull);
        let gone = strict.plan(&snaps, now, Liveness::Terminated);
        assert!(
            matches!(reason(&gone, old_full), Reason::Superseded { bucket, .. } if bucket.period == Period::Day)
        );
        let lenient = RetentionPolicy::default().plan(&snaps, now, Liveness::Terminated);
        assert_eq!(reason(&lenient, old_full), Reason::RecentFull { rank: 1 });
        // Past the maximum age too.
        let snaps = vec![full(1, now - 8 * 1440 * MIN), disk(2, now - MIN)];
        let live = strict.plan(&snaps, now, Liveness::Live);
        assert_eq!(reason(&live, 1), Reason::NewestFull);
        let gone = strict.plan(&snaps, now, Liveness::Terminated);
        assert!(matches!(reason(&gone, 1), Reason::Expired { .. }));
    }

    /// A sandbox left alone for weeks keeps its last state.
    #[test]
    fn newest_snapshot_survives_the_maximum_age() {
        let now = T0;
        let day = 1440 * MIN;
        let snaps = vec![
            disk(1, now - 10 * day),
            disk(2, now - 10 * day - 60 * MIN),
            full(3, now - 11 * day),
        ];
        let plan = RetentionPolicy::default().plan(&snaps, now, Liveness::Terminated);
        assert_eq!(reason(&plan, 1), Reason::Newest);
        assert!(matches!(reason(&plan, 2), Reason::Expired { .. }));
        assert!(matches!(reason(&plan, 3), Reason::Expired { .. }));
        let plan = RetentionPolicy::default().plan(&snaps, now, Liveness::Live);
        assert_eq!(reason(&plan, 1), Reason::Newest);
        assert_eq!(reason(&plan, 3), Reason::NewestFull);
        assert_eq!(plan.to_delete(), vec![&2]);
    }

    #[test]
    fn pinned_and_in_use_are_kept_and_do_not_compete() {
        let now = T0 + 12 * 60 * MIN;
        let hour = now - 4 * 60 * MIN;
        let snaps = vec![
            disk(1, now - 30 * 1440 * MIN).with_pinned(true),
            full(2, now - 20 * 1440 * MIN).with_in_use(true),
            disk(3, hour + 10 * MIN),
            disk(4, hour + 50 * MIN).with_pinned(true),
            disk(5, hour + 5 * MIN),
            disk(6, now),
        ];
        let plan = RetentionPolicy::default().plan(&snaps, now, Liveness::Live);
        assert_eq!(reason(&plan, 1), Reason::Pinned);
        assert_eq!(reason(&plan, 2), Reason::InUse);
        assert_eq!(reason(&plan, 4), Reason::Pinned);
        // 3 represents its hour although the pinned 4 is newer.
        assert!(matches!(reason(&plan, 3), Reason::Representative { .. }));
        assert!(matches!(reason(&plan, 5), Reason::Superseded { by: 3, .. }));
        // The in-use full snapshot does not count as the newest full one either: no other
        // full snapshot exists, so none is marked NewestFull.
        assert_eq!(counts(&plan).newest_full, 0);
        // A pinned snapshot that is also the newest one is reported pinned.
        let plan = RetentionPolicy::default().plan(
            &[disk(1, now).with_pinned(true), disk(2, now - MIN)],
            now,
            Liveness::Live,
        );
        assert_eq!(reason(&plan, 1), Reason::Pinned);
        assert_eq!(reason(&plan, 2), Reason::Recent { age_ms: MIN });
    }

    #[test]
    fn from_record_pins_requested_snapshots() {
        let rec = |reason: &str| -> SnapshotRecord {
            serde_json::from_value(serde_json::json!({
                "id": "1714521600000-full-ab12",
                "kind": "full",
                "reason": reason,
                "created_unix_ms": 1_714_521_600_000u64,
                "size_bytes": 1,
                "paused_for_us": 0,
            }))
            .expect("snapshot record")
        };
        let info = SnapshotInfo::from_record(&rec("request"));
        assert!(info.pinned && !info.in_use);
        assert_eq!(info.kind, SnapshotKind::Full);
        assert_eq!(info.at_unix_ms, 1_714_521_600_000);
        assert_eq!(info.id.as_str(), "1714521600000-full-ab12");
        for other in ["suspend", "fork", "pre_rollback"] {
            assert!(!SnapshotInfo::from_record(&rec(other)).pinned, "{other}");
        }
    }

    #[test]
    fn future_timestamps_are_kept_and_flagged() {
        let now = T0 + 3 * 60 * MIN;
        let snaps = vec![
            disk(1, now + 5 * MIN),
            disk(2, now + 1).with_pinned(true),
            disk(3, now),
            full(4, now - 2 * 60 * MIN),
            full(5, now + 60 * MIN),
        ];
        let plan = RetentionPolicy::default().plan(&snaps, now, Liveness::Live);
        assert_eq!(
            reason(&plan, 1),
            Reason::FutureTimestamp { ahead_ms: 5 * MIN }
        );
        assert!(decision(&plan, 1).future_timestamp);
        assert_eq!(reason(&plan, 2), Reason::Pinned);
        assert!(decision(&plan, 2).future_timestamp);
        // `at == now` is not in the future; it is the newest trustworthy snapshot.
        assert_eq!(reason(&plan, 3), Reason::Newest);
        assert!(!decision(&plan, 3).future_timestamp);
        // The newest full snapshot is the newest one not in the future.
        assert_eq!(reason(&plan, 4), Reason::NewestFull);
        assert_eq!(
            reason(&plan, 5),
            Reason::FutureTimestamp { ahead_ms: 60 * MIN }
        );
        assert_eq!(plan.deleted().count(), 0);
        // Future-only input: all kept, none is "newest".
        let plan = RetentionPolicy::default().plan(&[disk(1, now + 1)], now, Liveness::Live);
        assert_eq!(reason(&plan, 1), Reason::FutureTimestamp { ahead_ms: 1 });
    }

    #[test]
    fn boundaries_are_half_open() {
        let now = T0 + 5 * 60 * MIN;
        let hour = 60 * MIN;
        let day = 24 * hour;
        let snaps = vec![
            disk(1, now),                 // newest
            disk(2, now - hour + 1),      // age 1h - 1ms: recent
            disk(3, now - hour),          // age 1h: hourly tier, hour [now-1h, now)
            disk(4, now - hour - 1),      // previous hour, alone: its representative
            disk(5, now - day),           // age 24h: daily tier
            disk(6, now - 7 * day + 1),   // age 7d - 1ms: its day's representative
            disk(7, now - 7 * day),       // age 7d: expired
            disk(8, now - 10 * hour),     // an hour's first millisecond...
            disk(9, now - 10 * hour - 1), // ...and the previous hour's last
        ];
        let plan = RetentionPolicy::default().plan(&snaps, now, Liveness::Live);
        assert_eq!(reason(&plan, 1), Reason::Newest);
        assert_eq!(reason(&plan, 2), Reason::Recent { age_ms: hour - 1 });
        assert_eq!(
            reason(&plan, 3),
            Reason::Superseded {
                bucket: Bucket {
                    period: Period::Hour,
                    start_unix_ms: now - hour
                },
                by: 2
            }
        );
        assert_eq!(
            reason(&plan, 4),
            Reason::Representative {
                bucket: Bucket {
                    period: Period::Hour,
                    start_unix_ms: now - 2 * hour
                }
            }
        );
        // Day tier, but its day (T0 - 1 d) also holds 8 and 9, and 8 is its newest.
        assert_eq!(
            reason(&plan, 5),
            Reason::Superseded {
                bucket: Bucket {
                    period: Period::Day,
                    start_unix_ms: T0 - day
                },
                by: 8
            }
        );
        assert!(
            matches!(reason(&plan, 6), Reason::Representative { bucket } if bucket.period == Period::Day)
        );
        assert_eq!(reason(&plan, 7), Reason::Expired { age_ms: 7 * day });
        assert!(
            matches!(reason(&plan, 8), Reason::Representative { bucket } if bucket.start_unix_ms == now - 10 * hour)
        );
        assert!(
            matches!(reason(&plan, 9), Reason::Representative { bucket } if bucket.start_unix_ms == now - 11 * hour)
        );
    }

    #[test]
    fn equal_timestamps_are_ordered_by_id() {
        let now = T0 + 12 * 60 * MIN;
        let at = now - 5 * 60 * MIN;
        let a = vec![disk(5, at), disk(7, at), disk(6, at), disk(1, now)];
        let mut b = a.clone();
        b.reverse();
        let policy = RetentionPolicy::default();
        let plan = policy.plan(&a, now, Liveness::Live);
        assert_eq!(plan, policy.plan(&b, now, Liveness::Live));
        assert!(matches!(reason(&plan, 7), Reason::Representative { .. }));
        assert!(matches!(reason(&plan, 6), Reason::Superseded { by: 7, .. }));
        assert!(matches!(reason(&plan, 5), Reason::Superseded { by: 7, .. }));
        let order: Vec<u64> = plan.decisions.iter().map(|d| d.id).collect();
        assert_eq!(order, vec![1, 7, 6, 5]);
        // Two at the very same newest instant: the greater id is the newest.
        let plan = policy.plan(&[disk(2, now), disk(3, now)], now, Liveness::Live);
        assert_eq!(reason(&plan, 3), Reason::Newest);
        assert_eq!(reason(&plan, 2), Reason::Recent { age_ms: 0 });
    }

    #[test]
    fn input_order_does_not_matter() {
        let now = T0 + 7 * 60 * MIN + 13_000;
        let sorted = per_minute(now, 3 * 1440, Some(10));
        let mut shuffled = sorted.clone();
        let mut rng = Rng(0x5eed);
        rng.shuffle(&mut shuffled);
        let policy = RetentionPolicy::default();
        let plan = policy.plan(&sorted, now, Liveness::Live);
        assert_eq!(plan, policy.plan(&shuffled, now, Liveness::Live));
        let mut ascending = sorted;
        ascending.reverse();
        assert_eq!(plan, policy.plan(&ascending, now, Liveness::Live));
    }

    #[test]
    fn duplicate_ids_are_one_snapshot() {
        let now = T0 + 12 * 60 * MIN;
        let old = now - 3 * 1440 * MIN;
        let snaps = vec![disk(1, old), disk(1, old), disk(2, now)];
        let plan = RetentionPolicy::default().plan(&snaps, now, Liveness::Live);
        assert_eq!(plan.decisions.len(), 2);
        assert_eq!(decision(&plan, 1).duplicates, 1);
        assert!(decision(&plan, 1).to_string().ends_with("; listed 2 times"));
        // Conflicting listings merge towards keeping: pinned if any, newest time, full if any.
        let snaps = vec![
            disk(1, old),
            full(1, old + MIN).with_pinned(true),
            disk(2, now),
        ];
        let plan = RetentionPolicy::default().plan(&snaps, now, Liveness::Live);
        let d = decision(&plan, 1);
        assert_eq!((d.at_unix_ms, d.kind), (old + MIN, SnapshotKind::Full));
        assert_eq!(d.reason, Reason::Pinned);
        // Duplicate timestamps under different ids are different snapshots.
        let plan = RetentionPolicy::default().plan(
            &[disk(3, old), disk(4, old), disk(2, now)],
            now,
            Liveness::Live,
        );
        assert_eq!(plan.to_delete(), vec![&3]);
    }

    #[test]
    fn custom_policy() {
        let now = T0 + 12 * 60 * MIN;
        let policy = RetentionPolicy {
            keep_all_for: Duration::from_secs(10 * 60),
            hourly_for: Duration::from_secs(3 * 3600),
            max_age: Duration::from_secs(2 * 86_400),
            old_full_snapshots: 1,
        };
        let snaps = per_minute(now, 3 * 1440, None);
        let plan = policy.plan(&snaps, now, Liveness::Live);
        // Recent k < 10; hours H-1 (k 1..=60, newest recent), H-2, H-3 (k 61..=180, the hourly
        // tier ends at k = 180): 2 hourly; day D-1 (k 1..=720) has a recent newest; D-2
        // (k 721..=2160, newest k = 721) and D-3 (k 2161..=3600, newest k = 2161 < 2880): 2.
        let c = counts(&plan);
        assert_eq!((c.newest, c.recent, c.hourly, c.daily), (1, 9, 2, 2));
        assert_eq!(
            kept_ages(&plan, now, |r| !matches!(
                r,
                Reason::Recent { .. } | Reason::Newest
            )),
            vec![61, 121, 721, 2161]
        );
        // max_age below keep_all_for: the recent window still keeps everything in it.
        let tiny = RetentionPolicy {
            keep_all_for: Duration::from_secs(3600),
            hourly_for: Duration::ZERO,
            max_age: Duration::ZERO,
            old_full_snapshots: 0,
        };
        let plan = tiny.plan(&snaps, now, Liveness::Terminated);
        assert_eq!(plan.kept().count(), 60);
    }

    #[test]
    fn display_for_logs() {
        let now = T0 + 5 * 60 * MIN;
        let snaps = vec![
            disk(7, T0 + 3 * 60 * MIN + 20 * MIN),
            disk(5, T0 + 3 * 60 * MIN + 10 * MIN),
            disk(9, now),
            disk(3, now - 8 * 1440 * MIN - 1500),
            disk(4, now + 90_000),
        ];
        let plan = RetentionPolicy::default().plan(&snaps, now, Liveness::Live);
        let lines: Vec<String> = plan.decisions.iter().map(|d| d.to_string()).collect();
        assert_eq!(
            lines,
            vec![
                "keep 4 (disk, 2024-05-01T05:01:30Z): timestamp 1m30s in the future (clock skew)",
                "keep 9 (disk, 2024-05-01T05:00:00Z): newest snapshot",
                "keep 7 (disk, 2024-05-01T03:20:00Z): represents the hour from 2024-05-01T03:00:00Z",
                "delete 5 (disk, 2024-05-01T03:10:00Z): the hour from 2024-05-01T03:00:00Z is represented by 7",
                "delete 3 (disk, 2024-04-23T04:59:58.500Z): expired (8d0h0m1s old, beyond the maximum age)",
            ]
        );
        assert_eq!(Human(950).to_string(), "950ms");
        assert_eq!(Human(3_600_000).to_string(), "1h");
        assert_eq!(Human(3_605_000).to_string(), "1h0m5s");
        assert_eq!(Human(DAY_MS * 2 + HOUR_MS * 3).to_string(), "2d3h");
        assert_eq!(Utc(0).to_string(), "1970-01-01T00:00:00Z");
        assert_eq!(Utc(951_782_400_000).to_string(), "2000-02-29T00:00:00Z");
        assert_eq!(Utc(951_868_800_000).to_string(), "2000-03-01T00:00:00Z");
        assert_eq!(
            Utc(1_709_251_199_999).to_string(),
            "2024-02-29T23:59:59.999Z"
        );
        assert_eq!(Utc(4_102_444_800_000).to_string(), "2100-01-01T00:00:00Z");
    }

    #[test]
    fn unix_ms_of_system_time() {
        assert_eq!(unix_ms(UNIX_EPOCH + Duration::from_millis(1234)), 1234);
        assert_eq!(unix_ms(UNIX_EPOCH - Duration::from_secs(1)), 0);
    }

    // ---- property-style checks on random sets -------------------------------------------

    /// xorshift64*: small, seeded, good enough to vary test inputs.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            let mut x = self.0;
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            self.0 = x;
            x.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }

        fn chance(&mut self, percent: u64) -> bool {
            self.below(100) < percent
        }

        fn pick<T: Copy>(&mut self, items: &[T]) -> T {
            items[self.below(items.len() as u64) as usize]
        }

        fn shuffle<T>(&mut self, items: &mut [T]) {
            for i in (1..items.len()).rev() {
                let j = self.below(i as u64 + 1) as usize;
                items.swap(i, j);
            }
        }
    }

    fn random_case(rng: &mut Rng) -> (RetentionPolicy, Vec<SnapshotInfo<u64>>, u64, Liveness) {
        let hour = 60 * MIN;
        let day = 24 * hour;
        let policy = RetentionPolicy {
            keep_all_for: Duration::from_millis(rng.pick(&[0, 10 * MIN, hour, 3 * hour])),
            hourly_for: Duration::from_millis(rng.pick(&[0, hour, day, 2 * day])),
            max_age: Duration::from_millis(rng.pick(&[hour, day, 7 * day, 30 * day])),
            old_full_snapshots: rng.pick(&[0, 1, 2, 5]) as usize,
        };
        let now = T0 + rng.below(day);
        let mut snaps = Vec::new();
        let mut next_id = 0;
        let bursts = rng.below(6);
        for _ in 0..bursts {
            // A burst of snapshots, spaced like the rolling schedule or looser.
            let mut at = now.saturating_sub(rng.below(10 * day));
            let spacing = rng.pick(&[0, 1, MIN, 10 * MIN, hour, 5 * hour]);
            for _ in 0..rng.below(40) {
                let kind = if rng.chance(25) {
                    SnapshotKind::Full
                } else {
                    SnapshotKind::Disk
                };
                let ts = if rng.chance(4) {
                    now + 1 + rng.below(2 * hour)
                } else {
                    at
                };
                let s = SnapshotInfo::new(next_id, ts, kind)
                    .with_pinned(rng.chance(5))
                    .with_in_use(rng.chance(3));
                next_id += 1;
                if rng.chance(3) {
                    snaps.push(s.clone());
                }
                snaps.push(s);
                at = at.saturating_sub(spacing + rng.below(spacing / 2 + 1));
            }
        }
        rng.shuffle(&mut snaps);
        let live = if rng.chance(50) {
            Liveness::Live
        } else {
            Liveness::Terminated
        };
        (policy, snaps, now, live)
    }

    fn kept_ids(plan: &Plan<u64>) -> Vec<u64> {
        let mut ids: Vec<u64> = plan.kept().map(|d| d.id).collect();
        ids.sort_unstable();
        ids
    }

    fn only(snaps: &[SnapshotInfo<u64>], ids: &[u64]) -> Vec<SnapshotInfo<u64>> {
        snaps
            .iter()
            .filter(|s| ids.binary_search(&s.id).is_ok())
            .cloned()
            .collect()
    }

    #[test]
    fn invariants_on_random_sets() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for case in 0..600 {
            let (policy, snaps, now, live) = random_case(&mut rng);
            let ctx = format!("case {case}: {policy:?} now {now} {live:?}");
            let plan = policy.plan(&snaps, now, live);

            // One decision per id, newest first.
            let mut ids: Vec<u64> = snaps.iter().map(|s| s.id).collect();
            ids.sort_unstable();
            ids.dedup();
            assert_eq!(plan.decisions.len(), ids.len(), "{ctx}");
            assert!(
                plan.decisions
                    .windows(2)
                    .all(|w| (w[0].at_unix_ms, w[0].id) > (w[1].at_unix_ms, w[1].id)),
                "{ctx}"
            );

            // Pinned, in use and future snapshots are kept.
            for s in &snaps {
                if s.pinned || s.in_use || s.at_unix_ms > now {
                    assert!(decision(&plan, s.id).keep(), "{ctx}: {s:?}");
                }
            }
            // The newest, and the newest full of a live sandbox, are kept.
            let present = plan.decisions.iter().filter(|d| d.at_unix_ms <= now);
            if let Some(d) = present.clone().next() {
                assert!(d.keep(), "{ctx}: newest {d:?}");
            }
            if live == Liveness::Live {
                if let Some(d) = present.clone().find(|d| d.kind == SnapshotKind::Full) {
                    assert!(d.keep(), "{ctx}: newest full {d:?}");
                }
            }
            // Deleted snapshots name a kept representative in the same bucket; nothing past
            // the maximum age is kept but for the protected ones.
            for d in &plan.decisions {
                match &d.reason {
                    Reason::Superseded { bucket, by } => {
                        let rep = decision(&plan, *by);
                        assert!(rep.keep(), "{ctx}: {d:?} by {rep:?}");
                        assert!((rep.at_unix_ms, rep.id) > (d.at_unix_ms, d.id), "{ctx}");
                        assert_eq!(*bucket, Bucket::of(bucket.period, rep.at_unix_ms), "{ctx}");
                        assert_eq!(*bucket, Bucket::of(bucket.period, d.at_unix_ms), "{ctx}");
                    }
                    Reason::Representative { .. }
                    | Reason::Recent { .. }
                    | Reason::RecentFull { .. } => {
                        assert!(
                            now - d.at_unix_ms < ms(policy.max_age).max(ms(policy.keep_all_for)),
                            "{ctx}: {d:?}"
                        );
                    }
                    _ => {}
                }
            }

            // Idempotent: the kept set loses nothing more.
            let kept = kept_ids(&plan);
            let again = policy.plan(&only(&snaps, &kept), now, live);
            assert_eq!(again.deleted().count(), 0, "{ctx}: {:?}", again.to_delete());
            assert_eq!(kept_ids(&again), kept, "{ctx}");

            // Order does not matter.
            let mut shuffled = snaps.clone();
            rng.shuffle(&mut shuffled);
            assert_eq!(policy.plan(&shuffled, now, live), plan, "{ctx}");

            // Monotone over time, and pruning early changes nothing later.
            let later =
                now + rng.pick(&[1, MIN, 60 * MIN, 1440 * MIN, 3 * 1440 * MIN]) + rng.below(MIN);
            let plan_later = policy.plan(&snaps, later, live);
            let kept_later = kept_ids(&plan_later);
            for id in &kept_later {
                assert!(
                    kept.binary_search(id).is_ok(),
                    "{ctx}: {id} kept at {later} but not at {now}"
                );
            }
            let pruned_later = policy.plan(&only(&snaps, &kept), later, live);
            assert_eq!(kept_ids(&pruned_later), kept_later, "{ctx}: later {later}");
        }
    }

    /// Pruning every few minutes for four days while snapshots keep coming ends where one
    /// pruning at the end does.
    #[test]
    fn pruning_along_the_way_matches_pruning_once() {
        let policy = RetentionPolicy::default();
        let start = T0 + 17 * MIN;
        let mut all = Vec::new();
        let mut held: Vec<SnapshotInfo<u64>> = Vec::new();
        let mut now = start;
        while now < start + 4 * 1440 * MIN {
            let s = if on_grid(now, 10 * MIN) {
                full(now, now)
            } else {
                disk(now, now)
            };
            all.push(s.clone());
            held.push(s);
            if on_grid(now, 7 * MIN) {
                let plan = policy.plan(&held, now, Liveness::Live);
                let kept = kept_ids(&plan);
                held.retain(|s| kept.binary_search(&s.id).is_ok());
            }
            now += MIN;
        }
        let end = now;
        let once = policy.plan(&all, end, Liveness::Live);
        let along = policy.plan(&held, end, Liveness::Live);
        assert_eq!(kept_ids(&once), kept_ids(&along));
    }

    // ---- rolling schedule ------------------------------------------------------------------

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
