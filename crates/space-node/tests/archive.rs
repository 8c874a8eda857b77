//! Sandboxes through the object store, on real guests: suspend uploads and the local copy goes,
//! restore fetches it back with files and processes intact, incremental uploads, forks sharing
//! chunks, a node on an empty data directory finding and restoring everything, wake on
//! access, and clear errors (store down, a disabled key) that lose nothing. Against a local
//! directory store and against Garage (real S3).

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use space_archive::testing::{CutProxy, Garage};
use space_archive::StoreConfig;
use space_node::{ArchiveConfig, NodeError, SandboxOptions, State, Wake};

fn archive_config(store: &StoreConfig, key: &Path, cache_max: Option<u64>) -> ArchiveConfig {
    let mut cfg = archive_over(store, key);
    cfg.cache_max_bytes = cache_max;
    if let Ok(c) = std::env::var("SPACE_TEST_CHUNK_KIB") {
        cfg.chunk_size = c.parse::<u32>().unwrap() << 10;
    }
    cfg
}

/// Runs `test` on a btrfs node archiving to `store` under a fresh master key, with no local
/// copies kept (every restore comes from the store).
fn with_store_node<F, Fut>(store: &StoreConfig, test: F)
where
    F: FnOnce(space_node::Node) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let keys = tempfile::tempdir().unwrap();
    let cfg = archive_config(store, &keys.path().join("master.key"), Some(0));
    with_node(Disk::Btrfs, |c| c.archive = Some(cfg), test);
}

fn snapshot_dir(node: &space_node::Node, id: &space_node::SandboxId, snap: &str) -> PathBuf {
    node.layout().snapshot_dir(id.as_str(), snap).unwrap()
}

