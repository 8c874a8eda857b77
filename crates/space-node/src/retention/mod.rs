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

mod schedule;
pub use schedule::*;

#[cfg(test)]
mod tests;
