//! Prints how long the QEMU runtime's operations take on this host: cold boot to a guest that
//! answers, pause and resume, full snapshot (and its state-file size), and restore to the
//! first answer.
//!
//! ```text
//! SPACE_KERNEL=/path/to/vmlinux cargo run --release -p space-runtime --example measure -- [N]
//! ```
//!
//! With `SPACE_ROOTFS_MINIMAL` set, the guest is that image with `space-guestd` and "answer"
//! means a health check that reports ready. Otherwise it is the busybox shell guest of the
//! integration tests (built on the fly; needs busybox-static and e2fsprogs) and "answer" means
//! an `echo` round trip. Sandboxes and snapshots go under `$SPACE_MEASURE_DIR` (default: a
//! temporary directory), so pointing it at a btrfs mount measures reflinks.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use space_runtime::{GuestClient, QemuVm, RestoreSpec, Runtime, Vm};

/// An open line to the guest, kept so the first answer is not the last.
#[allow(dead_code)] // held, never read: dropping it would close the connection
enum Answering {
    Shell(common::Shell),
    Daemon(GuestClient),
}

async fn first_answer(vm: &QemuVm, daemon: bool) -> Answering {
    if daemon {
        Answering::Daemon(vm.wait_ready(common::BOOT_TIMEOUT).await.unwrap())
    } else {
        Answering::Shell(common::wait_shell(vm, common::BOOT_TIMEOUT).await)
    }
}

fn row(name: &str, samples: &mut [Duration]) {
    samples.sort();
    let pick = |q: f64| samples[((samples.len() as f64 - 1.0) * q).round() as usize];
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "{name:<28} {:>5} {:>10.2} {:>10.2} {:>10.2}",
        samples.len(),
        ms(pick(0.5)),
        ms(pick(0.9)),
        ms(*samples.last().unwrap())
    );
}

#[tokio::main]
async fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10);
    let base = match std::env::var_os("SPACE_MEASURE_DIR") {
        Some(d) => tempfile::tempdir_in(d).unwrap(),
        None => tempfile::tempdir().unwrap(),
    };
    // Logs go to stderr, so stdout is just the table (RUST_LOG=space_runtime=debug for phases).
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let rt = common::runtime().await;
    let daemon_image = std::env::var_os("SPACE_ROOTFS_MINIMAL").map(std::path::PathBuf::from);
    let daemon = daemon_image.is_some();
    let image = daemon_image.unwrap_or_else(|| common::build_shell_image(base.path()));
    println!(
        "QEMU {} accel {} in {}; guest: {}",
        rt.version(),
        rt.accel(),
        base.path().display(),
        if daemon {
            "space-guestd"
        } else {
            "busybox shell"
        }
    );
    println!(
        "{:<28} {:>5} {:>10} {:>10} {:>10}",
        "operation (ms)", "n", "p50", "p90", "max"
    );

    let mut boots = Vec::new();
    let mut vm = None;
    for i in 0..3.min(n) {
        let dir = base.path().join(format!("boot{i}"));
        std::fs::create_dir(&dir).unwrap();
        let t = Instant::now();
        let booted = rt.boot(common::boot_spec(&dir, &image)).await.unwrap();
        let conn = first_answer(&booted, daemon).await;
        boots.push(t.elapsed());
        vm = Some((booted, conn));
    }
    row("cold boot to answer", &mut boots);
    let (vm, conn) = vm.unwrap();

    let (mut pauses, mut resumes) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let t = Instant::now();
        vm.pause().await.unwrap();
        pauses.push(t.elapsed());
        let t = Instant::now();
        vm.resume().await.unwrap();
        resumes.push(t.elapsed());
    }
    row("pause", &mut pauses);
    row("resume", &mut resumes);

    let mut snaps = Vec::new();
    let mut stopped = Vec::new();
    let mut last = None;
    for i in 0..n {
        let dest = base.path().join(format!("snap{i}"));
        let t = Instant::now();
        let info = vm.snapshot(&dest).await.unwrap();
        snaps.push(t.elapsed());
        stopped.push(info.paused_for);
        if let Some(old) = last.replace(info) {
            let old: space_runtime::SnapshotInfo = old;
            std::fs::remove_dir_all(&old.dir).unwrap();
        }
    }
    row("snapshot (call)", &mut snaps);
    row("snapshot (vCPUs stopped)", &mut stopped);
    let info = last.unwrap();
    drop(conn);
    drop(vm);

    let mut restores = Vec::new();
    let mut answered = Vec::new();
    for i in 0..n {
        let dir = base.path().join(format!("restore{i}"));
        std::fs::create_dir(&dir).unwrap();
        let spec = RestoreSpec {
            snapshot: info.dir.clone(),
            dir: dir.clone(),
            paused: false,
            kernel: None,
            files_in_place: false,
            priority: Default::default(),
            splice: None,
        };
        let t = Instant::now();
        let restored = rt.restore(spec).await.unwrap();
        restores.push(t.elapsed());
        let conn = first_answer(&restored, daemon).await;
        answered.push(t.elapsed());
        drop(conn);
        drop(restored);
        std::fs::remove_dir_all(&dir).unwrap();
    }
    row("restore (call)", &mut restores);
    row("restore to first answer", &mut answered);
    println!(
        "state file {} bytes; RAM clone {:?}, disk clone {:?}",
        info.state_bytes, info.mem_clone, info.disk_clone
    );
}
