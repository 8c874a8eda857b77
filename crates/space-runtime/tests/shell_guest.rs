//! Boots a throwaway busybox guest whose init runs shell lines received on `space.ctl`, and
//! drives the QEMU runtime through boot, pause/resume, snapshot, kill and restore with it.
//! Needs SPACE_KERNEL (set by `make test`), busybox-static and e2fsprogs.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use space_runtime::manifest::Manifest;
use space_runtime::{Error, QemuVm, RestoreSpec, Runtime, Vm};

/// A temp directory with the shell image and a booted guest in `<tmp>/sandbox`. Destructure
/// with `tmp` (or `tmp: _tmp`) first, never leaving it to `..`: bindings drop in reverse order,
/// so the VM is killed before its directory is removed, and `..` would remove it at once.
struct Booted {
    vm: QemuVm,
    shell: Shell,
    image: PathBuf,
    tmp: tempfile::TempDir,
}

async fn boot() -> Booted {
    let rt = runtime().await;
    let tmp = tempfile::tempdir().unwrap();
    let image = build_shell_image(tmp.path());
    let dir = tmp.path().join("sandbox");
    std::fs::create_dir(&dir).unwrap();
    let vm = rt.boot(boot_spec(&dir, &image)).await.unwrap();
    let shell = wait_shell(&vm, BOOT_TIMEOUT).await;
    Booted {
        vm,
        shell,
        image,
        tmp,
    }
}

fn restore_spec(snapshot: &Path, dir: &Path, paused: bool) -> RestoreSpec {
    std::fs::create_dir_all(dir).unwrap();
    RestoreSpec {
        snapshot: snapshot.to_owned(),
        dir: dir.to_owned(),
        paused,
        kernel: None,
        files_in_place: false,
        priority: Default::default(),
        splice: None,
    }
}

