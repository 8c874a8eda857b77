//! Crash recovery: bringing a node's sandboxes back after the node process died, and bringing
//! a VM back after it died under a running node.
//!
//! The node runs its VMs detached ([`space_runtime::QemuRuntimeConfig::detached`]), so a node
//! crash leaves them running. [`run`] is a reconciler: it takes no input but the data
//! directory and what the node already drives, and running it twice changes nothing the
//! second time. `Node::open` runs it before anything else; `Node::recover` runs it again on
//! demand (then it leaves alone every sandbox the node drives, records with a transition in
//! flight, and directories it does not own yet).
//!
//! Per record (`docs/lifecycle.md`, "Crash recovery", has the same table):
//!
//! | record | what recovery does |
//! |---|---|
//! | Running/Paused, live VM that `adopt` accepts | adopted: same id and state, guest client reconnected, driver spawned |
//! | Running/Paused, VM gone (or not ours) | restored from the newest full snapshot, else cold-booted on the newest disk snapshot, else Failed; event recorded |
//! | Suspended, Failed | driver spawned without a VM; a stray VMM in the directory is killed |
//! | Terminated | a stray VMM is killed, a leftover directory removed |
//! | pending create/fork, warm-pool member | rolled back: VMM killed, sandbox directory and record removed |
//! | pending kill | finished: VMM killed, directory removed, Terminated |
//! | pending snapshot | rolled back: the unlisted snapshot removed; then as Running/Paused |
//! | pending suspend | complete snapshot: finished (listed, restore point, VM killed, Suspended); else the partial snapshot removed and as Running/Paused |
//! | pending pause/resume | the VM's own run state decides Running or Paused |
//! | pending restore | a live, ready VM: finished (identity step, Running); else rolled back (Suspended) |
//! | pending rollback | finished: a complete undo snapshot is listed, any VM killed, the target started |
//! | pending recover | the relaunch is redone |
//!
//! Orphans, at start only: sandbox directories without a record (their VMM killed), hidden
//! partial volumes (`.<name>.partial-*`), snapshot directories of unknown sandboxes or not
//! listed in their record, template versions without `template.json`, temporary record
//! files. Then `sweep_cgroups()`, after every adoption and before any VM is started: an empty
//! cgroup of one of the node's sandbox directories goes whatever its age and whatever the
//! record says (a kill finished up to its cgroup, a launch cut short before QEMU joined).
//!
//! A VM that dies while the node runs is noticed by its driver, which calls [`relaunch`]
//! when [`crate::NodeConfig::auto_restore`] is on (the default): the same restore as above,
//! recorded as an event. Three automatic restores within ten minutes mark it Failed instead
//! (a guest that crashes on every start would otherwise loop).

use std::collections::HashSet;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use space_runtime::{Manifest, NodeVm};

use crate::error::{NodeError, Result};
use crate::ids::{SandboxId, SnapshotId, VersionReq};
use crate::record::{
    now_ms, Intent, Origin, Pending, RecoveryAction, RecoveryEvent, SandboxRecord, SnapshotKind,
    SnapshotReason, SnapshotRecord, State,
};
use crate::sandbox::{
    clear_vm_files, dir_size, identity, launch, Ctx, Handle, Launch, Live, Sandbox,
};
use crate::template::{self, blocking};

/// What a recovery pass did. Empty ([`RecoveryReport::is_empty`]) when it changed nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Sandboxes whose live VM was taken over.
    pub adopted: Vec<SandboxId>,
    /// Sandboxes whose VM was gone and was started again from this snapshot.
    pub restored: Vec<(SandboxId, SnapshotId)>,
    /// Sandboxes left Failed, and why.
    pub failed: Vec<(SandboxId, String)>,
    /// Sandboxes without a VM whose driver was started again (Suspended, Failed).
    pub registered: Vec<SandboxId>,
    /// Transitions cut short that were finished or undone, in words.
    pub pending: Vec<(SandboxId, String)>,
    /// Directories and files removed (half-made sandboxes, partial and unlisted snapshots).
    pub removed: Vec<PathBuf>,
    /// VMM processes killed (VMs of terminated or unknown sandboxes).
    pub killed: Vec<u32>,
    /// Empty cgroups removed.
    pub cgroups: Vec<PathBuf>,
}

