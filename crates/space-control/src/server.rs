//! The API server: opens the node and the state store, reconciles the two, builds missing
//! stock templates, and serves the API until shut down.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use space_node::api::{ClusterCa, Identity, NodeServer, RemoteNode};
use space_node::{LocalNode, NodeApi};
use space_node::{
    Node, NodeConfig, NodeError, State, TemplateName, TemplateRef, TemplateSpec, VersionReq,
};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::api::{self, AppState};
use crate::archive::{own_adopted, ArchiveSettings, KeyAuditSink};
use crate::egress::{AuditSink, AuditWriter, VaultSecrets};
use crate::metrics::Metrics;
use crate::quota::QuotaLocks;
use crate::store::{KeyCreated, Store, TenantName};
use crate::vault::{KeySource, Vault, VaultKey};

/// Uploads are at most this many bytes by default: 1 GiB.
pub const DEFAULT_MAX_UPLOAD_BYTES: u64 = 1 << 30;
/// JSON request bodies are at most this many bytes by default: 1 MiB.
pub const DEFAULT_MAX_BODY_BYTES: usize = 1 << 20;
/// Largest template upload (a build context, an image archive), in bytes.
pub const MAX_TEMPLATE_UPLOAD_BYTES: u64 = 16 << 30;
/// The tenant the first start makes, with an admin key.
pub const DEFAULT_TENANT: &str = "default";
/// How long a shutdown waits for requests in flight.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// How to run a server.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The node (data directory, storage, QEMU, pools, ...).
    pub node: NodeConfig,
    /// Where to listen; port 0 picks a free one ([`Server::local_addr`] says which).
    pub listen: SocketAddr,
    /// The kernel templates are built with.
    pub kernel: PathBuf,
    /// Root images templates can be built from: image name -> rootfs file.
    pub images: BTreeMap<String, PathBuf>,
    /// The `space-guestd` binary put into templates made of OCI images and Dockerfiles
    /// (default: `$SPACE_GUESTD`).
    pub guestd: Option<PathBuf>,
    /// Images to build as same-named templates at start when no build of them exists.
    pub stock_templates: Vec<String>,
    /// Largest file upload in bytes.
    pub max_upload_bytes: u64,
    /// Largest JSON request body in bytes.
    pub max_body_bytes: usize,
    /// The object store suspended sandboxes go to (`docs/archive.md`); `None`: snapshots stay
    /// on the node's disk.
    pub archive: Option<ArchiveSettings>,
    /// The state database: a PostgreSQL URL or a SQLite file; `None`:
    /// `<data dir>/state/control.db`.
    pub database: Option<String>,
    /// Reach the node through the network node API (mutual TLS on loopback, from a cluster
    /// CA made for the process) instead of in process: every call and guest stream then
    /// takes the path a control replica's takes to a remote node. For tests and benchmarks.
    pub node_over_network: bool,
}

/// The variable that sets the base of ingress URLs (`https://space.example.com`); unset, the
/// base is `http://` plus the `Host` the client used to reach the server.
pub const PUBLIC_URL_ENV: &str = "SPACE_PUBLIC_URL";

impl ServerConfig {
    /// Defaults around a node configuration: listen on 127.0.0.1:7070, no images.
    pub fn new(node: NodeConfig, kernel: impl Into<PathBuf>) -> Self {
        ServerConfig {
            node,
            listen: SocketAddr::from(([127, 0, 0, 1], 7070)),
            kernel: kernel.into(),
            images: BTreeMap::new(),
            guestd: std::env::var_os("SPACE_GUESTD").map(PathBuf::from),
            stock_templates: Vec::new(),
            max_upload_bytes: DEFAULT_MAX_UPLOAD_BYTES,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            archive: None,
            database: None,
            node_over_network: false,
        }
    }
}

/// What [`Server::start`] prepared before the node opened.
struct Parts {
    store: Arc<Store>,
    vault: Arc<Vault>,
    metrics: Arc<Metrics>,
    bootstrap: Option<KeyCreated>,
    masters: Option<Arc<crate::masters::TenantMasters>>,
}

