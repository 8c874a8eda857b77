//! The sandbox runtime: the [`Runtime`] and [`Vm`] traits the node drives, and their QEMU
//! implementation ([`QemuRuntime`], [`QemuVm`]).
//!
//! A runtime turns a sandbox directory plus a kernel and a root disk into a running microVM
//! (`boot`), or turns a full snapshot into one (`restore`). A VM handle pauses, resumes,
//! snapshots and kills its VM, and opens the two host<->guest channels: `space.ctl` (the host
//! drives `space-guestd` over it) and `space.egress` (the guest's way out, served by the
//! gateway). The traits use `impl Future` returns, for callers that know their backend's type;
//! the node holds its runtime behind a pointer through the object-safe [`NodeRuntime`] and
//! [`NodeVm`] ([`node`]), which add what only a node needs (adoption, cgroup sweeps, the
//! VMM version for manifests). Where QEMU is not the right VMM (Firecracker on KVM hosts),
//! another implementation can sit behind the same traits.
//!
//! Lifecycle of a VM handle (transitions are one request each; QEMU's exit ends every state):
//!
//! ```text
//!   boot ──► Running ◄── pause/resume ──► Paused
//!   restore(paused=false) ──► Running     restore(paused=true) ──► Paused
//!   Running|Paused ── snapshot ──► same state as before (vCPUs stopped meanwhile)
//!   any ── kill / QEMU exits ──► Exited   (every later request fails with `Error::Exited`)
//! ```
//!
//! Everything that comes from the guest (console bytes, QMP traffic QEMU relays, what the
//! daemon answers) is bounded and never a reason for the host to panic.

use std::future::Future;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tokio::net::UnixStream;

pub mod accel;
pub mod cgroup;
pub mod cmdline;
pub mod console;
pub mod cow;
pub mod fake;
pub mod jail;
pub mod manifest;
pub mod node;
pub mod priority;
pub mod process;
pub mod qemu;
pub mod qmp;
pub mod splice;
pub mod tsc;
pub mod usage;

pub use accel::Accel;
pub use cow::CloneMethod;
pub use jail::{JailConfig, JailUser};
pub use manifest::Manifest;
pub use node::{BoxFuture, NodeRuntime, NodeVm};
pub use priority::Priority;
pub use process::ExitInfo;
pub use qemu::{QemuRuntime, QemuRuntimeConfig, QemuVm};
pub use space_proto::client::{ClientError, GuestClient};
pub use splice::Splice;
pub use usage::HostUsage;

/// What to boot: a fresh VM from a kernel and a root disk.
#[derive(Debug, Clone)]
pub struct BootSpec {
    /// The sandbox directory; it must exist. The runtime creates the RAM file, sockets and
    /// logs in it, and the VM process runs with it as working directory.
    pub dir: PathBuf,
    /// Uncompressed PVH `vmlinux`.
    pub kernel: PathBuf,
    /// Root disk image (raw ext4). If it is not already `<dir>/rootfs.ext4`, it is cloned
    /// there (reflink where possible); the VM writes only to that clone.
    pub rootfs: PathBuf,
    /// vCPU count.
    pub vcpus: u32,
    /// Guest RAM in MiB.
    pub memory_mib: u64,
    /// Kernel command line; `None` for [`cmdline::DEFAULT_KERNEL_CMDLINE`].
    pub kernel_cmdline: Option<String>,
}

/// What to restore: a full snapshot into a new sandbox directory.
#[derive(Debug, Clone)]
pub struct RestoreSpec {
    /// A directory written by [`Vm::snapshot`]. Only read.
    pub snapshot: PathBuf,
    /// The new sandbox directory; it must exist and must not hold a VM's files yet.
    pub dir: PathBuf,
    /// Leave the vCPUs stopped after loading (warm pools resume later).
    pub paused: bool,
    /// Kernel to use instead of the path recorded in the snapshot (for snapshots moved between
    /// hosts); it must be byte-identical to the original.
    pub kernel: Option<PathBuf>,
    /// The RAM file and the disk are already in `dir` (made there for this VM, by a fetch from
    /// the object store, say) and are used as they are; `snapshot` then needs only the device
    /// state and the manifest. Otherwise they are cloned from `snapshot` into `dir`.
    pub files_in_place: bool,
    /// CPU priority of the VMM from its start on ([`Vm::set_priority`] changes it later).
    pub priority: Priority,
    /// Host ends of the guest channels kept across a change of VMM ([`splice`]): the VM's
    /// channels are reached through it, and streams it holds move to the new VMM before its
    /// state loads. `None`: clients connect to QEMU's sockets directly.
    pub splice: Option<Splice>,
}

