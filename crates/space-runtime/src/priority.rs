//! CPU priority of a VMM: live sandboxes at normal priority, VMs being made ahead of demand
//! (warm-pool members) in the background, so that making them never slows a sandbox someone
//! uses.
//!
//! Where the scheduler compares a VM with the others decides what to change:
//!
//! - **A VM in its own cgroup** (the jail's) competes with its sibling cgroups by the cgroup's
//!   weight (`cpu.weight` under v2, `cpu.shares` under v1); the nice values of its threads only
//!   order them among themselves. So the weight is what changes.
//! - **A VM without a cgroup** competes through its threads' nice values. When it leads its own
//!   session (a detached VMM) and the kernel groups tasks by session (`autogroup`), its
//!   threads share one scheduling entity whose weight is the autogroup's nice, so that is set
//!   too. A VMM that shares the node's session never has the autogroup touched: that would
//!   change the node's own priority.
//!
//! Nice is per thread on Linux: every thread of the process is changed, and threads made
//! later inherit their creator's value.

use std::path::Path;

use crate::cgroup::Cgroup;

/// How a VM is scheduled against the others.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Priority {
    /// Like any process (nice 0, the default cgroup weight).
    #[default]
    Normal,
    /// Runs when live work leaves CPU over (nice 10, a tenth of the default weight).
    Background,
}

impl Priority {
    /// The nice value of the VMM's threads.
    pub fn nice(self) -> i32 {
        match self {
            Priority::Normal => 0,
            Priority::Background => 10,
        }
    }

    /// `cpu.weight` (cgroup v2; default 100).
    pub fn cpu_weight(self) -> u32 {
        match self {
            Priority::Normal => 100,
            Priority::Background => 10,
        }
    }

    /// `cpu.shares` (cgroup v1; default 1024).
    pub fn cpu_shares(self) -> u32 {
        match self {
            Priority::Normal => 1024,
            Priority::Background => 102,
        }
    }
}

/// Sets the priority of process `pid`, which runs in `cgroup` if it has one of its own.
pub fn apply(pid: u32, cgroup: Option<&Cgroup>, priority: Priority) -> std::io::Result<()> {
    match cgroup {
        Some(cg) => set_cgroup_weight(cg, priority),
        None => set_process_nice(pid, priority.nice()),
    }
}

fn set_cgroup_weight(cg: &Cgroup, priority: Priority) -> std::io::Result<()> {
    let mut written = false;
    for dir in &cg.dirs {
        let (file, value) = if dir.join("cpu.weight").exists() {
            ("cpu.weight", priority.cpu_weight())
        } else if dir.join("cpu.shares").exists() {
            ("cpu.shares", priority.cpu_shares())
        } else {
            continue;
        };
        std::fs::write(dir.join(file), value.to_string())?;
        written = true;
    }
    if written {
        Ok(())
    } else {
        Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "the VM's cgroup has no CPU controller",
        ))
    }
}

fn set_process_nice(pid: u32, nice: i32) -> std::io::Result<()> {
    // SAFETY: getsid takes a pid and returns a session id or -1; no memory is involved.
    let sid = unsafe { libc::getsid(pid as libc::pid_t) };
    if sid == pid as libc::pid_t {
        let autogroup = format!("/proc/{pid}/autogroup");
        if Path::new(&autogroup).exists() {
            std::fs::write(&autogroup, nice.to_string())?;
        }
    }
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))?;
    for task in tasks {
        let Some(tid) = task?
            .file_name()
            .to_str()
            .and_then(|t| t.parse::<libc::id_t>().ok())
        else {
            continue;
        };
        // SAFETY: setpriority takes plain integers. A thread that ended since the listing
        // makes it fail with ESRCH, which is ignored below; a tid cannot be reused by another
        // process while `pid` is alive and unreaped, since it is in `pid`'s own task list.
        let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, nice) };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::ESRCH) {
                return Err(e);
            }
        }
    }
    Ok(())
}

/// The nice value of thread `tid` (`/proc/<tid>/stat`, field 19), for checks.
pub fn thread_nice(pid: u32, tid: u32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: fields count from after it.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(16)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_process_is_niced_and_restored() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        apply(pid, None, Priority::Background).unwrap();
        assert_eq!(thread_nice(pid, pid), Some(10));
        // Raising it back needs CAP_SYS_NICE; only check when we have it.
        // SAFETY: geteuid has no arguments and cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            apply(pid, None, Priority::Normal).unwrap();
            assert_eq!(thread_nice(pid, pid), Some(0));
        }
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn a_gone_process_is_an_error() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert!(apply(pid, None, Priority::Background).is_err());
    }
}
