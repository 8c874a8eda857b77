//! Lazy restores from the object store on real guests and a real S3 server (Garage): the VM
//! runs before its RAM and disk have arrived (`docs/archive.md`, *Lazy restore*).
//!
//! - A 2 GiB guest holding 1 GiB of random data and a running process, restored on a node
//!   with an empty data directory (nothing of it, or of its template, local): its data is
//!   checked by SHA-256 while the rest still streams in, the process runs on, and a snapshot
//!   taken during the stream restores again with the same data. Once the files are whole
//!   the VM moves to a new VMM on them: nothing stays mounted, and a process's output that
//!   streamed to the host throughout arrives whole, each line once.
//! - Garage stopped while a restore still needs chunks: the guest waits a bounded time, then
//!   the VM is stopped, the sandbox is Suspended again with the reason recorded, nothing of
//!   the restore is left, and once Garage is back it restores whole.
//!
//! - A snapshot with a prefetch list (recorded by a lazy restore, uploaded by the suspend
//!   after it) restored while Garage is stopped: the restore answers the store's error, the
//!   sandbox stays Suspended on the same snapshot with nothing left of the attempt, and once
//!   Garage is back it restores with its list (the VM waits for it, paused) and its data.
//!
//! - A lazily restored VM that moved to its local files, handed to the next node start by one
//!   that stops leaving its VMs running: adopted, the same QEMU, its process and data.
//!
//! `SPACE_TEST_LAZY_RAM_MIB` and `SPACE_TEST_LAZY_DATA_MIB` change the first guest's size
//! (2048 and 1024 by default).

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use space_archive::lazy::LazyOptions;
use space_archive::testing::Garage;
use space_archive::StoreConfig;
use space_node::{
    ArchiveConfig, CreateRequest, Node, RecoveryAction, RestoreMode, SandboxId, SandboxOptions,
    SnapshotKind, State, TemplateRef, TemplateSpec,
};
use space_proto::{ExecSpec, GuestClient};

/// Builds `minimal` with `memory_mib` of RAM as version `version`.
async fn build_sized(node: &Node, version: &str, memory_mib: u64) -> TemplateRef {
    let template = TemplateRef::new("minimal", version).unwrap();
    node.build_template(TemplateSpec {
        template: template.clone(),
        kernel: env_path("SPACE_KERNEL"),
        rootfs: env_path("SPACE_ROOTFS_MINIMAL"),
        vcpus: 1,
        memory_mib,
        kernel_cmdline: None,
        ready_timeout: Duration::from_secs(300),
        guest: Default::default(),
        start: None,
        source: String::new(),
    })
    .await
    .expect("building the template");
    template
}

async fn create_sized(node: &Node, t: &TemplateRef, disk_mib: u64) -> SandboxId {
    let mut req = CreateRequest::new(t.name.clone());
    req.version = space_node::VersionReq::Exact(t.version.clone());
    req.options = SandboxOptions {
        disk_mib: Some(disk_mib),
        ..Default::default()
    };
    node.create(req).await.expect("create").id
}

/// Runs `line` with a long deadline (a big guest under emulation is slow); its stdout.
async fn sh_long(g: &GuestClient, line: &str) -> String {
    sh_within(g, line, Some(900_000)).await
}

/// Writes `mib` MiB of random data to `/root/data` in the guest, synced; its SHA-256.
async fn write_data(g: &GuestClient, mib: u64) -> String {
    sh_long(
        g,
        &format!("dd if=/dev/urandom of=/root/data bs=1M count={mib} 2>/dev/null && sync"),
    )
    .await;
    sum_in_guest(g, "/root/data").await
}

