//! The state driver of one sandbox: an actor task that owns the sandbox's VM, its guest
//! connection and its record, and takes one [`Request`] at a time from a channel.
//!
//! ```text
//!                   create ─────────► Running ◄──── resume ──── Paused
//!                   (restore/boot)     │  │ ▲ ─────── pause ─────► │
//!                                      │  │ │                      │
//!                       suspend ───────┘  │ └── restore ──┐        │ suspend
//!                                         │               │        │
//!                                         ▼               │        ▼
//!             rollback (any snapshot) ──► Running    Suspended ◄───┘
//!             from Running|Paused|Suspended|Failed
//!
//!   Running|Paused ── fork ──► (parent unchanged) + a new Running sandbox
//!   Running|Paused ── snapshot(disk|full) ──► same state
//!   Running|Paused ── VM exits on its own ──► Failed   (kill or rollback only)
//!   Running|Paused|Suspended|Failed ── kill ──► Terminated   (snapshots and record kept)
//! ```
//!
//! Contract:
//! - A request is checked against [`Request::legal`] first; an illegal one is answered with
//!   [`NodeError::IllegalState`] and nothing (VM, files, record) is touched.
//! - A legal request that changes anything writes the record with `pending` set (the intent)
//!   before acting and writes the outcome after. If it fails, everything it made is removed and
//!   the sandbox stays in its state, with two exceptions: a rollback that fails after the old VM
//!   is gone leaves the sandbox Suspended on the undo snapshot taken just before (nothing lost);
//!   and the VM dying on its own makes it Failed.
//! - Requests never run concurrently for one sandbox; different sandboxes are independent.
//! - A guest connection is only handed out while Running. A Paused sandbox is not resumed on
//!   the caller's behalf: requests on a paused guest would hang, so the caller resumes
//!   explicitly (and sees the refusal otherwise).
//! - A panic in the driver stays in its sandbox: the request it was handling is answered with
//!   [`NodeError::Internal`], the VM is let go without being killed, and the sandbox is
//!   recovered from its record on disk the way crash recovery does at start
//!   ([`crate::recovery::recover_one`]); requests queued meanwhile are served after that.
//!   After [`MAX_PANICS`](panics::MAX_PANICS) panics within
//!   [`PANIC_WINDOW`](panics::PANIC_WINDOW), or when that recovery fails, the driver stops
//!   trying: every request but kill and shutdown is answered with an internal error, and
//!   the VM is left running for the node's next start to adopt (`panics.rs`).
//!
//! Every method of the actor is in this module: the loop, the dispatch and the record keeping
//! here; the lifecycle transitions in `transitions.rs`; its step of rolling snapshots and
//! retention in `rolling.rs` (the policy is [`crate::scheduler`]'s); its snapshots' copies in
//! the object store in `archiving.rs` (the store's format and the archive pass are
//! [`crate::archive`]'s); panic isolation in `panics.rs`; starting a VM in `launch.rs`; the
//! requests and where each is legal in `request.rs`. Other modules start an actor
//! ([`Sandbox::spawn`]) and from then on reach it only through its [`Handle`].

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::FutureExt;
use rand::RngCore;
use space_gateway::{spawn_vm_loop, EgressPolicy, Gateway, SandboxGateway, VmLoop};
use space_proto::{ExecSpec, Identity};
use space_runtime::{
    BootSpec, ClientError, GuestClient, NodeRuntime, NodeVm, Priority, RestoreSpec,
};
use tokio::sync::{mpsc, oneshot};

use crate::error::{NodeError, Result};
use crate::ids::{SnapshotId, VersionReq};
use crate::record::{
    now_ms, Intent, Origin, Pending, RecordStore, SandboxRecord, SnapshotKind, SnapshotReason,
    SnapshotRecord, State, TimeoutAction, TimeoutPolicy,
};
use crate::scheduler::{RollingJob, RollingOutcome};
use crate::storage::{Layout, Storage};
use crate::template::{self, blocking, panic_message};

