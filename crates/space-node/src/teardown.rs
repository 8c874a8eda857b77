//! Removing a deployment's data for good (`space purge`): every VM of the data directory
//! killed, their control groups removed, the loop-backed btrfs image unmounted (which
//! detaches its loop device) and deleted, subvolumes deleted read-only or not when the
//! directory is on btrfs itself, and the directory removed.
//!
//! VMs are found by what they run from, not by a record (a crashed node's records may be
//! gone): a QEMU whose command line names a path under the data directory, or whose root or
//! working directory is there (a jailed QEMU runs chrooted into its sandbox's directory).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::storage::{btrfs, loopback};

/// What [`purge`] found and did.
#[derive(Debug, Default)]
pub struct Purged {
    /// QEMU processes killed.
    pub vms_killed: usize,
    /// Control-group directories removed.
    pub cgroups_removed: usize,
    /// Whether the loop-backed image was unmounted and deleted.
    pub image_removed: Option<PathBuf>,
    /// Subvolumes deleted (a data directory on btrfs itself).
    pub subvolumes_deleted: usize,
}

/// A process that serves `data` (a `space` server or node using it), if any: its pid and
/// command line.
pub fn server_of(data: &Path) -> Option<(u32, String)> {
    let data = data.to_string_lossy().into_owned();
    for (pid, comm, args) in processes() {
        if comm != "space" || pid == std::process::id() {
            continue;
        }
        let serving = args
            .iter()
            .skip(1)
            .any(|a| a == "up" || a == "node" || a == "control");
        if !serving {
            continue;
        }
        // `--data-dir D`, `--data-dir=D`, or none at all for the default directory.
        let named = args
            .windows(2)
            .any(|w| w[0] == "--data-dir" && w[1] == data)
            || args
                .iter()
                .any(|a| a.strip_prefix("--data-dir=") == Some(&data));
        let default = data == "/var/lib/space" && !args.iter().any(|a| a.starts_with("--data-dir"));
        if named || default {
            return Some((pid, args.join(" ")));
        }
    }
    None
}

/// Every process: pid, `comm` and argv.
fn processes() -> Vec<(u32, String, Vec<String>)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let e = e.ok()?;
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
        let raw = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let args = raw
            .split(|&b| b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        Some((pid, comm.trim().to_owned(), args))
    })
    .collect()
}

/// The (device, inode) of every directory up to two levels under `data`: a jailed QEMU's
/// root is one of them, and in its own mount namespace its path says nothing.
fn dirs_under(data: &Path) -> Vec<(u64, u64)> {
    use std::os::unix::fs::MetadataExt as _;
    let mut out = Vec::new();
    let mut push = |p: &Path| {
        if let Ok(m) = std::fs::metadata(p) {
            if m.is_dir() {
                out.push((m.dev(), m.ino()));
            }
        }
    };
    for top in std::fs::read_dir(data).into_iter().flatten().flatten() {
        push(&top.path());
        for inner in std::fs::read_dir(top.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            push(&inner.path());
        }
    }
    out
}

/// The live QEMU processes of `data`.
pub fn vms_of(data: &Path) -> Vec<u32> {
    use std::os::unix::fs::MetadataExt as _;
    let needle = data.to_string_lossy().into_owned();
    let dirs = dirs_under(data);
    processes()
        .into_iter()
        .filter(|(pid, comm, args)| {
            if !comm.starts_with("qemu") {
                return false;
            }
            let proc = PathBuf::from(format!("/proc/{pid}"));
            let zombie = std::fs::read_to_string(proc.join("stat"))
                .map(|s| {
                    s.rsplit(')')
                        .next()
                        .unwrap_or("")
                        .trim_start()
                        .starts_with('Z')
                })
                .unwrap_or(true);
            if zombie {
                return false;
            }
            let named = args.iter().any(|a| a.contains(&needle));
            let under = |link: &str| {
                std::fs::read_link(proc.join(link)).is_ok_and(|p| p.starts_with(data))
                    || std::fs::metadata(proc.join(link))
                        .is_ok_and(|m| dirs.contains(&(m.dev(), m.ino())))
            };
            named || under("root") || under("cwd")
        })
        .map(|(pid, _, _)| pid)
        .collect()
}

