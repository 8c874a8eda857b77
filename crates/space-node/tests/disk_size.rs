//! The create option `disk_mib` on real guests: a size above the template image's (256 MiB
//! for `minimal`) gives the sandbox a root filesystem of that size, whichever way its VM
//! starts (template snapshot restore, cold boot, warm pool), and suspend/restore, fork and
//! rollback keep it. A smaller size, or one over the node's maximum, is refused and changes
//! nothing.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::*;
use space_node::{Node, NodeError, Origin, PoolConfig, SandboxOptions, SnapshotKind, State};
use space_runtime::GuestClient;

const MIB: u64 = 1 << 20;

/// Size of `/` in bytes as `df` in the guest reports it.
async fn df_size(client: &GuestClient) -> u64 {
    let out = sh(client, "df -B1 / | tail -n1").await;
    out.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("unexpected df output {out:?}"))
}

/// Asserts that a filesystem of `bytes` is what a disk of `mib` MiB holds (ext4 keeps some
/// of it for its metadata and journal), and not what a disk half that size would.
fn about(bytes: u64, mib: u64) -> bool {
    let ok = bytes <= mib * MIB && bytes > mib * MIB * 3 / 4;
    assert!(ok, "df says {bytes} bytes for a {mib} MiB disk");
    ok
}

fn disk(mib: u64) -> SandboxOptions {
    SandboxOptions {
        disk_mib: Some(mib),
        ..Default::default()
    }
}

#[test]
fn a_larger_disk_is_grown_online_and_kept_by_restore_fork_and_rollback() {
    with_node(
        Disk::Btrfs,
        |c| c.max_disk_mib = 2048,
        |node| async move {
            build_minimal(&node, "1").await;

            // The template's own size: nothing grows.
            let plain = create(&node, SandboxOptions::default()).await;
            assert_eq!(node.info(&plain).await.unwrap().disk_mib, 256);
            let pg = node.guest(&plain).await.unwrap();
            assert!(about(df_size(&pg).await, 256));

            // From the template's snapshot, 1 GiB.
            let id = create(&node, disk(1024)).await;
            let info = node.info(&id).await.unwrap();
            assert_eq!(info.origin, Origin::Template);
            assert_eq!(info.disk_mib, 1024);
            assert_eq!(info.options.disk_mib, Some(1024));
            let g = node.guest(&id).await.unwrap();
            assert!(about(df_size(&g).await, 1024), "df {}", df_size(&g).await);
            let marker = write_random(&g, "/root/marker.bin", 200_000).await;
            // The template's image is untouched: the next plain create is 256 MiB again.
            let plain2 = create(&node, SandboxOptions::default()).await;
            let pg2 = node.guest(&plain2).await.unwrap();
            assert!(about(df_size(&pg2).await, 256));
            drop(pg2);
            node.kill(&plain2).await.unwrap();

            // Suspend and restore: the snapshot's disk has the grown size.
            node.suspend(&id).await.unwrap();
            node.restore(&id).await.unwrap();
            let g = node.guest(&id).await.unwrap();
            assert!(about(df_size(&g).await, 1024));
            assert_eq!(guest_sha(&g, "/root/marker.bin").await, marker);

            // A fork has the parent's disk.
            let child = node.fork(&id).await.unwrap();
            assert_eq!(child.disk_mib, 1024);
            assert_eq!(child.state, State::Running);
            let cg = node.guest(&child.id).await.unwrap();
            assert!(about(df_size(&cg).await, 1024));
            assert_eq!(guest_sha(&cg, "/root/marker.bin").await, marker);

            // A rollback to a disk snapshot cold-boots on the grown disk.
            let snap = node.snapshot(&id, SnapshotKind::Disk).await.unwrap();
            node.rollback(&id, &snap.id).await.unwrap();
            let g = node.guest(&id).await.unwrap();
            assert!(about(df_size(&g).await, 1024));

            // A cold boot (another memory size) grows too.
            let cold = create(
                &node,
                SandboxOptions {
                    memory_mib: Some(320),
                    disk_mib: Some(512),
                    ..Default::default()
                },
            )
            .await;
            let info = node.info(&cold).await.unwrap();
            assert_eq!(info.origin, Origin::TemplateColdBoot);
            assert_eq!(info.disk_mib, 512);
            let cg = node.guest(&cold).await.unwrap();
            assert!(about(df_size(&cg).await, 512));

            // Refused, and nothing is left behind.
            let dirs = || {
                std::fs::read_dir(node.layout().sandboxes())
                    .unwrap()
                    .count()
            };
            let (n_dirs, n_records) = (dirs(), node.list().await.unwrap().len());
            for (mib, needle) in [(128, "cannot shrink"), (4096, "maximum of 2048 MiB")] {
                let mut req = minimal();
                req.options = disk(mib);
                match node.create(req).await {
                    Err(NodeError::Invalid(msg)) => {
                        assert!(msg.contains(needle), "{mib} MiB: {msg}")
                    }
                    other => panic!("{mib} MiB: {other:?}"),
                }
            }
            assert_eq!(dirs(), n_dirs);
            assert_eq!(node.list().await.unwrap().len(), n_records);
        },
    );
}

#[test]
fn a_pool_take_grows_after_the_take_and_the_pool_stays_template_sized() {
    with_node(
        Disk::Btrfs,
        |c| {
            c.pools = PoolConfig::fixed(
                BTreeMap::from([("minimal".parse().unwrap(), 1)]),
                Some(Duration::from_millis(200)),
            )
        },
        |node| async move {
            build_minimal(&node, "1").await;
            wait_for_pool(&node, 1).await;
            let id = create(&node, disk(1024)).await;
            let hits = pool_hits(&node);
            assert_eq!(hits, 1, "{:?}", node.pool_stats());
            assert_eq!(node.info(&id).await.unwrap().disk_mib, 1024);
            let g = node.guest(&id).await.unwrap();
            assert!(about(df_size(&g).await, 1024));

            // The refilled member is template-sized.
            wait_for_pool(&node, 1).await;
            let plain = create(&node, SandboxOptions::default()).await;
            assert_eq!(pool_hits(&node), 2);
            let pg = node.guest(&plain).await.unwrap();
            assert!(about(df_size(&pg).await, 256));
        },
    );
}

fn pool_hits(node: &Node) -> u64 {
    node.pool_stats()
        .into_iter()
        .find(|s| s.template.name.as_str() == "minimal")
        .map(|s| s.hits)
        .unwrap_or(0)
}

async fn wait_for_pool(node: &Node, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(300);
    while !node
        .pool_stats()
        .iter()
        .any(|s| s.template.name.as_str() == "minimal" && s.ready == n)
    {
        assert!(
            Instant::now() < deadline,
            "the pool never reached {n}: {:?}",
            node.pool_stats()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