impl RecoveryReport {
    /// Whether the pass changed nothing.
    pub fn is_empty(&self) -> bool {
        *self == RecoveryReport::default()
    }
}

/// A pass's report and the drivers it started, for the node to register.
pub(crate) struct Recovered {
    pub report: RecoveryReport,
    pub handles: Vec<(SandboxId, Handle)>,
}

/// What is left to do for a record after adoption (phase 1). Short-lived, a handful per
/// pass: the size of the variants does not matter.
#[allow(clippy::large_enum_variant)]
enum Next {
    Nothing,
    Spawn(SandboxRecord, Option<Live>),
    /// The VM is gone: start one from the newest snapshot.
    Relaunch(SandboxRecord, String),
    /// Finish a rollback to this snapshot.
    Rollback(SandboxRecord, SnapshotId),
}

/// One recovery pass. `registered`: sandboxes the node drives (left alone). `at_start`: no
/// other work runs on the node yet, so orphans and cgroups can be swept.
pub(crate) async fn run(
    ctx: &Arc<Ctx>,
    registered: &HashSet<SandboxId>,
    at_start: bool,
) -> Result<Recovered> {
    let mut report = RecoveryReport::default();
    let records = {
        let c = ctx.clone();
        blocking(move || Ok(c.records.list()?)).await?
    };
    let known: HashSet<SandboxId> = records.iter().map(|r| r.id.clone()).collect();
    let mut next = Vec::new();
    for record in records {
        if registered.contains(&record.id) || (!at_start && record.pending.is_some()) {
            continue;
        }
        let id = record.id.clone();
        match phase1(ctx, record, &mut report, NODE_DIED).await {
            Ok(n) => next.push(n),
            Err(e) => {
                tracing::error!(%id, error = %chain(&e), "recovering a sandbox");
                report.failed.push((id, chain(&e)));
            }
        }
    }
    if at_start {
        sweep_orphans(ctx, &known, &mut report).await;
        match ctx.runtime.sweep_cgroups(&ctx.layout.sandboxes()) {
            Ok(swept) => report.cgroups.extend(swept),
            Err(e) => tracing::error!(error = %e, "sweeping cgroups"),
        }
    }
    let mut handles = Vec::new();
    for n in next {
        if let Some((record, live)) = phase2(ctx, n, &mut report).await? {
            let id = record.id.clone();
            handles.push((id, Sandbox::spawn(ctx.clone(), record, live)?));
        }
    }
    if !report.is_empty() {
        tracing::info!(?report, "recovery");
    }
    Ok(Recovered { report, handles })
}

/// What the events of a pass at start name as the cause.
const NODE_DIED: &str = "the node died";

/// Starts what phase 1 left to start; answers the record and VM a driver takes over, or
/// `None` when nothing is left to drive.
async fn phase2(
    ctx: &Arc<Ctx>,
    n: Next,
    report: &mut RecoveryReport,
) -> Result<Option<(SandboxRecord, Option<Live>)>> {
    let (mut record, live) = match n {
        Next::Nothing => return Ok(None),
        Next::Spawn(record, live) => (record, live),
        Next::Relaunch(mut record, why) => {
            let dir = ctx.layout.sandbox_dir(record.id.as_str())?;
            let live = relaunch(ctx, &mut record, &dir, &why).await.ok();
            note_relaunch(&record, live.is_some(), report);
            (record, live)
        }
        Next::Rollback(mut record, target) => {
            let live = finish_rollback(ctx, &mut record, &target).await;
            note_relaunch(&record, live.is_some(), report);
            (record, live)
        }
    };
    if record.state == State::Terminated {
        return Ok(None);
    }
    if live.is_none() && matches!(record.state, State::Running | State::Paused) {
        // Cannot happen after the steps above; keep the driver consistent regardless.
        record.state = State::Failed;
        ctx.records.write(&record)?;
    }
    Ok(Some((record, live)))
}

