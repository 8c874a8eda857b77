//! The measurements. Each group runs its operation a number of times, records one sample per
//! run and prints a table as soon as it is done; nothing here judges the numbers.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context as _, Result};
use bytes::Bytes;
use space_proto::{ExecSpec, Identity, WriteOptions};
use space_runtime::{
    BootSpec, GuestClient, QemuRuntime, QemuVm, RestoreSpec, Runtime, SnapshotInfo, Vm,
};

use crate::bare::Bare;
use crate::stats::{mb_per_s, Samples, Summary, Table};

/// How long a cold boot may take before it counts as failed (TCG boots take seconds).
const BOOT_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a restored guest may take to answer.
const RESTORE_TIMEOUT: Duration = Duration::from_secs(30);
/// Sizes of the large-file transfers.
const BIG_FILES: [u64; 2] = [16 << 20, 64 << 20];
/// Size of the small-file transfers.
const SMALL_FILE: usize = 4096;

/// The measurement groups `--only` selects from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Group {
    /// Cold boot to a ready guest daemon.
    Boot,
    /// Full snapshot of a running guest.
    Snapshot,
    /// Bare QEMU restore and the runtime's restore to the first exec.
    Restore,
    /// Pause and resume of a running guest.
    Pause,
    /// Exec round trips on a warm connection.
    Exec,
    /// File write and read throughput and small-file latency.
    Files,
}

/// What a run measures and on what.
pub struct Plan {
    pub runs: usize,
    pub groups: Vec<Group>,
    pub qemu: PathBuf,
    pub kernel: PathBuf,
    /// The root image, already inside the scratch area.
    pub rootfs: PathBuf,
    pub vcpus: u32,
    pub memory_mib: u64,
    /// Where sandboxes and snapshots go.
    pub root: PathBuf,
}

impl Plan {
    fn wants(&self, g: Group) -> bool {
        self.groups.contains(&g)
    }
}

/// A running VM with a connected client, for the groups that measure a live guest.
struct Live {
    vm: QemuVm,
    client: GuestClient,
}

pub struct Bench<'a> {
    plan: &'a Plan,
    rt: &'a QemuRuntime,
    next_dir: usize,
    summary: Summary,
    boot: Option<Samples>,
}

