//! The node API as this node serves it: [`LocalNode`], the in-process implementation of
//! [`NodeApi`] (what `space up` uses; a call is a function call), which a `space node` also
//! serves over mutual TLS. The contract itself (the calls, their types, the network client
//! and server) is `space-node-api`, re-exported here.
//!
//! Calls take and return the API's own types, never the node's records, and fail with a
//! [`Fault`] that keeps the difference between a refusal (the node understood and declined;
//! nothing changed) and a failure. Guest traffic (exec, PTY, files, watch, TCP to a port) goes
//! through [`NodeApi::guest`]: a client of the guest protocol whose requests the node serves on
//! the sandbox's behalf, waking it first when it sleeps.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use space_gateway::EgressPolicy;
use space_proto::GuestClient;

use crate::build::{BuildLog, BuildPlan, LogChunk};
use crate::ids::{SandboxId, SnapshotId, TemplateName, TemplateRef, VersionReq};
use crate::node::Node;
use crate::record::{SnapshotKind, TimeoutPolicy};
use crate::sandbox::CreateRequest;
use crate::template::Template;

mod convert;

pub use crate::settings::{NodeSettings, SecretMap};
pub use space_node_api::calls::{self as rpc, NodeResult};
pub use space_node_api::{remote, serve, tls, wire};
pub use space_node_api::{
    Blob, Call, ClusterCa, Fault, FaultCode, Gate, Gated, Identity, Leaf, NodeApi, NodeKey,
    NodeReport, NodeServer, NodeStatus, Pool, RemoteNode, Sandbox, Snapshot, TemplateBuild,
    TemplateInfo, TlsError, Usage, Woke,
};

fn not_here(call: &str) -> Fault {
    Fault::new(
        FaultCode::Invalid,
        format!("{call} is a call to a node of a cluster, not to this one"),
    )
}

/// The node in this process.
#[derive(Clone)]
pub struct LocalNode {
    node: Node,
    kernel: PathBuf,
    images: BTreeMap<String, PathBuf>,
    guestd: Option<PathBuf>,
    builds: std::sync::Arc<std::sync::Mutex<BuildLogs>>,
    settings: std::sync::Arc<crate::settings::Applied>,
    secrets: Option<std::sync::Arc<crate::settings::SecretValues>>,
}

impl std::fmt::Debug for LocalNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalNode").finish_non_exhaustive()
    }
}

impl LocalNode {
    /// The API of `node`, which builds templates with `kernel` from `images` (name → root
    /// image file).
    pub fn new(node: Node, kernel: PathBuf, images: BTreeMap<String, PathBuf>) -> LocalNode {
        LocalNode {
            node,
            kernel,
            images,
            guestd: None,
            builds: Default::default(),
            settings: Default::default(),
            secrets: None,
        }
    }

    /// Puts `guestd` into the root images it makes of OCI images and Dockerfiles.
    pub fn with_guestd(mut self, guestd: Option<PathBuf>) -> Self {
        self.guestd = guestd;
        self
    }

    /// Keeps secret values sent by the control plane in `secrets`, which must be the node's
    /// gateway's secret source (a node of a cluster).
    pub fn with_secrets(mut self, secrets: std::sync::Arc<crate::settings::SecretValues>) -> Self {
        self.secrets = Some(secrets);
        self
    }

    /// The settings the control plane sent, as applied.
    pub fn settings(&self) -> &crate::settings::Applied {
        &self.settings
    }

    /// The node itself.
    pub fn node(&self) -> &Node {
        &self.node
    }

