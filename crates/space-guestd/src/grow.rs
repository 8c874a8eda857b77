//! `POST /v1/fs/grow`: grows a mounted ext4 filesystem to fill its block device, online.
//!
//! The host grows the disk (QMP `block_resize`); virtio-blk then raises a configuration
//! change, and the guest kernel updates the device's capacity from a work item shortly after.
//! So the handler first waits, bounded, until the capacity the host asked for is visible in
//! `/sys/dev/block/MAJ:MIN/size`, then asks ext4 to grow with `EXT4_IOC_RESIZE_FS` (the same
//! online resize `resize2fs` uses on a mounted filesystem; it is part of ext4 itself).

use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::time::{Duration, Instant};

use http::Request;
use hyper::body::Incoming;
use nix::sys::statfs::{statfs, EXT4_SUPER_MAGIC};
use nix::sys::statvfs::statvfs;
use space_proto::query::validate_path;
use space_proto::{ErrorKind, GrowFsRequest, GrowFsResult, ProtoError};

use crate::body::{ok_json, read_json, HandlerResult};
use crate::daemon::Daemon;

/// How long to wait for the kernel to see the capacity the host set.
const CAPACITY_WAIT: Duration = Duration::from_secs(5);
const CAPACITY_POLL: Duration = Duration::from_millis(10);

// `EXT4_IOC_RESIZE_FS` is `_IOW('f', 16, __u64)`: the new size in filesystem blocks.
nix::ioctl_write_ptr!(ext4_resize_fs, b'f', 16, u64);

/// `POST /v1/fs/grow`. Only a daemon that may change the system (PID 1, or `--system`) grows
/// filesystems: outside a VM they are the host's.
pub async fn grow(d: &Daemon, req: Request<Incoming>) -> HandlerResult {
    let r: GrowFsRequest = read_json(req.into_body()).await?;
    validate_path(&r.path)?;
    if !d.system {
        return Err(ProtoError::new(
            ErrorKind::Unsupported,
            "growing a filesystem needs a daemon that runs the system (PID 1 or --system)",
        ));
    }
    let result = tokio::task::spawn_blocking(move || grow_blocking(&r.path, r.device_bytes))
        .await
        .map_err(|e| ProtoError::internal(format!("filesystem task failed: {e}")))??;
    ok_json(&result)
}

/// Grows the ext4 filesystem that holds `path` to its device's size (waiting for at least
/// `want` bytes of device first, when given).
pub fn grow_blocking(path: &str, want: Option<u64>) -> Result<GrowFsResult, ProtoError> {
    let fs_type = statfs(path).map_err(|e| errno_err("statfs", path, e))?;
    if fs_type.filesystem_type() != EXT4_SUPER_MAGIC {
        return Err(ProtoError::new(
            ErrorKind::Unsupported,
            format!(
                "{path} is on a filesystem of type {:#x}, not ext4; only ext4 grows online",
                fs_type.filesystem_type().0
            ),
        ));
    }
    let dev = fs::metadata(path)
        .map_err(|e| ProtoError::io(format!("stat {path}"), &e))?
        .dev();
    let size_file = format!(
        "/sys/dev/block/{}:{}/size",
        nix::sys::stat::major(dev),
        nix::sys::stat::minor(dev)
    );
    let device_bytes = wait_for_capacity(&size_file, want.unwrap_or(0))?;

    let before = statvfs(path).map_err(|e| errno_err("statvfs", path, e))?;
    let block_size = before.block_size() as u64;
    if block_size == 0 {
        return Err(ProtoError::internal(format!(
            "statvfs {path}: block size 0"
        )));
    }
    let old_bytes = before.blocks() as u64 * before.fragment_size() as u64;
    let blocks = device_bytes / block_size;

    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| ProtoError::io(format!("open {path}"), &e))?;
    // SAFETY: the descriptor is open for the whole call (`file` outlives it) and the argument
    // points to a live u64, which is what EXT4_IOC_RESIZE_FS reads; on a descriptor of another
    // kind the kernel fails the call with ENOTTY instead of touching the pointer.
    unsafe { ext4_resize_fs(file.as_raw_fd(), &blocks) }.map_err(|e| {
        let hint = match e {
            nix::errno::Errno::EINVAL => " (the filesystem is larger than that: it cannot shrink)",
            nix::errno::Errno::EOPNOTSUPP => " (this filesystem's features do not allow it)",
            _ => "",
        };
        ProtoError::new(
            ErrorKind::from_errno(e as i32),
            format!("growing {path} to {blocks} blocks of {block_size} bytes: {e}{hint}"),
        )
    })?;

    let after = statvfs(path).map_err(|e| errno_err("statvfs", path, e))?;
    let new_bytes = after.blocks() as u64 * after.fragment_size() as u64;
    tracing::info!(path, device_bytes, old_bytes, new_bytes, "filesystem grown");
    Ok(GrowFsResult {
        device_bytes,
        old_bytes,
        new_bytes,
        block_size,
    })
}

/// Reads a block device's capacity (512-byte sectors in sysfs) until it is at least `want`
/// bytes, for at most [`CAPACITY_WAIT`].
fn wait_for_capacity(size_file: &str, want: u64) -> Result<u64, ProtoError> {
    let deadline = Instant::now() + CAPACITY_WAIT;
    loop {
        let text = fs::read_to_string(size_file)
            .map_err(|e| ProtoError::io(format!("reading {size_file}"), &e))?;
        let sectors: u64 = text.trim().parse().map_err(|_| {
            ProtoError::internal(format!("{size_file} holds {text:?}, not a sector count"))
        })?;
        let bytes = sectors.saturating_mul(512);
        if bytes >= want {
            return Ok(bytes);
        }
        if Instant::now() >= deadline {
            return Err(ProtoError::new(
                ErrorKind::Timeout,
                format!(
                    "the block device is still {bytes} bytes after {CAPACITY_WAIT:?} \
                     ({size_file}); expected at least {want}: the device did not grow"
                ),
            ));
        }
        std::thread::sleep(CAPACITY_POLL);
    }
}

fn errno_err(op: &str, path: &str, e: nix::errno::Errno) -> ProtoError {
    ProtoError::new(ErrorKind::from_errno(e as i32), format!("{op} {path}: {e}"))
}
