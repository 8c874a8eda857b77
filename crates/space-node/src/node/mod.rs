//! The node: templates and the sandboxes of one host, behind one API.
//!
//! [`Node`] owns the machinery (runtime, storage, layout, record store) and a map from sandbox
//! id to the handle of that sandbox's state driver ([`crate::sandbox`]). Creating a sandbox
//! happens in the node (there is no driver yet); every later request goes to the driver as
//! one message and is answered when the driver has handled it. A background reconciler
//! ([`Node::reconcile_timeouts`]) enforces idle timeouts and maximum lifetimes.
//!
//! The node drives its runtime through [`space_runtime::NodeRuntime`] (QEMU's by default,
//! [`Node::open_with`] takes another): the lifecycle of [`space_runtime::Runtime`] plus what
//! only a node needs, adoption, cgroup sweeps and the VMM version and accelerator that
//! template manifests record. The node's unit tests run it on a fake runtime.
//!
//! This file holds [`Node`] itself: its accessors, crash recovery run again, admission and
//! shutdown. The rest of the node is split by concern:
//!
//! - `open.rs`: opening a node on its data directory, and attaching its object store;
//! - `create.rs`: creates and forks, which start a new sandbox's VM and its driver;
//! - `requests.rs`: what a sandbox's driver answers (info, pause, suspend, snapshots,
//!   rollback, the guest, kill) and what the node reads without one (list, usage);
//! - `background.rs`: the reconcilers (timeouts, warm pools, rolling snapshots, the archive
//!   pass) and the loop that runs them;
//! - `templates.rs`: builds, saves, lookups and deletion of templates;
//! - `cluster.rs`: what the node does as a member of a cluster;
//! - `records.rs`: the record of a new sandbox and the checks on its options;
//! - `config.rs`: [`NodeConfig`].

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use space_gateway::{EgressPolicy, Gateway, GatewayConfig};
use space_runtime::{GuestClient, NodeRuntime, QemuRuntime, QemuRuntimeConfig};

use crate::admission::{Admission, AdmissionConfig, Shape, Ticket};
use crate::archive::{ArchiveConfig, ArchiveReport};
use crate::error::{NodeError, Result};
use crate::ids::{SandboxId, SnapshotId, TemplateRef, VersionReq};
use crate::pool::{PoolConfig, PoolStats, Pools};
use crate::record::{
    now_ms, Intent, Origin, Pending, RecordStore, SandboxOptions, SandboxRecord, SnapshotKind,
    SnapshotRecord, State, TimeoutPolicy, RECORD_FORMAT,
};
use crate::recovery::{self, RecoveryReport};
use crate::sandbox::{
    clear_vm_files, launch, CreateRequest, Ctx, ForkPoint, Handle, Launch, Live, Request, Sandbox,
    SandboxInfo,
};
use crate::scheduler::{RollingConfig, RollingReport};
use crate::storage::{self, Layout, Storage, StorageOptions};
use crate::template::{self, blocking, Template};

mod background;
mod cluster;
mod config;
mod create;
mod open;
pub mod preparing;
mod records;
mod requests;
mod templates;
mod volumes;

pub use config::{NodeConfig, DEFAULT_MAX_DISK_MIB, DEFAULT_METRICS_TICK};
pub(crate) use records::{new_record, MachineShape, Owner};
use records::{validate_options, validate_timeouts};
pub use requests::{SandboxUsage, Wake};

struct Inner {
    ctx: Arc<Ctx>,
    admission: Admission,
    pools: Arc<Pools>,
    rolling: RollingConfig,
    max_disk_mib: u64,
    sandboxes: Mutex<HashMap<SandboxId, Handle>>,
    shutting_down: std::sync::atomic::AtomicBool,
    /// Sandboxes found in the object store at open, not yet handed to the control plane.
    adopted: Mutex<Vec<SandboxRecord>>,
    /// When the archive pass last collected garbage in the store, ms since the epoch.
    last_gc_ms: std::sync::atomic::AtomicU64,
    /// Templates being prepared (their images built), by name.
    preparing: Mutex<std::collections::BTreeMap<String, preparing::Preparing>>,
    /// Every sandbox's resource samples ([`crate::metrics`]).
    metrics: crate::metrics::Metrics,
}

/// One host's node services. Cheap to clone.
#[derive(Clone)]
pub struct Node {
    inner: Arc<Inner>,
}

