//! The public HTTP API (`docs/api.md`): the router, authentication, tenant scoping, request
//! extractors that answer in the API's error format, and the metrics middleware.
//!
//! - [`sandboxes`]: lifecycle, timeouts, logs, snapshots;
//! - [`streams`]: exec (NDJSON and WebSocket) and PTY;
//! - [`files`]: file transfer and file system operations;
//! - [`admin`]: templates, tenants, keys, audit;
//! - [`net`]: secrets, egress policies, exposed ports, ingress and the port proxy.

pub mod admin;
pub mod browser;
pub mod cluster;
mod extract;
pub mod files;
pub mod net;
pub mod openapi;
pub mod sandboxes;
pub mod shapes;
pub mod streams;
pub mod templates;
pub mod uploads;
pub mod volumes;

pub use extract::{
    integral, object, object_opt, parse_whole, whole, whole_opt, AdminCaller, ApiJson, ApiPath,
    ApiQuery, Caller, OptionalJson,
};

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, Method, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, patch, post, put};
use axum::{Json, Router};
use space_node_api::cluster as cluster_paths;
use space_node_api::{NodeApi, SandboxId};

use crate::error::{ApiError, ApiResult};
use crate::metrics::Metrics;
use crate::quota::QuotaLocks;
use crate::store::{NewAuditEvent, Principal, Store};

/// One route of the API: method, axum path and the operation name used in metrics, audit
/// events and the OpenAPI document.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    /// HTTP method.
    pub method: &'static str,
    /// Path with `{param}` placeholders.
    pub path: &'static str,
    /// Operation name (`sandbox.create`, ...).
    pub operation: &'static str,
}

const fn r(method: &'static str, path: &'static str, operation: &'static str) -> Route {
    Route {
        method,
        path,
        operation,
    }
}