mod archiving;
mod launch;
mod lazy;
mod panics;
mod request;
mod rolling;
#[cfg(test)]
mod tests;
mod transitions;

pub(crate) use launch::{
    clear_vm_files, dir_size, ensure_disk, identity, launch, mount_volumes, Launch,
};
pub(crate) use request::Request;
use rolling::{DiskMark, DISK_FILE};
use State::{Failed, Paused, Running, Suspended, Terminated};

/// What the actors share with the node: the machinery, never another sandbox's state.
pub(crate) struct Ctx {
    pub runtime: Arc<dyn NodeRuntime>,
    pub storage: Arc<dyn Storage>,
    pub layout: Layout,
    pub records: RecordStore,
    /// How long a started VM may take until its daemon answers.
    pub ready_timeout: Duration,
    /// Whether a VM that dies while the node runs is restored at once ([`crate::recovery`]).
    pub auto_restore: bool,
    /// The egress gateway ([`space_gateway`]).
    pub gateway: Arc<Gateway>,
    /// The object store, when the node has one ([`crate::archive`]).
    pub archive: std::sync::OnceLock<crate::archive::ArchiveConfig>,
    /// Serializes template uploads and fetches (one per template build, not per sandbox).
    pub archive_lock: tokio::sync::Mutex<()>,
    /// How restores from the store fetch ([`crate::archive::RestoreMode`], as a number).
    pub restore_mode: std::sync::atomic::AtomicU8,
    /// Set while the node is fenced (a member that could not renew its lease): no commit to
    /// the object store is made.
    pub fenced: std::sync::atomic::AtomicBool,
    /// Sandboxes whose VM was killed because they belong to another node now: their VM is
    /// not brought back when it exits.
    pub discarding: Mutex<std::collections::HashSet<crate::ids::SandboxId>>,
    /// Free space kept on the data disk, MiB ([`crate::AdmissionConfig::disk_reserve_mib`]).
    pub disk_reserve_mib: u64,
    /// The tenants' volumes kept here ([`crate::volumes`]).
    pub volumes: crate::volumes::VolumeStore,
}

/// The part of a sandbox's state that the node reads without asking the actor (listing,
/// the timeout reconciler): it must not wait behind a long request.
pub(crate) struct Status {
    pub state: Mutex<State>,
    /// Last request through the node, ms since the epoch.
    pub last_activity_ms: AtomicU64,
    /// When the current VM started, ms since the epoch.
    pub started_ms: AtomicU64,
    /// Changed by [`Request::SetTimeouts`]; read by the reconciler.
    pub timeouts: Mutex<TimeoutPolicy>,
    /// vCPUs and guest RAM (MiB) of the sandbox's VM, for admission control.
    pub vcpus: u32,
    pub memory_mib: u64,
    /// The ownership epoch this node holds the sandbox under ([`SandboxRecord::epoch`]).
    pub epoch: u64,
    /// Policy and bindings the sandbox's gateway loop reads; the policy is changed by
    /// [`Request::SetEgress`].
    pub egress: Arc<SandboxGateway>,
    /// Set when the driver failed and stopped driving the sandbox (see the module docs):
    /// what happened, for the internal error callers get.
    pub fault: Mutex<Option<String>>,
    /// Where the time of the sandbox's last restore went.
    pub last_restore: Mutex<Option<crate::archive::RestoreReport>>,
}

