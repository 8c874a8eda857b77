//! Copies of volumes in the object store, on a btrfs node: a copy holds the tree as it was
//! (files, holes, directories with their modes, links as links), a restore brings exactly
//! that back and drops what came after it, an unchanged file is not sent again, garbage
//! collection keeps what a copy needs, a copy of another tenant is not found, a node whose
//! volume moved away writes no copy, and a deleted volume's copies go with it.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use space_archive::StoreConfig;
use space_node::NodeError;
use space_proto::volume::{EntryKind, VolumeReply, VolumeRequest};

const VOL: &str = "vol-00000000000000d4";

fn archive_config(store: &Path, key: &Path) -> space_node::ArchiveConfig {
    let mut cfg = archive_over(&StoreConfig::Local(store.to_owned()), key);
    // Copies on request only, so the test decides when each is made.
    cfg.volume_copy_interval = None;
    cfg
}

async fn call(node: &space_node::Node, req: VolumeRequest, data: &[u8]) -> (VolumeReply, Vec<u8>) {
    let a = node.volume_call(VOL, req, data.to_vec()).await.unwrap();
    (a.reply, a.data.0)
}

async fn write(node: &space_node::Node, path: &str, mode: u32, data: &[u8]) {
    let (r, _) = call(
        node,
        VolumeRequest::Create {
            path: path.into(),
            mode,
            uid: 1000,
            gid: 1000,
            exclusive: false,
            truncate: true,
        },
        b"",
    )
    .await;
    assert!(matches!(r, VolumeReply::Attr(_)), "{path}: {r:?}");
    for (i, part) in data.chunks(1 << 20).enumerate() {
        let (r, _) = call(
            node,
            VolumeRequest::Write {
                path: path.into(),
                offset: (i as u64) << 20,
            },
            part,
        )
        .await;
        assert!(!matches!(r, VolumeReply::Errno(_)), "{path}: {r:?}");
    }
}

async fn read(node: &space_node::Node, path: &str) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let (r, bytes) = call(
            node,
            VolumeRequest::Read {
                path: path.into(),
                offset: out.len() as u64,
                size: 1 << 20,
            },
            b"",
        )
        .await;
        match r {
            VolumeReply::Data(0) => return Some(out),
            VolumeReply::Data(_) => out.extend(bytes),
            VolumeReply::Errno(_) => return None,
            other => panic!("{path}: {other:?}"),
        }
    }
}

async fn stat(node: &space_node::Node, path: &str) -> Option<space_proto::volume::Attr> {
    match call(node, VolumeRequest::Stat { path: path.into() }, b"")
        .await
        .0
    {
        VolumeReply::Attr(a) => Some(a),
        _ => None,
    }
}

fn pack_bytes(store: &Path) -> u64 {
    let dir = store.join("lineages").join(VOL).join("packs");
    std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.metadata().unwrap().len()).sum())
        .unwrap_or(0)
}

