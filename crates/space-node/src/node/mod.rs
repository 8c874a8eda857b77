//! The node: templates and the sandboxes of one host, behind one API.
//!
//! [`Node`] owns the machinery (runtime, storage, layout, record store) and a map from sandbox
//! id to the handle of that sandbox's state driver ([`crate::sandbox`]). Creating a sandbox
//! happens here (there is no driver yet); every later request goes to the driver as one
//! message and is answered when the driver has handled it. A background reconciler
//! ([`Node::reconcile_timeouts`]) enforces idle timeouts and maximum lifetimes.
//!
//! The node drives its runtime through [`space_runtime::NodeRuntime`] (QEMU's by default,
//! [`Node::open_with`] takes another): the lifecycle of [`space_runtime::Runtime`] plus what
//! only a node needs, adoption, cgroup sweeps and the VMM version and accelerator that
//! template manifests record. The node's unit tests run it on a fake runtime.

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

mod cluster;
mod config;
mod records;
mod templates;

pub use config::{NodeConfig, DEFAULT_MAX_DISK_MIB};
pub(crate) use records::{new_record, MachineShape, Owner};
use records::{validate_options, validate_timeouts};

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
}

/// One host's node services. Cheap to clone.
#[derive(Clone)]
pub struct Node {
    inner: Arc<Inner>,
}

impl Node {
    /// Prepares the data directory (mounting a loop-backed btrfs image when needed), probes
    /// QEMU, recovers the sandboxes an earlier node process left ([`crate::recovery`]: live
    /// VMs adopted, lost ones restored, cut-short transitions finished or undone, orphans
    /// removed), and starts the timeout reconciler.
    pub async fn open(config: NodeConfig) -> Result<Node> {
        let runtime = QemuRuntime::new(config.qemu.clone()).await?;
        Node::open_with(config, Arc::new(runtime)).await
    }