/// Every route the server answers.
pub const ROUTES: &[Route] = &[
    r("GET", "/v1/health", "health"),
    r("GET", "/v1/openapi.json", "openapi"),
    r("GET", "/v1/tls/ca.pem", "tls.ca"),
    r("GET", "/metrics", "metrics"),
    r("GET", "/", "console.page"),
    r("GET", "/console/{*path}", "console.file"),
    r("POST", crate::mcp::PATH, "mcp.post"),
    r("GET", crate::mcp::PATH, "mcp.get"),
    r("DELETE", crate::mcp::PATH, "mcp.delete"),
    r("GET", "/v1/templates", "template.list"),
    r("POST", "/v1/templates", "template.build"),
    r("POST", "/v1/template-uploads", "template.upload"),
    r("GET", "/v1/builds", "template.builds"),
    r("GET", "/v1/builds/{id}", "template.build_get"),
    r("GET", "/v1/builds/{id}/log", "template.build_log"),
    r("POST", "/v1/sandboxes/{id}/template", "template.save"),
    r(
        "DELETE",
        "/v1/templates/{name}/{version}",
        "template.delete",
    ),
    r("POST", "/v1/sandboxes", "sandbox.create"),
    r("GET", "/v1/sandboxes", "sandbox.list"),
    r("GET", "/v1/sandboxes/{id}", "sandbox.get"),
    r("DELETE", "/v1/sandboxes/{id}", "sandbox.kill"),
    r("POST", "/v1/sandboxes/{id}/pause", "sandbox.pause"),
    r("POST", "/v1/sandboxes/{id}/resume", "sandbox.resume"),
    r("POST", "/v1/sandboxes/{id}/suspend", "sandbox.suspend"),
    r("POST", "/v1/sandboxes/{id}/restore", "sandbox.restore"),
    r("POST", "/v1/sandboxes/{id}/fork", "sandbox.fork"),
    r("PUT", "/v1/sandboxes/{id}/timeouts", "sandbox.set_timeouts"),
    r("GET", "/v1/sandboxes/{id}/logs", "sandbox.logs"),
    r("GET", "/v1/sandboxes/{id}/metrics", "sandbox.metrics"),
    r("POST", "/v1/sandboxes/{id}/exec", "sandbox.exec"),
    r("GET", "/v1/sandboxes/{id}/exec/ws", "sandbox.exec_ws"),
    r("GET", "/v1/sandboxes/{id}/pty", "sandbox.pty"),
    r("GET", "/v1/sandboxes/{id}/files", "files.download"),
    r("PUT", "/v1/sandboxes/{id}/files", "files.upload"),
    r("DELETE", "/v1/sandboxes/{id}/files", "files.remove"),
    r("GET", "/v1/sandboxes/{id}/files/list", "files.list"),
    r("GET", "/v1/sandboxes/{id}/files/stat", "files.stat"),
    r("POST", "/v1/sandboxes/{id}/files/mkdir", "files.mkdir"),
    r("POST", "/v1/sandboxes/{id}/files/rename", "files.rename"),
    r("GET", "/v1/sandboxes/{id}/files/watch", "files.watch"),
    r("GET", "/v1/sandboxes/{id}/snapshots", "snapshot.list"),
    r("POST", "/v1/sandboxes/{id}/snapshots", "snapshot.create"),
    r("POST", "/v1/sandboxes/{id}/rollback", "snapshot.rollback"),
    r("GET", "/v1/volumes", "volume.list"),
    r("POST", "/v1/volumes", "volume.create"),
    r("GET", "/v1/volumes/{name}", "volume.get"),
    r("DELETE", "/v1/volumes/{name}", "volume.delete"),
    r("GET", "/v1/volumes/{name}/files", "volume_files.download"),
    r("PUT", "/v1/volumes/{name}/files", "volume_files.upload"),
    r("DELETE", "/v1/volumes/{name}/files", "volume_files.remove"),
    r("GET", "/v1/volumes/{name}/files/list", "volume_files.list"),
    r("GET", "/v1/volumes/{name}/files/stat", "volume_files.stat"),
    r(
        "POST",
        "/v1/volumes/{name}/files/mkdir",
        "volume_files.mkdir",
    ),
    r(
        "POST",
        "/v1/volumes/{name}/files/rename",
        "volume_files.rename",
    ),
    r("GET", "/v1/audit", "audit.list"),
    r("GET", "/v1/tenants", "tenant.list"),
    r("POST", "/v1/tenants", "tenant.create"),
    r("PATCH", "/v1/tenants/{name}", "tenant.update"),
    r(
        "GET",
        "/v1/tenants/{name}/master-key",
        "tenant.master_key.get",
    ),
    r(
        "PUT",
        "/v1/tenants/{name}/master-key",
        "tenant.master_key.set",
    ),
    r("GET", "/v1/tenants/{name}/keys", "key.list"),
    r("POST", "/v1/tenants/{name}/keys", "key.create"),
    r("DELETE", "/v1/keys/{key_id}", "key.revoke"),
    r("GET", "/v1/secrets", "secret.list"),
    r("PUT", "/v1/secrets/{name}", "secret.set"),
    r("DELETE", "/v1/secrets/{name}", "secret.delete"),
    r("GET", "/v1/sandboxes/{id}/egress", "egress.get"),
    r("PUT", "/v1/sandboxes/{id}/egress", "egress.update"),
    r("POST", "/v1/sandboxes/{id}/browser", "browser.start"),
    r("GET", "/v1/sandboxes/{id}/browser/cdp", "browser.cdp"),
    r("POST", "/v1/sandboxes/{id}/browser/fill", "browser.fill"),
    r("GET", BROWSER_LIVE, "browser.live"),
    r("POST", "/v1/sandboxes/{id}/ports", "port.expose"),
    r("GET", "/v1/sandboxes/{id}/ports", "port.list"),
    r("DELETE", "/v1/sandboxes/{id}/ports/{port}", "port.unexpose"),
    r("GET", PORT_PROXY, "port.proxy_get"),
    r("POST", PORT_PROXY, "port.proxy_post"),
    r("PUT", PORT_PROXY, "port.proxy_put"),
    r("PATCH", PORT_PROXY, "port.proxy_patch"),
    r("DELETE", PORT_PROXY, "port.proxy_delete"),
    r("POST", "/v1/cluster/join-tokens", "node.token"),
    r("POST", cluster_paths::JOIN_PATH, "node.join"),
    r("POST", cluster_paths::REJOIN_PATH, "node.rejoin"),
    r("POST", cluster_paths::HEARTBEAT_PATH, "node.heartbeat"),
    r("POST", cluster_paths::CLAIM_PATH, "node.claim"),
    r("POST", cluster_paths::AUDIT_PATH, "node.audit"),
    r("GET", "/v1/nodes", "node.list"),
    r("POST", "/v1/nodes/{id}/drain", "node.drain"),
    r("DELETE", "/v1/nodes/{id}", "node.remove"),
    r("GET", INGRESS, "ingress.get"),
    r("POST", INGRESS, "ingress.post"),
    r("PUT", INGRESS, "ingress.put"),
    r("PATCH", INGRESS, "ingress.patch"),
    r("DELETE", INGRESS, "ingress.delete"),
];

