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
pub(super) struct Rng(pub(super) u64);

impl Rng {
    pub(super) fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub(super) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    pub(super) fn chance(&mut self, percent: u64) -> bool {
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