/// The cgroup directories (under `/sys/fs/cgroup`) process `pid` is in, other than the root.
fn cgroups_of(pid: u32) -> Vec<PathBuf> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let mut dirs = Vec::new();
    for line in text.lines() {
        // `hierarchy-id:controllers:path`; v2 has empty controllers.
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = match (parts.next(), parts.next(), parts.next()) {
            (Some(a), Some(b), Some(c)) => (a, b, c),
            _ => continue,
        };
        if path == "/" || path.is_empty() {
            continue;
        }
        let mount = if controllers.is_empty() {
            PathBuf::from("/sys/fs/cgroup")
        } else {
            let first = controllers.split(',').next().unwrap_or(controllers);
            // v1 mounts are named after their controller list (`cpu,cpuacct`); find the one
            // that carries this controller.
            std::fs::read_dir("/sys/fs/cgroup")
                .ok()
                .and_then(|d| {
                    d.flatten().map(|e| e.path()).find(|p| {
                        p.file_name()
                            .and_then(|n| n.to_str())
                            .is_some_and(|n| n.split(',').any(|c| c == first))
                    })
                })
                .unwrap_or_else(|| PathBuf::from("/sys/fs/cgroup").join(first))
        };
        dirs.push(mount.join(path.trim_start_matches('/')));
    }
    dirs
}

/// Kills every VM of `data` and removes their control groups; answers how many of each.
pub fn kill_vms(data: &Path) -> (usize, usize) {
    let mut killed = 0;
    let mut groups = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let pids = vms_of(data);
        if pids.is_empty() || Instant::now() > deadline {
            break;
        }
        for pid in pids {
            groups.extend(cgroups_of(pid));
            if nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            )
            .is_ok()
            {
                killed += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    groups.sort();
    groups.dedup();
    let mut removed = 0;
    for g in groups {
        // A cgroup empties a moment after its last process is reaped.
        for _ in 0..50 {
            match std::fs::remove_dir(&g) {
                Ok(()) => {
                    removed += 1;
                    break;
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }
    (killed, removed)
}

/// Deletes every subvolume under `dir` (deepest first), read-only ones included.
fn delete_subvolumes(dir: &Path, count: &mut usize) -> std::io::Result<()> {
    let meta = std::fs::symlink_metadata(dir)?;
    if !meta.is_dir() {
        return Ok(());
    }
    for e in std::fs::read_dir(dir)? {
        let path = e?.path();
        if std::fs::symlink_metadata(&path)?.is_dir() {
            delete_subvolumes(&path, count)?;
        }
    }
    if btrfs::is_subvolume(dir).unwrap_or(false) {
        btrfs::delete_subvolume(dir).map_err(|e| std::io::Error::other(e.to_string()))?;
        *count += 1;
    }
    Ok(())
}

/// Removes everything of the deployment on `data`. The caller has made sure nothing serves
/// it ([`server_of`]).
pub fn purge(data: &Path) -> anyhow::Result<Purged> {
    use anyhow::Context as _;
    let mut done = Purged::default();
    let (vms, groups) = kill_vms(data);
    done.vms_killed = vms;
    done.cgroups_removed = groups;
    let image = loopback::image_path(data).ok();
    let mounted = is_mount_point(data);
    if mounted {
        loopback::unmount(data)
            .or_else(|_| {
                nix::mount::umount2(data, nix::mount::MntFlags::MNT_DETACH)
                    .map_err(|e| crate::storage::StorageError::Invalid(e.to_string()))
            })
            .with_context(|| format!("unmounting {}", data.display()))?;
    }
    if let Some(img) = image.filter(|i| i.is_file()) {
        detach_loops(&img);
        std::fs::remove_file(&img).with_context(|| format!("deleting {}", img.display()))?;
        done.image_removed = Some(img);
    }
    if data.exists() {
        if btrfs::is_btrfs(data).unwrap_or(false) {
            let mut n = 0;
            delete_subvolumes(data, &mut n)
                .with_context(|| format!("deleting the subvolumes under {}", data.display()))?;
            done.subvolumes_deleted = n;
        }
        if data.exists() {
            std::fs::remove_dir_all(data)
                .with_context(|| format!("deleting {}", data.display()))?;
        }
    }
    Ok(done)
}

/// Whether `path` is mounted on (its device differs from its parent's).
pub fn is_mount_point(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    match (
        std::fs::metadata(path),
        path.parent().map(std::fs::metadata),
    ) {
        (Ok(a), Some(Ok(b))) => a.dev() != b.dev(),
        _ => false,
    }
}

/// Detaches loop devices still backed by `image` (a lazy unmount leaves them until the last
/// user goes; auto-clear then detaches them itself).
fn detach_loops(image: &Path) {
    let Ok(out) = std::process::Command::new("losetup")
        .arg("-j")
        .arg(image)
        .output()
    else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        if let Some(dev) = line
            .split(':')
            .next()
            .filter(|d| d.starts_with("/dev/loop"))
        {
            let _ = std::process::Command::new("losetup")
                .args(["-d", dev])
                .status();
        }
    }
}

/// The loop devices backed by `image`, for checks.
pub fn loops_of(image: &Path) -> Vec<String> {
    std::process::Command::new("losetup")
        .arg("-j")
        .arg(image)
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter_map(|l| l.split(':').next().map(str::to_owned))
                .filter(|d| d.starts_with("/dev/loop"))
                .collect()
        })
        .unwrap_or_default()
}