impl Status {
    /// Why the driver stopped driving the sandbox, if it did.
    pub fn fault(&self) -> Option<String> {
        self.fault.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set_fault(&self, why: String) {
        *self.fault.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
    }

    pub fn state(&self) -> State {
        *self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn set_state(&self, s: State) {
        *self.state.lock().unwrap_or_else(|e| e.into_inner()) = s;
    }

    pub fn touch(&self) {
        self.last_activity_ms.fetch_max(now_ms(), Ordering::Relaxed);
    }

    /// Which timeout has expired at `now`, if any.
    pub fn expired(&self, now: u64) -> Option<TimeoutKind> {
        let state = self.state();
        if !matches!(state, State::Running | State::Paused) {
            return None;
        }
        let since =
            |t: &AtomicU64| Duration::from_millis(now.saturating_sub(t.load(Ordering::Relaxed)));
        let timeouts = *self.timeouts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(max) = timeouts.max_lifetime {
            if since(&self.started_ms) >= max {
                return Some(TimeoutKind::MaxLifetime);
            }
        }
        if let Some(idle) = timeouts.idle {
            if since(&self.last_activity_ms) >= idle {
                return Some(TimeoutKind::Idle);
            }
        }
        None
    }
}

/// Which timeout fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeoutKind {
    /// No request for the idle period.
    Idle,
    /// Up for longer than the maximum lifetime.
    MaxLifetime,
}

/// The answer to one request. One dropped unanswered (its handler panicked, or the driver
/// went away with it) answers [`NodeError::Internal`] as it goes: a caller never waits for an
/// answer that cannot come, and never mistakes a failure of the node for a refusal.
pub(crate) struct Reply<T>(Option<oneshot::Sender<Result<T>>>);

impl<T> Reply<T> {
    /// Answers; gives the answer back if the caller stopped waiting.
    pub fn send(mut self, answer: Result<T>) -> std::result::Result<(), Result<T>> {
        match self.0.take() {
            Some(tx) => tx.send(answer),
            None => Err(answer),
        }
    }
}

impl<T> Drop for Reply<T> {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(Err(NodeError::internal(
                "the sandbox's state driver failed while handling the request; the node's \
                 log has the cause",
            )));
        }
    }
}

/// A reply and the receiver its answer arrives on.
pub(crate) fn reply<T>() -> (Reply<T>, oneshot::Receiver<Result<T>>) {
    let (tx, rx) = oneshot::channel();
    (Reply(Some(tx)), rx)
}

/// Where a fork's child starts: the parent's full snapshot taken for it.
#[derive(Debug, Clone)]
pub(crate) struct ForkPoint {
    pub parent: SandboxRecord,
    pub snapshot: SnapshotId,
    pub dir: PathBuf,
}

/// The volumes `record` mounts, opened, by mount index. One that cannot be opened (gone
/// from this node) leaves the list empty: the guest's requests for it fail, the rest of the
/// sandbox goes on.
fn mounts_of(ctx: &Ctx, record: &SandboxRecord) -> Vec<space_gateway::volumes::Mount> {
    mounts_for(ctx, &record.id, &record.options.volumes)
}

/// The gateway's mounts of sandbox `id` for `volumes`, each on the volume's open tree here.
pub(crate) fn mounts_for(
    ctx: &Ctx,
    id: &crate::ids::SandboxId,
    volumes: &[space_node_api::VolumeMount],
) -> Vec<space_gateway::volumes::Mount> {
    let mut out = Vec::new();
    for m in volumes {
        match ctx.volumes.open(&m.volume) {
            Ok(tree) => out.push(space_gateway::volumes::Mount {
                tree,
                read_only: m.read_only,
            }),
            Err(e) => {
                tracing::error!(%id, volume = %m.volume, error = %e, "a mounted volume cannot be opened");
                return Vec::new();
            }
        }
    }
    out
}

/// The node's handle on a sandbox actor.
#[derive(Clone)]
pub(crate) struct Handle {
    pub tx: mpsc::Sender<Request>,
    pub status: Arc<Status>,
}

/// A started VM and its ready guest, before the actor takes them.
pub(crate) struct Live {
    pub vm: Box<dyn NodeVm>,
    /// `None` for an adopted paused VM (the driver connects when the guest runs again).
    pub client: Option<GuestClient>,
    /// How long the runtime took to start the VM (zero for an adopted one).
    pub started: Duration,
    /// A lazy restore with a prefetch list: the list's chunks, and how long the loaded VM
    /// waited for them, paused (part of `started`).
    pub prefetch: Option<(usize, Duration)>,
}

