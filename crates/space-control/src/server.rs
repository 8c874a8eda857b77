//! The API server of a single host (`space up`): opens the state store, reconciles it with
//! the node the process runs, and serves the API until shut down.
//!
//! The node itself is the caller's ([`HostedNode`]): this crate knows nodes only through the
//! node API. Before the node opens, [`Server::hooks`] gives what it needs from the control
//! plane (the gateway's secrets and audit sink, the object store's keyring); once it is open,
//! [`Server::start`] takes it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use space_archive::{Archive, Keyring};
use space_node_api::{FaultCode, NodeApi, SandboxId, State};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::api::{self, AppState};
use crate::archive::{own_adopted, ArchiveSettings, KeyAuditSink};
use crate::egress::{AuditSink, AuditWriter, VaultSecrets};
use crate::masters::TenantMasters;
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
/// How long a sandbox may take to answer its first request, unless configured.
pub const DEFAULT_READY_TIMEOUT: Duration = Duration::from_secs(120);

/// How to run a server.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The data directory: the state database (`state/control.db`), the vault and master
    /// keys (`state/`) and template uploads (`uploads/`) live under it.
    pub data_dir: PathBuf,
    /// How long a new sandbox may take to answer (the node's setting, for the answers that
    /// mention it).
    pub ready_timeout: Duration,
    /// Where to listen; port 0 picks a free one ([`Server::local_addr`] says which).
    pub listen: SocketAddr,
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
    /// TLS on the listener (`crate::listen`); by default leaves of the deployment CA in
    /// `<data dir>/state/ca`.
    pub tls: crate::listen::TlsSettings,
}

/// The variable that sets the base of ingress URLs (`https://space.example.com`); unset, the
/// base is `http://` plus the `Host` the client used to reach the server.
pub const PUBLIC_URL_ENV: &str = "SPACE_PUBLIC_URL";

impl ServerConfig {
    /// Defaults around a data directory: listen on 127.0.0.1:7070, no object store.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        let data_dir: PathBuf = data_dir.into();
        ServerConfig {
            ready_timeout: DEFAULT_READY_TIMEOUT,
            listen: SocketAddr::from(([127, 0, 0, 1], 7070)),
            max_upload_bytes: DEFAULT_MAX_UPLOAD_BYTES,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            archive: None,
            tls: crate::listen::TlsSettings {
                ca_dir: Some(data_dir.join("state").join("ca")),
                ..Default::default()
            },
            database: None,
            data_dir,
        }
    }
}

/// The node a server runs in its own process: the node API in front of it, what it found in
/// the object store when it opened, and how it stops. `space up` implements it around a
/// `space_node::Node`.
#[async_trait::async_trait]
pub trait HostedNode: Send + Sync + 'static {
    /// The node's calls.
    fn api(&self) -> Arc<dyn NodeApi>;
    /// The sandboxes the node found in the object store when it opened, each with the tenant
    /// its sealed record names; given once.
    fn take_adopted(&self) -> Vec<(SandboxId, String)>;
    /// Stops the node's drivers and leaves the VMs running for the next start to adopt.
    async fn shutdown(&self);
}

/// What the node of a server needs from the control plane before it opens, from
/// [`Server::hooks`]: its gateway's credentials and audit log, and the object store with the
/// keyring whose unwraps are audited. Given back to [`Server::start`].
pub struct NodeHooks {
    /// Credential values for the gateway, from the vault (connected once it opens).
    pub secrets: Arc<VaultSecrets>,
    /// The gateway's audit events, into the audit log.
    pub audit: Arc<AuditSink>,
    /// The object store and its keyring, when the server has one.
    pub archive: Option<(Archive, Arc<Keyring>)>,
    writer: AuditWriter,
    key_audit: Arc<KeyAuditSink>,
    masters: Option<Arc<TenantMasters>>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for NodeHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeHooks")
            .field("archive", &self.archive.as_ref().map(|(a, _)| a.name()))
            .finish_non_exhaustive()
    }
}

/// A running API server.
pub struct Server {
    node: Arc<dyn HostedNode>,
    api: Arc<dyn NodeApi>,
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
    /// What the node needs before it opens (see [`NodeHooks`]); the master key file is made
    /// on its first use, which may be after the node mounts the data directory.
    pub fn hooks(config: &ServerConfig) -> anyhow::Result<NodeHooks> {
        let metrics = Arc::new(Metrics::new());
        let (sink, writer) = AuditSink::new(metrics.clone());
        let key_audit = Arc::new(KeyAuditSink::default());
        let (archive, masters) = match &config.archive {
            Some(a) => {
                let (archive, keyring, masters) = a.open(&config.data_dir, key_audit.clone())?;
                (Some((archive, keyring)), Some(masters))
            }
            None => (None, None),
        };
        Ok(NodeHooks {
            secrets: Arc::new(VaultSecrets::new()),
            audit: Arc::new(sink),
            archive,
            writer,
            key_audit,
            masters,
            metrics,
        })
    }

