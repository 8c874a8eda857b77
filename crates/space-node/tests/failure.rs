//! A VM that dies on its own (QEMU killed from outside) makes its sandbox Failed when automatic
//! restore is off: only kill and rollback are accepted, and a rollback to one of its snapshots
//! brings it back. (With it on, the default, `recovery.rs` tests the restore.)

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use space_node::{SandboxOptions, SnapshotKind, State};

/// The pid of the sandbox's QEMU: from the runtime's pidfile, or (a runtime without one) the
/// QEMU process whose working directory is `dir`.
fn qemu_in(dir: &Path) -> Option<i32> {
    if let Ok(text) = std::fs::read_to_string(dir.join("qemu.pid")) {
        return text.trim().parse().ok();
    }
    std::fs::read_dir("/proc").ok()?.find_map(|e| {
        let e = e.ok()?;
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let cwd = std::fs::read_link(e.path().join("cwd")).ok()?;
        let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
        (cwd == dir && comm.starts_with("qemu")).then_some(pid)
    })
}

#[test]
fn a_vm_that_dies_makes_the_sandbox_failed_and_rollback_recovers_it() {
    with_node(
        Disk::Btrfs,
        |c| c.auto_restore = false,
        |node| async move {
            build_minimal(&node, "1").await;
            let id = create(&node, SandboxOptions::default()).await;
            let g = node.guest(&id).await.unwrap();
            let kept = write_random(&g, "/root/kept.bin", 50_000).await;
            let pid = start_sleeper(&g).await;
            let full = node.snapshot(&id, SnapshotKind::Full).await.unwrap();

            let dir = node.layout().sandbox_dir(id.as_str()).unwrap();
            let qemu = qemu_in(&dir).expect("the sandbox's QEMU process");
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(qemu),
                nix::sys::signal::Signal::SIGKILL,
            )
            .unwrap();
            let t0 = Instant::now();
            while node.info(&id).await.unwrap().state != State::Failed {
                assert!(t0.elapsed() < Duration::from_secs(10), "never noticed");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let info = node.info(&id).await.unwrap();
            assert!(
                info.failure.as_deref().unwrap_or("").contains("exited"),
                "{info:?}"
            );
            let e = node.resume(&id).await.unwrap_err();
            assert!(e.to_string().contains("is failed"), "{e}");
            assert!(node.guest(&id).await.is_err());

            node.rollback(&id, &full.id).await.unwrap();
            let info = node.info(&id).await.unwrap();
            assert_eq!(info.state, State::Running);
            assert!(info.failure.is_none());
            let g = node.guest(&id).await.unwrap();
            assert_eq!(guest_sha(&g, "/root/kept.bin").await, kept);
            assert!(alive(&g, pid).await);
        },
    );
}
