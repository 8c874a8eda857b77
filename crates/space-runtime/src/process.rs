//! VMM processes: started so they die with the host process (or, on request, so they outlive
//! it), watched so their exit is known the moment it happens, killed and reaped when dropped,
//! and adopted again by a later host process.
//!
//! Four details carry the weight:
//! - `PR_SET_PDEATHSIG(SIGKILL)` fires when the *thread* that forked the child exits, not the
//!   process. Async runtimes retire threads (idle blocking-pool threads, `block_in_place`), so
//!   children are forked from one dedicated thread that lives as long as the process.
//! - Signals go through a pidfd, never a bare pid: once a child is reaped its pid can be
//!   reused, and a late kill must not hit a stranger.
//! - Exactly one place reaps: `waitid(P_PIDFD)` in the watcher task, woken by the pidfd
//!   becoming readable when the process exits. For a process that is not our child (adopted
//!   after a restart) the pidfd still says *that* it exited, but nothing says *how*: its
//!   [`ExitInfo`] is [`ExitInfo::UNKNOWN`].
//! - A jailed VMM must be PID 1 of a new PID namespace, which `unshare` gives only to later
//!   children; see [`Process::spawn_with`] for the fork in `pre_exec` that handles this.
//!
//! Needs Linux 5.4 (`pidfd_open`, `waitid(P_PIDFD)`).

use std::fmt;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::Command;
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
    /// The dedicated spawner thread could not be started (the host is out of threads or
    /// memory); the next spawn tries again.
    #[error("starting the VMM spawner thread")]
    SpawnerStart(#[source] std::io::Error),
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

type Job = Box<dyn FnOnce() + Send>;

/// Runs `job` on the one thread every VMM is forked from. The thread starts with the first
/// job; when it cannot start (threads or memory exhausted) the job fails with
/// [`ProcessError::SpawnerStart`] and the next job tries again, and a thread that is gone
/// is replaced.
fn on_spawner_thread(job: Job) -> Result<(), ProcessError> {
    static SPAWNER: Mutex<Option<mpsc::Sender<Job>>> = Mutex::new(None);
    let mut slot = SPAWNER.lock().unwrap_or_else(|e| e.into_inner());
    let job = match slot.as_ref() {
        Some(tx) => match tx.send(job) {
            Ok(()) => return Ok(()),
            // The thread is gone: start another for this job.
            Err(mpsc::SendError(job)) => job,
        },
        None => job,
    };
    *slot = None;
    let (tx, rx) = mpsc::channel::<Job>();
    std::thread::Builder::new()
        .name("vmm-spawner".into())
        .spawn(move || {
            for job in rx {
                job();
            }
        })
        .map_err(ProcessError::SpawnerStart)?;
    tx.send(job).map_err(|_| ProcessError::SpawnerGone)?;
    *slot = Some(tx);
    Ok(())
}

/// A pidfd of this process, opened once. A jailed child checks it after arming its death
/// signal: in a new PID namespace `getppid()` reads 0, so it cannot tell whether its parent
/// already died.
fn own_pidfd() -> Option<&'static OwnedFd> {
    static OWN: OnceLock<Option<OwnedFd>> = OnceLock::new();
    OWN.get_or_init(|| pidfd_open(std::process::id()).ok())
        .as_ref()
}

pub(crate) fn pidfd_open(pid: u32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1; no memory
    // is shared with the kernel.
    let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh descriptor (pidfds are close-on-exec) that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(raw as i32) })
}

/// How [`Process::spawn_with`] starts a process.
#[derive(Default)]
pub struct SpawnOptions {
    /// SIGKILL the process when this one dies (`PR_SET_PDEATHSIG`). Off for VMs that must
    /// survive a node restart.
    pub die_with_parent: bool,
    /// Start a new session (`setsid`), so the process is in no process group or terminal of
    /// ours and no signal meant for the node's group reaches it.
    pub new_session: bool,
    /// Confine the process: cgroups, namespaces, a new root, an unprivileged user.
    pub jail: Option<Arc<crate::jail::Prepared>>,
}

impl fmt::Debug for SpawnOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SpawnOptions")
            .field("die_with_parent", &self.die_with_parent)
            .field("new_session", &self.new_session)
            .field("jailed", &self.jail.is_some())
            .finish()
    }
}

/// A running (or exited, not yet dropped) process: a child of ours, or one adopted from an
/// earlier node process.
pub struct Process {
    pid: u32,
    pidfd: OwnedFd,
    exit: watch::Receiver<Option<ExitInfo>>,
    watcher: JoinHandle<()>,
    /// Dropping kills the process unless it was let go with [`Process::detach`].
    kill_on_drop: bool,
}