/// Recovers one sandbox while the node runs, after its state driver failed (a panic): the
/// steps of a pass at start for its record as it is on disk (the driver's copy may be
/// half-changed; the disk holds what was acknowledged), with `cause` in the events it
/// records. The driver's VM must have been let go (detached, not killed), so a live VM is
/// adopted as it is and nothing the guest held is lost. Answers the record and VM the driver
/// goes on with, or `None` when nothing is left to drive (the record says Terminated or
/// was removed).
pub(crate) async fn recover_one(
    ctx: &Arc<Ctx>,
    record: SandboxRecord,
    cause: &str,
) -> Result<Option<(SandboxRecord, Option<Live>)>> {
    let mut report = RecoveryReport::default();
    let id = record.id.clone();
    let next = phase1(ctx, record, &mut report, cause).await?;
    let out = phase2(ctx, next, &mut report).await?;
    tracing::warn!(%id, ?report, "sandbox recovered: {cause}");
    Ok(out)
}

fn note_relaunch(record: &SandboxRecord, ok: bool, report: &mut RecoveryReport) {
    let last = record.recoveries.last();
    match (ok, last.and_then(|e| e.snapshot.clone())) {
        (true, Some(s)) => report.restored.push((record.id.clone(), s)),
        _ => report.failed.push((
            record.id.clone(),
            record.failure.clone().unwrap_or_default(),
        )),
    }
}

fn event(action: RecoveryAction, snapshot: Option<SnapshotId>, detail: String) -> RecoveryEvent {
    RecoveryEvent {
        at_unix_ms: now_ms(),
        action,
        snapshot,
        detail,
    }
}

/// Resolves a cut-short transition and adopts what can be adopted.
async fn phase1(
    ctx: &Arc<Ctx>,
    mut r: SandboxRecord,
    report: &mut RecoveryReport,
    cause: &str,
) -> Result<Next> {
    let dir = ctx.layout.sandbox_dir(r.id.as_str())?;
    let mut trust_vm = false;
    if let Some(p) = r.pending.clone() {
        let what = match p.request {
            Intent::Create | Intent::Fork | Intent::Pool => {
                kill_vmm_in(ctx, &dir, report).await;
                remove_volume(ctx, &dir, report).await?;
                remove_unlisted(ctx, &r, &[], report).await?;
                let snaps = ctx.layout.snapshots_of(r.id.as_str())?;
                let _ = std::fs::remove_dir(&snaps);
                ctx.records.remove(&r.id)?;
                tracing::warn!(id = %r.id, "removed a sandbox whose {} was cut short", p.request);
                report.pending.push((
                    r.id.clone(),
                    format!("{}: undone (half-made sandbox removed)", p.request),
                ));
                return Ok(Next::Nothing);
            }
            Intent::Kill => {
                kill_vmm_in(ctx, &dir, report).await;
                remove_volume(ctx, &dir, report).await?;
                r.restore_point = None;
                set_state(&mut r, State::Terminated);
                (RecoveryAction::FinishedPending, "finished".to_owned())
            }
            Intent::Suspend => match p.snapshot.as_ref().map(|s| complete_full(ctx, &r, s)) {
                Some(Ok(Some(snap))) => {
                    kill_vmm_in(ctx, &dir, report).await;
                    let _ = clear_vm_files(&dir);
                    r.snapshots.push(snap.clone());
                    r.restore_point = Some(snap.id);
                    set_state(&mut r, State::Suspended);
                    (
                        RecoveryAction::FinishedPending,
                        "finished (its snapshot was complete)".to_owned(),
                    )
                }
                _ => (
                    RecoveryAction::RolledBackPending,
                    "undone (its snapshot was not complete)".to_owned(),
                ),
            },
            Intent::Pause | Intent::Resume => {
                trust_vm = true;
                (
                    RecoveryAction::FinishedPending,
                    "the VM's run state decides".to_owned(),
                )
            }
            Intent::Restore => {
                let done = finish_restore(ctx, &mut r, &dir, &p, report, cause).await?;
                r.pending = None;
                remove_unlisted(ctx, &r, &[], report).await?;
                return Ok(done);
            }
            Intent::Rollback => {
                let target = p
                    .snapshot
                    .clone()
                    .ok_or_else(|| NodeError::internal("a rollback without a target snapshot"))?;
                // The undo point, if it was completed, is kept and becomes the restore point
                // should the target fail to start.
                let listed: Vec<SnapshotId> = r.snapshots.iter().map(|s| s.id.clone()).collect();
                for name in snapshot_names(ctx, &r)? {
                    let Ok(id) = name.parse::<SnapshotId>() else {
                        continue;
                    };
                    if listed.contains(&id) || !id.as_str().contains("-undo-") {
                        continue;
                    }
                    if let Ok(Some(mut snap)) = complete_full(ctx, &r, &id) {
                        snap.reason = SnapshotReason::PreRollback;
                        r.restore_point = Some(snap.id.clone());
                        r.snapshots.push(snap);
                    }
                }
                kill_vmm_in(ctx, &dir, report).await;
                let _ = clear_vm_files(&dir);
                remove_unlisted(ctx, &r, &[], report).await?;
                report
                    .pending
                    .push((r.id.clone(), "rollback: finished".to_owned()));
                r.push_recovery(event(
                    RecoveryAction::FinishedPending,
                    Some(target.clone()),
                    format!("{cause} during rollback: finished"),
                ));
                r.pending = None;
                ctx.records.write(&r)?;
                return Ok(Next::Rollback(r, target));
            }
            Intent::Recover => {
                kill_vmm_in(ctx, &dir, report).await;
                let _ = clear_vm_files(&dir);
                (RecoveryAction::FinishedPending, "redone".to_owned())
            }
            // Nothing but an unlisted snapshot to drop.
            Intent::Snapshot | Intent::Unknown => {
                (RecoveryAction::RolledBackPending, "undone".to_owned())
            }
        };
        r.pending = None;
        remove_unlisted(ctx, &r, &[], report).await?;
        let what = (what.0, format!("{}: {}", p.request, what.1));
        report.pending.push((r.id.clone(), what.1.clone()));
        r.push_recovery(event(
            what.0,
            p.snapshot.clone(),
            format!("{cause} during {}", what.1),
        ));
        ctx.records.write(&r)?;
    } else {
        remove_unlisted(ctx, &r, &[], report).await?;
    }
    match r.state {
        State::Creating => {
            // A create without its intent cannot be written by this code; treat it as cut
            // short.
            r.pending = Some(Pending {
                request: Intent::Create,
                target: State::Running,
                snapshot: None,
                started_unix_ms: r.created_unix_ms,
            });
            Box::pin(phase1(ctx, r, report, cause)).await
        }
        State::Running | State::Paused => adopt(ctx, r, &dir, trust_vm, report).await,
        State::Suspended | State::Failed => {
            kill_vmm_in(ctx, &dir, report).await;
            report.registered.push(r.id.clone());
            Ok(Next::Spawn(r, None))
        }
        State::Terminated => {
            if dir.exists() {
                kill_vmm_in(ctx, &dir, report).await;
                remove_volume(ctx, &dir, report).await?;
            }
            Ok(Next::Nothing)
        }
    }
}

