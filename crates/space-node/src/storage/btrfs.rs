//! The btrfs driver: volumes are subvolumes, snapshots are subvolume snapshots, file clones
//! are reflinks. Every operation is one or two ioctls and costs metadata only, whatever the
//! size of the data: this is the driver the create hot path is budgeted for.
//!
//! It talks to the kernel directly (`linux/btrfs.h`), with no `btrfs` command in the path:
//!
//! - create: `BTRFS_IOC_SUBVOL_CREATE` on the parent directory, with the new name;
//! - snapshot: `BTRFS_IOC_SNAP_CREATE_V2` on the destination's parent, with the source
//!   subvolume's descriptor and `BTRFS_SUBVOL_RDONLY` for read-only snapshots;
//! - delete: `BTRFS_IOC_SNAP_DESTROY` on the parent (the kernel drops the whole tree; the
//!   space is reclaimed in the background by the cleaner thread);
//! - read-only: `BTRFS_IOC_SUBVOL_GETFLAGS` / `BTRFS_IOC_SUBVOL_SETFLAGS`.
//!
//! A directory that is not a subvolume (made by hand, or by an older layout) still works: it
//! is snapshotted with a reflink walk, made read-only with permission bits, deleted
//! recursively — the rules of `tree.rs`.
//!
//! Permissions: all of this works for root, which also deletes read-only snapshots directly.
//! Without `CAP_SYS_ADMIN` the kernel refuses to delete any subvolume unless the filesystem is
//! mounted with `user_subvol_rm_allowed`, and even then refuses a read-only one (`EROFS`)
//! until its owner clears the flag, which [`delete_subvolume`] does.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use nix::errno::Errno;

use super::{io_err, tree, CloneMethod, DriverKind, Result, Storage, StorageError};

/// `BTRFS_SUPER_MAGIC`: `statfs` reports it as `f_type` for btrfs.
pub const BTRFS_SUPER_MAGIC: i64 = 0x9123_683e;
/// The inode number of every subvolume's root directory (`BTRFS_FIRST_FREE_OBJECTID`).
pub const SUBVOLUME_ROOT_INO: u64 = 256;
/// Longest subvolume name the kernel accepts (`BTRFS_VOL_NAME_MAX`).
pub const VOL_NAME_MAX: usize = 255;
/// Size of the name field of `btrfs_ioctl_vol_args`, less the terminating NUL.
const PATH_NAME_MAX: usize = 4087;
/// Size of the name field of `btrfs_ioctl_vol_args_v2`, less the terminating NUL.
const SUBVOL_NAME_MAX: usize = 4039;
/// `BTRFS_SUBVOL_RDONLY`: in snapshot-create flags and in the subvolume flags.
const SUBVOL_RDONLY: u64 = 1 << 1;

/// `struct btrfs_ioctl_vol_args`: a descriptor and a NUL-terminated name; 4 KiB in all.
#[repr(C)]
struct VolArgs {
    fd: i64,
    name: [u8; PATH_NAME_MAX + 1],
}

/// `struct btrfs_ioctl_vol_args_v2`, without the unions' alternatives this driver never sets
/// (quota-group inheritance, subvolume or device ids): `unused` stands for the first union,
/// `name` for the second. 4 KiB in all.
#[repr(C)]
struct VolArgsV2 {
    fd: i64,
    transid: u64,
    flags: u64,
    unused: [u64; 4],
    name: [u8; SUBVOL_NAME_MAX + 1],
}

const _: () = assert!(std::mem::size_of::<VolArgs>() == 4096);
const _: () = assert!(std::mem::size_of::<VolArgsV2>() == 4096);

nix::ioctl_write_ptr!(ioc_subvol_create, 0x94, 14, VolArgs);
nix::ioctl_write_ptr!(ioc_snap_destroy, 0x94, 15, VolArgs);
nix::ioctl_write_ptr!(ioc_snap_create_v2, 0x94, 23, VolArgsV2);
nix::ioctl_read!(ioc_subvol_getflags, 0x94, 25, u64);
nix::ioctl_write_ptr!(ioc_subvol_setflags, 0x94, 26, u64);