/// The local files behind a VM's RAM file and disk ([`Vm::set_backing`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backing {
    /// Holds what the VM's RAM file shows, once synced.
    pub mem: PathBuf,
    /// Holds what the VM's disk shows, once synced.
    pub disk: PathBuf,
}

/// What a snapshot produced.
#[derive(Debug, Clone)]
pub struct SnapshotInfo {
    /// The snapshot directory.
    pub dir: PathBuf,
    /// Size of the device-state file.
    pub state_bytes: u64,
    /// How the RAM file was cloned.
    pub mem_clone: CloneMethod,
    /// How the disk was cloned.
    pub disk_clone: CloneMethod,
    /// How long the vCPUs were stopped for it (zero if the VM was already paused).
    pub paused_for: Duration,
    /// The manifest written with it.
    pub manifest: Manifest,
}

/// Errors of runtime operations.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The VM process is gone. Carries the tail of the guest console and of the VMM's own
    /// output, which usually say why.
    #[error(
        "the VM exited ({exit})\n--- console tail ---\n{console}\n--- vmm log tail ---\n{vmm_log}"
    )]
    Exited {
        /// How the VMM process ended.
        exit: ExitInfo,
        /// Last bytes of the guest console (sanitized).
        console: String,
        /// Last bytes of the VMM's stderr (sanitized).
        vmm_log: String,
    },
    /// The request is malformed or impossible (bad sizes, missing files, occupied directory).
    #[error("invalid request: {0}")]
    Invalid(String),
    /// A step did not finish in time.
    #[error("timed out {0}")]
    Timeout(String),
    /// The runtime broke one of its own rules (blocking work that panicked): not the
    /// caller's fault.
    #[error("internal error: {0}")]
    Internal(String),
    /// Saving or loading VM state failed.
    #[error("migration failed: {0}")]
    Migration(String),
    /// File-system work on the sandbox or snapshot directory failed.
    #[error("{op} {path}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// Accelerator selection failed.
    #[error(transparent)]
    Accel(#[from] accel::AccelError),
    /// Starting the VMM process failed.
    #[error(transparent)]
    Process(#[from] process::ProcessError),
    /// Talking to QEMU failed.
    #[error(transparent)]
    Qmp(#[from] qmp::QmpError),
    /// Cloning a RAM or disk file failed.
    #[error(transparent)]
    Cow(#[from] cow::CowError),
    /// The snapshot's manifest is unreadable or does not fit this host.
    #[error(transparent)]
    Manifest(#[from] manifest::ManifestError),
    /// The guest daemon failed a request.
    #[error(transparent)]
    Guest(#[from] ClientError),
    /// Preparing the jail of a VMM failed.
    #[error(transparent)]
    Jail(#[from] jail::JailError),
    /// Adoption found no VMM of ours for the directory: no pidfile, the process is gone, or
    /// the pid now belongs to another process. Nothing was signalled.
    #[error("no VM to adopt in {dir}: {reason}")]
    NotAdoptable {
        /// The sandbox directory.
        dir: PathBuf,
        /// Why.
        reason: String,
    },
}

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A VMM backend: starts VMs.
pub trait Runtime: Send + Sync {
    /// The handle of a VM this runtime started.
    type Vm: Vm;

    /// Boots a fresh VM. Returns once the VMM runs the guest; the guest daemon is ready only
    /// after [`Vm::wait_ready`].
    fn boot(&self, spec: BootSpec) -> impl Future<Output = Result<Self::Vm>> + Send;

    /// Restores a full snapshot into a new sandbox directory. The snapshot is checked first
    /// (format, VMM version, accelerator, sizes, kernel); a mismatch is an error, never a
    /// half-loaded guest.
    fn restore(&self, spec: RestoreSpec) -> impl Future<Output = Result<Self::Vm>> + Send;
}

/// A running (or paused, or exited) VM. Dropping the handle kills the VM (the QEMU
/// implementation can instead let it go: [`QemuVm::detach`]).
pub trait Vm: Send + Sync {
    /// The sandbox directory.
    fn dir(&self) -> &std::path::Path;

    /// Stops the vCPUs; memory and devices stay. Idempotent.
    fn pause(&self) -> impl Future<Output = Result<()>> + Send;

    /// Restarts the vCPUs. Idempotent.
    fn resume(&self) -> impl Future<Output = Result<()>> + Send;

    /// Writes a full snapshot (device state, RAM, disk, manifest) into `dest`, which must not
    /// exist or be empty. A running VM is stopped for the duration and resumed afterwards.
    fn snapshot(&self, dest: &std::path::Path)
        -> impl Future<Output = Result<SnapshotInfo>> + Send;

    /// Where snapshots clone the RAM file and the disk from, when the VM's own files are not
    /// plain files (a lazy restore serves them through a file system in front of local
    /// files): a snapshot then syncs the VM's files (their changes reach the backing files)
    /// and clones these. `None`: the VM's own files.
    fn set_backing(&self, backing: Option<Backing>);

    /// Kills the VM and waits for its process. Files in the sandbox directory stay.
    fn kill(&self) -> impl Future<Output = Result<ExitInfo>> + Send;

    /// Waits until the VM process exits, for whatever reason.
    fn wait(&self) -> impl Future<Output = ExitInfo> + Send;

    /// `Err(Error::Exited)` once the VM process is gone.
    fn check_alive(&self) -> Result<()>;

    /// Changes how the VMM is scheduled against other VMs and the host ([`priority`]).
    fn set_priority(&self, priority: Priority) -> Result<()>;

    /// A new connection to the `space.ctl` port. Only one can be open at a time: the port
    /// carries one byte stream.
    fn connect_ctl(&self) -> impl Future<Output = Result<UnixStream>> + Send;

    /// A new connection to the `space.egress` port, for the gateway.
    fn connect_egress(&self) -> impl Future<Output = Result<UnixStream>> + Send;

    /// The last `max` bytes of the guest console, sanitized.
    fn console_tail(&self, max: usize) -> String;

    /// A protocol client on a new `space.ctl` connection. Does not wait for the daemon.
    fn guest(&self) -> impl Future<Output = Result<GuestClient>> + Send {
        async move {
            let stream = self.connect_ctl().await?;
            Ok(GuestClient::connect(stream).await?)
        }
    }

    /// Connects to the guest daemon and polls its health until it reports ready, the VM exits,
    /// or `timeout` passes. Each attempt gets a short deadline and a fresh connection: after a
    /// restore the daemon may still be reading its pre-snapshot connection and discard the
    /// first bytes of ours before it resynchronizes.
    fn wait_ready(&self, timeout: Duration) -> impl Future<Output = Result<GuestClient>> + Send {
        async move {
            let deadline = Instant::now() + timeout;
            let mut attempt_timeout = Duration::from_millis(250);
            let mut last_error = String::from("no attempt finished");
            // A client whose daemon answered but is not ready yet is polled again as is.
            let mut current: Option<GuestClient> = None;
            loop {
                self.check_alive()?;
                let now = Instant::now();
                if now >= deadline {
                    return Err(Error::Timeout(format!(
                        "after {timeout:?} waiting for the guest daemon (last error: {last_error})\n\
                         --- console tail ---\n{}",
                        self.console_tail(4096)
                    )));
                }
                let budget = attempt_timeout.min(deadline - now);
                let reuse = current.take();
                let attempt = async {
                    let client = match reuse {
                        Some(c) if !c.is_closed() => c,
                        _ => self.guest().await?,
                    };
                    let health = client.health().await?;
                    if health.ready {
                        // Bytes the daemon's pre-snapshot connection wrote before it saw our
                        // preface (its GOAWAY, say) reach us before any answer on this
                        // connection; h2 has taken them in by now. A second request shows
                        // whether they closed the connection to new streams, in which case
                        // this attempt fails and the next one connects afresh.
                        client.health().await?;
                    }
                    Ok::<_, Error>((client, health))
                };
                match tokio::time::timeout(budget, attempt).await {
                    Ok(Ok((client, health))) if health.ready => return Ok(client),
                    Ok(Ok((client, _))) => {
                        last_error = "daemon answered but is not ready".into();
                        current = Some(client);
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    Ok(Err(e)) => {
                        last_error = e.to_string();
                        // Refused connections (socket not there yet) retry soon, without
                        // spinning.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    Err(_) => {
                        last_error = format!("no answer within {budget:?}");
                        attempt_timeout = (attempt_timeout * 2).min(Duration::from_secs(2));
                    }
                }
            }
        }
    }
}
