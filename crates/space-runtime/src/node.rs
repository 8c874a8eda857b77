//! What a node needs of a runtime, as object-safe traits: [`NodeRuntime`] and [`NodeVm`].
//!
//! [`Runtime`] and [`Vm`] describe a VMM backend with `impl Future` returns, which suits a
//! caller that knows its backend's type. The node holds its runtime behind a pointer
//! instead (`Arc<dyn NodeRuntime>`, `Box<dyn NodeVm>`): the runtime is chosen when the node
//! opens (QEMU in production, a fake in the node's unit tests), and the sandbox drivers,
//! pools, recovery, templates and the archive all share it without a type parameter each.
//! A VM operation costs milliseconds; the boxed future and the indirect call cost nothing
//! next to it.
//!
//! Beyond the lifecycle of [`Runtime`] and [`Vm`], a node adopts the VMs an earlier node
//! process left running, releases what a gone VM held, sweeps cgroups, sets the CPU priority
//! of a VMM still starting, and records the VMM version and accelerator in snapshot
//! manifests; a VM handle has a pid, a run state and can be let go without being killed.
//!
//! The files a runtime keeps in a sandbox directory are part of the contract as well (their
//! names are in [`crate::cmdline`]): the node reads the pid file, the console log and
//! snapshot manifests, and the gateway connects to the egress socket by its path.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::time::Duration;

use tokio::net::UnixStream;

use crate::qmp::{QemuVersion, Status};
use crate::{
    Accel, BootSpec, ExitInfo, GuestClient, Priority, QemuRuntime, QemuVm, RestoreSpec, Result,
    Runtime, SnapshotInfo, Vm,
};

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A VMM backend as a node drives it.
pub trait NodeRuntime: Send + Sync + 'static {
    /// Boots a fresh VM ([`Runtime::boot`]).
    fn boot(&self, spec: BootSpec) -> BoxFuture<'_, Result<Box<dyn NodeVm>>>;

    /// Restores a full snapshot into a new sandbox directory ([`Runtime::restore`]).
    fn restore(&self, spec: RestoreSpec) -> BoxFuture<'_, Result<Box<dyn NodeVm>>>;

    /// Takes over the VM an earlier process of this runtime left running in `dir`;
    /// [`crate::Error::NotAdoptable`] when there is none (nothing is signalled then).
    fn adopt<'a>(&'a self, dir: &'a Path) -> BoxFuture<'a, Result<Box<dyn NodeVm>>>;

    /// Releases what a VM of `dir` that is gone without a handle still held (its cgroup);
    /// returns what was removed.
    fn release_gone<'a>(&'a self, dir: &'a Path) -> BoxFuture<'a, Vec<PathBuf>>;

    /// Removes what gone VMs left (empty cgroups), those of directories under `own` at any
    /// age; returns what was removed.
    fn sweep_cgroups(&self, own: &Path) -> Result<Vec<PathBuf>>;

    /// Sets the CPU priority of the VMM started in `dir` whose handle does not exist yet;
    /// `Ok(false)` when none runs there (yet).
    fn set_priority_in(&self, dir: &Path, priority: Priority) -> Result<bool>;

    /// The VMM's version, recorded in snapshot manifests.
    fn version(&self) -> &QemuVersion;

    /// The accelerator guests run under, recorded in snapshot manifests.
    fn accel(&self) -> Accel;
}

/// A VM as a node drives it. Dropping the handle kills the VM; [`NodeVm::detach`] lets it
/// go instead.
pub trait NodeVm: Send + Sync {
    /// The sandbox directory.
    fn dir(&self) -> &Path;
    /// The VMM's process id.
    fn pid(&self) -> u32;
    /// Stops the vCPUs ([`Vm::pause`]).
    fn pause(&self) -> BoxFuture<'_, Result<()>>;
    /// Restarts the vCPUs ([`Vm::resume`]).
    fn resume(&self) -> BoxFuture<'_, Result<()>>;
    /// Writes a full snapshot into `dest` ([`Vm::snapshot`]).
    fn snapshot<'a>(&'a self, dest: &'a Path) -> BoxFuture<'a, Result<SnapshotInfo>>;
    /// Where snapshots clone the RAM file and disk from ([`Vm::set_backing`]).
    fn set_backing(&self, backing: Option<crate::Backing>);
    /// Kills the VM and waits for its process ([`Vm::kill`]).
    fn kill(&self) -> BoxFuture<'_, Result<ExitInfo>>;
    /// Waits until the VM process exits ([`Vm::wait`]).
    fn wait(&self) -> BoxFuture<'_, ExitInfo>;
    /// `Err(Error::Exited)` once the VM process is gone.
    fn check_alive(&self) -> Result<()>;
    /// The VM's run state.
    fn status(&self) -> BoxFuture<'_, Result<Status>>;
    /// Changes how the VMM is scheduled ([`Vm::set_priority`]).
    fn set_priority(&self, priority: Priority) -> Result<()>;
    /// A new connection to the `space.ctl` port ([`Vm::connect_ctl`]).
    fn connect_ctl(&self) -> BoxFuture<'_, Result<UnixStream>>;
    /// The last `max` bytes of the guest console, sanitized.
    fn console_tail(&self, max: usize) -> String;
    /// Waits for the guest daemon to report ready ([`Vm::wait_ready`]).
    fn wait_ready(&self, timeout: Duration) -> BoxFuture<'_, Result<GuestClient>>;
    /// The size of the VM's root disk as the VM sees it.
    fn disk_bytes(&self) -> BoxFuture<'_, Result<u64>>;
    /// Grows the root disk of the running VM to `bytes` (the guest grows its filesystem).
    fn resize_disk(&self, bytes: u64) -> BoxFuture<'_, Result<()>>;
    /// Lets the VM go without killing it, for a later [`NodeRuntime::adopt`].
    fn detach(self: Box<Self>);
    /// What the VMM uses of the host now ([`crate::usage`]); `None` once it is gone.
    fn host_usage(&self) -> Option<crate::HostUsage>;
    /// The splice the VM's channels go through, if it was restored with one
    /// ([`crate::RestoreSpec::splice`]).
    fn splice(&self) -> Option<crate::Splice> {
        None
    }
    /// Stops the VM and saves its device state, its files synced but not cloned
    /// ([`QemuVm::save_state`]). A runtime that cannot answers [`crate::Error::Invalid`].
    fn save_state<'a>(&'a self, dest: &'a Path) -> BoxFuture<'a, Result<SnapshotInfo>> {
        let _ = dest;
        Box::pin(async {
            Err(crate::Error::Invalid(
                "this runtime cannot save a VM's state alone".into(),
            ))
        })
    }
}