    /// Opens the store at `<data_dir>/state/control.db` (or the configured database), makes
    /// the default tenant and its admin key on the first start, records who owns what the
    /// node found in the object store, discards sandboxes no tenant owns, binds and serves in a
    /// spawned task. The hooks' secrets and audit sink are connected to the store and the
    /// vault once those are open. A vault key that does not match the database stops the
    /// start with a clear error; a start that fails shuts the node down.
    pub async fn start(
        config: ServerConfig,
        hooks: NodeHooks,
        node: Arc<dyn HostedNode>,
    ) -> anyhow::Result<Server> {
        match Self::prepare(node.as_ref(), &config, &hooks).await {
            Ok((store, vault, bootstrap)) => {
                if let Some(m) = &hooks.masters {
                    m.connect(store.clone());
                }
                match Self::serve(node.clone(), store, vault, bootstrap, hooks, config).await {
                    Ok(s) => Ok(s),
                    Err(e) => {
                        node.shutdown().await;
                        Err(e)
                    }
                }
            }
            Err(e) => {
                node.shutdown().await;
                Err(e)
            }
        }
    }

    async fn prepare(
        node: &dyn HostedNode,
        config: &ServerConfig,
        hooks: &NodeHooks,
    ) -> anyhow::Result<(Arc<Store>, Arc<Vault>, Option<KeyCreated>)> {
        let state_dir = config.data_dir.join("state");
        std::fs::create_dir_all(&state_dir)
            .with_context(|| format!("creating {}", state_dir.display()))?;
        let database = match &config.database {
            Some(d) => d.clone(),
            None => sqlite_file(&config.data_dir).display().to_string(),
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
        hooks.secrets.connect(store.clone(), vault.clone());
        let tenant: TenantName = DEFAULT_TENANT.parse()?;
        let bootstrap = store
            .bootstrap(&tenant)
            .await
            .context("making the default tenant")?;
        hooks.key_audit.connect(store.clone());
        own_adopted(node.take_adopted(), &store)
            .await
            .context("recording sandboxes found in the object store")?;
        discard_unowned(node.api().as_ref(), &store).await?;
        Ok((store, vault, bootstrap))
    }

    async fn serve(
        node: Arc<dyn HostedNode>,
        store: Arc<Store>,
        vault: Arc<Vault>,
        bootstrap: Option<KeyCreated>,
        hooks: NodeHooks,
        config: ServerConfig,
    ) -> anyhow::Result<Server> {
        let NodeHooks {
            archive,
            writer,
            masters,
            metrics,
            ..
        } = hooks;
        writer
            .start(store.clone())
            .context("starting the egress audit writer")?;
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("listening on {}", config.listen))?;
        let addr = listener.local_addr()?;
        let public_url = std::env::var(PUBLIC_URL_ENV)
            .ok()
            .filter(|u| !u.is_empty())
            .map(|u| u.trim_end_matches('/').to_owned());
        let api = node.api();
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
            e2b,
            vault,
            public_url,
            node: api.clone(),
            store: store.clone(),
            metrics: metrics.clone(),
            quotas: QuotaLocks::new(),
            max_upload_bytes: config.max_upload_bytes,
            ready_timeout: config.ready_timeout,
            builds: tokio::sync::Mutex::new(()),
            uploads_dir: Some(config.data_dir.join("uploads")),
            max_template_upload_bytes: MAX_TEMPLATE_UPLOAD_BYTES,
            masters,
            keyring: archive.map(|(_, k)| k),
            cluster: None,
        });
        let app = api::router(state, config.max_body_bytes);
        let (stop, stopped) = oneshot::channel::<()>();
        let listener = crate::listen::Listener::new(listener, certs)?;
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

    /// The node API the server calls.
    pub fn node_api(&self) -> &Arc<dyn NodeApi> {
        &self.api
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
    /// [`SHUTDOWN_GRACE`] (streams still open then are cut), then stops the node
    /// ([`HostedNode::shutdown`]).
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
        self.node.shutdown().await;
    }
}

/// Discards every sandbox no tenant owns: left by a crash between the node's create and the
/// ownership write, nobody could reach it through the API, and nobody got an answer about
/// it, so nothing of it stays (its VM, its directories, its record), as after a failed
/// create. A kill would leave a terminated record that no tenant's list shows.
async fn discard_unowned(node: &dyn NodeApi, store: &Store) -> anyhow::Result<()> {
    let all = node
        .list()
        .await
        .map_err(|f| anyhow::anyhow!("listing the node's sandboxes: {f}"))?;
    for sb in all {
        if sb.state == State::Terminated || store.sandbox_tenant(sb.id.as_str()).await?.is_some() {
            continue;
        }
        tracing::warn!(id = %sb.id, state = %sb.state, "discarding a sandbox no tenant owns");
        eprintln!(
            "[up] discarding sandbox {} ({}): no tenant owns it (left by a crash during create)",
            sb.id, sb.state
        );
        match node.discard(&sb.id).await {
            Ok(()) => {}
            Err(f) if f.code == FaultCode::NotFound => {}
            Err(f) => tracing::error!(id = %sb.id, error = %f, "discarding an unowned sandbox"),
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
            let Ok(id) = id.parse::<SandboxId>() else {
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
            if matches!(&result, Err(f) if f.code == FaultCode::IllegalState) {
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