/// The authenticated port proxy; `{*path}` is the rest of the path, possibly empty.
pub const PORT_PROXY: &str = "/v1/sandboxes/{id}/ports/{port}/proxy/{*path}";
/// The live view of a sandbox's browser; `{*path}` is noVNC's page, files or WebSocket.
pub const BROWSER_LIVE: &str = "/v1/sandboxes/{id}/browser/live/{token}/{*path}";
/// The public ingress route; `{*path}` is the rest of the path, possibly empty.
pub const INGRESS: &str = "/ingress/{token}/{*path}";

/// Everything the handlers share.
pub struct AppState {
    /// The node doing the sandbox work, through the node API.
    pub node: Arc<dyn NodeApi>,
    /// Tenants, keys, ownership, audit.
    pub store: Arc<Store>,
    /// Request counters and latencies.
    pub metrics: Arc<Metrics>,
    /// Per-tenant quota locks.
    pub quotas: QuotaLocks,
    /// Largest file upload, in bytes.
    pub max_upload_bytes: u64,
    /// How long a template build VM may take to report ready.
    pub ready_timeout: Duration,
    /// Serializes template builds (each boots a VM).
    pub builds: tokio::sync::Mutex<()>,
    /// Where template uploads (build contexts, image archives) are kept on this server's
    /// disk; `None` on a cluster's replica, which keeps them in the object store
    /// ([`uploads`]).
    pub uploads_dir: Option<std::path::PathBuf>,
    /// Largest template upload, in bytes.
    pub max_template_upload_bytes: u64,
    /// The credentials vault.
    pub vault: Arc<crate::vault::Vault>,
    /// The base of ingress URLs (`https://space.example.com`), when configured; else
    /// `http://` plus the `Host` of the request that exposes a port.
    pub public_url: Option<String>,
    /// Each tenant's master key (with an object store only).
    pub masters: Option<Arc<crate::masters::TenantMasters>>,
    /// The tenant keys in the object store, for rotation onto another master (with an object
    /// store only).
    pub keyring: Option<Arc<space_archive::Keyring>>,
    /// The cluster this replica serves (`space control`); `None` on `space up`.
    pub cluster: Option<Arc<crate::cluster::Cluster>>,
    /// E2B compatibility.
    pub e2b: Arc<crate::e2b::E2bState>,
    /// The CA whose leaves the listener presents for TLS, PEM (`None`: no TLS, or the
    /// operator's certificate).
    pub ca_pem: Option<String>,
}

/// The shared state as handlers see it.
pub type Shared = Arc<AppState>;

impl AppState {
    /// Records an audit event of `who` (failures to record are logged, never answered).
    pub async fn audit(
        &self,
        who: &Principal,
        sandbox: Option<&str>,
        operation: &str,
        outcome: Option<&ApiError>,
        detail: Option<String>,
    ) {
        let event = NewAuditEvent {
            tenant: Some(who.tenant.clone()),
            key_id: Some(who.key_id.clone()),
            sandbox: sandbox.map(str::to_owned),
            operation: operation.to_owned(),
            result: outcome.map_or("ok", |e| e.code).to_owned(),
            detail: outcome.map(|e| e.message.clone()).or(detail),
        };
        if let Err(e) = self.store.record(event).await {
            tracing::error!(error = %e, operation, "recording an audit event");
        }
    }