impl NodeRuntime for QemuRuntime {
    fn boot(&self, spec: BootSpec) -> BoxFuture<'_, Result<Box<dyn NodeVm>>> {
        Box::pin(async move { Ok(Box::new(Runtime::boot(self, spec).await?) as Box<dyn NodeVm>) })
    }

    fn restore(&self, spec: RestoreSpec) -> BoxFuture<'_, Result<Box<dyn NodeVm>>> {
        Box::pin(
            async move { Ok(Box::new(Runtime::restore(self, spec).await?) as Box<dyn NodeVm>) },
        )
    }

    fn adopt<'a>(&'a self, dir: &'a Path) -> BoxFuture<'a, Result<Box<dyn NodeVm>>> {
        Box::pin(
            async move { Ok(Box::new(QemuRuntime::adopt(self, dir).await?) as Box<dyn NodeVm>) },
        )
    }

    fn release_gone<'a>(&'a self, dir: &'a Path) -> BoxFuture<'a, Vec<PathBuf>> {
        Box::pin(QemuRuntime::release_gone(self, dir))
    }

    fn sweep_cgroups(&self, own: &Path) -> Result<Vec<PathBuf>> {
        QemuRuntime::sweep_cgroups(self, own)
    }

    fn set_priority_in(&self, dir: &Path, priority: Priority) -> Result<bool> {
        QemuRuntime::set_priority_in(self, dir, priority)
    }

    fn version(&self) -> &QemuVersion {
        QemuRuntime::version(self)
    }

    fn accel(&self) -> Accel {
        QemuRuntime::accel(self)
    }
}

impl NodeVm for QemuVm {
    fn dir(&self) -> &Path {
        Vm::dir(self)
    }
    fn pid(&self) -> u32 {
        QemuVm::pid(self)
    }
    fn pause(&self) -> BoxFuture<'_, Result<()>> {
        Box::pin(Vm::pause(self))
    }
    fn resume(&self) -> BoxFuture<'_, Result<()>> {
        Box::pin(Vm::resume(self))
    }
    fn snapshot<'a>(&'a self, dest: &'a Path) -> BoxFuture<'a, Result<SnapshotInfo>> {
        Box::pin(Vm::snapshot(self, dest))
    }
    fn set_backing(&self, backing: Option<crate::Backing>) {
        Vm::set_backing(self, backing)
    }
    fn kill(&self) -> BoxFuture<'_, Result<ExitInfo>> {
        Box::pin(Vm::kill(self))
    }
    fn wait(&self) -> BoxFuture<'_, ExitInfo> {
        Box::pin(Vm::wait(self))
    }
    fn check_alive(&self) -> Result<()> {
        Vm::check_alive(self)
    }
    fn status(&self) -> BoxFuture<'_, Result<Status>> {
        Box::pin(QemuVm::status(self))
    }
    fn set_priority(&self, priority: Priority) -> Result<()> {
        Vm::set_priority(self, priority)
    }
    fn connect_ctl(&self) -> BoxFuture<'_, Result<UnixStream>> {
        Box::pin(Vm::connect_ctl(self))
    }
    fn console_tail(&self, max: usize) -> String {
        Vm::console_tail(self, max)
    }
    fn wait_ready(&self, timeout: Duration) -> BoxFuture<'_, Result<GuestClient>> {
        Box::pin(Vm::wait_ready(self, timeout))
    }
    fn disk_bytes(&self) -> BoxFuture<'_, Result<u64>> {
        Box::pin(QemuVm::disk_bytes(self))
    }
    fn resize_disk(&self, bytes: u64) -> BoxFuture<'_, Result<()>> {
        Box::pin(QemuVm::resize_disk(self, bytes))
    }
    fn detach(self: Box<Self>) {
        QemuVm::detach(*self)
    }
    fn host_usage(&self) -> Option<crate::HostUsage> {
        crate::usage::of_vm(QemuVm::pid(self), self.cgroup())
    }
    fn splice(&self) -> Option<crate::Splice> {
        self.splice.clone()
    }
    fn save_state<'a>(&'a self, dest: &'a Path) -> BoxFuture<'a, Result<SnapshotInfo>> {
        Box::pin(QemuVm::save_state(self, dest))
    }
}
