//! Leftovers: the sweep at start of what no record names (sandbox and snapshot directories,
//! partial template versions, temporary record files), and the killing of VMMs left running
//! in a directory nobody drives.

use std::collections::HashSet;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::NodeError;
use crate::ids::SandboxId;
use crate::sandbox::Ctx;
use crate::template;

use super::snapshots::remove_volume;
use super::RecoveryReport;

pub(super) async fn sweep_orphans(
    ctx: &Arc<Ctx>,
    known: &HashSet<SandboxId>,
    report: &mut RecoveryReport,
) {
    let children = |d: PathBuf| -> Vec<(String, PathBuf)> {
        std::fs::read_dir(d)
            .map(|e| {
                e.filter_map(|e| {
                    let e = e.ok()?;
                    Some((e.file_name().to_string_lossy().into_owned(), e.path()))
                })
                .collect()
            })
            .unwrap_or_default()
    };
    let is_known = |name: &str| {
        name.parse::<SandboxId>()
            .is_ok_and(|id| known.contains(&id))
    };
    let mut doomed = Vec::new();
    for (name, path) in children(ctx.layout.sandboxes()) {
        if !is_known(&name) {
            kill_vmm_in(ctx, &path, report).await;
            doomed.push(path);
        }
    }
    for (name, path) in children(ctx.layout.snapshots()) {
        if !is_known(&name) {
            doomed.extend(children(path.clone()).into_iter().map(|(_, p)| p));
            doomed.push(path);
        }
    }
    for (name, path) in children(ctx.layout.templates()) {
        if name.starts_with('.') {
            doomed.push(path);
            continue;
        }
        for (version, vpath) in children(path) {
            if version.starts_with('.') || !vpath.join(template::TEMPLATE_MANIFEST).exists() {
                doomed.push(vpath);
            }
        }
    }
    for path in doomed {
        let result = if path.is_dir() {
            remove_volume(ctx, &path, report).await
        } else {
            std::fs::remove_file(&path)
                .map(|()| report.removed.push(path.clone()))
                .map_err(NodeError::io("removing", &path))
        };
        if let Err(e) = result {
            tracing::error!(path = %path.display(), error = %e, "removing an orphan");
        }
    }
    let state = ctx.layout.root().join("state").join("sandboxes");
    for (name, path) in children(state) {
        if space_fs::is_leftover(&name) && std::fs::remove_file(&path).is_ok() {
            report.removed.push(path);
        }
    }
}

// ---- stray VMMs ----------------------------------------------------------------------------

/// Kills the VMM running in `dir`, if any: one that `adopt` accepts, else any QEMU process
/// whose root (jailed) or working directory (unjailed) is `dir`. Waits until it is gone.
/// Kills whatever VMM runs in `dir` (a sandbox whose driver let its VM go).
pub(crate) async fn kill_vmm(ctx: &Ctx, dir: &Path) {
    kill_vmm_in(ctx, dir, &mut RecoveryReport::default()).await;
}

pub(super) async fn kill_vmm_in(ctx: &Ctx, dir: &Path, report: &mut RecoveryReport) {
    let Ok(meta) = std::fs::metadata(dir) else {
        return;
    };
    if let Ok(vm) = ctx.runtime.adopt(dir).await {
        let pid = vm.pid();
        let _ = vm.kill().await;
        report.killed.push(pid);
        return;
    }
    let key = (meta.dev(), meta.ino());
    let strays = tokio::task::spawn_blocking(move || kill_strays(key))
        .await
        .unwrap_or_default();
    report.killed.extend(strays);
    // A VMM killed by a node that died before cleaning up left its cgroup: too young for
    // the sweep, which waits for cgroups being set up, so it goes here.
    report.cgroups.extend(ctx.runtime.release_gone(dir).await);
}

/// SIGKILLs every QEMU process whose root or working directory is the inode `key`, and waits
/// (up to 5 s each) until they are gone.
fn kill_strays(key: (u64, u64)) -> Vec<u32> {
    let mut killed = Vec::new();
    for pid in qemus_in(key) {
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1; no
        // memory is passed.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        if fd < 0 {
            continue;
        }
        // SAFETY: `fd` was just returned by pidfd_open and is owned by nothing else.
        let pidfd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        // The pid is pinned now: check again that it is the same process.
        if !qemus_in(key).contains(&pid) {
            continue;
        }
        // SAFETY: pidfd_send_signal takes a live pidfd, a signal number, a null siginfo
        // (allowed: the kernel fills one in) and flags 0.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                pidfd.as_raw_fd(),
                libc::SIGKILL,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        if rc < 0 {
            continue;
        }
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(5) {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let state = stat
                .rsplit_once(") ")
                .and_then(|(_, rest)| rest.chars().next());
            if matches!(state, None | Some('Z') | Some('X')) {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        tracing::warn!(pid, "killed a VMM left without a sandbox to run for");
        killed.push(pid);
    }
    killed
}

/// QEMU processes whose root or working directory is the inode `key`.
fn qemus_in(key: (u64, u64)) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let me = std::process::id();
    entries
        .filter_map(|e| {
            let e = e.ok()?;
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            if pid == me {
                return None;
            }
            let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
            if !comm.starts_with("qemu") {
                return None;
            }
            let same = |link: &str| {
                std::fs::metadata(e.path().join(link)).is_ok_and(|m| (m.dev(), m.ino()) == key)
            };
            (same("root") || same("cwd")).then_some(pid)
        })
        .collect()
}