/// A running API server.
pub struct Server {
    node: Node,
    api: Arc<dyn NodeApi>,
    node_server: Option<NodeServer>,
    store: Arc<Store>,
    metrics: Arc<Metrics>,
    addr: SocketAddr,
    bootstrap: Option<KeyCreated>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server").field("addr", &self.addr).finish()
    }
}

impl Server {
    /// Opens the node (crash recovery runs there) and the store at
    /// `<data_dir>/state/control.db`, makes the default tenant and its admin key on the first
    /// start, kills sandboxes no tenant owns, builds missing stock templates (progress on
    /// stderr), binds and serves in a spawned task.
    ///
    ///
    /// The node's egress gateway takes its secrets ([`VaultSecrets`]) and audit sink
    /// ([`AuditSink`]) from here; both are connected to the store and the vault once those are
    /// open, right after the node (which may mount the data directory first). A vault key that
    /// does not match the database stops the start with a clear error.
    pub async fn start(mut config: ServerConfig) -> anyhow::Result<Server> {
        let metrics = Arc::new(Metrics::new());
        let secrets = Arc::new(VaultSecrets::new());
        let (sink, writer) = AuditSink::new(metrics.clone());
        let writer = if config.node.gateway.audit.is_none() {
            config.node.gateway.audit = Some(Arc::new(sink));
            Some(writer)
        } else {
            None
        };
        if config.node.gateway.secrets.is_none() {
            config.node.gateway.secrets = Some(secrets.clone());
        }
        let key_audit = Arc::new(KeyAuditSink::default());
        let mut masters = None;
        if let (Some(a), None) = (&config.archive, &config.node.archive) {
            let (cfg, m) = a.node_config(&config.node.data_dir, key_audit.clone())?;
            config.node.archive = Some(cfg);
            masters = Some(m);
        }
        let node = Node::open(config.node.clone())
            .await
            .context("opening the node")?;
        match Self::prepare(&node, &config, &secrets, writer, &key_audit).await {
            Ok((store, vault, bootstrap)) => {
                if let Some(m) = &masters {
                    m.connect(store.clone());
                }
                let parts = Parts {
                    store,
                    vault,
                    metrics,
                    bootstrap,
                    masters,
                };
                Self::serve(node, parts, config).await
            }
            Err(e) => {
                node.shutdown_detach().await;
                Err(e)
            }
        }
    }

    async fn prepare(
        node: &Node,
        config: &ServerConfig,
        secrets: &VaultSecrets,
        writer: Option<AuditWriter>,
        key_audit: &KeyAuditSink,
    ) -> anyhow::Result<(Arc<Store>, Arc<Vault>, Option<KeyCreated>)> {
        let state_dir = config.node.data_dir.join("state");
        std::fs::create_dir_all(&state_dir)
            .with_context(|| format!("creating {}", state_dir.display()))?;
        let database = match &config.database {
            Some(d) => d.clone(),
            None => sqlite_file(&config.node.data_dir).display().to_string(),
        };
        let store = Arc::new(
            Store::open_database(&database)
                .await
                .with_context(|| format!("opening the state database {}", redact(&database)))?,
        );
        // The builds an earlier process ran died with it (they run in this process).
        let interrupted = store
            .fail_running_builds("the server stopped while the build ran")
            .await
            .context("marking interrupted builds")?;
        if interrupted > 0 {
            tracing::warn!(interrupted, "template builds interrupted by a restart");
        }
        let (key, source) = VaultKey::load(&state_dir).context("loading the vault key")?;
        if source == KeySource::NewFile {
            eprintln!(
                "[up] made a new vault key in {} (back it up: secrets do not open without it)",
                state_dir.join(crate::vault::VAULT_KEY_FILE).display()
            );
        }
        let vault = Arc::new(
            Vault::open(store.clone(), &key)
                .await
                .context("opening the vault")?,
        );
        drop(key);
        secrets.connect(store.clone(), vault.clone());
        if let Some(w) = writer {
            w.start(store.clone())
                .context("starting the egress audit writer")?;
        }
        let tenant: TenantName = DEFAULT_TENANT.parse()?;
        let bootstrap = store
            .bootstrap(&tenant)
            .await
            .context("making the default tenant")?;
        key_audit.connect(store.clone());
        own_adopted(node, &store)
            .await
            .context("recording sandboxes found in the object store")?;
        kill_unowned(node, &store).await?;
        for name in &config.stock_templates {
            build_stock(node, config, name).await?;
        }
        Ok((store, vault, bootstrap))
    }