/// Reads a file out of an ext4 image on the host, without mounting it.
/// Reads a file out of an ext4 image from the host. The guest's `sync` commits its writes to
/// the journal, but ext4 copies metadata to its home location only at a later checkpoint, and
/// debugfs does not replay the journal: so the image is copied and the copy's journal replayed
/// with e2fsck first. The image itself is never modified (it may be a read-only snapshot or
/// belong to a running VM).
fn debugfs_cat(image: &Path, path: &str) -> String {
    let scratch = tempfile::tempdir().unwrap();
    let copy = scratch.path().join("image.ext4");
    let status = Command::new("cp")
        .arg("--sparse=always")
        .arg(image)
        .arg(&copy)
        .status()
        .unwrap();
    assert!(status.success(), "copying {}", image.display());
    // Exit codes 0-2 mean clean or repaired; a journal replay alone is "repaired".
    let fsck = Command::new("e2fsck")
        .args(["-fy"])
        .arg(&copy)
        .output()
        .expect("e2fsck (e2fsprogs) must be installed");
    assert!(
        fsck.status.code().is_some_and(|c| c <= 2),
        "e2fsck on a copy of {}: {}",
        image.display(),
        String::from_utf8_lossy(&fsck.stdout)
    );
    let out = Command::new("debugfs")
        .args(["-R", &format!("cat {path}")])
        .arg(&copy)
        .output()
        .expect("debugfs (e2fsprogs) must be installed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn same_contents(a: &Path, b: &Path) -> bool {
    use std::io::Read;
    let (mut fa, mut fb) = (
        std::fs::File::open(a).unwrap(),
        std::fs::File::open(b).unwrap(),
    );
    let (mut ba, mut bb) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    loop {
        let n = fa.read(&mut ba).unwrap();
        fb.read_exact(&mut bb[..n]).unwrap();
        if ba[..n] != bb[..n] {
            return false;
        }
        if n == 0 {
            return fb.read(&mut bb).unwrap() == 0;
        }
    }
}

#[tokio::test]
async fn boot_round_trip_and_kill() {
    let Booted {
        tmp,
        vm,
        mut shell,
        image,
    } = boot().await;
    assert_eq!(
        shell.ok("echo hello from the guest").await,
        "hello from the guest\n"
    );
    let (out, code) = shell.run("echo oops >&2; exit 7").await.unwrap();
    assert_eq!((out.as_str(), code), ("oops\n", 7));
    // Bytes survive the trip unchanged, also long lines.
    let long = "x".repeat(3000);
    assert_eq!(shell.ok(&format!("echo {long}")).await, format!("{long}\n"));
    assert!(vm
        .console_tail(4096)
        .contains("shell-guest: serving on /dev/vport"));

    // The guest writes to the sandbox's clone of the image, never to the source.
    shell.ok("echo written > /data/marker && sync").await;
    assert_eq!(
        debugfs_cat(&vm.dir().join("rootfs.ext4"), "/data/marker"),
        "written\n"
    );
    assert_eq!(debugfs_cat(&image, "/data/marker"), "");

    // The egress port is there for the gateway.
    vm.connect_egress().await.unwrap();

    // The console log is kept under its cap while the guest keeps writing to it.
    let log = vm.dir().join("console.log");
    let mut f = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
    std::io::Write::write_all(&mut f, &vec![b'#'; 5 << 20]).unwrap();
    let mut rotated = false;
    for _ in 0..600 {
        if std::fs::metadata(&log).unwrap().len() < 1 << 20 {
            rotated = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(rotated, "console.log was not rotated");
    shell.ok("echo after-rotation > /dev/console").await;
    assert!(vm.console_tail(4096).contains("after-rotation"));

    let exit = vm.kill().await.unwrap();
    assert_eq!(exit.signal, Some(libc::SIGKILL));
    assert!(matches!(vm.pause().await, Err(Error::Exited { .. })));
    assert!(matches!(vm.connect_ctl().await, Err(Error::Exited { .. })));
    // Killing leaves the sandbox's files to their owner.
    assert!(vm.dir().join("rootfs.ext4").exists() && vm.dir().join("mem").exists());
    drop(vm);
    drop(tmp);
}

#[tokio::test]
async fn pause_and_resume() {
    let Booted {
        tmp: _tmp,
        vm,
        mut shell,
        ..
    } = boot().await;
    vm.pause().await.unwrap();
    assert_eq!(vm.qmp().query_status().await.unwrap().status, "paused");
    vm.pause().await.unwrap(); // idempotent
    vm.resume().await.unwrap();
    vm.resume().await.unwrap();
    assert!(vm.qmp().query_status().await.unwrap().running);
    assert_eq!(shell.ok("echo still here").await, "still here\n");

    // A line sent while paused is answered after the resume.
    vm.pause().await.unwrap();
    let pending = tokio::spawn(async move {
        let r = shell.ok("echo queued").await;
        (shell, r)
    });
    vm.resume().await.unwrap();
    let (_shell, answer) = pending.await.unwrap();
    assert_eq!(answer, "queued\n");
}

#[tokio::test]
async fn snapshot_kill_restore_keeps_files_and_processes() {
    let Booted {
        tmp, vm, mut shell, ..
    } = boot().await;
    shell.ok("echo before-snapshot > /data/file && sync").await;
    shell.ok("echo in-page-cache-only > /data/unsynced").await;
    shell.ok("sleep 100000 & echo $! > /tmp/sleeper").await;
    let sleeper = shell.ok("cat /tmp/sleeper").await;

    let snap = tmp.path().join("snap");
    let info = vm.snapshot(&snap).await.unwrap();
    assert!(
        info.state_bytes > 0 && info.state_bytes < 1 << 20,
        "{info:?}"
    );
    for f in ["mem", "rootfs.ext4", "state", "manifest.json"] {
        assert!(snap.join(f).exists(), "{f} missing");
    }
    let manifest = Manifest::read(&snap.join("manifest.json")).unwrap();
    assert_eq!(manifest, info.manifest);
    assert_eq!(manifest.memory_mib, 256);
    assert_eq!(
        std::fs::metadata(snap.join("mem")).unwrap().len(),
        256 << 20
    );
    // The state file names devices, not host paths.
    let state = std::fs::read(snap.join("state")).unwrap();
    let dir_bytes = vm.dir().as_os_str().as_encoded_bytes();
    assert!(!state.windows(dir_bytes.len()).any(|w| w == dir_bytes));
    // The disk clone holds what was synced before the snapshot.
    assert_eq!(
        debugfs_cat(&snap.join("rootfs.ext4"), "/data/file"),
        "before-snapshot\n"
    );

    // The source keeps running after the snapshot (QEMU resumes it from `postmigrate`), and
    // what it does from now on does not leak into the snapshot.
    assert_eq!(shell.ok("echo alive").await, "alive\n");
    shell.ok("echo after-snapshot > /data/file && sync").await;
    vm.kill().await.unwrap();
    drop(shell);
    drop(vm);

    let rt = runtime().await;
    let restored_dir = tmp.path().join("restored");
    let restored = rt
        .restore(restore_spec(&snap, &restored_dir, false))
        .await
        .unwrap();
    let mut shell = wait_shell(&restored, BOOT_TIMEOUT).await;
    assert_eq!(shell.ok("cat /data/file").await, "before-snapshot\n");
    assert_eq!(shell.ok("cat /data/unsynced").await, "in-page-cache-only\n");
    assert_eq!(shell.ok("cat /tmp/sleeper").await, sleeper);
    shell.ok(&format!("kill -0 {}", sleeper.trim())).await;
    // The snapshot itself is untouched by the restored guest's writes.
    shell.ok("echo restored-write > /data/file && sync").await;
    assert_eq!(
        debugfs_cat(&snap.join("rootfs.ext4"), "/data/file"),
        "before-snapshot\n"
    );
    assert_eq!(
        debugfs_cat(&restored_dir.join("rootfs.ext4"), "/data/file"),
        "restored-write\n"
    );
}

#[tokio::test]
async fn one_snapshot_restores_into_independent_clones() {
    let Booted {
        tmp, vm, mut shell, ..
    } = boot().await;
    shell.ok("echo 0 > /data/counter").await;
    let snap = tmp.path().join("snap");
    vm.snapshot(&snap).await.unwrap();
    drop(shell);
    drop(vm);

    let rt = runtime().await;
    let a = rt
        .restore(restore_spec(&snap, &tmp.path().join("a"), false))
        .await
        .unwrap();
    let b = rt
        .restore(restore_spec(&snap, &tmp.path().join("b"), true))
        .await
        .unwrap();
    assert_eq!(b.qmp().query_status().await.unwrap().status, "paused");
    // Loading the state leaves guest RAM alone: QEMU neither streams it nor reloads the kernel
    // image into it (ROMs are not copied into RAM while a migration is incoming).
    assert!(same_contents(&snap.join("mem"), &tmp.path().join("b/mem")));
    // A VM restored paused (a warm-pool member) can be snapshotted before it ever runs.
    let snap_b = tmp.path().join("snap-b");
    b.snapshot(&snap_b).await.unwrap();
    b.resume().await.unwrap();
    let mut sa = wait_shell(&a, BOOT_TIMEOUT).await;
    let mut sb = wait_shell(&b, BOOT_TIMEOUT).await;
    sa.ok("echo a > /data/counter").await;
    sb.ok("echo b > /data/counter").await;
    assert_eq!(sa.ok("cat /data/counter").await, "a\n");
    assert_eq!(sb.ok("cat /data/counter").await, "b\n");

    // A restored VM can be snapshotted and restored again.
    let snap2 = tmp.path().join("snap2");
    a.snapshot(&snap2).await.unwrap();
    let c = rt
        .restore(restore_spec(&snap2, &tmp.path().join("c"), false))
        .await
        .unwrap();
    let mut sc = wait_shell(&c, BOOT_TIMEOUT).await;
    assert_eq!(sc.ok("cat /data/counter").await, "a\n");
    let d = rt
        .restore(restore_spec(&snap_b, &tmp.path().join("d"), false))
        .await
        .unwrap();
    let mut sd = wait_shell(&d, BOOT_TIMEOUT).await;
    assert_eq!(sd.ok("cat /data/counter").await, "0\n");
}

#[tokio::test]
async fn snapshots_of_a_paused_vm_leave_it_paused() {
    let Booted {
        tmp, vm, mut shell, ..
    } = boot().await;
    vm.pause().await.unwrap();
    let first = vm.snapshot(&tmp.path().join("s1")).await.unwrap();
    assert_eq!(first.paused_for, std::time::Duration::ZERO);
    assert!(!vm.qmp().query_status().await.unwrap().running);
    // A second snapshot straight from `postmigrate` works too.
    vm.snapshot(&tmp.path().join("s2")).await.unwrap();
    assert!(!vm.qmp().query_status().await.unwrap().running);
    vm.resume().await.unwrap();
    assert_eq!(shell.ok("echo resumed").await, "resumed\n");

    // Both snapshots restore.
    let rt = runtime().await;
    for s in ["s1", "s2"] {
        let r = rt
            .restore(restore_spec(
                &tmp.path().join(s),
                &tmp.path().join(format!("{s}-vm")),
                false,
            ))
            .await
            .unwrap();
        let mut sh = wait_shell(&r, BOOT_TIMEOUT).await;
        assert_eq!(sh.ok("echo ok").await, "ok\n");
    }
}

#[tokio::test]
async fn snapshot_refuses_occupied_destination() {
    let Booted {
        tmp, vm, mut shell, ..
    } = boot().await;
    let dest = tmp.path().join("busy");
    std::fs::create_dir(&dest).unwrap();
    std::fs::write(dest.join("precious"), b"keep").unwrap();
    assert!(matches!(vm.snapshot(&dest).await, Err(Error::Invalid(_))));
    assert_eq!(std::fs::read(dest.join("precious")).unwrap(), b"keep");
    assert!(vm.qmp().query_status().await.unwrap().running);
    assert_eq!(shell.ok("echo fine").await, "fine\n");
}

#[tokio::test]
async fn restore_refuses_mismatched_snapshots() {
    let Booted { tmp, vm, .. } = boot().await;
    let snap = tmp.path().join("snap");
    vm.snapshot(&snap).await.unwrap();
    drop(vm);
    let rt = runtime().await;
    let manifest_path = snap.join("manifest.json");
    let original = Manifest::read(&manifest_path).unwrap();

    type Tamper = fn(&mut Manifest);
    let cases: [(&str, Tamper); 4] = [
        ("QEMU", |m| m.qemu.micro += 1),
        ("bytes", |m| m.memory_mib *= 2),
        ("kernel", |m| m.kernel.sha256 = "00".repeat(32)),
        ("format", |m| m.format += 1),
    ];
    for (what, tamper) in cases {
        let mut m = original.clone();
        tamper(&mut m);
        m.write(&manifest_path).unwrap();
        let dir = tmp.path().join(format!("r-{what}"));
        let err = rt
            .restore(restore_spec(&snap, &dir, false))
            .await
            .unwrap_err();
        assert!(err.to_string().contains(what), "{what}: {err}");
        // Nothing was started or left behind.
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "{what}");
    }
    original.write(&manifest_path).unwrap();

    // A truncated state file is caught before QEMU starts.
    let state = snap.join("state");
    let len = std::fs::metadata(&state).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&state)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let err = rt
        .restore(restore_spec(&snap, &tmp.path().join("r-state"), false))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("state"), "{err}");
}

