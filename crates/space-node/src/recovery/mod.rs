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
//! A VM that dies while the node runs is noticed by its driver, which calls [`relaunch()`]
//! when [`crate::NodeConfig::auto_restore`] is on (the default): the same restore as above,
//! recorded as an event. Three automatic restores within ten minutes mark it Failed instead
//! (a guest that crashes on every start would otherwise loop).
//!
//! This file holds a pass (`run`, `recover_one`) and its report; the steps are split by
//! concern:
//!
//! - `pending.rs`: phase 1 of a record, its cut-short transition finished or undone;
//! - `adopt.rs`: a live VM taken over as the record says;
//! - `relaunch.rs`: a VM started again from a snapshot (a lost VM, a rollback to finish);
//! - `snapshots.rs`: snapshot directories checked for completeness, unlisted ones removed;
//! - `orphans.rs`: the sweep at start, and stray VMMs killed.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;

use crate::error::Result;
use crate::ids::{SandboxId, SnapshotId};
use crate::record::{now_ms, RecoveryAction, RecoveryEvent, SandboxRecord, State};
use crate::sandbox::{Ctx, Handle, Live, Sandbox};
use crate::template::blocking;

mod adopt;
mod orphans;
mod pending;
mod relaunch;
mod snapshots;

pub(crate) use orphans::kill_vmm;
use orphans::sweep_orphans;
use pending::phase1;
use relaunch::finish_rollback;
pub(crate) use relaunch::relaunch;

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