/// Copies `name` into a NUL-terminated ioctl name field, refusing what the kernel would refuse
/// less clearly: names longer than [`VOL_NAME_MAX`], names with `/` or NUL, `.` and `..`.
fn fill_name(field: &mut [u8], name: &std::ffi::OsStr, path: &Path) -> Result<()> {
    let bytes = name.as_bytes();
    let bad = |why: &str| {
        Err(StorageError::Invalid(format!(
            "{}: not a valid subvolume name: {why}",
            path.display()
        )))
    };
    if bytes.len() > VOL_NAME_MAX || bytes.len() >= field.len() {
        return bad(&format!(
            "{} bytes, the limit is {VOL_NAME_MAX}",
            bytes.len()
        ));
    }
    if bytes.is_empty() || bytes == b"." || bytes == b".." {
        return bad("empty, '.' or '..'");
    }
    if bytes.contains(&b'/') || bytes.contains(&0) {
        return bad("contains '/' or NUL");
    }
    field[..bytes.len()].copy_from_slice(bytes);
    field[bytes.len()] = 0;
    Ok(())
}

fn open_dir(path: &Path) -> Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY)
        .open(path)
        .map_err(io_err("opening", path))
}

/// Whether `path` is on a btrfs filesystem.
pub fn is_btrfs(path: &Path) -> Result<bool> {
    let st = nix::sys::statfs::statfs(path).map_err(|e| io_err("statfs", path)(e.into()))?;
    Ok(st.filesystem_type().0 as i64 == BTRFS_SUPER_MAGIC)
}

/// Whether `path` is the root of a btrfs subvolume (a directory with inode 256 on btrfs).
pub fn is_subvolume(path: &Path) -> Result<bool> {
    let m = std::fs::symlink_metadata(path).map_err(io_err("reading", path))?;
    Ok(m.is_dir() && m.ino() == SUBVOLUME_ROOT_INO && is_btrfs(path)?)
}

/// Creates the empty subvolume `path`; its parent must exist on btrfs.
pub fn create_subvolume(path: &Path) -> Result<()> {
    let (parent, name) = tree::split(path)?;
    let mut args = VolArgs {
        fd: 0,
        name: [0; PATH_NAME_MAX + 1],
    };
    fill_name(&mut args.name, name, path)?;
    let dir = open_dir(parent)?;
    // SAFETY: `dir` is an open directory for the call; `args` is a live, initialised
    // `btrfs_ioctl_vol_args` (checked to be 4096 bytes) with a NUL-terminated name, which the
    // kernel only reads.
    match unsafe { ioc_subvol_create(dir.as_raw_fd(), &args) } {
        Ok(_) => Ok(()),
        Err(Errno::EEXIST) => Err(exists(path)),
        Err(e) => Err(io_err("creating subvolume", path)(e.into())),
    }
}

fn exists(path: &Path) -> StorageError {
    StorageError::Invalid(format!("{} already exists", path.display()))
}

/// Snapshots the subvolume `src` as the new subvolume `dst`, read-only if asked. Atomic: the
/// snapshot is a point-in-time copy of everything written to `src` before the call.
pub fn snapshot_subvolume(src: &Path, dst: &Path, readonly: bool) -> Result<()> {
    let (parent, name) = tree::split(dst)?;
    let mut args = VolArgsV2 {
        fd: 0,
        transid: 0,
        flags: if readonly { SUBVOL_RDONLY } else { 0 },
        unused: [0; 4],
        name: [0; SUBVOL_NAME_MAX + 1],
    };
    fill_name(&mut args.name, name, dst)?;
    let source = open_dir(src)?;
    args.fd = i64::from(source.as_raw_fd());
    let dir = open_dir(parent)?;
    // SAFETY: `dir` and `source` are open directories for the call; `args` is a live,
    // initialised `btrfs_ioctl_vol_args_v2` (4096 bytes) whose `fd` is `source`'s descriptor,
    // with only flags the kernel accepts for snapshots and a NUL-terminated name; the kernel
    // only reads it.
    match unsafe { ioc_snap_create_v2(dir.as_raw_fd(), &args) } {
        Ok(_) => Ok(()),
        Err(Errno::EEXIST) => Err(exists(dst)),
        Err(Errno::EXDEV) => Err(StorageError::Invalid(format!(
            "cannot snapshot {} into {}: different filesystems",
            src.display(),
            dst.display()
        ))),
        Err(e) => Err(io_err("snapshotting into", dst)(e.into())),
    }
}

/// Deletes the subvolume `path` and everything in it, read-only or not.
///
/// Root deletes a read-only subvolume directly. Without `CAP_SYS_ADMIN` (and with the
/// filesystem mounted `user_subvol_rm_allowed`) the kernel answers `EROFS` for a read-only
/// one; its owner can clear the flag and then delete it, which is what happens here.
pub fn delete_subvolume(path: &Path) -> Result<()> {
    match destroy(path) {
        Err(StorageError::Io { source, .. })
            if source.raw_os_error() == Some(libc::EROFS) && is_readonly(path)? =>
        {
            set_subvolume_readonly(path, false)?;
            destroy(path)
        }
        other => other,
    }
}

