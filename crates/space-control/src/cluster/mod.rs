//! The control plane's side of a cluster: the cluster CA, the clients of the nodes, and
//! [`ClusterNodes`], the [`NodeApi`] a replica serves the public API through, which sends
//! each call to the node that owns the sandbox and places new sandboxes (`docs/cluster.md`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use space_node_api::NodeApi as _;
use space_node_api::{ClusterCa, Identity, NodeReport, RemoteNode, TlsError};

use crate::store::{NodeRow, NodeState, Store, StoreError};
use crate::vault::Vault;

mod archive;
pub mod moves;
mod nodes;
mod volumes;

pub use archive::ClusterArchive;
pub use nodes::ClusterNodes;

/// How long a node's lease runs after a heartbeat.
pub const LEASE: Duration = Duration::from_secs(10);
/// How often a node heartbeats.
pub const HEARTBEAT: Duration = Duration::from_secs(2);
/// How long past its lease a silent node is given before it is taken for lost.
pub const GRACE: Duration = Duration::from_secs(5);
/// How long a placement's memory reservation counts (two heartbeats: by then the node's
/// own report counts the new VM).
pub const RESERVATION: Duration = Duration::from_secs(6);
/// How long the control plane's leaf and the nodes' are valid, in days.
pub const LEAF_DAYS: u64 = 30;

/// The `meta` entry holding the cluster CA, sealed by the vault.
const CA_META: &str = "cluster_ca";
/// What the CA's seal is bound to.
const CA_PURPOSE: &str = "cluster CA";

/// A failure of the cluster machinery.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Certificates could not be made or used.
    #[error(transparent)]
    Tls(#[from] TlsError),
}

#[derive(serde::Serialize, serde::Deserialize)]
struct SealedCa {
    cert_pem: String,
    key_pem: String,
}

/// What a replica knows of the cluster: the CA (from the database; every replica has the
/// same), its own leaf, and a client per node.
pub struct Cluster {
    store: Arc<Store>,
    ca: ClusterCa,
    identity: Identity,
    clients: std::sync::Mutex<HashMap<String, (String, Arc<RemoteNode>)>>,
    archive: Option<ClusterArchive>,
    /// Nodes this replica is sending settings to now.
    configuring: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Sandboxes this replica is sending secret values to now.
    sending_secrets: std::sync::Mutex<std::collections::HashSet<space_node_api::SandboxId>>,
    /// This replica's name in claims.
    holder: String,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster").finish_non_exhaustive()
    }
}

impl Cluster {
    /// Loads the cluster CA from the database, making it on the very first start (of any
    /// replica: the first one to write it wins, the others read it), and issues this
    /// replica's leaf.
    pub async fn open(
        store: Arc<Store>,
        vault: &Vault,
        archive: Option<ClusterArchive>,
    ) -> Result<Cluster, ClusterError> {
        let fresh = ClusterCa::generate()?;
        let sealed = serde_json::to_vec(&SealedCa {
            cert_pem: fresh.cert_pem().to_owned(),
            key_pem: fresh.key_pem().to_owned(),
        })
        .expect("serializes");
        let blob = vault.seal_blob(CA_PURPOSE, &sealed)?;
        let stored = store.meta_init(CA_META, &blob).await?;
        let opened = vault.open_blob(CA_PURPOSE, &stored)?;
        let ca: SealedCa = serde_json::from_slice(&opened)
            .map_err(|e| StoreError::Database(format!("the cluster CA: {e}")))?;
        let ca = ClusterCa::from_pem(&ca.cert_pem, &ca.key_pem)?;
        let identity = Identity::new(&ca.issue_control(LEAF_DAYS)?, ca.cert_pem())?;
        Ok(Cluster {
            store,
            ca,
            identity,
            clients: Default::default(),
            archive,
            configuring: Default::default(),
            sending_secrets: Default::default(),
            holder: format!("replica-{}", crate::store::cluster::random_alnum(12)),
        })
    }

    /// The object store, when the deployment has one.
    pub fn archive(&self) -> Option<&ClusterArchive> {
        self.archive.as_ref()
    }

    /// This replica's name in claims.
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// Marks `id`'s secret values as being sent; `false` when they are already.
    pub fn start_sending_secrets(&self, id: &space_node_api::SandboxId) -> bool {
        self.sending_secrets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.clone())
    }

    /// The sending of `id`'s secret values ended.
    pub fn done_sending_secrets(&self, id: &space_node_api::SandboxId) {
        self.sending_secrets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id);
    }

    /// Sends node `row` the deployment's settings when the digest it reported is not theirs
    /// (it restarted, or they changed), in the background, once at a time per node.
    pub async fn configure_if_stale(self: &Arc<Self>, row: &NodeRow, reported: Option<&str>) {
        let settings = match &self.archive {
            Some(archive) => match archive.node_settings(&self.store).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!(error = %e, "the nodes' settings");
                    return;
                }
            },
            // Nothing to give but the fact that there is nothing.
            None => space_node_api::settings::NodeSettings::default(),
        };
        if reported == Some(settings.digest().as_str()) {
            return;
        }
        if !self
            .configuring
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(row.id.clone())
        {
            return;
        }
        let (me, row) = (self.clone(), row.clone());
        tokio::spawn(async move {
            let sent = match me.client(&row) {
                Ok(c) => c.configure(settings).await.map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            match sent {
                Ok(()) => tracing::info!(node = %row.id, "settings sent"),
                Err(e) => tracing::warn!(node = %row.id, error = %e, "sending settings"),
            }
            me.configuring
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&row.id);
        });
    }

    /// The cluster CA.
    pub fn ca(&self) -> &ClusterCa {
        &self.ca
    }

    /// The store.
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// The client of node `row` (made again when its address changed).
    pub fn client(&self, row: &NodeRow) -> Result<Arc<RemoteNode>, TlsError> {
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((addr, c)) = clients.get(&row.id) {
            if *addr == row.address {
                return Ok(c.clone());
            }
        }
        let c = Arc::new(RemoteNode::new(&row.id, &row.address, &self.identity)?);
        clients.insert(row.id.clone(), (row.address.clone(), c.clone()));
        Ok(c)
    }

    /// The nodes that may take calls: live leases, active or draining.
    pub async fn live_nodes(&self) -> Result<Vec<NodeRow>, StoreError> {
        Ok(self
            .store
            .nodes()
            .await?
            .into_iter()
            .filter(|n| n.live && matches!(n.state, NodeState::Active | NodeState::Draining))
            .collect())
    }
}

/// A node's last report, or an empty one when it cannot be read.
pub fn report_of(row: &NodeRow) -> NodeReport {
    serde_json::from_value(row.report.clone()).unwrap_or_default()
}