/// The whole trip on one store: suspend (uploaded, local copy evicted, VM gone), restore
/// (fetched, file and process intact), a second suspend after 1 MiB of writes (a few chunks),
/// a fork that shares its parent's chunks, cycles that lose nothing, wake on access.
fn trip(store: StoreConfig, cycles: usize) {
    let keys = tempfile::tempdir().unwrap();
    let key = keys.path().join("master.key");
    let cfg = archive_config(&store, &key, Some(0));
    with_node(
        Disk::Btrfs,
        |c| c.archive = Some(cfg),
        |node| async move {
            build_minimal(&node, "1").await;
            let id = create(&node, SandboxOptions::default()).await;
            let g = node.guest(&id).await.unwrap();
            let data = write_random(&g, "/root/data.bin", 1 << 20).await;
            sh(&g, "sync").await;
            let pid = start_sleeper(&g).await;
            drop(g);

            let s1 = node.suspend(&id).await.unwrap();
            let r1 = s1
                .remote
                .clone()
                .expect("the suspend snapshot is in the store");
            assert!(
                !s1.local,
                "cache limit 0: the local copy goes after the upload"
            );
            assert_eq!(s1.location(), "remote");
            assert!(!snapshot_dir(&node, &id, s1.id.as_str()).exists());
            let sandbox_dir = node.layout().sandbox_dir(id.as_str()).unwrap();
            assert!(
                !sandbox_dir.join("mem").exists(),
                "the VM's RAM file is gone"
            );
            eprintln!(
                "first suspend: {} new chunks, {} bytes",
                r1.new_chunks, r1.uploaded_bytes
            );

            node.restore(&id).await.unwrap();
            let g = node.guest(&id).await.unwrap();
            assert_eq!(guest_sha(&g, "/root/data.bin").await, data);
            assert!(alive(&g, pid).await, "the process survives the trip");
            // The fetch went straight into the sandbox's files; the cache copy made from the
            // same reads is put in place in the background, and the record follows.
            let cached = snapshot_dir(&node, &id, s1.id.as_str()).join("mem");
            wait_until(
                "no local copy of the fetched snapshot",
                Duration::from_secs(60),
                || cached.exists(),
            )
            .await;

            // 1 MiB more: the next upload stores a few chunks, not the sandbox.
            let more = write_random(&g, "/root/more.bin", 1 << 20).await;
            sh(&g, "sync").await;
            drop(g);
            let s2 = node.suspend(&id).await.unwrap();
            let r2 = s2.remote.clone().unwrap();
            eprintln!(
                "after 1 MiB: {} new chunks, {} bytes",
                r2.new_chunks, r2.uploaded_bytes
            );
            // The guest's RAM moves too (buffers, page cache, the restore's own work): tens of
            // chunks of the ~2,000 a 256 MiB guest has. `space-bench archive` measures it.
            assert!(
                r2.new_chunks > 4,
                "1 MiB of new data is at least 4 chunks: {r2:?}"
            );
            assert!(r2.new_chunks < 200, "an incremental upload: {r2:?}");
            assert!(r2.uploaded_bytes < 16 << 20, "{r2:?}");

            // Wake on access: a suspended sandbox is restored by guest access.
            let (g, woke) = node.guest_waking(&id).await.unwrap();
            assert_eq!(woke, Some(Wake::Restored));
            assert_eq!(guest_sha(&g, "/root/more.bin").await, more);
            assert!(alive(&g, pid).await);
            node.pause(&id).await.unwrap();
            let (g, woke) = node.guest_waking(&id).await.unwrap();
            assert_eq!(woke, Some(Wake::Resumed));
            assert!(alive(&g, pid).await);
            let (_, woke) = node.guest_waking(&id).await.unwrap();
            assert_eq!(woke, None);
            drop(g);

            // A fork and its parent share chunks: the child's first upload stores little.
            let child = node.fork(&id).await.unwrap().id;
            let sc = node.suspend(&child).await.unwrap();
            let rc = sc.remote.unwrap();
            eprintln!(
                "fork: {} new chunks of {} stored bytes referenced",
                rc.new_chunks, rc.stored_bytes
            );
            assert!(rc.new_chunks < 200, "{rc:?}");
            assert!(
                rc.stored_bytes > 1 << 20,
                "the child's manifest references the parent's data"
            );

            // Cycles through the store lose nothing.
            node.suspend(&id).await.unwrap();
            for i in 0..cycles {
                node.restore(&id).await.unwrap();
                // Lazily, from the store, with the list the restore before recorded: the VM
                // ran once the list had arrived.
                let r = node.last_restore(&id).unwrap();
                assert!(r.from_store, "cycle {i}: {r:?}");
                if i > 0 {
                    assert!(
                        r.prefetch.is_some_and(|(chunks, _)| chunks > 0),
                        "cycle {i}: no prefetch list: {r:?}"
                    );
                }
                let g = node.guest(&id).await.unwrap();
                assert_eq!(guest_sha(&g, "/root/data.bin").await, data, "cycle {i}");
                assert!(alive(&g, pid).await, "cycle {i}");
                sh(&g, &format!("echo {i} > /root/cycle")).await;
                drop(g);
                let s = node.suspend(&id).await.unwrap();
                assert!(s.remote.is_some() && !s.local);
            }
            node.restore(&id).await.unwrap();
            let g = node.guest(&id).await.unwrap();
            if cycles > 0 {
                assert_eq!(
                    sh(&g, "cat /root/cycle").await.trim(),
                    (cycles - 1).to_string()
                );
            }
            drop(g);

            // With auto_resume off, guest access is refused as before.
            let opts = SandboxOptions {
                auto_resume: false,
                ..Default::default()
            };
            let strict = create(&node, opts).await;
            node.pause(&strict).await.unwrap();
            let err = node.guest_waking(&strict).await.unwrap_err();
            assert!(
                matches!(
                    err,
                    NodeError::IllegalState {
                        state: State::Paused,
                        ..
                    }
                ),
                "{err}"
            );
        },
    );
}

