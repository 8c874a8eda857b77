//! Driver tests on real filesystems: btrfs on a loop-mounted image, the copy driver on the
//! host's own filesystem, reflink on XFS (xfsprogs comes with `make test`) and on btrfs.

use std::collections::BTreeMap;
use std::fs;
use std::io::ErrorKind;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::testutil::{loop_attached, LoopFs, UnmountOnDrop};
use super::*;

/// What a tree holds, for comparisons: relative path to (kind, mode, content or link target).
fn describe(root: &Path) -> BTreeMap<PathBuf, (char, u32, Vec<u8>)> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, (char, u32, Vec<u8>)>) {
        for e in fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let m = fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(root).unwrap().to_owned();
            let mode = m.mode() & 0o7777;
            let ft = m.file_type();
            if ft.is_dir() {
                out.insert(rel, ('d', mode, Vec::new()));
                walk(root, &p, out);
            } else if ft.is_symlink() {
                let t = fs::read_link(&p).unwrap();
                out.insert(rel, ('l', 0, t.into_os_string().into_encoded_bytes()));
            } else if ft.is_file() {
                out.insert(rel, ('f', mode, fs::read(&p).unwrap()));
            } else if ft.is_socket() {
                out.insert(rel, ('s', mode, Vec::new()));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

/// Fills a volume with what sandbox directories hold: nested files, odd modes, a symlink, an
/// empty directory, a large file and a Unix socket.
fn populate(vol: &Path) -> std::os::unix::net::UnixListener {
    fs::write(vol.join("a.txt"), b"alpha").unwrap();
    fs::create_dir_all(vol.join("sub/deeper")).unwrap();
    fs::create_dir(vol.join("empty")).unwrap();
    let big: Vec<u8> = (0..(3 << 20) as u32).map(|i| (i * 7 % 251) as u8).collect();
    fs::write(vol.join("sub/big.bin"), &big).unwrap();
    fs::write(vol.join("sub/deeper/x"), b"x").unwrap();
    fs::write(vol.join("tool"), b"#!/bin/sh\n").unwrap();
    fs::set_permissions(vol.join("tool"), fs::Permissions::from_mode(0o751)).unwrap();
    fs::set_permissions(vol.join("sub/deeper"), fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::symlink("a.txt", vol.join("link")).unwrap();
    std::os::unix::net::UnixListener::bind(vol.join("ctl.sock")).unwrap()
}

fn without_sockets(
    mut t: BTreeMap<PathBuf, (char, u32, Vec<u8>)>,
) -> BTreeMap<PathBuf, (char, u32, Vec<u8>)> {
    t.retain(|_, v| v.0 != 's');
    t
}

/// Asserts that writing into `dir` (an existing file and a new one) is refused.
fn assert_refuses_writes(dir: &Path) {
    let errs = [
        fs::OpenOptions::new()
            .write(true)
            .open(dir.join("a.txt"))
            .map(drop),
        fs::write(dir.join("new"), b"n"),
        fs::remove_file(dir.join("a.txt")),
    ];
    for e in errs {
        let e = e.expect_err("write into a read-only volume succeeded");
        let code = e.raw_os_error().unwrap();
        assert!(
            [libc::EROFS, libc::EACCES, libc::EPERM].contains(&code),
            "unexpected error {e}"
        );
    }
    assert_eq!(fs::read(dir.join("a.txt")).unwrap(), b"alpha");
}

/// The behaviour every driver owes, exercised under `root` (a directory on the filesystem the
/// driver is meant for).
fn exercise(storage: &dyn Storage, root: &Path) {
    let tree_driver = storage.kind() != DriverKind::Btrfs;
    let vol = root.join("vol");
    storage.create_volume(&vol).unwrap();
    assert!(storage.create_volume(&vol).is_err(), "create over a volume");
    let _listener = populate(&vol);
    let source = describe(&vol);
    assert!(source.contains_key(Path::new("ctl.sock")));

    // A writable snapshot equals its source, byte for byte and mode for mode.
    let snap = root.join("snap");
    storage.snapshot_volume(&vol, &snap, false).unwrap();
    let copy = describe(&snap);
    if tree_driver {
        assert_eq!(copy, without_sockets(source.clone()), "sockets are skipped");
    } else {
        assert_eq!(copy, source);
    }

    // Writes after the snapshot stay where they were made.
    fs::write(vol.join("a.txt"), b"changed in source").unwrap();
    fs::OpenOptions::new()
        .write(true)
        .open(snap.join("sub/big.bin"))
        .unwrap()
        .write_all_at(b"changed in copy", 1000)
        .unwrap();
    assert_eq!(fs::read(snap.join("a.txt")).unwrap(), b"alpha");
    assert_eq!(
        fs::read(vol.join("sub/big.bin")).unwrap(),
        source[Path::new("sub/big.bin")].2
    );
    fs::write(vol.join("a.txt"), b"alpha").unwrap();

    // Destinations that exist are refused, empty directories included.
    assert!(storage.snapshot_volume(&vol, &snap, false).is_err());
    fs::create_dir(root.join("emptydir")).unwrap();
    assert!(storage
        .snapshot_volume(&vol, &root.join("emptydir"), true)
        .is_err());
    assert!(storage
        .snapshot_volume(&root.join("missing"), &root.join("m2"), false)
        .is_err());
    assert!(!root.join("m2").exists());

    // A read-only snapshot refuses writes and is deletable.
    let ro = root.join("ro");
    storage.snapshot_volume(&vol, &ro, true).unwrap();
    assert_refuses_writes(&ro);
    let mut expected = describe(&vol);
    if tree_driver {
        expected = without_sockets(expected);
        for v in expected.values_mut() {
            if v.0 != 'l' {
                v.1 &= !0o222;
            }
        }
    }
    assert_eq!(describe(&ro), expected);

    // A writable snapshot of a read-only one is writable.
    let rw = root.join("rw");
    storage.snapshot_volume(&ro, &rw, false).unwrap();
    fs::write(rw.join("a.txt"), b"writable again").unwrap();
    fs::write(rw.join("sub/new"), b"n").unwrap();

    // set_readonly turns a live volume read-only, idempotently.
    storage.set_readonly(&rw).unwrap();
    storage.set_readonly(&rw).unwrap();
    assert_refuses_writes_after_change(&rw);

    // Clones of single files.
    let method = storage
        .clone_file(&vol.join("sub/big.bin"), &root.join("big.clone"))
        .unwrap();
    if storage.kind() != DriverKind::Copy {
        assert_eq!(method, CloneMethod::Reflink);
    }
    assert!(fs::read(root.join("big.clone")).unwrap() == source[Path::new("sub/big.bin")].2);
    assert!(storage
        .clone_file(&vol.join("a.txt"), &root.join("big.clone"))
        .is_err());

    // Deletes: read-only or not, and again (a missing volume is fine).
    for v in [&ro, &rw, &snap, &vol] {
        storage.delete_volume(v).unwrap();
        assert!(fs::symlink_metadata(v).is_err(), "{} survived", v.display());
        storage.delete_volume(v).unwrap();
    }
}

/// Like [`assert_refuses_writes`] for a volume whose `a.txt` was rewritten.
fn assert_refuses_writes_after_change(dir: &Path) {
    let e = fs::write(dir.join("a.txt"), b"x").unwrap_err();
    assert!(
        [libc::EROFS, libc::EACCES, libc::EPERM].contains(&e.raw_os_error().unwrap()),
        "{e}"
    );
    assert!(fs::write(dir.join("new2"), b"x").is_err());
    assert_eq!(fs::read(dir.join("a.txt")).unwrap(), b"writable again");
}

#[test]
fn copy_driver_on_the_host_filesystem() {
    let dir = tempfile::tempdir().unwrap();
    exercise(&copy::CopyStorage::new(dir.path()), dir.path());
}

#[test]
fn copy_driver_keeps_holes() {
    let dir = tempfile::tempdir().unwrap();
    let storage = copy::CopyStorage::new(dir.path());
    let vol = dir.path().join("vol");
    storage.create_volume(&vol).unwrap();
    let f = fs::File::create(vol.join("disk.img")).unwrap();
    f.set_len(256 << 20).unwrap();
    f.write_all_at(b"boot", 0).unwrap();
    f.write_all_at(&[1u8; 65536], 100 << 20).unwrap();
    f.sync_all().unwrap();
    drop(f);
    storage
        .snapshot_volume(&vol, &dir.path().join("snap"), true)
        .unwrap();
    let m = fs::metadata(dir.path().join("snap/disk.img")).unwrap();
    assert_eq!(m.len(), 256 << 20);
    assert!(
        m.blocks() * 512 <= 1 << 20,
        "{} bytes allocated for a 256 MiB file with 68 KiB of data",
        m.blocks() * 512
    );
    assert!(
        fs::read(vol.join("disk.img")).unwrap()
            == fs::read(dir.path().join("snap/disk.img")).unwrap()
    );
    storage.delete_volume(&dir.path().join("snap")).unwrap();
}

#[test]
fn btrfs_driver_on_a_loop_image() {
    let Some(fs) = LoopFs::btrfs() else { return };
    let storage = btrfs::BtrfsStorage::new();
    exercise(&storage, fs.path());

    // Volumes are subvolumes; read-only snapshots carry the subvolume flag.
    let vol = fs.path().join("v");
    storage.create_volume(&vol).unwrap();
    assert!(btrfs::is_subvolume(&vol).unwrap());
    assert!(!btrfs::is_readonly(&vol).unwrap());
    fs::create_dir(vol.join("plain")).unwrap();
    assert!(!btrfs::is_subvolume(&vol.join("plain")).unwrap());
    storage
        .snapshot_volume(&vol, &fs.path().join("s"), true)
        .unwrap();
    assert!(btrfs::is_subvolume(&fs.path().join("s")).unwrap());
    assert!(btrfs::is_readonly(&fs.path().join("s")).unwrap());
    storage.delete_volume(&fs.path().join("s")).unwrap();
    storage.delete_volume(&vol).unwrap();

    // Names the kernel would refuse are refused up front, clearly.
    let long = fs.path().join("n".repeat(256));
    let err = storage.create_volume(&long).unwrap_err();
    assert!(err.to_string().contains("limit is 255"), "{err}");
    storage
        .create_volume(&fs.path().join("n".repeat(255)))
        .unwrap();
    assert!(storage
        .snapshot_volume(&fs.path().join("n".repeat(255)), &long, false)
        .is_err());
}

#[test]
fn btrfs_driver_handles_plain_directories() {
    let Some(fs) = LoopFs::btrfs() else { return };
    let storage = btrfs::BtrfsStorage::new();
    let dir = fs.path().join("plain");
    fs::create_dir(&dir).unwrap();
    fs::write(dir.join("a.txt"), b"alpha").unwrap();
    storage
        .snapshot_volume(&dir, &fs.path().join("ro"), true)
        .unwrap();
    assert_refuses_writes(&fs.path().join("ro"));
    storage.delete_volume(&fs.path().join("ro")).unwrap();
    storage.delete_volume(&dir).unwrap();
    assert!(!dir.exists());
}

#[test]
fn reflink_driver_on_btrfs() {
    let Some(fs) = LoopFs::btrfs() else { return };
    assert!(reflink::probe(fs.path()).unwrap());
    exercise(&reflink::ReflinkStorage::new(), fs.path());
}

#[test]
fn reflink_driver_on_xfs() {
    let Some(fs) = LoopFs::xfs() else { return };
    assert!(reflink::probe(fs.path()).unwrap());
    exercise(&reflink::ReflinkStorage::new(), fs.path());
}

#[test]
fn reflink_driver_refuses_to_copy() {
    let dir = tempfile::tempdir().unwrap();
    if reflink::probe(dir.path()).unwrap() {
        println!("note: the temporary directory clones files; nothing to refuse here");
        return;
    }
    let storage = reflink::ReflinkStorage::new();
    let vol = dir.path().join("vol");
    storage.create_volume(&vol).unwrap();
    fs::write(vol.join("f"), b"data").unwrap();
    assert!(storage
        .snapshot_volume(&vol, &dir.path().join("snap"), false)
        .is_err());
    assert!(!dir.path().join("snap").exists());
    let leftovers: Vec<_> = fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(leftovers.len(), 1, "partial snapshot left behind");
    assert!(storage
        .clone_file(&vol.join("f"), &dir.path().join("g"))
        .is_err());
    assert!(!dir.path().join("g").exists());
}

#[test]
fn open_without_a_loop_image_picks_copy_on_ext4() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let opts = StorageOptions {
        loop_image: false,
        ..Default::default()
    };
    let (storage, layout) = open(&data, &opts).unwrap();
    let expected = if btrfs::is_btrfs(dir.path()).unwrap() {
        DriverKind::Btrfs
    } else if reflink::probe(dir.path()).unwrap() {
        DriverKind::Reflink
    } else {
        DriverKind::Copy
    };
    assert_eq!(storage.kind(), expected);
    assert!(layout.mounted_image().is_none());
    for d in [layout.templates(), layout.sandboxes(), layout.snapshots()] {
        assert!(d.is_dir());
    }
    // Forcing a driver the filesystem cannot serve fails clearly.
    if expected == DriverKind::Copy {
        let forced = StorageOptions {
            driver: Some(DriverKind::Reflink),
            ..opts.clone()
        };
        assert!(open(&data, &forced).is_err());
    }
    let forced = StorageOptions {
        driver: Some(DriverKind::Copy),
        ..Default::default()
    };
    assert_eq!(open(&data, &forced).unwrap().0.kind(), DriverKind::Copy);
}

#[test]
fn open_mounts_and_reuses_a_loop_image() {
    if !testutil::can_mount("mkfs.btrfs") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    if btrfs::is_btrfs(dir.path()).unwrap() {
        println!("note: the temporary directory is on btrfs already; no image to test");
        return;
    }
    let data = dir.path().join("data");
    let image = dir.path().join("data.btrfs.img");
    let _guard = UnmountOnDrop(data.clone());
    let opts = StorageOptions {
        loop_image_size: 1 << 30,
        ..Default::default()
    };

    let (storage, layout) = open(&data, &opts).unwrap();
    assert_eq!(storage.kind(), DriverKind::Btrfs);
    assert_eq!(layout.mounted_image(), Some(image.as_path()));
    assert_eq!(loopback::image_path(&data).unwrap(), image);
    assert_eq!(fs::metadata(&image).unwrap().len(), 1 << 30);
    assert!(
        fs::metadata(&image).unwrap().blocks() * 512 < 64 << 20,
        "image not sparse"
    );
    let sandbox = layout.sandbox_dir("sb-1").unwrap();
    storage.create_volume(&sandbox).unwrap();
    fs::write(sandbox.join("disk"), b"kept").unwrap();

    // Already mounted: reused as is.
    let (storage, again) = open(&data, &opts).unwrap();
    assert_eq!(storage.kind(), DriverKind::Btrfs);
    assert!(again.mounted_image().is_none());
    assert_eq!(fs::read(sandbox.join("disk")).unwrap(), b"kept");

    // A restarted node: the image exists but is not mounted; it is mounted again, even when
    // creating images is not allowed.
    loopback::unmount(&data).unwrap();
    assert!(
        !loop_attached(&image),
        "unmount left the loop device attached"
    );
    assert!(!sandbox.exists());
    let (storage, restarted) = open(
        &data,
        &StorageOptions {
            loop_image: false,
            ..opts.clone()
        },
    )
    .unwrap();
    assert_eq!(storage.kind(), DriverKind::Btrfs);
    assert_eq!(restarted.mounted_image(), Some(image.as_path()));
    assert_eq!(fs::read(sandbox.join("disk")).unwrap(), b"kept");
    assert!(btrfs::is_subvolume(&sandbox).unwrap());
    loopback::unmount(&data).unwrap();
    assert!(!loop_attached(&image));
}

#[test]
fn layout_rejects_hostile_names() {
    let layout = Layout::new("/data");
    assert_eq!(
        layout.template_dir("base", "1.2.0").unwrap(),
        Path::new("/data/templates/base/1.2.0")
    );
    assert_eq!(
        layout.sandbox_dir("sb_01HX-a").unwrap(),
        Path::new("/data/sandboxes/sb_01HX-a")
    );
    assert_eq!(
        layout.snapshot_dir("sb1", "2024-05-01T10:00:00Z").unwrap(),
        Path::new("/data/snapshots/sb1/2024-05-01T10:00:00Z")
    );
    assert_eq!(
        layout.snapshots_of("sb1").unwrap(),
        Path::new("/data/snapshots/sb1")
    );
    let long = "a".repeat(256);
    for bad in [
        "",
        ".",
        "..",
        "a/b",
        "/abs",
        "../up",
        "a\0b",
        ".hidden",
        "sp ace",
        "new\nline",
        "é",
        &long,
    ] {
        for r in [
            layout.sandbox_dir(bad),
            layout.template_dir(bad, "1"),
            layout.template_dir("t", bad),
            layout.snapshot_dir(bad, "s"),
            layout.snapshot_dir("sb", bad),
            layout.snapshots_of(bad),
        ] {
            assert!(
                matches!(r, Err(StorageError::Invalid(_))),
                "{bad:?} accepted: {r:?}"
            );
        }
    }
    assert!(layout.sandbox_dir(&"a".repeat(255)).is_ok());
}

#[test]
fn errors_say_what_failed() {
    let dir = tempfile::tempdir().unwrap();
    let storage = copy::CopyStorage::new(dir.path());
    let err = storage
        .snapshot_volume(&dir.path().join("nope"), &dir.path().join("x"), false)
        .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("nope"), "{text}");
    let err = storage.create_volume(&dir.path().join("a/b")).unwrap_err();
    assert!(
        matches!(&err, StorageError::Io { source, .. } if source.kind() == ErrorKind::NotFound),
        "{err:?}"
    );
}
