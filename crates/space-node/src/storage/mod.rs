//! The node's data directory and the copy-on-write operations everything else is built on.
//!
//! Layout (see DESIGN.md, "Storage"):
//!
//! ```text
//! <data>/templates/<name>/<version>/   read-only once built: rootfs.ext4, snapshot/, manifest
//! <data>/sandboxes/<id>/               the sandbox directory (the VM's working directory)
//! <data>/snapshots/<id>/<time>/        read-only: a disk snapshot, plus mem/state for full ones
//! ```
//!
//! A [`Storage`] driver turns "make this directory a cheap copy of that one" into the best the
//! filesystem offers: btrfs subvolume snapshots and reflinks ([`btrfs`]), reflinks alone on XFS
//! ([`reflink`]), or plain copies anywhere else ([`copy`], correct but slow, and it says so).
//! Every operation is synchronous (ioctls and file copies); async callers wrap them in
//! `spawn_blocking`.
//!
//! [`open`] prepares a data directory: it creates it, mounts a loop-backed btrfs image over it
//! when the host filesystem has no copy-on-write and the process may do so ([`loopback`]),
//! picks the best driver, and creates the layout. [`Layout`] turns names into paths and is the
//! one place that checks that a name is safe to use as a path component.

use std::path::{Path, PathBuf};
use std::sync::Arc;

pub mod btrfs;
pub mod copy;
pub mod loopback;
pub mod reflink;
mod tree;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod testutil;

/// Which driver serves a data directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DriverKind {
    /// Subvolumes and reflinks: every clone and snapshot is O(metadata).
    Btrfs,
    /// Reflinks per file (XFS with reflink=1): clones cost per file, not per byte.
    Reflink,
    /// Byte copies (holes preserved): slow, for filesystems without copy-on-write.
    Copy,
}

/// How a file was cloned (reported for benchmarks and logs).
pub use space_runtime::CloneMethod;

/// Errors of storage operations.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// A filesystem call failed on `path`.
    #[error("{op} {path}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The request cannot be honoured (destination exists, source missing, not a volume...).
    #[error("{0}")]
    Invalid(String),
    /// Preparing the data directory (mkfs, loop device, mount) failed.
    #[error("setting up {path}: {message}")]
    Setup {
        /// The data directory or image involved.
        path: PathBuf,
        /// What went wrong, including the failing command's output.
        message: String,
    },
}

/// Shorthand for storage results.
pub type Result<T, E = StorageError> = std::result::Result<T, E>;

/// A copy-on-write driver for directories ("volumes") and files under one data directory.
///
/// A *volume* is a directory the driver can snapshot as a whole: a btrfs subvolume, or a plain
/// directory for the other drivers. Volumes may not nest inside other volumes that get
/// snapshotted (btrfs snapshots do not descend into nested subvolumes).
pub trait Storage: Send + Sync + 'static {
    /// The driver's kind.
    fn kind(&self) -> DriverKind;

    /// Creates an empty volume at `path` (its parent must exist; `path` must not).
    fn create_volume(&self, path: &Path) -> Result<()>;

    /// Makes `dst` (which must not exist) a copy of the volume `src` as of now; `readonly`
    /// makes the copy immutable (btrfs read-only snapshot; read-only permission bits
    /// otherwise). Files being written during the call may be captured mid-write: callers
    /// quiesce writers (pause the VM) first.
    fn snapshot_volume(&self, src: &Path, dst: &Path, readonly: bool) -> Result<()>;

    /// Deletes a volume and everything in it (read-only snapshots included). Deleting a
    /// missing path is not an error, so cleanup can be retried after a crash. Use this rather
    /// than `remove_dir_all`: read-only volumes of the reflink and copy drivers carry the
    /// immutable attribute when made by root, which only this lifts.
    fn delete_volume(&self, path: &Path) -> Result<()>;

    /// Clones the file `src` into the new file `dst` (which must not exist), created with mode
    /// 0600 and owned by the caller, who sets what the file needs. On btrfs and reflink
    /// this shares extents and costs no data, and it is the cheapest way to fill a new volume
    /// from a template: a subvolume snapshot commits a transaction, a clone does not.
    fn clone_file(&self, src: &Path, dst: &Path) -> Result<CloneMethod>;

    /// Makes a volume read-only (templates once built). Idempotent.
    fn set_readonly(&self, path: &Path) -> Result<()>;
}

