//! The node's calls on volumes: make, delete, list, and one operation of the file API.

use space_node_api::{Blob, VolumeAnswer, VolumeInfo};
use space_proto::volume::VolumeRequest;

use super::*;

impl Node {
    /// Makes volume `id` of `tenant` of `size_bytes` (an existing one keeps its content and
    /// takes the size).
    pub async fn create_volume(
        &self,
        id: &str,
        tenant: &str,
        size_bytes: u64,
    ) -> Result<VolumeInfo> {
        self.check_open()?;
        let (ctx, id, tenant) = (self.inner.ctx.clone(), id.to_owned(), tenant.to_owned());
        blocking(move || ctx.volumes.create(&id, &tenant, size_bytes)).await
    }

    /// Brings volume `id` of `tenant` here from its newest copy in the object store, held
    /// under placement `epoch` (the volume moved to this node). A copy already here of that
    /// epoch or a newer one is kept as it is.
    pub async fn restore_volume(
        &self,
        id: &str,
        tenant: &str,
        size_bytes: u64,
        epoch: u64,
    ) -> Result<VolumeInfo> {
        self.check_open()?;
        let ctx = &self.inner.ctx;
        if let Ok(m) = ctx.volumes.meta(id) {
            if m.epoch >= epoch && m.tenant == tenant {
                return ctx.volumes.info_of(id);
            }
        }
        let cfg = self.volume_copies_config()?;
        let _one = ctx.volumes.copy_lock.lock().await;
        let staged = ctx.volumes.dir.join(format!(".restore-{id}"));
        std::fs::create_dir_all(&ctx.volumes.dir)
            .map_err(NodeError::io("making", ctx.volumes.dir.clone()))?;
        let got = crate::volumes::copies::restore(ctx, &cfg, id, tenant, &staged).await;
        let head = match got {
            Ok(Some(h)) => h,
            Ok(None) => {
                return Err(NodeError::VolumeNotFound(format!(
                    "{id} (the object store has no copy of it)"
                )))
            }
            Err(e) => {
                let (s, st) = (ctx.storage.clone(), staged.clone());
                let _ = blocking(move || Ok(s.delete_volume(&st)?)).await;
                return Err(e);
            }
        };
        let meta = crate::volumes::Meta {
            size_bytes,
            tenant: tenant.to_owned(),
            epoch,
        };
        let (c2, id2) = (ctx.clone(), id.to_owned());
        let mut info = blocking(move || c2.volumes.install(&id2, &staged, &meta)).await?;
        ctx.volumes
            .with_copy(id, |c| c.synced_unix_ms = Some(head.synced_unix_ms));
        info.synced_unix_ms = Some(head.synced_unix_ms);
        // Sandboxes here that mount it (one that moved here with it) reach the new tree.
        for sb in self.list().await.unwrap_or_default() {
            if !sb.options.volumes.iter().any(|m| m.volume == id) {
                continue;
            }
            let h = self.lock_sandboxes().get(&sb.id).cloned();
            if let Some(h) = h {
                h.status.egress.set_mounts(crate::sandbox::mounts_for(
                    ctx,
                    &sb.id,
                    &sb.options.volumes,
                ));
            }
        }
        tracing::info!(volume = %id, copy = head.seq, epoch, from = %head.node, "volume restored from the object store");
        Ok(info)
    }

    /// Volume `id`'s use, and how far its copy in the object store goes.
    pub async fn volume_info(&self, id: &str) -> Result<VolumeInfo> {
        let (ctx, id) = (self.inner.ctx.clone(), id.to_owned());
        blocking(move || ctx.volumes.info_of(&id)).await
    }

    /// Copies volume `id` to the object store now if it changed since its last copy.
    pub async fn sync_volume(&self, id: &str) -> Result<VolumeInfo> {
        let cfg = self.volume_copies_config()?;
        crate::volumes::copies::copy(&self.inner.ctx, &cfg, id).await?;
        self.inner.ctx.volumes.info_of(id)
    }