/// Suspend/restore cycles of each trip: 3 here, 50 under `make soak`
/// (`SPACE_ARCHIVE_CYCLES`).
fn cycles() -> usize {
    std::env::var("SPACE_ARCHIVE_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
}

#[test]
fn through_a_local_directory_store() {
    let store = tempfile::tempdir().unwrap();
    trip(StoreConfig::Local(store.path().join("objects")), cycles());
}

#[test]
fn through_garage() {
    let garage = Garage::start();
    trip(garage.config("node"), cycles());
}

/// A node whose disk is gone: a fresh data directory, the same store and key, finds every
/// archived sandbox (template included) and restores it.
#[test]
fn a_fresh_node_finds_and_restores_archived_sandboxes() {
    let garage = Garage::start();
    let store = garage.config("fresh");
    let keys = tempfile::tempdir().unwrap();
    let key = keys.path().join("master.key");
    let (tx, rx) = std::sync::mpsc::channel();
    let cfg = archive_config(&store, &key, None);
    with_node(
        Disk::Btrfs,
        |c| c.archive = Some(cfg),
        |node| async move {
            build_minimal(&node, "1").await;
            let mut ids = Vec::new();
            for _ in 0..2 {
                let id = create(&node, SandboxOptions::default()).await;
                let g = node.guest(&id).await.unwrap();
                let sha = write_random(&g, "/root/keep.bin", 300_000).await;
                sh(&g, "sync").await;
                let pid = start_sleeper(&g).await;
                drop(g);
                node.suspend(&id).await.unwrap();
                ids.push((id, sha, pid));
            }
            // A killed sandbox's head says so: no node brings it back.
            let gone = create(&node, SandboxOptions::default()).await;
            node.suspend(&gone).await.unwrap();
            node.kill(&gone).await.unwrap();
            tx.send(ids).unwrap();
        },
    );
    let ids = rx.recv().unwrap();

    // The old data directory is gone with its node. A new one, same store, same key:
    let cfg = archive_config(&store, &key, None);
    with_node(
        Disk::Btrfs,
        |c| c.archive = Some(cfg),
        |node| async move {
            assert!(node.templates().unwrap().is_empty(), "nothing local yet");
            let adopted = node.take_adopted();
            assert_eq!(adopted.len(), 2);
            for (id, sha, pid) in &ids {
                let info = node.info(id).await.unwrap();
                assert_eq!(info.state, State::Suspended);
                assert_eq!(info.tenant, "default");
                node.restore(id).await.unwrap();
                let g = node.guest(id).await.unwrap();
                assert_eq!(&guest_sha(&g, "/root/keep.bin").await, sha);
                assert!(alive(&g, *pid).await);
            }
            // The template came down from the store with the first restore.
            assert_eq!(node.templates().unwrap().len(), 1);
            assert!(node.take_adopted().is_empty(), "handed out once");
        },
    );

    // A third node with another master key sees the sandboxes and cannot open them: each is
    // skipped with the key named in the log, and nothing is written.
    let other = keys.path().join("other.key");
    let cfg = archive_config(&store, &other, None);
    with_node(
        Disk::Btrfs,
        |c| c.archive = Some(cfg),
        |node| async move {
            assert!(node.take_adopted().is_empty());
            assert!(node.list().await.unwrap().is_empty());
        },
    );
}

/// The store goes away: an explicit suspend fails clearly and the sandbox runs on, as it was;
/// once the store is back the same suspend works. A restore with the store away fails clearly
/// and the sandbox stays Suspended.
#[test]
fn a_store_that_goes_away_loses_nothing() {
    let garage = Garage::start();
    let store = garage.config("outage");
    let garage = Arc::new(std::sync::Mutex::new(garage));
    let g2 = garage.clone();
    with_store_node(&store, |node| async move {
        let stop = || g2.lock().unwrap().stop();
        let restart = || g2.lock().unwrap().restart();
        build_minimal(&node, "1").await;
        let id = create(&node, SandboxOptions::default()).await;
        let g = node.guest(&id).await.unwrap();
        let sha = write_random(&g, "/root/x.bin", 100_000).await;
        sh(&g, "sync").await;
        drop(g);
        // The template goes up with the first suspend; make that one work.
        node.suspend(&id).await.unwrap();
        node.restore(&id).await.unwrap();

        stop();
        let err = node.suspend(&id).await.unwrap_err();
        assert!(matches!(err, NodeError::Archive(_)), "{err}");
        assert!(err.to_string().contains("object store"), "{err}");
        let info = node.info(&id).await.unwrap();
        assert_eq!(info.state, State::Running, "the sandbox runs on");
        let g = node.guest(&id).await.unwrap();
        assert_eq!(guest_sha(&g, "/root/x.bin").await, sha);
        drop(g);

        restart();
        let s = node.suspend(&id).await.unwrap();
        assert!(s.remote.is_some());
        stop();
        let err = node.restore(&id).await.unwrap_err();
        assert!(matches!(err, NodeError::Archive(_)), "{err}");
        assert_eq!(node.info(&id).await.unwrap().state, State::Suspended);
        restart();
        node.restore(&id).await.unwrap();
        let g = node.guest(&id).await.unwrap();
        assert_eq!(guest_sha(&g, "/root/x.bin").await, sha);
    });
    drop(garage);
}

/// An upload cut in the middle (the store's connections closed after a few MiB of a
/// suspend's packs, as a dying server or a broken network does): the suspend fails naming the
/// store, the sandbox runs on with its files, and the store's head still names the last
/// complete upload; once the store answers again, the suspend goes through and the sandbox
/// comes back from the store whole.
#[test]
fn an_upload_cut_midway_loses_nothing() {
    let garage = Garage::start();
    let proxy = Arc::new(CutProxy::start(
        garage.endpoint.trim_start_matches("http://"),
    ));
    let mut store = garage.config("cut");
    if let StoreConfig::S3(c) = &mut store {
        c.endpoint = Some(proxy.endpoint.clone());
    }
    let p2 = proxy.clone();
    with_store_node(&store, |node| async move {
        build_minimal(&node, "1").await;
        let id = create(&node, SandboxOptions::default()).await;
        let g = node.guest(&id).await.unwrap();
        let small = write_random(&g, "/root/small.bin", 100_000).await;
        sh(&g, "sync").await;
        drop(g);
        // The template and a first state of the sandbox go up whole.
        let first = node.suspend(&id).await.unwrap();
        assert!(first.remote.is_some());
        node.restore(&id).await.unwrap();

        // Enough new bytes that the next upload takes several packs.
        let g = node.guest(&id).await.unwrap();
        sh(&g, "head -c 24000000 /dev/urandom > /root/big.bin && sync").await;
        let big = guest_sha(&g, "/root/big.bin").await;
        drop(g);
        p2.arm(4 << 20);
        let err = node.suspend(&id).await.unwrap_err();
        assert!(p2.was_cut(), "the upload finished inside the budget");
        assert!(matches!(err, NodeError::Archive(_)), "{err:?}");
        assert!(err.to_string().contains("object store"), "{err}");
        let info = node.info(&id).await.unwrap();
        assert_eq!(info.state, State::Running, "the sandbox runs on");
        assert!(info.pending.is_none(), "{:?}", info.pending);
        let g = node.guest(&id).await.unwrap();
        assert_eq!(guest_sha(&g, "/root/big.bin").await, big);
        drop(g);

        p2.heal();
        let archive = node.archive().unwrap().archive.clone();
        let head = archive.head(id.as_str()).await.unwrap().unwrap();
        assert_eq!(
            head.snapshot,
            first.id.as_str(),
            "the head moved past a cut upload"
        );
        let s = node.suspend(&id).await.unwrap();
        assert!(s.remote.is_some());
        node.restore(&id).await.unwrap();
        let g = node.guest(&id).await.unwrap();
        assert_eq!(guest_sha(&g, "/root/big.bin").await, big);
        assert_eq!(guest_sha(&g, "/root/small.bin").await, small);
    });
    drop(proxy);
    drop(garage);
}

/// Crypto-shredding: a lineage's key is destroyed once every sandbox of it has been killed for
/// the retention's maximum age (a fork still alive keeps it); its local snapshots go with it,
/// and garbage collection then empties the store of it.
#[test]
fn killed_lineages_are_shredded_after_retention() {
    let store = tempfile::tempdir().unwrap();
    let objects = store.path().join("objects");
    let cfg = archive_config(
        &StoreConfig::Local(objects.clone()),
        &store.path().join("master.key"),
        None,
    );
    with_node(
        Disk::Btrfs,
        |c| {
            c.archive = Some(cfg);
            c.rolling.retention.max_age = Duration::from_secs(1);
        },
        |node| async move {
            build_minimal(&node, "1").await;
            let a = create(&node, SandboxOptions::default()).await;
            node.suspend(&a).await.unwrap();
            node.restore(&a).await.unwrap();
            let b = node.fork(&a).await.unwrap().id;
            let lineage = node.info(&b).await.unwrap().lineage().to_owned();
            assert_eq!(lineage, a.as_str(), "a fork joins its parent's lineage");
            let keyring = node.archive().unwrap().keyring.clone();

            node.kill(&a).await.unwrap();
            tokio::time::sleep(Duration::from_millis(1500)).await;
            node.reconcile_snapshots().await;
            keyring
                .lineage_keys("default", &lineage, false, true)
                .await
                .expect("the fork keeps the lineage's key");
            assert!(node.info(&a).await.unwrap().shredded_unix_ms.is_none());

            node.kill(&b).await.unwrap();
            tokio::time::sleep(Duration::from_millis(1500)).await;
            node.reconcile_snapshots().await;
            let err = keyring
                .lineage_keys("default", &lineage, false, true)
                .await
                .unwrap_err();
            assert!(err.to_string().contains("destroyed"), "{err}");
            for id in [&a, &b] {
                let r = node.info(id).await.unwrap();
                assert!(r.shredded_unix_ms.is_some(), "{id}");
                assert!(r.snapshots.is_empty());
                let dir = node.layout().snapshots_of(id.as_str()).unwrap();
                let left = std::fs::read_dir(&dir).map(|d| d.count()).unwrap_or(0);
                assert_eq!(left, 0, "local snapshots of {id} left");
            }
            // The sealed objects are still in the store until garbage collection.
            let packs = objects.join("lineages").join(&lineage).join("packs");
            assert!(std::fs::read_dir(&packs).unwrap().count() > 0);
            let gc = node.collect_garbage(Duration::ZERO).await.unwrap();
            assert_eq!(
                gc.shredded_removed,
                std::slice::from_ref(&lineage),
                "{gc:?}"
            );
            assert_eq!(std::fs::read_dir(&packs).map(|d| d.count()).unwrap_or(0), 0);
        },
    );
}

/// The archive pass keeps a running sandbox's newest state in the store: every upload interval
/// it takes a full snapshot and uploads it incrementally (a lost disk loses at most that much);
/// within the interval it does nothing.
#[test]
fn running_sandboxes_go_up_every_interval() {
    let store = tempfile::tempdir().unwrap();
    let mut cfg = archive_config(
        &StoreConfig::Local(store.path().join("objects")),
        &store.path().join("master.key"),
        None,
    );
    cfg.upload_interval = Some(Duration::from_secs(2));
    with_node(
        Disk::Btrfs,
        |c| c.archive = Some(cfg),
        |node| async move {
            build_minimal(&node, "1").await;
            let id = create(&node, SandboxOptions::default()).await;
            let first = node.reconcile_archive().await;
            assert_eq!(first.uploaded.len(), 1, "{first:?}");
            let again = node.reconcile_archive().await;
            assert!(again.uploaded.is_empty(), "within the interval: {again:?}");
            tokio::time::sleep(Duration::from_millis(2100)).await;
            let later = node.reconcile_archive().await;
            assert_eq!(later.uploaded.len(), 1, "{later:?}");
            let info = node.info(&id).await.unwrap();
            assert_eq!(info.state, State::Running);
            let up: Vec<_> = info
                .snapshots
                .iter()
                .filter_map(|s| s.remote.clone())
                .collect();
            assert_eq!(up.len(), 2);
            eprintln!(
                "periodic uploads: {} then {} bytes",
                up[0].uploaded_bytes, up[1].uploaded_bytes
            );
            assert!(up[1].uploaded_bytes < 8 << 20, "incremental: {up:?}");
            // The store's head names the newest.
            let head = node
                .archive()
                .unwrap()
                .archive
                .head(id.as_str())
                .await
                .unwrap()
                .unwrap();
            assert_eq!(head.manifest_hash, up[1].manifest_hash);
        },
    );
}

/// Every pack file under `dir` (a directory store), recursively.
fn pack_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_owned()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                todo.push(p);
            } else if p.parent().is_some_and(|q| q.ends_with("packs")) {
                out.push(p);
            }
        }
    }
    out
}

