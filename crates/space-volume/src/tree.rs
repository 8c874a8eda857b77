//! A volume's directory on the host, and every operation on it.
//!
//! Whatever made the entries in it (a guest, through its mount, can make symlinks, hard links
//! and deep trees) the host never leaves the tree: a path is checked ([`check_path`]), its
//! parent directory is opened with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//! RESOLVE_NO_XDEV)` from the root's descriptor, and the last name is used with the `*at`
//! calls that do not follow it (`AT_SYMLINK_NOFOLLOW`, `O_NOFOLLOW`). A symlink anywhere in a
//! path is `ELOOP`; its text is kept and shown, never followed. Only regular files, directories
//! and symlinks are made; set-user-id and set-group-id bits are dropped.
//!
//! Bytes are counted: the tree knows the blocks its entries take (each inode once), and a write
//! or a truncation that would take it past its size is `ENOSPC` before anything is written.

use std::collections::HashSet;
use std::ffi::{CString, OsStr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use nix::errno::Errno;
use nix::fcntl::{openat, openat2, OFlag, OpenHow, RenameFlags, ResolveFlag};
use nix::sys::stat::{fchmod, fstat, fstatat, futimens, mkdirat, FileStat, Mode};
use nix::sys::time::TimeSpec;
use nix::unistd::{fchown, fchownat, linkat, symlinkat, unlinkat, Gid, Uid, UnlinkatFlags};
use space_proto::volume::{
    check_name, check_path, Attr, Entry, EntryKind, VolumeStat, MAX_ENTRIES,
};

/// An errno as the protocol carries it.
pub type Result<T> = std::result::Result<T, Errno>;

/// Permission bits kept (no set-user-id, no set-group-id).
const MODE_BITS: u32 = 0o1777;

/// A volume's directory, opened.
pub struct Tree {
    root: OwnedFd,
    size_bytes: AtomicU64,
    used_bytes: AtomicU64,
    entries: AtomicU64,
    /// Calls that may have changed the tree, counted (copies are made when it moves).
    changes: AtomicU64,
}

fn nul_free(s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Errno::EINVAL)
}

fn resolve_flags() -> ResolveFlag {
    ResolveFlag::RESOLVE_BENEATH
        | ResolveFlag::RESOLVE_NO_SYMLINKS
        | ResolveFlag::RESOLVE_NO_MAGICLINKS
        | ResolveFlag::RESOLVE_NO_XDEV
}

fn owned(fd: RawFd) -> OwnedFd {
    // SAFETY: `fd` was just returned by a successful open call and is owned by no one else.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// A path's parent and last name; `None` for the root.
fn split(path: &str) -> Option<(&str, &str)> {
    if path.is_empty() {
        return None;
    }
    Some(match path.rsplit_once('/') {
        Some((p, n)) => (p, n),
        None => ("", path),
    })
}

fn kind_of(st: &FileStat) -> EntryKind {
    match st.st_mode & libc::S_IFMT {
        libc::S_IFREG => EntryKind::File,
        libc::S_IFDIR => EntryKind::Dir,
        libc::S_IFLNK => EntryKind::Symlink,
        _ => EntryKind::Other,
    }
}

/// The protocol's attributes of `st`.
pub fn attr_of(st: &FileStat) -> Attr {
    let ns = |s: i64, n: i64| s.saturating_mul(1_000_000_000).saturating_add(n);
    Attr {
        kind: kind_of(st),
        mode: st.st_mode & 0o7777,
        size: st.st_size.max(0) as u64,
        blocks: st.st_blocks.max(0) as u64,
        nlink: st.st_nlink.min(u32::MAX as u64) as u32,
        uid: st.st_uid,
        gid: st.st_gid,
        atime_ns: ns(st.st_atime, st.st_atime_nsec),
        mtime_ns: ns(st.st_mtime, st.st_mtime_nsec),
        ctime_ns: ns(st.st_ctime, st.st_ctime_nsec),
        ino: st.st_ino,
    }
}

fn bytes_of(st: &FileStat) -> u64 {
    (st.st_blocks.max(0) as u64).saturating_mul(512)
}

/// A time for `futimens`: nanoseconds since the epoch, `-1` now, `None` unchanged.
fn timespec(ns: Option<i64>) -> TimeSpec {
    match ns {
        None => TimeSpec::new(0, libc::UTIME_OMIT),
        Some(-1) => TimeSpec::new(0, libc::UTIME_NOW),
        Some(ns) => TimeSpec::new(ns.div_euclid(1_000_000_000), ns.rem_euclid(1_000_000_000)),
    }
}

struct Counted<'a>(&'a AtomicU64);

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// What to change of an entry ([`Tree::set_attr`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Change {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime_ns: Option<i64>,
    pub mtime_ns: Option<i64>,
}

