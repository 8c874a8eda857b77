//! The egress gateway: the host end of every sandbox's way out (`docs/egress.md`).
//!
//! - [`policy`]: rules (`host[:port]`), the per-sandbox [`EgressPolicy`], private addresses.
//! - [`hello`]: the bounded TLS ClientHello parser of the SNI check.
//! - [`http1`]: request and response heads, credential placeholders, rewriting.
//! - [`substitute`]: values in request bodies and scrubbed from responses; [`chunked`]: the
//!   chunked coding; `exchange`: one request and response of a sandbox with credentials.
//! - [`resolve`]: name resolution, once per connection (the checked address is the one used).
//! - [`ca`]: the deployment CA, leaf certificates and both TLS configurations.
//! - [`serve`]: the HTTP/2 server on the `space.egress` port; `handlers`: its two handlers.
//!
//! A node has one [`Gateway`] (CA, TLS client configuration, limits, the control plane's
//! [`SecretSource`] and [`EgressAudit`]); each sandbox has a [`SandboxGateway`] holding its
//! current policy and bindings, read by every new connection; each running VM has a loop
//! ([`spawn_vm_loop`]) that connects to its `egress.sock` and serves it.

pub mod ca;
pub mod chunked;
mod exchange;
mod handlers;
pub mod hello;
pub mod http1;
pub use space_node_api::policy;
pub mod resolve;
pub mod serve;
mod streams;
pub mod substitute;
pub mod upstream;
pub mod volumes;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::sync::Semaphore;

use space_node_api::ids::SandboxId;

pub use policy::{EgressDefault, EgressPolicy, EgressRule, Host};
pub use serve::serve;

pub use space_node_api::secrets::{
    validate_bindings, EgressAudit, EgressEvent, SecretBinding, SecretSource, SecretValue,
    MAX_BINDINGS,
};

/// The node-wide gateway settings.
#[derive(Clone)]
pub struct GatewayConfig {
    /// Open connections per sandbox (`429` beyond).
    pub max_connections: usize,
    /// Bytes per second per direction per sandbox; `None`: unlimited.
    pub bandwidth_bytes_per_sec: Option<u64>,
    /// A connection with no bytes either way for this long is cut.
    pub idle_timeout: Duration,
    /// Upstream connect (and TLS handshake) timeout.
    pub connect_timeout: Duration,
    /// PEM files trusted for upstream TLS besides the system's roots.
    pub extra_roots: Vec<PathBuf>,
    /// PEM files of the operator's CAs that sandboxes trust besides the deployment's own
    /// (a TLS-inspecting proxy's, a private PKI's); the gateway trusts them for upstreams too.
    pub guest_cas: Vec<PathBuf>,
    /// The HTTP proxy upstreams are reached through (`HTTPS_PROXY`, `NO_PROXY`).
    pub upstream_proxy: Option<upstream::Proxy>,
    /// Secret values; `None`: placeholders are never replaced.
    pub secrets: Option<Arc<dyn SecretSource>>,
    /// Audit sink; `None`: events are only traced.
    pub audit: Option<Arc<dyn EgressAudit>>,
    /// Turns destination names into addresses ([`resolve::SystemResolver`] by default).
    pub resolver: Arc<dyn resolve::Resolve>,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        GatewayConfig {
            max_connections: 64,
            bandwidth_bytes_per_sec: None,
            idle_timeout: Duration::from_secs(300),
            connect_timeout: Duration::from_secs(10),
            extra_roots: Vec::new(),
            guest_cas: Vec::new(),
            upstream_proxy: None,
            secrets: None,
            audit: None,
            resolver: Arc::new(resolve::SystemResolver),
        }
    }
}

impl std::fmt::Debug for GatewayConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayConfig")
            .field("max_connections", &self.max_connections)
            .field("bandwidth_bytes_per_sec", &self.bandwidth_bytes_per_sec)
            .field("idle_timeout", &self.idle_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("extra_roots", &self.extra_roots)
            .field("guest_cas", &self.guest_cas)
            .field("upstream_proxy", &self.upstream_proxy)
            .field("secrets", &self.secrets.as_ref().map(|_| "<source>"))
            .field("audit", &self.audit.as_ref().map(|_| "<sink>"))
            .field("resolver", &"<resolver>")
            .finish()
    }
}