/// The actor.
pub(crate) struct Sandbox {
    ctx: Arc<Ctx>,
    record: SandboxRecord,
    status: Arc<Status>,
    dir: PathBuf,
    vm: Option<Box<dyn NodeVm>>,
    client: Option<GuestClient>,
    /// The disk image's fingerprint when its content was last known to be held by a snapshot
    /// or the VM's origin; the rolling step compares it (`rolling.rs`).
    disk_mark: Option<DiskMark>,
    /// The egress gateway loop of the current VM ([`Sandbox::sync_egress`]).
    egress_loop: Option<VmLoop>,
    /// Snapshots fetched from the store straight into the sandbox directory by a restore,
    /// whose local copy (the cache) the archive pass fetches again (not at once: that would
    /// compete with the guest's first requests); with the flag that fetch sets when it ends,
    /// once it is under way. The record says a snapshot is local once its copy is there.
    caching: Vec<(SnapshotId, Option<Arc<std::sync::atomic::AtomicBool>>)>,
    /// When the driver panicked recently (within [`PANIC_WINDOW`](panics::PANIC_WINDOW)).
    panics: Vec<Instant>,
    /// Set once the driver stopped trying to recover the sandbox: why.
    faulted: Option<String>,
    /// The VM runs on a lazy restore's files, still being (or filled) in (`lazy.rs`).
    lazy: Option<lazy::Filling>,
    /// When to move the VM of a filled lazy restore to a new VMM on its local files
    /// (`lazy.rs`).
    handover_at: Option<tokio::time::Instant>,
}

/// Queue depth per sandbox: callers wait beyond it (back-pressure, not errors).
const QUEUE: usize = 64;

impl Sandbox {
    /// Starts the actor of a sandbox whose record is written and whose VM (if any) is live.
    pub fn spawn(ctx: Arc<Ctx>, record: SandboxRecord, live: Option<Live>) -> Result<Handle> {
        let dir = ctx.layout.sandbox_dir(record.id.as_str())?;
        let status = Arc::new(Status {
            state: Mutex::new(record.state),
            last_activity_ms: AtomicU64::new(record.last_activity_unix_ms),
            started_ms: AtomicU64::new(record.started_unix_ms),
            timeouts: Mutex::new(record.options.timeouts),
            vcpus: record.vcpus,
            memory_mib: record.memory_mib,
            epoch: record.epoch,
            egress: ctx.gateway.sandbox(
                record.id.clone(),
                record.options.egress.clone(),
                record.options.secrets.clone(),
            ),
            fault: Mutex::new(None),
            last_restore: Mutex::new(None),
        });
        status.egress.set_mounts(mounts_of(&ctx, &record));
        let (tx, rx) = mpsc::channel(QUEUE);
        let (vm, client) = match live {
            Some(l) => (Some(l.vm), l.client),
            None => (None, None),
        };
        // A VM that just started (create, fork, a restore by recovery) holds its origin's disk:
        // nobody has written to it yet. An adopted VM may have been written since its last
        // snapshot, so it starts unknown, which counts as changed.
        let just_started = now_ms().saturating_sub(record.started_unix_ms) < 5_000;
        let disk_mark = (vm.is_some() && just_started)
            .then(|| DiskMark::of(&dir.join(DISK_FILE)))
            .flatten();
        let id = record.id.clone();
        let actor = Sandbox {
            ctx,
            record,
            status: status.clone(),
            dir,
            vm,
            client,
            disk_mark,
            egress_loop: None,
            caching: Vec::new(),
            panics: Vec::new(),
            faulted: None,
            lazy: None,
            handover_at: None,
        };
        let driver = tokio::spawn(actor.run(rx));
        // The driver catches its own panics; this is for one that escapes (a panic while it
        // recovers from one). The sandbox is then left as it is for the node's next start.
        let watched = status.clone();
        tokio::spawn(async move {
            if let Err(e) = driver.await {
                if e.is_panic() {
                    let why = format!(
                        "its state driver died ({}); the node's next start recovers it",
                        panic_message(e.into_panic().as_ref())
                    );
                    tracing::error!(%id, %why, "sandbox state driver gone");
                    watched.set_fault(why);
                }
            }
        });
        Ok(Handle { tx, status })
    }