impl Tree {
    /// Opens the directory `dir` as a volume of `size_bytes`, counting what is in it.
    pub fn open(dir: &Path, size_bytes: u64) -> std::io::Result<Tree> {
        let fd = nix::fcntl::open(
            dir,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW,
            Mode::empty(),
        )?;
        let tree = Tree {
            root: owned(fd),
            size_bytes: AtomicU64::new(size_bytes),
            used_bytes: AtomicU64::new(0),
            entries: AtomicU64::new(0),
            changes: AtomicU64::new(0),
        };
        tree.recount()?;
        Ok(tree)
    }

    /// Counts the blocks and entries of the tree again (each inode once).
    pub fn recount(&self) -> std::io::Result<VolumeStat> {
        let mut seen = HashSet::new();
        let (mut bytes, mut entries) = (0u64, 0u64);
        let mut stack = vec![String::new()];
        while let Some(dir) = stack.pop() {
            let mut after = None;
            loop {
                let (page, more) = self.read_dir(&dir, after.as_deref())?;
                for e in &page {
                    entries += 1;
                    if seen.insert(e.attr.ino) {
                        bytes = bytes.saturating_add(e.attr.blocks.saturating_mul(512));
                    }
                    if e.attr.kind == EntryKind::Dir {
                        stack.push(space_proto::volume::join(&dir, &e.name));
                    }
                }
                if !more {
                    break;
                }
                after = page.last().map(|e| e.name.clone());
            }
        }
        self.used_bytes.store(bytes, Ordering::Relaxed);
        self.entries.store(entries, Ordering::Relaxed);
        Ok(self.stat_fs())
    }

    /// Size and use.
    pub fn stat_fs(&self) -> VolumeStat {
        VolumeStat {
            size_bytes: self.size_bytes.load(Ordering::Relaxed),
            used_bytes: self.used_bytes.load(Ordering::Relaxed),
            entries: self.entries.load(Ordering::Relaxed),
        }
    }

    /// How many calls that may change the tree were made since it was opened: equal
    /// counts at two moments mean nothing changed in between.
    pub fn changes(&self) -> u64 {
        self.changes.load(Ordering::SeqCst)
    }