    /// Audits the outcome of `result` and passes it on.
    pub async fn audited<T>(
        &self,
        who: &Principal,
        sandbox: Option<&str>,
        operation: &str,
        result: ApiResult<T>,
    ) -> ApiResult<T> {
        self.audit(who, sandbox, operation, result.as_ref().err(), None)
            .await;
        result
    }

    /// A client for the guest of `id`, waking the sandbox first when it is Paused (resume) or
    /// Suspended (restore, from this node or the object store) and its `auto_resume` is on:
    /// the caller sees a slower first answer instead of a refusal. Each wake is audited as
    /// `sandbox.wake` (detail `resume` or `restore`), for `who` or, on a public ingress URL,
    /// for the sandbox's tenant.
    pub async fn guest(
        &self,
        who: Option<&Principal>,
        id: &SandboxId,
    ) -> ApiResult<space_proto::GuestClient> {
        let started = std::time::Instant::now();
        let (client, woke) = self
            .node
            .guest(id)
            .await
            .map_err(crate::error::node_error(id))?;
        if let Some(w) = woke {
            let detail = format!(
                "{} on access ({} ms)",
                w.as_str(),
                started.elapsed().as_millis()
            );
            let event = NewAuditEvent {
                tenant: match who {
                    Some(p) => Some(p.tenant.clone()),
                    None => self.store.sandbox_tenant(id.as_str()).await.ok().flatten(),
                },
                key_id: who.map(|p| p.key_id.clone()),
                sandbox: Some(id.to_string()),
                operation: "sandbox.wake".into(),
                result: "ok".into(),
                detail: Some(detail),
            };
            if let Err(e) = self.store.record(event).await {
                tracing::error!(error = %e, "recording an audit event");
            }
        }
        Ok(client)
    }

    /// The answer to a guest call on `id` that failed with `e`: see [`guest_failure`].
    pub async fn guest_failure(&self, id: &SandboxId, e: space_proto::ClientError) -> ApiError {
        guest_failure(&*self.node, id, e).await
    }

    /// The result of a guest call on `id`, its failure answered by [`Self::guest_failure`].
    pub async fn guest_call<T>(
        &self,
        id: &SandboxId,
        call: impl std::future::Future<Output = Result<T, space_proto::ClientError>>,
    ) -> ApiResult<T> {
        match call.await {
            Ok(v) => Ok(v),
            Err(e) => Err(self.guest_failure(id, e).await),
        }
    }

    /// Resolves a sandbox id of the caller's tenant: a malformed id is `400 invalid_id`;
    /// another tenant's sandbox answers exactly like a missing one.
    pub async fn scope(&self, who: &Principal, raw: &str) -> ApiResult<SandboxId> {
        let id: SandboxId = raw
            .parse()
            .map_err(|e: space_node_api::ids::IdError| ApiError::invalid_id(e.to_string()))?;
        match self.store.sandbox_tenant(id.as_str()).await? {
            Some(t) if t == who.tenant => Ok(id),
            _ => Err(ApiError::sandbox_not_found(id.as_str())),
        }
    }
}

/// The operation name of a matched route, for metrics.
pub fn operation_of(method: &Method, matched: Option<&str>) -> &'static str {
    static INDEX: OnceLock<HashMap<(&'static str, &'static str), &'static str>> = OnceLock::new();
    let index = INDEX.get_or_init(|| {
        ROUTES
            .iter()
            .map(|r| ((r.method, r.path), r.operation))
            .collect()
    });
    let Some(path) = matched else {
        return "route_not_found";
    };
    if let Some(op) = index.get(&(method.as_str(), path)) {
        return op;
    }
    // The proxies' forms with an empty rest of the path (and the ingress redirect) count as
    // the wildcard route.
    let wildcard = if path == "/ingress/{token}" {
        INGRESS.to_owned()
    } else {
        format!("{path}{{*path}}")
    };
    index
        .get(&(method.as_str(), wildcard.as_str()))
        .copied()
        .unwrap_or("method_not_allowed")
}