    /// [`Node::open`] on a runtime of the caller's ([`NodeConfig::qemu`] is not used).
    pub async fn open_with(config: NodeConfig, runtime: Arc<dyn NodeRuntime>) -> Result<Node> {
        let (data, opts) = (config.data_dir.clone(), config.storage.clone());
        let (storage, layout): (Arc<dyn Storage>, Layout) =
            blocking(move || Ok(storage::open(&data, &opts)?)).await?;
        let records = RecordStore::open(layout.root().join("state").join("sandboxes"))?;
        let (ca_dir, gw) = (
            layout.root().join("state").join("ca"),
            config.gateway.clone(),
        );
        let gateway = blocking(move || {
            Gateway::open(&ca_dir, gw)
                .map_err(|e| NodeError::internal(format!("egress gateway: {e}")))
        })
        .await?;
        let ctx = Arc::new(Ctx {
            runtime,
            storage,
            layout,
            records,
            ready_timeout: config.ready_timeout,
            auto_restore: config.auto_restore,
            gateway,
            archive: std::sync::OnceLock::new(),
            archive_lock: tokio::sync::Mutex::new(()),
            fenced: false.into(),
            discarding: Default::default(),
            disk_reserve_mib: config.admission.disk_reserve_mib,
        });
        let node = Node {
            inner: Arc::new(Inner {
                pools: Pools::new(ctx.clone(), config.pools.clone()),
                ctx,
                admission: Admission::new(config.admission.clone()),
                rolling: config.rolling,
                max_disk_mib: config.max_disk_mib,
                sandboxes: Mutex::default(),
                shutting_down: false.into(),
                adopted: Mutex::default(),
                last_gc_ms: now_ms().into(),
            }),
        };
        // A node process that died while fenced left its guests stopped (crate::fence):
        // recovery adopts them, so they continue; a member fences them again at its start.
        for pid in node.vm_pids() {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            if stat
                .rsplit_once(") ")
                .is_some_and(|(_, rest)| rest.starts_with('T'))
            {
                tracing::warn!(pid, "continuing a VM a fence stopped");
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGCONT,
                );
            }
        }
        node.recover_pass(true).await?;
        if let Some(cfg) = config.archive.clone() {
            node.attach_archive(cfg, true).await?;
        }
        if let Some(tick) = config.timeout_tick {
            tokio::spawn(reconcile_every(
                Arc::downgrade(&node.inner),
                tick,
                |inner| async move {
                    reconcile(&inner).await;
                },
            ));
        }
        if config.rolling.enabled {
            tokio::spawn(reconcile_every(
                Arc::downgrade(&node.inner),
                config.rolling.tick,
                |inner| async move {
                    rolling_pass(&inner).await;
                },
            ));
        }
        // After recovery, which removes sandbox directories no record names.
        node.inner.pools.spawn_loop();
        Ok(node)
    }

    /// Gives the node its object store, once: when `adopt`, every sandbox the store holds
    /// that this node has no record of comes back as a Suspended record (a single host that
    /// lost its disk; see [`Node::take_adopted`]); a node of a cluster adopts only the
    /// sandboxes the control plane moves to it ([`Node::adopt`]). Then the archive pass
    /// starts. A store that cannot be reached or listed does not keep the node's own
    /// sandboxes down: it is logged, and uploads retry on every pass.
    pub async fn attach_archive(&self, cfg: ArchiveConfig, adopt: bool) -> Result<()> {
        if self.inner.ctx.archive.set(cfg).is_err() {
            return Err(NodeError::Invalid(
                "this node already has an object store".into(),
            ));
        }
        let cfg = self.inner.ctx.archive.get().expect("just set");
        let checked = cfg.archive.check().await;
        if let Err(e) = &checked {
            tracing::error!(error = %e, "object store");
        }
        if adopt {
            let found = match checked {
                Ok(()) => crate::archive::adopt_archived(&self.inner.ctx, cfg).await,
                Err(e) => Err(NodeError::Archive(e.to_string())),
            };
            match found {
                Ok(found) => {
                    for r in found {
                        let h = Sandbox::spawn(self.inner.ctx.clone(), r.clone(), None)?;
                        self.lock_sandboxes().insert(r.id.clone(), h);
                        self.inner
                            .adopted
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push(r);
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, "object store: archived sandboxes not listed")
                }
            }
        }
        tokio::spawn(reconcile_every(
            Arc::downgrade(&self.inner),
            crate::archive::ARCHIVE_TICK,
            |inner| async move {
                if !Node::is_fenced(&inner) {
                    crate::archive::pass(&inner.ctx, handles_of(&inner), &inner.last_gc_ms).await;
                }
            },
        ));
        Ok(())
    }

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

    // ---- create --------------------------------------------------------------------------

    /// Creates a sandbox from a template and returns it Running (guest ready, identity set).
    ///
    /// With the template's vCPUs and memory (the default) this restores the template's
    /// snapshot into a CoW clone; with another shape it cold-boots the template's kernel on a
    /// clone of its root image (seconds under TCG; build a template variant with that shape
    /// for the fast path). A disk size larger than the image's grows the disk and the root
    /// filesystem once the guest runs (a smaller one, or one over
    /// [`NodeConfig::max_disk_mib`], is refused). A create that fails
    /// leaves nothing behind (no directory, no record).
    pub async fn create(&self, req: CreateRequest) -> Result<SandboxInfo> {
        self.check_open()?;
        let ctx = &self.inner.ctx;
        let t = template::resolve(&ctx.layout, &req.template, &req.version)?;
        t.check_runtime(&*ctx.runtime)?;
        let opts = req.options;
        validate_options(&opts, &t, self.inner.max_disk_mib)?;
        let vcpus = opts.vcpus.unwrap_or(t.manifest.vcpus);
        let memory_mib = opts.memory_mib.unwrap_or(t.manifest.memory_mib);
        let disk_mib = opts.disk_mib.unwrap_or(t.image_mib());
        let ticket = self.admit(vcpus, memory_mib)?;
        let (how, origin) = if vcpus == t.manifest.vcpus && memory_mib == t.manifest.memory_mib {
            (
                Launch::Restore {
                    snapshot: t.snapshot(),
                },
                Origin::Template,
            )
        } else {
            (
                Launch::Boot {
                    kernel: t.kernel(),
                    rootfs: t.rootfs(),
                    vcpus,
                    memory_mib,
                    kernel_cmdline: Some(t.manifest.kernel_cmdline.clone()),
                },
                Origin::TemplateColdBoot,
            )
        };
        let mut record = new_record(
            SandboxId::generate(),
            t.template_ref().clone(),
            opts,
            MachineShape {
                vcpus,
                memory_mib,
                disk_mib,
            },
            origin,
            None,
            Owner {
                tenant: req.tenant.clone(),
                lineage: None,
            },
        );
        record.guest = t.manifest.guest.clone();
        if let Launch::Restore { .. } = how {
            // A warm-pool member if there is one (`crate::pool`), else the restore below.
            if let Some(live) = self.inner.pools.take(t.template_ref(), &mut record).await {
                return self.register(record, live);
            }
            let t0 = Instant::now();
            let info = self.start(record, how, ticket).await?;
            self.inner.pools.restored(t.template_ref(), t0.elapsed());
            return Ok(info);
        }
        self.start(record, how, ticket).await
    }

    /// Forks a Running or Paused sandbox: a full snapshot of the parent (listed among its
    /// snapshots, reason `fork`) restored into a new sandbox with its own id, hostname and
    /// entropy. The child is Running; the parent stays as it was.
    pub async fn fork(&self, id: &SandboxId) -> Result<SandboxInfo> {
        self.check_open()?;
        let shape = self.info(id).await?;
        let ticket = self.admit(shape.vcpus, shape.memory_mib)?;
        let point: ForkPoint = self.call(id, Request::Fork).await?;
        let parent = point.parent;
        let mut record = new_record(
            SandboxId::generate(),
            parent.template.clone(),
            parent.options.clone(),
            MachineShape {
                vcpus: parent.vcpus,
                memory_mib: parent.memory_mib,
                disk_mib: parent.disk_mib,
            },
            Origin::Snapshot {
                sandbox: parent.id.clone(),
                snapshot: point.snapshot.clone(),
            },
            Some((parent.id.clone(), point.snapshot.clone())),
            Owner {
                tenant: parent.tenant.clone(),
                lineage: Some(parent.lineage().to_owned()),
            },
        );
        record.guest = parent.guest.clone();
        self.start(
            record,
            Launch::Restore {
                snapshot: point.dir,
            },
            ticket,
        )
        .await
    }

    /// Makes the sandbox directory, starts the VM, records the outcome and spawns the driver.
    /// `_ticket` (admission) is held until the driver is registered and counts the VM.
    async fn start(
        &self,
        record: SandboxRecord,
        how: Launch,
        _ticket: Ticket,
    ) -> Result<SandboxInfo> {
        let ctx = self.inner.ctx.clone();
        let id = record.id.clone();
        let dir = ctx.layout.sandbox_dir(id.as_str())?;
        ctx.records.write(&record)?;
        let made = async {
            let (s, d) = (ctx.storage.clone(), dir.clone());
            blocking(move || Ok(s.create_volume(&d)?)).await?;
            launch(&ctx, &dir, how, &record).await
        }
        .await;
        let live = match made {
            Ok(live) => live,
            Err(e) => {
                let (s, d) = (ctx.storage.clone(), dir.clone());
                let _ = blocking(move || {
                    let _ = clear_vm_files(&d);
                    Ok(s.delete_volume(&d)?)
                })
                .await
                .map_err(|cleanup| tracing::error!(error = %cleanup, "removing a failed sandbox"));
                let _ = ctx.records.remove(&id);
                return Err(e);
            }
        };
        self.register(record, live)
    }

    /// Records a sandbox whose VM is ready (`live`) as Running and spawns its driver.
    fn register(&self, mut record: SandboxRecord, live: Live) -> Result<SandboxInfo> {
        let ctx = self.inner.ctx.clone();
        let id = record.id.clone();
        let dir = ctx.layout.sandbox_dir(id.as_str())?;
        let now = now_ms();
        record.state = State::Running;
        record.pending = None;
        record.state_since_unix_ms = now;
        record.started_unix_ms = now;
        record.last_activity_unix_ms = now;
        if let Err(e) = ctx.records.write(&record) {
            drop(live);
            let _ = ctx.storage.delete_volume(&dir);
            let _ = ctx.records.remove(&id);
            return Err(e.into());
        }
        let handle = Sandbox::spawn(ctx, record.clone(), Some(live))?;
        self.inner
            .sandboxes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, handle);
        Ok(record)
    }

    // ---- requests to a sandbox's driver --------------------------------------------------

    /// Sends a request to the driver of `id` and waits for the answer. A sandbox without a
    /// driver (killed, or left by an earlier process) answers from its record: the request is
    /// refused for its state.
    async fn call<T>(
        &self,
        id: &SandboxId,
        make: impl FnOnce(crate::sandbox::Reply<T>) -> Request,
    ) -> Result<T> {
        let (tx, rx) = crate::sandbox::reply();
        let req = make(tx);
        let handle = self
            .inner
            .sandboxes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned();
        let refused = |req: &Request| -> NodeError {
            match self.inner.ctx.records.read(id) {
                Ok(Some(r)) => NodeError::IllegalState {
                    id: id.clone(),
                    request: req.name(),
                    state: r.state,
                    legal: req.legal(),
                },
                Ok(None) => NodeError::NotFound(id.clone()),
                Err(e) => e.into(),
            }
        };
        let Some(handle) = handle else {
            if self.is_shutting_down() {
                return Err(NodeError::ShuttingDown);
            }
            return Err(refused(&req));
        };
        if let Err(tokio::sync::mpsc::error::SendError(req)) = handle.tx.send(req).await {
            if self.is_shutting_down() {
                return Err(NodeError::ShuttingDown);
            }
            // The driver is gone without its sandbox being finished with (a panic it could
            // not recover from): not a refusal.
            if let Some(why) = handle.status.fault() {
                return Err(NodeError::internal(format!("sandbox {id}: {why}")));
            }
            return Err(refused(&req));
        }
        rx.await.map_err(|_| NodeError::ShuttingDown)?
    }

    /// Makes the state driver of `id` panic in the middle of a request (after writing a
    /// transition's intent), for tests of panic isolation. Not part of any API.
    #[cfg(any(test, feature = "test-hooks"))]
    pub async fn inject_panic(&self, id: &SandboxId) -> Result<()> {
        self.call(id, Request::Panic).await
    }

    /// The sandbox's record as of now.
    pub async fn info(&self, id: &SandboxId) -> Result<SandboxInfo> {
        match self.call(id, Request::Info).await {
            // The sandbox's driver ended while the request waited (it was being killed): the
            // record says how it ended.
            Err(NodeError::ShuttingDown) if !self.is_shutting_down() => self
                .inner
                .ctx
                .records
                .read(id)?
                .ok_or_else(|| NodeError::NotFound(id.clone())),
            Err(NodeError::IllegalState { .. }) => self
                .inner
                .ctx
                .records
                .read(id)?
                .ok_or_else(|| NodeError::NotFound(id.clone())),
            other => other,
        }
    }

    /// Every sandbox with a record on this node (terminated ones included), oldest first.
    pub async fn list(&self) -> Result<Vec<SandboxInfo>> {
        let ctx = self.inner.ctx.clone();
        let all = blocking(move || Ok(ctx.records.list()?)).await?;
        Ok(all.into_iter().filter(|r| !r.is_pooled()).collect())
    }

    /// State and shape of every sandbox on this node that is not terminated, read without
    /// waiting for any driver (for quota and capacity accounting on a hot path; a request in
    /// flight may change a state right after).
    pub fn usage(&self) -> Vec<SandboxUsage> {
        self.inner
            .sandboxes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(id, h)| SandboxUsage {
                id: id.clone(),
                state: h.status.state(),
                vcpus: h.status.vcpus,
                memory_mib: h.status.memory_mib,
                epoch: h.status.epoch,
            })
            .filter(|u| u.state != State::Terminated)
            .collect()
    }

    /// Stops the vCPUs (Running only); memory stays.
    pub async fn pause(&self, id: &SandboxId) -> Result<()> {
        self.call(id, Request::Pause).await
    }

    /// Restarts the vCPUs (Paused only).
    pub async fn resume(&self, id: &SandboxId) -> Result<()> {
        self.call(id, Request::Resume).await
    }

    /// Full snapshot, then the VM exits and its RAM file is freed (Running or Paused).
    pub async fn suspend(&self, id: &SandboxId) -> Result<SnapshotRecord> {
        self.call(id, Request::Suspend).await
    }

    /// Back to Running from the suspend snapshot, with a new identity step (Suspended only).
    pub async fn restore(&self, id: &SandboxId) -> Result<()> {
        let _ticket = self.admit_for(id)?;
        self.call(id, Request::Restore).await
    }

    /// Takes a snapshot now (Running or Paused).
    pub async fn snapshot(&self, id: &SandboxId, kind: SnapshotKind) -> Result<SnapshotRecord> {
        self.call(id, |r| Request::Snapshot(kind, r)).await
    }

    /// The sandbox's snapshots, oldest first (any state, terminated included).
    pub async fn snapshots(&self, id: &SandboxId) -> Result<Vec<SnapshotRecord>> {
        Ok(self.info(id).await?.snapshots)
    }

    /// Replaces the sandbox's VM with one started from one of its own snapshots: a full one
    /// brings back memory and disk, a disk-only one cold-boots on a clone of that disk.
    /// Legal when Running, Paused, Suspended or Failed; ends Running.
    pub async fn rollback(&self, id: &SandboxId, snapshot: &SnapshotId) -> Result<()> {
        let snap = snapshot.clone();
        let _ticket = self.admit_for(id)?;
        match self.call(id, |r| Request::Rollback(snap, r)).await {
            Err(NodeError::SnapshotNotFound {
                sandbox,
                snapshot,
                owner: None,
            }) => {
                // Say whose snapshot it is, if it is anyone's on this node.
                let owner = self.list().await.ok().and_then(|all| {
                    all.into_iter()
                        .find(|r| r.snapshot(&snapshot).is_some())
                        .map(|r| r.id)
                });
                Err(NodeError::SnapshotNotFound {
                    sandbox,
                    snapshot,
                    owner,
                })
            }
            other => other,
        }
    }

    /// A client for the guest daemon (exec, files, ...) while the sandbox is Running. A
    /// Paused sandbox is refused rather than resumed: resuming is the caller's decision.
    /// Counts as activity; traffic on the client afterwards does not pass through the node.
    pub async fn guest(&self, id: &SandboxId) -> Result<GuestClient> {
        self.call(id, Request::Guest).await
    }

    /// Replaces the idle timeout, maximum lifetime and timeout action of a sandbox that is not
    /// terminated; the reconciler uses the new values from its next pass.
    pub async fn set_timeouts(
        &self,
        id: &SandboxId,
        timeouts: TimeoutPolicy,
    ) -> Result<SandboxInfo> {
        validate_timeouts(&timeouts)?;
        self.call(id, |r| Request::SetTimeouts(timeouts, r)).await
    }

    /// Replaces the egress policy of a sandbox that is not terminated. New connections use it
    /// at once (open ones are not cut); it is kept in the record and copied by fork.
    pub async fn set_egress(&self, id: &SandboxId, policy: EgressPolicy) -> Result<SandboxInfo> {
        policy.validate().map_err(NodeError::Invalid)?;
        self.call(id, |r| Request::SetEgress(policy, r)).await
    }

    /// The deployment CA's certificate (PEM) that guests trust for intercepted TLS.
    pub fn ca_pem(&self) -> String {
        self.inner.ctx.gateway.ca_pem()
    }

    /// The last `max_bytes` of the sandbox's serial console (kernel messages and whatever the
    /// guest writes there). Empty once the sandbox directory is gone (killed).
    pub async fn console_tail(&self, id: &SandboxId, max_bytes: usize) -> Result<Vec<u8>> {
        // The id must be one of ours; the file itself needs no actor.
        self.info(id).await?;
        let path = self
            .inner
            .ctx
            .layout
            .sandbox_dir(id.as_str())?
            .join(space_runtime::cmdline::CONSOLE_LOG);
        blocking(move || tail_of(&path, max_bytes)).await
    }

    /// Like [`Node::guest`], but a Paused sandbox is resumed and a Suspended one restored
    /// (from this node's copy or the object store) first, unless its `auto_resume` is off
    /// (then the refusal is answered as is). Says what it woke. Concurrent callers wake the
    /// sandbox once: the others find it running.
    pub async fn guest_waking(&self, id: &SandboxId) -> Result<(GuestClient, Option<Wake>)> {
        let mut woke = None;
        for _ in 0..3 {
            let err = match self.guest(id).await {
                Ok(c) => return Ok((c, woke)),
                Err(e) => e,
            };
            let NodeError::IllegalState { state, .. } = &err else {
                return Err(err);
            };
            let state = *state;
            if !matches!(state, State::Paused | State::Suspended) {
                return Err(err);
            }
            if !self.info(id).await?.options.auto_resume {
                return Err(err);
            }
            let r = match state {
                State::Paused => self.resume(id).await.map(|_| Wake::Resumed),
                _ => self.restore(id).await.map(|_| Wake::Restored),
            };
            match r {
                Ok(w) => woke = Some(w),
                // Someone else woke it in between.
                Err(NodeError::IllegalState { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        self.guest(id).await.map(|c| (c, woke))
    }

    /// Drops this node's copy of an archived snapshot of a Suspended sandbox (a restore
    /// fetches it again). Answers whether it did (false: not archived, or not here).
    pub async fn evict_local(&self, id: &SandboxId, snapshot: &SnapshotId) -> Result<bool> {
        let snap = snapshot.clone();
        self.call(id, |r| Request::Evict(snap, r)).await
    }

    /// Uploads what should be in the object store and is not (restore points of suspended
    /// sandboxes, snapshots taken on request, and every upload interval the newest full
    /// snapshot of each live sandbox), then evicts local copies over the cache limits. Takes
    /// no input and can run at any time.
    pub async fn reconcile_archive(&self) -> ArchiveReport {
        crate::archive::pass(
            &self.inner.ctx,
            handles_of(&self.inner),
            &self.inner.last_gc_ms,
        )
        .await
    }

    /// Deletes what nobody can use in the object store: packs no manifest references (older
    /// than `grace`, so uploads in progress keep theirs) and the objects of shredded lineages
    /// (`space_archive::gc`). The archive pass does this every hour with an hour of grace.
    pub async fn collect_garbage(&self, grace: Duration) -> Result<space_archive::gc::GcReport> {
        let cfg = self
            .archive()
            .ok_or_else(|| NodeError::Invalid("this node has no object store".into()))?;
        space_archive::gc::collect(&cfg.archive, &cfg.keyring, grace)
            .await
            .map_err(|e| NodeError::Archive(format!("garbage collection: {e}")))
    }

    /// Counts as activity for the idle timeout (for callers that use a client they hold).
    pub async fn touch(&self, id: &SandboxId) -> Result<()> {
        self.call(id, Request::Touch).await
    }

    /// Kills the VM and removes the sandbox directory; the record (Terminated) and the
    /// snapshots stay.
    pub async fn kill(&self, id: &SandboxId) -> Result<()> {
        self.call(id, Request::Kill).await?;
        self.inner
            .sandboxes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id);
        Ok(())
    }

    // ---- background work -----------------------------------------------------------------

    /// Suspends (or kills, per policy) every Running or Paused sandbox whose idle timeout or
    /// maximum lifetime has passed. Takes no input and can run at any time: the driver checks
    /// the condition again before acting. Returns how many sandboxes it stopped.
    pub async fn reconcile_timeouts(&self) -> usize {
        reconcile(&self.inner).await
    }

    /// Brings the warm pools to their configured sizes and drops pools of templates that are
    /// gone or superseded ([`crate::pool`]). Takes no input; returns how many VMs it made.
    pub async fn reconcile_pools(&self) -> usize {
        self.inner.pools.reconcile().await
    }

    /// Size, readiness, hits and misses of every warm pool.
    pub fn pool_stats(&self) -> Vec<PoolStats> {
        self.inner.pools.stats()
    }

    /// Takes the rolling snapshots that are due and deletes what retention says
    /// ([`crate::scheduler`]). Takes no input and can run at any time.
    pub async fn reconcile_snapshots(&self) -> RollingReport {
        rolling_pass(&self.inner).await
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

/// What [`Node::guest_waking`] did before answering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// The sandbox was Paused and was resumed.
    Resumed,
    /// The sandbox was Suspended and was restored.
    Restored,
}

impl Wake {
    /// `resume` or `restore`.
    pub fn as_str(self) -> &'static str {
        match self {
            Wake::Resumed => "resume",
            Wake::Restored => "restore",
        }
    }
}

/// What [`Node::usage`] tells of one sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxUsage {
    /// The sandbox.
    pub id: SandboxId,
    /// Its state now.
    pub state: State,
    /// vCPUs of its VM (when it has one).
    pub vcpus: u32,
    /// Guest RAM of its VM in MiB (when it has one).
    pub memory_mib: u64,
    /// The ownership epoch this node holds it under (0: its first owner).
    pub epoch: u64,
}

async fn reconcile(inner: &Inner) -> usize {
    if Node::is_fenced(inner) {
        return 0;
    }
    let now = now_ms();
    let due: Vec<_> = inner
        .sandboxes
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter_map(|(id, h)| Some((id.clone(), h.clone(), h.status.expired(now)?)))
        .collect();
    let mut acted = 0;
    let mut waits = Vec::new();
    for (id, h, kind) in due {
        let (tx, rx) = crate::sandbox::reply();
        if h.tx.send(Request::Timeout(kind, tx)).await.is_ok() {
            waits.push((id, rx));
        }
    }
    for (id, rx) in waits {
        match rx.await {
            Ok(Ok(true)) => acted += 1,
            Ok(Ok(false)) | Err(_) => {}
            Ok(Err(e)) => tracing::error!(%id, error = %e, "acting on a timeout"),
        }
    }
    acted
}

/// Every sandbox handle, for a pass over them.
fn handles_of(inner: &Inner) -> Vec<(SandboxId, Handle)> {
    inner
        .sandboxes
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .map(|(id, h)| (id.clone(), h.clone()))
        .collect()
}

async fn rolling_pass(inner: &Inner) -> RollingReport {
    if Node::is_fenced(inner) {
        return RollingReport::default();
    }
    let handles: Vec<(SandboxId, Handle)> = inner
        .sandboxes
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .map(|(id, h)| (id.clone(), h.clone()))
        .collect();
    crate::scheduler::reconcile(&inner.ctx, handles, &inner.rolling).await
}

/// Runs one reconciler pass every `tick` until the node is dropped or shutting down. A pass
/// takes no input and may run at any time; a tick that is late is delayed, not doubled up.
/// A pass that panics is logged, and the next tick runs the next one.
async fn reconcile_every<F, Fut>(inner: Weak<Inner>, tick: Duration, pass: F)
where
    F: Fn(Arc<Inner>) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut interval = tokio::time::interval(tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        let Some(inner) = inner.upgrade() else { return };
        if inner
            .shutting_down
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            return;
        }
        let one = std::panic::AssertUnwindSafe(pass(inner));
        if let Err(panic) = futures::FutureExt::catch_unwind(one).await {
            tracing::error!(
                panic = %template::panic_message(panic.as_ref()),
                "a reconciler pass panicked; the next tick runs it again"
            );
        }
    }
}

/// The last `max` bytes of a file; empty when it does not exist.
fn tail_of(path: &std::path::Path, max: usize) -> Result<Vec<u8>> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(NodeError::io("opening", path)(e)),
    };
    let len = f
        .metadata()
        .map_err(NodeError::io("inspecting", path))?
        .len();
    let start = len.saturating_sub(max as u64);
    f.seek(SeekFrom::Start(start))
        .map_err(NodeError::io("seeking", path))?;
    let mut out = Vec::with_capacity((len - start) as usize);
    f.take(max as u64)
        .read_to_end(&mut out)
        .map_err(NodeError::io("reading", path))?;
    Ok(out)
}