/// Errors of the gateway's machinery (not refusals, which are answers).
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// A filesystem or socket call failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file involved.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// Certificates or TLS configuration.
    #[error("TLS: {0}")]
    Tls(String),
    /// The egress stream misbehaved (no sync line, HTTP/2 error).
    #[error("egress stream: {0}")]
    Stream(String),
}

/// The node's gateway: CA, upstream TLS roots, limits, secret source, audit sink.
pub struct Gateway {
    pub(crate) config: GatewayConfig,
    pub(crate) authority: ca::Authority,
    pub(crate) client_tls: Arc<rustls::ClientConfig>,
    guest_pem: String,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Gateway {
    /// Opens the CA in `ca_dir` (made when absent) and loads the upstream roots.
    pub fn open(ca_dir: &Path, config: GatewayConfig) -> Result<Arc<Gateway>, GatewayError> {
        let authority = ca::Authority::open(ca_dir)?;
        let roots: Vec<PathBuf> = config
            .extra_roots
            .iter()
            .chain(&config.guest_cas)
            .cloned()
            .collect();
        let client_tls = ca::client_config(&roots)?;
        let mut guest_pem = authority.ca_pem().trim_end().to_owned();
        guest_pem.push('\n');
        for path in &config.guest_cas {
            guest_pem.push_str(&ca::read_certificates(path)?);
        }
        if guest_pem.len() > space_proto::limits::MAX_CA_PEM {
            return Err(GatewayError::Tls(format!(
                "the CA certificates for sandboxes are {} bytes of PEM; at most {} fit",
                guest_pem.len(),
                space_proto::limits::MAX_CA_PEM
            )));
        }
        Ok(Arc::new(Gateway {
            config,
            authority,
            client_tls,
            guest_pem,
        }))
    }

    /// The CA certificates sandboxes trust, PEM: the deployment CA's, then the operator's.
    pub fn ca_pem(&self) -> String {
        self.guest_pem.clone()
    }

    /// The per-sandbox state for sandbox `id`.
    pub fn sandbox(
        self: &Arc<Self>,
        id: SandboxId,
        policy: EgressPolicy,
        bindings: Vec<SecretBinding>,
    ) -> Arc<SandboxGateway> {
        let bucket = |rate: Option<u64>| rate.filter(|r| *r > 0).map(streams::Bucket::new);
        Arc::new(SandboxGateway {
            gateway: self.clone(),
            id,
            policy: RwLock::new(Arc::new(policy)),
            bindings: Arc::new(bindings),
            connections: Arc::new(Semaphore::new(self.config.max_connections)),
            up: bucket(self.config.bandwidth_bytes_per_sec),
            down: bucket(self.config.bandwidth_bytes_per_sec),
            sent: AtomicU64::new(0),
            received: AtomicU64::new(0),
            mounts: RwLock::new(Arc::new(Vec::new())),
        })
    }

    pub(crate) fn audit(&self, event: EgressEvent) {
        tracing::debug!(
            sandbox = %event.sandbox, operation = event.operation, host = %event.host,
            port = event.port, detail = %event.detail, "egress"
        );
        if let Some(a) = &self.config.audit {
            a.record(event);
        }
    }
}

/// One sandbox's egress state, shared by its VM loop and its actor: the policy is replaced
/// by [`SandboxGateway::set_policy`] and read by every new connection.
pub struct SandboxGateway {
    pub(crate) gateway: Arc<Gateway>,
    pub(crate) id: SandboxId,
    policy: RwLock<Arc<EgressPolicy>>,
    pub(crate) bindings: Arc<Vec<SecretBinding>>,
    pub(crate) connections: Arc<Semaphore>,
    pub(crate) up: Option<streams::Bucket>,
    pub(crate) down: Option<streams::Bucket>,
    /// Bytes the guest sent into its egress channel and got out of it, framing included.
    pub(crate) sent: AtomicU64,
    pub(crate) received: AtomicU64,
    /// The volumes mounted in the sandbox, by index ([`volumes`]).
    mounts: RwLock<Arc<Vec<volumes::Mount>>>,
}

impl std::fmt::Debug for SandboxGateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxGateway")
            .field("id", &self.id)
            .field("policy", &self.policy())
            .field("bindings", &self.bindings.len())
            .finish_non_exhaustive()
    }
}