async fn track(State(state): State<Shared>, req: Request, next: Next) -> Response {
    let op = operation_of(
        req.method(),
        req.extensions()
            .get::<MatchedPath>()
            .map(MatchedPath::as_str),
    );
    let start = Instant::now();
    let sent_body = request_has_body(&req);
    let mut resp = next.run(req).await;
    state
        .metrics
        .observe(op, resp.status().as_u16(), start.elapsed().as_secs_f64());
    close_after_refusal(sent_body, &mut resp);
    resp
}

/// Whether an HTTP/1 request came with a body (`Content-Length` above 0, or chunked).
fn request_has_body(req: &Request) -> bool {
    let h1 = matches!(
        req.version(),
        axum::http::Version::HTTP_10 | axum::http::Version::HTTP_11
    );
    let length = req
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(0);
    h1 && (length > 0
        || req
            .headers()
            .contains_key(axum::http::header::TRANSFER_ENCODING))
}

/// A refusal (4xx, 5xx) usually comes before the request's body was read, and an HTTP/1
/// connection with an unread body is closed after the answer. Saying so
/// (`Connection: close`) keeps a client from sending its next request on it, which would be
/// lost when it closes.
fn close_after_refusal(sent_body: bool, resp: &mut Response) {
    let status = resp.status();
    if sent_body && (status.is_client_error() || status.is_server_error()) {
        resp.headers_mut().insert(
            axum::http::header::CONNECTION,
            axum::http::HeaderValue::from_static("close"),
        );
    }
}

async fn not_found(method: Method, uri: Uri, headers: axum::http::HeaderMap) -> Response {
    if crate::e2b::is_e2b_request(uri.path(), &headers) {
        return crate::e2b::unserved(
            axum::http::StatusCode::NOT_FOUND,
            method.as_str(),
            uri.path(),
        );
    }
    ApiError::route_not_found(method.as_str(), uri.path()).into_response()
}

async fn wrong_method(method: Method, uri: Uri, headers: axum::http::HeaderMap) -> Response {
    if crate::e2b::is_e2b_request(uri.path(), &headers) {
        return crate::e2b::unserved(
            axum::http::StatusCode::METHOD_NOT_ALLOWED,
            method.as_str(),
            uri.path(),
        );
    }
    ApiError::method_not_allowed(method.as_str(), uri.path()).into_response()
}

async fn health(State(state): State<Shared>) -> Response {
    match state.node.status().await {
        Ok(s) => Json(serde_json::json!({
            "status": "ok",
            "version": env!("CARGO_PKG_VERSION"),
            "accelerator": s.accelerator,
        }))
        .into_response(),
        Err(e) => ApiError::from(e).into_response(),
    }
}

/// `GET /v1/tls/ca.pem`: the CA to trust for the listener's TLS (the hosts of sandbox ports).
async fn tls_ca(State(state): State<Shared>) -> Response {
    match &state.ca_pem {
        Some(pem) => (
            [(header::CONTENT_TYPE, "application/x-pem-file")],
            pem.clone(),
        )
            .into_response(),
        None => ApiError::new(
            axum::http::StatusCode::NOT_FOUND,
            "not_found",
            "this server presents no certificate of its own CA (TLS is off, or the operator's \
             certificate is used)",
        )
        .into_response(),
    }
}

async fn openapi() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        openapi::served(),
    )
        .into_response()
}

