//! Rolling snapshots and retention: the loop around [`RollingSchedule`] and
//! [`RetentionPolicy`].
//!
//! [`reconcile`] takes no input and can run at any time. Each run:
//!
//! 1. reads every record once, to learn which snapshots other sandboxes still start from (a
//!    fork child's origin is a snapshot of its parent);
//! 2. sends [`Request::Rolling`] to the driver of every sandbox that is Running, Paused,
//!    Suspended or Failed. The driver (`sandbox/rolling.rs`) asks the schedule what is due —
//!    only while Running: a paused VM changes nothing — takes it (reason
//!    [`SnapshotReason::Rolling`](crate::record::SnapshotReason::Rolling), through the same
//!    code as any other snapshot), then plans retention over its snapshots with
//!    [`plan_deletions`] and deletes what the plan says ([`delete_volumes`]);
//! 3. plans retention for terminated sandboxes (no driver; their records are final) and
//!    deletes what the plan says.
//!
//! A timer runs it every [`RollingConfig::tick`] when [`RollingConfig::enabled`].
//!
//! **Disk changed** and **schedule anchors** are the driver's: it keeps a fingerprint of the
//! VM's disk image and counts the VM's start as a full snapshot (`sandbox/rolling.rs`).
//!
//! **Retention inputs.** Snapshots taken on request are pinned. In use (never deleted): the
//! restore point of a suspended sandbox, and the origin of a live VM (its own or another
//! sandbox's snapshot it was restored or cold-booted from) until that sandbox has a full
//! snapshot of its own taken since the VM started. A snapshot is dropped from the record
//! first, then its volume is deleted: a crash in between leaves an unlisted volume (space, not
//! a dangling entry that a rollback would trip over).

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::Duration;

use crate::error::{NodeError, Result};
use crate::ids::{SandboxId, SnapshotId};
use crate::record::{now_ms, Origin, SandboxRecord, SnapshotKind, SnapshotRecord, State};
use crate::retention::{Liveness, RetentionPolicy, RollingSchedule, SnapshotInfo};
use crate::sandbox::{Ctx, Handle, Request};
use crate::template::blocking;

/// Rolling snapshots and retention of a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RollingConfig {
    /// Whether the background loop runs ([`crate::Node::reconcile_snapshots`] works either
    /// way).
    pub enabled: bool,
    /// Disk and full snapshot intervals.
    pub schedule: RollingSchedule,
    /// What to keep.
    pub retention: RetentionPolicy,
    /// How often the loop runs. The schedule is checked at each run, so a snapshot is taken
    /// at most this late; a run costs a `stat` and a plan per sandbox.
    pub tick: Duration,
}

impl Default for RollingConfig {
    fn default() -> Self {
        RollingConfig {
            enabled: true,
            schedule: RollingSchedule::default(),
            retention: RetentionPolicy::default(),
            tick: Duration::from_secs(1),
        }
    }
}

/// What one sandbox's driver did in a run.
#[derive(Debug, Clone, Default)]
pub(crate) struct RollingOutcome {
    pub taken: Option<SnapshotRecord>,
    pub deleted: Vec<SnapshotId>,
}

/// What a driver is asked to do in a run.
#[derive(Debug, Clone)]
pub(crate) struct RollingJob {
    pub schedule: RollingSchedule,
    pub retention: RetentionPolicy,
    /// Snapshots of this sandbox that other sandboxes start from.
    pub in_use: Vec<SnapshotId>,
    /// Whether to apply retention (not when the other sandboxes' records could not be read:
    /// `in_use` may then be incomplete).
    pub prune: bool,
}

/// What a run of the reconciler did.
#[derive(Debug, Clone, Default)]
pub struct RollingReport {
    /// Snapshots taken, per sandbox.
    pub taken: Vec<(SandboxId, SnapshotRecord)>,
    /// Snapshots deleted by retention, per sandbox.
    pub deleted: Vec<(SandboxId, SnapshotId)>,
    /// Sandboxes where something failed (logged).
    pub failed: usize,
}

/// An error and its sources on one line, for the log line where it is handled.
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        out.push_str(": ");
        out.push_str(&s.to_string());
        next = s.source();
    }
    out
}

/// One run over every sandbox (see the module docs). `handles` are the drivers of the node.
pub(crate) async fn reconcile(
    ctx: &std::sync::Arc<Ctx>,
    handles: Vec<(SandboxId, Handle)>,
    config: &RollingConfig,
) -> RollingReport {
    let mut report = RollingReport::default();
    // One unreadable record must not stop the snapshots of all the others: without the
    // records, snapshots are still taken but nothing is deleted.
    let records = {
        let c = ctx.clone();
        match blocking(move || Ok(c.records.list()?)).await {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::error!(error = %chain(&e), "rolling snapshots: listing records (retention skipped)");
                report.failed += 1;
                None
            }
        }
    };
    let in_use = records.as_deref().map(origins_in_use).unwrap_or_default();
    let mut waits = Vec::new();
    for (id, h) in &handles {
        if !matches!(
            h.status.state(),
            State::Running | State::Paused | State::Suspended | State::Failed
        ) {
            continue;
        }
        let job = RollingJob {
            schedule: config.schedule,
            retention: config.retention,
            in_use: in_use.get(id).cloned().unwrap_or_default(),
            prune: records.is_some(),
        };
        let (tx, rx) = crate::sandbox::reply();
        if h.tx.send(Request::Rolling(job, tx)).await.is_ok() {
            waits.push((id.clone(), rx));
        }
    }
    for (id, rx) in waits {
        match rx.await {
            Ok(Ok(out)) => {
                report.taken.extend(out.taken.map(|s| (id.clone(), s)));
                report
                    .deleted
                    .extend(out.deleted.into_iter().map(|s| (id.clone(), s)));
            }
            // The driver went away (kill, shutdown), or the state changed in between.
            Err(_) | Ok(Err(NodeError::IllegalState { .. })) => {}
            Ok(Err(e)) => {
                tracing::error!(%id, error = %chain(&e), "rolling snapshots");
                report.failed += 1;
            }
        }
    }
    let driven: HashSet<&SandboxId> = handles.iter().map(|(id, _)| id).collect();
    if let Some(all) = &records {
        crate::archive::shred_expired(ctx, all, config.retention.max_age).await;
    }
    for r in records.into_iter().flatten() {
        if r.state != State::Terminated || driven.contains(&r.id) {
            continue;
        }
        let keep = in_use.get(&r.id).cloned().unwrap_or_default();
        match prune_terminated(ctx, r.clone(), &config.retention, &keep).await {
            Ok(deleted) => report
                .deleted
                .extend(deleted.into_iter().map(|s| (r.id.clone(), s))),
            Err(e) => {
                tracing::error!(id = %r.id, error = %chain(&e), "retention of a terminated sandbox");
                report.failed += 1;
            }
        }
    }
    report
}