impl Process {
    /// Starts `cmd` so that it is SIGKILLed if this process dies, and begins watching it.
    /// Must be called inside a tokio runtime.
    pub async fn spawn(cmd: Command) -> Result<Process, ProcessError> {
        let options = SpawnOptions {
            die_with_parent: true,
            ..SpawnOptions::default()
        };
        Process::spawn_with(cmd, options).await
    }

    /// Starts `cmd` as `options` say and begins watching it. Must be called inside a tokio
    /// runtime.
    ///
    /// A jailed process is started in two steps, both in `pre_exec`: the forked child joins
    /// the cgroups, creates the namespaces and forks again with `CLONE_PARENT`, so the
    /// grandchild is PID 1 of the new PID namespace (unsharing one affects only later
    /// children) yet still a child of this process; the grandchild builds the jail and execs.
    /// The middle process writes the grandchild's pid into a pipe and exits.
    pub async fn spawn_with(
        mut cmd: Command,
        options: SpawnOptions,
    ) -> Result<Process, ProcessError> {
        let program = cmd.get_program().to_string_lossy().into_owned();
        let spawn_error = |source| ProcessError::Spawn {
            program: program.clone(),
            source,
        };
        match options.jail.clone() {
            None => install_plain(&mut cmd, &options),
            Some(jail) => {
                let (rx, tx) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
                    .map_err(|e| spawn_error(e.into()))?;
                install_jailed(&mut cmd, &options, jail.clone(), tx.as_raw_fd());
                let (reply, result) = oneshot::channel();
                on_spawner_thread(Box::new(move || {
                    let spawned = cmd.spawn();
                    // Close our write end so reading the pid pipe ends at EOF.
                    drop(cmd);
                    drop(tx);
                    let _ = reply.send(finish_jailed_spawn(spawned, rx));
                }))?;
                let pid = result
                    .await
                    .map_err(|_| ProcessError::SpawnerGone)?
                    .map_err(spawn_error)?;
                return Process::watch_child(pid);
            }
        }
        let (reply, result) = oneshot::channel();
        on_spawner_thread(Box::new(move || {
            let _ = reply.send(cmd.spawn());
        }))?;
        let child = result
            .await
            .map_err(|_| ProcessError::SpawnerGone)?
            .map_err(spawn_error)?;
        // The child is reaped through its pidfd from here on; `Child` has nothing left to do.
        Process::watch_child(child.id())
    }

    /// Watches a child of ours that has not been reaped (so `pid` still names it).
    fn watch_child(pid: u32) -> Result<Process, ProcessError> {
        let pidfd = match pidfd_open(pid) {
            Ok(fd) => fd,
            Err(err) => {
                // SAFETY: kill and waitpid take plain integers; `pid` is our unreaped child,
                // so it cannot name another process.
                unsafe {
                    libc::kill(pid as libc::pid_t, libc::SIGKILL);
                    libc::waitpid(pid as libc::pid_t, std::ptr::null_mut(), 0);
                }
                return Err(ProcessError::Pidfd(err));
            }
        };
        Process::watch(pid, pidfd)
    }

    /// Takes over a process that is not (or no longer known to be) our child, identified by a
    /// pidfd the caller opened and verified. Its exit is noticed through the pidfd; its exit
    /// status is known only if it happens to be our child, else it is
    /// [`ExitInfo::UNKNOWN`]. Dropping the result kills the process, like a spawned one.
    pub fn adopt(pid: u32, pidfd: OwnedFd) -> Result<Process, ProcessError> {
        Process::watch(pid, pidfd)
    }

    fn watch(pid: u32, pidfd: OwnedFd) -> Result<Process, ProcessError> {
        let (exit_tx, exit) = watch::channel(None);
        let watch_fd = pidfd.try_clone().map_err(ProcessError::Pidfd)?;
        let watcher = tokio::spawn(watch_exit(watch_fd, exit_tx));
        Ok(Process {
            pid,
            pidfd,
            exit,
            watcher,
            kill_on_drop: true,
        })
    }

    /// The process id (for logs; signal through [`Process::kill`]).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The pidfd, for callers that check on the process themselves.
    pub fn pidfd(&self) -> BorrowedFd<'_> {
        self.pidfd.as_fd()
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

