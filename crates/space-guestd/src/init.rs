//! PID 1 duties, done only when the daemon is the guest's init: standard descriptors, pseudo
//! filesystems, hostname, loopback, signals, and power-off.
//!
//! Linux delivers to PID 1 only signals it installed handlers for, so the daemon cannot be
//! killed by a stray `kill -TERM 1`; it still installs handlers (rather than ignoring signals)
//! because an ignored disposition would be inherited by every process it starts. The release
//! build aborts on panic and an init that exits panics the kernel, which ends the VM: the
//! daemon avoids panics, and the host sees the VM exit rather than a silent hang.

use std::fs;
use std::io;
use std::os::fd::{AsRawFd, IntoRawFd};
use std::os::unix::fs::{symlink, DirBuilderExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;

use nix::mount::{mount, MsFlags};
use tokio::signal::unix::{signal, SignalKind};

use crate::daemon::Daemon;

/// Errors of one init step; each is logged and the next step still runs.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    #[error("mount {target}")]
    Mount {
        target: &'static str,
        #[source]
        source: nix::Error,
    },
    #[error("loopback")]
    Loopback(#[source] io::Error),
    #[error("hostname")]
    Hostname(#[source] nix::Error),
}

/// Makes sure descriptors 0, 1 and 2 are open. Without a `/dev/console` in the image the kernel
/// starts init with none, and the first files the daemon opens (the control port!) would become
/// its stdout and stderr. Runs before anything else opens a file.
pub fn ensure_std_fds() {
    for fd in 0..3 {
        // SAFETY: F_GETFD only queries the descriptor table; any integer is a valid argument.
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } >= 0 {
            continue;
        }
        let file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/console")
            .or_else(|_| {
                fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open("/dev/null")
            });
        match file {
            Ok(f) => {
                let raw = f.into_raw_fd();
                if raw != fd {
                    // SAFETY: both descriptors are valid; dup2 onto an unused slot cannot close
                    // anything we own, and `raw` is ours to close afterwards.
                    unsafe {
                        libc::dup2(raw, fd);
                        libc::close(raw);
                    }
                }
            }
            // Neither exists (no devtmpfs yet): retried after /dev is mounted.
            Err(_) => return,
        }
    }
}

fn mount_one(
    source: &str,
    target: &'static str,
    fstype: &str,
    flags: MsFlags,
    data: Option<&str>,
) -> Result<(), InitError> {
    let _ = fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(target);
    match mount(Some(source), target, Some(fstype), flags, data) {
        Ok(()) => Ok(()),
        // Already mounted (the kernel's devtmpfs automount, or a second start).
        Err(nix::Error::EBUSY) => Ok(()),
        Err(source) => Err(InitError::Mount { target, source }),
    }
}

/// Mounts /proc, /sys, /dev, /dev/pts, /dev/shm, /tmp and /run.
fn mount_all() -> Vec<InitError> {
    let nodev = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    let mut errors = Vec::new();
    let steps: [(&str, &'static str, &str, MsFlags, Option<&str>); 4] = [
        ("proc", "/proc", "proc", nodev, None),
        ("sysfs", "/sys", "sysfs", nodev, None),
        (
            "devtmpfs",
            "/dev",
            "devtmpfs",
            MsFlags::MS_NOSUID,
            Some("mode=0755"),
        ),
        (
            "tmpfs",
            "/run",
            "tmpfs",
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some("mode=0755"),
        ),
    ];
    for (src, target, fstype, flags, data) in steps {
        if let Err(e) = mount_one(src, target, fstype, flags, data) {
            errors.push(e);
        }
    }
    // gid 5 is the conventional `tty` group; use it only if the image defines it.
    let tty_gid = fs::read_to_string("/etc/group").ok().and_then(|g| {
        g.lines()
            .find(|l| l.starts_with("tty:"))
            .and_then(|l| l.split(':').nth(2).map(str::to_owned))
    });
    let pts_opts = match tty_gid {
        Some(gid) => format!("ptmxmode=0666,mode=0620,gid={gid}"),
        None => "ptmxmode=0666,mode=0620".to_string(),
    };
    if let Err(e) = mount_one(
        "devpts",
        "/dev/pts",
        "devpts",
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some(&pts_opts),
    ) {
        errors.push(e);
    }
    if !Path::new("/dev/ptmx").exists() {
        let _ = symlink("pts/ptmx", "/dev/ptmx");
    }
    for (target, mode) in [("/dev/shm", "mode=1777"), ("/tmp", "mode=1777")] {
        if let Err(e) = mount_one(
            "tmpfs",
            target,
            "tmpfs",
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some(mode),
        ) {
            errors.push(e);
        }
    }
    let _ = fs::set_permissions("/tmp", fs::Permissions::from_mode(0o1777));
    errors
}

/// `struct ifreq` as used by SIOC[GS]IFFLAGS: a name and a short in a 24-byte union.
#[repr(C)]
struct IfReqFlags {
    name: [u8; 16],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// Brings `lo` up. Linux gives the loopback device 127.0.0.1/8 (and ::1) by itself when it
/// goes up, so no address needs to be configured.
pub fn loopback_up() -> Result<(), InitError> {
    // Any AF_INET socket can carry interface ioctls; binding to port 0 on the wildcard
    // address works before any interface is up.
    let sock = std::net::UdpSocket::bind("0.0.0.0:0").map_err(InitError::Loopback)?;
    let mut req = IfReqFlags {
        name: [0; 16],
        flags: 0,
        _pad: [0; 22],
    };
    req.name[..2].copy_from_slice(b"lo");
    // SAFETY: SIOCGIFFLAGS reads the name from and writes the flags into a `struct ifreq`;
    // `req` has that layout and size (40 bytes) and lives across the call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } < 0 {
        return Err(InitError::Loopback(io::Error::last_os_error()));
    }
    req.flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    // SAFETY: as above; SIOCSIFFLAGS only reads the struct.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) } < 0 {
        return Err(InitError::Loopback(io::Error::last_os_error()));
    }
    Ok(())
}

/// Everything PID 1 sets up before serving. Failures are logged, never fatal: a guest with a
/// missing mount can still be repaired through exec.
pub fn setup() {
    ensure_std_fds();
    for e in mount_all() {
        log_chain(&e);
    }
    ensure_std_fds();
    if let Err(e) = nix::unistd::sethostname("sandbox").map_err(InitError::Hostname) {
        log_chain(&e);
    }
    if let Err(e) = loopback_up() {
        log_chain(&e);
    }
}

fn log_chain(e: &dyn std::error::Error) {
    let mut msg = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    tracing::warn!("init: {msg}");
}

/// Keeps PID 1 alive through the signals a user or the kernel may send it.
pub fn spawn_signal_handlers(daemon: Arc<Daemon>) {
    for kind in [
        SignalKind::terminate(),
        SignalKind::interrupt(),
        SignalKind::hangup(),
        SignalKind::user_defined1(),
        SignalKind::user_defined2(),
    ] {
        let Ok(mut sig) = signal(kind) else { continue };
        let d = daemon.clone();
        tokio::spawn(async move {
            while sig.recv().await.is_some() {
                d.warn_limited("init", &format!("ignoring signal {kind:?}"));
            }
        });
    }
}

/// Flushes filesystems and reboots, which ends the VM (it runs with `-no-reboot`).
pub fn power_off() {
    tracing::info!("powering off");
    nix::unistd::sync();
    let Err(e) = nix::sys::reboot::reboot(nix::sys::reboot::RebootMode::RB_AUTOBOOT);
    tracing::error!("reboot failed: {e}");
}
