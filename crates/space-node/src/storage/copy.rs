//! The copy driver: volumes are plain directories and every clone copies bytes.
//!
//! It works on any filesystem and is correct, but a snapshot costs time and space in
//! proportion to the data (holes excepted: files are copied extent by extent with
//! `SEEK_DATA`/`SEEK_HOLE`, so a mostly empty disk or RAM image stays mostly empty). It exists
//! so `space` runs anywhere; creating a sandbox or taking a snapshot on it is far from the
//! milliseconds of the hot path, which is why it announces itself with a warning.

use std::path::Path;

use super::{tree, CloneMethod, DriverKind, Result, Storage};

/// Copies bytes (sparse-aware) for every clone and snapshot.
#[derive(Debug, Default)]
pub struct CopyStorage(());

impl CopyStorage {
    /// The copy driver for the data directory `data` (named in the warning it logs).
    pub fn new(data: &Path) -> Self {
        tracing::warn!(
            data = %data.display(),
            "storage driver 'copy': the filesystem has no copy-on-write (neither btrfs nor \
             FICLONE reflinks), so every sandbox create and snapshot copies its files byte \
             by byte; expect seconds instead of milliseconds and full disk usage per copy. \
             Put the data directory on btrfs (or XFS with reflink=1), or run as root to let \
             space mount a loop-backed btrfs image over it"
        );
        Self(())
    }
}

/// Sparse-aware copy (a reflink when the filesystem happens to allow one).
fn copy_file(src: &Path, dst: &Path) -> Result<CloneMethod> {
    Ok(space_runtime::cow::clone_file(src, dst)?)
}

impl Storage for CopyStorage {
    fn kind(&self) -> DriverKind {
        DriverKind::Copy
    }

    fn create_volume(&self, path: &Path) -> Result<()> {
        tree::create_dir_volume(path)
    }

    fn snapshot_volume(&self, src: &Path, dst: &Path, readonly: bool) -> Result<()> {
        tree::snapshot_tree(src, dst, readonly, &|s, d| copy_file(s, d).map(drop))
    }

    fn delete_volume(&self, path: &Path) -> Result<()> {
        tree::remove_tree(path)
    }

    fn clone_file(&self, src: &Path, dst: &Path) -> Result<CloneMethod> {
        copy_file(src, dst)
    }

    fn set_readonly(&self, path: &Path) -> Result<()> {
        tree::make_readonly(path)
    }
}