impl Node {
    fn lock_sandboxes(&self) -> std::sync::MutexGuard<'_, HashMap<SandboxId, Handle>> {
        self.inner
            .sandboxes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// The sandboxes this node found in the object store when it opened (a node that lost its
    /// disk, or a fresh one on an existing store), each once: the caller records who owns
    /// them.
    pub fn take_adopted(&self) -> Vec<SandboxRecord> {
        std::mem::take(&mut *self.inner.adopted.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The object store configuration, when the node has one.
    pub fn archive(&self) -> Option<&ArchiveConfig> {
        self.inner.ctx.archive.get()
    }

    /// The data directory layout.
    pub fn layout(&self) -> &Layout {
        &self.inner.ctx.layout
    }

    /// The storage driver.
    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.inner.ctx.storage
    }

    /// The runtime.
    pub fn runtime(&self) -> &dyn NodeRuntime {
        &*self.inner.ctx.runtime
    }

    /// Runs crash recovery again ([`crate::recovery`]): sandboxes the node drives and
    /// transitions in flight are left alone; orphans and cgroups are swept only at start.
    /// Running it when nothing was left behind changes nothing.
    pub async fn recover(&self) -> Result<RecoveryReport> {
        self.recover_pass(false).await
    }

    async fn recover_pass(&self, at_start: bool) -> Result<RecoveryReport> {
        let registered = self
            .inner
            .sandboxes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .cloned()
            .collect();
        let done = recovery::run(&self.inner.ctx, &registered, at_start).await?;
        self.inner
            .sandboxes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(done.handles);
        Ok(done.report)
    }

    /// Admits a new VM of this shape next to the live ones, or refuses.
    fn live_shapes(&self) -> Vec<Shape> {
        self.inner
            .sandboxes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .filter(|h| matches!(h.status.state(), State::Running | State::Paused))
            .map(|h| Shape {
                vcpus: h.status.vcpus,
                memory_mib: h.status.memory_mib,
            })
            .collect()
    }

    /// The memory admission counts with, MiB: all that VMs may take, and what is still free
    /// for a new one (guest RAM plus its overhead). What placement weighs nodes by.
    pub fn memory(&self) -> Result<(u64, u64)> {
        self.inner.admission.memory(&self.live_shapes())
    }

    fn admit(&self, vcpus: u32, memory_mib: u64) -> Result<Ticket> {
        let ctx = &self.inner.ctx;
        crate::admission::check_disk(ctx.layout.root(), ctx.disk_reserve_mib)?;
        self.inner
            .admission
            .admit(Shape { vcpus, memory_mib }, &self.live_shapes())
    }

    /// Admission for a request that starts a VM for a sandbox that has none now.
    fn admit_for(&self, id: &SandboxId) -> Result<Option<Ticket>> {
        let h = self
            .inner
            .sandboxes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned();
        match h {
            Some(h) if matches!(h.status.state(), State::Suspended | State::Failed) => {
                self.admit(h.status.vcpus, h.status.memory_mib).map(Some)
            }
            _ => Ok(None),
        }
    }

    /// The file of a sandbox's record.
    pub fn record_path(&self, id: &SandboxId) -> PathBuf {
        self.inner.ctx.records.path(id)
    }

    // ---- shutdown ------------------------------------------------------------------------

    fn is_shutting_down(&self) -> bool {
        self.inner
            .shutting_down
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    fn check_open(&self) -> Result<()> {
        if self.is_shutting_down() {
            Err(NodeError::ShuttingDown)
        } else {
            Ok(())
        }
    }

    /// Stops every driver and kills every VM. Records stay as they are (a later node sees the
    /// sandboxes as they were). Does not unmount the data directory.
    pub async fn shutdown(&self) {
        self.stop(false).await
    }

    /// Stops every driver and leaves the VMs running (warm-pool members excepted): the next
    /// node process on this data directory adopts them ([`crate::recovery`]), so a restart
    /// of the node costs the sandboxes nothing. Needs a runtime with detached VMs (the
    /// default); others die with the process anyway.
    pub async fn shutdown_detach(&self) {
        self.stop(true).await
    }

    async fn stop(&self, detach: bool) {
        self.inner
            .shutting_down
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let handles: Vec<(SandboxId, Handle)> = self
            .inner
            .sandboxes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain()
            .collect();
        for (_, h) in handles {
            let (tx, rx) = crate::sandbox::reply();
            if h.tx.send(Request::Shutdown(detach, tx)).await.is_ok() {
                let _ = rx.await;
            }
        }
        self.inner.pools.close().await;
    }
}