async fn metrics(State(state): State<Shared>) -> Response {
    let mut by_state: BTreeMap<String, u64> = BTreeMap::new();
    match state.node.list().await {
        Ok(all) => {
            for r in all {
                *by_state.entry(r.state.as_str().to_owned()).or_default() += 1;
            }
        }
        Err(e) => tracing::warn!(error = %e, "listing sandboxes for metrics"),
    }
    let pools = match state.node.pools().await {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(error = %e, "listing pools for metrics");
            Vec::new()
        }
    };
    let mut text = state.metrics.render(&by_state, &pools);
    if state.cluster.is_some() {
        match state.store.nodes().await {
            Ok(nodes) => text.push_str(&crate::metrics::render_nodes(&nodes)),
            Err(e) => tracing::warn!(error = %e, "listing nodes for metrics"),
        }
    }
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// The API router over `state`; JSON bodies are limited to `max_body_bytes`. It serves MCP
/// at `/mcp` too, whose tools call the service layer in process.
pub fn router(state: Shared, max_body_bytes: usize) -> Router {
    let mcp = crate::mcp::routes(state.clone());
    build(state, max_body_bytes, mcp)
}

fn build(state: Shared, max_body_bytes: usize, mcp: Router<Shared>) -> Router {
    use admin as a;
    use cluster as c;
    use files as f;
    use net as n;
    use sandboxes as s;
    use streams as x;
    use templates as t;
    use volumes as v;
    let router = Router::new()
        .route("/v1/health", get(health))
        .route("/v1/openapi.json", get(openapi))
        .route("/v1/tls/ca.pem", get(tls_ca))
        .route("/metrics", get(metrics))
        .route("/", get(crate::console::page))
        .route("/console/{*path}", get(crate::console::file))
        .route(
            "/v1/templates",
            get(t::list_templates).post(t::build_template),
        )
        .route("/v1/templates/{name}/{version}", delete(t::delete_template))
        .route("/v1/template-uploads", post(uploads::upload))
        .route("/v1/builds", get(t::list_builds))
        .route("/v1/builds/{id}", get(t::get_build))
        .route("/v1/builds/{id}/log", get(t::build_log))
        .route("/v1/sandboxes/{id}/template", post(t::save_template))
        .route("/v1/sandboxes", post(s::create).get(s::list))
        .route("/v1/sandboxes/{id}", get(s::get).delete(s::kill))
        .route("/v1/sandboxes/{id}/pause", post(s::pause))
        .route("/v1/sandboxes/{id}/resume", post(s::resume))
        .route("/v1/sandboxes/{id}/suspend", post(s::suspend))
        .route("/v1/sandboxes/{id}/restore", post(s::restore))
        .route("/v1/sandboxes/{id}/fork", post(s::fork))
        .route("/v1/sandboxes/{id}/timeouts", put(s::set_timeouts))
        .route("/v1/sandboxes/{id}/logs", get(s::logs))
        .route("/v1/sandboxes/{id}/metrics", get(s::metrics))
        .route("/v1/sandboxes/{id}/exec", post(x::exec))
        .route("/v1/sandboxes/{id}/exec/ws", get(x::exec_ws))
        .route("/v1/sandboxes/{id}/pty", get(x::pty))
        .route(
            "/v1/sandboxes/{id}/files",
            get(f::download).put(f::upload).delete(f::remove),
        )
        .route("/v1/sandboxes/{id}/files/list", get(f::list))
        .route("/v1/sandboxes/{id}/files/stat", get(f::stat))
        .route("/v1/sandboxes/{id}/files/mkdir", post(f::mkdir))
        .route("/v1/sandboxes/{id}/files/rename", post(f::rename))
        .route("/v1/sandboxes/{id}/files/watch", get(f::watch))
        .route(
            "/v1/sandboxes/{id}/snapshots",
            get(s::snapshots).post(s::snapshot),
        )
        .route("/v1/sandboxes/{id}/rollback", post(s::rollback))
        .route("/v1/volumes", get(v::list).post(v::create))
        .route("/v1/volumes/{name}", get(v::get).delete(v::delete))
        .route(
            "/v1/volumes/{name}/files",
            get(v::download).put(v::upload).delete(v::remove),
        )
        .route("/v1/volumes/{name}/files/list", get(v::list_dir))
        .route("/v1/volumes/{name}/files/stat", get(v::stat))
        .route("/v1/volumes/{name}/files/mkdir", post(v::mkdir))
        .route("/v1/volumes/{name}/files/rename", post(v::rename))
        .route("/v1/audit", get(a::audit))
        .route("/v1/tenants", get(a::list_tenants).post(a::create_tenant))
        .route("/v1/tenants/{name}", patch(a::update_tenant))
        .route(
            "/v1/tenants/{name}/master-key",
            get(a::get_master_key).put(a::put_master_key),
        )
        .route(
            "/v1/tenants/{name}/keys",
            get(a::list_keys).post(a::create_key),
        )
        .route("/v1/keys/{key_id}", delete(a::revoke_key))
        .route("/v1/secrets", get(n::list_secrets))
        .route(
            "/v1/secrets/{name}",
            put(n::put_secret).delete(n::delete_secret),
        )
        .route(
            "/v1/sandboxes/{id}/egress",
            get(n::get_egress).put(n::put_egress),
        )
        .route(
            "/v1/sandboxes/{id}/ports",
            post(n::expose).get(n::list_ports),
        )
        .route("/v1/sandboxes/{id}/ports/{port}", delete(n::unexpose))
        .route("/v1/sandboxes/{id}/browser", post(browser::start))
        .route("/v1/sandboxes/{id}/browser/cdp", get(browser::cdp))
        .route("/v1/sandboxes/{id}/browser/fill", post(browser::fill))
        .route(BROWSER_LIVE, get(browser::live))
        .route("/v1/cluster/join-tokens", post(c::create_join_token))
        .route(cluster_paths::JOIN_PATH, post(c::join))
        .route(cluster_paths::REJOIN_PATH, post(c::rejoin))
        .route(cluster_paths::HEARTBEAT_PATH, post(c::heartbeat))
        .route(cluster_paths::CLAIM_PATH, post(c::claim))
        .route(cluster_paths::AUDIT_PATH, post(c::audit))
        .route("/v1/nodes", get(c::list_nodes))
        .route("/v1/nodes/{id}/drain", post(c::drain_node))
        .route("/v1/nodes/{id}", delete(c::remove_node))
        .route(
            "/v1/sandboxes/{id}/ports/{port}/proxy/",
            get(n::port_proxy_index)
                .post(n::port_proxy_index)
                .put(n::port_proxy_index)
                .patch(n::port_proxy_index)
                .delete(n::port_proxy_index),
        )
        .route(
            PORT_PROXY,
            get(n::port_proxy)
                .post(n::port_proxy)
                .put(n::port_proxy)
                .patch(n::port_proxy)
                .delete(n::port_proxy),
        )
        .route(
            "/ingress/{token}",
            get(n::ingress_root)
                .post(n::ingress_root)
                .put(n::ingress_root)
                .patch(n::ingress_root)
                .delete(n::ingress_root),
        )
        .route(
            "/ingress/{token}/",
            get(n::ingress_index)
                .post(n::ingress_index)
                .put(n::ingress_index)
                .patch(n::ingress_index)
                .delete(n::ingress_index),
        )
        .route(
            INGRESS,
            get(n::ingress)
                .post(n::ingress)
                .put(n::ingress)
                .patch(n::ingress)
                .delete(n::ingress),
        )
        .fallback(not_found)
        .method_not_allowed_fallback(wrong_method);
    let router = router.merge(mcp);
    crate::e2b::routes(router)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::e2b::dispatch,
        ))
        .layer(axum::extract::DefaultBodyLimit::max(max_body_bytes))
        .layer(axum::middleware::from_fn_with_state(state.clone(), track))
        .with_state(state)
}

