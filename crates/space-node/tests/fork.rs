//! Fork on real guests: the child starts with the parent's memory and files at that instant
//! (a running process included), takes its own identity, and the two go on independently.

mod common;

use common::*;
use space_node::{Origin, SandboxOptions, SnapshotReason, State};

#[test]
fn fork_copies_memory_and_files_then_both_diverge() {
    with_node(
        Disk::Btrfs,
        |_| {},
        |node| async move {
            build_minimal(&node, "1").await;
            let parent = create(&node, SandboxOptions::default()).await;
            let pg = node.guest(&parent).await.unwrap();
            let shared = write_random(&pg, "/root/shared.bin", 100_000).await;
            let pid = start_sleeper(&pg).await;
            // A counter that keeps running in both afterwards.
            pg.exec(space_proto::ExecSpec::shell(
                "i=0; while true; do i=$((i+1)); echo $i > /root/counter; sleep 0.1; done",
            ))
            .await
            .unwrap();
            let parent_uuid = sh(&pg, "cat /proc/sys/kernel/random/uuid").await;

            let child = node.fork(&parent).await.unwrap();
            assert_ne!(child.id, parent);
            assert_eq!(child.state, State::Running);
            let (from, snap) = child.forked_from.clone().unwrap();
            assert_eq!(from, parent);
            assert_eq!(
                child.origin,
                Origin::Snapshot {
                    sandbox: parent.clone(),
                    snapshot: snap.clone()
                }
            );
            let parent_info = node.info(&parent).await.unwrap();
            assert_eq!(parent_info.state, State::Running);
            assert_eq!(parent_info.snapshots.last().unwrap().id, snap);
            assert_eq!(
                parent_info.snapshots.last().unwrap().reason,
                SnapshotReason::Fork
            );

            let cg = node.guest(&child.id).await.unwrap();
            // Same files and the same running process at the instant of the fork.
            assert_eq!(guest_sha(&cg, "/root/shared.bin").await, shared);
            assert!(
                alive(&cg, pid).await,
                "the sleeper did not make it into the child"
            );
            assert!(alive(&pg, pid).await);
            // Own identity.
            assert_eq!(sh(&cg, "hostname").await.trim(), child.id.as_str());
            assert_eq!(sh(&pg, "hostname").await.trim(), parent.as_str());
            assert_ne!(
                sh(&cg, "cat /proc/sys/kernel/random/uuid").await,
                parent_uuid
            );

            // Independent from here: writes in one do not appear in the other.
            let c_only = write_random(&cg, "/root/child-only.bin", 5000).await;
            let p_only = write_random(&pg, "/root/parent-only.bin", 5000).await;
            write_random(&cg, "/root/shared.bin", 100).await;
            sh(&cg, "sync").await;
            sh(&pg, "sync").await;
            assert!(!exists(&pg, "/root/child-only.bin").await);
            assert!(!exists(&cg, "/root/parent-only.bin").await);
            assert_eq!(guest_sha(&pg, "/root/shared.bin").await, shared);
            assert_eq!(guest_sha(&cg, "/root/child-only.bin").await, c_only);
            assert_eq!(guest_sha(&pg, "/root/parent-only.bin").await, p_only);

            // Both counters keep counting.
            for g in [&pg, &cg] {
                let a: u64 = sh(g, "cat /root/counter").await.trim().parse().unwrap();
                tokio::time::sleep(std::time::Duration::from_millis(700)).await;
                let b: u64 = sh(g, "cat /root/counter").await.trim().parse().unwrap();
                assert!(b > a, "counter stopped: {a} -> {b}");
            }

            // Killing the parent leaves the child (restored from the parent's snapshot) alone.
            node.kill(&parent).await.unwrap();
            assert_eq!(guest_sha(&cg, "/root/child-only.bin").await, c_only);
            assert!(alive(&cg, pid).await);
            // A fork of the child works too.
            let grandchild = node.fork(&child.id).await.unwrap();
            let gg = node.guest(&grandchild.id).await.unwrap();
            assert_eq!(guest_sha(&gg, "/root/child-only.bin").await, c_only);
            assert_eq!(sh(&gg, "hostname").await.trim(), grandchild.id.as_str());
        },
    );
}