    /// Lets the process go: dropping no longer kills it. If it is our child and exits while
    /// this process still runs, the watcher (which keeps running) reaps it, so no zombie
    /// stays.
    pub fn detach(&mut self) {
        self.kill_on_drop = false;
    }

    /// Whether [`Process::detach`] was called.
    pub fn is_detached(&self) -> bool {
        !self.kill_on_drop
    }

    /// Kills the process and waits (blocking, bounded) until it is gone, as dropping does.
    /// Afterwards dropping does nothing more.
    pub fn terminate_blocking(&mut self) {
        self.kill_on_drop = false;
        self.watcher.abort();
        if self.exit_status().is_some() {
            return;
        }
        let _ = self.kill();
        let mut fds = [PollFd::new(self.pidfd.as_fd(), PollFlags::POLLIN)];
        let _ = poll(&mut fds, PollTimeout::from(DROP_WAIT_MS));
        let _ = reap(self.pidfd.as_fd());
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if self.kill_on_drop {
            self.terminate_blocking();
        }
    }
}

/// `pre_exec` of a process started without a jail.
fn install_plain(cmd: &mut Command, options: &SpawnOptions) {
    let parent = std::process::id();
    let (die_with_parent, new_session) = (options.die_with_parent, options.new_session);
    // SAFETY: the closure runs in the forked child before exec and only makes
    // async-signal-safe calls (setsid, prctl, getppid) and builds errors from raw errno
    // values, which does not allocate.
    unsafe {
        cmd.pre_exec(move || {
            if new_session {
                nix::unistd::setsid()?;
            }
            if die_with_parent {
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
                // If we died between fork and prctl the signal will never come: give up now.
                if nix::unistd::getppid().as_raw() as u32 != parent {
                    return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
                }
            }
            Ok(())
        });
    }
}

/// `pre_exec` of a jailed process; `pid_pipe` is the write end of the pipe that carries the
/// grandchild's pid (4 bytes, native endian) and, if the jail could not be built, the number
/// of the failed step (1 byte).
fn install_jailed(
    cmd: &mut Command,
    options: &SpawnOptions,
    jail: Arc<crate::jail::Prepared>,
    pid_pipe: i32,
) {
    let (die_with_parent, new_session) = (options.die_with_parent, options.new_session);
    let own = own_pidfd().map(|fd| fd.as_raw_fd());
    // SAFETY: the closure runs in the forked child before exec. Everything it touches was
    // allocated before the fork (`jail` holds C strings and open descriptors); it makes only
    // raw system calls (setsid, write, unshare, clone, mount, pivot_root, mknod, chown,
    // setres[ug]id, prctl, poll, _exit) and builds errors from errno values, which does not
    // allocate. The clone is a raw `clone(2)` without a new stack, i.e. a fork of this
    // single-threaded child, so the grandchild runs on its own copy of this stack.
    unsafe {
        cmd.pre_exec(move || {
            let errno = || std::io::Error::last_os_error();
            if new_session && libc::setsid() < 0 {
                return Err(errno());
            }
            if let Err((step, err)) = jail.enter_cgroups() {
                // No grandchild: pid 0, then the step.
                let b = [0, 0, 0, 0, step];
                libc::write(pid_pipe, b.as_ptr().cast(), 5);
                return Err(err);
            }
            if libc::unshare(crate::jail::NAMESPACES) < 0 {
                return Err(errno());
            }
            let pid = libc::syscall(
                libc::SYS_clone,
                (libc::CLONE_PARENT | libc::SIGCHLD) as libc::c_ulong,
                0usize,
                0usize,
                0usize,
                0usize,
            );
            if pid < 0 {
                return Err(errno());
            }
            if pid > 0 {
                // The middle process: report the grandchild and leave. Its exit does not
                // close the exec-status pipe of `Command`: the grandchild holds it until exec.
                let bytes = (pid as u32).to_ne_bytes();
                let ok = libc::write(pid_pipe, bytes.as_ptr().cast(), 4) == 4;
                libc::_exit(if ok { 0 } else { 1 });
            }
            // PID 1 of the new namespaces.
            if let Err((step, err)) = jail.confine() {
                let b = [step];
                libc::write(pid_pipe, b.as_ptr().cast(), 1);
                return Err(err);
            }
            if die_with_parent {
                // After the user switch: changing credentials clears the death signal.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) < 0 {
                    return Err(errno());
                }
                if let Some(fd) = own {
                    let mut p = libc::pollfd {
                        fd,
                        events: libc::POLLIN,
                        revents: 0,
                    };
                    // Readable means the node already exited: the signal will never come.
                    if libc::poll(&mut p, 1, 0) != 0 {
                        return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
                    }
                }
            }
            Ok(())
        });
    }
}

