//! The archive's background work: what each sandbox should upload next, the pass that
//! uploads it and evicts the cache, and crypto-shredding of lineages past retention.

use super::*;

/// What the archive pass uploads for one sandbox: a snapshot, and the record its manifest
/// carries.
pub(crate) struct UploadJob {
    pub record: SandboxRecord,
    pub snapshot: SnapshotId,
    pub dir: PathBuf,
}

impl crate::sandbox::Sandbox {
    /// The next snapshot this sandbox should have in the store, if any: a suspended
    /// sandbox's restore point, a snapshot taken on request, or (every `interval`) the newest
    /// full snapshot of a live one, taken now for a running one when none is newer than the
    /// last upload. Only snapshots whose files are here.
    pub(crate) async fn upload_job(&mut self, interval: Option<Duration>) -> Option<UploadJob> {
        self.fetch_cache_copies();
        let local_full = |s: &&crate::record::SnapshotRecord| {
            s.kind == SnapshotKind::Full && s.local && s.remote.is_none()
        };
        let r = &self.record;
        let mut pick = match r.state {
            State::Suspended => r
                .restore_point
                .as_ref()
                .and_then(|p| r.snapshot(p))
                .filter(local_full)
                .map(|s| s.id.clone()),
            State::Running | State::Paused => r
                .snapshots
                .iter()
                .filter(local_full)
                .find(|s| s.reason == crate::record::SnapshotReason::Request)
                .map(|s| s.id.clone()),
            _ => None,
        };
        if pick.is_none() && matches!(r.state, State::Running | State::Paused) {
            if let Some(interval) = interval {
                let last = r
                    .snapshots
                    .iter()
                    .filter_map(|s| s.remote.as_ref().map(|rc| rc.uploaded_unix_ms))
                    .max()
                    .unwrap_or(0);
                if now_ms().saturating_sub(last) >= interval.as_millis() as u64 {
                    let newest = r
                        .snapshots
                        .iter()
                        .rev()
                        .find(|s| s.kind == SnapshotKind::Full)
                        .filter(local_full)
                        .filter(|s| s.created_unix_ms > last)
                        .map(|s| s.id.clone());
                    pick = match newest {
                        Some(id) => Some(id),
                        // Nothing newer to send: a running guest gets a fresh full snapshot (a
                        // rolling one, thinned by retention); a paused one has not changed.
                        None if r.state == State::Running => {
                            match self
                                .snapshot(
                                    SnapshotKind::Full,
                                    crate::record::SnapshotReason::Rolling,
                                )
                                .await
                            {
                                Ok(s) => Some(s.id),
                                Err(e) => {
                                    tracing::warn!(id = %self.record.id, error = %e, "archive pass: periodic full snapshot");
                                    None
                                }
                            }
                        }
                        None => None,
                    };
                }
            }
        }
        let pick = pick?;
        let dir = self
            .ctx
            .layout
            .snapshot_dir(self.record.id.as_str(), pick.as_str())
            .ok()?;
        full_snapshot_present(&dir).then(|| UploadJob {
            record: self.record.clone(),
            snapshot: pick,
            dir,
        })
    }

    /// Drops the local copy of an archived snapshot (the record says where it lives).
    pub(crate) async fn evict_local(&mut self, snap: &SnapshotId) -> bool {
        let archived = self
            .record
            .snapshot(snap)
            .is_some_and(|s| s.remote.is_some() && s.local);
        if !archived {
            return false;
        }
        if let Err(e) = evict(&self.ctx, &self.record.id, snap).await {
            tracing::error!(id = %self.record.id, snapshot = %snap, error = %e, "evicting a local snapshot copy");
            return false;
        }
        if let Some(s) = self.record.snapshots.iter_mut().find(|s| &s.id == snap) {
            s.local = false;
        }
        if let Err(e) = self.write() {
            tracing::error!(id = %self.record.id, error = %e, "writing a sandbox record");
        }
        true
    }