/// Adds the guest console tail to an error of a guest request.
fn on_guest<T, E>(vm: &QemuVm, what: &str, r: std::result::Result<T, E>) -> Result<T>
where
    E: std::error::Error + Send + Sync + 'static,
{
    r.map_err(anyhow::Error::new).with_context(|| {
        let alive = match vm.check_alive() {
            Ok(()) => "the VM is still running".to_string(),
            Err(e) => e.to_string(),
        };
        format!(
            "{what} failed ({alive})\n--- console tail ---\n{}",
            vm.console_tail(2048)
        )
    })
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

impl<'a> Bench<'a> {
    pub fn new(plan: &'a Plan, rt: &'a QemuRuntime) -> Self {
        Bench {
            plan,
            rt,
            next_dir: 0,
            summary: Summary::new(),
            boot: None,
        }
    }

    /// A new empty directory under the scratch root.
    fn fresh_dir(&mut self, prefix: &str) -> Result<PathBuf> {
        self.next_dir += 1;
        let dir = self
            .plan
            .root
            .join(format!("{prefix}-{:03}", self.next_dir));
        std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(dir)
    }

    fn boot_spec(&self, dir: &Path) -> BootSpec {
        BootSpec {
            dir: dir.to_owned(),
            kernel: self.plan.kernel.clone(),
            rootfs: self.plan.rootfs.clone(),
            vcpus: self.plan.vcpus,
            memory_mib: self.plan.memory_mib,
            kernel_cmdline: None,
        }
    }

    /// Boots a VM and waits until its daemon reports ready.
    async fn boot_ready(&mut self, prefix: &str) -> Result<(Live, PathBuf)> {
        let dir = self.fresh_dir(prefix)?;
        let vm = self.rt.boot(self.boot_spec(&dir)).await.context("boot")?;
        let client = vm
            .wait_ready(BOOT_TIMEOUT)
            .await
            .context("waiting for the booted guest")?;
        Ok((Live { vm, client }, dir))
    }

    /// Runs every selected group in an order that lets later ones reuse earlier work.
    pub async fn run(&mut self) -> Result<()> {
        let p = self.plan;
        if p.wants(Group::Boot) {
            self.cold_boot().await?;
        }
        let needs_live = [
            Group::Snapshot,
            Group::Restore,
            Group::Pause,
            Group::Exec,
            Group::Files,
        ]
        .iter()
        .any(|g| p.wants(*g));
        if needs_live {
            progress("booting the guest the other groups use");
            let (live, dir) = self.boot_ready("live").await?;
            let result = self.with_live(&live).await;
            let _ = live.vm.kill().await;
            drop(live);
            let _ = std::fs::remove_dir_all(&dir);
            result?;
        }
        if !self.summary.is_empty() {
            println!("{}", self.summary.render());
        }
        Ok(())
    }

    async fn with_live(&mut self, live: &Live) -> Result<()> {
        let p = self.plan;
        let snapshots = self.plan.root.join("snapshots");
        std::fs::create_dir_all(&snapshots)?;
        let mut template = None;
        if p.wants(Group::Snapshot) {
            template = Some(self.snapshot(live, &snapshots).await?);
        }
        if p.wants(Group::Restore) {
            let info = match template.take() {
                Some(info) => info,
                None => live
                    .vm
                    .snapshot(&snapshots.join("template"))
                    .await
                    .context("snapshot for the restores")?,
            };
            // The live guest is not part of these measurements; keep it from taking CPU.
            live.vm.pause().await?;
            let result = self.restores(&info).await;
            live.vm.resume().await?;
            result?;
            let _ = std::fs::remove_dir_all(&info.dir);
        }
        if p.wants(Group::Pause) {
            self.pause_resume(live).await?;
        }
        if p.wants(Group::Exec) {
            self.exec(live).await?;
        }
        if p.wants(Group::Files) {
            self.files(live).await?;
        }
        Ok(())
    }

    async fn cold_boot(&mut self) -> Result<()> {
        let n = self.plan.runs;
        let mut ready = Samples::new();
        let mut started = Samples::new();
        for i in 0..n {
            progress(&format!("cold boot {}/{n}", i + 1));
            let dir = self.fresh_dir("boot")?;
            let t = Instant::now();
            let vm = self.rt.boot(self.boot_spec(&dir)).await.context("boot")?;
            started.push_duration(t.elapsed());
            let client = vm
                .wait_ready(BOOT_TIMEOUT)
                .await
                .context("waiting for the booted guest")?;
            ready.push_duration(t.elapsed());
            drop(client);
            vm.kill().await?;
            drop(vm);
            std::fs::remove_dir_all(&dir)?;
        }
        let mut t = Table::new("Cold boot (runtime.boot -> wait_ready: health says ready)");
        t.add("boot call returned (QEMU running)", "ms", started);
        t.add("boot to ready", "ms", ready.clone());
        println!("{}", t.render());
        self.boot = Some(ready);
        Ok(())
    }

    /// Snapshots the running guest `runs` times into fresh directories; keeps the last one.
    async fn snapshot(&mut self, live: &Live, parent: &Path) -> Result<SnapshotInfo> {
        let n = self.plan.runs;
        let mut call = Samples::new();
        let mut paused = Samples::new();
        let mut size = Samples::new();
        let mut last: Option<SnapshotInfo> = None;
        for i in 0..n {
            progress(&format!("snapshot {}/{n}", i + 1));
            let dest = parent.join(format!("snap-{i:03}"));
            let t = Instant::now();
            let info = live.vm.snapshot(&dest).await.context("snapshot")?;
            call.push_duration(t.elapsed());
            paused.push_duration(info.paused_for);
            size.push(info.state_bytes as f64 / 1024.0);
            if let Some(old) = last.replace(info) {
                std::fs::remove_dir_all(&old.dir)?;
            }
            // Let the guest run between snapshots, as it would between real ones.
            on_guest(&live.vm, "health", live.client.health().await)?;
        }
        let info = last.context("no snapshot was taken (--runs 0?)")?;
        let mut t = Table::new(format!(
            "Snapshot of a running guest (RAM clone: {:?}, disk clone: {:?})",
            info.mem_clone, info.disk_clone
        ));
        t.add("vm.snapshot(dest) call", "ms", call.clone());
        t.add("vCPUs paused (SnapshotInfo)", "ms", paused.clone());
        t.add("device state file", "KB", size);
        println!("{}", t.render());
        self.summary.add(
            "snapshot: vCPU pause / whole call",
            &paused,
            &call,
            "share of the call the guest is stopped",
        );
        Ok(info)
    }

    /// Alternates bare and runtime restores of one snapshot, so drift on the host (other
    /// work, page cache) affects both alike. One uncounted pair warms the caches first.
    async fn restores(&mut self, snap: &SnapshotInfo) -> Result<()> {
        let n = self.plan.runs;
        let bare = Bare::new(&self.plan.qemu, &snap.dir)?;
        let mut b_clone = Samples::new();
        let mut b_qmp = Samples::new();
        let mut b_running = Samples::new();
        let mut b_answer = Samples::new();
        let mut b_exec = Samples::new();
        let mut o_restore = Samples::new();
        let mut o_ready = Samples::new();
        let mut o_identity = Samples::new();
        let mut o_exec = Samples::new();
        let mut o_second = Samples::new();
        let mut failures: Vec<String> = Vec::new();
        // A restore that fails (for example a guest that never answers) is reported and
        // counted, and the run goes on; too many failures end it.
        let max_failures = (n / 4).max(2);
        for i in 0..=n {
            let counted = i > 0;
            if counted {
                progress(&format!("restore {i}/{n} (bare, then runtime)"));
            }
            let dir = self.fresh_dir("bare")?;
            let times = bare.restore(&dir).await;
            let _ = std::fs::remove_dir_all(&dir);
            match times {
                Ok(times) if counted => {
                    b_clone.push_duration(times.clone);
                    b_qmp.push_duration(times.qmp);
                    b_running.push_duration(times.running);
                    b_answer.push_duration(times.answered);
                    b_exec.push_duration(times.first_exec);
                }
                Ok(_) => {}
                Err(e) => failures.push(failed(i, "bare restore", &e)),
            }

            let dir = self.fresh_dir("restore")?;
            let times = self.restore_once(snap, &dir, i).await;
            let _ = std::fs::remove_dir_all(&dir);
            match times {
                Ok(t) if counted => {
                    o_restore.push(ms(t[0]));
                    o_ready.push(ms(t[1]));
                    o_identity.push(ms(t[2]));
                    o_exec.push(ms(t[3]));
                    o_second.push(ms(t[4]));
                }
                Ok(_) => {}
                Err(e) => failures.push(failed(i, "runtime restore", &e)),
            }
            if failures.len() > max_failures {
                bail!("{} restores failed; giving up", failures.len());
            }
        }
        let mut t = Table::new(
            "Bare QEMU restore (same QEMU arguments, own QMP, one health answer; \
             times from QEMU spawn)",
        );
        t.add(
            "clone RAM + disk (before spawn, not counted)",
            "ms",
            b_clone,
        );
        t.add("QMP greeting + capabilities", "ms", b_qmp);
        t.add("state loaded, cont answered", "ms", b_running);
        t.add("bare: health answered", "ms", b_answer.clone());
        t.add("(then run true answered)", "ms", b_exec.clone());
        println!("{}", t.render());

        let mut t = Table::new(
            "Restore to first exec (runtime.restore -> ready -> identity -> run true; \
             cumulative)",
        );
        t.add("runtime.restore returned", "ms", o_restore);
        t.add("health ready (wait_ready)", "ms", o_ready);
        t.add("identity applied", "ms", o_identity);
        t.add("ours: first exec answered", "ms", o_exec.clone());
        t.add("(then a second run true answered)", "ms", o_second);
        print!("{}", t.render());
        if failures.is_empty() {
            println!("failed restores: none\n");
        } else {
            println!("failed restores (not in the tables above):");
            for f in &failures {
                println!("- {f}");
            }
            println!();
        }

        self.summary.add(
            "restore: ours (to first exec) / bare (to health)",
            &o_exec,
            &b_answer,
            "target <= 1.3x",
        );
        self.summary.add(
            "restore: ours / bare, both to first exec",
            &o_exec,
            &b_exec,
            "like for like: what our machinery adds",
        );
        if let Some(boot) = &self.boot {
            self.summary.add(
                "cold boot / ours restore to first exec",
                boot,
                &o_exec,
                "how much a snapshot saves over booting",
            );
        }
        Ok(())
    }

    /// One runtime restore to the first exec; returns the cumulative times of restore
    /// returned, ready, identity applied, first exec and second exec. The VM dies with its
    /// handle on every path.
    async fn restore_once(
        &mut self,
        snap: &SnapshotInfo,
        dir: &Path,
        i: usize,
    ) -> Result<[Duration; 5]> {
        let identity = Identity {
            sandbox_id: format!("bench-{i}"),
            entropy: entropy()?,
            time_unix_ns: None,
            hostname: Some(format!("bench-{i}")),
            ..Default::default()
        };
        let spec = RestoreSpec {
            snapshot: snap.dir.clone(),
            dir: dir.to_owned(),
            paused: false,
            kernel: None,
            files_in_place: false,
            priority: Default::default(),
            splice: None,
        };
        let t = Instant::now();
        let vm = self.rt.restore(spec).await.context("runtime restore")?;
        let restored = t.elapsed();
        let client = vm
            .wait_ready(RESTORE_TIMEOUT)
            .await
            .context("waiting for the restored guest")?;
        let ready = t.elapsed();
        let identity = Identity {
            time_unix_ns: Some(unix_ns()),
            ..identity
        };
        on_guest(&vm, "identity", client.identity(&identity).await)?;
        let identified = t.elapsed();
        let out = on_guest(
            &vm,
            "first exec",
            client.run(ExecSpec::argv(["true"])).await,
        )?;
        let executed = t.elapsed();
        if !out.status.success() {
            bail!("`true` failed in the restored guest: {:?}", out.status);
        }
        on_guest(
            &vm,
            "second exec",
            client.run(ExecSpec::argv(["true"])).await,
        )?;
        let second = t.elapsed();
        drop(client);
        vm.kill().await?;
        Ok([restored, ready, identified, executed, second])
    }

    async fn pause_resume(&mut self, live: &Live) -> Result<()> {
        let n = self.plan.runs;
        progress(&format!("pause/resume x{n}"));
        let mut pause = Samples::new();
        let mut resume = Samples::new();
        for _ in 0..n {
            let t = Instant::now();
            live.vm.pause().await.context("pause")?;
            pause.push_duration(t.elapsed());
            let t = Instant::now();
            live.vm.resume().await.context("resume")?;
            resume.push_duration(t.elapsed());
            // The guest runs a little between rounds.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let mut t = Table::new("Pause and resume of a running guest (QMP stop / cont)");
        t.add("pause (stop)", "ms", pause);
        t.add("resume (cont)", "ms", resume);
        println!("{}", t.render());
        Ok(())
    }

    async fn exec(&mut self, live: &Live) -> Result<()> {
        let n = self.plan.runs * 5;
        progress(&format!("exec x{n} (true, then sh -c 'echo hi')"));
        let (vm, client) = (&live.vm, &live.client);
        let mut true_ = Samples::new();
        let mut echo = Samples::new();
        // Warm the connection and the guest's caches.
        for _ in 0..3 {
            on_guest(vm, "exec", client.run(ExecSpec::argv(["true"])).await)?;
        }
        for _ in 0..n {
            let t = Instant::now();
            let out = on_guest(vm, "exec true", client.run(ExecSpec::argv(["true"])).await)?;
            true_.push_duration(t.elapsed());
            if !out.status.success() {
                bail!("`true` failed: {:?}", out.status);
            }
        }
        for _ in 0..n {
            let t = Instant::now();
            let out = on_guest(vm, "exec sh", client.run(ExecSpec::shell("echo hi")).await)?;
            echo.push_duration(t.elapsed());
            if !out.status.success() || &out.stdout[..] != b"hi\n" {
                bail!(
                    "`sh -c 'echo hi'` returned {:?} {:?}",
                    out.status,
                    out.stdout
                );
            }
        }
        let mut t = Table::new("Exec round trip on a warm connection (run, empty stdin)");
        t.add("run [\"true\"]", "ms", true_);
        t.add("run sh -c 'echo hi'", "ms", echo);
        println!("{}", t.render());
        Ok(())
    }

    async fn files(&mut self, live: &Live) -> Result<()> {
        let (vm, client) = (&live.vm, &live.client);
        let big_runs = (self.plan.runs / 2).max(1);
        let small_runs = self.plan.runs * 5;
        let path = "/root/space-bench.bin";
        let mut t = Table::new(format!(
            "File transfer to and from the guest's root disk ({path}; MB = 10^6 bytes)"
        ));
        for size in BIG_FILES {
            progress(&format!("files: {} MiB x{big_runs}", size >> 20));
            let data = Bytes::from(pattern(size as usize, size));
            let mut write = Samples::new();
            let mut read = Samples::new();
            for _ in 0..big_runs {
                let t0 = Instant::now();
                let stat = on_guest(
                    vm,
                    "file write",
                    client
                        .write_file(path, data.clone(), WriteOptions::default())
                        .await,
                )?;
                write.push(mb_per_s(size, t0.elapsed()));
                if stat.size != size {
                    bail!("wrote {size} bytes, the guest reports {}", stat.size);
                }
                let t0 = Instant::now();
                let back = on_guest(vm, "file read", client.read_file_bytes(path).await)?;
                read.push(mb_per_s(size, t0.elapsed()));
                if back != data {
                    bail!(
                        "read back {} bytes that differ from the {size} written",
                        back.len()
                    );
                }
            }
            t.add(format!("write {} MiB", size >> 20), "MB/s", write);
            t.add(format!("read {} MiB", size >> 20), "MB/s", read);
        }
        on_guest(vm, "remove", client.remove(path, false).await)?;

        progress(&format!("files: 4 KiB x{small_runs}"));
        let small = Bytes::from(pattern(SMALL_FILE, 4));
        let small_path = "/root/space-bench-small.bin";
        let mut write = Samples::new();
        let mut read = Samples::new();
        for _ in 0..small_runs {
            let t0 = Instant::now();
            on_guest(
                vm,
                "small write",
                client
                    .write_file(small_path, small.clone(), WriteOptions::default())
                    .await,
            )?;
            write.push_duration(t0.elapsed());
            let t0 = Instant::now();
            let back = on_guest(vm, "small read", client.read_file_bytes(small_path).await)?;
            read.push_duration(t0.elapsed());
            if back != small {
                bail!("small file read back differs");
            }
        }
        on_guest(vm, "remove", client.remove(small_path, false).await)?;
        t.add("write 4 KiB", "ms", write);
        t.add("read 4 KiB", "ms", read);
        println!("{}", t.render());
        Ok(())
    }
}

/// Deterministic, incompressible-looking bytes (xorshift64*), so nothing on the way can
/// shortcut zeros.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        out.extend_from_slice(&state.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Reports a failed run in full on stderr and returns its one-line summary for stdout.
pub(crate) fn failed(i: usize, what: &str, e: &anyhow::Error) -> String {
    eprintln!("[space-bench] run {i}: {what} failed: {e:#}");
    let cause = e.root_cause().to_string();
    let first = cause.lines().next().unwrap_or("").to_owned();
    let run = if i == 0 {
        "warm-up".to_string()
    } else {
        format!("run {i}")
    };
    format!("{run}: {what}: {first}")
}

/// Fresh entropy for a restored guest's identity.
fn entropy() -> Result<Vec<u8>> {
    use std::io::Read;
    let mut buf = vec![0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .context("reading /dev/urandom")?;
    Ok(buf)
}

fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// A progress line on stderr; the tables go to stdout.
/// A run's result with its cleanup's: the run's error first, the cleanup's added to it.
pub fn with_cleanup(result: Result<()>, cleaned: Result<()>) -> Result<()> {
    match (result, cleaned) {
        (Ok(()), Ok(())) => Ok(()),
        (Err(e), Ok(())) => Err(e),
        (Ok(()), Err(c)) => Err(c),
        (Err(e), Err(c)) => Err(e.context(format!("also: {c:#}"))),
    }
}

pub(crate) fn progress(what: &str) {
    eprintln!("[space-bench] {what}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_is_deterministic_and_sized() {
        assert_eq!(pattern(0, 1).len(), 0);
        assert_eq!(pattern(13, 1).len(), 13);
        assert_eq!(pattern(4096, 7), pattern(4096, 7));
        assert_ne!(pattern(4096, 7), pattern(4096, 8));
        // Not trivially compressible: no long runs of one byte value.
        let p = pattern(1 << 16, 3);
        let zeros = p.iter().filter(|&&b| b == 0).count();
        assert!(zeros < p.len() / 64, "{zeros} zero bytes");
        // A prefix of a longer pattern is the shorter pattern.
        assert_eq!(&pattern(100, 9)[..50], &pattern(50, 9)[..]);
    }
}