    async fn serve(node: Node, parts: Parts, config: ServerConfig) -> anyhow::Result<Server> {
        let Parts {
            store,
            vault,
            metrics,
            bootstrap,
            masters,
        } = parts;
        let listener = match tokio::net::TcpListener::bind(config.listen).await {
            Ok(l) => l,
            Err(e) => {
                node.shutdown_detach().await;
                return Err(e).with_context(|| format!("listening on {}", config.listen));
            }
        };
        let addr = listener.local_addr()?;
        let public_url = std::env::var(PUBLIC_URL_ENV)
            .ok()
            .filter(|u| !u.is_empty())
            .map(|u| u.trim_end_matches('/').to_owned());
        let local: Arc<dyn NodeApi> = Arc::new(
            LocalNode::new(node.clone(), config.kernel.clone(), config.images.clone())
                .with_guestd(config.guestd.clone()),
        );
        let (api, node_server) = if config.node_over_network {
            match loopback_node(local).await {
                Ok((api, server)) => (api, Some(server)),
                Err(e) => {
                    node.shutdown_detach().await;
                    return Err(e.context("serving the node API on loopback"));
                }
            }
        } else {
            (local, None)
        };
        let state = Arc::new(AppState {
            e2b: Arc::new(crate::e2b::E2bState::new(vault.clone(), addr.port())),
            vault,
            public_url,
            node: api.clone(),
            store: store.clone(),
            metrics: metrics.clone(),
            quotas: QuotaLocks::new(),
            max_upload_bytes: config.max_upload_bytes,
            ready_timeout: config.node.ready_timeout,
            builds: tokio::sync::Mutex::new(()),
            uploads_dir: config.node.data_dir.join("uploads"),
            max_template_upload_bytes: MAX_TEMPLATE_UPLOAD_BYTES,
            masters,
            keyring: node.archive().map(|a| a.keyring.clone()),
            cluster: None,
        });
        let app = api::router(state, config.max_body_bytes);
        let (stop, stopped) = oneshot::channel::<()>();
        // Streamed answers (exec's NDJSON lines) are many small writes: without TCP_NODELAY
        // each one after the first waits for the client's delayed ACK (~40 ms on Linux).
        let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!(error = %e, "setting TCP_NODELAY on an API connection");
            }
        });
        let task = tokio::spawn(async move {
            let served = axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await;
            if let Err(e) = served {
                tracing::error!(error = %e, "the API server stopped");
            }
        });
        {
            // Sandboxes suspended past their tenant's limit are killed, once a minute.
            let (api, store) = (api.clone(), Arc::downgrade(&store));
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(EXPIRY_TICK);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    let Some(store) = store.upgrade() else { return };
                    expire_suspended(api.as_ref(), &store).await;
                }
            });
        }
        tracing::info!(%addr, store = store.backend(), "serving the API");
        Ok(Server {
            node,
            api,
            node_server,
            store,
            metrics,
            addr,
            bootstrap,
            stop: Some(stop),
            task,
        })
    }

    /// Kills the sandboxes suspended past their tenant's `max_suspended_ms` now (the server
    /// does this once a minute on its own). Returns how many.
    pub async fn expire_suspended(&self) -> usize {
        expire_suspended(self.api.as_ref(), &self.store).await
    }

    /// `http://<address>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The address the server listens on (the actual port when asked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The admin key made on the first start of this data directory; `None` on later starts.
    pub fn bootstrap_key(&self) -> Option<&str> {
        self.bootstrap.as_ref().map(|k| k.key.as_str())
    }

    /// The node.
    pub fn node(&self) -> &Node {
        &self.node
    }

    /// The state store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The request metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Stops accepting connections, lets requests in flight finish for up to
    /// [`SHUTDOWN_GRACE`] (streams still open then are cut), then stops the node's drivers
    /// and leaves the VMs running for the next start to adopt.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let abort = self.task.abort_handle();
        if tokio::time::timeout(SHUTDOWN_GRACE, &mut self.task)
            .await
            .is_err()
        {
            tracing::warn!("requests still open after the grace period; cutting them");
            abort.abort();
            let _ = (&mut self.task).await;
        }
        if let Some(s) = self.node_server.take() {
            s.stop().await;
        }
        self.node.shutdown_detach().await;
    }
}

