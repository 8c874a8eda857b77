//! One layer applied onto a root tree, as an overlay stack would show it.
//!
//! A layer is a tar stream (plain, gzip or zstd). Its entries are written under `root`:
//! regular files, directories, symbolic and hard links with their modes, owners, modification
//! times and extended attributes (`user.*` and `security.capability`). `.wh.NAME` removes
//! `NAME` from the layers below; `.wh..wh..opq` in a directory hides everything the layers
//! below put in it (what this layer put there stays). Device nodes and FIFOs are skipped: a
//! guest has devtmpfs.
//!
//! Nothing in an archive is trusted. An entry whose path leaves the root (`..` past it) is
//! refused; a path that goes through a symbolic link follows it *inside* the root, as a chroot
//! would (an absolute target starts at the root, `..` stops there), so a link planted by one
//! entry cannot make a later one write outside. Hard link targets resolve the same way. A
//! [`Budget`] bounds the bytes and entries an image may write, so a decompression bomb stops
//! with an error instead of filling the disk.

use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::{CString, OsStr, OsString};
use std::fs;
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use crate::{ImageError, Result};

/// Symbolic links followed while resolving one path, at most (Linux's own limit).
const MAX_LINK_HOPS: usize = 40;
/// The whiteout prefix.
const WHITEOUT: &str = ".wh.";
/// The marker of an opaque directory.
const OPAQUE: &str = ".wh..wh..opq";

/// How a layer's bytes are compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

impl Compression {
    /// The compression a layer's media type names, or `None` for a type that is not a layer.
    pub fn from_media_type(media_type: &str) -> Option<Compression> {
        match media_type {
            "application/vnd.oci.image.layer.v1.tar"
            | "application/vnd.oci.image.layer.nondistributable.v1.tar" => Some(Compression::None),
            "application/vnd.oci.image.layer.v1.tar+gzip"
            | "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"
            | "application/vnd.docker.image.rootfs.diff.tar.gzip"
            | "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip" => {
                Some(Compression::Gzip)
            }
            "application/vnd.oci.image.layer.v1.tar+zstd" => Some(Compression::Zstd),
            _ => None,
        }
    }

    /// The compression the first bytes of a layer show (docker archives do not say).
    pub fn sniff(head: &[u8]) -> Compression {
        if head.starts_with(&[0x1f, 0x8b]) {
            Compression::Gzip
        } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
            Compression::Zstd
        } else {
            Compression::None
        }
    }
}

/// What an image may still write: bytes of file content and entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    pub bytes: u64,
    pub entries: u64,
}

/// What one layer did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LayerStats {
    /// Entries written (files, directories, links).
    pub entries: u64,
    /// Bytes of file content written.
    pub bytes: u64,
    /// Paths removed by whiteouts and opaque directories.
    pub whiteouts: u64,
    /// Entries skipped (device nodes, FIFOs, extended attributes of other namespaces).
    pub skipped: u64,
}

fn invalid(msg: impl Into<String>) -> ImageError {
    ImageError::Invalid(msg.into())
}

/// An archive path as components under the root; `None` for the root itself. Refuses a
/// path that leaves the root or holds a NUL.
fn components(path: &Path) -> Result<Vec<OsString>> {
    let mut out: Vec<OsString> = Vec::new();
    for c in path.components() {
        match c {
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
            Component::ParentDir => {
                if out.pop().is_none() {
                    return Err(invalid(format!(
                        "the entry {} leaves the image's root",
                        path.display()
                    )));
                }
            }
            Component::Normal(n) => {
                if n.as_bytes().contains(&0) {
                    return Err(invalid(format!("the entry {} has a NUL", path.display())));
                }
                out.push(n.to_os_string());
            }
        }
    }
    Ok(out)
}

