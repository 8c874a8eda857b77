use std::io::Write;
use std::os::unix::fs::MetadataExt;

use super::*;

/// A layer built entry by entry.
struct Layer(tar::Builder<Vec<u8>>);

impl Layer {
    fn new() -> Layer {
        Layer(tar::Builder::new(Vec::new()))
    }

    fn header(kind: tar::EntryType, mode: u32, owner: (u64, u64)) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_uid(owner.0);
        h.set_gid(owner.1);
        h.set_mtime(1_600_000_000);
        h.set_size(0);
        h
    }

    fn dir(mut self, path: &str, mode: u32) -> Layer {
        let mut h = Self::header(tar::EntryType::Directory, mode, (0, 0));
        self.0.append_data(&mut h, path, io::empty()).unwrap();
        self
    }

    fn file(mut self, path: &str, data: &[u8], mode: u32, owner: (u64, u64)) -> Layer {
        let mut h = Self::header(tar::EntryType::Regular, mode, owner);
        h.set_size(data.len() as u64);
        self.0.append_data(&mut h, path, data).unwrap();
        self
    }

    fn symlink(mut self, path: &str, target: &str) -> Layer {
        let mut h = Self::header(tar::EntryType::Symlink, 0o777, (0, 0));
        self.0.append_link(&mut h, path, target).unwrap();
        self
    }

    fn hardlink(mut self, path: &str, target: &str) -> Layer {
        let mut h = Self::header(tar::EntryType::Link, 0o644, (0, 0));
        self.0.append_link(&mut h, path, target).unwrap();
        self
    }

    fn xattr_file(mut self, path: &str, data: &[u8], attr: &str, value: &[u8]) -> Layer {
        let key = format!("SCHILY.xattr.{attr}");
        self.0
            .append_pax_extensions([(key.as_str(), value)])
            .unwrap();
        self.file(path, data, 0o644, (0, 0))
    }

    /// An entry whose name is written raw, as a hostile archive would.
    fn raw(mut self, name: &[u8], data: &[u8]) -> Layer {
        let mut h = Self::header(tar::EntryType::Regular, 0o644, (0, 0));
        h.as_old_mut().name[..name.len()].copy_from_slice(name);
        h.set_size(data.len() as u64);
        h.set_cksum();
        self.0.append(&h, data).unwrap();
        self
    }

    fn bytes(self) -> Vec<u8> {
        self.0.into_inner().unwrap()
    }
}

fn budget() -> Budget {
    Budget {
        bytes: 1 << 30,
        entries: 100_000,
    }
}

fn apply(root: &Path, layer: Vec<u8>) -> Result<LayerStats> {
    apply_layer(root, &layer[..], Compression::None, &mut budget())
}

#[test]
fn three_layers_with_whiteouts_an_opaque_directory_and_links() {
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    apply(
        r,
        Layer::new()
            .dir("etc", 0o755)
            .file("etc/a", b"a", 0o644, (0, 0))
            .file("etc/keep", b"k", 0o640, (1000, 1000))
            .dir("opt", 0o755)
            .file("opt/lower-1", b"1", 0o644, (0, 0))
            .dir("opt/sub", 0o755)
            .file("opt/sub/lower-2", b"2", 0o644, (0, 0))
            .symlink("conf", "/etc")
            .file("bin-tool", b"#!/bin/sh\n", 0o4755, (0, 0))
            .bytes(),
    )
    .unwrap();
    let stats = apply(
        r,
        Layer::new()
            .file("etc/.wh.a", b"", 0o644, (0, 0))
            .dir("opt", 0o755)
            .dir("opt/sub", 0o755)
            .file("opt/sub/upper", b"u", 0o644, (0, 0))
            .file("opt/.wh..wh..opq", b"", 0o644, (0, 0))
            .file("opt/new", b"n", 0o644, (0, 0))
            .bytes(),
    )
    .unwrap();
    assert_eq!(stats.whiteouts, 3, "{stats:?}"); // etc/a, opt/lower-1, opt/sub/lower-2
    apply(
        r,
        Layer::new()
            // Through the link: lands in /etc of the image.
            .file("conf/b", b"via link", 0o600, (0, 0))
            .hardlink("etc/keep-again", "etc/keep")
            .xattr_file("etc/tagged", b"t", "user.origin", b"layer-3")
            .bytes(),
    )
    .unwrap();

    let mut seen = Vec::new();
    for e in walk(r) {
        seen.push(e);
    }
    assert_eq!(
        seen,
        [
            "bin-tool",
            "conf",
            "etc",
            "etc/b",
            "etc/keep",
            "etc/keep-again",
            "etc/tagged",
            "opt",
            "opt/new",
            "opt/sub",
            "opt/sub/upper",
        ]
    );
    assert_eq!(fs::read(r.join("etc/b")).unwrap(), b"via link");
    let keep = fs::metadata(r.join("etc/keep")).unwrap();
    assert_eq!(
        (keep.uid(), keep.gid(), keep.mode() & 0o7777),
        (1000, 1000, 0o640)
    );
    assert_eq!(
        keep.ino(),
        fs::metadata(r.join("etc/keep-again")).unwrap().ino()
    );
    assert_eq!(
        fs::metadata(r.join("bin-tool")).unwrap().mode() & 0o7777,
        0o4755
    );
    assert_eq!(fs::read_link(r.join("conf")).unwrap(), Path::new("/etc"));
    assert_eq!(
        fs::metadata(r.join("etc/b")).unwrap().mtime(),
        1_600_000_000
    );
    assert_eq!(read_xattr(&r.join("etc/tagged"), "user.origin"), b"layer-3");
}