/// Serves `local` on a loopback port with mutual TLS and returns the network client of it.
async fn loopback_node(local: Arc<dyn NodeApi>) -> anyhow::Result<(Arc<dyn NodeApi>, NodeServer)> {
    let ca = ClusterCa::generate()?;
    let node_id = "local";
    let node_identity = Identity::new(&ca.issue_node(node_id, 1)?, ca.cert_pem())?;
    let server = NodeServer::start(local, "127.0.0.1:0".parse()?, &node_identity).await?;
    let control = Identity::new(&ca.issue_control(1)?, ca.cert_pem())?;
    let remote = RemoteNode::new(node_id, &server.local_addr().to_string(), &control)?;
    Ok((Arc::new(remote), server))
}

/// Kills every sandbox no tenant owns: left by a crash between the node's create and the
/// ownership write, nobody could reach it through the API.
async fn kill_unowned(node: &Node, store: &Store) -> anyhow::Result<()> {
    for r in node.list().await.context("listing the node's sandboxes")? {
        if r.state == State::Terminated || store.sandbox_tenant(r.id.as_str()).await?.is_some() {
            continue;
        }
        tracing::warn!(id = %r.id, state = %r.state, "killing a sandbox no tenant owns");
        eprintln!(
            "[up] killing sandbox {} ({}): no tenant owns it (left by a crash during create)",
            r.id, r.state
        );
        match node.kill(&r.id).await {
            Ok(()) | Err(NodeError::IllegalState { .. }) | Err(NodeError::NotFound(_)) => {}
            Err(e) => tracing::error!(id = %r.id, error = %e, "killing an unowned sandbox"),
        }
    }
    Ok(())
}

/// How often suspended sandboxes are checked against their tenant's limit.
pub(crate) const EXPIRY_TICK: Duration = Duration::from_secs(60);

/// Kills every sandbox that has been suspended for longer than its tenant's
/// `max_suspended_ms`, audited as `sandbox.expire`. Returns how many it killed.
/// Kills the sandboxes suspended past their tenant's `max_suspended_ms`; returns how many.
/// Safe on several replicas at once: a sandbox another replica killed first is skipped.
pub async fn expire_suspended(node: &dyn NodeApi, store: &Store) -> usize {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    let tenants = match store.tenants().await {
        Ok(t) => t,
        Err(e) => {
            tracing::error!(error = %e, "listing tenants for the suspended limit");
            return 0;
        }
    };
    let mut killed = 0;
    for t in tenants {
        let Some(limit) = t.quotas.max_suspended_ms else {
            continue;
        };
        for id in store.sandboxes_of(&t.name).await.unwrap_or_default() {
            let Ok(id) = id.parse::<space_node::SandboxId>() else {
                continue;
            };
            let Ok(info) = node.info(&id).await else {
                continue;
            };
            let held = now.saturating_sub(info.state_since_unix_ms);
            if info.state != State::Suspended || held < limit {
                continue;
            }
            let result = node.kill(&id).await;
            if matches!(&result, Err(f) if f.code == space_node::FaultCode::IllegalState) {
                // Killed meanwhile (by another replica's pass, or by its owner).
                continue;
            }
            let event = crate::store::NewAuditEvent {
                tenant: Some(t.name.clone()),
                key_id: None,
                sandbox: Some(id.to_string()),
                operation: "sandbox.expire".into(),
                result: if result.is_ok() { "ok" } else { "internal" }.into(),
                detail: Some(match &result {
                    Ok(()) => format!(
                        "suspended for {held} ms; tenant {} allows {limit} ms",
                        t.name
                    ),
                    Err(e) => e.to_string(),
                }),
            };
            if let Err(e) = store.record(event).await {
                tracing::error!(error = %e, "recording an audit event");
            }
            if result.is_ok() {
                killed += 1;
                tracing::info!(%id, tenant = %t.name, held_ms = held, "suspended past the tenant's limit: killed");
            }
        }
    }
    killed
}

