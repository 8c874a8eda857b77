//! `GET /v1/stats`: what the guest kernel counts of CPU, memory and the root filesystem, read
//! from `/proc/stat`, `/proc/meminfo` and `statfs("/")`. The host samples it every few seconds
//! for the sandbox's metrics, so it reads two small files and makes one system call.

use nix::sys::statvfs::statvfs;
use space_proto::{GuestStats, ProtoError};

use crate::body::{ok_json, HandlerResult};

pub async fn stats() -> HandlerResult {
    let stats = tokio::task::spawn_blocking(read)
        .await
        .map_err(|e| ProtoError::internal(format!("reading stats: {e}")))??;
    ok_json(&stats)
}

fn read() -> Result<GuestStats, ProtoError> {
    let stat = std::fs::read_to_string("/proc/stat")
        .map_err(|e| ProtoError::internal(format!("/proc/stat: {e}")))?;
    let meminfo = std::fs::read_to_string("/proc/meminfo")
        .map_err(|e| ProtoError::internal(format!("/proc/meminfo: {e}")))?;
    let mut s = GuestStats::default();
    cpu(&stat, &mut s);
    memory(&meminfo, &mut s);
    if let Ok(fs) = statvfs("/") {
        let frag = fs.fragment_size();
        s.disk_total_bytes = fs.blocks().saturating_mul(frag);
        let free = fs.blocks_free().saturating_mul(frag);
        s.disk_used_bytes = s.disk_total_bytes.saturating_sub(free);
    }
    Ok(s)
}

/// The `cpu` line (all CPUs) and the number of `cpuN` lines of `/proc/stat`.
fn cpu(stat: &str, s: &mut GuestStats) {
    for line in stat.lines() {
        let mut parts = line.split_ascii_whitespace();
        let Some(name) = parts.next() else { continue };
        if name == "cpu" {
            // user nice system idle iowait irq softirq steal (guest time is inside user).
            let v: Vec<u64> = parts.take(8).map(|p| p.parse().unwrap_or(0)).collect();
            let at = |i: usize| v.get(i).copied().unwrap_or(0);
            s.cpu_total_ticks = v.iter().sum();
            s.cpu_busy_ticks = s.cpu_total_ticks - at(3) - at(4);
        } else if name.starts_with("cpu") {
            s.cpu_count += 1;
        }
    }
}

/// `MemTotal`, `MemAvailable`, `Cached` and `Buffers` of `/proc/meminfo` (in kB there).
fn memory(meminfo: &str, s: &mut GuestStats) {
    for line in meminfo.lines() {
        let Some((key, rest)) = line.split_once(':') else {
            continue;
        };
        let kb: u64 = rest
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .unwrap_or(0);
        let bytes = kb.saturating_mul(1024);
        match key {
            "MemTotal" => s.mem_total_bytes = bytes,
            "MemAvailable" => s.mem_available_bytes = bytes,
            "Cached" | "Buffers" => s.mem_cache_bytes += bytes,
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_files() {
        let mut s = GuestStats::default();
        cpu(
            "cpu  100 5 50 800 20 3 2 0 0 0\ncpu0 50 2 25 400 10 1 1 0 0 0\n\
             cpu1 50 3 25 400 10 2 1 0 0 0\nintr 1 2 3\n",
            &mut s,
        );
        assert_eq!(s.cpu_count, 2);
        assert_eq!(s.cpu_total_ticks, 980);
        assert_eq!(s.cpu_busy_ticks, 160);
        memory(
            "MemTotal:         500000 kB\nMemFree:  1000 kB\nMemAvailable:     300000 kB\n\
             Buffers:            1000 kB\nCached:            20000 kB\nSwapCached: 5 kB\n",
            &mut s,
        );
        assert_eq!(s.mem_total_bytes, 500_000 * 1024);
        assert_eq!(s.mem_available_bytes, 300_000 * 1024);
        assert_eq!(s.mem_cache_bytes, 21_000 * 1024);
    }

    #[test]
    fn reads_this_machine() {
        let s = read().unwrap();
        assert!(s.cpu_count >= 1);
        assert!(s.cpu_total_ticks >= s.cpu_busy_ticks);
        assert!(s.mem_total_bytes > 0 && s.mem_available_bytes <= s.mem_total_bytes);
        assert!(s.disk_total_bytes >= s.disk_used_bytes);
    }
}