/// An error and its sources, for a record's `failure` (read by people, later).
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        out.push_str(": ");
        out.push_str(&s.to_string());
        next = s.source();
    }
    out
}

fn set_state(r: &mut SandboxRecord, s: State) {
    if r.state != s {
        r.state = s;
        r.state_since_unix_ms = now_ms();
    }
}

/// Adopts the VM of a Running or Paused sandbox, or says it must be started again.
async fn adopt(
    ctx: &Arc<Ctx>,
    mut r: SandboxRecord,
    dir: &Path,
    trust_vm: bool,
    report: &mut RecoveryReport,
) -> Result<Next> {
    let vm = match ctx.runtime.adopt(dir).await {
        Ok(vm) => vm,
        Err(e) => {
            // Not ours or gone: make sure nothing runs there before a new VM starts.
            kill_vmm_in(ctx, dir, report).await;
            return Ok(Next::Relaunch(
                r,
                format!("the VM was gone at start ({})", chain(&e)),
            ));
        }
    };
    match take_over(ctx, &mut r, vm, trust_vm).await {
        Ok(live) => {
            r.failure = None;
            r.push_recovery(event(
                RecoveryAction::Adopted,
                None,
                format!("VM (pid {}) taken over, {}", live.vm.pid(), r.state),
            ));
            ctx.records.write(&r)?;
            report.adopted.push(r.id.clone());
            Ok(Next::Spawn(r, Some(live)))
        }
        Err(e) => {
            kill_vmm_in(ctx, dir, report).await;
            Ok(Next::Relaunch(
                r,
                format!(
                    "the VM left running could not be taken over ({})",
                    chain(&e)
                ),
            ))
        }
    }
}