    /// What a heartbeat carries: capacity, templates, pools and the sandboxes held.
    pub async fn report(&self) -> NodeResult<NodeReport> {
        let status = self.status().await?;
        let (total, free) = self.node.memory().map_err(fault)?;
        Ok(NodeReport {
            accelerator: status.accelerator,
            qemu: status.qemu,
            memory_total_mib: total,
            memory_free_mib: free,
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get() as u32),
            templates: self.templates().await?,
            pools: self.pools().await?,
            sandboxes: self.usage().await?,
            settings: self.settings.digest(),
            key_events: self.settings.key_events(MAX_REPORTED_KEY_EVENTS),
            secrets_wanted: match &self.secrets {
                Some(values) => self
                    .node
                    .secret_bindings()
                    .into_iter()
                    .filter(|(id, _)| !values.has(id))
                    .take(MAX_REPORTED_SECRETS_WANTED)
                    .map(|(id, names)| crate::settings::SecretsWanted { id, names })
                    .collect(),
                None => Vec::new(),
            },
        })
    }

    fn info(&self, t: &Template) -> TemplateInfo {
        let m = &t.manifest;
        let path = &m.rootfs.path;
        let image = self
            .images
            .iter()
            .find(|(_, p)| *p == path)
            .map(|(n, _)| n.clone())
            .unwrap_or_else(|| {
                path.file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default()
            });
        TemplateInfo {
            template: m.template.clone(),
            vcpus: m.vcpus,
            memory_mib: m.memory_mib,
            disk_bytes: m.disk_bytes,
            image,
            created_unix_ms: m.created_unix_ms,
            accelerator: m.accel.as_str().to_owned(),
            qemu: m.qemu.to_string(),
            source: m.source.clone(),
            guest: m.guest.clone(),
            start: m.start.clone(),
        }
    }
}

/// Finished build logs kept for readers.
const KEPT_BUILD_LOGS: usize = 64;

/// The logs of the builds a node ran or runs, newest last.
#[derive(Default)]
struct BuildLogs {
    logs: Vec<(String, std::sync::Arc<BuildLog>)>,
}

impl BuildLogs {
    fn start(&mut self, id: &str) -> std::sync::Arc<BuildLog> {
        self.logs.retain(|(i, _)| i != id);
        let log = std::sync::Arc::new(BuildLog::default());
        self.logs.push((id.to_owned(), log.clone()));
        if self.logs.len() > KEPT_BUILD_LOGS {
            self.logs.remove(0);
        }
        log
    }

    fn get(&self, id: &str) -> Option<std::sync::Arc<BuildLog>> {
        self.logs
            .iter()
            .find(|(i, _)| i == id)
            .map(|(_, l)| l.clone())
    }
}

/// How long a read of a build log waits for more when there is nothing new.
const BUILD_LOG_WAIT: Duration = Duration::from_secs(5);

/// Key events one heartbeat carries at most.
const MAX_REPORTED_KEY_EVENTS: usize = 500;
/// Sandboxes lacking secret values one heartbeat names at most.
const MAX_REPORTED_SECRETS_WANTED: usize = 100;

fn fault(e: crate::error::NodeError) -> Fault {
    Fault::from(e)
}

#[async_trait]
impl NodeApi for LocalNode {
    async fn status(&self) -> NodeResult<NodeStatus> {
        let rt = self.node.runtime();
        Ok(NodeStatus {
            accelerator: rt.accel().as_str().to_owned(),
            qemu: rt.version().to_string(),
        })
    }

    async fn create(&self, req: CreateRequest) -> NodeResult<Sandbox> {
        self.node
            .create(req)
            .await
            .map(Sandbox::from)
            .map_err(fault)
    }

    async fn fork(&self, id: &SandboxId) -> NodeResult<Sandbox> {
        self.node.fork(id).await.map(Sandbox::from).map_err(fault)
    }

    async fn info(&self, id: &SandboxId) -> NodeResult<Sandbox> {
        self.node.info(id).await.map(Sandbox::from).map_err(fault)
    }

    async fn list(&self) -> NodeResult<Vec<Sandbox>> {
        let all = self.node.list().await.map_err(fault)?;
        Ok(all.iter().map(Sandbox::from).collect())
    }

    async fn usage(&self) -> NodeResult<Vec<Usage>> {
        Ok(self.node.usage().into_iter().map(Usage::from).collect())
    }

    async fn pause(&self, id: &SandboxId) -> NodeResult<()> {
        self.node.pause(id).await.map_err(fault)
    }

    async fn resume(&self, id: &SandboxId) -> NodeResult<()> {
        self.node.resume(id).await.map_err(fault)
    }

    async fn suspend(&self, id: &SandboxId) -> NodeResult<Snapshot> {
        self.node
            .suspend(id)
            .await
            .map(Snapshot::from)
            .map_err(fault)
    }

    async fn restore(&self, id: &SandboxId) -> NodeResult<()> {
        self.node.restore(id).await.map_err(fault)
    }

    async fn kill(&self, id: &SandboxId) -> NodeResult<()> {
        if let Some(s) = &self.secrets {
            s.forget(id);
        }
        self.node.kill(id).await.map_err(fault)
    }

