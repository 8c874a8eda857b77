//! Phase 1 of a record: the transition it was in when the node or its driver died, finished
//! or undone as the table in `recovery/mod.rs` says, and then what its state asks for
//! (adoption of a live VM, a driver without one, or nothing).

use std::path::Path;
use std::sync::Arc;

use crate::error::{NodeError, Result};
use crate::ids::SnapshotId;
use crate::record::{
    now_ms, Intent, Origin, Pending, RecoveryAction, SandboxRecord, SnapshotReason, State,
};
use crate::sandbox::{clear_vm_files, identity, Ctx, Live};

use super::adopt::adopt;
use super::orphans::kill_vmm_in;
use super::snapshots::{complete_full, remove_unlisted, remove_volume, snapshot_names};
use super::{event, set_state, Next, RecoveryReport};

/// Resolves a cut-short transition and adopts what can be adopted.
pub(super) async fn phase1(
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
                    started: std::time::Duration::ZERO,
                    prefetch: None,
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
