//! The tree against a real directory: what it does, and that nothing a guest can make inside
//! (symlinks out, `..`, links) leads the host outside.

use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};

use nix::errno::Errno;
use space_proto::volume::{EntryKind, VolumeReply, VolumeRequest};
use space_volume::{serve, Change, Tree};

fn setup(size: u64) -> (tempfile::TempDir, std::path::PathBuf, Tree) {
    let dir = tempfile::tempdir().unwrap();
    let vol = dir.path().join("vol");
    std::fs::create_dir(&vol).unwrap();
    std::fs::write(dir.path().join("secret"), b"host only").unwrap();
    let tree = Tree::open(&vol, size).unwrap();
    (dir, vol, tree)
}

#[test]
fn files_directories_and_links() {
    let (_d, vol, t) = setup(1 << 30);
    t.mkdir("d", 0o755, (1000, 1000)).unwrap();
    let a = t
        .create("d/a.txt", 0o6755, (1000, 1000), true, false)
        .unwrap();
    assert_eq!(a.kind, EntryKind::File);
    assert_eq!(a.mode, 0o755, "set-id bits dropped");
    assert_eq!((a.uid, a.gid), (1000, 1000));
    assert_eq!(
        t.create("d/a.txt", 0o644, (0, 0), true, false),
        Err(Errno::EEXIST)
    );
    t.write("d/a.txt", 0, b"hello world").unwrap();
    let after = t.write("d/a.txt", 6, b"there").unwrap();
    assert_eq!(after.size, 11);
    assert_eq!(t.read("d/a.txt", 0, 100).unwrap(), b"hello there");
    assert_eq!(t.read("d/a.txt", 6, 3).unwrap(), b"the");
    assert_eq!(t.read("d/a.txt", 50, 3).unwrap(), b"");
    assert_eq!(std::fs::read(vol.join("d/a.txt")).unwrap(), b"hello there");

    // Listing, in name order, paged.
    for i in 0..600 {
        t.create(&format!("d/f{i:03}"), 0o644, (0, 0), true, false)
            .unwrap();
    }
    let (first, more) = t.read_dir("d", None).unwrap();
    assert!(more && first.len() == 512);
    assert_eq!(first[0].name, "a.txt");
    let (rest, more) = t.read_dir("d", Some(&first.last().unwrap().name)).unwrap();
    assert!(!more);
    assert_eq!(first.len() + rest.len(), 601);

    // Rename, hard link, symlink text, truncation, times.
    t.rename("d/a.txt", "b.txt", false, false).unwrap();
    assert_eq!(t.stat("d/a.txt"), Err(Errno::ENOENT));
    t.create("c.txt", 0o644, (0, 0), true, false).unwrap();
    assert_eq!(t.rename("b.txt", "c.txt", true, false), Err(Errno::EEXIST));
    let linked = t.link("b.txt", "d/hard").unwrap();
    assert_eq!(linked.nlink, 2);
    t.symlink("s", "../../etc/passwd", (1000, 1000)).unwrap();
    assert_eq!(t.read_link("s").unwrap(), "../../etc/passwd");
    assert_eq!(t.stat("s").unwrap().kind, EntryKind::Symlink);
    let cut = t
        .set_attr(
            "b.txt",
            Change {
                size: Some(5),
                mode: Some(0o600),
                mtime_ns: Some(1_000_000_000),
                ..Change::default()
            },
        )
        .unwrap();
    assert_eq!(
        (cut.size, cut.mode, cut.mtime_ns),
        (5, 0o600, 1_000_000_000)
    );
    assert_eq!(t.read("d/hard", 0, 100).unwrap(), b"hello");

    // Removal.
    assert_eq!(t.rmdir("d"), Err(Errno::ENOTEMPTY));
    assert_eq!(t.unlink("d"), Err(Errno::EISDIR));
    t.remove_all("d").unwrap();
    assert_eq!(t.stat("d"), Err(Errno::ENOENT));
    assert_eq!(t.remove_all(""), Err(Errno::EBUSY));
    let st = t.recount().unwrap();
    assert_eq!(st.entries, 3, "b.txt, c.txt, s");
}