    /// Counts a change when the call ends, after its effect: a copy that read the count
    /// before the effect landed sees a new count afterwards and copies again.
    fn change(&self) -> Counted<'_> {
        Counted(&self.changes)
    }

    /// Changes the volume's size (a smaller size than in use refuses only new bytes).
    pub fn set_size(&self, size_bytes: u64) {
        self.size_bytes.store(size_bytes, Ordering::Relaxed);
    }

    fn grow(&self, before: u64, after: u64) {
        if after >= before {
            self.used_bytes.fetch_add(after - before, Ordering::Relaxed);
        } else {
            let d = before - after;
            let _ = self
                .used_bytes
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| {
                    Some(u.saturating_sub(d))
                });
        }
    }

    fn count_entries(&self, add: bool) {
        if add {
            self.entries.fetch_add(1, Ordering::Relaxed);
        } else {
            let _ = self
                .entries
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| {
                    Some(u.saturating_sub(1))
                });
        }
    }

    /// `ENOSPC` unless `more` bytes fit.
    fn room_for(&self, more: u64) -> Result<()> {
        let used = self.used_bytes.load(Ordering::Relaxed);
        if more > 0 && used.saturating_add(more) > self.size_bytes.load(Ordering::Relaxed) {
            return Err(Errno::ENOSPC);
        }
        Ok(())
    }

    /// The directory at `rel` (checked), opened with `flags`, never through a symlink.
    fn open_dir(&self, rel: &str, flags: OFlag) -> Result<OwnedFd> {
        let path = if rel.is_empty() { "." } else { rel };
        let how = OpenHow::new()
            .flags(flags | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
            .resolve(resolve_flags());
        openat2(self.root.as_raw_fd(), path, how).map(owned)
    }

    /// `path`'s parent directory (an `O_PATH` descriptor) and last name.
    fn parent(&self, path: &str) -> Result<(OwnedFd, CString)> {
        check_path(path).map_err(|_| Errno::EINVAL)?;
        let (parent, name) = split(path).ok_or(Errno::EBUSY)?;
        Ok((self.open_dir(parent, OFlag::O_PATH)?, nul_free(name)?))
    }

    fn lstat_at(dir: &OwnedFd, name: &CString) -> Result<FileStat> {
        fstatat(
            Some(dir.as_raw_fd()),
            name.as_c_str(),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        )
    }

    /// Opens the entry at `path` itself (never a symlink's target; a symlink is `ELOOP`).
    fn open_entry(&self, path: &str, flags: OFlag) -> Result<OwnedFd> {
        check_path(path).map_err(|_| Errno::EINVAL)?;
        match split(path) {
            None => self.open_dir("", flags & !OFlag::O_DIRECTORY),
            Some(_) => {
                let (dir, name) = self.parent(path)?;
                openat(
                    Some(dir.as_raw_fd()),
                    name.as_c_str(),
                    flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK,
                    Mode::empty(),
                )
                .map(owned)
            }
        }
    }

    /// The entry at `path`, not following a symlink.
    pub fn stat(&self, path: &str) -> Result<Attr> {
        check_path(path).map_err(|_| Errno::EINVAL)?;
        match split(path) {
            None => fstat(self.root.as_raw_fd()).map(|s| attr_of(&s)),
            Some(_) => {
                let (dir, name) = self.parent(path)?;
                Self::lstat_at(&dir, &name).map(|s| attr_of(&s))
            }
        }
    }

    /// Up to [`MAX_ENTRIES`] entries of the directory `path` after the name `after`, in name
    /// order, and whether more follow.
    pub fn read_dir(&self, path: &str, after: Option<&str>) -> Result<(Vec<Entry>, bool)> {
        check_path(path).map_err(|_| Errno::EINVAL)?;
        let fd = self.open_dir(path, OFlag::O_RDONLY)?;
        let dup = nix::unistd::dup(fd.as_raw_fd())?;
        let mut dir = nix::dir::Dir::from_fd(dup)?;
        let mut names: Vec<Vec<u8>> = Vec::new();
        for e in dir.iter() {
            let e = e?;
            let n = e.file_name().to_bytes();
            if n == b"." || n == b".." {
                continue;
            }
            if after.is_some_and(|a| n <= a.as_bytes()) {
                continue;
            }
            names.push(n.to_vec());
        }
        names.sort_unstable();
        let more = names.len() > MAX_ENTRIES as usize;
        names.truncate(MAX_ENTRIES as usize);
        let mut out = Vec::with_capacity(names.len());
        for n in names {
            // A name that is not UTF-8 cannot be named by any request; it is left out.
            let Ok(name) = String::from_utf8(n) else {
                continue;
            };
            if check_name(&name).is_err() {
                continue;
            }
            let c = nul_free(&name)?;
            match Self::lstat_at(&fd, &c) {
                Ok(st) => out.push(Entry {
                    name,
                    attr: attr_of(&st),
                }),
                // Removed between the listing and the stat.
                Err(Errno::ENOENT) => {}
                Err(e) => return Err(e),
            }
        }
        Ok((out, more))
    }

    /// Up to `size` bytes of the file at `path` from `offset`.
    pub fn read(&self, path: &str, offset: u64, size: u32) -> Result<Vec<u8>> {
        let fd = self.open_entry(path, OFlag::O_RDONLY)?;
        let st = fstat(fd.as_raw_fd())?;
        match kind_of(&st) {
            EntryKind::File => {}
            EntryKind::Dir => return Err(Errno::EISDIR),
            _ => return Err(Errno::EINVAL),
        }
        let mut buf = vec![0u8; size.min(space_proto::volume::MAX_IO) as usize];
        let mut filled = 0;
        while filled < buf.len() {
            let off =
                i64::try_from(offset.saturating_add(filled as u64)).map_err(|_| Errno::EINVAL)?;
            let n = nix::sys::uio::pread(&fd, &mut buf[filled..], off)?;
            if n == 0 {
                break;
            }
            filled += n;
        }
        buf.truncate(filled);
        Ok(buf)
    }

    /// Writes `data` at `offset` of the existing file `path`; answers its attributes after.
    pub fn write(&self, path: &str, offset: u64, data: &[u8]) -> Result<Attr> {
        let _counted = self.change();
        if data.len() > space_proto::volume::MAX_IO as usize {
            return Err(Errno::EFBIG);
        }
        let fd = self.open_entry(path, OFlag::O_WRONLY)?;
        let st = fstat(fd.as_raw_fd())?;
        if kind_of(&st) != EntryKind::File {
            return Err(Errno::EINVAL);
        }
        let end = offset.checked_add(data.len() as u64).ok_or(Errno::EFBIG)?;
        let size = st.st_size.max(0) as u64;
        // New bytes past the end take blocks; rewritten ones may too (copy on write), which
        // the count after the write picks up.
        self.room_for(end.saturating_sub(size))?;
        let mut done = 0;
        while done < data.len() {
            let off = i64::try_from(offset + done as u64).map_err(|_| Errno::EFBIG)?;
            let n = nix::sys::uio::pwrite(&fd, &data[done..], off)?;
            if n == 0 {
                return Err(Errno::EIO);
            }
            done += n;
        }
        let after = fstat(fd.as_raw_fd())?;
        self.grow(bytes_of(&st), bytes_of(&after));
        Ok(attr_of(&after))
    }

    /// Makes (or, unless `exclusive`, opens) the regular file `path`; answers its attributes.
    pub fn create(
        &self,
        path: &str,
        mode: u32,
        owner: (u32, u32),
        exclusive: bool,
        truncate: bool,
    ) -> Result<Attr> {
        let _counted = self.change();
        let (dir, name) = self.parent(path)?;
        let base = OFlag::O_WRONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK;
        let mode = Mode::from_bits_truncate(mode & MODE_BITS);
        match openat(
            Some(dir.as_raw_fd()),
            name.as_c_str(),
            base | OFlag::O_CREAT | OFlag::O_EXCL,
            mode,
        ) {
            Ok(fd) => {
                let fd = owned(fd);
                fchown(
                    fd.as_raw_fd(),
                    Some(Uid::from_raw(owner.0)),
                    Some(Gid::from_raw(owner.1)),
                )?;
                // The umask may have taken bits.
                fchmod(fd.as_raw_fd(), mode)?;
                let st = fstat(fd.as_raw_fd())?;
                self.grow(0, bytes_of(&st));
                self.count_entries(true);
                Ok(attr_of(&st))
            }
            Err(Errno::EEXIST) if !exclusive => {
                let fd = owned(openat(
                    Some(dir.as_raw_fd()),
                    name.as_c_str(),
                    base,
                    Mode::empty(),
                )?);
                let st = fstat(fd.as_raw_fd())?;
                if kind_of(&st) != EntryKind::File {
                    return Err(Errno::EISDIR);
                }
                if truncate && st.st_size > 0 {
                    nix::unistd::ftruncate(&fd, 0)?;
                    let after = fstat(fd.as_raw_fd())?;
                    self.grow(bytes_of(&st), bytes_of(&after));
                    return Ok(attr_of(&after));
                }
                Ok(attr_of(&st))
            }
            Err(e) => Err(e),
        }
    }

    /// Makes the directory `path`.
    pub fn mkdir(&self, path: &str, mode: u32, owner: (u32, u32)) -> Result<Attr> {
        let _counted = self.change();
        let (dir, name) = self.parent(path)?;
        let mode = Mode::from_bits_truncate(mode & MODE_BITS);
        mkdirat(Some(dir.as_raw_fd()), name.as_c_str(), mode)?;
        let fd = owned(openat(
            Some(dir.as_raw_fd()),
            name.as_c_str(),
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?);
        fchown(
            fd.as_raw_fd(),
            Some(Uid::from_raw(owner.0)),
            Some(Gid::from_raw(owner.1)),
        )?;
        fchmod(fd.as_raw_fd(), mode)?;
        let st = fstat(fd.as_raw_fd())?;
        self.grow(0, bytes_of(&st));
        self.count_entries(true);
        Ok(attr_of(&st))
    }

    /// Removes the file or symlink `path` (a directory is `EISDIR`).
    pub fn unlink(&self, path: &str) -> Result<()> {
        let _counted = self.change();
        let (dir, name) = self.parent(path)?;
        let st = Self::lstat_at(&dir, &name)?;
        if kind_of(&st) == EntryKind::Dir {
            return Err(Errno::EISDIR);
        }
        unlinkat(
            Some(dir.as_raw_fd()),
            name.as_c_str(),
            UnlinkatFlags::NoRemoveDir,
        )?;
        // The blocks are free once the last link is gone.
        if st.st_nlink <= 1 {
            self.grow(bytes_of(&st), 0);
        }
        self.count_entries(false);
        Ok(())
    }

    /// Removes the empty directory `path`.
    pub fn rmdir(&self, path: &str) -> Result<()> {
        let _counted = self.change();
        let (dir, name) = self.parent(path)?;
        let st = Self::lstat_at(&dir, &name)?;
        if kind_of(&st) != EntryKind::Dir {
            return Err(Errno::ENOTDIR);
        }
        unlinkat(
            Some(dir.as_raw_fd()),
            name.as_c_str(),
            UnlinkatFlags::RemoveDir,
        )?;
        self.grow(bytes_of(&st), 0);
        self.count_entries(false);
        Ok(())
    }

    /// Removes `path` and, for a directory, everything under it (never the root).
    pub fn remove_all(&self, path: &str) -> Result<()> {
        let _counted = self.change();
        let st = self.stat(path)?;
        if path.is_empty() {
            return Err(Errno::EBUSY);
        }
        if st.kind != EntryKind::Dir {
            return self.unlink(path);
        }
        loop {
            let (page, _) = self.read_dir(path, None)?;
            if page.is_empty() {
                break;
            }
            for e in page {
                self.remove_all(&space_proto::volume::join(path, &e.name))?;
            }
        }
        self.rmdir(path)
    }

    /// Moves `from` to `to` (`renameat2` semantics).
    pub fn rename(&self, from: &str, to: &str, noreplace: bool, exchange: bool) -> Result<()> {
        let _counted = self.change();
        let (fdir, fname) = self.parent(from)?;
        let (tdir, tname) = self.parent(to)?;
        let mut flags = RenameFlags::empty();
        if noreplace {
            flags |= RenameFlags::RENAME_NOREPLACE;
        }
        if exchange {
            flags |= RenameFlags::RENAME_EXCHANGE;
        }
        // A replaced file's blocks are freed with its last link.
        let replaced = if exchange {
            None
        } else {
            Self::lstat_at(&tdir, &tname).ok()
        };
        nix::fcntl::renameat2(
            Some(fdir.as_raw_fd()),
            fname.as_c_str(),
            Some(tdir.as_raw_fd()),
            tname.as_c_str(),
            flags,
        )?;
        if let Some(st) = replaced {
            if st.st_nlink <= 1 || kind_of(&st) == EntryKind::Dir {
                self.grow(bytes_of(&st), 0);
            }
            self.count_entries(false);
        }
        Ok(())
    }

    /// Makes a symlink at `path` holding `target`.
    pub fn symlink(&self, path: &str, target: &str, owner: (u32, u32)) -> Result<Attr> {
        let _counted = self.change();
        if target.is_empty() || target.len() > space_proto::volume::MAX_PATH {
            return Err(Errno::EINVAL);
        }
        let target = nul_free(target)?;
        let (dir, name) = self.parent(path)?;
        symlinkat(target.as_c_str(), Some(dir.as_raw_fd()), name.as_c_str())?;
        fchownat(
            Some(dir.as_raw_fd()),
            name.as_c_str(),
            Some(Uid::from_raw(owner.0)),
            Some(Gid::from_raw(owner.1)),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        )?;
        let st = Self::lstat_at(&dir, &name)?;
        self.grow(0, bytes_of(&st));
        self.count_entries(true);
        Ok(attr_of(&st))
    }

    /// A symlink's text.
    pub fn read_link(&self, path: &str) -> Result<String> {
        let (dir, name) = self.parent(path)?;
        let t = nix::fcntl::readlinkat(Some(dir.as_raw_fd()), name.as_c_str())?;
        String::from_utf8(OsStr::as_bytes(&t).to_vec()).map_err(|_| Errno::EINVAL)
    }

    /// A hard link `to` of `from` (not a directory).
    pub fn link(&self, from: &str, to: &str) -> Result<Attr> {
        let _counted = self.change();
        let (fdir, fname) = self.parent(from)?;
        let (tdir, tname) = self.parent(to)?;
        linkat(
            Some(fdir.as_raw_fd()),
            fname.as_c_str(),
            Some(tdir.as_raw_fd()),
            tname.as_c_str(),
            nix::fcntl::AtFlags::empty(),
        )?;
        self.count_entries(true);
        Self::lstat_at(&tdir, &tname).map(|s| attr_of(&s))
    }

    /// Changes what `change` gives of `path`; a symlink's times and owner only.
    pub fn set_attr(&self, path: &str, change: Change) -> Result<Attr> {
        let _counted = self.change();
        let current = self.stat(path)?;
        if current.kind == EntryKind::Symlink {
            let (dir, name) = self.parent(path)?;
            if change.mode.is_some() || change.size.is_some() {
                return Err(Errno::EPERM);
            }
            if change.uid.is_some() || change.gid.is_some() {
                fchownat(
                    Some(dir.as_raw_fd()),
                    name.as_c_str(),
                    change.uid.map(Uid::from_raw),
                    change.gid.map(Gid::from_raw),
                    nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
                )?;
            }
            if change.atime_ns.is_some() || change.mtime_ns.is_some() {
                nix::sys::stat::utimensat(
                    Some(dir.as_raw_fd()),
                    name.as_c_str(),
                    &timespec(change.atime_ns),
                    &timespec(change.mtime_ns),
                    nix::sys::stat::UtimensatFlags::NoFollowSymlink,
                )?;
            }
            return Self::lstat_at(&dir, &name).map(|s| attr_of(&s));
        }
        let flags = match (current.kind, change.size) {
            (EntryKind::Dir, Some(_)) => return Err(Errno::EISDIR),
            (EntryKind::File, Some(_)) => OFlag::O_WRONLY,
            (EntryKind::Dir, None) => OFlag::O_RDONLY | OFlag::O_DIRECTORY,
            (EntryKind::File, None) => OFlag::O_RDONLY,
            _ => return Err(Errno::EPERM),
        };
        let fd = self.open_entry(path, flags)?;
        let before = fstat(fd.as_raw_fd())?;
        if let Some(size) = change.size {
            let len = i64::try_from(size).map_err(|_| Errno::EFBIG)?;
            // Growing a file is sparse: no blocks until written.
            nix::unistd::ftruncate(&fd, len)?;
        }
        if change.uid.is_some() || change.gid.is_some() {
            fchown(
                fd.as_raw_fd(),
                change.uid.map(Uid::from_raw),
                change.gid.map(Gid::from_raw),
            )?;
        }
        if let Some(mode) = change.mode {
            fchmod(fd.as_raw_fd(), Mode::from_bits_truncate(mode & MODE_BITS))?;
        }
        if change.atime_ns.is_some() || change.mtime_ns.is_some() {
            futimens(
                fd.as_raw_fd(),
                &timespec(change.atime_ns),
                &timespec(change.mtime_ns),
            )?;
        }
        let after = fstat(fd.as_raw_fd())?;
        self.grow(bytes_of(&before), bytes_of(&after));
        Ok(attr_of(&after))
    }

    /// Flushes `path`'s data and metadata to disk.
    pub fn fsync(&self, path: &str) -> Result<()> {
        let st = self.stat(path)?;
        let flags = match st.kind {
            EntryKind::Dir => OFlag::O_RDONLY | OFlag::O_DIRECTORY,
            EntryKind::File => OFlag::O_RDONLY,
            _ => return Ok(()),
        };
        let fd = self.open_entry(path, flags)?;
        nix::unistd::fsync(fd.as_raw_fd())
    }
}
