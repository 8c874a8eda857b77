//! The jail and adoption, with real guests: a VM that outlives the process that started it
//! and is adopted by another; detach and adopt within one process; stale pidfiles; what a
//! jailed QEMU looks like from the host (user, namespaces, root, cgroup); snapshot and restore
//! under the jail; a busy guest under its memory limit; and the unjailed mode. The jail tests
//! need root (they are skipped with a message otherwise).
//!
//! Adoption means a second host connection to a guest whose first host vanished; those tests
//! use the shell guest (whose init reads `space.ctl` line by line and is indifferent to a
//! vanished host), the others `space-guestd` on the `minimal` image. Needs SPACE_KERNEL and
//! SPACE_ROOTFS_MINIMAL (set by `make test`), busybox-static and e2fsprogs.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use space_proto::{ExecSpec, WriteOptions};
use space_runtime::process::ExitInfo;
use space_runtime::{
    Error, GuestClient, JailConfig, QemuRuntime, QemuRuntimeConfig, QemuVm, RestoreSpec, Runtime,
    Vm,
};

async fn runtime_with(detached: bool, jail: Option<JailConfig>) -> QemuRuntime {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("space_runtime=debug")
        .with_test_writer()
        .try_init();
    QemuRuntime::new(QemuRuntimeConfig {
        detached,
        jail,
        ..Default::default()
    })
    .await
    .expect("QEMU runtime")
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Skips a test that needs root, saying so.
macro_rules! require_root {
    () => {
        if !is_root() {
            eprintln!("skipped: the jail needs root");
            return;
        }
    };
}

async fn boot_minimal(rt: &QemuRuntime, dir: &Path) -> (QemuVm, GuestClient) {
    std::fs::create_dir_all(dir).unwrap();
    let vm = rt
        .boot(boot_spec(dir, &env_path("SPACE_ROOTFS_MINIMAL")))
        .await
        .unwrap();
    let client = vm.wait_ready(BOOT_TIMEOUT).await.unwrap();
    (vm, client)
}

async fn sh(client: &GuestClient, line: &str) -> String {
    let out = client.run(ExecSpec::shell(line)).await.unwrap();
    assert!(
        out.status.success(),
        "`{line}` failed: {:?} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.to_vec()).unwrap()
}

/// `(state, start time)` from `/proc/<pid>/stat`, if the process exists.
fn proc_stat(pid: u32) -> Option<(char, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some((f[0].chars().next()?, f[19].parse().ok()?))
}

fn alive(pid: u32) -> bool {
    matches!(proc_stat(pid), Some((s, _)) if s != 'Z' && s != 'X')
}

/// Kills a process this test left running (identified by pid and start time, so never a
/// stranger) when the test ends, passed or not.
struct KillGuard(Option<(u32, u64)>);

impl KillGuard {
    fn new(pid: u32) -> KillGuard {
        KillGuard(proc_stat(pid).map(|(_, start)| (pid, start)))
    }
}

impl Drop for KillGuard {
    fn drop(&mut self) {
        if let Some((pid, start)) = self.0 {
            if proc_stat(pid).map(|(_, s)| s) == Some(start) {
                // SAFETY: kill takes plain integers; the start time check above makes it our
                // process.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
        }
    }
}

async fn wait_gone(pid: u32, within: Duration) {
    let deadline = Instant::now() + within;
    while alive(pid) {
        assert!(Instant::now() < deadline, "process {pid} still alive");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn same_inode(a: &Path, b: &Path) -> bool {
    let (x, y) = (std::fs::metadata(a).unwrap(), std::fs::metadata(b).unwrap());
    x.dev() == y.dev() && x.ino() == y.ino()
}

fn status_ids(pid: u32, field: &str) -> Vec<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with(&format!("{field}:")))
        .unwrap();
    line.split_whitespace()
        .skip(1)
        .map(|v| v.parse().unwrap())
        .collect()
}

/// The VM a helper process booted (detached) and abandoned: the helper exits without any
/// cleanup, as a crashing node would; the VM must still run, and this process adopts it.
#[tokio::test]
async fn vm_outlives_its_node_and_is_adopted() {
    let tmp = tempfile::tempdir().unwrap();
    let image = build_shell_image(tmp.path());
    let dir = tmp.path().join("orphan");
    let status = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "abandon_helper", "--nocapture", "--ignored"])
        .env("ABANDON_DIR", &dir)
        .env("ABANDON_IMAGE", &image)
        .status()
        .unwrap();
    assert!(status.success());
    let pid: u32 = std::fs::read_to_string(dir.join("qemu.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let _guard = KillGuard::new(pid);
    // The helper is gone; its VM is not (no parent-death signal, own session).
    assert!(alive(pid), "the detached VM died with its node");

    let rt = runtime_with(true, QemuRuntimeConfig::default().jail).await;
    let vm = rt.adopt(&dir).await.unwrap();
    assert_eq!(vm.pid(), pid);
    assert_eq!(vm.status().await.unwrap().status, "running");
    let mut shell = wait_shell(&vm, BOOT_TIMEOUT).await;
    assert_eq!(
        shell.ok("cat /before.txt").await,
        "written by the first node\n"
    );

    vm.pause().await.unwrap();
    assert_eq!(vm.status().await.unwrap().status, "paused");
    vm.resume().await.unwrap();
    assert_eq!(shell.ok("echo resumed").await, "resumed\n");

    // A snapshot of the adopted VM restores (into a VM of this process).
    let snap = tmp.path().join("snap");
    vm.snapshot(&snap).await.unwrap();
    let restored_dir = tmp.path().join("restored");
    std::fs::create_dir(&restored_dir).unwrap();
    let restored = rt
        .restore(RestoreSpec {
            snapshot: snap,
            dir: restored_dir,
            paused: false,
            kernel: None,
            files_in_place: false,
            priority: Default::default(),
            splice: None,
        })
        .await
        .unwrap();
    let mut rshell = wait_shell(&restored, BOOT_TIMEOUT).await;
    assert_eq!(
        rshell.ok("cat /before.txt").await,
        "written by the first node\n"
    );
    drop(rshell);
    drop(restored);

    // SIGKILL from outside: the adopted handle (not the VMM's parent) notices at once, and
    // says honestly that it cannot know the exit status.
    let cgroup = vm.cgroup().cloned();
    // SAFETY: kill takes plain integers; `pid` was verified as this VM's QEMU by adopt.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let t = Instant::now();
    let exit = tokio::time::timeout(Duration::from_secs(5), vm.wait())
        .await
        .expect("the adopted VM's exit went unnoticed");
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert_eq!(exit, ExitInfo::UNKNOWN);
    assert!(matches!(vm.check_alive(), Err(Error::Exited { .. })));
    if let Some(cg) = cgroup {
        for d in &cg.dirs {
            assert!(!d.exists(), "{} left behind", d.display());
        }
    }
}

#[tokio::test]
#[ignore = "helper process for vm_outlives_its_node_and_is_adopted"]
async fn abandon_helper() {
    let Some(dir) = std::env::var_os("ABANDON_DIR") else {
        return;
    };
    let dir = PathBuf::from(dir);
    let image = PathBuf::from(std::env::var_os("ABANDON_IMAGE").unwrap());
    let rt = runtime_with(true, QemuRuntimeConfig::default().jail).await;
    std::fs::create_dir_all(&dir).unwrap();
    let vm = rt.boot(boot_spec(&dir, &image)).await.unwrap();
    let mut shell = wait_shell(&vm, BOOT_TIMEOUT).await;
    shell
        .ok("echo written by the first node > /before.txt && sync")
        .await;
    // Leave without running destructors, as a crashing node would.
    std::process::exit(0);
}

#[tokio::test]
async fn detach_then_adopt_in_the_same_process() {
    let tmp = tempfile::tempdir().unwrap();
    let image = build_shell_image(tmp.path());
    let dir = tmp.path().join("sandbox");
    std::fs::create_dir(&dir).unwrap();
    let rt = runtime_with(true, QemuRuntimeConfig::default().jail).await;
    let vm = rt.boot(boot_spec(&dir, &image)).await.unwrap();
    let mut shell = wait_shell(&vm, BOOT_TIMEOUT).await;
    shell.ok("echo kept > /tmp/kept").await;
    let pid = vm.pid();
    let _guard = KillGuard::new(pid);
    drop(shell);
    vm.detach();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(alive(pid), "detach killed the VM");

    let vm = rt.adopt(&dir).await.unwrap();
    assert_eq!(vm.pid(), pid);
    let mut shell = wait_shell(&vm, BOOT_TIMEOUT).await;
    assert_eq!(shell.ok("cat /tmp/kept").await, "kept\n");
    // Kill through the handle. The VMM is still this process's child, so whichever watcher
    // (the detached one or the adopted one) reaps it first collects the status.
    let cgroup = vm.cgroup().cloned();
    vm.kill().await.unwrap();
    wait_gone(pid, Duration::from_secs(5)).await;
    if let Some(cg) = cgroup {
        for d in &cg.dirs {
            assert!(!d.exists(), "{} left behind", d.display());
        }
    }
    // Its pidfile is stale now.
    let err = rt.adopt(&dir).await.unwrap_err();
    assert!(matches!(err, Error::NotAdoptable { .. }), "{err}");
}

#[tokio::test]
async fn stale_pidfiles_are_refused_without_signalling_anyone() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("sandbox");
    let rt = runtime_with(false, QemuRuntimeConfig::default().jail).await;

    // No pidfile at all.
    std::fs::create_dir_all(&dir).unwrap();
    let err = rt.adopt(&dir).await.unwrap_err();
    assert!(err.to_string().contains("qemu.pid"), "{err}");

    // Any VM will do: nothing here talks to the guest.
    let image = build_shell_image(tmp.path());
    let vm = rt.boot(boot_spec(&dir, &image)).await.unwrap();
    let pid = vm.pid();
    vm.kill().await.unwrap();
    drop(vm);

    // The process is gone.
    let err = rt.adopt(&dir).await.unwrap_err();
    assert!(
        matches!(&err, Error::NotAdoptable { reason, .. } if reason.contains("gone")),
        "{err}"
    );

    // The pid now belongs to an unrelated process: it must be left alone.
    let mut stranger = Command::new("sleep").arg("1000").spawn().unwrap();
    let record = std::fs::read_to_string(dir.join("qemu.json")).unwrap();
    let record = record.replace(
        &format!("\"pid\": {pid},"),
        &format!("\"pid\": {},", stranger.id()),
    );
    std::fs::write(dir.join("qemu.json"), record).unwrap();
    std::fs::write(dir.join("qemu.pid"), format!("{}\n", stranger.id())).unwrap();
    let err = rt.adopt(&dir).await.unwrap_err();
    assert!(matches!(err, Error::NotAdoptable { .. }), "{err}");
    assert!(err.to_string().contains("another process"), "{err}");
    assert!(
        stranger.try_wait().unwrap().is_none(),
        "adopt hurt a stranger"
    );
    stranger.kill().unwrap();
    stranger.wait().unwrap();

    // Garbage.
    std::fs::write(dir.join("qemu.pid"), "not a pid").unwrap();
    let err = rt.adopt(&dir).await.unwrap_err();
    assert!(matches!(err, Error::NotAdoptable { .. }), "{err}");
}

#[tokio::test]
async fn jailed_vm_is_confined_and_snapshots_restore() {
    require_root!();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("jailed");
    let rt = runtime_with(false, Some(JailConfig::default())).await;
    let (vm, client) = boot_minimal(&rt, &dir).await;
    let pid = vm.pid();
    assert_eq!(sh(&client, "echo jailed").await, "jailed\n");

    // An unprivileged user, no capabilities, no way back.
    let (uid, gid) = vm.jail_ids().unwrap();
    assert_ne!(uid, 0);
    assert_eq!(status_ids(pid, "Uid"), [uid; 4]);
    assert_eq!(status_ids(pid, "Gid"), [gid; 4]);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert!(status.contains("CapEff:\t0000000000000000"), "{status}");
    assert!(status.contains("NoNewPrivs:\t1"), "{status}");
    assert!(status.contains("Seccomp:\t2"), "{status}");
    // PID 1 of its own PID namespace.
    let nspid = status.lines().find(|l| l.starts_with("NSpid:")).unwrap();
    assert_eq!(nspid.split_whitespace().last(), Some("1"), "{nspid}");

    // Its own namespaces.
    for ns in ["mnt", "pid", "ipc", "uts", "net", "cgroup"] {
        let theirs = std::fs::read_link(format!("/proc/{pid}/ns/{ns}")).unwrap();
        let ours = std::fs::read_link(format!("/proc/self/ns/{ns}")).unwrap();
        assert_ne!(theirs, ours, "{ns} namespace is shared with the host");
    }

    // Its root is the sandbox directory, which holds nothing of the host but the read-only
    // binds.
    let root = PathBuf::from(format!("/proc/{pid}/root"));
    assert!(same_inode(&root, &dir));
    assert!(root.join("qmp.sock").exists());
    assert!(root.join("usr/bin/qemu-system-x86_64").exists());
    assert!(!root.join("etc").exists());
    assert!(!root.join("proc/self").exists());
    assert!(root.join("dev/null").exists());

    // The cgroup: limits and membership.
    let cg = vm.cgroup().expect("a cgroup").clone();
    let cfg = JailConfig::default();
    for d in &cg.dirs {
        let procs = std::fs::read_to_string(d.join("cgroup.procs")).unwrap();
        assert!(
            procs.lines().any(|l| l.trim() == pid.to_string()),
            "{pid} not in {}",
            d.display()
        );
        let read = |f: &str| {
            std::fs::read_to_string(d.join(f))
                .ok()
                .map(|s| s.trim().to_owned())
        };
        let memory = ((256 + cfg.memory_overhead_mib) << 20).to_string();
        if let Some(v) = read("memory.limit_in_bytes").or(read("memory.max")) {
            assert_eq!(v, memory);
        }
        if let Some(v) = read("cpu.cfs_quota_us") {
            assert_eq!(v, "100000");
        }
        if let Some(v) = read("cpu.max") {
            assert_eq!(v, "100000 100000");
        }
        if let Some(v) = read("pids.max") {
            assert_eq!(v, cfg.pids_max.to_string());
        }
    }

    // Snapshot and restore, both jailed; the clone gets its own uid.
    client
        .write_file("/root/kept.txt", &b"kept"[..], WriteOptions::default())
        .await
        .unwrap();
    let snap = tmp.path().join("snap");
    vm.snapshot(&snap).await.unwrap();
    let rdir = tmp.path().join("clone");
    std::fs::create_dir(&rdir).unwrap();
    let restored = rt
        .restore(RestoreSpec {
            snapshot: snap,
            dir: rdir.clone(),
            paused: false,
            kernel: None,
            files_in_place: false,
            priority: Default::default(),
            splice: None,
        })
        .await
        .unwrap();
    let rclient = restored.wait_ready(BOOT_TIMEOUT).await.unwrap();
    assert_eq!(
        &rclient.read_file_bytes("/root/kept.txt").await.unwrap()[..],
        b"kept"
    );
    let (ruid, _) = restored.jail_ids().unwrap();
    assert_ne!(ruid, uid, "two live VMs share a uid");
    assert!(same_inode(
        &PathBuf::from(format!("/proc/{}/root", restored.pid())),
        &rdir
    ));
    drop(rclient);
    drop(restored);

    // Killing removes the cgroup.
    drop(client);
    vm.kill().await.unwrap();
    for d in &cg.dirs {
        assert!(!d.exists(), "{} left behind", d.display());
    }
}

/// A guest that dirties all of its RAM stays alive under the default memory limit: guest RAM
/// is a shared file mapping, i.e. page cache, reclaimable by writeback.
#[tokio::test]
async fn busy_guest_is_not_oom_killed() {
    require_root!();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("busy");
    let rt = runtime_with(false, Some(JailConfig::default())).await;
    let (vm, client) = boot_minimal(&rt, &dir).await;
    // 256 MiB guest: fill a tmpfs with ~200 MiB of random data, twice over.
    sh(
        &client,
        "mkdir -p /mnt/fill && mount -t tmpfs -o size=220m fill /mnt/fill && \
         for i in 1 2; do dd if=/dev/urandom of=/mnt/fill/f bs=1M count=200 2>/dev/null; \
         rm /mnt/fill/f; done; echo done",
    )
    .await;
    assert_eq!(sh(&client, "echo alive").await, "alive\n");
    vm.check_alive().unwrap();
    let cg = vm.cgroup().unwrap();
    for d in &cg.dirs {
        if let Ok(max) = std::fs::read_to_string(d.join("memory.max_usage_in_bytes")) {
            let failcnt = std::fs::read_to_string(d.join("memory.failcnt")).unwrap();
            eprintln!(
                "memory: peak {} MiB, limit hits {}",
                max.trim().parse::<u64>().unwrap() >> 20,
                failcnt.trim()
            );
        }
        // v2 counts OOM kills in memory.events, v1 in memory.oom_control.
        for f in ["memory.events", "memory.oom_control"] {
            if let Ok(events) = std::fs::read_to_string(d.join(f)) {
                eprintln!("{f}: {events}");
                assert!(events.contains("oom_kill 0"), "{events}");
            }
        }
    }
}

#[tokio::test]
async fn unjailed_runtime_runs_qemu_as_the_caller() {
    let tmp = tempfile::tempdir().unwrap();
    let image = build_shell_image(tmp.path());
    let dir = tmp.path().join("plain");
    std::fs::create_dir(&dir).unwrap();
    let rt = runtime_with(false, None).await;
    let vm = rt.boot(boot_spec(&dir, &image)).await.unwrap();
    let mut shell = wait_shell(&vm, BOOT_TIMEOUT).await;
    assert_eq!(shell.ok("echo plain").await, "plain\n");
    let pid = vm.pid();
    assert!(vm.jail_ids().is_none() && vm.cgroup().is_none());
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    assert_eq!(status_ids(pid, "Uid")[0], me);
    for ns in ["mnt", "pid", "net"] {
        assert_eq!(
            std::fs::read_link(format!("/proc/{pid}/ns/{ns}")).unwrap(),
            std::fs::read_link(format!("/proc/self/ns/{ns}")).unwrap()
        );
    }
    assert!(same_inode(&PathBuf::from(format!("/proc/{pid}/cwd")), &dir));
    // Unjailed VMs are adoptable too (checked by working directory instead of root).
    drop(shell);
    vm.detach();
    let vm = rt.adopt(&dir).await.unwrap();
    let mut shell = wait_shell(&vm, BOOT_TIMEOUT).await;
    assert_eq!(shell.ok("echo plain again").await, "plain again\n");
}

/// The sweep at a node's start removes an empty cgroup of one of its own sandbox directories
/// at any age (its VM was killed, or the launch was cut short before QEMU joined it), and
/// leaves a young empty one of another directory (possibly another node's VM being set up).
#[tokio::test]
async fn the_start_sweep_removes_the_nodes_own_empty_cgroups_whatever_their_age() {
    require_root!();
    let tmp = tempfile::tempdir().unwrap();
    let own = tmp.path().join("sandboxes");
    let parent = PathBuf::from(format!("space-sweep-test-{}", std::process::id()));
    let rt = runtime_with(
        false,
        Some(JailConfig {
            cgroup_parent: parent.clone(),
            ..JailConfig::default()
        }),
    )
    .await;
    let Some(layout) = rt.cgroup_layout() else {
        eprintln!("skipped: no cgroup hierarchy to make cgroups in");
        return;
    };
    let limits = space_runtime::cgroup::Limits {
        cpus: None,
        memory_bytes: 64 << 20,
        pids: 16,
    };
    let make = |dir: &Path| {
        space_runtime::cgroup::Cgroup::create(
            layout,
            &parent,
            &space_runtime::jail::cgroup_name(dir),
            &limits,
        )
        .unwrap()
    };
    let mine = make(&own.join("sbx-0123456789abcdef"));
    let foreign = make(&tmp.path().join("elsewhere").join("sbx-0123456789abcdef"));
    let swept = rt.sweep_cgroups(&own).unwrap();
    assert_eq!(swept, mine.dirs, "the node's own empty cgroup goes at once");
    assert!(mine.dirs.iter().all(|d| !d.exists()));
    assert!(
        foreign.dirs.iter().all(|d| d.is_dir()),
        "a young cgroup of another directory stays"
    );
    foreign.remove(Duration::from_secs(5)).unwrap();
    for p in layout.parents(&parent) {
        let _ = std::fs::remove_dir(p);
    }
}
