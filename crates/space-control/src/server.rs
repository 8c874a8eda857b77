//! The API server: opens the node and the state store, reconciles the two, builds missing
//! stock templates, and serves the API until shut down.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use space_node::{
    Node, NodeConfig, NodeError, State, TemplateName, TemplateRef, TemplateSpec, VersionReq,
};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::api::{self, AppState};
use crate::metrics::Metrics;
use crate::quota::QuotaLocks;
use crate::store::{KeyCreated, Store, TenantName};

/// Uploads are at most this many bytes by default: 1 GiB.
pub const DEFAULT_MAX_UPLOAD_BYTES: u64 = 1 << 30;
/// JSON request bodies are at most this many bytes by default: 1 MiB.
pub const DEFAULT_MAX_BODY_BYTES: usize = 1 << 20;
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
    /// Images to build as same-named templates at start when no build of them exists.
    pub stock_templates: Vec<String>,
    /// Largest file upload in bytes.
    pub max_upload_bytes: u64,
    /// Largest JSON request body in bytes.
    pub max_body_bytes: usize,
}

impl ServerConfig {
    /// Defaults around a node configuration: listen on 127.0.0.1:7070, no images.
    pub fn new(node: NodeConfig, kernel: impl Into<PathBuf>) -> Self {
        ServerConfig {
            node,
            listen: SocketAddr::from(([127, 0, 0, 1], 7070)),
            kernel: kernel.into(),
            images: BTreeMap::new(),
            stock_templates: Vec::new(),
            max_upload_bytes: DEFAULT_MAX_UPLOAD_BYTES,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
        }
    }
}

/// A running API server.
pub struct Server {
    node: Node,
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
    pub async fn start(config: ServerConfig) -> anyhow::Result<Server> {
        let node = Node::open(config.node.clone())
            .await
            .context("opening the node")?;
        match Self::prepare(&node, &config).await {
            Ok((store, bootstrap)) => Self::serve(node, store, bootstrap, config).await,
            Err(e) => {
                node.shutdown_detach().await;
                Err(e)
            }
        }
    }

    async fn prepare(
        node: &Node,
        config: &ServerConfig,
    ) -> anyhow::Result<(Arc<Store>, Option<KeyCreated>)> {
        let state_dir = config.node.data_dir.join("state");
        std::fs::create_dir_all(&state_dir)
            .with_context(|| format!("creating {}", state_dir.display()))?;
        let db = state_dir.join("control.db");
        let store = Store::open(&db).with_context(|| format!("opening {}", db.display()))?;
        let tenant: TenantName = DEFAULT_TENANT.parse()?;
        let bootstrap = store
            .bootstrap(&tenant)
            .context("making the default tenant")?;
        kill_unowned(node, &store).await?;
        for name in &config.stock_templates {
            build_stock(node, config, name).await?;
        }
        Ok((Arc::new(store), bootstrap))
    }

    async fn serve(
        node: Node,
        store: Arc<Store>,
        bootstrap: Option<KeyCreated>,
        config: ServerConfig,
    ) -> anyhow::Result<Server> {
        let metrics = Arc::new(Metrics::new());
        let state = Arc::new(AppState {
            node: node.clone(),
            store: store.clone(),
            metrics: metrics.clone(),
            quotas: QuotaLocks::new(),
            kernel: config.kernel.clone(),
            images: config.images.clone(),
            max_upload_bytes: config.max_upload_bytes,
            ready_timeout: config.node.ready_timeout,
            builds: tokio::sync::Mutex::new(()),
        });
        let app = api::router(state, config.max_body_bytes);
        let listener = match tokio::net::TcpListener::bind(config.listen).await {
            Ok(l) => l,
            Err(e) => {
                node.shutdown_detach().await;
                return Err(e).with_context(|| format!("listening on {}", config.listen));
            }
        };
        let addr = listener.local_addr()?;
        let (stop, stopped) = oneshot::channel::<()>();
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
        tracing::info!(%addr, "serving the API");
        Ok(Server {
            node,
            store,
            metrics,
            addr,
            bootstrap,
            stop: Some(stop),
            task,
        })
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
        self.node.shutdown_detach().await;
    }
}

/// Kills every sandbox no tenant owns: left by a crash between the node's create and the
/// ownership write, nobody could reach it through the API.
async fn kill_unowned(node: &Node, store: &Store) -> anyhow::Result<()> {
    for r in node.list().await.context("listing the node's sandboxes")? {
        if r.state == State::Terminated || store.sandbox_tenant(r.id.as_str())?.is_some() {
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

/// Builds image `name` as template `name` version 1 when no build of it exists.
async fn build_stock(node: &Node, config: &ServerConfig, name: &str) -> anyhow::Result<()> {
    let tname: TemplateName = name.parse()?;
    match node.template(&tname, &VersionReq::Latest) {
        Ok(_) => return Ok(()),
        Err(NodeError::TemplateNotFound(_)) => {}
        Err(e) => return Err(e).with_context(|| format!("looking up template {name}")),
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
            template: TemplateRef::new(name, "1")?,
            kernel: config.kernel.clone(),
            rootfs: rootfs.clone(),
            vcpus: api::admin::DEFAULT_TEMPLATE_VCPUS,
            memory_mib: api::admin::DEFAULT_TEMPLATE_MEMORY_MIB,
            kernel_cmdline: None,
            ready_timeout: config.node.ready_timeout,
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
