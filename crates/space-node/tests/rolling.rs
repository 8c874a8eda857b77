//! Rolling snapshots and retention on real guests, with intervals of seconds: writes cause disk
//! snapshots, an idle disk causes none, full snapshots come on schedule, and retention deletes
//! what the policy says (volumes included) while keeping the newest full snapshot, pinned
//! snapshots and a suspended sandbox's restore point.

mod common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::*;
use space_node::retention::{Liveness, RetentionPolicy, RollingSchedule, SnapshotInfo};
use space_node::{
    Node, NodeConfig, RollingReport, SandboxId, SandboxRecord, SnapshotKind, SnapshotReason,
    SnapshotRecord, State,
};

const DISK: Duration = Duration::from_secs(2);
const FULL: Duration = Duration::from_secs(5);

fn rolling(
    full: Duration,
    retention: RetentionPolicy,
    background: bool,
) -> impl FnOnce(&mut NodeConfig) {
    move |c| {
        c.rolling.enabled = background;
        c.rolling.tick = Duration::from_millis(200);
        c.rolling.schedule = RollingSchedule {
            disk_interval: DISK,
            full_interval: full,
        };
        c.rolling.retention = retention;
    }
}

fn rolling_of(r: &SandboxRecord) -> Vec<&SnapshotRecord> {
    r.snapshots
        .iter()
        .filter(|s| s.reason == SnapshotReason::Rolling)
        .collect()
}

fn snapshot_exists(node: &Node, id: &SandboxId, s: &SnapshotRecord) -> bool {
    node.layout()
        .snapshot_dir(id.as_str(), s.id.as_str())
        .unwrap()
        .exists()
}

/// Runs the reconciler and returns what it did to `id`.
async fn step(node: &Node, id: &SandboxId) -> RollingReport {
    let mut r = node.reconcile_snapshots().await;
    assert_eq!(r.failed, 0, "{r:?}");
    r.taken.retain(|(s, _)| s == id);
    r.deleted.retain(|(s, _)| s == id);
    r
}

#[test]
fn writes_cause_disk_snapshots_and_an_idle_disk_none() {
    let keep_everything = RetentionPolicy::default();
    with_node(
        Disk::Btrfs,
        rolling(Duration::from_secs(3600), keep_everything, false),
        |node| async move {
            build_minimal(&node, "1").await;
            let id = create(&node, Default::default()).await;
            let g = node.guest(&id).await.unwrap();
            // Nothing written: nothing due, now or after the disk interval.
            assert!(step(&node, &id).await.taken.is_empty());
            tokio::time::sleep(DISK + Duration::from_millis(500)).await;
            assert!(step(&node, &id).await.taken.is_empty());

            // A write that reached the image: a disk snapshot, reason rolling, vCPUs stopped
            // for it (and recorded).
            let sum = write_random(&g, "/root/one.bin", 30_000).await;
            sh(&g, "sync").await;
            let taken = step(&node, &id).await.taken;
            assert_eq!(taken.len(), 1, "{taken:?}");
            let first = taken[0].1.clone();
            assert_eq!(first.kind, SnapshotKind::Disk);
            assert_eq!(first.reason, SnapshotReason::Rolling);
            assert!(first.paused_for_us > 0);
            assert!(snapshot_exists(&node, &id, &first));

            // Another write right away waits for the interval, then is captured.
            write_random(&g, "/root/two.bin", 30_000).await;
            sh(&g, "sync").await;
            assert!(step(&node, &id).await.taken.is_empty());
            tokio::time::sleep(DISK + Duration::from_millis(200)).await;
            let taken = step(&node, &id).await.taken;
            assert_eq!(taken.len(), 1, "{taken:?}");
            let second = taken[0].1.clone();
            assert!(second.created_unix_ms >= first.created_unix_ms + DISK.as_millis() as u64);

            // No writes since: no more snapshots, however long.
            for _ in 0..3 {
                tokio::time::sleep(DISK + Duration::from_millis(200)).await;
                let taken = step(&node, &id).await.taken;
                assert!(taken.is_empty(), "no write, yet {taken:?}");
            }
            let info = node.info(&id).await.unwrap();
            assert_eq!(rolling_of(&info).len(), 2);

            // A paused sandbox is skipped.
            write_random(&g, "/root/three.bin", 1000).await;
            sh(&g, "sync").await;
            node.pause(&id).await.unwrap();
            assert!(step(&node, &id).await.taken.is_empty());
            node.resume(&id).await.unwrap();
            assert_eq!(step(&node, &id).await.taken.len(), 1);

            // A rolling snapshot is a real one: rolling back to the first brings its disk back.
            node.rollback(&id, &first.id).await.unwrap();
            let g = node.guest(&id).await.unwrap();
            assert_eq!(guest_sha(&g, "/root/one.bin").await, sum);
            assert!(!exists(&g, "/root/two.bin").await);
        },
    );
}

