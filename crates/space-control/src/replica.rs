//! A control replica (`space control`): the public API over a cluster of nodes, keeping
//! nothing of its own. Its state is the database's; its node calls go through
//! [`ClusterNodes`]; any number of replicas can serve the same cluster, and any one of them
//! answers any request, streams included (`docs/cluster.md`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::api::{self, AppState};
use crate::archive::{ArchiveSettings, KeyAuditSink};
use crate::cluster::{moves, Cluster, ClusterArchive, ClusterNodes, GRACE};
use crate::metrics::Metrics;
use crate::quota::QuotaLocks;
use crate::server::{redact, DEFAULT_TENANT, PUBLIC_URL_ENV, SHUTDOWN_GRACE};
use crate::store::{KeyCreated, NewAuditEvent, Store, TenantName};
use crate::vault::{Vault, VaultKey};

/// How often the shared store's garbage is collected (the node's own period).
use space_archive::gc::GC_EVERY;

/// How often a replica looks for nodes whose lease ran out.
const LOST_TICK: Duration = Duration::from_secs(1);

/// How to run a replica.
#[derive(Debug)]
pub struct ReplicaConfig {
    /// TLS on the listener (`crate::listen`): off unless an operator certificate or a CA
    /// directory is given.
    pub tls: crate::listen::TlsSettings,
    /// The state database (PostgreSQL for several replicas; a SQLite file works for one).
    pub database: String,
    /// Where the API listens.
    pub listen: SocketAddr,
    /// The vault key every replica of the deployment shares.
    pub vault_key: VaultKey,
    /// Largest file upload, bytes.
    pub max_upload_bytes: u64,
    /// Largest JSON body, bytes.
    pub max_body_bytes: usize,
    /// How long a template build VM may take to report ready.
    pub ready_timeout: Duration,
    /// The object store every node archives to, and the master key (`None`: nodes keep
    /// their snapshots on their own disks, and a lost node's sandboxes cannot come back
    /// elsewhere).
    pub archive: Option<ArchiveSettings>,
}

/// A running replica.
pub struct Replica {
    addr: SocketAddr,
    store: Arc<Store>,
    cluster: Arc<Cluster>,
    bootstrap: Option<KeyCreated>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
    watcher: JoinHandle<()>,
}

impl std::fmt::Debug for Replica {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replica").field("addr", &self.addr).finish()
    }
}

impl Replica {
    /// Opens the database (migrating it), the vault and the cluster CA, makes the default
    /// tenant and its admin key on the very first start of the deployment, and serves.
    pub async fn start(config: ReplicaConfig) -> anyhow::Result<Replica> {
        let store = Arc::new(
            Store::open_database(&config.database)
                .await
                .with_context(|| {
                    format!("opening the state database {}", redact(&config.database))
                })?,
        );
        let vault = Arc::new(
            Vault::open(store.clone(), &config.vault_key)
                .await
                .context("opening the vault")?,
        );
        let tenant: TenantName = DEFAULT_TENANT.parse()?;
        let bootstrap = store
            .bootstrap(&tenant)
            .await
            .context("making the default tenant")?;
        let audit = Arc::new(KeyAuditSink::default());
        audit.connect(store.clone());
        let archive = match config.archive.clone() {
            Some(settings) => Some(
                ClusterArchive::open(store.clone(), &vault, settings, audit)
                    .await
                    .context("opening the object store")?,
            ),
            None => None,
        };
        let (masters, keyring) = match &archive {
            Some(a) => (Some(a.masters().clone()), Some(a.keyring().clone())),
            None => (None, None),
        };
        let cluster = Arc::new(
            Cluster::open(store.clone(), &vault, archive)
                .await
                .context("opening the cluster CA")?,
        );
        if let Some(a) = cluster.archive() {
            for tenant in [space_archive::keys::TEMPLATE_TENANT, DEFAULT_TENANT] {
                a.ensure_tenant_key(&store, cluster.holder(), tenant)
                    .await
                    .with_context(|| format!("the object store key of {tenant}"))?;
            }
        }
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("listening on {}", config.listen))?;
        let addr = listener.local_addr()?;
        let public_url = std::env::var(PUBLIC_URL_ENV)
            .ok()
            .filter(|u| !u.is_empty())
            .map(|u| u.trim_end_matches('/').to_owned());
        let nodes: Arc<dyn space_node_api::NodeApi> = Arc::new(ClusterNodes::new(cluster.clone()));
        let e2b = Arc::new(crate::e2b::E2bState::new(vault.clone(), addr.port()));
        let certs = crate::listen::Certificates::open(
            &config.tls,
            addr,
            public_url.as_deref(),
            &e2b.domain,
        )?
        .map(Arc::new);
        let state = Arc::new(AppState {
            ca_pem: certs.as_ref().and_then(|c| c.ca_pem()).map(str::to_owned),
            node: nodes.clone(),
            store: store.clone(),
            metrics: Arc::new(Metrics::new()),
            quotas: QuotaLocks::shared(store.clone(), cluster.holder().to_owned()),
            max_upload_bytes: config.max_upload_bytes,
            ready_timeout: config.ready_timeout,
            builds: tokio::sync::Mutex::new(()),
            // Uploaded build inputs go to the object store, where any node reads them.
            uploads_dir: None,
            max_template_upload_bytes: crate::server::MAX_TEMPLATE_UPLOAD_BYTES,
            e2b,
            vault,
            public_url,
            masters,
            keyring,
            cluster: Some(cluster.clone()),
        });
        let app = api::router(state, config.max_body_bytes);
        let listener = crate::listen::Listener::new(listener, certs)?;
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let served = axum::serve(
                listener,
                app.into_make_service_with_connect_info::<crate::listen::Peer>(),
            )
            .with_graceful_shutdown(async move {
                let _ = stopped.await;
            })
            .await;
            if let Err(e) = served {
                tracing::error!(error = %e, "the API server stopped");
            }
        });
        let watcher = tokio::spawn(watch_leases(Arc::downgrade(&cluster)));
        {
            // Sandboxes suspended past their tenant's limit are killed, as on `space up`.
            let store = Arc::downgrade(&store);
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(crate::server::EXPIRY_TICK);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    let Some(store) = store.upgrade() else { return };
                    crate::server::expire_suspended(nodes.as_ref(), &store).await;
                }
            });
        }
        if cluster.archive().is_some() {
            // The shared store's garbage, once an hour for the whole cluster (nodes of a
            // cluster leave it to the replicas): whichever replica holds the claim.
            let cluster = Arc::downgrade(&cluster);
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(GC_EVERY);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    let Some(cluster) = cluster.upgrade() else {
                        return;
                    };
                    collect_garbage(&cluster).await;
                }
            });
        }
        tracing::info!(%addr, store = store.backend(), "serving the cluster's API");
        Ok(Replica {
            addr,
            store,
            cluster,
            bootstrap,
            stop: Some(stop),
            task,
            watcher,
        })
    }

    /// `http://<address>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The admin key made on the deployment's first start (by whichever replica started
    /// first), shown once.
    pub fn bootstrap_key(&self) -> Option<&str> {
        self.bootstrap.as_ref().map(|k| k.key.as_str())
    }

    /// The store.
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// The cluster.
    pub fn cluster(&self) -> &Arc<Cluster> {
        &self.cluster
    }

    /// Stops serving (requests in flight get [`SHUTDOWN_GRACE`]).
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.watcher.abort();
        let abort = self.task.abort_handle();
        if tokio::time::timeout(SHUTDOWN_GRACE, &mut self.task)
            .await
            .is_err()
        {
            abort.abort();
        }
    }
}

