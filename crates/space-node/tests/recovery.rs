//! Crash recovery with real guests and real processes:
//!
//! - a QEMU killed with SIGKILL under a running node comes back from its newest full snapshot
//!   (what was written before it is there, what came after is not, a process started before it
//!   runs), and the record says so;
//! - a node process killed with SIGKILL leaves its VMs running; a new node on the same data
//!   directory adopts them: same ids, same states, same QEMU processes, a guest process started
//!   before still running, exec working; orphans are removed; a second pass changes nothing;
//! - a node killed in the middle of a suspend/restore loop leaves nothing the next node cannot
//!   finish or undo.
//!
//! The node that gets killed is this test binary run again (`--exact child_node`) with
//! `SPACE_RECOVERY_CHILD` naming what it should do; it prints what it made on stdout. A guard
//! kills the child and every QEMU under the test's data directory, whatever happens.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::*;
use space_node::storage::{DriverKind, StorageOptions};
use space_node::{
    Node, NodeConfig, RecoveryAction, SandboxId, SandboxOptions, SnapshotKind, State,
};
use space_proto::ExecSpec;

const CHILD_ENV: &str = "SPACE_RECOVERY_CHILD";
const DATA_ENV: &str = "SPACE_RECOVERY_DATA";

fn config(data: &Path) -> NodeConfig {
    let mut cfg = NodeConfig::new(data);
    cfg.storage = StorageOptions {
        driver: Some(DriverKind::Btrfs),
        loop_image_size: 8 << 30,
        loop_image: true,
    };
    cfg.ready_timeout = Duration::from_secs(120);
    // Only the sandboxes the tests make: no warm-pool members, no rolling snapshots.
    cfg.pools.sizes.clear();
    cfg.pools.default_size = 0;
    cfg.rolling.enabled = false;
    cfg
}

fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            std::env::var("RUST_LOG")
                .unwrap_or_else(|_| "space_node=info,space_runtime=warn".into()),
        )
        .with_test_writer()
        .try_init();
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Owns the data directory. Dropped last: kills the child node, every QEMU whose root or
/// working directory lies under the data directory, unmounts it, removes it.
struct Guard {
    data: PathBuf,
    child: Option<Child>,
    _tmp: tempfile::TempDir,
}

impl Guard {
    fn new() -> Guard {
        init_tracing();
        let tmp = tempfile::Builder::new()
            .prefix("space-recovery-test")
            .tempdir_in("/var/tmp")
            .unwrap();
        Guard {
            data: tmp.path().join("data"),
            child: None,
            _tmp: tmp,
        }
    }

    /// Runs this binary as a node process in `mode`; returns the lines it prints (prefix
    /// `CHILD `), as they come.
    fn spawn_child(&mut self, mode: &str) -> mpsc::Receiver<String> {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "child_node", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, mode)
            .env(DATA_ENV, &self.data)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        self.child = Some(child);
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if let Some(l) = line.strip_prefix("CHILD ") {
                    if tx.send(l.to_owned()).is_err() {
                        return;
                    }
                }
            }
        });
        rx
    }

    fn kill_child(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill(); // SIGKILL
            let _ = c.wait();
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.kill_child();
        kill_qemus_under(&self.data);
        unmount(&self.data);
    }
}

