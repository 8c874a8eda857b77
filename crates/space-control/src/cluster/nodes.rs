//! [`ClusterNodes`]: the node API of a whole cluster, as one replica serves it.
//!
//! A call about a sandbox goes to the node the database names as its owner. A create is
//! placed: among the live, active nodes that have the template build, the best few (a ready
//! warm pool first, then the most free memory) are tried in turn, each only after its memory
//! was reserved in the database (`Store::reserve`), so replicas placing at once never
//! double-book a node. Calls about the cluster as a whole (lists, usage, templates, pools)
//! ask every live node.

use std::sync::Arc;

use async_trait::async_trait;
use space_node_api::policy::EgressPolicy;
use space_node_api::{
    Blob, Fault, FaultCode, NodeApi, NodeResult, NodeSettings, NodeStatus, Pool, RemoteNode,
    Sandbox, SecretMap, Snapshot, TemplateBuild, TemplateInfo, Usage, Woke,
};
use space_node_api::{
    CreateRequest, SandboxId, SnapshotId, SnapshotKind, TemplateName, TemplateRef, TimeoutPolicy,
    VersionReq,
};
use space_proto::GuestClient;

use super::moves::{is_being_moved, relocate, Why, MOVE_CLAIM};
use super::{report_of, Cluster, RESERVATION};
use crate::store::{NodeRow, NodeState, StoreError, TenantName};

/// How many placement candidates a create tries.
const CANDIDATES: usize = 3;

fn internal(e: StoreError) -> Fault {
    Fault::new(FaultCode::Internal, format!("state store: {e}"))
}

fn one_node(call: &str) -> Fault {
    Fault::new(
        FaultCode::Invalid,
        format!("{call} is a call to one node, not to the cluster"),
    )
}

fn not_found(id: &SandboxId) -> Fault {
    let mut f = Fault::new(FaultCode::NotFound, format!("no sandbox {id}"));
    f.sandbox = Some(id.clone());
    f
}

/// The cluster's node API.
#[derive(Debug, Clone)]
pub struct ClusterNodes {
    cluster: Arc<Cluster>,
}

impl ClusterNodes {
    /// The node API of the nodes `cluster` knows.
    pub fn new(cluster: Arc<Cluster>) -> ClusterNodes {
        ClusterNodes { cluster }
    }

    pub(super) fn cluster(&self) -> &Arc<Cluster> {
        &self.cluster
    }

    pub(super) fn client_of(&self, row: &NodeRow) -> NodeResult<Arc<RemoteNode>> {
        self.client(row)
    }

    fn client(&self, row: &NodeRow) -> NodeResult<Arc<RemoteNode>> {
        self.cluster
            .client(row)
            .map_err(|e| Fault::new(FaultCode::Internal, e.to_string()))
    }

    /// The client of the node that owns `id`. A sandbox of a lost or removed node is moved
    /// to a live one first (it wakes anywhere), from its newest archived snapshot.
    async fn owner(&self, id: &SandboxId) -> NodeResult<Arc<RemoteNode>> {
        match self.owner_once(id).await {
            Err(f) if is_being_moved(&f) => {
                // Another replica is moving it: its new node answers once the move lands.
                let store = self.cluster.store();
                let before = store.sandbox_node(id.as_str()).await.map_err(internal)?;
                let until = tokio::time::Instant::now() + MOVE_CLAIM;
                while tokio::time::Instant::now() < until {
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                    let now = store.sandbox_node(id.as_str()).await.map_err(internal)?;
                    if now != before {
                        return self.owner_once(id).await;
                    }
                }
                Err(f)
            }
            other => other,
        }
    }