/// For each sandbox, its snapshots that another live sandbox was started from and may need
/// again (it has no full snapshot of its own since it started).
fn origins_in_use(records: &[SandboxRecord]) -> HashMap<SandboxId, Vec<SnapshotId>> {
    let mut out: HashMap<SandboxId, Vec<SnapshotId>> = HashMap::new();
    for r in records {
        if r.state == State::Terminated || r.is_pooled() {
            continue;
        }
        if let Origin::Snapshot { sandbox, snapshot } = &r.origin {
            if sandbox != &r.id && !has_full_since_start(r) {
                out.entry(sandbox.clone())
                    .or_default()
                    .push(snapshot.clone());
            }
        }
    }
    out
}

fn has_full_since_start(r: &SandboxRecord) -> bool {
    r.snapshots
        .iter()
        .any(|s| s.kind == SnapshotKind::Full && s.created_unix_ms >= r.started_unix_ms)
}

/// The retention input of a sandbox's snapshots: pinned per reason; in use for the restore
/// point, the own origin of a live VM without a full snapshot since, and `extra`.
fn retention_input(r: &SandboxRecord, extra: &[SnapshotId]) -> Vec<SnapshotInfo<SnapshotId>> {
    let mut in_use: HashSet<&SnapshotId> = extra.iter().collect();
    in_use.extend(r.restore_point.as_ref());
    if r.state != State::Terminated && !has_full_since_start(r) {
        match &r.origin {
            Origin::Snapshot { sandbox, snapshot } if sandbox == &r.id => {
                in_use.insert(snapshot);
            }
            Origin::DiskSnapshot { snapshot } => {
                in_use.insert(snapshot);
            }
            _ => {}
        }
    }
    r.snapshots
        .iter()
        .map(|s| SnapshotInfo::from_record(s).with_in_use(in_use.contains(&s.id)))
        .collect()
}

/// What the policy deletes among `r`'s snapshots at `now`.
pub(crate) fn plan_deletions(
    r: &SandboxRecord,
    policy: &RetentionPolicy,
    extra: &[SnapshotId],
    now: u64,
) -> Vec<SnapshotId> {
    let liveness = if r.state == State::Terminated {
        Liveness::Terminated
    } else {
        Liveness::Live
    };
    // The newest archived snapshot is what the store's head names: kept while it is.
    let mut extra = extra.to_vec();
    if let Some(s) = r.snapshots.iter().rev().find(|s| s.remote.is_some()) {
        extra.push(s.id.clone());
    }
    let plan = policy.plan(&retention_input(r, &extra), now, liveness);
    for d in plan.deleted() {
        tracing::info!(id = %r.id, "retention: {d}");
    }
    plan.to_delete().into_iter().cloned().collect()
}

/// Deletes snapshot volumes of `sandbox` (already dropped from its record). Errors are logged:
/// an unlisted volume is only space.
pub(crate) async fn delete_volumes(ctx: &Ctx, sandbox: &SandboxId, ids: &[SnapshotId]) {
    for id in ids {
        let dir = match ctx.layout.snapshot_dir(sandbox.as_str(), id.as_str()) {
            Ok(d) => d,
            Err(e) => {
                tracing::error!(%sandbox, snapshot = %id, error = %chain(&e), "retention: snapshot path");
                continue;
            }
        };
        let s = ctx.storage.clone();
        if let Err(e) = blocking(move || {
            if present(&dir) {
                s.delete_volume(&dir)?;
            }
            Ok(())
        })
        .await
        {
            tracing::error!(%sandbox, snapshot = %id, error = %chain(&e), "retention: deleting a snapshot");
        }
    }
}

fn present(p: &Path) -> bool {
    p.symlink_metadata().is_ok()
}

/// Retention for a terminated sandbox, straight on its record (no driver owns it any more).
async fn prune_terminated(
    ctx: &Ctx,
    mut r: SandboxRecord,
    policy: &RetentionPolicy,
    extra: &[SnapshotId],
) -> Result<Vec<SnapshotId>> {
    let doomed = plan_deletions(&r, policy, extra, now_ms());
    if doomed.is_empty() {
        return Ok(doomed);
    }
    let remote = crate::archive::archived(&r, &doomed);
    r.snapshots.retain(|s| !doomed.contains(&s.id));
    ctx.records.write(&r)?;
    delete_volumes(ctx, &r.id, &doomed).await;
    crate::archive::delete_remote(ctx, &r.id, &remote).await;
    Ok(doomed)
}
