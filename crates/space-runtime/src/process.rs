//! VMM processes whose lifetime is tied to ours: started so they die with the host process,
//! watched so their exit is known the moment it happens, killed and reaped when dropped.
//!
//! Three details carry the weight:
//! - `PR_SET_PDEATHSIG(SIGKILL)` fires when the *thread* that forked the child exits, not the
//!   process. Async runtimes retire threads (idle blocking-pool threads, `block_in_place`), so
//!   children are forked from one dedicated thread that lives as long as the process.
//! - Signals go through a pidfd, never a bare pid: once a child is reaped its pid can be
//!   reused, and a late kill must not hit a stranger.
//! - Exactly one place reaps (the `std::process::Child`, under a lock), woken by the pidfd
//!   becoming readable when the process exits.

use std::fmt;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command};
use std::sync::{mpsc, Arc, Mutex, OnceLock};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::Signal;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

/// How long dropping a [`Process`] waits for the killed child before leaving it to the
/// background reaper. SIGKILL takes effect in milliseconds unless the process is stuck in
/// uninterruptible I/O.
const DROP_WAIT_MS: u16 = 5000;

/// Errors starting a process.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// `fork`/`exec` failed (binary missing, not executable, ...).
    #[error("starting {program}")]
    Spawn {
        /// The program.
        program: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// `pidfd_open` failed (kernels before 5.3 lack it).
    #[error("pidfd_open")]
    Pidfd(#[source] std::io::Error),
    /// The dedicated spawner thread is gone (it only ends if it panicked).
    #[error("the process spawner thread is gone")]
    SpawnerGone,
}

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitInfo {
    /// Exit code, if it exited.
    pub code: Option<i32>,
    /// Terminating signal, if it was killed.
    pub signal: Option<i32>,
}

impl ExitInfo {
    /// Used when the status could not be collected (someone else reaped it).
    pub const UNKNOWN: ExitInfo = ExitInfo {
        code: None,
        signal: None,
    };
}

impl fmt::Display for ExitInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.code, self.signal) {
            (Some(code), _) => write!(f, "exit code {code}"),
            (None, Some(sig)) => match Signal::try_from(sig) {
                Ok(s) => write!(f, "killed by {s}"),
                Err(_) => write!(f, "killed by signal {sig}"),
            },
            (None, None) => f.write_str("unknown exit status"),
        }
    }
}

type Job = (Command, oneshot::Sender<std::io::Result<Child>>);

fn spawner() -> &'static Mutex<mpsc::Sender<Job>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("vmm-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("starting the VMM spawner thread");
        Mutex::new(tx)
    })
}

/// A running (or exited, not yet dropped) child process.
pub struct Process {
    pid: u32,
    pidfd: OwnedFd,
    child: Arc<Mutex<Child>>,
    exit: watch::Receiver<Option<ExitInfo>>,
    watcher: JoinHandle<()>,
}

impl Process {
    /// Starts `cmd` so that it is SIGKILLed if this process dies, and begins watching it.
    /// Must be called inside a tokio runtime.
    pub async fn spawn(mut cmd: Command) -> Result<Process, ProcessError> {
        let program = cmd.get_program().to_string_lossy().into_owned();
        let parent = std::process::id();
        // SAFETY: the closure runs in the forked child before exec and only makes
        // async-signal-safe calls (prctl, getppid) and builds errors from raw errno values,
        // which does not allocate.
        unsafe {
            cmd.pre_exec(move || {
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
                // If we died between fork and prctl the signal will never come: give up now.
                if nix::unistd::getppid().as_raw() as u32 != parent {
                    return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }
        let (tx, rx) = oneshot::channel();
        spawner()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send((cmd, tx))
            .map_err(|_| ProcessError::SpawnerGone)?;
        let child = rx
            .await
            .map_err(|_| ProcessError::SpawnerGone)?
            .map_err(|source| ProcessError::Spawn { program, source })?;
        let pid = child.id();
        let child = Arc::new(Mutex::new(child));

        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1; no
        // memory is shared with the kernel.
        let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        if raw < 0 {
            let err = std::io::Error::last_os_error();
            let mut c = lock(&child);
            let _ = c.kill();
            let _ = c.wait();
            return Err(ProcessError::Pidfd(err));
        }
        // SAFETY: `raw` is a fresh descriptor that nothing else owns.
        let pidfd = unsafe { OwnedFd::from_raw_fd(raw as i32) };

        let (exit_tx, exit) = watch::channel(None);
        let watch_fd = pidfd.try_clone().map_err(ProcessError::Pidfd)?;
        let watcher = tokio::spawn(watch_exit(watch_fd, child.clone(), exit_tx));
        Ok(Process {
            pid,
            pidfd,
            child,
            exit,
            watcher,
        })
    }

    /// The process id (for logs; signal through [`Process::kill`]).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// How it ended, if it has.
    pub fn exit_status(&self) -> Option<ExitInfo> {
        *self.exit.borrow()
    }

    /// A receiver that turns `Some` when the process exits.
    pub fn exit_watch(&self) -> watch::Receiver<Option<ExitInfo>> {
        self.exit.clone()
    }

    /// Waits for the process to exit.
    pub async fn wait(&self) -> ExitInfo {
        let mut rx = self.exit.clone();
        let info = match rx.wait_for(Option::is_some).await {
            Ok(v) => v.unwrap_or(ExitInfo::UNKNOWN),
            Err(_) => ExitInfo::UNKNOWN,
        };
        info
    }

    /// Sends SIGKILL. Harmless if the process already exited.
    pub fn kill(&self) -> std::io::Result<()> {
        // SAFETY: pidfd_send_signal reads only its integer arguments; the info pointer is null,
        // which the kernel accepts. The pidfd is owned by `self` and open.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.pidfd.as_raw_fd(),
                libc::SIGKILL,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        if rc < 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::ESRCH) {
                return Err(err);
            }
        }
        Ok(())
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.watcher.abort();
        if self.exit_status().is_some() {
            return;
        }
        let _ = self.kill();
        let mut fds = [PollFd::new(self.pidfd.as_fd(), PollFlags::POLLIN)];
        let _ = poll(&mut fds, PollTimeout::from(DROP_WAIT_MS));
        let _ = lock(&self.child).try_wait();
    }
}

fn lock(child: &Mutex<Child>) -> std::sync::MutexGuard<'_, Child> {
    child.lock().unwrap_or_else(|e| e.into_inner())
}