    async fn owner_once(&self, id: &SandboxId) -> NodeResult<Arc<RemoteNode>> {
        let store = self.cluster.store();
        let (node, epoch) = store
            .sandbox_node(id.as_str())
            .await
            .map_err(internal)?
            .ok_or_else(|| not_found(id))?;
        let row = store
            .node(&node)
            .await
            .map_err(internal)?
            .ok_or_else(|| not_found(id))?;
        if matches!(row.state, NodeState::Lost | NodeState::Removed)
            && self.cluster.archive().is_some()
        {
            let last = report_of(&row).sandboxes.into_iter().find(|u| &u.id == id);
            let memory = last.as_ref().map_or(0, |u| u.memory_mib);
            // One that ran there runs again (the failover pass would have restored it).
            let run = last.as_ref().is_some_and(|u| {
                matches!(
                    u.state,
                    space_node_api::State::Running | space_node_api::State::Paused
                )
            });
            let why = if run { Why::Failover } else { Why::Wake };
            let moved = relocate(&self.cluster, id, &row, epoch, memory, run, why)
                .await
                .map_err(|mut f| {
                    if f.code == FaultCode::NotFound {
                        f = Fault::new(
                            FaultCode::Unavailable,
                            format!(
                                "sandbox {id} is on node {}, which is {}, and the object store \
                                 has no snapshot of it to bring it back elsewhere",
                                row.id,
                                row.state.as_str()
                            ),
                        );
                    }
                    f
                })?;
            return self.client(&moved.node);
        }
        if !row.live || !matches!(row.state, NodeState::Active | NodeState::Draining) {
            return Err(Fault::new(
                FaultCode::Unavailable,
                format!(
                    "sandbox {id} is on node {node}, which is {} (its lease {})",
                    row.state.as_str(),
                    if row.live { "runs" } else { "ran out" }
                ),
            ));
        }
        self.client(&row)
    }

    /// Every live node and its client; a node whose client cannot be made is skipped.
    async fn live(&self) -> NodeResult<Vec<(NodeRow, Arc<RemoteNode>)>> {
        let rows = self.cluster.live_nodes().await.map_err(internal)?;
        Ok(rows
            .into_iter()
            .filter_map(|r| match self.cluster.client(&r) {
                Ok(c) => Some((r, c)),
                Err(e) => {
                    tracing::warn!(node = %r.id, error = %e, "no client for a node");
                    None
                }
            })
            .collect())
    }

    async fn any_live(&self) -> NodeResult<Arc<RemoteNode>> {
        self.live()
            .await?
            .into_iter()
            .next()
            .map(|(_, c)| c)
            .ok_or_else(|| Fault::new(FaultCode::Unavailable, "no node of the cluster is live"))
    }

    /// Records that `id` belongs to `tenant` and lives on `node` (epoch 1).
    async fn record(&self, id: &SandboxId, tenant: &str, node: &str) -> NodeResult<()> {
        let store = self.cluster.store();
        let tenant: TenantName = tenant
            .parse()
            .map_err(|e: StoreError| Fault::new(FaultCode::Invalid, e.to_string()))?;
        store
            .add_sandbox(id.as_str(), &tenant)
            .await
            .map_err(internal)?;
        match store.move_sandbox(id.as_str(), None, node).await {
            Ok(Some(_)) => Ok(()),
            Ok(None) => Err(Fault::new(
                FaultCode::Internal,
                format!("sandbox {id} was placed twice"),
            )),
            Err(e) => Err(internal(e)),
        }
    }

    /// The nodes a create of `template` needing `memory_mib` may go to, best first.
    fn candidates(
        rows: Vec<NodeRow>,
        reserved: &std::collections::HashMap<String, u64>,
        template: &TemplateName,
        version: &VersionReq,
    ) -> Vec<NodeRow> {
        let mut fit: Vec<(bool, u64, NodeRow)> = rows
            .into_iter()
            .filter(|r| r.state == NodeState::Active)
            .filter_map(|r| {
                let report = report_of(&r);
                let has = report.templates.iter().any(|t| {
                    &t.template.name == template
                        && match version {
                            VersionReq::Latest => true,
                            VersionReq::Exact(v) => &t.template.version == v,
                        }
                });
                if !has {
                    return None;
                }
                let warm = report
                    .pools
                    .iter()
                    .any(|p| &p.template.name == template && p.ready > 0);
                let held = reserved.get(&r.id).copied().unwrap_or(0);
                Some((warm, report.memory_free_mib.saturating_sub(held), r))
            })
            .collect();
        fit.sort_by_key(|c| std::cmp::Reverse((c.0, c.1)));
        fit.into_iter()
            .take(CANDIDATES)
            .map(|(_, _, r)| r)
            .collect()
    }