/// Asserts that retention left nothing the policy deletes as of `before` (a time just before
/// the last run: whatever the policy deletes then, it deletes at the run's own, later, time),
/// and that the listed snapshots have their volumes.
fn assert_pruned(node: &Node, r: &SandboxRecord, policy: &RetentionPolicy, before: u64) {
    let liveness = if r.state == State::Terminated {
        Liveness::Terminated
    } else {
        Liveness::Live
    };
    let input: Vec<_> = r
        .snapshots
        .iter()
        .map(|s| SnapshotInfo::from_record(s).with_in_use(r.restore_point.as_ref() == Some(&s.id)))
        .collect();
    let plan = policy.plan(&input, before, liveness);
    assert!(
        plan.to_delete().is_empty(),
        "retention left {:?} of {:?}",
        plan.to_delete(),
        r.snapshots
    );
    for s in &r.snapshots {
        assert!(
            snapshot_exists(node, &r.id, s),
            "{} is listed without its volume",
            s.id
        );
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

#[test]
fn full_snapshots_on_schedule_and_retention_thins() {
    // Tiny windows: everything younger than 3 s is kept, beyond 4 s one per UTC day (so only
    // the newest of the day, plus the newest old full snapshot).
    let policy = RetentionPolicy {
        keep_all_for: Duration::from_secs(3),
        hourly_for: Duration::from_secs(4),
        max_age: Duration::from_secs(3600),
        old_full_snapshots: 1,
    };
    with_node(
        Disk::Btrfs,
        rolling(FULL, policy, false),
        |node| async move {
            build_minimal(&node, "1").await;
            let id = create(&node, Default::default()).await;
            let g = node.guest(&id).await.unwrap();
            let pinned = node.snapshot(&id, SnapshotKind::Disk).await.unwrap();
            let started = node.info(&id).await.unwrap().started_unix_ms;
            // A writer that keeps the disk changing.
            g.exec(space_proto::ExecSpec::shell(
                "while true; do date >> /root/log; sync; sleep 0.3; done",
            ))
            .await
            .unwrap();

            let mut taken: Vec<SnapshotRecord> = Vec::new();
            let mut deleted: HashSet<String> = HashSet::new();
            let mut before = now_ms();
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_secs(17) {
                before = now_ms();
                let r = step(&node, &id).await;
                taken.extend(r.taken.into_iter().map(|(_, s)| s));
                deleted.extend(r.deleted.into_iter().map(|(_, s)| s.to_string()));
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            let fulls: Vec<&SnapshotRecord> = taken
                .iter()
                .filter(|s| s.kind == SnapshotKind::Full)
                .collect();
            let disks: Vec<&SnapshotRecord> = taken
                .iter()
                .filter(|s| s.kind == SnapshotKind::Disk)
                .collect();
            println!(
                "taken: {} full, {} disk; deleted {}",
                fulls.len(),
                disks.len(),
                deleted.len()
            );
            // Full snapshots on schedule: the first one full interval after the VM started, then
            // one per interval, never closer.
            assert!(fulls.len() >= 2, "{fulls:?}");
            assert!(fulls[0].created_unix_ms >= started + FULL.as_millis() as u64);
            for w in fulls.windows(2) {
                assert!(w[1].created_unix_ms >= w[0].created_unix_ms + FULL.as_millis() as u64);
            }
            // Disk snapshots while the disk changes, never two snapshots of the disk closer than
            // the disk interval.
            assert!(disks.len() >= 2, "{disks:?}");
            let mut holding: Vec<u64> = taken.iter().map(|s| s.created_unix_ms).collect();
            holding.sort();
            for s in &disks {
                let prev = holding
                    .iter()
                    .filter(|&&t| t < s.created_unix_ms)
                    .max()
                    .copied()
                    .unwrap_or(started);
                assert!(s.created_unix_ms >= prev + DISK.as_millis() as u64);
            }

            // Retention thinned, per the policy, volumes included.
            assert!(!deleted.is_empty());
            let info = node.info(&id).await.unwrap();
            assert_pruned(&node, &info, &policy, before);
            for s in &taken {
                let listed = info.snapshot(&s.id).is_some();
                assert_eq!(listed, !deleted.contains(s.id.as_str()));
                assert_eq!(snapshot_exists(&node, &id, s), listed, "{}", s.id);
            }
            // Kept: the pinned snapshot and the newest full snapshot.
            assert!(info.snapshot(&pinned.id).is_some());
            let newest_full = fulls.last().unwrap();
            assert!(info.snapshot(&newest_full.id).is_some());

            // Suspended: the restore point stays however old; restore works after pruning.
            node.suspend(&id).await.unwrap();
            let point = node.info(&id).await.unwrap().restore_point.unwrap();
            tokio::time::sleep(Duration::from_secs(5)).await;
            let r = step(&node, &id).await;
            assert!(r.taken.is_empty());
            let info = node.info(&id).await.unwrap();
            assert!(info.snapshot(&point).is_some());
            node.restore(&id).await.unwrap();
            let g = node.guest(&id).await.unwrap();
            assert!(
                sh(&g, "wc -l < /root/log")
                    .await
                    .trim()
                    .parse::<u64>()
                    .unwrap()
                    > 0
            );

            // Terminated: only the newest snapshot, pinned ones and the one old full are kept.
            node.kill(&id).await.unwrap();
            tokio::time::sleep(Duration::from_secs(4)).await;
            let before = now_ms();
            step(&node, &id).await;
            let info = node.info(&id).await.unwrap();
            assert_eq!(info.state, State::Terminated);
            assert_pruned(&node, &info, &policy, before);
            assert!(info.snapshot(&pinned.id).is_some());
            assert!(info.snapshots.len() <= 3, "{:?}", info.snapshots);
        },
    );
}

#[test]
fn the_background_loop_takes_full_snapshots() {
    with_node(
        Disk::Btrfs,
        rolling(Duration::from_secs(2), RetentionPolicy::default(), true),
        |node| async move {
            build_minimal(&node, "1").await;
            let id = create(&node, Default::default()).await;
            let deadline = Instant::now() + Duration::from_secs(120);
            loop {
                let info = node.info(&id).await.unwrap();
                let fulls = rolling_of(&info)
                    .into_iter()
                    .filter(|s| s.kind == SnapshotKind::Full)
                    .count();
                if fulls >= 2 {
                    break;
                }
                assert!(Instant::now() < deadline, "{:?}", info.snapshots);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            // Rolling snapshots are not activity: the idle clock is untouched by them.
            let info = node.info(&id).await.unwrap();
            assert!(info.last_activity_unix_ms < info.snapshots[0].created_unix_ms);
        },
    );
}
