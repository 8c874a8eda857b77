//! Volumes in a cluster (`docs/cluster.md`, *Volumes*): each volume lives on one node, the
//! one the database names. Its first create places it (the live, active node with the most
//! free memory); every later call about it, and every sandbox that mounts it, goes to that
//! node.

use std::sync::Arc;

use space_node_api::{Fault, FaultCode, NodeResult, RemoteNode};

use super::nodes::ClusterNodes;
use super::report_of;
use crate::store::{NodeRow, NodeState, StoreError};

fn internal(e: StoreError) -> Fault {
    Fault::new(FaultCode::Internal, format!("state store: {e}"))
}

fn not_found(volume: &str) -> Fault {
    Fault::new(FaultCode::VolumeNotFound, format!("no volume {volume}"))
}

impl ClusterNodes {
    /// The node that keeps `volume`, if it was placed.
    pub(super) async fn volume_home(&self, volume: &str) -> NodeResult<Option<NodeRow>> {
        let store = self.cluster().store();
        let row = store
            .volume_by_id(volume)
            .await
            .map_err(internal)?
            .ok_or_else(|| not_found(volume))?;
        let Some(node) = row.node else {
            return Ok(None);
        };
        let node = store
            .node(&node)
            .await
            .map_err(internal)?
            .ok_or_else(|| not_found(volume))?;
        if !node.live || !matches!(node.state, NodeState::Active | NodeState::Draining) {
            return Err(Fault::new(
                FaultCode::Unavailable,
                format!(
                    "volume {volume} is on node {}, which is {} (its lease {})",
                    node.id,
                    node.state.as_str(),
                    if node.live { "runs" } else { "ran out" }
                ),
            ));
        }
        Ok(Some(node))
    }

    /// The client of the node that keeps `volume`.
    pub(super) async fn volume_client(&self, volume: &str) -> NodeResult<Arc<RemoteNode>> {
        let node = self
            .volume_home(volume)
            .await?
            .ok_or_else(|| not_found(volume))?;
        self.client_of(&node)
    }

    /// The node `volume` is placed on (placing it on the live, active node with the most
    /// free memory when it has none yet).
    pub(super) async fn place_volume(&self, volume: &str) -> NodeResult<Arc<RemoteNode>> {
        if let Some(node) = self.volume_home(volume).await? {
            return self.client_of(&node);
        }
        let rows = self.cluster().live_nodes().await.map_err(internal)?;
        let best = rows
            .into_iter()
            .filter(|r| r.state == NodeState::Active)
            .max_by_key(|r| report_of(r).memory_free_mib)
            .ok_or_else(|| Fault::new(FaultCode::Unavailable, "no node of the cluster is live"))?;
        self.cluster()
            .store()
            .set_volume_node(volume, &best.id)
            .await
            .map_err(internal)?;
        self.client_of(&best)
    }

    /// The one node every volume of a create is on (`None` without volumes).
    pub(super) async fn mounts_home(
        &self,
        volumes: &[space_node_api::VolumeMount],
    ) -> NodeResult<Option<String>> {
        let mut home: Option<String> = None;
        for m in volumes {
            let node = self
                .volume_home(&m.volume)
                .await?
                .ok_or_else(|| not_found(&m.volume))?;
            match &home {
                Some(h) if h != &node.id => {
                    return Err(Fault::new(
                        FaultCode::Invalid,
                        format!(
                            "volumes {} and others are on different nodes ({h} and {}): one \
                             sandbox mounts volumes of one node",
                            m.name, node.id
                        ),
                    ))
                }
                _ => home = Some(node.id),
            }
        }
        Ok(home)
    }
}