    /// `rows` with each node's report holding `template` if the node itself says it has
    /// it now (its report may be a heartbeat old).
    async fn with_template(
        &self,
        rows: Vec<NodeRow>,
        template: &TemplateName,
        version: &VersionReq,
    ) -> Vec<NodeRow> {
        let asked = rows.into_iter().map(|mut row| async move {
            let Ok(c) = self.client(&row) else {
                return row;
            };
            if let Ok(info) = c.template(template, version).await {
                let mut report = report_of(&row);
                report.templates.push(info);
                if let Ok(v) = serde_json::to_value(&report) {
                    row.report = v;
                }
            }
            row
        });
        futures::future::join_all(asked).await
    }
}

/// `sb` as node `node` answered it: the node's id goes into the answer.
fn held_by(node: &RemoteNode, mut sb: Sandbox) -> Sandbox {
    sb.node = Some(node.node_id().to_owned());
    sb
}

#[async_trait]
impl NodeApi for ClusterNodes {
    async fn status(&self) -> NodeResult<NodeStatus> {
        self.any_live().await?.status().await
    }

    async fn create(&self, req: CreateRequest) -> NodeResult<Sandbox> {
        if let Some(a) = self.cluster.archive() {
            a.ensure_tenant_key(self.cluster.store(), self.cluster.holder(), &req.tenant)
                .await
                .map_err(|e| Fault::new(FaultCode::Key, format!("{e:#}")))?;
        }
        let mut rows = self.cluster.live_nodes().await.map_err(internal)?;
        let live = rows.len();
        let reserved = self.cluster.store().reserved().await.map_err(internal)?;
        // A sandbox that mounts volumes goes where they are.
        let home = self.mounts_home(&req.options.volumes).await?;
        if let Some(h) = &home {
            rows.retain(|r| &r.id == h);
        }
        let mut candidates = Self::candidates(rows.clone(), &reserved, &req.template, &req.version);
        if candidates.is_empty() {
            // Reports come with heartbeats: a template a node built or fetched since its last
            // one is not in it yet (a create right after a build). Ask the nodes.
            rows = self.with_template(rows, &req.template, &req.version).await;
            candidates = Self::candidates(rows.clone(), &reserved, &req.template, &req.version);
        }
        let memory = match req.options.memory_mib {
            Some(m) => m,
            None => rows
                .iter()
                .flat_map(|r| report_of(r).templates)
                .find(|t| t.template.name == req.template)
                .map_or(0, |t| t.memory_mib),
        };
        if candidates.is_empty() {
            return Err(Fault::new(
                FaultCode::Capacity,
                format!(
                    "no live node has template {}:{} ({live} node(s) live)",
                    req.template, req.version
                ),
            ));
        }
        let store = self.cluster.store();
        let mut last: Option<Fault> = None;
        for row in candidates {
            let ttl = u64::try_from(RESERVATION.as_millis()).unwrap_or(u64::MAX);
            let Some(reservation) = store
                .reserve(&row.id, memory, ttl)
                .await
                .map_err(internal)?
            else {
                continue;
            };
            let client = self.client(&row)?;
            match client.create(req.clone()).await {
                Ok(sb) => {
                    if let Err(f) = self.record(&sb.id, &req.tenant, &row.id).await {
                        tracing::error!(id = %sb.id, node = %row.id, error = %f, "recording a placed sandbox; killing it");
                        let _ = client.kill(&sb.id).await;
                        return Err(f);
                    }
                    tracing::info!(id = %sb.id, node = %row.id, "placed");
                    return Ok(held_by(&client, sb));
                }
                Err(f) => {
                    let _ = store.release(&reservation).await;
                    if matches!(f.code, FaultCode::Capacity | FaultCode::Unavailable) {
                        tracing::warn!(node = %row.id, error = %f, "placement: trying the next node");
                        last = Some(f);
                        continue;
                    }
                    return Err(f);
                }
            }
        }
        Err(last.unwrap_or_else(|| {
            Fault::new(
                FaultCode::Capacity,
                format!("no live node has {memory} MiB free for this sandbox ({live} live)"),
            )
        }))
    }