/// A restore from the store puts the VM's files in the sandbox directory: when a chunk turns
/// out corrupt, the restore fails naming the pack and the sandbox is Suspended (at once, or
/// when the background meets the chunk), and nothing of the half-made fetch is left there.
/// With the pack repaired the same restore brings everything back.
#[test]
fn a_corrupt_pack_fails_the_restore_and_leaves_nothing() {
    let store_dir = tempfile::tempdir().unwrap();
    let objects = store_dir.path().join("objects");
    let store = StoreConfig::Local(objects.clone());
    with_store_node(&store, |node| async move {
        build_minimal(&node, "1").await;
        let id = create(&node, SandboxOptions::default()).await;
        let g = node.guest(&id).await.unwrap();
        let data = write_random(&g, "/root/data.bin", 4 << 20).await;
        sh(&g, "sync").await;
        drop(g);
        let s = node.suspend(&id).await.unwrap();
        assert!(!snapshot_dir(&node, &id, s.id.as_str()).exists());

        // Flip a byte in the middle of every pack of this sandbox's lineage.
        let lineage = objects.join("lineages").join(id.as_str());
        let packs = pack_files(&lineage);
        assert!(!packs.is_empty(), "no packs under {}", lineage.display());
        let originals: Vec<Vec<u8>> = packs.iter().map(|p| std::fs::read(p).unwrap()).collect();
        for (p, bytes) in packs.iter().zip(&originals) {
            let mut bad = bytes.clone();
            let mid = bad.len() / 2;
            bad[mid] ^= 0x5a;
            std::fs::write(p, bad).unwrap();
        }
        // The restore is lazy: it fails as it starts the VM if the VM touches a corrupt
        // chunk, else the background meets one and the sandbox is Suspended again. Either
        // way the error names the pack, and nothing of it is installed or left.
        match node.restore(&id).await {
            Err(err) => {
                assert!(matches!(err, NodeError::Archive(_)), "{err}");
                assert!(err.to_string().contains("pack"), "{err}");
            }
            Ok(()) => {
                let deadline = std::time::Instant::now() + Duration::from_secs(120);
                loop {
                    let info = node.info(&id).await.unwrap();
                    if info.state == State::Suspended {
                        let ev = info.recoveries.last().expect("a recovery event");
                        assert_eq!(ev.action, space_node::RecoveryAction::RestoreFailed);
                        assert!(ev.detail.contains("pack"), "{}", ev.detail);
                        break;
                    }
                    assert!(
                        std::time::Instant::now() < deadline,
                        "the restore of corrupt packs did not fail: {:?}",
                        info.state
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        assert_eq!(node.info(&id).await.unwrap().state, State::Suspended);
        let sandbox_dir = node.layout().sandbox_dir(id.as_str()).unwrap();
        for leftover in ["mem", "rootfs.ext4", ".incoming", ".lazy"] {
            assert!(
                !sandbox_dir.join(leftover).exists(),
                "{leftover} is left in the sandbox directory"
            );
        }

        for (p, bytes) in packs.iter().zip(&originals) {
            std::fs::write(p, bytes).unwrap();
        }
        node.restore(&id).await.unwrap();
        let g = node.guest(&id).await.unwrap();
        assert_eq!(guest_sha(&g, "/root/data.bin").await, data);
    });
}