/// Builds the `map_err` closure that turns an I/O error on `path` into [`StorageError::Io`].
pub(crate) fn io_err<'a>(
    op: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> StorageError + 'a {
    move |source| StorageError::Io {
        op,
        path: path.to_owned(),
        source,
    }
}

impl From<space_runtime::cow::CowError> for StorageError {
    fn from(e: space_runtime::cow::CowError) -> Self {
        match e {
            space_runtime::cow::CowError::Io { op, path, source } => {
                StorageError::Io { op, path, source }
            }
        }
    }
}

/// How [`open`] prepares a data directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageOptions {
    /// Forces a driver instead of detecting one; [`open`] fails if the filesystem cannot
    /// support it (for example `Btrfs` on ext4 without a loop image). `Copy` always works and
    /// is how tests and benchmarks compare drivers on the same host.
    pub driver: Option<DriverKind>,
    /// Apparent size of a loop image created by [`open`]. The file is sparse, so this is a
    /// ceiling on what the data directory can hold, not space taken up front.
    pub loop_image_size: u64,
    /// Allows [`open`] to create a loop-backed btrfs image when the data directory is not on
    /// btrfs (root only). An image that already exists is mounted regardless: it holds the
    /// data of an earlier run, and leaving it unmounted would hide that data.
    pub loop_image: bool,
}

/// Default apparent size of a loop image: room for a few templates and dozens of sandboxes.
pub const DEFAULT_LOOP_IMAGE_SIZE: u64 = 20 << 30;

impl Default for StorageOptions {
    fn default() -> Self {
        Self {
            driver: None,
            loop_image_size: DEFAULT_LOOP_IMAGE_SIZE,
            loop_image: true,
        }
    }
}

/// Prepares the data directory `data` and returns its driver and layout.
///
/// In order: creates `data` if needed; when `data` is not on btrfs, the process is root and
/// btrfs is wanted (detected or forced), mounts a loop-backed btrfs image over it (see
/// [`loopback`]); picks the driver (btrfs, else reflink if a probe clone works, else copy) or
/// checks the forced one; creates `templates/`, `sandboxes/` and `snapshots/`. The choice is
/// logged once, with the reason when it is not btrfs.
pub fn open(data: &Path, opts: &StorageOptions) -> Result<(Arc<dyn Storage>, Layout)> {
    std::fs::create_dir_all(data).map_err(io_err("creating", data))?;
    let data = data.canonicalize().map_err(io_err("resolving", data))?;

    let mut mounted_image = None;
    let wants_btrfs = matches!(opts.driver, None | Some(DriverKind::Btrfs));
    if wants_btrfs && !btrfs::is_btrfs(&data)? {
        match loopback::ensure(&data, opts.loop_image_size, opts.loop_image)? {
            loopback::Outcome::Mounted { image, created } => {
                tracing::info!(
                    data = %data.display(),
                    image = %image.display(),
                    created,
                    "data directory is not on btrfs: mounted a loop-backed btrfs image over it"
                );
                mounted_image = Some(image);
            }
            loopback::Outcome::Skipped(why) => {
                tracing::info!(data = %data.display(), "no loop-backed btrfs image: {why}");
            }
        }
    }

    let storage: Arc<dyn Storage> = match opts.driver {
        Some(DriverKind::Btrfs) => {
            if !btrfs::is_btrfs(&data)? {
                return Err(StorageError::Invalid(format!(
                    "the btrfs driver was requested but {} is not on btrfs",
                    data.display()
                )));
            }
            Arc::new(btrfs::BtrfsStorage::new())
        }
        Some(DriverKind::Reflink) => {
            if !reflink::probe(&data)? {
                return Err(StorageError::Invalid(format!(
                    "the reflink driver was requested but {} cannot clone files (FICLONE)",
                    data.display()
                )));
            }
            Arc::new(reflink::ReflinkStorage::new())
        }
        Some(DriverKind::Copy) => Arc::new(copy::CopyStorage::new(&data)),
        None if btrfs::is_btrfs(&data)? => Arc::new(btrfs::BtrfsStorage::new()),
        None if reflink::probe(&data)? => Arc::new(reflink::ReflinkStorage::new()),
        None => Arc::new(copy::CopyStorage::new(&data)),
    };
    tracing::info!(data = %data.display(), driver = ?storage.kind(), "storage ready");

    let layout = Layout {
        root: data,
        mounted_image,
    };
    for dir in [layout.templates(), layout.sandboxes(), layout.snapshots()] {
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io_err("creating", &dir)(e)),
        }
    }
    Ok((storage, layout))
}

