//! Requests that are not legal get clear errors and change nothing: the state, the record
//! file (byte for byte) and the guest stay as they were. Also: creates the node cannot honour,
//! and template builds that fail or collide.

mod common;

use std::time::Duration;

use common::*;
use space_node::{
    NodeError, SandboxId, SandboxOptions, SnapshotKind, State, TemplateRef, TemplateSpec,
    VersionReq,
};

/// Asserts `result` is a refusal whose message contains every piece of `needles`, and that
/// the sandbox's record did not change.
async fn refused<T: std::fmt::Debug>(
    node: &space_node::Node,
    id: &SandboxId,
    before: &[u8],
    result: Result<T, NodeError>,
    needles: &[&str],
) {
    let err = result.expect_err("request should have been refused");
    assert!(err.is_refusal(), "not a refusal: {err}");
    let msg = err.to_string();
    for n in needles {
        assert!(msg.contains(n), "message {msg:?} does not mention {n:?}");
    }
    assert_eq!(
        record_bytes(node, id),
        before,
        "record changed by a refused request"
    );
    println!("refused as expected: {msg}");
}

#[test]
fn illegal_requests_are_refused_and_change_nothing() {
    with_node(
        Disk::Btrfs,
        |_| {},
        |node| async move {
            build_minimal(&node, "1").await;
            let a = create(&node, SandboxOptions::default()).await;
            let b = create(&node, SandboxOptions::default()).await;

            // Unknown id.
            let ghost: SandboxId = "sbx-does-not-exist".parse().unwrap();
            let e = node.pause(&ghost).await.unwrap_err();
            assert!(matches!(e, NodeError::NotFound(_)), "{e}");
            assert!(e.to_string().contains("sbx-does-not-exist"));
            assert!(node.info(&ghost).await.is_err());

            // Resume of a running sandbox.
            let before = record_bytes(&node, &a);
            refused(
                &node,
                &a,
                &before,
                node.resume(&a).await,
                &[
                    "resume refused",
                    a.as_str(),
                    "is running",
                    "only when paused",
                ],
            )
            .await;
            // Restore of a running sandbox.
            refused(&node, &a, &before, node.restore(&a).await, &["suspended"]).await;

            // Rollback to another sandbox's snapshot.
            let b_snap = node.snapshot(&b, SnapshotKind::Disk).await.unwrap();
            let g = node.guest(&a).await.unwrap();
            let marker = write_random(&g, "/root/marker", 1000).await;
            let before = record_bytes(&node, &a);
            refused(
                &node,
                &a,
                &before,
                node.rollback(&a, &b_snap.id).await,
                &[b_snap.id.as_str(), b.as_str(), "has no snapshot"],
            )
            .await;
            // ... and to a snapshot that does not exist at all.
            let nowhere = "0000000000001-disk-0000".parse().unwrap();
            refused(
                &node,
                &a,
                &before,
                node.rollback(&a, &nowhere).await,
                &["has no snapshot"],
            )
            .await;
            // The guest was not touched.
            assert_eq!(guest_sha(&g, "/root/marker").await, marker);

            // Suspended: pause, fork, snapshot, guest, suspend are refused.
            node.suspend(&a).await.unwrap();
            let before = record_bytes(&node, &a);
            refused(
                &node,
                &a,
                &before,
                node.pause(&a).await,
                &["pause refused", "is suspended", "only when running"],
            )
            .await;
            refused(
                &node,
                &a,
                &before,
                node.fork(&a).await,
                &["fork refused", "is suspended", "running or paused"],
            )
            .await;
            refused(
                &node,
                &a,
                &before,
                node.snapshot(&a, SnapshotKind::Full).await,
                &["suspended"],
            )
            .await;
            refused(&node, &a, &before, node.guest(&a).await, &["suspended"]).await;
            refused(&node, &a, &before, node.suspend(&a).await, &["suspended"]).await;
            refused(&node, &a, &before, node.resume(&a).await, &["suspended"]).await;
            assert_eq!(node.info(&a).await.unwrap().state, State::Suspended);
            // It still restores afterwards, with its files.
            node.restore(&a).await.unwrap();
            let g = node.guest(&a).await.unwrap();
            assert_eq!(guest_sha(&g, "/root/marker").await, marker);

            // Paused: guest access is refused (no auto-resume), pause again is refused.
            node.pause(&a).await.unwrap();
            let before = record_bytes(&node, &a);
            refused(
                &node,
                &a,
                &before,
                node.guest(&a).await,
                &["guest access refused", "is paused", "only when running"],
            )
            .await;
            refused(&node, &a, &before, node.pause(&a).await, &["paused"]).await;
            node.resume(&a).await.unwrap();

            // Terminated: everything but inspection is refused.
            node.kill(&b).await.unwrap();
            let before = record_bytes(&node, &b);
            refused(&node, &b, &before, node.kill(&b).await, &["terminated"]).await;
            refused(&node, &b, &before, node.restore(&b).await, &["terminated"]).await;
            refused(
                &node,
                &b,
                &before,
                node.rollback(&b, &b_snap.id).await,
                &["terminated"],
            )
            .await;
            assert_eq!(node.snapshots(&b).await.unwrap().len(), 1);
        },
    );
}

