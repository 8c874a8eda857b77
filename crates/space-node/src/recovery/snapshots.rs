//! A sandbox's snapshot directories as recovery sees them: their names, whether a full
//! snapshot cut short is complete after all, and the removal of what the record does not list.

use std::path::Path;
use std::sync::Arc;

use space_runtime::Manifest;

use crate::error::{NodeError, Result};
use crate::ids::SnapshotId;
use crate::record::{SandboxRecord, SnapshotKind, SnapshotReason, SnapshotRecord};
use crate::sandbox::{clear_vm_files, dir_size, Ctx};
use crate::template::blocking;

use super::RecoveryReport;

/// Names in `<data>/snapshots/<id>/`.
pub(super) fn snapshot_names(ctx: &Ctx, r: &SandboxRecord) -> Result<Vec<String>> {
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
pub(super) fn complete_full(
    ctx: &Ctx,
    r: &SandboxRecord,
    id: &SnapshotId,
) -> Result<Option<SnapshotRecord>> {
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
pub(super) async fn remove_unlisted(
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

pub(super) async fn remove_volume(
    ctx: &Arc<Ctx>,
    path: &Path,
    report: &mut RecoveryReport,
) -> Result<()> {
    if std::fs::symlink_metadata(path).is_err() {
        return Ok(());
    }
    let (s, p) = (ctx.storage.clone(), path.to_owned());
    let _ = clear_vm_files(path);
    blocking(move || Ok(s.delete_volume(&p)?)).await?;
    report.removed.push(path.to_owned());
    Ok(())
}