    /// Keeps one gateway loop serving the current VM: started when a VM becomes current
    /// (create, restore, rollback, fork, recovery's adoption or restore), replaced when another
    /// VM takes its place, stopped when there is none. Called before every wait for work, so
    /// every transition passes here.
    fn sync_egress(&mut self) {
        let pid = self.vm.as_ref().map(|vm| vm.pid());
        if self.egress_loop.as_ref().map(|l| l.pid) != pid {
            let splice = self.vm.as_ref().and_then(|vm| vm.splice());
            self.egress_loop = pid.map(|pid| {
                spawn_vm_loop(self.status.egress.clone(), self.dir.clone(), pid, splice)
            });
        }
    }

    async fn run(mut self, mut rx: mpsc::Receiver<Request>) {
        loop {
            // Bound first: the step (and the request it held) is gone before recovery starts.
            let step = std::panic::AssertUnwindSafe(self.step(&mut rx))
                .catch_unwind()
                .await;
            match step {
                Ok(false) => {}
                Ok(true) => break,
                Err(panic) => {
                    let panic = panic_message(panic.as_ref());
                    if self.panicked(panic).await {
                        break;
                    }
                }
            }
        }
        // Dropping the VM handle kills QEMU if it still runs (node shutdown).
        drop(self.egress_loop.take());
        drop(self.client.take());
        drop(self.vm.take());
        self.refuse_queued(&mut rx);
    }

