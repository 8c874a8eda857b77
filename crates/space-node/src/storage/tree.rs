//! Directory trees as volumes, for the drivers without subvolumes (reflink and copy), and for
//! plain directories the btrfs driver meets.
//!
//! A snapshot is a walk that recreates directories and symlinks and clones each regular file
//! with the driver's file clone. What a copy keeps: contents, holes (copy) or shared extents
//! (reflink), permission bits, and ownership when the process is root (the jailed VMM runs as
//! an unprivileged user that must still own its files in a clone). What it drops: sockets,
//! FIFOs and device nodes (a sandbox directory holds the VMM's Unix sockets, which are
//! meaningless without the process listening on them and are recreated on start), hard links
//! (each link becomes its own file), timestamps and extended attributes.
//!
//! The walk fills a hidden sibling (`.<name>.partial-…`) and renames it into place with
//! `RENAME_NOREPLACE`, so `dst` either does not exist or is complete, even after a crash; a
//! leftover hidden sibling is garbage that [`remove_tree`] can delete.
//!
//! Read-only means the write bits cleared everywhere and, when the process is root (which
//! permission bits do not stop), the inode's immutable attribute (`FS_IMMUTABLE_FL`, what
//! `chattr +i` sets) on every directory and file, where the filesystem supports it. Deleting
//! such a tree first gives back what it needs: the immutable attribute and the owner's write
//! bit on directories.

use std::ffi::CString;
use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::errno::Errno;

use super::{io_err, Result, StorageError};

/// The inode attribute that makes a file or directory unchangeable, even by root.
const FS_IMMUTABLE_FL: libc::c_long = 0x10;

// `FS_IOC_GETFLAGS`/`FS_IOC_SETFLAGS` are declared with a `long` argument but the kernel reads
// and writes an `int` through the pointer: passing a zeroed `long` serves both (little endian).
nix::ioctl_read!(fs_ioc_getflags, b'f', 1, libc::c_long);
nix::ioctl_write_ptr!(fs_ioc_setflags, b'f', 2, libc::c_long);

/// Whether the process runs as root: ownership is kept in copies and read-only trees are made
/// immutable.
pub(super) fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// The file clone a driver uses inside a tree walk: creates the new file `dst` from `src`.
pub(super) type CloneFn<'a> = &'a dyn Fn(&Path, &Path) -> Result<()>;

/// Creates the volume `path` as a plain directory.
pub(super) fn create_dir_volume(path: &Path) -> Result<()> {
    fs::create_dir(path).map_err(io_err("creating", path))
}

/// Makes `dst` a copy of the directory tree `src` (see the module docs for what is kept).
pub(super) fn snapshot_tree(src: &Path, dst: &Path, readonly: bool, clone: CloneFn) -> Result<()> {
    let meta = fs::metadata(src).map_err(io_err("reading", src))?;
    if !meta.is_dir() {
        return Err(StorageError::Invalid(format!(
            "{} is not a directory",
            src.display()
        )));
    }
    if fs::symlink_metadata(dst).is_ok() {
        return Err(StorageError::Invalid(format!(
            "{} already exists",
            dst.display()
        )));
    }
    let partial = partial_sibling(dst)?;
    // A writable copy of a read-only tree must be writable: give the owner's write bit back.
    let ctx = Walk {
        clone,
        add_owner_write: !readonly && meta.mode() & 0o200 == 0,
        chown: is_root(),
    };
    let result = fs::create_dir(&partial)
        .map_err(io_err("creating", &partial))
        .and_then(|()| ctx.copy_dir(src, &partial, &meta))
        .and_then(|()| rename_noreplace(&partial, dst));
    if let Err(e) = result {
        let _ = remove_tree(&partial);
        return Err(e);
    }
    if readonly {
        if let Err(e) = make_readonly(dst) {
            let _ = remove_tree(dst);
            return Err(e);
        }
    }
    Ok(())
}

/// A hidden, unique name next to `dst` to build it under.
fn partial_sibling(dst: &Path) -> Result<PathBuf> {
    let (parent, name) = split(dst)?;
    let tag: u32 = rand::random();
    let mut hidden = std::ffi::OsString::from(".");
    hidden.push(name);
    hidden.push(format!(".partial-{}-{tag:08x}", std::process::id()));
    Ok(parent.join(hidden))
}

/// The parent directory and last component of a volume path.
pub(super) fn split(path: &Path) -> Result<(&Path, &std::ffi::OsStr)> {
    match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) => {
            let parent = if parent.as_os_str().is_empty() {
                Path::new(".")
            } else {
                parent
            };
            Ok((parent, name))
        }
        _ => Err(StorageError::Invalid(format!(
            "{} has no parent directory or no name",
            path.display()
        ))),
    }
}

fn cstring(path: &Path) -> Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| StorageError::Invalid(format!("{} contains a NUL byte", path.display())))
}

/// Renames `from` to `to`, failing if `to` exists (a plain rename would replace an empty
/// directory).
fn rename_noreplace(from: &Path, to: &Path) -> Result<()> {
    let (a, b) = (cstring(from)?, cstring(to)?);
    // SAFETY: both pointers are NUL-terminated strings owned by `a` and `b`, alive for the
    // call; AT_FDCWD makes them ordinary paths.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    match Errno::last() {
        Errno::EEXIST => Err(StorageError::Invalid(format!(
            "{} already exists",
            to.display()
        ))),
        e => Err(io_err("renaming into", to)(e.into())),
    }
}

struct Walk<'a> {
    clone: CloneFn<'a>,
    add_owner_write: bool,
    chown: bool,
}