/// The answer to a guest call on `id` that failed with `e`. When the connection broke under
/// the call because another request killed, paused or suspended the sandbox meanwhile, that
/// is what the caller is told (`409 conflict`, or the sandbox's 404 once it is gone), not a
/// guest fault: the call may or may not have taken effect. Any other failure is answered as
/// the guest's error.
pub(crate) async fn guest_failure(
    node: &dyn NodeApi,
    id: &SandboxId,
    e: space_proto::ClientError,
) -> ApiError {
    use space_node_api::State as S;
    use space_proto::{ClientError as C, ErrorKind as K};
    // The connection failing, here or (a node reached over the network) in the node's relay,
    // which answers that as an HTTP error that is no guest's.
    let cut = match &e {
        C::Closed | C::Transport(_) => true,
        C::Guest(p) => matches!(p.kind, K::Unreachable | K::Closed),
        _ => false,
    };
    if !cut {
        return e.into();
    }
    let state = match node.info(id).await {
        Ok(sb) => sb.state,
        Err(f) => return crate::error::node_error(id)(f),
    };
    let what = match state {
        S::Terminated => "killed",
        S::Paused => "paused",
        S::Suspended => "suspended",
        _ => return e.into(),
    };
    ApiError::conflict(format!(
        "sandbox {id} was {what} while this request ran (by another request or its timeout); \
         the request may or may not have taken effect"
    ))
}

