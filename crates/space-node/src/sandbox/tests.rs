//! Panic isolation without guests: sandboxes whose drivers hold no VM (Suspended records left
//! by an earlier node), one of which is made to panic.

use std::time::Duration;

use crate::ids::TemplateRef;
use crate::node::{new_record, MachineShape, Owner};
use crate::record::{Origin, SandboxOptions, State, TimeoutPolicy};
use crate::storage::{DriverKind, StorageOptions};
use crate::{Node, NodeConfig, NodeError, SandboxId};

/// A node on a fresh directory (copy driver, no loop mount) that finds `n` Suspended
/// sandboxes in its records.
async fn node_with_suspended(dir: &std::path::Path, n: usize) -> (Node, Vec<SandboxId>) {
    let data = dir.join("data");
    let records = crate::record::RecordStore::open(data.join("state").join("sandboxes")).unwrap();
    let mut ids = Vec::new();
    for _ in 0..n {
        let mut r = new_record(
            SandboxId::generate(),
            TemplateRef::new("minimal", "1").unwrap(),
            SandboxOptions::default(),
            MachineShape {
                vcpus: 1,
                memory_mib: 128,
                disk_mib: 0,
            },
            Origin::Template,
            None,
            Owner {
                tenant: crate::record::DEFAULT_TENANT.to_owned(),
                lineage: None,
            },
        );
        r.state = State::Suspended;
        r.pending = None;
        records.write(&r).unwrap();
        ids.push(r.id);
    }
    let mut cfg = NodeConfig::new(&data);
    cfg.storage = StorageOptions {
        driver: Some(DriverKind::Copy),
        loop_image_size: 0,
        loop_image: false,
    };
    cfg.pools = crate::PoolConfig::disabled();
    cfg.rolling.enabled = false;
    cfg.timeout_tick = None;
    let node = Node::open(cfg).await.expect("opening the node");
    (node, ids)
}

fn policy(idle_s: u64) -> TimeoutPolicy {
    TimeoutPolicy {
        idle: Some(Duration::from_secs(idle_s)),
        ..TimeoutPolicy::default()
    }
}

fn is_internal<T: std::fmt::Debug>(r: &Result<T, NodeError>) -> bool {
    matches!(r, Err(NodeError::Internal(_)))
}

/// Bounds every wait: a driver that stopped answering fails the test instead of hanging it.
async fn soon<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(30), f)
        .await
        .expect("an answer within 30 s")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_driver_answers_an_internal_error_and_recovers_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let (node, ids) = node_with_suspended(tmp.path(), 2).await;
    let (a, b) = (&ids[0], &ids[1]);
    soon(node.set_timeouts(b, policy(100))).await.unwrap();

    // The request in flight when the driver panics, and one queued behind it.
    let (panicked, queued) = soon(async {
        tokio::join!(node.inject_panic(a), async {
            tokio::task::yield_now().await;
            node.set_timeouts(a, policy(200)).await
        })
    })
    .await;
    assert!(is_internal(&panicked), "{panicked:?}");
    // The node's API maps it to 500 (not a refusal).
    assert!(!panicked.unwrap_err().is_refusal());
    assert_eq!(
        queued
            .expect("a queued request is served once recovered")
            .options
            .timeouts,
        policy(200)
    );

    // Recovered from its record: the intent the panic left was undone, with an event.
    let info = soon(node.info(a)).await.unwrap();
    assert_eq!(info.state, State::Suspended);
    assert!(info.pending.is_none(), "{info:?}");
    let last = info.recoveries.last().expect("a recovery event");
    assert!(
        last.detail.contains("state driver failed"),
        "{:?}",
        info.recoveries
    );
    soon(node.set_timeouts(a, policy(300))).await.unwrap();

    // The other sandbox never noticed.
    let info_b = soon(node.set_timeouts(b, policy(400))).await.unwrap();
    assert_eq!(info_b.state, State::Suspended);
    assert_eq!(info_b.options.timeouts, policy(400));
    assert!(info_b.recoveries.is_empty());
    soon(node.shutdown()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_that_keeps_panicking_is_left_failing_fast_and_can_be_killed() {
    let tmp = tempfile::tempdir().unwrap();
    let (node, ids) = node_with_suspended(tmp.path(), 2).await;
    let (a, b) = (&ids[0], &ids[1]);
    for _ in 0..=super::panics::MAX_PANICS {
        assert!(is_internal(&soon(node.inject_panic(a)).await));
    }
    // No more recovering: every request answers an internal error at once.
    for _ in 0..3 {
        let r = soon(node.info(a)).await;
        assert!(is_internal(&r), "{r:?}");
        let r = soon(node.set_timeouts(a, policy(10))).await;
        match &r {
            Err(NodeError::Internal(m)) => assert!(m.contains("panicked"), "{m}"),
            other => panic!("{other:?}"),
        }
    }
    soon(node.set_timeouts(b, policy(20))).await.unwrap();

    // Kill still works, from the record on disk.
    soon(node.kill(a)).await.unwrap();
    let info = soon(node.info(a)).await.unwrap();
    assert_eq!(info.state, State::Terminated);
    assert!(info.pending.is_none());
    let e = soon(node.set_timeouts(a, policy(30))).await.unwrap_err();
    assert!(matches!(e, NodeError::IllegalState { .. }), "{e:?}");
    soon(node.set_timeouts(b, policy(40))).await.unwrap();
    soon(node.shutdown()).await;
}

#[tokio::test]
async fn an_unanswered_reply_is_an_internal_error() {
    let (tx, rx) = super::reply::<u32>();
    drop(tx);
    assert!(is_internal(&rx.await.unwrap()));
    let (tx, rx) = super::reply::<u32>();
    assert!(tx.send(Ok(5)).is_ok());
    assert_eq!(rx.await.unwrap().unwrap(), 5);
}