    /// Copies every volume that changed since its last copy (the archive's volume pass);
    /// answers how many were copied.
    pub async fn sync_volumes(&self) -> usize {
        let Ok(cfg) = self.volume_copies_config() else {
            return 0;
        };
        sync_all(&self.inner.ctx, &cfg).await
    }

    fn volume_copies_config(&self) -> Result<crate::archive::ArchiveConfig> {
        let cfg = self
            .archive()
            .ok_or_else(|| NodeError::Invalid("this node has no object store".into()))?;
        if !crate::volumes::copies::supported(&self.inner.ctx) {
            return Err(NodeError::Invalid(
                "volume copies need the btrfs storage driver (a snapshot of the live volume)"
                    .into(),
            ));
        }
        Ok(cfg.clone())
    }

    /// Deletes volume `id`, refused while a sandbox of this node that is not terminated
    /// mounts it.
    pub async fn delete_volume(&self, id: &str) -> Result<()> {
        self.check_open()?;
        for info in self.list().await? {
            if info.state != State::Terminated
                && info.options.volumes.iter().any(|m| m.volume == id)
            {
                return Err(NodeError::VolumeInUse {
                    volume: id.to_owned(),
                    sandbox: info.id.clone(),
                });
            }
        }
        let ctx = self.inner.ctx.clone();
        let tenant = ctx.volumes.meta(id).map(|m| m.tenant).unwrap_or_default();
        let id2 = id.to_owned();
        blocking(move || ctx.volumes.delete(&id2)).await?;
        // Its copies go with it: the key first (nothing of them opens again), then the
        // objects (garbage collection takes what is left).
        if let Some(cfg) = self.archive() {
            if !tenant.is_empty() {
                if let Err(e) = cfg.keyring.shred(&tenant, id).await {
                    tracing::warn!(volume = %id, error = %e, "destroying a deleted volume's key");
                }
                if let Err(e) = cfg.archive.delete_volume_copies(id).await {
                    tracing::warn!(volume = %id, error = %e, "deleting a deleted volume's copies");
                }
            }
        }
        Ok(())
    }

    /// Every volume of this node.
    pub async fn volumes(&self) -> Result<Vec<VolumeInfo>> {
        let ctx = self.inner.ctx.clone();
        blocking(move || ctx.volumes.list()).await
    }

    /// One operation on volume `id`, as a guest's mount would send it (read-write).
    pub async fn volume_call(
        &self,
        id: &str,
        request: VolumeRequest,
        data: Vec<u8>,
    ) -> Result<VolumeAnswer> {
        let tree = self.inner.ctx.volumes.open(id)?;
        blocking(move || {
            let (reply, out) = space_volume::serve(&tree, false, request, &data);
            Ok(VolumeAnswer {
                reply,
                data: Blob(out),
            })
        })
        .await
    }
}

/// Copies every open volume that changed since its last copy; how many were copied.
pub(crate) async fn sync_all(ctx: &Arc<Ctx>, cfg: &crate::archive::ArchiveConfig) -> usize {
    if !crate::volumes::copies::supported(ctx) {
        return 0;
    }
    // Every volume, opened: one with writes from before the node started is copied too.
    let c2 = ctx.clone();
    let ids = match blocking(move || c2.volumes.list()).await {
        Ok(v) => v.into_iter().map(|v| v.id).collect(),
        Err(e) => {
            tracing::warn!(error = %e, "listing the volumes to copy");
            ctx.volumes.open_ids()
        }
    };
    let mut copied = 0;
    for id in ids {
        let before = ctx.volumes.with_copy(&id, |c| c.synced_unix_ms);
        match crate::volumes::copies::copy(ctx, cfg, &id).await {
            Ok(after) if after != before => copied += 1,
            Ok(_) => {}
            Err(NodeError::VolumeNotFound(_)) => {}
            Err(e) => {
                tracing::warn!(volume = %id, error = %e, "copying a volume to the object store")
            }
        }
    }
    copied
}