#[test]
fn nothing_leads_outside() {
    let (dir, vol, t) = setup(1 << 30);
    // What a guest could make in its mount: a symlink to the host's file, to a directory
    // outside, and to a directory inside.
    symlink(dir.path().join("secret"), vol.join("out")).unwrap();
    symlink(dir.path(), vol.join("outdir")).unwrap();
    std::fs::create_dir(vol.join("inside")).unwrap();
    symlink("inside", vol.join("in")).unwrap();

    for bad in [
        "../secret",
        "/etc/passwd",
        "a/../../secret",
        "./x",
        "x/",
        "",
    ] {
        if bad.is_empty() {
            continue;
        }
        assert_eq!(t.stat(bad), Err(Errno::EINVAL), "{bad}");
        assert_eq!(t.read(bad, 0, 10), Err(Errno::EINVAL), "{bad}");
    }
    // The last component is never followed, a symlink in the middle is refused.
    assert_eq!(t.read("out", 0, 100), Err(Errno::ELOOP));
    assert_eq!(t.write("out", 0, b"x"), Err(Errno::ELOOP));
    assert_eq!(t.read("outdir/secret", 0, 100), Err(Errno::ELOOP));
    assert_eq!(
        t.create("outdir/new", 0o644, (0, 0), true, false),
        Err(Errno::ELOOP)
    );
    assert_eq!(t.read_dir("outdir", None).map(|_| ()), Err(Errno::ELOOP));
    assert_eq!(t.mkdir("in/sub", 0o755, (0, 0)), Err(Errno::ELOOP));
    assert_eq!(
        t.set_attr(
            "out",
            Change {
                mode: Some(0o777),
                ..Change::default()
            }
        ),
        Err(Errno::EPERM)
    );
    assert_eq!(
        t.set_attr(
            "outdir/secret",
            Change {
                size: Some(0),
                ..Change::default()
            }
        ),
        Err(Errno::ELOOP)
    );
    assert_eq!(t.link("outdir/secret", "stolen"), Err(Errno::ELOOP));
    assert_eq!(
        t.create("out", 0o644, (0, 0), false, true),
        Err(Errno::ELOOP)
    );
    // Renaming or removing the link touches the link, not what it names.
    t.rename("out", "moved", false, false).unwrap();
    t.unlink("moved").unwrap();
    assert_eq!(
        std::fs::read(dir.path().join("secret")).unwrap(),
        b"host only"
    );
    assert_eq!(
        std::fs::metadata(dir.path().join("secret"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o644
    );
    // The host file was never linked or changed.
    assert_eq!(
        std::fs::metadata(dir.path().join("secret"))
            .unwrap()
            .nlink(),
        1
    );
}

#[test]
fn a_full_volume_refuses_new_bytes_and_keeps_what_it_had() {
    let (_d, _vol, t) = setup(256 << 10);
    t.create("a", 0o644, (0, 0), true, false).unwrap();
    t.write("a", 0, &vec![1u8; 100 << 10]).unwrap();
    t.create("b", 0o644, (0, 0), true, false).unwrap();
    assert_eq!(t.write("b", 0, &vec![2u8; 200 << 10]), Err(Errno::ENOSPC));
    assert_eq!(
        t.stat("b").unwrap().size,
        0,
        "nothing of the refused write landed"
    );
    assert_eq!(t.read("a", 0, 200 << 10).unwrap(), vec![1u8; 100 << 10]);
    // Rewriting what is there needs no new room; freeing makes room.
    t.write("a", 0, &vec![3u8; 50 << 10]).unwrap();
    t.unlink("a").unwrap();
    t.write("b", 0, &vec![2u8; 200 << 10]).unwrap();
    let st = t.stat_fs();
    assert!(
        st.used_bytes >= 200 << 10 && st.used_bytes <= 256 << 10,
        "{st:?}"
    );
}

#[test]
fn serve_answers_errnos_and_refuses_writes_on_read_only_mounts() {
    let (_d, _vol, t) = setup(1 << 30);
    let (r, _) = serve(
        &t,
        false,
        VolumeRequest::Create {
            path: "f".into(),
            mode: 0o644,
            uid: 0,
            gid: 0,
            exclusive: true,
            truncate: false,
        },
        b"",
    );
    assert!(matches!(r, VolumeReply::Attr(_)), "{r:?}");
    let (r, _) = serve(
        &t,
        false,
        VolumeRequest::Write {
            path: "f".into(),
            offset: 0,
        },
        b"abc",
    );
    assert!(
        matches!(r, VolumeReply::Written { written: 3, .. }),
        "{r:?}"
    );
    let (r, data) = serve(
        &t,
        true,
        VolumeRequest::Read {
            path: "f".into(),
            offset: 1,
            size: 10,
        },
        b"",
    );
    assert_eq!((r, data), (VolumeReply::Data(2), b"bc".to_vec()));
    let (r, _) = serve(&t, true, VolumeRequest::Unlink { path: "f".into() }, b"");
    assert_eq!(r, VolumeReply::Errno(libc::EROFS));
    let (r, _) = serve(
        &t,
        false,
        VolumeRequest::Stat {
            path: "nope".into(),
        },
        b"",
    );
    assert_eq!(r, VolumeReply::Errno(libc::ENOENT));
}