/// `Some(b)` for a field that is present: null is refused (with `#[serde(default)]`, a missing
/// field stays `None`).
pub(crate) fn bool_present<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<bool>, D::Error> {
    <bool as serde::Deserialize>::deserialize(d).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

    #[test]
    fn refusals_of_requests_with_bodies_close_the_connection() {
        let post = |len: &str| {
            axum::http::Request::post("/v1/sandboxes")
                .header("content-length", len)
                .body(axum::body::Body::empty())
                .unwrap()
        };
        assert!(request_has_body(&post("12")));
        assert!(!request_has_body(&post("0")));
        let h2 = axum::http::Request::post("/x")
            .version(axum::http::Version::HTTP_2)
            .header("content-length", "12")
            .body(axum::body::Body::empty())
            .unwrap();
        assert!(!request_has_body(&h2));
        for (sent, status, closes) in [
            (true, StatusCode::UNAUTHORIZED, true),
            (true, StatusCode::BAD_GATEWAY, true),
            (true, StatusCode::OK, false),
            (false, StatusCode::UNAUTHORIZED, false),
        ] {
            let mut resp = Response::new(axum::body::Body::empty());
            *resp.status_mut() = status;
            close_after_refusal(sent, &mut resp);
            assert_eq!(
                resp.headers().get("connection").is_some(),
                closes,
                "{sent} {status}"
            );
        }
    }

    #[test]
    fn routes_are_unique_and_named() {
        let mut seen = std::collections::HashSet::new();
        for r in ROUTES {
            assert!(seen.insert((r.method, r.path)), "{r:?} twice");
            assert!(!r.operation.is_empty());
        }
        let ops: std::collections::HashSet<_> = ROUTES.iter().map(|r| r.operation).collect();
        assert_eq!(ops.len(), ROUTES.len(), "operation names repeat");
    }

    #[test]
    fn whole_numbers_are_integers_however_written() {
        assert_eq!(parse_whole::<u16>("255"), Some(255));
        assert_eq!(parse_whole::<u16>("255.0"), Some(255));
        assert_eq!(parse_whole::<u64>("1e3"), Some(1000));
        assert_eq!(parse_whole::<u16>("65536"), None);
        assert_eq!(parse_whole::<u16>("2.5"), None);
        assert_eq!(parse_whole::<u64>("-1"), None);
        assert_eq!(parse_whole::<u64>("inf"), None);
        assert_eq!(
            integral(serde_json::json!({"a": 253.0, "b": [1.5, -2.0], "c": "3.0"})),
            serde_json::json!({"a": 253, "b": [1.5, -2], "c": "3.0"})
        );
        // A large whole number written as a float is read exactly, not rounded onto a half.
        let big: serde_json::Value = serde_json::from_str("3699121262647158.0").unwrap();
        assert_eq!(integral(big), serde_json::json!(3699121262647158u64));
    }

    #[test]
    fn a_busy_path_is_a_conflict_not_a_server_error() {
        // rename("/", "/") in the guest is EBUSY.
        let e = ApiError::from(space_proto::ClientError::Guest(
            space_proto::ProtoError::new(space_proto::ErrorKind::Busy, "rename / to /"),
        ));
        assert_eq!((e.status, e.code), (StatusCode::CONFLICT, "conflict"));
    }
}