/// The real directory (under `root`) that `dirs` name, following symbolic links inside the
/// root; missing directories are made (mode 0755, root's) when `create`.
pub(crate) fn resolve_dir(root: &Path, dirs: &[OsString], create: bool) -> Result<PathBuf> {
    let mut cur: Vec<OsString> = Vec::new();
    let mut queue: VecDeque<OsString> = dirs.iter().cloned().collect();
    let mut hops = 0;
    while let Some(c) = queue.pop_front() {
        if c == ".." {
            cur.pop();
            continue;
        }
        if c.is_empty() || c == "." {
            continue;
        }
        let mut here = root.to_path_buf();
        here.extend(&cur);
        here.push(&c);
        match fs::symlink_metadata(&here) {
            Ok(m) if m.file_type().is_symlink() => {
                hops += 1;
                if hops > MAX_LINK_HOPS {
                    return Err(invalid(format!(
                        "{} goes through more than {MAX_LINK_HOPS} symbolic links",
                        display(dirs)
                    )));
                }
                let target = fs::read_link(&here)
                    .map_err(|e| ImageError::io(format!("readlink {}", here.display()), e))?;
                let mut front: Vec<OsString> = Vec::new();
                for t in target.components() {
                    match t {
                        Component::RootDir => {
                            cur.clear();
                            front.clear();
                        }
                        Component::ParentDir => front.push("..".into()),
                        Component::Normal(n) => front.push(n.to_os_string()),
                        Component::CurDir | Component::Prefix(_) => {}
                    }
                }
                for t in front.into_iter().rev() {
                    queue.push_front(t);
                }
            }
            Ok(m) if m.is_dir() => cur.push(c),
            Ok(_) => {
                return Err(invalid(format!(
                    "{} is not a directory in the image, but an entry is under it",
                    display(&[cur.clone(), vec![c]].concat())
                )))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound && create => {
                fs::DirBuilder::new()
                    .mode(0o755)
                    .create(&here)
                    .map_err(|e| ImageError::io(format!("mkdir {}", here.display()), e))?;
                cur.push(c);
            }
            Err(e) => return Err(ImageError::io(format!("stat {}", here.display()), e)),
        }
    }
    let mut out = root.to_path_buf();
    out.extend(&cur);
    Ok(out)
}

fn display(parts: &[OsString]) -> String {
    let mut p = PathBuf::from("/");
    p.extend(parts);
    p.display().to_string()
}

/// Removes whatever is at `path` (a directory with its contents; a link, not its target).
pub(crate) fn remove(path: &Path) -> Result<bool> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(path)
            .map(|()| true)
            .map_err(|e| ImageError::io(format!("remove {}", path.display()), e)),
        Ok(_) => fs::remove_file(path)
            .map(|()| true)
            .map_err(|e| ImageError::io(format!("remove {}", path.display()), e)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(ImageError::io(format!("stat {}", path.display()), e)),
    }
}

/// Hides what lower layers put in `dir`: removes each child not written by this layer, and
/// inside a directory this layer wrote, recurses.
fn make_opaque(dir: &Path, written: &HashSet<PathBuf>, stats: &mut LayerStats) -> Result<()> {
    let children =
        fs::read_dir(dir).map_err(|e| ImageError::io(format!("list {}", dir.display()), e))?;
    for child in children {
        let child = child.map_err(|e| ImageError::io(format!("list {}", dir.display()), e))?;
        let path = child.path();
        if !written.contains(&path) {
            if remove(&path)? {
                stats.whiteouts += 1;
            }
        } else if fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
            make_opaque(&path, written, stats)?;
        }
    }
    Ok(())
}

fn c_path(path: &Path) -> Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| invalid(format!("{} has a NUL", path.display())))
}

