//! The scratch directory every sandbox, snapshot and restore of a run lives in.
//!
//! Production keeps sandboxes on btrfs so snapshots and restores clone files with reflinks.
//! By default the bench builds the same situation on any host: a sparse image file under
//! `/var/tmp`, formatted btrfs and loop-mounted. `--no-btrfs` uses a plain temporary directory
//! instead (on an ext4 root that means the sparse-copy fallback), and `--dir` uses a fresh
//! directory inside a given one. Whatever was created is removed by [`Scratch::cleanup`]; the
//! `Drop` impl does the same as a last resort.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context as _, Result};

/// Size of the btrfs image; sparse, so only what the run writes takes space.
const IMAGE_SIZE: u64 = 8 << 30;
/// Where the image goes.
const IMAGE_PARENT: &str = "/var/tmp";

enum Kind {
    /// A loop-mounted btrfs image: `base` holds `image` and the mount point `mnt`.
    Btrfs {
        base: PathBuf,
        image: PathBuf,
        mnt: PathBuf,
        mounted: bool,
    },
    /// A directory removed at the end.
    Plain { dir: PathBuf },
    /// Nothing left to clean up.
    Done,
}

/// The scratch area of one run.
pub struct Scratch {
    root: PathBuf,
    description: String,
    kind: Kind,
}

impl Scratch {
    /// A fresh loop-mounted btrfs image under `/var/tmp`.
    pub fn btrfs() -> Result<Scratch> {
        let base = tempfile::Builder::new()
            .prefix("space-bench-")
            .tempdir_in(IMAGE_PARENT)
            .with_context(|| format!("creating a directory in {IMAGE_PARENT}"))?
            .keep();
        let image = base.join("btrfs.img");
        let mnt = base.join("mnt");
        let mut scratch = Scratch {
            root: mnt.clone(),
            description: String::new(),
            kind: Kind::Btrfs {
                base,
                image: image.clone(),
                mnt: mnt.clone(),
                mounted: false,
            },
        };
        // From here on, failures clean up through `scratch`'s Drop.
        std::fs::File::create(&image)
            .and_then(|f| f.set_len(IMAGE_SIZE))
            .with_context(|| format!("creating the sparse image {}", image.display()))?;
        run(Command::new("mkfs.btrfs").arg("-q").arg(&image))
            .context("formatting the scratch image (is btrfs-progs installed?)")?;
        std::fs::create_dir(&mnt).with_context(|| format!("creating {}", mnt.display()))?;
        run(Command::new("mount")
            .args(["-o", "loop"])
            .arg(&image)
            .arg(&mnt))
        .context("loop-mounting the scratch image (needs root and a free loop device)")?;
        if let Kind::Btrfs { mounted, .. } = &mut scratch.kind {
            *mounted = true;
        }
        let device = loop_device(&image).unwrap_or_else(|| "a loop device".into());
        scratch.description = format!(
            "btrfs, {} GiB sparse image {} on {device}, mounted at {}",
            IMAGE_SIZE >> 30,
            image.display(),
            mnt.display()
        );
        Ok(scratch)
    }

    /// A fresh directory inside `parent` (the system temporary directory if `None`).
    pub fn plain(parent: Option<&Path>) -> Result<Scratch> {
        let mut builder = tempfile::Builder::new();
        builder.prefix("space-bench-");
        let dir = match parent {
            Some(p) => builder.tempdir_in(p),
            None => builder.tempdir(),
        }
        .context("creating the scratch directory")?
        .keep();
        let fs = filesystem_name(&dir);
        Ok(Scratch {
            root: dir.clone(),
            description: format!("{fs}, directory {}", dir.display()),
            kind: Kind::Plain { dir },
        })
    }

    /// Where sandboxes go.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// One line saying what the scratch area is.
    pub fn describe(&self) -> &str {
        &self.description
    }

    /// Removes everything this run created: unmounts (retrying while the last QEMU processes
    /// release their files), detaches the loop device and deletes the image. Safe to call
    /// twice.
    pub fn cleanup(&mut self) -> Result<()> {
        match std::mem::replace(&mut self.kind, Kind::Done) {
            Kind::Done => Ok(()),
            Kind::Plain { dir } => {
                std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))
            }
            Kind::Btrfs {
                base,
                image,
                mnt,
                mounted,
            } => {
                let mut problems = Vec::new();
                if mounted {
                    if let Err(e) = unmount(&mnt) {
                        problems.push(format!("{e:#}"));
                    }
                }
                // `mount -o loop` sets autoclear, so the unmount normally detached the device
                // already; detach explicitly in case it did not.
                if let Some(dev) = loop_device(&image) {
                    if let Err(e) = run(Command::new("losetup").arg("-d").arg(&dev)) {
                        problems.push(format!("detaching {dev}: {e:#}"));
                    }
                }
                if problems.is_empty() {
                    if let Err(e) = std::fs::remove_dir_all(&base) {
                        problems.push(format!("removing {}: {e}", base.display()));
                    }
                } else {
                    // Never delete under a mount point that is still there.
                    problems.push(format!("left {} in place", base.display()));
                }
                if problems.is_empty() {
                    Ok(())
                } else {
                    bail!("cleaning up the scratch image: {}", problems.join("; "))
                }
            }
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Err(e) = self.cleanup() {
            eprintln!("space-bench: {e:#}");
        }
    }
}

/// The filesystem type name of `path` (`btrfs`, `ext4`, `xfs`, `tmpfs`, ...).
pub fn filesystem_name(path: &Path) -> String {
    match nix::sys::statfs::statfs(path) {
        Ok(s) => {
            let t = s.filesystem_type();
            if t == nix::sys::statfs::BTRFS_SUPER_MAGIC {
                "btrfs".into()
            } else if t == nix::sys::statfs::EXT4_SUPER_MAGIC {
                "ext4".into()
            } else if t == nix::sys::statfs::XFS_SUPER_MAGIC {
                "xfs".into()
            } else if t == nix::sys::statfs::TMPFS_MAGIC {
                "tmpfs".into()
            } else {
                format!("filesystem 0x{:x}", t.0)
            }
        }
        Err(e) => format!("unknown filesystem ({e})"),
    }
}

fn unmount(mnt: &Path) -> Result<()> {
    let mut last = None;
    for _ in 0..50 {
        match run(Command::new("umount").arg(mnt)) {
            Ok(()) => return Ok(()),
            Err(e) => last = Some(e),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // Busy for five seconds: detach it lazily so it disappears once the last user goes.
    run(Command::new("umount").arg("-l").arg(mnt))
        .with_context(|| format!("{:#}", last.expect("at least one attempt failed")))
        .with_context(|| format!("unmounting {}", mnt.display()))
}

/// The loop device backed by `image`, if one is attached.
pub(crate) fn loop_device(image: &Path) -> Option<String> {
    let out = Command::new("losetup").arg("-j").arg(image).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let dev = text.lines().next()?.split(':').next()?.trim();
    (!dev.is_empty()).then(|| dev.to_owned())
}

/// Runs a command to completion; its output is only shown when it fails.
pub(crate) fn run(cmd: &mut Command) -> Result<()> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let out = cmd.output().with_context(|| format!("running {program}"))?;
    if !out.status.success() {
        bail!(
            "{program} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            String::from_utf8_lossy(&out.stdout).trim()
        );
    }
    Ok(())
}
