//! What the header of every run says about the host: time, kernel banner of the guest kernel,
//! CPU, load, and the signals that end a run early.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

/// Resolves on Ctrl-C, SIGTERM or SIGHUP, with the signal's name.
pub async fn shutdown_signal() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut hup)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) else {
        let _ = tokio::signal::ctrl_c().await;
        return "SIGINT";
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => "SIGINT",
        _ = term.recv() => "SIGTERM",
        _ = hup.recv() => "SIGHUP",
    }
}

/// The `Linux version ...` banner embedded in a kernel image.
pub fn kernel_version(path: &Path) -> Option<String> {
    let bytes = std::fs::read(path).ok()?;
    banner(&bytes)
}

fn banner(bytes: &[u8]) -> Option<String> {
    let needle = b"Linux version ";
    let start = bytes.windows(needle.len()).position(|w| w == needle)?;
    let rest = &bytes[start..];
    let end = rest
        .iter()
        .position(|&b| b == 0 || b == b'\n')
        .unwrap_or(rest.len())
        .min(160);
    let text = String::from_utf8_lossy(&rest[..end]);
    // "Linux version 6.1.x (builder@host) (compiler ...) #1 ...": the first three words say
    // enough.
    Some(
        text.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
    )
}

/// The three load averages of `/proc/loadavg`, space-separated.
pub fn load_average() -> String {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    load.split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The first lines of a group's output: its title with the time, the accelerator (and why),
/// and the QEMU version.
pub fn print_run_start(
    title: &str,
    accel: &space_runtime::accel::Decision,
    qemu: &dyn std::fmt::Display,
) {
    println!("{title} {}", utc_timestamp(SystemTime::now()));
    println!(
        "accelerator: {} ({})",
        accel.accel.as_str().to_uppercase(),
        accel.reason
    );
    println!("QEMU:        {qemu}");
}

/// CPU model, CPU count, kernel release and load of the host.
pub fn host_summary() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == "model name").then(|| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!(
        "{model}, {cpus} CPUs, Linux {}, load average {}",
        release.trim(),
        load_average()
    )
}

/// `YYYY-MM-DD HH:MM:SS UTC` for a point in time.
pub fn utc_timestamp(t: SystemTime) -> String {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Proleptic Gregorian date of a day count since 1970-01-01 (the era-based method: 400-year
/// eras of 146097 days, years starting in March so the leap day comes last).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(59), (1970, 3, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
        let t = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(utc_timestamp(t), "2023-11-14 22:13:20 UTC");
    }

    #[test]
    fn finds_the_kernel_banner() {
        let mut image = vec![0u8; 64];
        image.extend_from_slice(
            b"Linux version 6.1.119 (root@build) (gcc (Debian 12.2.0-14) 12.2.0) #1 SMP\n\0",
        );
        assert_eq!(banner(&image).as_deref(), Some("Linux version 6.1.119"));
        assert_eq!(banner(b"no banner here"), None);
    }
}
