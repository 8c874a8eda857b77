//! Starting a sandbox's VM again from one of its snapshots: a VM lost under a running node or
//! at start ([`relaunch`], with its limit on automatic restores), and a rollback cut short.
//! What cannot be started leaves the sandbox Failed, or Suspended on its restore point.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::error::{NodeError, Result};
use crate::ids::{SnapshotId, VersionReq};
use crate::record::{
    now_ms, Intent, Origin, Pending, RecoveryAction, SandboxRecord, SnapshotKind, SnapshotRecord,
    State,
};
use crate::sandbox::{clear_vm_files, launch, Ctx, Launch, Live};
use crate::template::{self, blocking};

use super::{chain, event, set_state};

pub(super) async fn finish_rollback(
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
