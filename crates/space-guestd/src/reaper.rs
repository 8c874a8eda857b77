//! The one place that calls `waitpid`.
//!
//! As PID 1 the daemon inherits every orphan in the guest and must reap them, but a blanket
//! `waitpid(-1)` would steal the exit status of processes that exec is waiting for. So a single
//! reaper, woken by SIGCHLD, reaps everything and hands each status to whoever registered that
//! pid; statuses nobody asked for (orphans) are dropped.
//!
//! Spawning happens under the same lock as reaping. That closes two races: a child that exits
//! before its pid is registered cannot be reaped unclaimed, and the standard library's own
//! `waitpid` on a child whose `exec` failed cannot lose its status to the reaper. The lock also
//! makes signalling a process group safe: while a pid is registered it has not been reaped, so
//! the pid cannot have been reused.

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{killpg, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use space_proto::ExitStatus;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::oneshot;

/// Longest a child's exit status waits to be reaped when its SIGCHLD was lost.
const SAFETY_TICK: Duration = Duration::from_secs(30);

/// Errors of the reaper itself.
#[derive(Debug, thiserror::Error)]
pub enum ReaperError {
    #[error("cannot install the SIGCHLD handler")]
    Signal(#[source] io::Error),
    #[error("no such process")]
    NoSuchProcess,
    #[error("kill failed")]
    Kill(#[source] Errno),
}

/// Resolves with the exit status of one registered child.
pub type ExitWaiter = oneshot::Receiver<ExitStatus>;

pub struct Reaper {
    waiters: Mutex<HashMap<i32, oneshot::Sender<ExitStatus>>>,
}

/// Converts a wait status to the wire form: a signal death reports 128 + signal as its code.
pub fn exit_status_of(status: WaitStatus) -> Option<ExitStatus> {
    match status {
        WaitStatus::Exited(_, code) => Some(ExitStatus {
            exit_code: Some(code),
            signal: None,
            timed_out: false,
        }),
        WaitStatus::Signaled(_, sig, _) => Some(ExitStatus {
            exit_code: Some(128 + sig as i32),
            signal: Some(sig as i32),
            timed_out: false,
        }),
        _ => None,
    }
}

impl Reaper {
    /// Creates the reaper and starts its task. Must run inside the tokio runtime, before the
    /// first child is spawned.
    pub fn start() -> Result<Arc<Reaper>, ReaperError> {
        let reaper = Arc::new(Reaper {
            waiters: Mutex::new(HashMap::new()),
        });
        let mut sigchld = signal(SignalKind::child()).map_err(ReaperError::Signal)?;
        let r = reaper.clone();
        tokio::spawn(async move {
            loop {
                // SIGCHLD coalesces, and a status can in theory slip between a reap pass and
                // the next signal; the slow tick bounds how long such a status can wait. It is
                // slow on purpose: an idle guest should not wake (every wake of an emulated
                // CPU costs the host), and the signal, not the tick, is what reaps in practice.
                let _ = tokio::time::timeout(SAFETY_TICK, sigchld.recv()).await;
                r.reap_all();
            }
        });
        Ok(reaper)
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<i32, oneshot::Sender<ExitStatus>>> {
        self.waiters.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `spawn` (which returns the child's pid and whatever else it made) under the reaper
    /// lock and registers the pid. Blocking: call from `spawn_blocking`.
    pub fn spawn<T>(
        &self,
        spawn: impl FnOnce() -> io::Result<(u32, T)>,
    ) -> io::Result<(u32, T, ExitWaiter)> {
        let mut waiters = self.lock();
        let (pid, extra) = spawn()?;
        let (tx, rx) = oneshot::channel();
        waiters.insert(pid as i32, tx);
        Ok((pid, extra, rx))
    }

    /// Reaps every child that has exited.
    pub fn reap_all(&self) {
        let mut waiters = self.lock();
        loop {
            match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) => break,
                Ok(status) => {
                    let Some(pid) = status.pid() else { continue };
                    if let Some(tx) = waiters.remove(&pid.as_raw()) {
                        if let Some(exit) = exit_status_of(status) {
                            let _ = tx.send(exit);
                        }
                    }
                }
                Err(Errno::EINTR) => continue,
                // ECHILD: no children left.
                Err(_) => break,
            }
        }
    }

    /// Sends `sig` to the process group led by `pid`, if `pid` is a child that has not been
    /// reaped yet.
    pub fn signal_group(&self, pid: u32, sig: Signal) -> Result<(), ReaperError> {
        let waiters = self.lock();
        if !waiters.contains_key(&(pid as i32)) {
            return Err(ReaperError::NoSuchProcess);
        }
        match killpg(Pid::from_raw(pid as i32), sig) {
            Ok(()) => Ok(()),
            // The leader is a zombie and the group is empty: nothing left to signal.
            Err(Errno::ESRCH) => Ok(()),
            Err(e) => Err(ReaperError::Kill(e)),
        }
    }
}