/// Brings an adopted VM to the record's state (or, `trust_vm`, the record to the VM's) and
/// reconnects the guest when it runs. Dropping the VM on failure kills it.
async fn take_over(
    ctx: &Ctx,
    r: &mut SandboxRecord,
    vm: Box<dyn NodeVm>,
    trust_vm: bool,
) -> Result<Live> {
    let status = vm.status().await?;
    if trust_vm {
        set_state(
            r,
            if status.running {
                State::Running
            } else {
                State::Paused
            },
        );
    } else if r.state == State::Running && !status.running {
        // Stopped mid-snapshot when the node died.
        vm.resume().await?;
    } else if r.state == State::Paused && status.running {
        vm.pause().await?;
    }
    let client = if r.state == State::Running {
        Some(vm.wait_ready(ctx.ready_timeout).await?)
    } else {
        None
    };
    Ok(Live { vm, client })
}

/// A restore cut short: a live VM that answers finishes it, anything else undoes it.
async fn finish_restore(
    ctx: &Arc<Ctx>,
    r: &mut SandboxRecord,
    dir: &Path,
    p: &Pending,
    report: &mut RecoveryReport,
    cause: &str,
) -> Result<Next> {
    let point = p.snapshot.clone().or_else(|| r.restore_point.clone());
    if let (Ok(vm), Some(point)) = (ctx.runtime.adopt(dir).await, point) {
        let ready = async {
            if !vm.status().await?.running {
                return Err(NodeError::internal("the restored VM never ran"));
            }
            let client = vm.wait_ready(ctx.ready_timeout).await?;
            client
                .identity(&identity(ctx, r))
                .await
                .map_err(|source| NodeError::Guest {
                    what: "identity",
                    source,
                })?;
            Ok(client)
        }
        .await;
        if let Ok(client) = ready {
            r.origin = Origin::Snapshot {
                sandbox: r.id.clone(),
                snapshot: point.clone(),
            };
            r.restore_point = None;
            r.started_unix_ms = now_ms();
            set_state(r, State::Running);
            r.pending = None;
            r.push_recovery(event(
                RecoveryAction::FinishedPending,
                Some(point),
                format!("{cause} during restore: finished"),
            ));
            ctx.records.write(r)?;
            report
                .pending
                .push((r.id.clone(), "restore: finished".into()));
            return Ok(Next::Spawn(
                r.clone(),
                Some(Live {
                    vm,
                    client: Some(client),
                }),
            ));
        }
        drop(vm);
    }
    kill_vmm_in(ctx, dir, report).await;
    let _ = clear_vm_files(dir);
    r.pending = None;
    r.push_recovery(event(
        RecoveryAction::RolledBackPending,
        p.snapshot.clone(),
        format!("{cause} during restore: undone, still suspended"),
    ));
    ctx.records.write(r)?;
    report
        .pending
        .push((r.id.clone(), "restore: undone".into()));
    report.registered.push(r.id.clone());
    Ok(Next::Spawn(r.clone(), None))
}

async fn finish_rollback(
    ctx: &Arc<Ctx>,
    r: &mut SandboxRecord,
    target: &SnapshotId,
) -> Option<Live> {
    let Some(snap) = r.snapshot(target).cloned() else {
        fail(ctx, r, format!("rollback target {target} is not listed"));
        return None;
    };
    let dir = ctx.layout.sandbox_dir(r.id.as_str()).ok()?;
    match start_from(ctx, r, &dir, &snap).await {
        Ok(live) => Some(live),
        Err(e) => {
            if r.restore_point.is_some() {
                set_state(r, State::Suspended);
                r.pending = None;
                let _ = ctx.records.write(r);
            } else {
                fail(
                    ctx,
                    r,
                    format!("finishing a rollback to {target}: {}", chain(&e)),
                );
            }
            None
        }
    }
}