/// Collects the grandchild's pid after `Command::spawn` of a jailed process returned, reaps
/// the middle process, and turns a failed jail step into a readable error.
fn finish_jailed_spawn(
    spawned: std::io::Result<std::process::Child>,
    rx: OwnedFd,
) -> std::io::Result<u32> {
    let mut middle = match spawned {
        Ok(c) => Some(c),
        Err(e) => {
            // The grandchild may exist and have failed; it is our child: reap it. Its pid and
            // failed step are in the pipe (every writer has exited by now).
            let mut buf = [0u8; 5];
            let n = read_all(&rx, &mut buf);
            let pid = u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]);
            if n >= 4 && pid != 0 {
                // SAFETY: waitpid takes plain integers; the pid is our unreaped child.
                unsafe { libc::waitpid(pid as libc::pid_t, std::ptr::null_mut(), 0) };
            }
            if n == 5 {
                let step = crate::jail::step_name(buf[4]);
                return Err(std::io::Error::new(e.kind(), format!("jail: {step}: {e}")));
            }
            return Err(e);
        }
    };
    let mut buf = [0u8; 4];
    let n = read_all(&rx, &mut buf[..]);
    if let Some(m) = middle.as_mut() {
        let _ = m.wait();
    }
    if n != 4 {
        return Err(std::io::Error::other(
            "the jail launcher exited without reporting the VMM's pid",
        ));
    }
    Ok(u32::from_ne_bytes(buf))
}

/// Reads until `buf` is full or EOF; returns the count.
fn read_all(fd: &OwnedFd, buf: &mut [u8]) -> usize {
    let mut n = 0;
    while n < buf.len() {
        match nix::unistd::read(fd.as_raw_fd(), &mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => break,
        }
    }
    n
}

/// Collects the exit status of a process that has exited (or reports it still running).
/// Only a child of ours has a status to collect; for others (adopted processes) the status
/// is unknown, and the pidfd becoming readable is what says they exited.
fn reap(pidfd: BorrowedFd<'_>) -> Option<ExitInfo> {
    // SAFETY: an all-zero siginfo_t is a valid value of this plain C struct.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: waitid writes only into `info`, which outlives the call; the pidfd is open.
    let rc = unsafe {
        libc::waitid(
            libc::P_PIDFD,
            pidfd.as_raw_fd() as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG,
        )
    };
    if rc < 0 {
        // ECHILD: not our child (adopted) or reaped elsewhere. Callers ask only once the
        // pidfd said the process exited.
        return Some(ExitInfo::UNKNOWN);
    }
    // SAFETY: after a successful waitid the kernel filled si_pid (0 if nothing exited yet)
    // and, for an exited child, si_status.
    let (pid, status) = unsafe { (info.si_pid(), info.si_status()) };
    if pid == 0 {
        return None;
    }
    Some(match info.si_code {
        libc::CLD_EXITED => ExitInfo {
            code: Some(status),
            signal: None,
        },
        _ => ExitInfo {
            code: None,
            signal: Some(status),
        },
    })
}

/// Whether the process behind `pidfd` has exited (the pidfd is readable).
pub(crate) fn pidfd_exited(pidfd: BorrowedFd<'_>) -> bool {
    let mut fds = [PollFd::new(pidfd, PollFlags::POLLIN)];
    matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0)
}

async fn watch_exit(pidfd: OwnedFd, exit: watch::Sender<Option<ExitInfo>>) {
    // SAFETY: the pidfd is an `OwnedFd` moved into the `AsyncFd`, so it stays open and refers
    // to the same process for as long as the registration exists.
    let registered = unsafe { AsyncFd::register_with_interest(pidfd, Interest::READABLE) };
    let info = match registered {
        Ok(fd) => loop {
            let Ok(mut guard) = fd.readable().await else {
                break ExitInfo::UNKNOWN;
            };
            match reap(fd.get_ref().as_fd()) {
                Some(info) => break info,
                None => guard.clear_ready(),
            }
        },
        Err(e) => {
            // Without epoll support for the pidfd, ask it with poll(2) now and then.
            let (pidfd, _) = e.into_parts();
            loop {
                if pidfd_exited(pidfd.as_fd()) {
                    if let Some(info) = reap(pidfd.as_fd()) {
                        break info;
                    }
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
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
