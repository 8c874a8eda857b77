//! The reflink driver, for filesystems that clone files (`FICLONE`) but have no subvolumes:
//! XFS formatted with `reflink=1`, and others that grow the ioctl.
//!
//! Volumes are plain directories and a snapshot is a walk that reflinks every regular file
//! (see the tree rules in the module docs of `tree.rs`: sockets and FIFOs are skipped,
//! permission bits kept). A snapshot costs a few syscalls per file and no data. A file that
//! cannot be reflinked is an error, never a silent byte copy: a volume that quietly costs
//! gigabytes is worse than a clear failure, and the copy driver exists for filesystems that
//! cannot clone.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use nix::errno::Errno;

use super::{io_err, tree, CloneMethod, DriverKind, Result, Storage};

// FICLONE is `_IOW(0x94, 9, int)`: the source descriptor travels as the integer argument.
nix::ioctl_write_int!(ficlone, 0x94, 9);

/// Creates the new file `dst` (mode 0600) sharing all of `src`'s extents. Fails, leaving no
/// `dst` behind, when the filesystem cannot clone (`EOPNOTSUPP`, `EXDEV` across filesystems).
pub fn reflink_file(src: &Path, dst: &Path) -> Result<()> {
    let source = File::open(src).map_err(io_err("opening", src))?;
    let target = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(dst)
        .map_err(io_err("creating", dst))?;
    // SAFETY: both descriptors belong to `File`s alive across the call; FICLONE reads the
    // source descriptor from the integer argument and touches no user memory.
    let result = unsafe { ficlone(target.as_raw_fd(), source.as_raw_fd() as libc::c_ulong) };
    match result {
        Ok(_) => Ok(()),
        Err(e) => {
            drop(target);
            let _ = std::fs::remove_file(dst);
            Err(io_err("reflinking into", dst)(e.into()))
        }
    }
}

/// Whether files in `dir` can be reflinked: clones a small probe file and removes both. Only
/// "not supported" answers mean no; any other failure (permissions, a full disk) is an error,
/// so a broken data directory is not mistaken for one that needs the copy driver.
pub fn probe(dir: &Path) -> Result<bool> {
    let tag = format!(
        ".reflink-probe-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    );
    let src = dir.join(&tag);
    let dst = dir.join(format!("{tag}.clone"));
    let result = (|| {
        std::fs::write(&src, [0x5a; 4096]).map_err(io_err("writing", &src))?;
        match reflink_file(&src, &dst) {
            Ok(()) => Ok(true),
            Err(super::StorageError::Io { source, .. })
                if matches!(
                    source.raw_os_error().map(Errno::from_raw),
                    Some(
                        Errno::EOPNOTSUPP
                            | Errno::ENOTTY
                            | Errno::EINVAL
                            | Errno::EXDEV
                            | Errno::ENOSYS
                    )
                ) =>
            {
                Ok(false)
            }
            Err(e) => Err(e),
        }
    })();
    let _ = std::fs::remove_file(&dst);
    let _ = std::fs::remove_file(&src);
    result
}

/// Reflinks every file of a snapshot; refuses filesystems that cannot.
#[derive(Debug, Default)]
pub struct ReflinkStorage(());

impl ReflinkStorage {
    /// The reflink driver. It does not probe: [`super::open`] does, once per data directory.
    pub fn new() -> Self {
        Self(())
    }
}

impl Storage for ReflinkStorage {
    fn kind(&self) -> DriverKind {
        DriverKind::Reflink
    }

    fn create_volume(&self, path: &Path) -> Result<()> {
        tree::create_dir_volume(path)
    }

    fn snapshot_volume(&self, src: &Path, dst: &Path, readonly: bool) -> Result<()> {
        tree::snapshot_tree(src, dst, readonly, &reflink_file)
    }

    fn delete_volume(&self, path: &Path) -> Result<()> {
        tree::remove_tree(path)
    }

    fn clone_file(&self, src: &Path, dst: &Path) -> Result<CloneMethod> {
        reflink_file(src, dst)?;
        Ok(CloneMethod::Reflink)
    }

    fn set_readonly(&self, path: &Path) -> Result<()> {
        tree::make_readonly(path)
    }
}
