//! The archive's background work: the pass that asks each sandbox what it should upload next
//! ([`Request::UploadJob`]), uploads it and evicts the cache, and crypto-shredding of lineages
//! past retention.

use super::*;

/// What the archive pass uploads for one sandbox: a snapshot, and the record its manifest
/// carries.
pub(crate) struct UploadJob {
    pub record: SandboxRecord,
    pub snapshot: SnapshotId,
    pub dir: PathBuf,
}

/// What one archive pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ArchiveReport {
    /// Snapshots uploaded.
    pub uploaded: Vec<(SandboxId, SnapshotId)>,
    /// Uploads that failed.
    pub failed: usize,
    /// Local copies evicted.
    pub evicted: Vec<(SandboxId, SnapshotId)>,
}

/// How often the archive pass runs (each sandbox's own interval decides what it uploads).
pub(crate) const ARCHIVE_TICK: Duration = Duration::from_secs(5);

/// One archive pass over `handles` (see [`crate::Node::reconcile_archive`]).
pub(crate) async fn pass(
    ctx: &Arc<Ctx>,
    handles: Vec<(SandboxId, crate::sandbox::Handle)>,
    last_gc_ms: &std::sync::atomic::AtomicU64,
) -> ArchiveReport {
    let mut report = ArchiveReport::default();
    let Some(cfg) = ctx.archive.get().cloned() else {
        return report;
    };
    for (id, h) in &handles {
        let (tx, rx) = crate::sandbox::reply();
        if h.tx
            .send(Request::UploadJob(cfg.upload_interval, tx))
            .await
            .is_err()
        {
            continue;
        }
        let Ok(Ok(Some(job))) = rx.await else {
            continue;
        };
        match upload_snapshot(ctx, &cfg, &job.record, &job.snapshot, &job.dir).await {
            Ok(remote) => {
                let (tx, rx) = crate::sandbox::reply();
                if h.tx
                    .send(Request::Uploaded(job.snapshot.clone(), remote, tx))
                    .await
                    .is_ok()
                    && matches!(rx.await, Ok(Ok(())))
                {
                    report.uploaded.push((id.clone(), job.snapshot));
                }
            }
            Err(e) => {
                report.failed += 1;
                tracing::warn!(%id, snapshot = %job.snapshot, error = %e, "archive pass: upload failed (retried next pass)");
            }
        }
    }
    // Garbage in the store, once an hour.
    let last = last_gc_ms.load(std::sync::atomic::Ordering::Relaxed);
    if cfg.collect_garbage && now_ms().saturating_sub(last) >= GC_EVERY.as_millis() as u64 {
        last_gc_ms.store(now_ms(), std::sync::atomic::Ordering::Relaxed);
        space_archive::gc::collect_and_log(&cfg.archive, &cfg.keyring).await;
    }
    // The cache: archived local copies of suspended sandboxes, oldest suspension first.
    let mut cached: Vec<(u64, SandboxId, SnapshotId, u64, crate::sandbox::Handle)> = Vec::new();
    for (id, h) in &handles {
        if h.status.state() != State::Suspended {
            continue;
        }
        let (tx, rx) = crate::sandbox::reply();
        if h.tx.send(Request::Info(tx)).await.is_err() {
            continue;
        }
        let Ok(Ok(r)) = rx.await else { continue };
        for s in r.snapshots.iter().filter(|s| s.local && s.remote.is_some()) {
            cached.push((
                r.state_since_unix_ms,
                id.clone(),
                s.id.clone(),
                s.size_bytes,
                h.clone(),
            ));
        }
    }
    cached.sort_by_key(|c| c.0);
    let mut total: u64 = cached.iter().map(|c| c.3).sum();
    let root = ctx.layout.root().to_owned();
    for (_, id, snap, size, h) in cached {
        let over_size = cfg.cache_max_bytes.is_some_and(|max| total > max);
        let low_space = free_bytes(&root).is_some_and(|f| f < cfg.min_free_bytes);
        if !over_size && !low_space {
            break;
        }
        let (tx, rx) = crate::sandbox::reply();
        if h.tx.send(Request::Evict(snap.clone(), tx)).await.is_err() {
            continue;
        }
        if let Ok(Ok(true)) = rx.await {
            total = total.saturating_sub(size);
            tracing::info!(%id, snapshot = %snap, over_size, low_space, "evicted a cached snapshot copy");
            report.evicted.push((id, snap));
        }
    }
    report
}

fn free_bytes(p: &std::path::Path) -> Option<u64> {
    nix::sys::statvfs::statvfs(p)
        .ok()
        .map(|s| s.blocks_available() * s.fragment_size())
}

/// Destroys the key of every lineage whose sandboxes have all been terminated for at least
/// `max_age` (the retention's): the lineage's archive can never be opened again. Their local
/// snapshots (plaintext) are deleted first, and their records say when. A lineage with a
/// sandbox that is not terminated, or terminated more recently, is left alone. Failures are
/// logged and retried on the next pass.
pub(crate) async fn shred_expired(ctx: &Ctx, records: &[SandboxRecord], max_age: Duration) {
    let Some(cfg) = ctx.archive.get() else { return };
    let now = now_ms();
    let mut by_lineage: std::collections::BTreeMap<&str, Vec<&SandboxRecord>> = Default::default();
    for r in records.iter().filter(|r| !r.is_pooled()) {
        by_lineage.entry(r.lineage()).or_default().push(r);
    }
    for (lineage, members) in by_lineage {
        let expired = members.iter().all(|r| {
            r.state == State::Terminated
                && now.saturating_sub(r.state_since_unix_ms) >= max_age.as_millis() as u64
        });
        if !expired || members.iter().all(|r| r.shredded_unix_ms.is_some()) {
            continue;
        }
        let tenant = members[0].tenant.clone();
        // Local plaintext first: a shredded lineage must not survive on this disk either.
        let mut cleared = Vec::new();
        for r in &members {
            let mut r = (*r).clone();
            for s in &r.snapshots {
                if let Err(e) = evict(ctx, &r.id, &s.id).await {
                    tracing::error!(id = %r.id, snapshot = %s.id, error = %e, "shredding: deleting a local snapshot");
                }
            }
            r.snapshots.clear();
            r.restore_point = None;
            cleared.push(r);
        }
        let shredded = match cfg.keyring.shred(&tenant, lineage).await {
            Ok(()) => {
                tracing::info!(
                    %lineage, %tenant,
                    "lineage key destroyed (every sandbox of it terminated past retention)"
                );
                true
            }
            Err(e) => {
                tracing::error!(%lineage, error = %e, "shredding a lineage key (retried next pass)");
                false
            }
        };
        for mut r in cleared {
            if shredded {
                r.shredded_unix_ms = Some(now);
            }
            if let Err(e) = ctx.records.write(&r) {
                tracing::error!(id = %r.id, error = %e, "shredding: writing a record");
            }
        }
    }
}