    async fn touch(&self, id: &SandboxId) -> NodeResult<()> {
        self.node.touch(id).await.map_err(fault)
    }

    async fn snapshot(&self, id: &SandboxId, kind: SnapshotKind) -> NodeResult<Snapshot> {
        self.node
            .snapshot(id, kind)
            .await
            .map(Snapshot::from)
            .map_err(fault)
    }

    async fn rollback(&self, id: &SandboxId, snapshot: &SnapshotId) -> NodeResult<()> {
        self.node.rollback(id, snapshot).await.map_err(fault)
    }

    async fn set_timeouts(&self, id: &SandboxId, timeouts: TimeoutPolicy) -> NodeResult<Sandbox> {
        self.node
            .set_timeouts(id, timeouts)
            .await
            .map(Sandbox::from)
            .map_err(fault)
    }

    async fn set_egress(&self, id: &SandboxId, policy: EgressPolicy) -> NodeResult<Sandbox> {
        self.node
            .set_egress(id, policy)
            .await
            .map(Sandbox::from)
            .map_err(fault)
    }

    async fn metrics(
        &self,
        id: &SandboxId,
        start_ms: u64,
        end_ms: u64,
    ) -> NodeResult<Vec<space_node_api::MetricSample>> {
        self.node.metrics(id, start_ms, end_ms).await.map_err(fault)
    }

    async fn create_volume(
        &self,
        volume: &str,
        tenant: &str,
        size_bytes: u64,
    ) -> NodeResult<space_node_api::VolumeInfo> {
        self.node
            .create_volume(volume, tenant, size_bytes)
            .await
            .map_err(fault)
    }

    async fn restore_volume(
        &self,
        volume: &str,
        tenant: &str,
        size_bytes: u64,
        epoch: u64,
    ) -> NodeResult<space_node_api::VolumeInfo> {
        self.node
            .restore_volume(volume, tenant, size_bytes, epoch)
            .await
            .map_err(fault)
    }

    async fn sync_volume(&self, volume: &str) -> NodeResult<space_node_api::VolumeInfo> {
        self.node.sync_volume(volume).await.map_err(fault)
    }

    async fn volume_info(&self, volume: &str) -> NodeResult<space_node_api::VolumeInfo> {
        self.node.volume_info(volume).await.map_err(fault)
    }

    async fn delete_volume(&self, volume: &str) -> NodeResult<()> {
        self.node.delete_volume(volume).await.map_err(fault)
    }

    async fn volume_call(
        &self,
        volume: &str,
        request: space_proto::volume::VolumeRequest,
        data: Blob,
    ) -> NodeResult<space_node_api::VolumeAnswer> {
        self.node
            .volume_call(volume, request, data.0)
            .await
            .map_err(fault)
    }

    async fn volumes(&self) -> NodeResult<Vec<space_node_api::VolumeInfo>> {
        self.node.volumes().await.map_err(fault)
    }

    async fn console_tail(&self, id: &SandboxId, max_bytes: usize) -> NodeResult<Blob> {
        self.node
            .console_tail(id, max_bytes)
            .await
            .map(Blob)
            .map_err(fault)
    }

    async fn wake(&self, id: &SandboxId) -> NodeResult<Option<Woke>> {
        let (_client, woke) = self.node.guest_waking(id).await.map_err(fault)?;
        Ok(woke.map(Woke::from))
    }

    async fn guest(&self, id: &SandboxId) -> NodeResult<(GuestClient, Option<Woke>)> {
        let (client, woke) = self.node.guest_waking(id).await.map_err(fault)?;
        Ok((client, woke.map(Woke::from)))
    }

    async fn templates(&self) -> NodeResult<Vec<TemplateInfo>> {
        let all = self.node.templates().map_err(fault)?;
        Ok(all.iter().map(|t| self.info(t)).collect())
    }

    async fn template(
        &self,
        name: &TemplateName,
        version: &VersionReq,
    ) -> NodeResult<TemplateInfo> {
        self.node
            .template(name, version)
            .map(|t| self.info(&t))
            .map_err(fault)
    }

    async fn images(&self) -> NodeResult<Vec<String>> {
        Ok(self.images.keys().cloned().collect())
    }

