//! The core lifecycle on real guests: create -> pause/resume -> suspend/restore -> disk and
//! full snapshots -> rollback -> kill, checking that files (by SHA-256) and running processes
//! survive every step and that the records and directories say what happened. Runs once on
//! btrfs (loop-mounted image) and once with the copying driver on ext4.

mod common;

use std::collections::BTreeMap;
use std::time::Instant;

use common::*;
use space_node::{NodeError, Origin, SandboxOptions, SnapshotKind, SnapshotReason, State};

async fn core_lifecycle(node: space_node::Node) {
    let t0 = Instant::now();
    build_minimal(&node, "1").await;
    let built = t0.elapsed();

    let mut env = BTreeMap::new();
    env.insert("SPACE_TEST".to_owned(), "lifecycle".to_owned());
    let mut meta = BTreeMap::new();
    meta.insert("owner".to_owned(), "tests".to_owned());
    let t = Instant::now();
    let id = create(
        &node,
        SandboxOptions {
            env,
            metadata: meta.clone(),
            ..Default::default()
        },
    )
    .await;
    let created = t.elapsed();
    let info = node.info(&id).await.unwrap();
    assert_eq!(info.state, State::Running);
    assert_eq!(info.origin, Origin::Template);
    assert_eq!(info.options.metadata, meta);
    assert!(info.pending.is_none());
    let sandbox_dir = node.layout().sandbox_dir(id.as_str()).unwrap();
    assert!(sandbox_dir.join("mem").exists());

    // Identity: hostname and sandbox id are the new id, the environment is applied.
    let g = node.guest(&id).await.unwrap();
    assert_eq!(sh(&g, "hostname").await.trim(), id.as_str());
    assert_eq!(sh(&g, "echo $SPACE_TEST").await.trim(), "lifecycle");
    assert_eq!(
        g.health().await.unwrap().sandbox_id.as_deref(),
        Some(id.as_str())
    );

    let first = write_random(&g, "/root/first.bin", 200_000).await;
    let pid = start_sleeper(&g).await;

    // Pause / resume.
    let t = Instant::now();
    node.pause(&id).await.unwrap();
    let paused_in = t.elapsed();
    assert_eq!(node.info(&id).await.unwrap().state, State::Paused);
    let refused = node.guest(&id).await.unwrap_err();
    assert!(
        matches!(refused, NodeError::IllegalState { .. }),
        "{refused}"
    );
    let t = Instant::now();
    node.resume(&id).await.unwrap();
    let resumed_in = t.elapsed();
    let g = node.guest(&id).await.unwrap();
    assert_eq!(guest_sha(&g, "/root/first.bin").await, first);
    assert!(alive(&g, pid).await);

    // Suspend: the VM exits and its RAM file goes; the snapshot is listed as the restore point.
    let t = Instant::now();
    let suspend = node.suspend(&id).await.unwrap();
    let suspended_in = t.elapsed();
    assert_eq!(suspend.kind, SnapshotKind::Full);
    assert_eq!(suspend.reason, SnapshotReason::Suspend);
    let info = node.info(&id).await.unwrap();
    assert_eq!(info.state, State::Suspended);
    assert_eq!(info.restore_point.as_ref(), Some(&suspend.id));
    assert!(
        !sandbox_dir.join("mem").exists(),
        "RAM file kept after suspend"
    );
    let on_disk: space_node::SandboxRecord =
        serde_json::from_slice(&record_bytes(&node, &id)).unwrap();
    assert_eq!(on_disk.state, State::Suspended);
    assert!(on_disk.pending.is_none());

    // Restore: same files, same process, a new identity step.
    let t = Instant::now();
    node.restore(&id).await.unwrap();
    let restored_in = t.elapsed();
    let g = node.guest(&id).await.unwrap();
    assert_eq!(guest_sha(&g, "/root/first.bin").await, first);
    assert!(alive(&g, pid).await, "process lost across suspend/restore");
    assert_eq!(sh(&g, "hostname").await.trim(), id.as_str());

    // Disk snapshot, then later writes, then rollback: the later writes are gone.
    let disk = node.snapshot(&id, SnapshotKind::Disk).await.unwrap();
    assert_eq!(disk.kind, SnapshotKind::Disk);
    assert!(disk.size_bytes > 0);
    let snap_dir = node
        .layout()
        .snapshot_dir(id.as_str(), disk.id.as_str())
        .unwrap();
    assert!(snap_dir.join("rootfs.ext4").exists());
    assert!(!snap_dir.join("mem").exists());
    write_random(&g, "/root/later.bin", 10_000).await;
    sh(&g, "sync").await;
    node.rollback(&id, &disk.id).await.unwrap();
    let info = node.info(&id).await.unwrap();
    assert_eq!(info.state, State::Running);
    assert_eq!(
        info.origin,
        Origin::DiskSnapshot {
            snapshot: disk.id.clone()
        }
    );
    let g = node.guest(&id).await.unwrap();
    assert!(
        !exists(&g, "/root/later.bin").await,
        "write after the snapshot survived"
    );
    assert_eq!(guest_sha(&g, "/root/first.bin").await, first);
    assert_eq!(sh(&g, "hostname").await.trim(), id.as_str());

    // Full snapshot, then rollback to it brings back memory: a process started before it
    // runs, one started after does not; a file written after it is gone.
    let pid2 = start_sleeper(&g).await;
    let full = node.snapshot(&id, SnapshotKind::Full).await.unwrap();
    assert_eq!(full.kind, SnapshotKind::Full);
    let pid3 = start_sleeper(&g).await;
    write_random(&g, "/root/after-full.bin", 1000).await;
    node.rollback(&id, &full.id).await.unwrap();
    let g = node.guest(&id).await.unwrap();
    assert!(alive(&g, pid2).await);
    assert!(
        !alive(&g, pid3).await,
        "a process started after the snapshot survived"
    );
    assert!(!exists(&g, "/root/after-full.bin").await);
    assert_eq!(guest_sha(&g, "/root/first.bin").await, first);

    // The list: suspend, disk, full, plus the undo points the two rollbacks took.
    let snaps = node.snapshots(&id).await.unwrap();
    let reasons: Vec<_> = snaps.iter().map(|s| (s.reason, s.kind)).collect();
    assert_eq!(
        reasons,
        vec![
            (SnapshotReason::Suspend, SnapshotKind::Full),
            (SnapshotReason::Request, SnapshotKind::Disk),
            (SnapshotReason::PreRollback, SnapshotKind::Full),
            (SnapshotReason::Request, SnapshotKind::Full),
            (SnapshotReason::PreRollback, SnapshotKind::Full),
        ]
    );
    println!(
        "disk snapshot paused the vCPUs for {} us; full snapshot for {} us",
        disk.paused_for_us, full.paused_for_us
    );

    // Kill: VM and sandbox directory gone, snapshots and record kept.
    node.kill(&id).await.unwrap();
    assert!(!sandbox_dir.exists(), "sandbox directory kept after kill");
    for s in &snaps {
        let d = node
            .layout()
            .snapshot_dir(id.as_str(), s.id.as_str())
            .unwrap();
        assert!(d.exists(), "snapshot {} removed by kill", s.id);
    }
    let info = node.info(&id).await.unwrap();
    assert_eq!(info.state, State::Terminated);
    assert_eq!(info.snapshots.len(), snaps.len());
    let e = node.resume(&id).await.unwrap_err();
    assert!(e.to_string().contains("terminated"), "{e}");
    println!(
        "template build {built:?}, create {created:?}, pause {paused_in:?}, resume \
         {resumed_in:?}, suspend {suspended_in:?}, restore {restored_in:?}, whole test {:?}",
        t0.elapsed()
    );
}

#[test]
fn core_lifecycle_on_btrfs() {
    with_node(Disk::Btrfs, |_| {}, core_lifecycle);
}

#[test]
fn core_lifecycle_on_copy_driver() {
    with_node(Disk::Copy, |_| {}, core_lifecycle);
}
