//! The node's calls on volumes: make, delete, list, and one operation of the file API.

use space_node_api::{Blob, VolumeAnswer, VolumeInfo};
use space_proto::volume::VolumeRequest;

use super::*;

impl Node {
    /// Makes volume `id` of `size_bytes` (an existing one keeps its content and takes the
    /// size).
    pub async fn create_volume(&self, id: &str, size_bytes: u64) -> Result<VolumeInfo> {
        self.check_open()?;
        let (ctx, id) = (self.inner.ctx.clone(), id.to_owned());
        blocking(move || ctx.volumes.create(&id, size_bytes)).await
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
        let (ctx, id) = (self.inner.ctx.clone(), id.to_owned());
        blocking(move || ctx.volumes.delete(&id)).await
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