    async fn fork(&self, id: &SandboxId) -> NodeResult<Sandbox> {
        let store = self.cluster.store();
        let (node, _) = store
            .sandbox_node(id.as_str())
            .await
            .map_err(internal)?
            .ok_or_else(|| not_found(id))?;
        let owner = self.owner(id).await?;
        let child = held_by(&owner, owner.fork(id).await?);
        let tenant = store
            .sandbox_tenant(id.as_str())
            .await
            .map_err(internal)?
            .ok_or_else(|| not_found(id))?;
        self.record(&child.id, tenant.as_str(), &node).await?;
        Ok(child)
    }

    async fn info(&self, id: &SandboxId) -> NodeResult<Sandbox> {
        let owner = self.owner(id).await?;
        Ok(held_by(&owner, owner.info(id).await?))
    }

    async fn list(&self) -> NodeResult<Vec<Sandbox>> {
        let mut all = Vec::new();
        for (row, c) in self.live().await? {
            match c.list().await {
                Ok(l) => all.extend(l.into_iter().map(|sb| held_by(&c, sb))),
                Err(f) => tracing::warn!(node = %row.id, error = %f, "listing a node"),
            }
        }
        Ok(all)
    }

    async fn usage(&self) -> NodeResult<Vec<Usage>> {
        let mut all = Vec::new();
        for (row, c) in self.live().await? {
            match c.usage().await {
                Ok(u) => all.extend(u),
                // Quotas count what can be seen; a node that cannot be asked is counted from
                // its last report.
                Err(f) => {
                    tracing::warn!(node = %row.id, error = %f, "usage of a node from its report");
                    all.extend(report_of(&row).sandboxes);
                }
            }
        }
        Ok(all)
    }

    async fn pause(&self, id: &SandboxId) -> NodeResult<()> {
        self.owner(id).await?.pause(id).await
    }

    async fn resume(&self, id: &SandboxId) -> NodeResult<()> {
        self.owner(id).await?.resume(id).await
    }

    async fn suspend(&self, id: &SandboxId) -> NodeResult<Snapshot> {
        self.owner(id).await?.suspend(id).await
    }

    async fn restore(&self, id: &SandboxId) -> NodeResult<()> {
        self.owner(id).await?.restore(id).await
    }

    async fn kill(&self, id: &SandboxId) -> NodeResult<()> {
        self.owner(id).await?.kill(id).await
    }

    async fn touch(&self, id: &SandboxId) -> NodeResult<()> {
        self.owner(id).await?.touch(id).await
    }

    async fn snapshot(&self, id: &SandboxId, kind: SnapshotKind) -> NodeResult<Snapshot> {
        self.owner(id).await?.snapshot(id, kind).await
    }

    async fn rollback(&self, id: &SandboxId, snapshot: &SnapshotId) -> NodeResult<()> {
        self.owner(id).await?.rollback(id, snapshot).await
    }

    async fn set_timeouts(&self, id: &SandboxId, timeouts: TimeoutPolicy) -> NodeResult<Sandbox> {
        let owner = self.owner(id).await?;
        Ok(held_by(&owner, owner.set_timeouts(id, timeouts).await?))
    }

    async fn set_egress(&self, id: &SandboxId, policy: EgressPolicy) -> NodeResult<Sandbox> {
        let owner = self.owner(id).await?;
        Ok(held_by(&owner, owner.set_egress(id, policy).await?))
    }

    async fn metrics(
        &self,
        id: &SandboxId,
        start_ms: u64,
        end_ms: u64,
    ) -> NodeResult<Vec<space_node_api::MetricSample>> {
        self.owner(id).await?.metrics(id, start_ms, end_ms).await
    }