/// Starts a VM from `snap` into `dir` and records it Running (rollback and recovery).
async fn start_from(
    ctx: &Ctx,
    r: &mut SandboxRecord,
    dir: &Path,
    snap: &SnapshotRecord,
) -> Result<Live> {
    let snap_dir = ctx.layout.snapshot_dir(r.id.as_str(), snap.id.as_str())?;
    let how = match snap.kind {
        SnapshotKind::Full => Launch::Restore { snapshot: snap_dir },
        SnapshotKind::Disk => {
            let t = template::resolve(
                &ctx.layout,
                &r.template.name,
                &VersionReq::Exact(r.template.version.clone()),
            )?;
            Launch::Boot {
                kernel: t.kernel(),
                rootfs: snap_dir.join("rootfs.ext4"),
                vcpus: r.vcpus,
                memory_mib: r.memory_mib,
                kernel_cmdline: Some(t.manifest.kernel_cmdline.clone()),
            }
        }
    };
    if !dir.exists() {
        let (s, d) = (ctx.storage.clone(), dir.to_owned());
        blocking(move || Ok(s.create_volume(&d)?)).await?;
    }
    clear_vm_files(dir)?;
    let live = launch(ctx, dir, how, r).await?;
    r.origin = match snap.kind {
        SnapshotKind::Full => Origin::Snapshot {
            sandbox: r.id.clone(),
            snapshot: snap.id.clone(),
        },
        SnapshotKind::Disk => Origin::DiskSnapshot {
            snapshot: snap.id.clone(),
        },
    };
    r.restore_point = None;
    r.failure = None;
    r.started_unix_ms = now_ms();
    set_state(r, State::Running);
    r.pending = None;
    ctx.records.write(r)?;
    Ok(live)
}

fn fail(ctx: &Ctx, r: &mut SandboxRecord, why: String) {
    tracing::error!(id = %r.id, %why, "sandbox lost");
    r.failure = Some(why.clone());
    r.pending = None;
    set_state(r, State::Failed);
    r.push_recovery(event(RecoveryAction::Lost, None, why));
    if let Err(e) = ctx.records.write(r) {
        tracing::error!(id = %r.id, error = %e, "writing a sandbox record");
    }
}

/// How many automatic restores within [`RESTART_WINDOW`] mark a sandbox Failed instead.
const MAX_RESTARTS: usize = 3;
const RESTART_WINDOW: Duration = Duration::from_secs(600);

/// Starts a new VM for a sandbox whose VM is gone: from its newest full snapshot, else a cold
/// boot on its newest disk snapshot. A Paused sandbox is paused again. Records the event; on
/// failure the record is Failed (with the reason) and written, and the error returned.
pub(crate) async fn relaunch(
    ctx: &Ctx,
    r: &mut SandboxRecord,
    dir: &Path,
    why: &str,
) -> Result<Live> {
    let since = now_ms().saturating_sub(RESTART_WINDOW.as_millis() as u64);
    let recent = r
        .recoveries
        .iter()
        .filter(|e| e.at_unix_ms >= since)
        .filter(|e| {
            matches!(
                e.action,
                RecoveryAction::Restored | RecoveryAction::ColdBooted
            )
        })
        .count();
    let newest = |kind| {
        r.snapshots
            .iter()
            .filter(|s| s.kind == kind)
            .max_by_key(|s| (s.created_unix_ms, s.id.as_str().to_owned()))
            .cloned()
    };
    let chosen = newest(SnapshotKind::Full).or_else(|| newest(SnapshotKind::Disk));
    let e = match chosen {
        _ if recent >= MAX_RESTARTS => NodeError::internal(format!(
            "{why}; not restored: {recent} automatic restores in the last {} minutes",
            RESTART_WINDOW.as_secs() / 60
        )),
        None => NodeError::internal(format!("{why}; no snapshot to restore it from")),
        Some(snap) => {
            let was = r.state;
            r.pending = Some(Pending {
                request: Intent::Recover,
                target: was,
                snapshot: Some(snap.id.clone()),
                started_unix_ms: now_ms(),
            });
            ctx.records.write(r)?;
            match start_from(ctx, r, dir, &snap).await {
                Ok(live) => {
                    if was == State::Paused {
                        if let Err(e) = live.vm.pause().await {
                            tracing::warn!(id = %r.id, error = %e, "pausing a restored VM");
                        } else {
                            set_state(r, State::Paused);
                        }
                    }
                    let action = match snap.kind {
                        SnapshotKind::Full => RecoveryAction::Restored,
                        SnapshotKind::Disk => RecoveryAction::ColdBooted,
                    };
                    r.push_recovery(event(action, Some(snap.id.clone()), why.to_owned()));
                    ctx.records.write(r)?;
                    tracing::warn!(id = %r.id, snapshot = %snap.id, %why, "sandbox VM brought back");
                    return Ok(live);
                }
                Err(e) => NodeError::internal(format!(
                    "{why}; restoring snapshot {} failed: {}",
                    snap.id,
                    chain(&e)
                )),
            }
        }
    };
    let _ = clear_vm_files(dir);
    let text = match &e {
        NodeError::Internal(m) => m.clone(),
        other => other.to_string(),
    };
    fail(ctx, r, text);
    Err(e)
}