fn random(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn a_volume_copied_to_the_store_comes_back_as_it_was() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("objects");
    let cfg = archive_config(&store, &tmp.path().join("master.key"));
    let st = store.clone();
    with_node(
        Disk::Btrfs,
        |c| c.archive = Some(cfg),
        |node| async move {
            node.create_volume(VOL, "t1", 256 << 20).await.unwrap();
            let big = random(3 << 20, 7);
            let (r, _) = call(
                &node,
                VolumeRequest::MkDir {
                    path: "d".into(),
                    mode: 0o750,
                    uid: 1000,
                    gid: 1000,
                },
                b"",
            )
            .await;
            assert!(matches!(r, VolumeReply::Attr(_)), "{r:?}");
            write(&node, "d/big", 0o640, &big).await;
            write(&node, "small", 0o600, b"small\n").await;
            write(&node, "empty", 0o644, b"").await;
            write(&node, "sparse", 0o644, b"head").await;
            call(
                &node,
                VolumeRequest::SetAttr {
                    path: "sparse".into(),
                    mode: None,
                    uid: None,
                    gid: None,
                    size: Some(64 << 20),
                    atime_ns: None,
                    mtime_ns: None,
                },
                b"",
            )
            .await;
            call(
                &node,
                VolumeRequest::Symlink {
                    path: "d/link".into(),
                    target: "../small".into(),
                    uid: 1000,
                    gid: 1000,
                },
                b"",
            )
            .await;

            // The first copy: everything sent once, the moment recorded.
            let before = now();
            let info = node.sync_volume(VOL).await.unwrap();
            let synced = info.synced_unix_ms.expect("a copy was made");
            assert!(synced >= before, "{synced} < {before}");
            assert_eq!(info.copy_error, None);
            let first = pack_bytes(&st);
            assert!(first >= big.len() as u64, "{first} bytes of packs");
            assert!(first < 8 << 20, "the hole is not sent: {first} bytes");
            // Nothing changed: no new copy.
            assert_eq!(
                node.sync_volume(VOL).await.unwrap().synced_unix_ms,
                Some(synced)
            );

            // A small change: the big file is not read or sent again.
            write(&node, "small", 0o600, b"changed\n").await;
            let second = node.sync_volume(VOL).await.unwrap().synced_unix_ms.unwrap();
            assert!(second > synced);
            let grown = pack_bytes(&st) - first;
            assert!(grown < 64 << 10, "a small change sent {grown} bytes");

            // Written after the last copy, then the volume is brought back from the store
            // (a move to this node under a newer epoch): the late write is not there.
            write(&node, "late", 0o644, b"after the copy").await;
            node.collect_garbage(Duration::ZERO).await.unwrap();
            let back = node.restore_volume(VOL, "t1", 256 << 20, 5).await.unwrap();
            assert_eq!(back.synced_unix_ms, Some(second));
            assert_eq!(read(&node, "late").await, None);
            assert_eq!(read(&node, "d/big").await.unwrap(), big);
            assert_eq!(read(&node, "small").await.unwrap(), b"changed\n");
            assert_eq!(read(&node, "empty").await.unwrap(), b"");
            let sparse = stat(&node, "sparse").await.unwrap();
            assert_eq!(sparse.size, 64 << 20);
            assert!(sparse.blocks * 512 < 1 << 20, "the hole stays a hole");
            let d = stat(&node, "d").await.unwrap();
            assert_eq!(
                (d.kind, d.mode & 0o7777, d.uid),
                (EntryKind::Dir, 0o750, 1000)
            );
            let big_attr = stat(&node, "d/big").await.unwrap();
            assert_eq!((big_attr.mode & 0o7777, big_attr.gid), (0o640, 1000));
            assert_eq!(
                stat(&node, "d/link").await.unwrap().kind,
                EntryKind::Symlink
            );
            let (r, _) = call(
                &node,
                VolumeRequest::ReadLink {
                    path: "d/link".into(),
                },
                b"",
            )
            .await;
            assert_eq!(r, VolumeReply::Target("../small".into()));
            // The same epoch again: what is here stays.
            write(&node, "kept", 0o644, b"kept").await;
            node.restore_volume(VOL, "t1", 256 << 20, 5).await.unwrap();
            assert_eq!(read(&node, "kept").await.unwrap(), b"kept");

            // Another tenant's name for the volume finds nothing.
            let err = node
                .restore_volume(VOL, "t2", 1 << 20, 9)
                .await
                .unwrap_err();
            assert!(matches!(err, NodeError::VolumeNotFound(_)), "{err}");

            // The volume moved on to another node (a newer epoch in the store): this node's
            // writes are not copied over it.
            let archive = node.archive().unwrap().archive.clone();
            let mut head = archive.volume_head(VOL).await.unwrap().unwrap();
            head.epoch = 99;
            archive.put_volume_head(&head).await.unwrap();
            write(&node, "stale", 0o644, b"from a node the volume left").await;
            let err = node.sync_volume(VOL).await.unwrap_err();
            assert!(err.to_string().contains("moved"), "{err}");
            assert_eq!(archive.volume_head(VOL).await.unwrap().unwrap(), head);
            head.epoch = 5;
            archive.put_volume_head(&head).await.unwrap();

            // Deleted: its copies and its key go.
            node.delete_volume(VOL).await.unwrap();
            assert_eq!(archive.volume_head(VOL).await.unwrap(), None);
            assert!(archive.volume_copies(VOL).await.unwrap().is_empty());
            assert!(!st.join("lineages").join(VOL).join("key").exists());
            node.collect_garbage(Duration::ZERO).await.unwrap();
            assert_eq!(pack_bytes(&st), 0);
        },
    );
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}
