//! `space-bench`: measures the sandbox runtime on this host and prints tables (p50/p90/p99,
//! mean, n). It never asserts on timing; the numbers are for reading and quoting.
//!
//! ```text
//! source target/space/env.sh && cargo run --release -p space-bench -- [--runs N]
//!     [--only boot,snapshot,restore,pause,exec,files] [--dir DIR | --no-btrfs]
//! ```

use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context as _, Result};
use clap::Parser;
use space_runtime::{accel, cow, CloneMethod, QemuRuntime, QemuRuntimeConfig};

use space_bench::bench::{Bench, Group, Plan};
use space_bench::scratch::Scratch;

/// Measures boot, snapshot, restore, pause/resume, exec and file transfer of space sandboxes.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    /// Runs per measurement (exec and 4 KiB files run 5x this, large files half of it).
    #[arg(long, default_value_t = 20)]
    runs: usize,
    /// Only these groups (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',')]
    only: Vec<Group>,
    /// Put sandboxes in a fresh directory inside DIR instead of a loop-mounted btrfs image.
    #[arg(long, value_name = "DIR", conflicts_with = "no_btrfs")]
    dir: Option<PathBuf>,
    /// Use a plain directory under /var/tmp (the root filesystem) instead of a btrfs image,
    /// to show the copy fallback where reflinks are not available.
    #[arg(long)]
    no_btrfs: bool,
    /// Guest kernel (uncompressed vmlinux).
    #[arg(long, env = "SPACE_KERNEL")]
    kernel: PathBuf,
    /// Root disk image the guests boot.
    #[arg(long, env = "SPACE_ROOTFS_MINIMAL")]
    rootfs: PathBuf,
    /// vCPUs per guest.
    #[arg(long, default_value_t = 1)]
    vcpus: u32,
    /// Guest RAM in MiB.
    #[arg(long, default_value_t = 256)]
    memory_mib: u64,
    /// QEMU binary.
    #[arg(long, default_value = "qemu-system-x86_64")]
    qemu: PathBuf,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("space-bench: starting tokio: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("space-bench: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<()> {
    for (what, path) in [("kernel", &cli.kernel), ("root image", &cli.rootfs)] {
        if !path.is_file() {
            bail!(
                "{what} {} does not exist; build the artifacts and `source target/space/env.sh`",
                path.display()
            );
        }
    }
    let groups = if cli.only.is_empty() {
        vec![
            Group::Boot,
            Group::Snapshot,
            Group::Restore,
            Group::Pause,
            Group::Exec,
            Group::Files,
        ]
    } else {
        cli.only.clone()
    };

    let mut scratch = if cli.no_btrfs {
        Scratch::plain(Some(Path::new("/var/tmp")))?
    } else if let Some(dir) = &cli.dir {
        Scratch::plain(Some(dir))?
    } else {
        Scratch::btrfs().context("setting up the btrfs scratch image (or pass --no-btrfs)")?
    };
    // Everything that can fail or be interrupted runs inside `measured`; the scratch area is
    // cleaned up after it either way. Dropping the future on a signal drops every VM handle,
    // which kills its QEMU.
    let measured = async {
        tokio::select! {
            r = measure(&cli, groups, &scratch) => r,
            s = shutdown_signal() => Err(anyhow!("interrupted by {s}")),
        }
    };
    let result = measured.await;
    let cleaned = tokio::task::block_in_place(|| scratch.cleanup());
    match (result, cleaned) {
        (Ok(()), Ok(())) => Ok(()),
        (Err(e), Ok(())) => Err(e),
        (Ok(()), Err(c)) => Err(c),
        (Err(e), Err(c)) => Err(e.context(format!("also: {c:#}"))),
    }
}

async fn measure(cli: &Cli, groups: Vec<Group>, scratch: &Scratch) -> Result<()> {
    let decision = accel::detect()?;
    let rt = QemuRuntime::new(QemuRuntimeConfig {
        qemu: cli.qemu.clone(),
        accel: Some(decision.accel),
        ..Default::default()
    })
    .await?;

    // The template image lives in the scratch area so boots clone it the way production
    // clones a template (reflink on btrfs).
    let root = scratch.root().to_owned();
    let rootfs = root.join("template-rootfs.ext4");
    let t = Instant::now();
    let (src, dst) = (cli.rootfs.clone(), rootfs.clone());
    tokio::task::spawn_blocking(move || cow::clone_file(&src, &dst))
        .await?
        .context("copying the root image into the scratch area")?;
    let staged = t.elapsed();
    let probe = root.join("clone-probe");
    let (src, dst) = (rootfs.clone(), probe.clone());
    let t = Instant::now();
    let method = tokio::task::spawn_blocking(move || cow::clone_file(&src, &dst))
        .await?
        .context("probing how files clone in the scratch area")?;
    let probe_time = t.elapsed();
    std::fs::remove_file(&probe)?;

    let image_size = std::fs::metadata(&cli.rootfs)?.len();
    println!("space-bench {}", utc_timestamp(SystemTime::now()));
    println!(
        "accelerator: {} ({})",
        decision.accel.as_str().to_uppercase(),
        decision.reason
    );
    println!("QEMU:        {}", rt.version());
    println!(
        "guest:       {} vCPU, {} MiB RAM; kernel {} ({})",
        cli.vcpus,
        cli.memory_mib,
        cli.kernel.display(),
        kernel_version(&cli.kernel).unwrap_or_else(|| "version string not found".into())
    );
    println!(
        "root image:  {} ({} MiB)",
        cli.rootfs.display(),
        image_size >> 20
    );
    println!("host:        {}", host_summary());
    println!("scratch:     {}", scratch.describe());
    println!(
        "clone:       {} ({} MiB image cloned in {:.1} ms; staged into scratch in {:.0} ms)",
        match method {
            CloneMethod::Reflink => "reflink (FICLONE, extents shared)",
            CloneMethod::SparseCopy => "sparse copy fallback (no reflink on this filesystem)",
        },
        image_size >> 20,
        probe_time.as_secs_f64() * 1e3,
        staged.as_secs_f64() * 1e3
    );
    println!(
        "runs:        {} (exec and 4 KiB files {}, large files {})",
        cli.runs,
        cli.runs * 5,
        (cli.runs / 2).max(1)
    );
    println!();

    let plan = Plan {
        runs: cli.runs,
        groups,
        qemu: cli.qemu.clone(),
        kernel: cli.kernel.clone(),
        rootfs,
        vcpus: cli.vcpus,
        memory_mib: cli.memory_mib,
        root,
    };
    Bench::new(&plan, &rt).run().await
}

/// Resolves on Ctrl-C, SIGTERM or SIGHUP, with the signal's name.
async fn shutdown_signal() -> &'static str {
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
fn kernel_version(path: &Path) -> Option<String> {
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

/// CPU model, CPU count, kernel release and load of the host.
fn host_summary() -> String {
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
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    format!(
        "{model}, {cpus} CPUs, Linux {}, load average {}",
        release.trim(),
        load.join(" ")
    )
}

/// `YYYY-MM-DD HH:MM:SS UTC` for a point in time.
fn utc_timestamp(t: SystemTime) -> String {
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

    #[test]
    fn cli_parses_groups() {
        let cli = Cli::try_parse_from([
            "space-bench",
            "--kernel",
            "/k",
            "--rootfs",
            "/r",
            "--only",
            "restore,exec",
            "--runs",
            "3",
        ])
        .unwrap();
        assert_eq!(cli.only, [Group::Restore, Group::Exec]);
        assert_eq!(cli.runs, 3);
        assert!(Cli::try_parse_from([
            "space-bench",
            "--kernel",
            "/k",
            "--rootfs",
            "/r",
            "--no-btrfs",
            "--dir",
            "/x"
        ])
        .is_err());
        assert!(Cli::try_parse_from([
            "space-bench",
            "--kernel",
            "/k",
            "--rootfs",
            "/r",
            "--only",
            "warp"
        ])
        .is_err());
    }
}
