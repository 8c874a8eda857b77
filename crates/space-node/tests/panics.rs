//! A panic in one sandbox's state driver stays in that sandbox: the request it was handling
//! is answered with an internal error, the sandbox is recovered from its record with the VM
//! it had (the guest loses nothing it acknowledged: files, processes), and the other
//! sandboxes keep working meanwhile. The panic comes from a hook only tests have
//! (`Node::inject_panic`, feature `test-hooks`).

mod common;

use std::time::{Duration, Instant};

use common::*;
use space_node::{NodeError, RecoveryAction, SandboxOptions, State};

#[test]
fn a_panic_in_one_driver_loses_nothing_and_leaves_the_others_running() {
    with_node(
        Disk::Btrfs,
        |_| {},
        |node| async move {
            build_minimal(&node, "1").await;
            let a = create(&node, SandboxOptions::default()).await;
            let b = create(&node, SandboxOptions::default()).await;
            let ga = node.guest(&a).await.unwrap();
            let kept = write_random(&ga, "/root/kept.bin", 50_000).await;
            let pid = start_sleeper(&ga).await;
            drop(ga);

            let t0 = Instant::now();
            let e = node.inject_panic(&a).await.unwrap_err();
            assert!(matches!(e, NodeError::Internal(_)), "{e:?}");
            assert!(!e.is_refusal());
            assert!(t0.elapsed() < Duration::from_secs(5), "answered late");

            // The other sandbox runs on.
            let gb = node.guest(&b).await.unwrap();
            assert_eq!(sh(&gb, "echo $((6*7))").await.trim(), "42");

            // The panicked one is back with the same VM: what the guest held is there.
            let info = tokio::time::timeout(Duration::from_secs(150), node.info(&a))
                .await
                .expect("an answer after recovery")
                .unwrap();
            assert_eq!(info.state, State::Running, "{info:?}");
            assert!(info.pending.is_none(), "{info:?}");
            let actions: Vec<_> = info.recoveries.iter().map(|e| e.action).collect();
            assert!(actions.contains(&RecoveryAction::Adopted), "{actions:?}");
            let ga = node.guest(&a).await.unwrap();
            assert_eq!(guest_sha(&ga, "/root/kept.bin").await, kept);
            assert!(alive(&ga, pid).await, "the guest's process survived");
            assert_eq!(sh(&ga, "echo $((6*7))").await.trim(), "42");

            // Both go on: a snapshot of each (a transition through the recovered driver).
            node.snapshot(&a, space_node::SnapshotKind::Disk)
                .await
                .unwrap();
            node.snapshot(&b, space_node::SnapshotKind::Disk)
                .await
                .unwrap();
            assert_eq!(sh(&gb, "echo still").await.trim(), "still");
        },
    );
}