    async fn create_volume(
        &self,
        volume: &str,
        tenant: &str,
        size_bytes: u64,
    ) -> NodeResult<space_node_api::VolumeInfo> {
        self.place_volume(volume)
            .await?
            .create_volume(volume, tenant, size_bytes)
            .await
    }

    async fn restore_volume(
        &self,
        volume: &str,
        tenant: &str,
        size_bytes: u64,
        epoch: u64,
    ) -> NodeResult<space_node_api::VolumeInfo> {
        self.place_volume(volume)
            .await?
            .restore_volume(volume, tenant, size_bytes, epoch)
            .await
    }

    async fn sync_volume(&self, volume: &str) -> NodeResult<space_node_api::VolumeInfo> {
        self.volume_client(volume).await?.sync_volume(volume).await
    }

    async fn volume_info(&self, volume: &str) -> NodeResult<space_node_api::VolumeInfo> {
        self.volume_client(volume).await?.volume_info(volume).await
    }

    async fn delete_volume(&self, volume: &str) -> NodeResult<()> {
        match self.volume_home(volume).await? {
            Some(node) => self.client_of(&node)?.delete_volume(volume).await,
            None => Ok(()),
        }
    }

    async fn volume_call(
        &self,
        volume: &str,
        request: space_proto::volume::VolumeRequest,
        data: Blob,
    ) -> NodeResult<space_node_api::VolumeAnswer> {
        self.volume_client(volume)
            .await?
            .volume_call(volume, request, data)
            .await
    }

    async fn volumes(&self) -> NodeResult<Vec<space_node_api::VolumeInfo>> {
        let mut all = Vec::new();
        for (_, client) in self.live().await? {
            all.extend(client.volumes().await?);
        }
        Ok(all)
    }

    async fn console_tail(&self, id: &SandboxId, max_bytes: usize) -> NodeResult<Blob> {
        self.owner(id).await?.console_tail(id, max_bytes).await
    }

    async fn wake(&self, id: &SandboxId) -> NodeResult<Option<Woke>> {
        self.owner(id).await?.wake(id).await
    }

    // The calls below are a replica's to one node (configuring it, moving sandboxes to and
    // from it, sharing template builds through the object store, sending secret values):
    // the cluster as a whole refuses them.

    async fn configure(&self, _settings: NodeSettings) -> NodeResult<()> {
        Err(one_node("configure"))
    }

    async fn adopt(&self, _id: &SandboxId, _tenant: &str, _epoch: u64) -> NodeResult<Sandbox> {
        Err(one_node("adopt"))
    }

    async fn discard(&self, _id: &SandboxId) -> NodeResult<()> {
        Err(one_node("discard"))
    }

    async fn publish_template(&self, _template: &TemplateRef) -> NodeResult<()> {
        Err(one_node("publish_template"))
    }

    async fn fetch_template(&self, _template: &TemplateRef) -> NodeResult<TemplateInfo> {
        Err(one_node("fetch_template"))
    }

    async fn set_secrets(&self, _id: &SandboxId, _values: SecretMap) -> NodeResult<()> {
        Err(one_node("set_secrets"))
    }

    async fn guest(&self, id: &SandboxId) -> NodeResult<(GuestClient, Option<Woke>)> {
        self.owner(id).await?.guest(id).await
    }

    async fn templates(&self) -> NodeResult<Vec<TemplateInfo>> {
        let mut all: Vec<TemplateInfo> = Vec::new();
        for (row, _) in self.live().await? {
            for t in report_of(&row).templates {
                if !all.iter().any(|a| a.template == t.template) {
                    all.push(t);
                }
            }
        }
        all.sort_by_key(|a| a.template.to_string());
        Ok(all)
    }

    async fn template(
        &self,
        name: &TemplateName,
        version: &VersionReq,
    ) -> NodeResult<TemplateInfo> {
        let mut last = None;
        for (_, c) in self.live().await? {
            match c.template(name, version).await {
                Ok(t) => return Ok(t),
                Err(f) => last = Some(f),
            }
        }
        Err(last.unwrap_or_else(|| {
            Fault::new(
                FaultCode::TemplateNotFound,
                format!("no template {name}:{version} (no node is live)"),
            )
        }))
    }