#[test]
fn creates_and_builds_the_node_cannot_honour_are_refused() {
    with_node(
        Disk::Btrfs,
        |_| {},
        |node| async move {
            // No template yet.
            let e = node.create(minimal()).await.unwrap_err();
            assert!(matches!(e, NodeError::TemplateNotFound(_)), "{e}");

            // A build that fails (the "kernel" is not one) leaves nothing behind.
            let junk = node.layout().root().join("not-a-kernel");
            std::fs::write(&junk, b"definitely not a kernel").unwrap();
            let e = node
                .build_template(TemplateSpec {
                    template: TemplateRef::new("broken", "1").unwrap(),
                    kernel: junk.clone(),
                    rootfs: env_path("SPACE_ROOTFS_MINIMAL"),
                    vcpus: 1,
                    memory_mib: 256,
                    kernel_cmdline: None,
                    ready_timeout: Duration::from_secs(20),
                    guest: Default::default(),
                    start: None,
                    source: String::new(),
                })
                .await
                .unwrap_err();
            println!("failed build: {e}");
            assert!(!node.layout().templates().join("broken").exists());
            assert_eq!(
                std::fs::read_dir(node.layout().sandboxes())
                    .unwrap()
                    .count(),
                0,
                "the build VM's directory was left behind"
            );
            std::fs::remove_file(&junk).unwrap();

            // Versions coexist; `latest` is the newest; a version is built once.
            build_minimal(&node, "1").await;
            build_minimal(&node, "2").await;
            let e = node
                .build_template(TemplateSpec {
                    template: TemplateRef::new("minimal", "1").unwrap(),
                    kernel: env_path("SPACE_KERNEL"),
                    rootfs: env_path("SPACE_ROOTFS_MINIMAL"),
                    vcpus: 1,
                    memory_mib: 256,
                    kernel_cmdline: None,
                    ready_timeout: Duration::from_secs(20),
                    guest: Default::default(),
                    start: None,
                    source: String::new(),
                })
                .await
                .unwrap_err();
            assert!(matches!(e, NodeError::TemplateExists(_)), "{e}");
            let latest = node
                .template(&"minimal".parse().unwrap(), &VersionReq::Latest)
                .unwrap();
            assert_eq!(latest.manifest.template.version.as_str(), "2");
            assert_eq!(node.templates().unwrap().len(), 2);
            let id = create(&node, SandboxOptions::default()).await;
            assert_eq!(node.info(&id).await.unwrap().template.version.as_str(), "2");
            let mut old = minimal();
            old.version = "1".parse().unwrap();
            let id1 = node.create(old).await.unwrap().id;
            assert_eq!(
                node.info(&id1).await.unwrap().template.version.as_str(),
                "1"
            );

            // Options the node cannot honour: nothing is created.
            let count = || {
                std::fs::read_dir(node.layout().sandboxes())
                    .unwrap()
                    .count()
            };
            let records = node.list().await.unwrap().len();
            let n = count();
            for (opts, needle) in [
                (
                    SandboxOptions {
                        disk_mib: Some(100_000),
                        ..Default::default()
                    },
                    "maximum",
                ),
                (
                    SandboxOptions {
                        vcpus: Some(0),
                        ..Default::default()
                    },
                    "vcpus",
                ),
                (
                    SandboxOptions {
                        memory_mib: Some(1),
                        ..Default::default()
                    },
                    "memory",
                ),
            ] {
                let mut req = minimal();
                req.options = opts;
                let e = node.create(req).await.unwrap_err();
                assert!(e.is_refusal() && e.to_string().contains(needle), "{e}");
            }
            let mut env_bad = minimal();
            env_bad.options.env.insert("A=B".into(), "x".into());
            assert!(node.create(env_bad).await.unwrap_err().is_refusal());
            let mut missing = minimal();
            missing.version = "9".parse().unwrap();
            assert!(matches!(
                node.create(missing).await.unwrap_err(),
                NodeError::TemplateNotFound(_)
            ));
            assert_eq!(count(), n);
            assert_eq!(node.list().await.unwrap().len(), records);

            // Another shape than the template's snapshot: a cold boot on the template's image.
            let mut big = minimal();
            big.options.memory_mib = Some(320);
            let info = node.create(big).await.unwrap();
            assert_eq!(info.origin, space_node::Origin::TemplateColdBoot);
            assert_eq!(info.memory_mib, 320);
            let g = node.guest(&info.id).await.unwrap();
            let mem = sh(&g, "grep MemTotal /proc/meminfo").await;
            let kb: u64 = mem.split_whitespace().nth(1).unwrap().parse().unwrap();
            assert!(kb > 256 * 1024, "{mem}");
            assert_eq!(sh(&g, "hostname").await.trim(), info.id.as_str());
        },
    );
}