#[tokio::test]
async fn a_dead_qemu_fails_requests_with_its_console() {
    let Booted {
        tmp: _tmp,
        vm,
        mut shell,
        ..
    } = boot().await;
    // init exits: the kernel panics, panic=-1 reboots, -no-reboot turns that into an exit.
    shell.writer_line("__exit").await;
    let exit = tokio::time::timeout(BOOT_TIMEOUT, vm.wait())
        .await
        .expect("QEMU should exit");
    assert_eq!(exit.code, Some(0), "{exit}");
    match vm.snapshot(&vm.dir().join("never")).await {
        Err(Error::Exited { console, .. }) => {
            assert!(console.contains("shell-guest"), "{console}");
            assert!(console.contains("Kernel panic"), "{console}");
        }
        other => panic!("expected Exited, got {other:?}"),
    }
    assert!(!vm.dir().join("never").exists());
    assert!(matches!(vm.resume().await, Err(Error::Exited { .. })));
}

#[tokio::test]
async fn an_externally_killed_qemu_is_noticed() {
    let Booted { tmp: _tmp, vm, .. } = boot().await;
    // The QEMU this test started, by its pid, as an OOM killer would.
    let pid = nix::unistd::Pid::from_raw(vm.pid() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).unwrap();
    let exit = vm.wait().await;
    assert_eq!(exit.signal, Some(libc::SIGKILL));
    let err = vm.pause().await.unwrap_err();
    assert!(err.to_string().contains("SIGKILL"), "{err}");
}