async fn watch_exit(
    pidfd: OwnedFd,
    child: Arc<Mutex<Child>>,
    exit: watch::Sender<Option<ExitInfo>>,
) {
    let reap = || -> Option<ExitInfo> {
        match lock(&child).try_wait() {
            Ok(Some(status)) => Some(ExitInfo {
                code: status.code(),
                signal: status.signal(),
            }),
            Ok(None) => None,
            Err(_) => Some(ExitInfo::UNKNOWN),
        }
    };
    // SAFETY: the pidfd is an `OwnedFd` moved into the `AsyncFd`, so it stays open and refers
    // to the same process for as long as the registration exists.
    let registered = unsafe { AsyncFd::register_with_interest(pidfd, Interest::READABLE) };
    let info = match registered {
        Ok(fd) => loop {
            let Ok(mut guard) = fd.readable().await else {
                break ExitInfo::UNKNOWN;
            };
            match reap() {
                Some(info) => break info,
                None => guard.clear_ready(),
            }
        },
        Err(_) => loop {
            // Without epoll support for the pidfd, poll the child instead.
            match reap() {
                Some(info) => break info,
                None => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
            }
        },
    };
    let _ = exit.send(Some(info));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn exit_is_observed_and_reported() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "exit 3"]);
        let p = Process::spawn(cmd).await.unwrap();
        let info = tokio::time::timeout(Duration::from_secs(10), p.wait())
            .await
            .unwrap();
        assert_eq!(info.code, Some(3));
        assert_eq!(info.to_string(), "exit code 3");
        assert_eq!(p.exit_status(), Some(info));
        // Killing an exited, reaped process is harmless.
        p.kill().unwrap();
    }

    #[tokio::test]
    async fn kill_and_drop_reap() {
        let mut cmd = Command::new("sleep");
        cmd.arg("1000");
        let p = Process::spawn(cmd).await.unwrap();
        let pid = p.pid();
        assert!(p.exit_status().is_none());
        p.kill().unwrap();
        let info = tokio::time::timeout(Duration::from_secs(10), p.wait())
            .await
            .unwrap();
        assert_eq!(info.signal, Some(libc::SIGKILL));
        assert_eq!(info.to_string(), "killed by SIGKILL");
        drop(p);
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());

        let mut cmd = Command::new("sleep");
        cmd.arg("1000");
        let p = Process::spawn(cmd).await.unwrap();
        let pid = p.pid();
        drop(p);
        // Dropping kills and reaps: no process, not even a zombie, is left.
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    }

    #[tokio::test]
    async fn missing_binary_is_a_spawn_error() {
        let err = Process::spawn(Command::new("/nonexistent/qemu"))
            .await
            .err()
            .unwrap();
        assert!(matches!(err, ProcessError::Spawn { .. }), "{err:?}");
    }

    #[test]
    fn children_die_with_the_spawning_process() {
        // Fork a helper that spawns `sleep` through this module and then exits without
        // cleanup; PR_SET_PDEATHSIG must take the sleeper down with it.
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("pid");
        let exe = std::env::current_exe().unwrap();
        let status = Command::new(exe)
            .args([
                "--exact",
                "process::tests::orphan_helper",
                "--nocapture",
                "--ignored",
            ])
            .env("ORPHAN_PIDFILE", &pidfile)
            .status()
            .unwrap();
        assert!(status.success());
        let pid: u32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let gone = (0..500).any(|_| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // Gone, or a zombie waiting for init to reap it.
            let dead = stat.is_empty()
                || stat
                    .rsplit(')')
                    .next()
                    .is_some_and(|s| s.trim_start().starts_with('Z'));
            if !dead {
                std::thread::sleep(Duration::from_millis(10));
            }
            dead
        });
        assert!(gone, "child {pid} outlived its parent");
    }

    #[tokio::test]
    #[ignore = "helper process for children_die_with_the_spawning_process"]
    async fn orphan_helper() {
        let Ok(pidfile) = std::env::var("ORPHAN_PIDFILE") else {
            return;
        };
        let mut cmd = Command::new("sleep");
        cmd.arg("1000");
        let p = Process::spawn(cmd).await.unwrap();
        std::fs::write(pidfile, p.pid().to_string()).unwrap();
        // Leave without running destructors, as a crashing host would.
        std::process::exit(0);
    }
}