/// `sha256sum` of a guest file, computed in the guest.
async fn sum_in_guest(g: &GuestClient, path: &str) -> String {
    sh_long(g, &format!("sha256sum {path}"))
        .await
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// Waits until the lazily restored VM of `id` has moved to its local files.
async fn moved_to_local_files(node: &Node, id: &SandboxId) {
    wait_until(
        "the VM moved to its local files",
        Duration::from_secs(120),
        || {
            node.last_restore(id)
                .is_some_and(|r| r.handed_over.is_some())
        },
    )
    .await;
}

fn config(store: &StoreConfig, key: &Path, lazy: Option<LazyOptions>) -> ArchiveConfig {
    let mut cfg = archive_over(store, key);
    cfg.cache_max_bytes = Some(0);
    cfg.lazy = lazy;
    cfg
}

#[test]
fn a_big_guest_restores_from_the_store_while_it_streams_in() {
    let ram = env_number("SPACE_TEST_LAZY_RAM_MIB", 2048);
    let data = env_number("SPACE_TEST_LAZY_DATA_MIB", 1024);
    let garage = Garage::start();
    let store = garage.config("lazy-big");
    let keys = tempfile::tempdir().unwrap();
    let key = keys.path().join("master.key");
    let (tx, rx) = std::sync::mpsc::channel();
    let cfg = config(&store, &key, Some(LazyOptions::default()));
    with_node(
        Disk::Btrfs,
        |c| {
            c.archive = Some(cfg);
            c.ready_timeout = Duration::from_secs(300);
        },
        |node| async move {
            let t = build_sized(&node, "big", ram).await;
            let id = create_sized(&node, &t, data + 1024).await;
            let g = node.guest(&id).await.unwrap();
            let sum = write_data(&g, data).await;
            let pid = start_sleeper(&g).await;
            drop(g);
            let s = node.suspend(&id).await.unwrap();
            assert!(s.remote.is_some());
            tx.send((id, sum, pid)).unwrap();
        },
    );
    let (id, sum, pid) = rx.recv().unwrap();

    // Another node: an empty data directory, the same store and key.
    let cfg = config(&store, &key, Some(LazyOptions::default()));
    with_node(
        Disk::Btrfs,
        |c| {
            c.archive = Some(cfg);
            c.ready_timeout = Duration::from_secs(300);
        },
        |node| async move {
            assert!(node.templates().unwrap().is_empty(), "nothing local yet");
            assert_eq!(node.take_adopted().len(), 1);
            let t0 = Instant::now();
            node.restore(&id).await.unwrap();
            let restored_in = t0.elapsed();
            let r = node.last_restore(&id).unwrap();
            assert!(r.from_store && r.fetch.is_none(), "{r:?}");
            assert!(
                r.lazy.is_none(),
                "the files were whole when the restore returned ({restored_in:?})"
            );
            let g = node.guest(&id).await.unwrap();
            // A process whose output streams to the host until told to stop: the stream
            // must survive the VM's move to its local files.
            let counter = g
                .exec(ExecSpec::shell(
                    "i=0; while [ ! -e /tmp/stop ]; do i=$((i+1)); echo $i; sleep 0.1; done; echo end",
                ))
                .await
                .unwrap();
            let counter = tokio::spawn(counter.output());
            assert!(alive(&g, pid).await, "the process runs on");
            assert_eq!(sum_in_guest(&g, "/root/data").await, sum);

            // A snapshot taken while the rest streams in: it waits until the files are
            // whole, and is the guest's state.
            let snap = node.snapshot(&id, SnapshotKind::Full).await.unwrap();

            // Then the node leaves the data path: the VM moves to a new VMM on its local
            // files, the mounts and the lazy restore's files go, and the host's streams to
            // the guest go on (the same connection, the same process output).
            let dir = node.layout().sandbox_dir(id.as_str()).unwrap();
            moved_to_local_files(&node, &id).await;
            assert!(!dir.join(".lazy").exists());
            let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
            let dir_text = dir.to_string_lossy().into_owned();
            assert!(
                !mounts.lines().any(|l| l.contains(&dir_text)),
                "nothing is mounted in the sandbox directory any more:\n{mounts}"
            );
            assert!(alive(&g, pid).await, "the process runs on after the move");
            assert_eq!(sum_in_guest(&g, "/root/data").await, sum);
            sh(&g, "touch /tmp/stop").await;
            let out = tokio::time::timeout(Duration::from_secs(120), counter)
                .await
                .expect("the counter ends")
                .unwrap()
                .expect("its stream went on through the move");
            assert!(out.status.success(), "{:?}", out.status);
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let lines: Vec<&str> = text.lines().collect();
            assert_eq!(lines.last(), Some(&"end"), "{text}");
            let numbers: Vec<u64> = lines[..lines.len() - 1]
                .iter()
                .map(|l| {
                    l.parse()
                        .unwrap_or_else(|_| panic!("a line {l:?} in {text}"))
                })
                .collect();
            assert!(numbers.len() > 5, "{text}");
            assert!(
                numbers.iter().enumerate().all(|(i, n)| *n == i as u64 + 1),
                "every line once, in order: {text}"
            );
            let r = node.last_restore(&id).unwrap();
            let lazy = r
                .lazy
                .clone()
                .expect("the files are whole once a snapshot is taken");
            assert!(lazy.urgent_chunks > 0, "{lazy:?}");
            eprintln!("restore to ready {restored_in:?}; {r:?}");
            sh(&g, "echo after > /root/marker && sync").await;
            drop(g);
            node.rollback(&id, &snap.id).await.unwrap();
            let g = node.guest(&id).await.unwrap();
            assert!(!exists(&g, "/root/marker").await, "rolled back");
            assert!(alive(&g, pid).await);
            assert_eq!(sum_in_guest(&g, "/root/data").await, sum);
            drop(g);

            // The record keeps what the restore waited for; the next upload lists it.
            let info = node.info(&id).await.unwrap();
            assert!(!info.prefetch.is_empty());
        },
    );
}

#[test]
fn the_store_going_away_mid_restore_leaves_the_sandbox_suspended_and_restorable() {
    let garage = Garage::start();
    let store = garage.config("lazy-gone");
    let garage = Arc::new(std::sync::Mutex::new(garage));
    let keys = tempfile::tempdir().unwrap();
    // No background fetching: what the guest has not touched stays in the store, so the
    // store can go away while the restore still needs it.
    let opts = LazyOptions {
        parallel: 0,
        read_timeout: Duration::from_secs(3),
        attempts: 2,
        ..Default::default()
    };
    let limit = opts.stall_limit();
    let cfg = config(&store, &keys.path().join("master.key"), Some(opts));
    let g2 = garage.clone();
    with_node(
        Disk::Btrfs,
        |c| c.archive = Some(cfg),
        |node| async move {
            build_minimal(&node, "1").await;
            let id = create(&node, SandboxOptions::default()).await;
            let g = node.guest(&id).await.unwrap();
            let sum = write_data(&g, 32).await;
            // Out of the page cache: reading it again goes to the disk.
            sh(&g, "echo 3 > /proc/sys/vm/drop_caches").await;
            let pid = start_sleeper(&g).await;
            drop(g);
            node.suspend(&id).await.unwrap();
            node.restore(&id).await.unwrap();
            assert!(node.last_restore(&id).unwrap().lazy.is_none());

            g2.lock().unwrap().stop();
            let g = node.guest(&id).await.unwrap();
            let t = Instant::now();
            let read = g
                .run(ExecSpec::shell("sha256sum /root/data"))
                .await
                .map(|o| o.status.success());
            assert_ne!(
                read.ok(),
                Some(true),
                "the data was read with the store gone"
            );
            drop(g);
            let deadline = Instant::now() + limit + Duration::from_secs(60);
            let info = loop {
                let info = node.info(&id).await.unwrap();
                if info.state == State::Suspended {
                    break info;
                }
                assert!(Instant::now() < deadline, "still {:?}", info.state);
                tokio::time::sleep(Duration::from_millis(200)).await;
            };
            eprintln!("failed {:?} after the read", t.elapsed());
            let ev = info.recoveries.last().unwrap();
            assert_eq!(ev.action, RecoveryAction::RestoreFailed);
            assert!(ev.detail.contains("object store"), "{}", ev.detail);
            let dir = node.layout().sandbox_dir(id.as_str()).unwrap();
            for leftover in ["mem", "rootfs.ext4", ".lazy"] {
                assert!(!dir.join(leftover).exists(), "{leftover} is left");
            }

            // Back: the same snapshot restores whole.
            g2.lock().unwrap().restart();
            node.set_restore_mode(RestoreMode::Eager);
            node.restore(&id).await.unwrap();
            let g = node.guest(&id).await.unwrap();
            assert_eq!(sum_in_guest(&g, "/root/data").await, sum);
            assert!(alive(&g, pid).await);
        },
    );
    drop(garage);
}

#[test]
fn a_listed_snapshot_restores_after_the_store_was_gone_for_a_restore() {
    let garage = Garage::start();
    let store = garage.config("lazy-gate");
    let keys = tempfile::tempdir().unwrap();
    let opts = LazyOptions {
        read_timeout: Duration::from_secs(3),
        attempts: 2,
        ..Default::default()
    };
    let cfg = config(&store, &keys.path().join("master.key"), Some(opts));
    let garage = Arc::new(std::sync::Mutex::new(garage));
    let g2 = garage.clone();
    with_node(
        Disk::Btrfs,
        |c| c.archive = Some(cfg),
        |node| async move {
            build_minimal(&node, "1").await;
            let id = create(&node, SandboxOptions::default()).await;
            let g = node.guest(&id).await.unwrap();
            let sum = write_data(&g, 16).await;
            let pid = start_sleeper(&g).await;
            drop(g);
            // A lazy restore records what its VM touched; the next suspend uploads the list.
            let first = node.suspend(&id).await.unwrap();
            node.restore(&id).await.unwrap();
            assert!(node.last_restore(&id).unwrap().prefetch.is_none());
            let g = node.guest(&id).await.unwrap();
            assert_eq!(sum_in_guest(&g, "/root/data").await, sum);
            drop(g);
            let listed = node.suspend(&id).await.unwrap();
            assert_ne!(listed.id, first.id);
            assert!(!node.info(&id).await.unwrap().prefetch.is_empty());

            g2.lock().unwrap().stop();
            let t = Instant::now();
            let err = node.restore(&id).await.unwrap_err();
            eprintln!("the restore failed after {:?}: {err}", t.elapsed());
            assert!(err.to_string().contains("object store"), "{err}");
            let info = node.info(&id).await.unwrap();
            assert_eq!(info.state, State::Suspended);
            let dir = node.layout().sandbox_dir(id.as_str()).unwrap();
            for leftover in ["mem", "rootfs.ext4", ".lazy"] {
                assert!(!dir.join(leftover).exists(), "{leftover} is left");
            }

            // Back: the same snapshot restores, with its list, and nothing was lost.
            g2.lock().unwrap().restart();
            node.restore(&id).await.unwrap();
            let r = node.last_restore(&id).unwrap();
            assert!(
                r.from_store && r.prefetch.is_some_and(|(n, _)| n > 0),
                "{r:?}"
            );
            let g = node.guest(&id).await.unwrap();
            assert_eq!(sum_in_guest(&g, "/root/data").await, sum);
            assert!(alive(&g, pid).await);
        },
    );
    drop(garage);
}

/// Once its files are whole and it moved to them, a lazily restored VM is like any other: a
/// node that stops leaving its VMs running hands it to the next start, which adopts the same
/// QEMU (not a restore from the store), with the guest's process and data.
#[test]
fn a_restored_vm_on_its_local_files_is_adopted_by_the_next_start() {
    let garage = Garage::start();
    let store = garage.config("lazy-adopt");
    let keys = tempfile::tempdir().unwrap();
    let key = keys.path().join("master.key");
    let cfg = config(&store, &key, Some(LazyOptions::default()));
    let opened: Arc<std::sync::Mutex<Option<space_node::NodeConfig>>> = Default::default();
    let slot = opened.clone();
    with_node_opened(
        Disk::Btrfs,
        |c| c.archive = Some(cfg),
        move |c| {
            *slot.lock().unwrap() = Some(c.clone());
            Node::open(c)
        },
        |node| async move {
            build_minimal(&node, "1").await;
            let id = create(&node, SandboxOptions::default()).await;
            let g = node.guest(&id).await.unwrap();
            let sum = write_random(&g, "/root/data.bin", 8 << 20).await;
            let pid = start_sleeper(&g).await;
            drop(g);
            let s = node.suspend(&id).await.unwrap();
            assert!(s.remote.is_some());
            for s in node.snapshots(&id).await.unwrap() {
                if s.local && s.remote.is_some() {
                    node.evict_local(&id, &s.id).await.unwrap();
                }
            }
            node.restore(&id).await.unwrap();
            assert!(node.last_restore(&id).unwrap().from_store);
            moved_to_local_files(&node, &id).await;
            let dir = node.layout().sandbox_dir(id.as_str()).unwrap();
            let qemu = std::fs::read_to_string(dir.join("qemu.pid")).unwrap();
            node.shutdown_detach().await;

            let cfg = opened.lock().unwrap().clone().unwrap();
            let node = Node::open(cfg).await.expect("reopening the node");
            let info = node.info(&id).await.unwrap();
            assert_eq!(info.state, State::Running);
            let ev = info.recoveries.last().expect("an adoption event");
            assert_eq!(ev.action, RecoveryAction::Adopted, "{ev:?}");
            assert_eq!(
                std::fs::read_to_string(dir.join("qemu.pid")).unwrap(),
                qemu,
                "the same QEMU"
            );
            let g = node.guest(&id).await.unwrap();
            assert!(alive(&g, pid).await, "the process runs on");
            assert_eq!(guest_sha(&g, "/root/data.bin").await, sum);
            drop(g);
            node.kill(&id).await.unwrap();
            node.shutdown().await;
        },
    );
}
