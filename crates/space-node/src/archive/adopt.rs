//! A node without its disk: the sandboxes the store holds that this node has no record of
//! come back as Suspended records.

use super::*;

/// Records for every sandbox the store holds and this node has no record of: Suspended on
/// the head's snapshot, which lives only in the store until a restore fetches it. Sandboxes
/// whose keys do not open (a disabled master key) are skipped with a warning and found again
/// at the next start.
pub(crate) async fn adopt_archived(ctx: &Ctx, cfg: &ArchiveConfig) -> Result<Vec<SandboxRecord>> {
    let heads = cfg
        .archive
        .heads()
        .await
        .map_err(|e| NodeError::Archive(format!("listing archived sandboxes: {e}")))?;
    let mut adopted = Vec::new();
    for h in heads {
        let Ok(id) = h.sandbox.parse::<SandboxId>() else {
            continue;
        };
        if h.terminated {
            continue;
        }
        if ctx.records.read(&id)?.is_some() {
            continue;
        }
        match adopt_one(ctx, cfg, &h, &id).await {
            Ok(r) => adopted.push(r),
            Err(e) => {
                tracing::warn!(sandbox = %h.sandbox, error = %e, "archived sandbox not adopted")
            }
        }
    }
    Ok(adopted)
}

/// The record of sandbox `id` of `tenant`, from the newest snapshot the store holds,
/// Suspended on it, owned here under `epoch` (the control plane moved the sandbox to this
/// node). Refused when the store holds no such sandbox of that tenant, when it was killed,
/// and when its head names a newer epoch (it moved again).
pub(crate) async fn adopt_moved(
    ctx: &Ctx,
    cfg: &ArchiveConfig,
    id: &SandboxId,
    tenant: &str,
    epoch: u64,
) -> Result<SandboxRecord> {
    let h = cfg
        .archive
        .head(id.as_str())
        .await
        .map_err(|e| NodeError::Archive(format!("reading the head of {id}: {e}")))?
        .filter(|h| h.tenant == tenant)
        .ok_or_else(|| NodeError::NotFound(id.clone()))?;
    if h.terminated {
        return Err(NodeError::NotFound(id.clone()));
    }
    if h.epoch > epoch {
        return Err(NodeError::Invalid(format!(
            "{id} was moved again (epoch {} in the store, {epoch} asked)",
            h.epoch
        )));
    }
    let mut r = adopt_one(ctx, cfg, &h, id).await?;
    r.epoch = epoch;
    ctx.records.write(&r)?;
    Ok(r)
}

async fn adopt_one(
    ctx: &Ctx,
    cfg: &ArchiveConfig,
    h: &space_archive::Head,
    id: &SandboxId,
) -> Result<SandboxRecord> {
    let keys = cfg
        .keyring
        .lineage_keys(&h.tenant, &h.lineage, false, true)
        .await
        .map_err(key_error)?;
    let m = fetch_manifest(cfg, &keys, &h.sandbox, &h.snapshot, &h.manifest_hash).await?;
    let mut r: SandboxRecord = serde_json::from_value(m.record.clone()).map_err(|e| {
        NodeError::Archive(format!(
            "the record in snapshot {} of {}: {e}",
            h.snapshot, h.sandbox
        ))
    })?;
    if r.id != *id || r.lineage() != h.lineage || r.tenant != h.tenant {
        return Err(NodeError::Archive(format!(
            "the record in snapshot {} names sandbox {} of tenant {}",
            h.snapshot, r.id, r.tenant
        )));
    }
    let snap: SnapshotId = h.snapshot.parse()?;
    // Only what the store holds: snapshots with a remote copy, plus the head's own.
    r.snapshots
        .retain(|s| (s.remote.is_some() && s.kind == SnapshotKind::Full) || s.id == snap);
    for s in r.snapshots.iter_mut() {
        s.local = false;
    }
    match r.snapshots.iter_mut().find(|s| s.id == snap) {
        Some(s) => {
            s.remote = Some(RemoteCopy {
                manifest_hash: h.manifest_hash.clone(),
                uploaded_unix_ms: h.updated_unix_ms,
                uploaded_bytes: 0,
                new_chunks: 0,
                stored_bytes: m.stored_bytes(),
            })
        }
        None => {
            return Err(NodeError::Archive(format!(
                "the record in snapshot {} does not list it",
                h.snapshot
            )))
        }
    }
    // The VM's working directory, as a suspended sandbox has it (the restore starts there).
    let dir = ctx.layout.sandbox_dir(r.id.as_str())?;
    if !dir.exists() {
        let (s, d) = (ctx.storage.clone(), dir.clone());
        blocking(move || Ok(s.create_volume(&d)?)).await?;
    }
    let now = now_ms();
    r.state = State::Suspended;
    r.state_since_unix_ms = now;
    r.pending = None;
    r.restore_point = Some(snap);
    r.failure = None;
    r.last_activity_unix_ms = now;
    ctx.records.write(&r)?;
    tracing::info!(id = %r.id, tenant = %r.tenant, snapshot = %h.snapshot, "archived sandbox adopted from the object store");
    Ok(r)
}
