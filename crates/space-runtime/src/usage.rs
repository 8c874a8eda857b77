//! What a VM costs the host, for metrics: CPU time and memory of its VMM, from its cgroup when
//! it has one (every thread and child of the VMM counted, page cache of its RAM file
//! included), else from `/proc/<pid>`.

use std::path::Path;

use crate::cgroup::Cgroup;

/// A VMM's use of the host as of now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostUsage {
    /// CPU time since the VMM started, all threads, nanoseconds.
    pub cpu_ns: u64,
    /// Memory charged to it now, bytes (the cgroup's, or the process's resident set).
    pub memory_bytes: u64,
}

/// The use of the VMM `pid`, in `cgroup` when it has one. `None` once the process is gone.
pub fn of_vm(pid: u32, cgroup: Option<&Cgroup>) -> Option<HostUsage> {
    if let Some(u) = cgroup.and_then(of_cgroup) {
        return Some(u);
    }
    of_process(pid)
}

/// Under v2 `cpu.stat`'s `usage_usec` and `memory.current`; under v1 `cpuacct.usage` and
/// `memory.usage_in_bytes`. `None` when the files are not there.
fn of_cgroup(cg: &Cgroup) -> Option<HostUsage> {
    let mut cpu = None;
    let mut memory = None;
    for dir in &cg.dirs {
        if let Ok(stat) = std::fs::read_to_string(dir.join("cpu.stat")) {
            if let Some(us) = field(&stat, "usage_usec") {
                cpu = Some(us.saturating_mul(1000));
            }
        }
        if cpu.is_none() {
            cpu = number(&dir.join("cpuacct.usage"));
        }
        memory = memory
            .or_else(|| number(&dir.join("memory.current")))
            .or_else(|| number(&dir.join("memory.usage_in_bytes")));
    }
    Some(HostUsage {
        cpu_ns: cpu?,
        memory_bytes: memory?,
    })
}

/// `utime + stime` of `/proc/<pid>/stat` (and its waited-for children's) and the resident
/// set of `/proc/<pid>/statm`.
pub fn of_process(pid: u32) -> Option<HostUsage> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: fields count from after it.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_ascii_whitespace().collect();
    // After the name: state(0) ... utime(11) stime(12) cutime(13) cstime(14).
    let ticks: u64 = (11..=14)
        .map(|i| {
            fields
                .get(i)
                .and_then(|f| f.parse::<u64>().ok())
                .unwrap_or(0)
        })
        .sum();
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
    let pages: u64 = statm.split_ascii_whitespace().nth(1)?.parse().ok()?;
    Some(HostUsage {
        cpu_ns: ticks.saturating_mul(1_000_000_000 / clock_ticks()),
        memory_bytes: pages.saturating_mul(page_size()),
    })
}

fn field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

fn number(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn clock_ticks() -> u64 {
    // SAFETY: sysconf only reads a configuration value.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as u64
    } else {
        100
    }
}

fn page_size() -> u64 {
    // SAFETY: sysconf only reads a configuration value.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as u64
    } else {
        4096
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_uses_cpu_and_memory() {
        let pid = std::process::id();
        let before = of_vm(pid, None).unwrap();
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while t.elapsed() < std::time::Duration::from_millis(300) {
            x = x.wrapping_mul(31).wrapping_add(7);
        }
        std::hint::black_box(x);
        let after = of_vm(pid, None).unwrap();
        assert!(after.cpu_ns > before.cpu_ns, "{before:?} {after:?}");
        assert!(after.memory_bytes > 0);
        assert!(of_process(u32::MAX).is_none());
    }

    #[test]
    fn cgroup_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("cpu.stat"),
            "usage_usec 1500\nuser_usec 1000\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("memory.current"), "4096\n").unwrap();
        let cg = Cgroup {
            dirs: vec![dir.path().to_owned()],
        };
        assert_eq!(
            of_cgroup(&cg),
            Some(HostUsage {
                cpu_ns: 1_500_000,
                memory_bytes: 4096
            })
        );
        std::fs::remove_file(dir.path().join("memory.current")).unwrap();
        assert_eq!(of_cgroup(&cg), None);
    }
}
