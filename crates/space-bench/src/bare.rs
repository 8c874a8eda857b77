//! The reference restore: what QEMU itself costs, with the least machinery around it.
//!
//! It starts `qemu-system-x86_64` with exactly the arguments the runtime would use
//! (`space_runtime::cmdline::build` on the snapshot's manifest, with `-incoming defer`), speaks
//! QMP through the small client in [`crate::qmp`] (capabilities, `x-ignore-shared`, `getfd` of
//! the state file, `migrate-incoming`, wait, `cont`) and then asks the guest daemon for its
//! health over a fresh HTTP/2 connection on the `space.ctl` socket, reconnecting when the
//! first attempt is swallowed by the connection the guest had before the snapshot. No
//! manifest checks, no kernel hashing, no exit watcher, no log housekeeping.

use std::fs::File;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use serde_json::json;
use space_proto::client::GuestClient;
use space_proto::ExecSpec;
use space_runtime::cmdline::{self, QemuConfig};
use space_runtime::{console, cow, Manifest};
use tokio::net::UnixStream;
use tokio::process::{Child, Command};

use crate::qmp::Qmp;

/// Bound for the whole restore; a healthy one takes well under a second even under TCG.
const RESTORE_TIMEOUT: Duration = Duration::from_secs(60);

/// The machine a snapshot needs, prepared once for all the bare restores of it.
pub struct Bare {
    qemu: PathBuf,
    snapshot: PathBuf,
    config: QemuConfig,
}

/// Stage times of one bare restore, each measured from the spawn of QEMU.
#[derive(Debug, Clone, Copy)]
pub struct BareTimes {
    /// Cloning the snapshot's RAM file and disk (before the clock starts, reported apart).
    pub clone: Duration,
    /// QMP greeting read and capabilities negotiated.
    pub qmp: Duration,
    /// Device state loaded and the vCPUs running (`cont` answered).
    pub running: Duration,
    /// The guest daemon answered a health request.
    pub answered: Duration,
    /// `true` ran and its exit was reported, on the same connection (not part of the
    /// reference; it shows what a guest's first exec after a restore costs by itself).
    pub first_exec: Duration,
}

impl Bare {
    pub fn new(qemu: &Path, snapshot: &Path) -> Result<Bare> {
        let manifest = Manifest::read(&snapshot.join(cmdline::MANIFEST_FILE))?;
        let config = QemuConfig {
            accel: manifest.accel,
            vcpus: manifest.vcpus,
            memory_mib: manifest.memory_mib,
            kernel: manifest.kernel.path.clone(),
            kernel_cmdline: manifest.kernel_cmdline.clone(),
            incoming: true,
        };
        Ok(Bare {
            qemu: qemu.to_owned(),
            snapshot: snapshot.to_owned(),
            config,
        })
    }

    /// Restores into `dir` (which must exist and be empty), measures, and kills QEMU.
    pub async fn restore(&self, dir: &Path) -> Result<BareTimes> {
        let t = Instant::now();
        for name in [cmdline::MEM_FILE, cmdline::DISK_FILE] {
            cow::clone_file(&self.snapshot.join(name), &dir.join(name))
                .with_context(|| format!("cloning the snapshot's {name}"))?;
        }
        let clone = t.elapsed();
        let state_path = self.snapshot.join(cmdline::STATE_FILE);
        let state =
            File::open(&state_path).with_context(|| format!("opening {}", state_path.display()))?;
        let log = File::create(dir.join(cmdline::QEMU_LOG)).context("creating qemu.log")?;

        let t0 = Instant::now();
        let deadline = t0 + RESTORE_TIMEOUT;
        let mut child = Command::new(&self.qemu)
            .args(cmdline::build(&self.config))
            .current_dir(dir)
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", self.qemu.display()))?;
        let result = drive(&mut child, dir, &state, t0, deadline).await;
        let _ = child.kill().await;
        result
            .map(|(qmp, running, answered, first_exec)| BareTimes {
                clone,
                qmp,
                running,
                answered,
                first_exec,
            })
            .with_context(|| {
                format!(
                    "bare restore in {}\n--- console tail ---\n{}\n--- qemu log tail ---\n{}",
                    dir.display(),
                    console_excerpt(&dir.join(cmdline::CONSOLE_LOG)),
                    console::tail(&dir.join(cmdline::QEMU_LOG), 2048)
                )
            })
    }
}

/// The start and the end of a console log: after a restore the first lines say how the guest
/// came back, the last ones what it was doing when the bench gave up.
fn console_excerpt(path: &Path) -> String {
    const PART: usize = 1536;
    let bytes = std::fs::read(path).unwrap_or_default();
    if bytes.len() <= 2 * PART {
        return console::sanitize(&bytes);
    }
    format!(
        "{}\n[... {} bytes ...]\n{}",
        console::sanitize(&bytes[..PART]),
        bytes.len() - 2 * PART,
        console::sanitize(&bytes[bytes.len() - PART..])
    )
}

async fn drive(
    child: &mut Child,
    dir: &Path,
    state: &File,
    t0: Instant,
    deadline: Instant,
) -> Result<(Duration, Duration, Duration, Duration)> {
    let mut qmp = Qmp::connect(&dir.join(cmdline::QMP_SOCKET), deadline, || {
        matches!(child.try_wait(), Ok(None))
    })
    .await?;
    let qmp_ready = t0.elapsed();
    let caps = json!({ "capabilities": [
        { "capability": "x-ignore-shared", "state": true },
        { "capability": "events", "state": true },
    ]});
    qmp.execute("migrate-set-capabilities", Some(caps), deadline)
        .await?;
    qmp.execute_with_fd(
        "getfd",
        Some(json!({ "fdname": "state" })),
        state.as_fd(),
        deadline,
    )
    .await?;
    qmp.execute(
        "migrate-incoming",
        Some(json!({ "uri": "fd:state" })),
        deadline,
    )
    .await?;
    qmp.wait_migration(deadline).await?;
    qmp.execute("cont", None, deadline).await?;
    let running = t0.elapsed();
    let client = health(&dir.join(cmdline::CTL_SOCKET), deadline).await?;
    let answered = t0.elapsed();
    let remaining = deadline.saturating_duration_since(Instant::now());
    let out = tokio::time::timeout(remaining, client.run(ExecSpec::argv(["true"])))
        .await
        .context("timed out waiting for the first exec")?
        .context("first exec")?;
    if !out.status.success() {
        bail!("`true` failed in the restored guest: {:?}", out.status);
    }
    Ok((qmp_ready, running, answered, t0.elapsed()))
}

/// One answered health request on a fresh connection; each attempt is bounded and a failed
/// one reconnects (the daemon may still be reading its pre-snapshot connection).
async fn health(ctl: &Path, deadline: Instant) -> Result<GuestClient> {
    let mut budget = Duration::from_millis(250);
    let mut last = String::from("no attempt finished");
    while Instant::now() < deadline {
        let attempt = async {
            let stream = UnixStream::connect(ctl).await?;
            let client = GuestClient::connect(stream).await?;
            client.health().await?;
            anyhow::Ok(client)
        };
        match tokio::time::timeout(budget, attempt).await {
            Ok(Ok(client)) => return Ok(client),
            Ok(Err(e)) => {
                last = format!("{e:#}");
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            Err(_) => {
                last = format!("no answer within {budget:?}");
                budget = (budget * 2).min(Duration::from_secs(2));
            }
        }
    }
    bail!("the guest daemon did not answer its health request ({last})")
}