/// Longest name [`Layout`] accepts for one path component: the kernel's `NAME_MAX`, which is
/// also btrfs' limit for a subvolume name (`BTRFS_VOL_NAME_MAX`).
pub const MAX_NAME_LEN: usize = 255;

/// Checks that `name` is safe as one path component under the data directory.
///
/// Accepted: 1 to [`MAX_NAME_LEN`] bytes of ASCII letters, digits and `-_.:@+`, not starting
/// with `.`. That rules out `/`, `.`, `..`, NUL, whitespace and control characters (names
/// reach logs), and it leaves names starting with `.` free for the drivers' temporary entries,
/// which therefore never collide with a volume.
pub fn validate_name(what: &str, name: &str) -> Result<()> {
    let bad = |why: &str| Err(StorageError::Invalid(format!("{what} {name:?}: {why}")));
    if name.is_empty() {
        return bad("must not be empty");
    }
    if name.len() > MAX_NAME_LEN {
        return bad("longer than 255 bytes");
    }
    if name.starts_with('.') {
        return bad("must not start with '.'");
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "-_.:@+".contains(*c)))
    {
        return bad(&format!(
            "character {c:?} not allowed (letters, digits and -_.:@+ only)"
        ));
    }
    Ok(())
}

/// Where things live under the data directory (see the module docs for the tree).
///
/// `templates/`, `sandboxes/` and `snapshots/` and the per-template and per-sandbox parents
/// (`templates/<name>/`, `snapshots/<id>/`) are plain directories; the leaves that the path
/// helpers return (a template version, a sandbox, one snapshot) are volumes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// The data directory, canonical (symlinks resolved), so paths handed to QEMU and to the
    /// kernel are stable.
    root: PathBuf,
    /// The loop image that [`open`] mounted on `root` in this process, if any: the owner of the
    /// layout unmounts it on clean shutdown with [`loopback::unmount`].
    mounted_image: Option<PathBuf>,
}

impl Layout {
    /// A layout over an existing data directory, without preparing anything (tests, tools).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            mounted_image: None,
        }
    }

    /// The data directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The loop image [`open`] mounted over the data directory, when it did so itself (not
    /// when it found it already mounted).
    pub fn mounted_image(&self) -> Option<&Path> {
        self.mounted_image.as_deref()
    }

    /// `<data>/templates`.
    pub fn templates(&self) -> PathBuf {
        self.root.join("templates")
    }

    /// `<data>/sandboxes`.
    pub fn sandboxes(&self) -> PathBuf {
        self.root.join("sandboxes")
    }

    /// `<data>/snapshots`.
    pub fn snapshots(&self) -> PathBuf {
        self.root.join("snapshots")
    }

    /// `<data>/volumes`: the tenants' volumes (`crate::volumes`), each a storage volume of
    /// its own beside its `<id>.json`.
    pub fn volumes(&self) -> PathBuf {
        self.root.join("volumes")
    }

    /// `<data>/templates/<name>/<version>`, a volume.
    pub fn template_dir(&self, name: &str, version: &str) -> Result<PathBuf> {
        validate_name("template name", name)?;
        validate_name("template version", version)?;
        Ok(self.templates().join(name).join(version))
    }

    /// `<data>/sandboxes/<id>`, a volume.
    pub fn sandbox_dir(&self, id: &str) -> Result<PathBuf> {
        validate_name("sandbox id", id)?;
        Ok(self.sandboxes().join(id))
    }

    /// `<data>/snapshots/<sandbox_id>`, the plain directory holding a sandbox's snapshots.
    pub fn snapshots_of(&self, sandbox_id: &str) -> Result<PathBuf> {
        validate_name("sandbox id", sandbox_id)?;
        Ok(self.snapshots().join(sandbox_id))
    }

    /// `<data>/snapshots/<sandbox_id>/<name>`, a volume.
    pub fn snapshot_dir(&self, sandbox_id: &str, name: &str) -> Result<PathBuf> {
        validate_name("snapshot name", name)?;
        Ok(self.snapshots_of(sandbox_id)?.join(name))
    }
}