    async fn build_template(&self, build: TemplateBuild) -> NodeResult<TemplateInfo> {
        let log = match &build.build_id {
            Some(id) => self
                .builds
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .start(id),
            None => Default::default(),
        };
        log.line(format!(
            "building {} from {}",
            build.template,
            build.source.describe()
        ));
        let plan = BuildPlan {
            template: build.template,
            source: build.source,
            kernel: self.kernel.clone(),
            guestd: self.guestd.clone(),
            stock: self.images.clone(),
            vcpus: build.vcpus,
            memory_mib: build.memory_mib,
            disk_mib: build.disk_mib,
            start: build.start,
            ready_timeout: Duration::from_millis(build.ready_timeout_ms),
            egress: build.egress.unwrap_or_default(),
        };
        let built = self.node.build(plan, &log).await;
        if let Err(e) = &built {
            log.line(format!("error: {e}"));
        }
        log.finish();
        built.map(|t| self.info(&t)).map_err(fault)
    }

    async fn build_log(&self, build: &str, from: u64) -> NodeResult<LogChunk> {
        let log = self
            .builds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(build)
            .ok_or_else(|| {
                Fault::new(
                    FaultCode::NotFound,
                    format!("no build {build:?} on this node"),
                )
            })?;
        log.wait(from, BUILD_LOG_WAIT).await;
        Ok(log.read(from))
    }

    async fn save_template(
        &self,
        id: &SandboxId,
        template: &TemplateRef,
        memory: bool,
    ) -> NodeResult<TemplateInfo> {
        self.node
            .save_template(id, template, memory)
            .await
            .map(|t| self.info(&t))
            .map_err(fault)
    }

    async fn delete_template(&self, template: &TemplateRef) -> NodeResult<()> {
        self.node.delete_template(template).await.map_err(fault)
    }

    async fn pools(&self) -> NodeResult<Vec<Pool>> {
        Ok(self.node.pool_stats().into_iter().map(Pool::from).collect())
    }

    async fn ca_pem(&self) -> NodeResult<String> {
        Ok(self.node.ca_pem())
    }

    async fn configure(&self, settings: NodeSettings) -> NodeResult<()> {
        if self.settings.digest().as_deref() == Some(settings.digest().as_str()) {
            return Ok(());
        }
        let attach = self
            .settings
            .apply(&settings)
            .map_err(|e| Fault::new(FaultCode::Invalid, e))?;
        if let Some(cfg) = attach {
            tracing::info!(store = %cfg.archive.name(), "object store from the control plane");
            self.node.attach_archive(cfg, false).await.map_err(fault)?;
        }
        Ok(())
    }

    async fn adopt(&self, id: &SandboxId, tenant: &str, epoch: u64) -> NodeResult<Sandbox> {
        Ok(Sandbox::from(
            self.node.adopt(id, tenant, epoch).await.map_err(fault)?,
        ))
    }

    async fn discard(&self, id: &SandboxId) -> NodeResult<()> {
        if let Some(s) = &self.secrets {
            s.forget(id);
        }
        self.node.discard(id).await.map_err(fault)
    }

    async fn set_secrets(&self, id: &SandboxId, values: SecretMap) -> NodeResult<()> {
        let Some(store) = &self.secrets else {
            return Err(not_here("set_secrets"));
        };
        let mut decoded = BTreeMap::new();
        for (name, v) in values.0 {
            let secret = space_node_api::secrets::StoredSecret::from_wire(&v).ok_or_else(|| {
                space_node_api::wire::Fault::new(
                    space_node_api::wire::FaultCode::Invalid,
                    format!("the value of secret {name} is not in its wire form"),
                )
            })?;
            decoded.insert(name, secret);
        }
        // Only for a sandbox this node holds.
        self.node.info(id).await.map_err(fault)?;
        store.set(id, decoded);
        Ok(())
    }

    async fn forget_secret(&self, name: &str) -> NodeResult<()> {
        if let Some(s) = &self.secrets {
            s.forget_name(name);
        }
        Ok(())
    }

    async fn publish_template(&self, template: &TemplateRef) -> NodeResult<()> {
        self.node.publish_template(template).await.map_err(fault)
    }

    async fn fetch_template(&self, template: &TemplateRef) -> NodeResult<TemplateInfo> {
        match self.node.fetch_template(template).await.map_err(fault)? {
            Some(t) => Ok(self.info(&t)),
            None => Err(Fault::new(
                FaultCode::TemplateNotFound,
                format!("template {template} is not published in the object store"),
            )),
        }
    }
}