fn walk(root: &Path) -> Vec<String> {
    fn go(root: &Path, dir: &Path, out: &mut Vec<String>) {
        let mut names: Vec<_> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        names.sort();
        for p in names {
            out.push(p.strip_prefix(root).unwrap().to_string_lossy().into_owned());
            if fs::symlink_metadata(&p).unwrap().is_dir() {
                go(root, &p, out);
            }
        }
    }
    let mut out = Vec::new();
    go(root, root, &mut out);
    out
}

fn read_xattr(path: &Path, name: &str) -> Vec<u8> {
    let (c, n) = (c_path(path).unwrap(), CString::new(name).unwrap());
    let mut buf = vec![0u8; 256];
    // SAFETY: both strings are NUL-terminated and `buf` is valid for its length.
    let len =
        unsafe { libc::lgetxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(
        len >= 0,
        "{name} on {}: {}",
        path.display(),
        io::Error::last_os_error()
    );
    buf.truncate(len as usize);
    buf
}

#[test]
fn nothing_is_written_outside_the_root() {
    let outside = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    // `..` past the root is refused outright.
    let e = apply(r, Layer::new().raw(b"../escaped", b"x").bytes()).unwrap_err();
    assert!(e.to_string().contains("leaves the image's root"), "{e}");
    // A link to a path outside is followed inside the root: absolute targets start at the
    // root, `..` stops there.
    let target = outside.path().to_str().unwrap().to_owned();
    apply(
        r,
        Layer::new()
            .symlink("abs", &target)
            .symlink("rel", "../../../../../../..")
            .file("abs/f", b"1", 0o644, (0, 0))
            .file("rel/g", b"2", 0o644, (0, 0))
            .bytes(),
    )
    .unwrap();
    assert_eq!(fs::read_dir(outside.path()).unwrap().count(), 0);
    assert_eq!(
        fs::read(r.join(target.trim_start_matches('/')).join("f")).unwrap(),
        b"1"
    );
    assert_eq!(fs::read(r.join("g")).unwrap(), b"2");
    // A hard link to a file outside the root names a file of the image, which is missing.
    let outside_file = outside.path().join("secret");
    fs::write(&outside_file, b"s").unwrap();
    let e = apply(
        r,
        Layer::new()
            .hardlink("stolen", outside_file.to_str().unwrap())
            .bytes(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("is not a file of the image"), "{e}");
    // A link loop ends with an error.
    let e = apply(
        r,
        Layer::new()
            .symlink("loop-a", "loop-b")
            .symlink("loop-b", "loop-a")
            .file("loop-a/x", b"x", 0o644, (0, 0))
            .bytes(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("symbolic links"), "{e}");
}

#[test]
fn budgets_truncation_and_compression() {
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    let big = Layer::new()
        .file("big", &vec![7u8; 4096], 0o644, (0, 0))
        .bytes();
    let mut small = Budget {
        bytes: 1000,
        entries: 10,
    };
    let e = apply_layer(r, &big[..], Compression::None, &mut small).unwrap_err();
    assert!(
        e.to_string().contains("larger than a template may hold"),
        "{e}"
    );
    let mut few = Budget {
        bytes: 1 << 20,
        entries: 1,
    };
    let two = Layer::new()
        .file("a", b"a", 0o644, (0, 0))
        .file("b", b"b", 0o644, (0, 0))
        .bytes();
    let e = apply_layer(r, &two[..], Compression::None, &mut few).unwrap_err();
    assert!(e.to_string().contains("more entries"), "{e}");

    // Cut short in the middle of a file's content.
    let e = apply(r, big[..1024].to_vec()).unwrap_err();
    assert!(matches!(e, ImageError::Invalid(_)), "{e}");

    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&big).unwrap();
    let gz = gz.finish().unwrap();
    assert_eq!(Compression::sniff(&gz), Compression::Gzip);
    let stats = apply_layer(r, &gz[..], Compression::Gzip, &mut budget()).unwrap();
    assert_eq!((stats.entries, stats.bytes), (1, 4096));
    let zs = zstd::encode_all(&big[..], 1).unwrap();
    assert_eq!(Compression::sniff(&zs), Compression::Zstd);
    apply_layer(r, &zs[..], Compression::Zstd, &mut budget()).unwrap();
    assert_eq!(fs::read(r.join("big")).unwrap(), vec![7u8; 4096]);
    // Garbage is not a layer.
    let e = apply_layer(r, &b"not gzip at all"[..], Compression::Gzip, &mut budget());
    assert!(e.is_err());
}

#[test]
fn a_file_replaces_a_lower_directory_and_a_directory_a_lower_file() {
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    apply(
        r,
        Layer::new()
            .dir("x", 0o755)
            .file("x/inner", b"i", 0o644, (0, 0))
            .file("y", b"y", 0o644, (0, 0))
            .bytes(),
    )
    .unwrap();
    apply(
        r,
        Layer::new()
            .file("x", b"now a file", 0o644, (0, 0))
            .dir("y", 0o700)
            .bytes(),
    )
    .unwrap();
    assert_eq!(fs::read(r.join("x")).unwrap(), b"now a file");
    let y = fs::metadata(r.join("y")).unwrap();
    assert!(y.is_dir());
    assert_eq!(y.mode() & 0o7777, 0o700);
}
