//! Volumes in a cluster (`docs/cluster.md`, *Volumes*): each volume lives on one node, the
//! one the database names. Its first create places it (the live, active node with the most
//! free memory); every later call about it, and every sandbox that mounts it, goes to that
//! node. When that node is lost or removed, the volume moves: another node brings it from
//! its newest copy in the object store, under a new placement epoch, and the database names
//! that node from then on.

use std::sync::Arc;

use space_node_api::{Fault, FaultCode, NodeApi, NodeResult, RemoteNode};

use super::nodes::ClusterNodes;
use super::report_of;
use super::Cluster;
use crate::store::{NodeRow, NodeState, StoreError, VolumeRow};

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
        let Some(node) = row.node.clone() else {
            return Ok(None);
        };
        let node = store
            .node(&node)
            .await
            .map_err(internal)?
            .ok_or_else(|| not_found(volume))?;
        if matches!(node.state, NodeState::Lost | NodeState::Removed) {
            return self.move_off(&row, &node).await.map(Some);
        }
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

    /// Moves the volume of `row` off `from` (lost or removed) to the live, active node with
    /// the most free memory; answers the node that keeps it now.
    async fn move_off(&self, row: &VolumeRow, from: &NodeRow) -> NodeResult<NodeRow> {
        let rows = self.cluster().live_nodes().await.map_err(internal)?;
        let best = rows
            .into_iter()
            .filter(|r| r.state == NodeState::Active && r.id != from.id)
            .max_by_key(|r| report_of(r).memory_free_mib)
            .ok_or_else(|| {
                Fault::new(
                    FaultCode::Unavailable,
                    format!(
                        "volume {} is on node {}, which is {}, and no other node is live",
                        row.id,
                        from.id,
                        from.state.as_str()
                    ),
                )
            })?;
        move_volume(self.cluster(), row, &from.id, &best).await
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

/// Brings the volume of `row` to node `to` from its newest copy in the object store and names
/// `to` its node, if `from` still is; answers the node that keeps it afterwards (another
/// replica's choice when it moved the volume first).
pub(super) async fn move_volume(
    cluster: &Cluster,
    row: &VolumeRow,
    from: &str,
    to: &NodeRow,
) -> NodeResult<NodeRow> {
    let store = cluster.store();
    let client = cluster
        .client(to)
        .map_err(|e| Fault::new(FaultCode::Internal, e.to_string()))?;
    // Placement epochs are the moves' times: a later move has a higher one.
    let epoch = space_node_api::sandbox::now_ms();
    let info = client
        .restore_volume(&row.id, row.tenant.as_str(), row.size_bytes, epoch)
        .await
        .map_err(|f| {
            Fault::new(
                f.code,
                format!(
                    "volume {} was on node {from}, which is gone, and could not be brought \
                     to node {}: {}",
                    row.id, to.id, f.message
                ),
            )
        })?;
    if store
        .move_volume(&row.id, from, &to.id)
        .await
        .map_err(internal)?
    {
        tracing::warn!(
            volume = %row.id, from, to = %to.id, epoch, synced_unix_ms = ?info.synced_unix_ms,
            "volume moved off a lost node from its copy in the object store"
        );
        return Ok(to.clone());
    }
    // Another replica moved it first: the copy made here is never used (the database does
    // not name this node), and the volume is where that replica put it.
    let now = store
        .volume_by_id(&row.id)
        .await
        .map_err(internal)?
        .and_then(|r| r.node)
        .ok_or_else(|| not_found(&row.id))?;
    store
        .node(&now)
        .await
        .map_err(internal)?
        .ok_or_else(|| not_found(&row.id))
}

/// After sandbox `sb` moved off the lost node `from` to `to`: the volumes it mounts that
/// were on `from` come to `to` too (a sandbox mounts volumes of its own node). One that
/// another sandbox took elsewhere first stays there, and this sandbox's mount of it answers
/// errors (logged).
pub(super) async fn follow(
    cluster: &Cluster,
    sb: &space_node_api::Sandbox,
    from: &str,
    to: &NodeRow,
) {
    for m in &sb.options.volumes {
        let row = match cluster.store().volume_by_id(&m.volume).await {
            Ok(Some(r)) => r,
            Ok(None) => continue,
            Err(e) => {
                tracing::warn!(volume = %m.volume, error = %e, "a moved sandbox's volume");
                continue;
            }
        };
        match row.node.as_deref() {
            Some(n) if n == from => match move_volume(cluster, &row, from, to).await {
                Ok(home) if home.id == to.id => {}
                Ok(home) => tracing::warn!(
                    sandbox = %sb.id, volume = %m.volume, node = %home.id,
                    "a moved sandbox's volume went to another node: its mount answers errors"
                ),
                Err(f) => tracing::warn!(
                    sandbox = %sb.id, volume = %m.volume, error = %f,
                    "a moved sandbox's volume could not follow it: its mount answers errors"
                ),
            },
            Some(n) if n == to.id => {}
            other => tracing::warn!(
                sandbox = %sb.id, volume = %m.volume, node = ?other,
                "a moved sandbox's volume is on another node: its mount answers errors"
            ),
        }
    }
}