    /// Waits for the next request (or the VM's exit) and handles it; true when the driver
    /// should stop.
    async fn step(&mut self, rx: &mut mpsc::Receiver<Request>) -> bool {
        self.sync_egress();
        let next = {
            let exited = async {
                match &self.vm {
                    Some(vm) => vm.wait().await,
                    None => std::future::pending().await,
                }
            };
            let mut filling = self.lazy.as_ref().and_then(|f| f.pending());
            let filled = async {
                match filling.as_mut() {
                    Some(f) => {
                        let _ = f.wait_for(|o| o.is_some()).await;
                    }
                    None => std::future::pending().await,
                }
            };
            let handover_at = self.handover_at;
            let handover = async {
                match handover_at {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                req = rx.recv() => Ok(req),
                exit = exited => Err(exit),
                () = filled => {
                    self.filling_changed().await;
                    return false;
                }
                () = handover => {
                    self.hand_over().await;
                    return false;
                }
            }
        };
        match next {
            Ok(None) => true,
            Ok(Some(req)) => {
                if let Some(why) = self.faulted.clone() {
                    return self.handle_faulted(req, why).await;
                }
                let state = self.record.state;
                if !req.legal().contains(&state) {
                    let err = NodeError::IllegalState {
                        id: self.record.id.clone(),
                        request: req.name(),
                        state,
                        legal: req.legal(),
                    };
                    req.refuse(err);
                    return false;
                }
                if req.is_activity() {
                    self.status.touch();
                }
                self.handle(req).await
            }
            Err(exit) => {
                self.vm_exited(exit.to_string()).await;
                false
            }
        }
    }

    /// Answers what is still queued once the driver ends, as the node answers a sandbox
    /// without a driver: from its record.
    fn refuse_queued(&self, rx: &mut mpsc::Receiver<Request>) {
        rx.close();
        while let Ok(req) = rx.try_recv() {
            let err = match self.ctx.records.read(&self.record.id) {
                Ok(Some(r)) if r.state == Terminated => NodeError::IllegalState {
                    id: self.record.id.clone(),
                    request: req.name(),
                    state: r.state,
                    legal: req.legal(),
                },
                Ok(None) => NodeError::NotFound(self.record.id.clone()),
                _ => NodeError::ShuttingDown,
            };
            req.refuse(err);
        }
    }

    /// Handles one legal request; true when the actor should stop.
    async fn handle(&mut self, req: Request) -> bool {
        match req {
            Request::Info(r) => {
                let mut rec = self.record.clone();
                rec.last_activity_unix_ms = self.status.last_activity_ms.load(Ordering::Relaxed);
                let _ = r.send(Ok(rec));
            }
            Request::Pause(r) => {
                let res = self.pause().await;
                let _ = r.send(res);
            }
            Request::Resume(r) => {
                let res = self.resume().await;
                let _ = r.send(res);
            }
            Request::Suspend(r) => {
                let res = self.suspend(true).await;
                let _ = r.send(res);
            }
            Request::Restore(r) => {
                let res = self.restore().await;
                let _ = r.send(res);
            }
            Request::Snapshot(kind, r) => {
                let res = self.snapshot(kind, SnapshotReason::Request).await;
                let _ = r.send(res);
            }
            Request::Rollback(snap, r) => {
                let res = self.rollback(snap).await;
                let _ = r.send(res);
            }
            Request::Fork(r) => {
                let res = self
                    .snapshot(SnapshotKind::Full, SnapshotReason::Fork)
                    .await;
                let res = res.and_then(|s| {
                    Ok(ForkPoint {
                        parent: self.record.clone(),
                        dir: self
                            .ctx
                            .layout
                            .snapshot_dir(self.record.id.as_str(), s.id.as_str())?,
                        snapshot: s.id,
                    })
                });
                let _ = r.send(res);
            }
            Request::Guest(r) => {
                let res = self.guest().await;
                let _ = r.send(res);
            }
            Request::Touch(r) => {
                let _ = r.send(Ok(()));
            }
            Request::Probe(r) => {
                let vm = self.vm.as_deref();
                let _ = r.send(Ok(crate::metrics::Probe {
                    client: self.client.clone().filter(|c| !c.is_closed()),
                    host: vm.and_then(|v| v.host_usage()),
                    vm_pid: vm.map_or(0, |v| v.pid()),
                }));
            }
            Request::Kill(r) => {
                let res = self.kill().await;
                let done = res.is_ok();
                let _ = r.send(res);
                return done;
            }
            Request::Discard(r) => {
                let res = self.discard().await;
                let done = res.is_ok();
                let _ = r.send(res);
                return done;
            }
            Request::Timeout(kind, r) => {
                let res = self.timeout(kind).await;
                let done = self.record.state == Terminated;
                let _ = r.send(res);
                return done;
            }
            Request::Rolling(job, r) => {
                let res = self.rolling(job).await;
                let _ = r.send(res);
            }
            Request::SetTimeouts(policy, r) => {
                let res = self.set_timeouts(policy);
                let _ = r.send(res);
            }
            Request::SetEgress(policy, r) => {
                let res = self.set_egress(policy);
                let _ = r.send(res);
            }
            Request::UploadJob(interval, r) => {
                let job = self.upload_job(interval).await;
                let _ = r.send(Ok(job));
            }
            Request::Uploaded(snap, remote, r) => {
                let _ = r.send(self.uploaded(&snap, remote));
            }
            Request::Evict(snap, r) => {
                let done = self.evict_local(&snap).await;
                let _ = r.send(Ok(done));
            }
            Request::Shutdown(detach, r) => {
                if detach && self.lazy.is_some() && matches!(self.record.state, Running | Paused) {
                    // Its files are served by this process: it cannot outlive it. Suspended
                    // on a local snapshot instead, nothing is lost.
                    if let Err(e) = self.suspend(false).await {
                        tracing::error!(id = %self.record.id, error = %e, "suspending a lazily restored sandbox at shutdown");
                    }
                }
                if let Some(vm) = self.vm.take() {
                    if detach {
                        vm.detach();
                    } else {
                        let _ = vm.kill().await;
                    }
                }
                let _ = r.send(Ok(()));
                return true;
            }
            #[cfg(any(test, feature = "test-hooks"))]
            Request::Panic(r) => {
                // Mid-transition, as a real fault would strike: the intent is on disk.
                let state = self.record.state;
                if let Err(e) = self.begin(Intent::Snapshot, state, None) {
                    let _ = r.send(Err(e));
                    return false;
                }
                let _unanswered = r;
                panic!("a panic injected into the driver of {}", self.record.id);
            }
        }
        false
    }

    // ---- record keeping ------------------------------------------------------------------

    fn write(&mut self) -> Result<()> {
        self.record.last_activity_unix_ms = self.status.last_activity_ms.load(Ordering::Relaxed);
        Ok(self.ctx.records.write(&self.record)?)
    }

    /// Writes the intent of a transition.
    fn begin(
        &mut self,
        request: Intent,
        target: State,
        snapshot: Option<&SnapshotId>,
    ) -> Result<()> {
        let before = self.record.pending.replace(Pending {
            request,
            target,
            snapshot: snapshot.cloned(),
            started_unix_ms: now_ms(),
        });
        if let Err(e) = self.write() {
            // Nothing was begun (the record on disk is the old one): nor is it in memory.
            self.record.pending = before;
            return Err(e);
        }
        Ok(())
    }

    /// Writes the outcome: the new state, nothing pending.
    fn finish(&mut self, state: State) -> Result<()> {
        if state != self.record.state {
            self.record.state = state;
            self.record.state_since_unix_ms = now_ms();
        }
        self.record.pending = None;
        self.status.set_state(state);
        self.write()
    }

    /// Clears a pending intent after a failure that changed nothing. A record that cannot be
    /// written here is logged: the caller already reports the original error.
    fn abandon(&mut self) {
        self.record.pending = None;
        if let Err(e) = self.write() {
            tracing::error!(id = %self.record.id, error = %e, "writing a sandbox record");
        }
    }

    fn set_started(&mut self) {
        self.disk_mark = DiskMark::of(&self.disk_file());
        let now = now_ms();
        self.record.started_unix_ms = now;
        self.status.started_ms.store(now, Ordering::Relaxed);
    }

    /// The file holding what the VM's disk holds: its disk, or the local file behind a lazy
    /// restore's mount over it.
    fn disk_file(&self) -> PathBuf {
        match &self.lazy {
            Some(_) => self.dir.join(crate::archive::LAZY_DIR).join(DISK_FILE),
            None => self.dir.join(DISK_FILE),
        }
    }

    /// The VM of a Running or Paused sandbox (one without is an internal fault).
    fn vm(&self) -> Result<&dyn NodeVm> {
        self.vm.as_deref().ok_or_else(|| {
            NodeError::internal(format!(
                "sandbox {} is {} but has no VM",
                self.record.id, self.record.state
            ))
        })
    }

    fn new_snapshot_id(&self, kind: &str) -> SnapshotId {
        let mut ms = now_ms();
        loop {
            let id = SnapshotId::generate(ms, kind);
            if self.record.snapshot(&id).is_none() {
                return id;
            }
            ms += 1;
        }
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        // A driver torn down by a panic that escaped [`Sandbox::run`]: the VM is let go, not
        // killed, so that the node's next start adopts it with everything the guest held.
        if std::thread::panicking() {
            if let Some(vm) = self.vm.take() {
                vm.detach();
            }
        }
    }
}

pub use space_node_api::sandbox::CreateRequest;

/// Public view of a sandbox: its record.
pub type SandboxInfo = SandboxRecord;
