//! The data disk filling up: under the node's reserve, work that would write there is
//! refused before it starts; full to the last block under a snapshot, the snapshot fails
//! with an error that says the disk is full, its half-written volume goes, the record keeps
//! no pending intent, and once there is room again the sandbox and its files are as they
//! were.

mod common;

use std::os::fd::AsRawFd;
use std::path::Path;

use common::*;
use space_node::{SandboxOptions, SnapshotKind, State};

/// Takes the free space of the filesystem holding `dir` with preallocated files, in
/// shrinking pieces, until at most `leave` bytes (and less than a 64 KiB piece) are free;
/// returns the files.
fn fill(dir: &Path, leave: u64) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    let mut piece: i64 = 256 << 20;
    while piece >= 64 << 10 {
        let path = dir.join(format!("fill-{}", files.len()));
        let f = std::fs::File::create(&path).unwrap();
        let mut got = 0i64;
        while free_bytes(dir) >= leave + piece as u64 {
            // SAFETY: fallocate on a descriptor this function owns, with plain integer
            // arguments; it touches no memory of the process.
            let rc = unsafe { libc::fallocate(f.as_raw_fd(), 0, got, piece) };
            if rc != 0 {
                break;
            }
            got += piece;
        }
        files.push(path);
        piece /= 4;
    }
    if leave == 0 {
        // The last blocks, one at a time.
        let path = dir.join(format!("fill-{}", files.len()));
        let f = std::fs::File::create(&path).unwrap();
        let mut got = 0i64;
        // SAFETY: as above.
        while unsafe { libc::fallocate(f.as_raw_fd(), 0, got, 4096) } == 0 {
            got += 4096;
        }
        files.push(path);
    }
    files
}

/// Removes the fill files and waits for the filesystem to count their space free again
/// (btrfs frees extents when its transaction commits).
fn unfill(dir: &Path, files: Vec<std::path::PathBuf>) {
    for f in files {
        std::fs::remove_file(f).unwrap();
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while free_bytes(dir) < 1 << 30 {
        assert!(
            std::time::Instant::now() < deadline,
            "{} bytes free",
            free_bytes(dir)
        );
        nix::unistd::sync();
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

fn free_bytes(dir: &Path) -> u64 {
    let s = nix::sys::statvfs::statvfs(dir).unwrap();
    s.blocks_available() * s.fragment_size()
}

/// A 3 GiB data disk with a reserve of `reserve_mib`.
fn small_disk(reserve_mib: u64) -> impl FnOnce(&mut space_node::NodeConfig) {
    move |c| {
        c.storage.loop_image_size = 3 << 30;
        c.admission.disk_reserve_mib = reserve_mib;
    }
}

/// A sandbox of `minimal` with a file written in it: its id, a guest client and the file's
/// SHA-256.
async fn sandbox_with_a_file(
    node: &space_node::Node,
) -> (space_node::SandboxId, space_runtime::GuestClient, String) {
    build_minimal(node, "1").await;
    let id = create(node, SandboxOptions::default()).await;
    let g = node.guest(&id).await.unwrap();
    let kept = write_random(&g, "/root/kept.bin", 200_000).await;
    (id, g, kept)
}

/// The reserve: with less free than the node keeps, work that writes to the disk is refused
/// before it starts, and the sandboxes already running go on untouched.
#[test]
fn under_the_reserve_snapshots_and_creates_are_refused() {
    with_node(Disk::Btrfs, small_disk(512), |node| async move {
        let (id, g, kept) = sandbox_with_a_file(&node).await;
        let root = node.layout().root().to_owned();
        let filler = fill(&root, 256 << 20);
        let free = free_bytes(&root);
        assert!(free < 512 << 20, "{free} bytes free");
        for e in [
            node.snapshot(&id, SnapshotKind::Full).await.unwrap_err(),
            node.snapshot(&id, SnapshotKind::Disk).await.unwrap_err(),
            node.create(minimal()).await.unwrap_err(),
            node.fork(&id).await.unwrap_err(),
        ] {
            assert!(e.is_disk_full() && e.is_refusal(), "{e:?}");
            let fault = space_node::Fault::from(e);
            assert_eq!(fault.code, space_node::FaultCode::DiskFull, "{fault:?}");
            assert!(
                fault.message.contains("under the 512 MiB this node keeps"),
                "{fault:?}"
            );
        }
        let info = node.info(&id).await.unwrap();
        assert_eq!(info.state, State::Running);
        assert!(info.snapshots.is_empty(), "{:?}", info.snapshots);
        assert_eq!(node.list().await.unwrap().len(), 1);
        assert_eq!(guest_sha(&g, "/root/kept.bin").await, kept);
        unfill(&root, filler);
        node.snapshot(&id, SnapshotKind::Full).await.unwrap();
        node.kill(&id).await.unwrap();
    });
}

/// No reserve, and the disk full to the last block under a full snapshot: whichever of its
/// steps meets the full disk first (the record's intent, the volume, QEMU writing the
/// device state), the snapshot fails as a full disk, a half-written volume goes, the record
/// keeps no pending intent, and the (paused, so it touches no new memory) sandbox resumes
/// with its files once there is room.
#[test]
fn a_disk_full_under_a_snapshot_fails_it_and_loses_nothing() {
    with_node(Disk::Btrfs, small_disk(0), |node| async move {
        let (id, g, kept) = sandbox_with_a_file(&node).await;
        let earlier = node.snapshot(&id, SnapshotKind::Disk).await.unwrap();
        let snapshots = node.layout().snapshots_of(id.as_str()).unwrap();
        let volumes = |p: &Path| std::fs::read_dir(p).unwrap().count();
        let before = volumes(&snapshots);

        let root = node.layout().root().to_owned();
        node.pause(&id).await.unwrap();
        let filler = fill(&root, 0);
        assert!(free_bytes(&root) < 1 << 20, "{} free", free_bytes(&root));
        for _ in 0..2 {
            let e = node.snapshot(&id, SnapshotKind::Full).await.unwrap_err();
            assert!(e.is_disk_full(), "{e:?}");
            let fault = space_node::Fault::from(e);
            assert_eq!(fault.code, space_node::FaultCode::DiskFull, "{fault:?}");
            assert!(fault.message.contains("disk is full"), "{fault:?}");
        }
        let info = node.info(&id).await.unwrap();
        assert_eq!(info.state, State::Paused);
        assert!(info.pending.is_none(), "{:?}", info.pending);
        assert_eq!(info.snapshots.len(), 1, "{:?}", info.snapshots);
        assert_eq!(info.snapshots[0].id, earlier.id);
        assert_eq!(volumes(&snapshots), before, "a half-made snapshot is left");

        // Room again: the guest goes on with its files, snapshots work, and a rollback
        // to the new one has the files.
        unfill(&root, filler);
        node.resume(&id).await.unwrap();
        assert_eq!(guest_sha(&g, "/root/kept.bin").await, kept);
        assert_eq!(sh(&g, "echo up").await, "up\n");
        let snap = node.snapshot(&id, SnapshotKind::Full).await.unwrap();
        sh(&g, "rm /root/kept.bin").await;
        node.rollback(&id, &snap.id).await.unwrap();
        let g = node.guest(&id).await.unwrap();
        assert_eq!(guest_sha(&g, "/root/kept.bin").await, kept);
        node.kill(&id).await.unwrap();
    });
}