/// Builds image `name` as template `name` version 1 when no build of it exists.
async fn build_stock(node: &Node, config: &ServerConfig, name: &str) -> anyhow::Result<()> {
    let tname: TemplateName = name.parse()?;
    match node.template(&tname, &VersionReq::Latest) {
        Ok(_) => return Ok(()),
        Err(NodeError::TemplateNotFound(_)) => {}
        Err(e) => return Err(e).with_context(|| format!("looking up template {name}")),
    }
    // A node on a new disk over an existing store: the build its archived sandboxes were
    // made from is the store's, not a new one.
    let tref = TemplateRef::new(name, "1")?;
    if node.archive().is_some() {
        match node.fetch_template(&tref).await {
            Ok(Some(_)) => {
                eprintln!("[up] template {tref} fetched from the object store");
                return Ok(());
            }
            Ok(None) => {}
            Err(e) => eprintln!("[up] template {tref} not fetched from the object store: {e}"),
        }
    }
    let rootfs = config
        .images
        .get(name)
        .with_context(|| format!("stock template {name}: no image of that name is configured"))?;
    eprintln!(
        "[up] building template {name} from {} ...",
        rootfs.display()
    );
    let started = Instant::now();
    let t = node
        .build_template(TemplateSpec {
            template: tref,
            kernel: config.kernel.clone(),
            rootfs: rootfs.clone(),
            vcpus: api::templates::DEFAULT_TEMPLATE_VCPUS,
            memory_mib: api::templates::DEFAULT_TEMPLATE_MEMORY_MIB,
            kernel_cmdline: None,
            ready_timeout: config.node.ready_timeout,
            guest: Default::default(),
            start: None,
            source: String::new(),
        })
        .await
        .with_context(|| format!("building template {name}"))?;
    eprintln!(
        "[up] template {name} {} ready ({:.1} s)",
        t.manifest.template.version,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The SQLite state database of a single-host deployment on `data_dir` (the one used when no
/// database is configured).
pub fn sqlite_file(data_dir: &std::path::Path) -> std::path::PathBuf {
    data_dir.join("state").join("control.db")
}

/// A database URL without its password, for messages.
pub fn redact(database: &str) -> String {
    match (database.find("://"), database.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &database[scheme + 3..at];
            match userinfo.find(':') {
                Some(colon) => format!(
                    "{}{}:***{}",
                    &database[..scheme + 3],
                    &userinfo[..colon],
                    &database[at..]
                ),
                None => database.to_owned(),
            }
        }
        _ => database.to_owned(),
    }
}

#[cfg(test)]
mod redact_tests {
    #[test]
    fn passwords_do_not_reach_messages() {
        assert_eq!(
            super::redact("postgres://space:s3cret@db.internal/space"),
            "postgres://space:***@db.internal/space"
        );
        assert_eq!(
            super::redact("postgres://space@/space?host=/run"),
            "postgres://space@/space?host=/run"
        );
        assert_eq!(
            super::redact("/data/state/control.db"),
            "/data/state/control.db"
        );
    }
}