/// Marks nodes lost once their lease is past the grace period and records it. Every replica
/// runs this; the database makes each node's loss reported once.
async fn watch_leases(cluster: std::sync::Weak<Cluster>) {
    let mut tick = tokio::time::interval(LOST_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(cluster) = cluster.upgrade() else {
            return;
        };
        let store = cluster.store().clone();
        let grace = u64::try_from(GRACE.as_millis()).unwrap_or(u64::MAX);
        match store.mark_lost(grace).await {
            Ok(lost) => {
                for n in lost {
                    tracing::warn!(node = %n.id, incarnation = n.incarnation, "node lost: its lease ran out");
                    let event = NewAuditEvent {
                        tenant: None,
                        key_id: None,
                        sandbox: None,
                        operation: "node.lost".into(),
                        result: "ok".into(),
                        detail: Some(format!(
                            "node {} (incarnation {}) stopped renewing its lease",
                            n.id, n.incarnation
                        )),
                    };
                    if let Err(e) = store.record(event).await {
                        tracing::error!(error = %e, "recording a lost node");
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "looking for lost nodes"),
        }
        if cluster.archive().is_none() {
            // Without a store nothing can move: a lost node's sandboxes wait for it.
            continue;
        }
        moves::failover_pass(&cluster).await;
        match store.nodes().await {
            Ok(nodes) => {
                for n in nodes
                    .iter()
                    .filter(|n| n.state == crate::store::NodeState::Draining && n.live)
                {
                    match moves::drain_pass(&cluster, n).await {
                        Ok(0) => tracing::debug!(node = %n.id, "drained: it holds no sandbox"),
                        Ok(_) => {}
                        Err(f) => tracing::warn!(node = %n.id, error = %f, "draining"),
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "listing nodes to drain"),
        }
    }
}

/// Collects the shared store's garbage if no other replica did in the last hour.
async fn collect_garbage(cluster: &Cluster) {
    let Some(a) = cluster.archive() else { return };
    let hold = u64::try_from(GC_EVERY.as_millis()).unwrap_or(u64::MAX) - 60_000;
    match cluster.store().claim("gc", cluster.holder(), hold).await {
        Ok(true) => {}
        Ok(false) => return,
        Err(e) => {
            tracing::warn!(error = %e, "claiming the store's garbage collection");
            return;
        }
    }
    space_archive::gc::collect_and_log(a.keyring().archive(), a.keyring()).await;
}