/// Sets the modification time of `path` itself (a link, not its target).
fn set_mtime(path: &Path, secs: u64) -> Result<()> {
    let c = c_path(path)?;
    let t = libc::timespec {
        tv_sec: libc::time_t::try_from(secs).unwrap_or(libc::time_t::MAX),
        tv_nsec: 0,
    };
    let times = [t, t];
    // SAFETY: `c` is a NUL-terminated path and `times` two valid timespecs for the call.
    let rc = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if rc != 0 {
        return Err(ImageError::io(
            format!("set the time of {}", path.display()),
            io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// Sets an extended attribute on `path` itself.
fn set_xattr(path: &Path, name: &str, value: &[u8]) -> Result<()> {
    let (c, n) = (
        c_path(path)?,
        CString::new(name).map_err(|_| invalid(format!("the attribute {name:?} has a NUL")))?,
    );
    // SAFETY: both strings are NUL-terminated and `value` is valid for its length.
    let rc = unsafe {
        libc::lsetxattr(
            c.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if rc != 0 {
        return Err(ImageError::io(
            format!("set {name} on {}", path.display()),
            io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// Whether an attribute of this name is carried into the root tree.
fn kept_xattr(name: &str) -> bool {
    (name.starts_with("user.") && name.len() > 5) || name == "security.capability"
}

/// Applies one layer read from `reader` onto `root`, within `budget` (what it writes is
/// taken from it). On an error the root is left partly written: the caller discards it.
pub fn apply_layer(
    root: &Path,
    reader: impl Read,
    compression: Compression,
    budget: &mut Budget,
) -> Result<LayerStats> {
    apply_tar(root, decompress(reader, compression)?, budget)
}

/// `reader`'s bytes decompressed.
pub fn decompress<'a>(
    reader: impl Read + 'a,
    compression: Compression,
) -> Result<Box<dyn Read + 'a>> {
    Ok(match compression {
        Compression::None => Box::new(reader),
        Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(reader)),
        Compression::Zstd => Box::new(
            zstd::stream::read::Decoder::new(reader)
                .map_err(|e| ImageError::io("start the zstd decoder", e))?,
        ),
    })
}

/// Applies an uncompressed layer (a tar stream) onto `root`; see [`apply_layer`].
pub fn apply_tar(root: &Path, reader: impl Read, budget: &mut Budget) -> Result<LayerStats> {
    let mut archive = tar::Archive::new(reader);
    let mut stats = LayerStats::default();
    let mut written: HashSet<PathBuf> = HashSet::new();
    // Directory times are set last: writing into a directory changes its time.
    let mut dir_times: HashMap<PathBuf, u64> = HashMap::new();
    let entries = archive
        .entries()
        .map_err(|e| invalid(format!("the layer is not a tar archive: {e}")))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| invalid(format!("a layer entry: {e}")))?;
        let raw_path = entry
            .path()
            .map_err(|e| invalid(format!("a layer entry's path: {e}")))?
            .into_owned();
        let parts = components(&raw_path)?;
        let Some((name, parents)) = parts.split_last() else {
            // The root itself: only its metadata could change, and the root is ours.
            continue;
        };
        if budget.entries == 0 {
            return Err(invalid(
                "the image has more entries than a template may hold",
            ));
        }
        budget.entries -= 1;
        let dir = resolve_dir(root, parents, true)?;
        let name_str = name.to_string_lossy();
        if name_str == OPAQUE {
            make_opaque(&dir, &written, &mut stats)?;
            continue;
        }
        if let Some(hidden) = name_str.strip_prefix(WHITEOUT) {
            if hidden.is_empty() || hidden == "." || hidden == ".." || hidden.contains('/') {
                return Err(invalid(format!(
                    "the whiteout {} is malformed",
                    raw_path.display()
                )));
            }
            if remove(&dir.join(hidden))? {
                stats.whiteouts += 1;
            }
            continue;
        }
        let path = dir.join(name);
        let header = entry.header().clone();
        let kind = header.entry_type();
        let mode = header
            .mode()
            .map_err(|e| invalid(format!("{}: mode: {e}", raw_path.display())))?
            & 0o7777;
        let uid = header
            .uid()
            .map_err(|e| invalid(format!("{}: uid: {e}", raw_path.display())))?;
        let gid = header
            .gid()
            .map_err(|e| invalid(format!("{}: gid: {e}", raw_path.display())))?;
        let mtime = header.mtime().unwrap_or(0);
        let (uid, gid) = (
            u32::try_from(uid)
                .map_err(|_| invalid(format!("{}: uid {uid}", raw_path.display())))?,
            u32::try_from(gid)
                .map_err(|_| invalid(format!("{}: gid {gid}", raw_path.display())))?,
        );
        let mut xattrs: Vec<(String, Vec<u8>)> = Vec::new();
        if let Ok(Some(exts)) = entry.pax_extensions() {
            for ext in exts {
                let ext =
                    ext.map_err(|e| invalid(format!("{}: pax header: {e}", raw_path.display())))?;
                let Ok(key) = ext.key() else { continue };
                if let Some(attr) = key.strip_prefix("SCHILY.xattr.") {
                    if kept_xattr(attr) {
                        xattrs.push((attr.to_owned(), ext.value_bytes().to_vec()));
                    } else {
                        stats.skipped += 1;
                    }
                }
            }
        }
        match kind {
            tar::EntryType::Directory => {
                match fs::symlink_metadata(&path) {
                    Ok(m) if m.is_dir() => {}
                    Ok(_) => {
                        remove(&path)?;
                        mkdir(&path)?;
                    }
                    Err(_) => mkdir(&path)?,
                }
                dir_times.insert(path.clone(), mtime);
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                let size = header.size().unwrap_or(0);
                if size > budget.bytes {
                    return Err(invalid(format!(
                        "the image is larger than a template may hold (at {})",
                        raw_path.display()
                    )));
                }
                remove(&path)?;
                let mut file = fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&path)
                    .map_err(|e| ImageError::io(format!("create {}", path.display()), e))?;
                let copied = io::copy(&mut (&mut entry).take(size), &mut file).map_err(|e| {
                    invalid(format!(
                        "{}: the layer is cut short: {e}",
                        raw_path.display()
                    ))
                })?;
                if copied != size {
                    return Err(invalid(format!(
                        "{}: the layer is cut short",
                        raw_path.display()
                    )));
                }
                budget.bytes -= copied;
                stats.bytes += copied;
            }
            tar::EntryType::Symlink => {
                let target = link_target(&entry, &raw_path)?;
                if target.as_os_str().as_bytes().contains(&0) || target.as_os_str().is_empty() {
                    return Err(invalid(format!(
                        "{}: a bad link target",
                        raw_path.display()
                    )));
                }
                remove(&path)?;
                std::os::unix::fs::symlink(&target, &path)
                    .map_err(|e| ImageError::io(format!("symlink {}", path.display()), e))?;
            }
            tar::EntryType::Link => {
                let target = link_target(&entry, &raw_path)?;
                let tparts = components(&target)?;
                let Some((tname, tparents)) = tparts.split_last() else {
                    return Err(invalid(format!(
                        "{}: a hard link to the root",
                        raw_path.display()
                    )));
                };
                let source = resolve_dir(root, tparents, false)?.join(tname);
                match fs::symlink_metadata(&source) {
                    Ok(m) if !m.is_dir() => {}
                    _ => {
                        return Err(invalid(format!(
                            "{}: the hard link's target {} is not a file of the image",
                            raw_path.display(),
                            target.display()
                        )))
                    }
                }
                if source != path {
                    remove(&path)?;
                    fs::hard_link(&source, &path)
                        .map_err(|e| ImageError::io(format!("link {}", path.display()), e))?;
                }
                // A hard link shares its target's inode: owner and mode are the target's.
                written.insert(path);
                stats.entries += 1;
                continue;
            }
            tar::EntryType::Char | tar::EntryType::Block | tar::EntryType::Fifo => {
                stats.skipped += 1;
                continue;
            }
            // Headers that only carry metadata of the next entry are read by the tar reader.
            tar::EntryType::XGlobalHeader
            | tar::EntryType::XHeader
            | tar::EntryType::GNULongName
            | tar::EntryType::GNULongLink => continue,
            other => {
                return Err(invalid(format!(
                    "{}: entries of type {other:?} are not supported",
                    raw_path.display()
                )))
            }
        }
        std::os::unix::fs::lchown(&path, Some(uid), Some(gid))
            .map_err(|e| ImageError::io(format!("chown {}", path.display()), e))?;
        if kind != tar::EntryType::Symlink {
            // After the owner: chown clears the set-id bits.
            fs::set_permissions(&path, fs::Permissions::from_mode(mode))
                .map_err(|e| ImageError::io(format!("chmod {}", path.display()), e))?;
        }
        for (attr, value) in &xattrs {
            set_xattr(&path, attr, value)?;
        }
        if kind != tar::EntryType::Directory {
            set_mtime(&path, mtime)?;
        }
        written.insert(path);
        stats.entries += 1;
    }
    for (dir, mtime) in dir_times {
        if fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir()) {
            set_mtime(&dir, mtime)?;
        }
    }
    Ok(stats)
}

/// The target a link entry names.
fn link_target<R: Read>(entry: &tar::Entry<R>, raw_path: &Path) -> Result<PathBuf> {
    Ok(entry
        .link_name()
        .map_err(|e| invalid(format!("{}: link target: {e}", raw_path.display())))?
        .ok_or_else(|| invalid(format!("{}: a link without a target", raw_path.display())))?
        .into_owned())
}

fn mkdir(path: &Path) -> Result<()> {
    fs::DirBuilder::new()
        .mode(0o755)
        .create(path)
        .map_err(|e| ImageError::io(format!("mkdir {}", path.display()), e))
}

/// Whether `name` is a whiteout of any kind (what a layer writer must not copy as a file).
pub fn is_whiteout(name: &OsStr) -> bool {
    name.as_bytes().starts_with(WHITEOUT.as_bytes())
}

#[cfg(test)]
mod tests;
