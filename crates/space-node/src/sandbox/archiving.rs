//! A sandbox's side of the object store ([`crate::archive`]): which of its snapshots should go
//! up next, recording an upload, evicting the local copy of an archived snapshot, and getting
//! a snapshot's files back onto this node for a restore or a rollback (fetched from the store
//! when there is no local copy, with the local copy fetched again afterwards).

use crate::archive::{
    evict, fetch_for_restore, fetch_lazy, fetch_snapshot, full_snapshot_present, key_error,
    Incoming, LazyIncoming, UploadJob,
};
use crate::record::RemoteCopy;

use super::*;

/// Where a restore's files came from ([`Sandbox::restore_source`]).
pub(super) enum Fetched {
    /// The snapshot's local copy.
    Local,
    /// The store, whole, into the sandbox directory.
    Whole(Incoming),
    /// The store, lazily: mounted in the sandbox directory, filled in while the VM runs.
    Lazy(LazyIncoming),
}

impl Sandbox {
    /// The next snapshot this sandbox should have in the store, if any: a suspended
    /// sandbox's restore point, a snapshot taken on request, or (every `interval`) the newest
    /// full snapshot of a live one, taken now for a running one when none is newer than the
    /// last upload. Only snapshots whose files are here.
    pub(super) async fn upload_job(&mut self, interval: Option<Duration>) -> Option<UploadJob> {
        self.fetch_cache_copies();
        let local_full =
            |s: &&SnapshotRecord| s.kind == SnapshotKind::Full && s.local && s.remote.is_none();
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
                .find(|s| s.reason == SnapshotReason::Request)
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
                                .snapshot(SnapshotKind::Full, SnapshotReason::Rolling)
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
    pub(super) async fn evict_local(&mut self, snap: &SnapshotId) -> bool {
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
    /// none, the object store: lazily (its RAM file and disk mounted in the sandbox
    /// directory, filled in while the VM runs), or fetched whole into the sandbox directory
    /// first; either way with the cache copy to put in place once the VM runs.
    pub(super) async fn restore_source(&mut self, snap: &SnapshotId) -> Result<(Launch, Fetched)> {
        let dir = self
            .ctx
            .layout
            .snapshot_dir(self.record.id.as_str(), snap.as_str())?;
        let remote = self.record.snapshot(snap).and_then(|s| s.remote.clone());
        match (self.ctx.archive.get(), remote) {
            (Some(cfg), Some(remote)) if !full_snapshot_present(&dir) => {
                let cfg = cfg.clone();
                let mode = crate::archive::RestoreMode::from_u8(
                    self.ctx
                        .restore_mode
                        .load(std::sync::atomic::Ordering::Relaxed),
                );
                if let Some(opts) = mode.lazy_options(cfg.lazy.as_ref()) {
                    let lazy = fetch_lazy(
                        &self.ctx,
                        &cfg,
                        opts,
                        &self.record,
                        snap,
                        &remote.manifest_hash,
                        &self.dir,
                    )
                    .await?;
                    let how = Launch::RestoreInPlace {
                        snapshot: lazy.dir.clone(),
                        prefetch: lazy.restore.as_ref().map(|r| r.files.clone()),
                        splice: lazy
                            .restore
                            .as_ref()
                            .map(|_| space_runtime::Splice::new(&self.dir)),
                    };
                    return Ok((how, Fetched::Lazy(lazy)));
                }
                let incoming = fetch_for_restore(
                    &self.ctx,
                    &cfg,
                    &self.record,
                    snap,
                    &remote.manifest_hash,
                    &self.dir,
                )
                .await?;
                let how = Launch::RestoreInPlace {
                    snapshot: incoming.dir().to_owned(),
                    prefetch: None,
                    splice: None,
                };
                Ok((how, Fetched::Whole(incoming)))
            }
            _ => {
                let snapshot = self.ensure_local(snap).await?;
                Ok((Launch::Restore { snapshot }, Fetched::Local))
            }
        }
    }

    /// Fetches the local copies of snapshots a restore fetched straight into the sandbox
    /// directory (in the background, one pass after the restore), and once one is there
    /// records that its snapshot is local.
    fn fetch_cache_copies(&mut self) {
        let Some(cfg) = self.ctx.archive.get().cloned() else {
            self.caching.clear();
            return;
        };
        if self.lazy.as_ref().is_some_and(|f| f.pending().is_some()) || self.handover_at.is_some() {
            // Not while a lazy restore fills its files in from the same packs, nor before its
            // VM has moved to them (the move would share the CPU with the fetch).
            return;
        }
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
                    fetch_snapshot(&ctx, &cfg, &record, &snap, &remote.manifest_hash).await
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
    pub(super) async fn ensure_local(&mut self, snap: &SnapshotId) -> Result<PathBuf> {
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
    pub(super) fn uploaded(&mut self, snap: &SnapshotId, remote: RemoteCopy) -> Result<()> {
        if let Some(s) = self.record.snapshots.iter_mut().find(|s| &s.id == snap) {
            s.remote = Some(remote);
        }
        self.write()
    }
}