    async fn images(&self) -> NodeResult<Vec<String>> {
        let mut all: Vec<String> = Vec::new();
        for (_, c) in self.live().await? {
            for i in c.images().await.unwrap_or_default() {
                if !all.contains(&i) {
                    all.push(i);
                }
            }
        }
        all.sort();
        Ok(all)
    }

    async fn build_template(&self, build: TemplateBuild) -> NodeResult<TemplateInfo> {
        let active: Vec<_> = self
            .live()
            .await?
            .into_iter()
            .filter(|(row, _)| row.state == NodeState::Active)
            .collect();
        let Some(((builder, c), rest)) = active.split_first() else {
            return Err(Fault::new(
                FaultCode::Unavailable,
                "no node of the cluster is live",
            ));
        };
        if self.cluster.archive().is_none() {
            // Nothing to share builds through: every active node builds its own (its
            // sandboxes cannot move anyway).
            let t = c.build_template(build.clone()).await?;
            for (row, c) in rest {
                if let Err(f) = c.build_template(build.clone()).await {
                    tracing::warn!(node = %row.id, error = %f, "building a template");
                }
            }
            return Ok(t);
        }
        // Built once, published, fetched by the others: one build for the whole cluster,
        // so a snapshot made on one node has the same base on every other.
        let t = c.build_template(build.clone()).await?;
        c.publish_template(&build.template).await?;
        tracing::info!(template = %build.template, node = %builder.id, "template built and published");
        for (row, c) in rest {
            if let Err(f) = c.fetch_template(&build.template).await {
                // A restore of a sandbox made from it fetches it there.
                tracing::warn!(node = %row.id, error = %f, "fetching a published template");
            }
        }
        Ok(t)
    }

    async fn build_log(&self, build: &str, from: u64) -> NodeResult<space_node_api::LogChunk> {
        // The node that runs (or ran) the build has its log; the others do not know it.
        let mut last = None;
        for (_, c) in self.live().await? {
            match c.build_log(build, from).await {
                Ok(chunk) => return Ok(chunk),
                Err(f) => last = Some(f),
            }
        }
        Err(last.unwrap_or_else(|| Fault::new(FaultCode::NotFound, format!("no build {build}"))))
    }

    async fn save_template(
        &self,
        id: &SandboxId,
        template: &TemplateRef,
        memory: bool,
    ) -> NodeResult<TemplateInfo> {
        let c = self.owner(id).await?;
        let t = c.save_template(id, template, memory).await?;
        if self.cluster.archive().is_some() {
            c.publish_template(template).await?;
            for (_, other) in self.live().await? {
                let _ = other.fetch_template(template).await;
            }
        }
        Ok(t)
    }

    async fn delete_template(&self, template: &TemplateRef) -> NodeResult<()> {
        let mut deleted = false;
        let mut refusal = None;
        for (_, c) in self.live().await? {
            match c.delete_template(template).await {
                Ok(()) => deleted = true,
                Err(f) if f.code == FaultCode::TemplateNotFound => {}
                Err(f) => refusal = Some(f),
            }
        }
        match (refusal, deleted) {
            (Some(f), _) => Err(f),
            (None, true) => Ok(()),
            (None, false) => Err(Fault::new(
                FaultCode::TemplateNotFound,
                format!("no template {template}"),
            )),
        }
    }

    async fn pools(&self) -> NodeResult<Vec<Pool>> {
        Ok(self
            .live()
            .await?
            .into_iter()
            .flat_map(|(row, _)| report_of(&row).pools)
            .collect())
    }

    async fn forget_secret(&self, name: &str) -> NodeResult<()> {
        for (row, c) in self.live().await? {
            if let Err(f) = c.forget_secret(name).await {
                tracing::warn!(node = %row.id, error = %f, "telling a node a secret changed");
            }
        }
        Ok(())
    }

    async fn ca_pem(&self) -> NodeResult<String> {
        self.any_live().await?.ca_pem().await
    }
}