// ---- snapshots -----------------------------------------------------------------------------

/// Names in `<data>/snapshots/<id>/`.
fn snapshot_names(ctx: &Ctx, r: &SandboxRecord) -> Result<Vec<String>> {
    let dir = ctx.layout.snapshots_of(r.id.as_str())?;
    match std::fs::read_dir(&dir) {
        Ok(entries) => Ok(entries
            .filter_map(|e| Some(e.ok()?.file_name().to_string_lossy().into_owned()))
            .collect()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(NodeError::io("listing", dir)(e)),
    }
}

/// The full snapshot `id` of `r` as a listing, if its directory is complete (the runtime
/// writes the manifest last; sizes are checked against it).
fn complete_full(ctx: &Ctx, r: &SandboxRecord, id: &SnapshotId) -> Result<Option<SnapshotRecord>> {
    let dir = ctx.layout.snapshot_dir(r.id.as_str(), id.as_str())?;
    let Ok(m) = Manifest::read(&dir.join("manifest.json")) else {
        return Ok(None);
    };
    let len = |name: &str| std::fs::metadata(dir.join(name)).map(|m| m.len()).ok();
    if len("mem") != Some(m.memory_bytes())
        || len("state") != Some(m.state_bytes)
        || len("rootfs.ext4").is_none()
    {
        return Ok(None);
    }
    // Made read-only like every listed snapshot (it may have been cut short before that).
    ctx.storage.set_readonly(&dir)?;
    Ok(Some(SnapshotRecord {
        id: id.clone(),
        kind: SnapshotKind::Full,
        reason: SnapshotReason::Suspend,
        created_unix_ms: m.created_unix_ms,
        size_bytes: dir_size(&dir),
        paused_for_us: 0,
        local: true,
        remote: None,
    }))
}

/// Removes every entry under `<data>/snapshots/<id>/` that the record does not list (partial
/// volumes, snapshots cut short), except `keep`.
async fn remove_unlisted(
    ctx: &Arc<Ctx>,
    r: &SandboxRecord,
    keep: &[SnapshotId],
    report: &mut RecoveryReport,
) -> Result<()> {
    let parent = ctx.layout.snapshots_of(r.id.as_str())?;
    for name in snapshot_names(ctx, r)? {
        let listed = name
            .parse::<SnapshotId>()
            .ok()
            .filter(|id| r.snapshot(id).is_some() || keep.contains(id));
        if listed.is_none() {
            remove_volume(ctx, &parent.join(&name), report).await?;
        }
    }
    Ok(())
}

async fn remove_volume(ctx: &Arc<Ctx>, path: &Path, report: &mut RecoveryReport) -> Result<()> {
    if std::fs::symlink_metadata(path).is_err() {
        return Ok(());
    }
    let (s, p) = (ctx.storage.clone(), path.to_owned());
    let _ = clear_vm_files(path);
    blocking(move || Ok(s.delete_volume(&p)?)).await?;
    report.removed.push(path.to_owned());
    Ok(())
}

// ---- orphans -------------------------------------------------------------------------------

async fn sweep_orphans(ctx: &Arc<Ctx>, known: &HashSet<SandboxId>, report: &mut RecoveryReport) {
    let children = |d: PathBuf| -> Vec<(String, PathBuf)> {
        std::fs::read_dir(d)
            .map(|e| {
                e.filter_map(|e| {
                    let e = e.ok()?;
                    Some((e.file_name().to_string_lossy().into_owned(), e.path()))
                })
                .collect()
            })
            .unwrap_or_default()
    };
    let is_known = |name: &str| {
        name.parse::<SandboxId>()
            .is_ok_and(|id| known.contains(&id))
    };
    let mut doomed = Vec::new();
    for (name, path) in children(ctx.layout.sandboxes()) {
        if !is_known(&name) {
            kill_vmm_in(ctx, &path, report).await;
            doomed.push(path);
        }
    }
    for (name, path) in children(ctx.layout.snapshots()) {
        if !is_known(&name) {
            doomed.extend(children(path.clone()).into_iter().map(|(_, p)| p));
            doomed.push(path);
        }
    }
    for (name, path) in children(ctx.layout.templates()) {
        if name.starts_with('.') {
            doomed.push(path);
            continue;
        }
        for (version, vpath) in children(path) {
            if version.starts_with('.') || !vpath.join(template::TEMPLATE_MANIFEST).exists() {
                doomed.push(vpath);
            }
        }
    }
    for path in doomed {
        let result = if path.is_dir() {
            remove_volume(ctx, &path, report).await
        } else {
            std::fs::remove_file(&path)
                .map(|()| report.removed.push(path.clone()))
                .map_err(NodeError::io("removing", &path))
        };
        if let Err(e) = result {
            tracing::error!(path = %path.display(), error = %e, "removing an orphan");
        }
    }
    let state = ctx.layout.root().join("state").join("sandboxes");
    for (name, path) in children(state) {
        if space_fs::is_leftover(&name) && std::fs::remove_file(&path).is_ok() {
            report.removed.push(path);
        }
    }
}

// ---- stray VMMs ----------------------------------------------------------------------------

/// Kills the VMM running in `dir`, if any: one that `adopt` accepts, else any QEMU process
/// whose root (jailed) or working directory (unjailed) is `dir`. Waits until it is gone.
/// Kills whatever VMM runs in `dir` (a sandbox whose driver let its VM go).
pub(crate) async fn kill_vmm(ctx: &Ctx, dir: &Path) {
    kill_vmm_in(ctx, dir, &mut RecoveryReport::default()).await;
}

async fn kill_vmm_in(ctx: &Ctx, dir: &Path, report: &mut RecoveryReport) {
    let Ok(meta) = std::fs::metadata(dir) else {
        return;
    };
    if let Ok(vm) = ctx.runtime.adopt(dir).await {
        let pid = vm.pid();
        let _ = vm.kill().await;
        report.killed.push(pid);
        return;
    }
    let key = (meta.dev(), meta.ino());
    let strays = tokio::task::spawn_blocking(move || kill_strays(key))
        .await
        .unwrap_or_default();
    report.killed.extend(strays);
    // A VMM killed by a node that died before cleaning up left its cgroup: too young for
    // the sweep, which waits for cgroups being set up, so it goes here.
    report.cgroups.extend(ctx.runtime.release_gone(dir).await);
}

/// SIGKILLs every QEMU process whose root or working directory is the inode `key`, and waits
/// (up to 5 s each) until they are gone.
fn kill_strays(key: (u64, u64)) -> Vec<u32> {
    let mut killed = Vec::new();
    for pid in qemus_in(key) {
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1; no
        // memory is passed.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        if fd < 0 {
            continue;
        }
        // SAFETY: `fd` was just returned by pidfd_open and is owned by nothing else.
        let pidfd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        // The pid is pinned now: check again that it is the same process.
        if !qemus_in(key).contains(&pid) {
            continue;
        }
        // SAFETY: pidfd_send_signal takes a live pidfd, a signal number, a null siginfo
        // (allowed: the kernel fills one in) and flags 0.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                pidfd.as_raw_fd(),
                libc::SIGKILL,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        if rc < 0 {
            continue;
        }
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(5) {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let state = stat
                .rsplit_once(") ")
                .and_then(|(_, rest)| rest.chars().next());
            if matches!(state, None | Some('Z') | Some('X')) {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        tracing::warn!(pid, "killed a VMM left without a sandbox to run for");
        killed.push(pid);
    }
    killed
}

/// QEMU processes whose root or working directory is the inode `key`.
fn qemus_in(key: (u64, u64)) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let me = std::process::id();
    entries
        .filter_map(|e| {
            let e = e.ok()?;
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            if pid == me {
                return None;
            }
            let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
            if !comm.starts_with("qemu") {
                return None;
            }
            let same = |link: &str| {
                std::fs::metadata(e.path().join(link)).is_ok_and(|m| (m.dev(), m.ino()) == key)
            };
            (same("root") || same("cwd")).then_some(pid)
        })
        .collect()
}