impl SandboxGateway {
    /// The policy new connections use.
    pub fn policy(&self) -> Arc<EgressPolicy> {
        self.policy
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Replaces the policy for new connections (open ones are not cut).
    pub fn set_policy(&self, policy: EgressPolicy) {
        *self.policy.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(policy);
    }

    /// The sandbox.
    pub fn id(&self) -> &SandboxId {
        &self.id
    }

    /// The sandbox's credential bindings.
    pub fn bindings(&self) -> &[SecretBinding] {
        &self.bindings
    }

    /// Whether requests to `host:port` go through the exchange (`exchange`): the sandbox
    /// has credential bindings (every request is searched for their placeholders), or a
    /// header rule of its policy names the destination.
    pub(crate) fn exchanges(&self, host: &Host, port: u16) -> bool {
        !self.bindings.is_empty() || self.policy().headers_for(host, port).next().is_some()
    }

    /// The volumes the sandbox's guest may reach, by mount index.
    pub fn mounts(&self) -> Arc<Vec<volumes::Mount>> {
        self.mounts
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Replaces the volumes the sandbox's guest may reach (requests under way finish on the
    /// old list).
    pub fn set_mounts(&self, mounts: Vec<volumes::Mount>) {
        *self.mounts.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(mounts);
    }

    /// Bytes the sandbox sent and received through the gateway since this state was made
    /// (counted on its egress channel, so HTTP/2 framing is included: about 9 bytes a frame
    /// of up to 16 KiB).
    pub fn traffic(&self) -> (u64, u64) {
        (
            self.sent.load(Ordering::Relaxed),
            self.received.load(Ordering::Relaxed),
        )
    }
}

/// Aborts the VM's gateway loop when dropped.
pub struct VmLoop {
    task: tokio::task::JoinHandle<()>,
    /// The VMM's pid the loop serves.
    pub pid: u32,
}

impl Drop for VmLoop {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How long the loop waits before connecting again after the stream ended or failed.
const RECONNECT_BACKOFF: Duration = Duration::from_millis(200);

/// Starts the loop serving the `egress.sock` of the VM (process `pid`) in `dir`: connect
/// (through `splice` when the VM's channels go through one), wait for the guest's line,
/// serve, and start over after a short pause, until dropped.
pub fn spawn_vm_loop(
    sandbox: Arc<SandboxGateway>,
    dir: PathBuf,
    pid: u32,
    splice: Option<space_runtime::Splice>,
) -> VmLoop {
    let task = tokio::spawn(async move {
        let mut seed = Vec::new();
        loop {
            let name = space_runtime::cmdline::EGRESS_SOCKET;
            let stream = match &splice {
                Some(s) => s.connect(name).await,
                None => space_runtime::qemu::connect_in_dir(&dir, name).await,
            };
            match stream {
                Ok(stream) => {
                    match serve::serve_seeded(stream, sandbox.clone(), std::mem::take(&mut seed))
                        .await
                    {
                        Ok(tail) => seed = tail,
                        Err(e) => {
                            tracing::debug!(id = %sandbox.id, error = %e, "egress stream ended")
                        }
                    }
                }
                Err(e) => tracing::debug!(id = %sandbox.id, error = %e, "egress socket"),
            }
            tokio::time::sleep(RECONNECT_BACKOFF).await;
        }
    });
    VmLoop { task, pid }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bindings_validate() {
        let b = SecretBinding::new("GITHUB_TOKEN", vec!["api.github.com".parse().unwrap()]);
        b.validate().unwrap();
        assert!(b.placeholder.starts_with("space-secret-"));
        assert_eq!(b.placeholder.len(), 13 + 32);
        for bad in ["", "lower", "1ABC", "A-B", &"A".repeat(65)] {
            let mut x = b.clone();
            x.name = bad.into();
            assert!(x.validate().is_err(), "{bad}");
        }
        let mut x = b.clone();
        x.placeholder = "space-secret-XYZ".into();
        assert!(x.validate().is_err());
        let other = SecretBinding::new("OTHER", vec![]);
        validate_bindings(&[b.clone(), other]).unwrap();
        assert!(validate_bindings(&[b.clone(), b.clone()]).is_err());
        let json = serde_json::to_value(&b).unwrap();
        assert_eq!(json["hosts"][0], "api.github.com");
        assert_eq!(serde_json::from_value::<SecretBinding>(json).unwrap(), b);
    }

    #[test]
    fn secret_values_do_not_show() {
        let v = SecretValue::from("hunter2".to_owned());
        assert_eq!(format!("{v:?}"), "<redacted>");
        assert_eq!(v.as_bytes(), b"hunter2");
        let mut buf = b"abc".to_vec();
        SecretValue::wipe(&mut buf);
        assert_eq!(buf, [0, 0, 0]);
    }
}
