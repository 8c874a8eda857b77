//! Host memory of a process, as `/proc` reports it: RSS from `status`, and from `smaps_rollup`
//! (when the kernel has it and we may read it) PSS and how PSS splits into anonymous memory and
//! file pages. A QEMU guest's RAM is a shared file mapping, so its touched pages count as file
//! pages; QEMU's own heap is anonymous. And the CPU time of each thread of a process, for what
//! idle sandboxes cost.

use anyhow::{Context as _, Result};

/// One process's memory, in KiB.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcMem {
    /// Resident set (`VmRSS`).
    pub rss_kib: u64,
    /// Proportional set size: shared pages divided among the processes that map them.
    pub pss_kib: Option<u64>,
    /// The anonymous part of PSS.
    pub pss_anon_kib: Option<u64>,
    /// The file-backed part of PSS (guest RAM file, binaries, libraries).
    pub pss_file_kib: Option<u64>,
}

/// Reads the memory of `pid` (`"self"` for this process).
pub fn read(pid: &str) -> Result<ProcMem> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let rss_kib =
        field_kib(&status, "VmRSS").with_context(|| format!("no VmRSS in /proc/{pid}/status"))?;
    let mut mem = ProcMem {
        rss_kib,
        ..Default::default()
    };
    if let Ok(rollup) = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")) {
        mem.pss_kib = field_kib(&rollup, "Pss");
        mem.pss_anon_kib = field_kib(&rollup, "Pss_Anon");
        mem.pss_file_kib = field_kib(&rollup, "Pss_File");
    }
    Ok(mem)
}

/// `MemAvailable` of `/proc/meminfo`, in KiB.
pub fn mem_available_kib() -> Option<u64> {
    field_kib(
        &std::fs::read_to_string("/proc/meminfo").ok()?,
        "MemAvailable",
    )
}

/// The value of a `Name:   123 kB` line.
fn field_kib(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        if k.trim() != name {
            return None;
        }
        v.split_whitespace().next()?.parse().ok()
    })
}

/// CPU time (user + system, in clock ticks) each thread of process `pid` has used, with the
/// thread's name. Threads that end while being read are left out.
pub fn thread_ticks(pid: &str) -> Result<Vec<(String, u64)>> {
    let dir = format!("/proc/{pid}/task");
    let mut out = Vec::new();
    for task in std::fs::read_dir(&dir).with_context(|| format!("reading {dir}"))? {
        let path = task?.path().join("stat");
        let Ok(stat) = std::fs::read_to_string(&path) else {
            continue;
        };
        // `pid (comm) state ...`: the name may hold spaces and parentheses.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let name = stat[open + 1..close].to_owned();
        let fields: Vec<&str> = stat[close + 2..].split_whitespace().collect();
        // utime and stime are fields 14 and 15 of the line, 11 and 12 after the name.
        let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok());
        if let (Some(u), Some(s)) = (ticks(11), ticks(12)) {
            out.push((name, u + s));
        }
    }
    Ok(out)
}

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`).
pub fn clock_ticks_per_second() -> u64 {
    // SAFETY: sysconf takes a constant and returns a value or -1; no memory is involved.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as u64
    } else {
        100
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_rollup_fields() {
        let text = "55d0-7ffd ---p 00000000 00:00 0  [rollup]\nRss:  272160 kB\nPss:  \
                    270001 kB\nPss_Anon:  20480 kB\nPss_File:  249521 kB\nPss_Shmem: 0 kB\n";
        assert_eq!(field_kib(text, "Pss"), Some(270_001));
        assert_eq!(field_kib(text, "Pss_Anon"), Some(20_480));
        assert_eq!(field_kib(text, "Pss_File"), Some(249_521));
        assert_eq!(field_kib(text, "Pss_Dirty"), None);
    }

    #[test]
    fn reads_this_process() {
        let me = read("self").unwrap();
        assert!(me.rss_kib > 0);
        assert!(mem_available_kib().is_some());
    }
}
