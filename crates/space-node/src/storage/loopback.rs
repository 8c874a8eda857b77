//! A loop-backed btrfs image mounted over the data directory, so that a host whose disk is
//! ext4 (the common case) still gets subvolume snapshots and reflinks.
//!
//! The image is a sparse file next to the data directory, `<data>.btrfs.img`: not inside it,
//! because the mount hides whatever is under the data directory (and an image cannot live in
//! the filesystem it holds); next to it, so it sits on the disk the operator chose for data
//! and is found by anyone looking there. Its size is a ceiling; blocks are allocated as they
//! are written, and the `discard=async` mount option punches deleted blocks back out of the
//! file, so deleted sandboxes and snapshots return their space to the host.
//!
//! Setup shells out (`mkfs.btrfs`, `mount -o loop`): it runs once per node start, not on the
//! create path. `mount -o loop` attaches the loop device with auto-clear, so unmounting also
//! detaches it. Mount options: `noatime` (reads of a template must not write metadata into
//! every snapshot that shares it) and `discard=async`; data copy-on-write stays on (it is the
//! point) and compression stays off (VM images and RAM files are written in place at random;
//! compressing them costs CPU on a 2-core host for little gain). The filesystem is made with
//! the `single` metadata profile: the default `dup` writes metadata twice into the same file
//! on the same disk, which protects against little and doubles the cost of the metadata that
//! snapshots are made of.
//!
//! Everything is idempotent across restarts: a data directory already on btrfs is left alone,
//! and an existing image that is not mounted (a restarted node, a reboot) is mounted again.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{btrfs, io_err, tree, Result, StorageError};

/// Mount options for the image (see the module docs).
pub const MOUNT_OPTIONS: &str = "loop,noatime,discard=async";

/// What [`ensure`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The image is now mounted on the data directory by this call.
    Mounted {
        /// The image file.
        image: PathBuf,
        /// Whether this call created and formatted it.
        created: bool,
    },
    /// Nothing was mounted, for the reason given (for the log line).
    Skipped(String),
}

/// The image that backs the data directory `data`: `<data>.btrfs.img`, beside it.
pub fn image_path(data: &Path) -> Result<PathBuf> {
    let (parent, name) = tree::split(data)?;
    let mut file = name.to_owned();
    file.push(".btrfs.img");
    Ok(parent.join(file))
}

/// Makes `data` a btrfs mount if it is not on btrfs already: mounts its existing image, or,
/// when `create` allows, creates a sparse image of `size` bytes, formats it and mounts it.
/// Needs root; without it, or without `mkfs.btrfs`, or when `data` already holds files that
/// a mount would hide, it skips and says why.
pub fn ensure(data: &Path, size: u64, create: bool) -> Result<Outcome> {
    if btrfs::is_btrfs(data)? {
        return Ok(Outcome::Skipped("already on btrfs".into()));
    }
    if !nix::unistd::geteuid().is_root() {
        return Ok(Outcome::Skipped(
            "mounting a loop-backed image needs root".into(),
        ));
    }
    let image = image_path(data)?;
    if image.exists() {
        mount_image(&image, data)?;
        return Ok(Outcome::Mounted {
            image,
            created: false,
        });
    }
    if !create {
        return Ok(Outcome::Skipped(
            "creating a loop-backed image is disabled".into(),
        ));
    }
    let mut entries = std::fs::read_dir(data).map_err(io_err("listing", data))?;
    if entries.next().is_some() {
        return Ok(Outcome::Skipped(format!(
            "{} is not empty and a mount would hide its contents",
            data.display()
        )));
    }
    if !command_exists("mkfs.btrfs") {
        return Ok(Outcome::Skipped(
            "mkfs.btrfs is not installed (btrfs-progs)".into(),
        ));
    }
    create_image(&image, size)?;
    mount_image(&image, data)?;
    Ok(Outcome::Mounted {
        image,
        created: true,
    })
}

fn command_exists(name: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/sbin:/usr/bin:/sbin:/bin".into());
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .any(|dir| dir.join(name).is_file())
}

/// Creates `image` as a sparse file of `size` bytes holding a fresh btrfs. The file is
/// formatted under a temporary name and renamed into place, so an image that exists is always
/// a formatted one, even after a crash mid-way.
pub fn create_image(image: &Path, size: u64) -> Result<()> {
    let mut partial = image.as_os_str().to_owned();
    partial.push(".partial");
    let partial = PathBuf::from(partial);
    let _ = std::fs::remove_file(&partial);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&partial)
        .map_err(io_err("creating", &partial))?;
    let result = file
        .set_len(size)
        .map_err(io_err("sizing", &partial))
        .and_then(|()| {
            drop(file);
            run(
                Command::new("mkfs.btrfs")
                    .args(["-q", "-K", "-L", "space", "-m", "single", "-d", "single"])
                    .arg(&partial),
                &partial,
            )
        })
        .and_then(|()| std::fs::rename(&partial, image).map_err(io_err("renaming", image)));
    if result.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    result
}

/// Mounts the btrfs image `image` on the directory `data` through a new loop device.
pub fn mount_image(image: &Path, data: &Path) -> Result<()> {
    run(
        Command::new("mount")
            .args(["-t", "btrfs", "-o", MOUNT_OPTIONS])
            .arg(image)
            .arg(data),
        data,
    )?;
    if !btrfs::is_btrfs(data)? {
        return Err(StorageError::Setup {
            path: data.to_owned(),
            message: format!("mounted {} but found no btrfs there", image.display()),
        });
    }
    Ok(())
}

/// Unmounts the image from `data`; the kernel then detaches its loop device. For a clean
/// shutdown of a node that mounted the image itself, and for tests. Fails (`EBUSY`) while
/// files under `data` are open.
pub fn unmount(data: &Path) -> Result<()> {
    nix::mount::umount2(data, nix::mount::MntFlags::empty())
        .map_err(|e| io_err("unmounting", data)(e.into()))
}

/// Runs a setup command, turning a failure into [`StorageError::Setup`] with its output.
fn run(cmd: &mut Command, path: &Path) -> Result<()> {
    let shown = format!("{cmd:?}");
    let out = cmd.output().map_err(|e| StorageError::Setup {
        path: path.to_owned(),
        message: format!("running {shown}: {e}"),
    })?;
    if out.status.success() {
        return Ok(());
    }
    Err(StorageError::Setup {
        path: path.to_owned(),
        message: format!(
            "{shown} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            String::from_utf8_lossy(&out.stdout).trim()
        ),
    })
}