    /// Where a restore of full snapshot `snap` starts from: its local copy, or when there is
    /// none, its RAM file and disk fetched from the object store into the sandbox directory
    /// (with the cache copy to put in place once the VM runs).
    pub(crate) async fn restore_source(
        &mut self,
        snap: &SnapshotId,
    ) -> Result<(crate::sandbox::Launch, Option<super::Incoming>)> {
        let dir = self
            .ctx
            .layout
            .snapshot_dir(self.record.id.as_str(), snap.as_str())?;
        let remote = self.record.snapshot(snap).and_then(|s| s.remote.clone());
        match (self.ctx.archive.get(), remote) {
            (Some(cfg), Some(remote)) if !full_snapshot_present(&dir) => {
                let cfg = cfg.clone();
                let incoming = super::fetch_for_restore(
                    &self.ctx,
                    &cfg,
                    &self.record,
                    snap,
                    &remote.manifest_hash,
                    &self.dir,
                )
                .await?;
                let how = crate::sandbox::Launch::RestoreInPlace {
                    snapshot: incoming.dir().to_owned(),
                };
                Ok((how, Some(incoming)))
            }
            _ => {
                let snapshot = self.ensure_local(snap).await?;
                Ok((crate::sandbox::Launch::Restore { snapshot }, None))
            }
        }
    }

    /// Fetches the local copies of snapshots a restore fetched straight into the sandbox
    /// directory (in the background, one pass after the restore), and once one is there
    /// records that its snapshot is local.
    pub(crate) fn fetch_cache_copies(&mut self) {
        let Some(cfg) = self.ctx.archive.get().cloned() else {
            self.caching.clear();
            return;
        };
        let mut pending = std::mem::take(&mut self.caching);
        let mut changed = false;
        pending.retain_mut(|(snap, started)| {
            let Some(remote) = self.record.snapshot(snap).and_then(|s| s.remote.clone()) else {
                return false; // dropped meanwhile
            };
            let Ok(dir) = self
                .ctx
                .layout
                .snapshot_dir(self.record.id.as_str(), snap.as_str())
            else {
                return false;
            };
            if full_snapshot_present(&dir) {
                if let Some(s) = self.record.snapshots.iter_mut().find(|s| &s.id == snap) {
                    changed |= !s.local;
                    s.local = true;
                }
                return false;
            }
            if let Some(done) = started {
                // Under way; or it failed (and said why), and a restore fetches again.
                return !done.load(std::sync::atomic::Ordering::Acquire);
            }
            let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
            *started = Some(done.clone());
            let (ctx, cfg, record, snap) =
                (self.ctx.clone(), cfg.clone(), self.record.clone(), snap.clone());
            tokio::spawn(async move {
                if let Err(e) =
                    super::fetch_snapshot(&ctx, &cfg, &record, &snap, &remote.manifest_hash).await
                {
                    tracing::warn!(id = %record.id, snapshot = %snap, error = %e, "fetching the local copy of a restored snapshot");
                }
                done.store(true, std::sync::atomic::Ordering::Release);
            });
            true
        });
        self.caching = pending;
        if changed {
            if let Err(e) = self.write() {
                tracing::error!(id = %self.record.id, error = %e, "writing a sandbox record");
            }
        }
    }

    /// Makes sure full snapshot `snap`'s files are on this node, fetching them from the
    /// object store when they are not.
    pub(crate) async fn ensure_local(&mut self, snap: &SnapshotId) -> Result<PathBuf> {
        let dir = self
            .ctx
            .layout
            .snapshot_dir(self.record.id.as_str(), snap.as_str())?;
        let remote = self.record.snapshot(snap).and_then(|s| s.remote.clone());
        if full_snapshot_present(&dir) {
            // A snapshot that is in the store is sealed under the tenant's keys: a local copy
            // starts only while those keys still open (a revoked master key stops it too).
            if let (Some(cfg), Some(_)) = (self.ctx.archive.get(), &remote) {
                cfg.keyring
                    .lineage_keys(&self.record.tenant, self.record.lineage(), false, true)
                    .await
                    .map_err(key_error)?;
            }
            return Ok(dir);
        }
        let (Some(cfg), Some(remote)) = (self.ctx.archive.get().cloned(), remote) else {
            return Err(NodeError::Archive(format!(
                "snapshot {snap} of {} is neither on this node nor in an object store it uses",
                self.record.id
            )));
        };
        fetch_snapshot(&self.ctx, &cfg, &self.record, snap, &remote.manifest_hash).await?;
        if let Some(s) = self.record.snapshots.iter_mut().find(|s| &s.id == snap) {
            s.local = true;
        }
        Ok(dir)
    }

    /// Records an upload the archive pass made.
    pub(crate) fn uploaded(&mut self, snap: &SnapshotId, remote: RemoteCopy) -> Result<()> {
        if let Some(s) = self.record.snapshots.iter_mut().find(|s| &s.id == snap) {
            s.remote = Some(remote);
        }
        self.write()
    }
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