fn kill_qemus_under(data: &Path) {
    for _ in 0..50 {
        let pids = qemus_under(data);
        if pids.is_empty() {
            return;
        }
        for pid in pids {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Live (not zombie) QEMU processes whose root or working directory is a directory under
/// `data/sandboxes` (by inode: a jailed QEMU's root is that directory seen from another
/// mount namespace).
fn qemus_under(data: &Path) -> Vec<u32> {
    use std::os::unix::fs::MetadataExt;
    let dirs: Vec<(u64, u64)> = std::fs::read_dir(data.join("sandboxes"))
        .map(|e| {
            e.filter_map(|e| {
                let m = std::fs::metadata(e.ok()?.path()).ok()?;
                Some((m.dev(), m.ino()))
            })
            .collect()
        })
        .unwrap_or_default();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            if !comm.starts_with("qemu") || stat.contains(") Z ") {
                return None;
            }
            let under = |l: &str| {
                std::fs::read_link(e.path().join(l)).is_ok_and(|p| p.starts_with(data))
                    || std::fs::metadata(e.path().join(l))
                        .is_ok_and(|m| dirs.contains(&(m.dev(), m.ino())))
            };
            (under("root") || under("cwd")).then_some(pid)
        })
        .collect()
}

fn unmount(data: &Path) {
    use std::os::unix::fs::MetadataExt;
    let (Ok(a), Ok(b)) = (
        std::fs::metadata(data),
        std::fs::metadata(data.parent().unwrap()),
    ) else {
        return;
    };
    if a.dev() != b.dev() && nix::mount::umount2(data, nix::mount::MntFlags::empty()).is_err() {
        let _ = nix::mount::umount2(data, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// Waits for the child's next line starting with `key`; returns the rest of it.
fn expect(rx: &mpsc::Receiver<String>, key: &str) -> String {
    loop {
        let line = rx
            .recv_timeout(Duration::from_secs(600))
            .unwrap_or_else(|e| panic!("the child node never said {key:?}: {e}"));
        if let Some(rest) = line.strip_prefix(key) {
            return rest.trim().to_owned();
        }
    }
}

fn qemu_pid(node: &Node, id: &SandboxId) -> u32 {
    let dir = node.layout().sandbox_dir(id.as_str()).unwrap();
    std::fs::read_to_string(dir.join("qemu.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Every snapshot directory of `id` is listed in its record, and every listed one exists.
fn snapshots_consistent(node: &Node, info: &space_node::SandboxInfo) {
    let dir = node.layout().snapshots_of(info.id.as_str()).unwrap();
    let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
        .map(|e| {
            e.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    on_disk.sort();
    let mut listed: Vec<String> = info.snapshots.iter().map(|s| s.id.to_string()).collect();
    listed.sort();
    assert_eq!(on_disk, listed, "snapshot directories vs the record");
}

/// The node process the tests kill. A no-op unless run by one of them.
#[test]
fn child_node() {
    let Ok(mode) = std::env::var(CHILD_ENV) else {
        return;
    };
    let data = PathBuf::from(std::env::var(DATA_ENV).unwrap());
    init_tracing();
    runtime().block_on(async move {
        let node = Node::open(config(&data)).await.expect("opening the node");
        match mode.as_str() {
            "adopt" => {
                let a = create(&node, SandboxOptions::default()).await;
                let g = node.guest(&a).await.unwrap();
                let sha = write_random(&g, "/root/before.bin", 40_000).await;
                let pid = start_sleeper(&g).await;
                println!("CHILD a {a} {pid} {sha} {}", qemu_pid(&node, &a));
                let b = create(&node, SandboxOptions::default()).await;
                let pid = start_sleeper(&node.guest(&b).await.unwrap()).await;
                node.pause(&b).await.unwrap();
                println!("CHILD b {b} {pid}");
                let c = create(&node, SandboxOptions::default()).await;
                node.suspend(&c).await.unwrap();
                println!("CHILD c {c}");
                println!("CHILD ready");
            }
            "suspend-loop" => {
                let s = create(&node, SandboxOptions::default()).await;
                let g = node.guest(&s).await.unwrap();
                let sha = write_random(&g, "/root/before.bin", 40_000).await;
                sh(&g, "sync").await;
                println!("CHILD s {s} {sha}");
                for i in 0.. {
                    node.suspend(&s).await.unwrap();
                    node.restore(&s).await.unwrap();
                    node.snapshot(&s, SnapshotKind::Disk).await.unwrap();
                    println!("CHILD iteration {i}");
                }
            }
            other => panic!("unknown child mode {other}"),
        }
        // Wait to be killed.
        std::future::pending::<()>().await;
    });
}

/// Builds the `minimal` template with a node of this process, then lets that node go.
fn prepare(data: &Path) {
    runtime().block_on(async {
        let node = Node::open(config(data)).await.unwrap();
        build_minimal(&node, "1").await;
        node.shutdown().await;
    });
}

#[test]
fn a_killed_qemu_comes_back_from_its_newest_full_snapshot() {
    with_node(
        Disk::Btrfs,
        |c| {
            c.pools.sizes.clear();
            c.pools.default_size = 0;
            c.rolling.enabled = false;
        },
        |node| async move {
            build_minimal(&node, "1").await;
            let id = create(&node, SandboxOptions::default()).await;
            let g = node.guest(&id).await.unwrap();
            let kept = write_random(&g, "/root/kept.bin", 50_000).await;
            let pid = start_sleeper(&g).await;
            node.snapshot(&id, SnapshotKind::Disk).await.unwrap();
            let full = node.snapshot(&id, SnapshotKind::Full).await.unwrap();
            write_random(&g, "/root/after.bin", 1000).await;

            let before = qemu_pid(&node, &id);
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(before as i32),
                nix::sys::signal::Signal::SIGKILL,
            )
            .unwrap();
            // Bounded wait for the monitor (not a timing assertion: restores under TCG on a
            // loaded host take seconds).
            let t0 = Instant::now();
            let info = loop {
                let info = node.info(&id).await.unwrap();
                if info.state == State::Running && !info.recoveries.is_empty() {
                    break info;
                }
                assert_ne!(info.state, State::Failed, "{info:?}");
                assert!(t0.elapsed() < Duration::from_secs(300), "never restored");
                tokio::time::sleep(Duration::from_millis(50)).await;
            };
            let ev = info.recoveries.last().unwrap();
            assert_eq!(ev.action, RecoveryAction::Restored);
            assert_eq!(ev.snapshot.as_ref(), Some(&full.id));
            assert!(ev.detail.contains("exited"), "{ev:?}");
            assert!(info.pending.is_none() && info.failure.is_none());
            assert_ne!(qemu_pid(&node, &id), before);

            let g = node.guest(&id).await.unwrap();
            assert_eq!(guest_sha(&g, "/root/kept.bin").await, kept);
            assert!(!exists(&g, "/root/after.bin").await);
            assert!(alive(&g, pid).await);
            assert_eq!(sh(&g, "echo ok").await.trim(), "ok");
            // The record on disk says the same.
            let on_disk: space_node::SandboxRecord =
                serde_json::from_slice(&record_bytes(&node, &id)).unwrap();
            assert_eq!(on_disk.recoveries, info.recoveries);
        },
    );
}

#[test]
fn a_restarted_node_adopts_the_vms_of_a_killed_one() {
    let mut guard = Guard::new();
    prepare(&guard.data);
    let rx = guard.spawn_child("adopt");
    let a_line = expect(&rx, "a ");
    let b_line = expect(&rx, "b ");
    let c_line = expect(&rx, "c ");
    expect(&rx, "ready");
    guard.kill_child();

    let a: Vec<&str> = a_line.split(' ').collect();
    let (a_id, a_pid, a_sha, a_qemu): (SandboxId, u32, &str, u32) = (
        a[0].parse().unwrap(),
        a[1].parse().unwrap(),
        a[2],
        a[3].parse().unwrap(),
    );
    let b: Vec<&str> = b_line.split(' ').collect();
    let (b_id, b_pid): (SandboxId, u32) = (b[0].parse().unwrap(), b[1].parse().unwrap());
    let c_id: SandboxId = c_line.parse().unwrap();
    assert!(
        !qemus_under(&guard.data).is_empty(),
        "the VMs died with their node"
    );

    // Leftovers a crash can leave: a sandbox directory without a record, a partial snapshot.
    let orphan = guard.data.join("sandboxes").join("sbx-orphan");
    std::fs::create_dir(&orphan).unwrap();
    std::fs::write(orphan.join("console.log"), b"x").unwrap();
    let partial = guard
        .data
        .join("snapshots")
        .join(a_id.as_str())
        .join(".1700000000000-full-abcd.partial-1-0000abcd");
    std::fs::create_dir_all(&partial).unwrap();

    let data = guard.data.clone();
    runtime().block_on(async move {
        let node = Node::open(config(&data)).await.expect("reopening the node");
        let a = node.info(&a_id).await.unwrap();
        let b = node.info(&b_id).await.unwrap();
        let c = node.info(&c_id).await.unwrap();
        assert_eq!(
            (a.state, b.state, c.state),
            (State::Running, State::Paused, State::Suspended)
        );
        for r in [&a, &b] {
            let ev = r.recoveries.last().expect("an adoption event");
            assert_eq!(ev.action, RecoveryAction::Adopted, "{ev:?}");
        }
        assert!(c.recoveries.is_empty());
        assert_eq!(
            qemu_pid(&node, &a_id),
            a_qemu,
            "the same QEMU, not a new one"
        );
        assert!(!orphan.exists() && !partial.exists());

        // Nothing left to do: a second pass changes nothing.
        let records: Vec<Vec<u8>> = [&a_id, &b_id, &c_id]
            .iter()
            .map(|id| record_bytes(&node, id))
            .collect();
        let again = node.recover().await.unwrap();
        assert!(again.is_empty(), "{again:?}");
        for (id, before) in [&a_id, &b_id, &c_id].iter().zip(&records) {
            assert_eq!(&record_bytes(&node, id), before);
        }

        let g = node.guest(&a_id).await.unwrap();
        assert!(alive(&g, a_pid).await, "a process started before the crash");
        assert_eq!(guest_sha(&g, "/root/before.bin").await, a_sha);
        let out = g
            .run(ExecSpec::shell("echo $((6*7)) > /root/n && cat /root/n"))
            .await
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "42");

        node.resume(&b_id).await.unwrap();
        let g = node.guest(&b_id).await.unwrap();
        assert!(alive(&g, b_pid).await);

        node.restore(&c_id).await.unwrap();
        let g = node.guest(&c_id).await.unwrap();
        assert_eq!(sh(&g, "echo ok").await.trim(), "ok");
        node.shutdown().await;
    });
}

#[test]
fn a_node_killed_mid_operation_leaves_nothing_half_done() {
    let mut guard = Guard::new();
    prepare(&guard.data);
    let rx = guard.spawn_child("suspend-loop");
    let s_line = expect(&rx, "s ");
    expect(&rx, "iteration 1");
    // Somewhere inside the next suspend, restore or snapshot.
    std::thread::sleep(Duration::from_millis(rand::random::<u64>() % 600));
    guard.kill_child();
    let (id, sha) = s_line.split_once(' ').unwrap();
    let id: SandboxId = id.parse().unwrap();
    let sha = sha.to_owned();

    let data = guard.data.clone();
    runtime().block_on(async move {
        let node = Node::open(config(&data)).await.expect("reopening the node");
        let info = node.info(&id).await.unwrap();
        eprintln!(
            "after the kill: {} (events: {:?})",
            info.state, info.recoveries
        );
        assert!(info.pending.is_none(), "{info:?}");
        assert!(
            matches!(info.state, State::Running | State::Suspended),
            "{info:?}"
        );
        snapshots_consistent(&node, &info);
        let bytes = record_bytes(&node, &id);
        let again = node.recover().await.unwrap();
        assert!(again.is_empty(), "{again:?}");
        assert_eq!(record_bytes(&node, &id), bytes);

        if info.state == State::Suspended {
            node.restore(&id).await.unwrap();
        }
        let g = node.guest(&id).await.unwrap();
        assert_eq!(guest_sha(&g, "/root/before.bin").await, sha);
        assert_eq!(sh(&g, "echo ok").await.trim(), "ok");
        node.suspend(&id).await.unwrap();
        node.restore(&id).await.unwrap();
        snapshots_consistent(&node, &node.info(&id).await.unwrap());
        node.shutdown().await;
    });
}