fn destroy(path: &Path) -> Result<()> {
    let (parent, name) = tree::split(path)?;
    let mut args = VolArgs {
        fd: 0,
        name: [0; PATH_NAME_MAX + 1],
    };
    fill_name(&mut args.name, name, path)?;
    let dir = open_dir(parent)?;
    // SAFETY: `dir` is an open directory for the call; `args` is a live, initialised
    // `btrfs_ioctl_vol_args` with a NUL-terminated name, which the kernel only reads.
    match unsafe { ioc_snap_destroy(dir.as_raw_fd(), &args) } {
        Ok(_) => Ok(()),
        Err(Errno::ENOENT) => Ok(()),
        Err(Errno::ENOTEMPTY) => Err(StorageError::Invalid(format!(
            "{} holds other subvolumes: delete them first",
            path.display()
        ))),
        Err(e) => Err(io_err("deleting subvolume", path)(e.into())),
    }
}

fn subvolume_flags(dir: &File, path: &Path) -> Result<u64> {
    let mut flags = 0u64;
    // SAFETY: `dir` is open for the call and `flags` is a live `u64`, the size the ioctl
    // writes.
    unsafe { ioc_subvol_getflags(dir.as_raw_fd(), &mut flags) }
        .map_err(|e| io_err("reading subvolume flags of", path)(e.into()))?;
    Ok(flags)
}

/// Whether the subvolume `path` is read-only.
pub fn is_readonly(path: &Path) -> Result<bool> {
    let dir = open_dir(path)?;
    Ok(subvolume_flags(&dir, path)? & SUBVOL_RDONLY != 0)
}

/// Makes the subvolume `path` read-only or writable again. Idempotent.
pub fn set_subvolume_readonly(path: &Path, readonly: bool) -> Result<()> {
    let dir = open_dir(path)?;
    let flags = subvolume_flags(&dir, path)?;
    let wanted = if readonly {
        flags | SUBVOL_RDONLY
    } else {
        flags & !SUBVOL_RDONLY
    };
    if wanted == flags {
        return Ok(());
    }
    // SAFETY: `dir` is open for the call; `wanted` is a live `u64` the kernel only reads.
    unsafe { ioc_subvol_setflags(dir.as_raw_fd(), &wanted) }
        .map_err(|e| io_err("setting subvolume flags of", path)(e.into()))?;
    Ok(())
}

/// Subvolumes for volumes, snapshots for snapshots, reflinks for files.
#[derive(Debug, Default)]
pub struct BtrfsStorage(());

impl BtrfsStorage {
    /// The btrfs driver. It does not check the filesystem: [`super::open`] does.
    pub fn new() -> Self {
        Self(())
    }
}

/// A reflink, or a sparse copy when `src` is on another filesystem.
fn clone_any(src: &Path, dst: &Path) -> Result<CloneMethod> {
    Ok(space_runtime::cow::clone_file(src, dst)?)
}

impl Storage for BtrfsStorage {
    fn kind(&self) -> DriverKind {
        DriverKind::Btrfs
    }

    fn create_volume(&self, path: &Path) -> Result<()> {
        create_subvolume(path)
    }

    fn snapshot_volume(&self, src: &Path, dst: &Path, readonly: bool) -> Result<()> {
        if is_subvolume(src)? {
            return snapshot_subvolume(src, dst, readonly);
        }
        tracing::debug!(
            src = %src.display(),
            "not a subvolume: snapshotting it file by file"
        );
        tree::snapshot_tree(src, dst, readonly, &|s, d| clone_any(s, d).map(drop))
    }

    fn delete_volume(&self, path: &Path) -> Result<()> {
        match std::fs::symlink_metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io_err("reading", path)(e)),
            Ok(_) => {}
        }
        if is_subvolume(path)? {
            delete_subvolume(path)
        } else {
            tree::remove_tree(path)
        }
    }

    fn clone_file(&self, src: &Path, dst: &Path) -> Result<CloneMethod> {
        clone_any(src, dst)
    }

    fn set_readonly(&self, path: &Path) -> Result<()> {
        if is_subvolume(path)? {
            set_subvolume_readonly(path, true)
        } else {
            tree::make_readonly(path)
        }
    }
}