impl Walk<'_> {
    /// Fills the existing directory `dst` from `src`, then gives `dst` the mode and owner of
    /// `src` (last, so a read-only source directory does not stop the filling).
    fn copy_dir(&self, src: &Path, dst: &Path, meta: &fs::Metadata) -> Result<()> {
        for entry in fs::read_dir(src).map_err(io_err("listing", src))? {
            let entry = entry.map_err(io_err("listing", src))?;
            let from = entry.path();
            let to = dst.join(entry.file_name());
            let m = fs::symlink_metadata(&from).map_err(io_err("reading", &from))?;
            let ft = m.file_type();
            if ft.is_dir() {
                fs::create_dir(&to).map_err(io_err("creating", &to))?;
                self.copy_dir(&from, &to, &m)?;
            } else if ft.is_file() {
                (self.clone)(&from, &to)?;
                self.finish(&to, &m)?;
            } else if ft.is_symlink() {
                let target = fs::read_link(&from).map_err(io_err("reading", &from))?;
                std::os::unix::fs::symlink(&target, &to).map_err(io_err("creating", &to))?;
                if self.chown {
                    std::os::unix::fs::lchown(&to, Some(m.uid()), Some(m.gid()))
                        .map_err(io_err("chown", &to))?;
                }
            } else {
                tracing::debug!(path = %from.display(), "not copied: socket, FIFO or device");
            }
        }
        self.finish(dst, meta)
    }

    /// Gives a copied file or directory the owner and permission bits of its source. Owner
    /// first: changing it clears set-user-ID bits.
    fn finish(&self, path: &Path, meta: &fs::Metadata) -> Result<()> {
        if self.chown {
            std::os::unix::fs::lchown(path, Some(meta.uid()), Some(meta.gid()))
                .map_err(io_err("chown", path))?;
        }
        let mut mode = meta.mode() & 0o7777;
        if self.add_owner_write {
            mode |= 0o200;
        }
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(io_err("chmod", path))
    }
}

/// Makes the tree at `path` read-only: write bits off and, as root, the immutable attribute
/// (see the module docs). Children first, so the directories are still open to changes while
/// their entries are done. Idempotent.
pub(super) fn make_readonly(path: &Path) -> Result<()> {
    let immutable = is_root();
    readonly_walk(path, immutable)
}

fn readonly_walk(path: &Path, immutable: bool) -> Result<()> {
    let m = fs::symlink_metadata(path).map_err(io_err("reading", path))?;
    let ft = m.file_type();
    if ft.is_dir() {
        for entry in fs::read_dir(path).map_err(io_err("listing", path))? {
            let entry = entry.map_err(io_err("listing", path))?;
            readonly_walk(&entry.path(), immutable)?;
        }
    } else if !ft.is_file() {
        // Symlinks have no permission bits of their own; sockets and FIFOs are left alone.
        return Ok(());
    }
    let mode = m.mode() & 0o7777;
    if mode & 0o222 != 0 {
        fs::set_permissions(path, fs::Permissions::from_mode(mode & !0o222))
            .map_err(io_err("chmod", path))?;
    }
    if immutable {
        set_immutable(path, true)?;
    }
    Ok(())
}

/// Sets or clears the immutable attribute of a file or directory. Filesystems without inode
/// attributes are skipped: the permission bits are then all there is.
fn set_immutable(path: &Path, on: bool) -> Result<()> {
    let file = match fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => f,
        Err(e) => return Err(io_err("opening", path)(e)),
    };
    let mut flags: libc::c_long = 0;
    // SAFETY: the descriptor is open for the call and `flags` is a live, writable `long`, at
    // least as large as the `int` the kernel stores.
    match unsafe { fs_ioc_getflags(file.as_raw_fd(), &mut flags) } {
        Ok(_) => {}
        Err(Errno::ENOTTY | Errno::EOPNOTSUPP | Errno::EINVAL) => return Ok(()),
        Err(e) => return Err(io_err("reading attributes of", path)(e.into())),
    }
    let wanted = if on {
        flags | FS_IMMUTABLE_FL
    } else {
        flags & !FS_IMMUTABLE_FL
    };
    if wanted == flags {
        return Ok(());
    }
    // SAFETY: as above; the kernel only reads `wanted`, which outlives the call.
    match unsafe { fs_ioc_setflags(file.as_raw_fd(), &wanted) } {
        Ok(_) => Ok(()),
        Err(Errno::ENOTTY | Errno::EOPNOTSUPP) => Ok(()),
        Err(e) => Err(io_err("setting attributes of", path)(e.into())),
    }
}

/// Deletes the tree at `path`; a missing path is success. A read-only tree is first made
/// deletable (immutable attribute off everywhere, owner write bit on directories).
pub(super) fn remove_tree(path: &Path) -> Result<()> {
    match fs::remove_dir_all(path) {
        Ok(()) => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {}
        Err(e) => return Err(io_err("deleting", path)(e)),
    }
    unlock_walk(path)?;
    match fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_err("deleting", path)(e)),
    }
}

fn unlock_walk(path: &Path) -> Result<()> {
    let m = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_err("reading", path)(e)),
    };
    let ft = m.file_type();
    if !(ft.is_dir() || ft.is_file()) {
        return Ok(());
    }
    if is_root() {
        set_immutable(path, false)?;
    }
    if ft.is_dir() {
        let mode = m.mode() & 0o7777;
        if mode & 0o700 != 0o700 {
            fs::set_permissions(path, fs::Permissions::from_mode(mode | 0o700))
                .map_err(io_err("chmod", path))?;
        }
        for entry in fs::read_dir(path).map_err(io_err("listing", path))? {
            let entry = entry.map_err(io_err("listing", path))?;
            unlock_walk(&entry.path())?;
        }
    }
    Ok(())
}
