//! E2B compatibility (`docs/e2b.md`): the unmodified E2B SDKs drive space through
//!
//! - the REST API ([`rest`]) on the main listener, with space API keys as `X-API-KEY`;
//! - envd, the in-sandbox API ([`envd`]): requests that carry `E2b-Sandbox-Id` (or whose
//!   host is `49983-{id}.{domain}`), Connect-protocol services ([`process`]) over the
//!   sandbox's guest;
//! - ports: a host `{port}-{id}.{domain}` reaches that port of the sandbox, as the SDKs'
//!   `get_host` names it.
//!
//! All of it is built on the service calls the `/v1` handlers use, so tenants, quotas, audit,
//! timeouts and wake on access behave the same. A replica keeps no E2B state of its own but a
//! cache of which sandboxes have E2B's default account.

pub mod builds;
pub mod connect;
pub mod envd;
pub mod files;
pub mod filesystem;
pub mod metrics;
pub mod network;
pub mod process;
pub mod rest;
pub mod secrets;
pub mod snapshots;
mod times;
pub mod volumes;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use space_node_api::SandboxId;

use crate::api::Shared;

/// The envd version reported: the SDKs' feature gates up to it are what this facade serves.
pub const ENVD_VERSION: &str = "0.6.4";
/// The port E2B's SDKs address envd on.
pub const ENVD_PORT: u16 = 49983;
/// The header that carries a sandbox's traffic token to its ports.
pub const TRAFFIC_TOKEN_HEADER: &str = "e2b-traffic-access-token";
/// Where the SDKs `PUT` the files of a template build's `copy` steps (signed URLs).
pub const TEMPLATE_FILES_PATH: &str = "/e2b/template-files";
/// The variable that sets the domain of E2B sandbox hosts.
pub const DOMAIN_ENV: &str = "SPACE_E2B_DOMAIN";
/// Sandboxes whose default account is remembered, at most.
const USER_CACHE: usize = 65_536;
/// How long what was read from a guest for a call (an account, the user and group names) is
/// reused by the next calls: an account made or renamed in the sandbox shows this much later.
const GUEST_FACTS_TTL: std::time::Duration = std::time::Duration::from_secs(5);

/// What the facade read from one sandbox's guest, and when.
struct Facts {
    at: std::time::Instant,
    accounts: HashMap<String, space_proto::Account>,
    names: Option<Arc<filesystem::Names>>,
}

/// What the facade needs beside the API's state.
pub struct E2bState {
    /// The domain of sandbox hosts (`{port}-{id}.{domain}`), as create answers name it.
    pub domain: String,
    vault: Arc<crate::vault::Vault>,
    default_user: Mutex<HashMap<SandboxId, bool>>,
    facts: Mutex<HashMap<SandboxId, Facts>>,
}

impl std::fmt::Debug for E2bState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("E2bState")
            .field("domain", &self.domain)
            .finish_non_exhaustive()
    }
}

impl E2bState {
    /// With the domain of `SPACE_E2B_DOMAIN`, else `localhost:<port>` of the listener (names
    /// under `localhost` resolve to loopback in browsers, curl and systemd's resolver).
    pub fn new(vault: Arc<crate::vault::Vault>, listen_port: u16) -> E2bState {
        let domain = std::env::var(DOMAIN_ENV)
            .ok()
            .map(|d| d.trim().trim_end_matches('.').to_ascii_lowercase())
            .filter(|d| !d.is_empty())
            .unwrap_or_else(|| format!("localhost:{listen_port}"));
        E2bState {
            domain,
            vault,
            default_user: Mutex::new(HashMap::new()),
            facts: Mutex::new(HashMap::new()),
        }
    }

    /// The envd access token of sandbox `id`: a MAC of its id under the vault key, the same
    /// on every replica, never stored.
    pub fn access_token(&self, id: &SandboxId) -> String {
        hex::encode(
            self.vault
                .mac("e2b envd access token", id.as_str().as_bytes()),
        )
    }

    /// The signature of an upload URL for `tenant`'s files of hash `hash` good until
    /// `expires` (ms since the Unix epoch).
    pub fn upload_signature(&self, tenant: &str, hash: &str, expires: u64) -> String {
        hex::encode(self.vault.mac(
            "e2b template files upload",
            format!("{tenant}\n{hash}\n{expires}").as_bytes(),
        ))
    }

    /// Whether `sig` is [`E2bState::upload_signature`]'s (compared in constant time).
    pub fn upload_signature_ok(&self, tenant: &str, hash: &str, expires: u64, sig: &str) -> bool {
        use subtle::ConstantTimeEq;
        let want = self.upload_signature(tenant, hash, expires);
        want.len() == sig.len() && bool::from(want.as_bytes().ct_eq(sig.as_bytes()))
    }

    /// The token that opens the ports of sandbox `id` when they are not public (E2B's
    /// `trafficAccessToken`, sent as `e2b-traffic-access-token`): a MAC of its id under the
    /// vault key, never stored.
    pub fn traffic_token(&self, id: &SandboxId) -> String {
        hex::encode(
            self.vault
                .mac("e2b traffic access token", id.as_str().as_bytes()),
        )
    }

    /// Whether `token` is [`E2bState::traffic_token`] of `id` (compared in constant time).
    pub fn traffic_token_ok(&self, id: &SandboxId, token: &str) -> bool {
        use subtle::ConstantTimeEq;
        let want = self.traffic_token(id);
        want.len() == token.len() && bool::from(want.as_bytes().ct_eq(token.as_bytes()))
    }

    /// Whether `token` is sandbox `id`'s (compared in constant time).
    pub fn token_ok(&self, id: &SandboxId, token: &str) -> bool {
        use subtle::ConstantTimeEq;
        let want = self.access_token(id);
        want.len() == token.len() && bool::from(want.as_bytes().ct_eq(token.as_bytes()))
    }

    fn users(&self) -> std::sync::MutexGuard<'_, HashMap<SandboxId, bool>> {
        self.default_user.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn has_default_user(&self, id: &SandboxId) -> Option<bool> {
        self.users().get(id).copied()
    }

    fn set_default_user(&self, id: &SandboxId, has: bool) {
        let mut m = self.users();
        if m.len() >= USER_CACHE {
            m.clear();
        }
        m.insert(id.clone(), has);
    }

    /// Runs `f` on sandbox `id`'s facts, fresh ones (empty) when they are older than
    /// [`GUEST_FACTS_TTL`].
    fn with_facts<T>(&self, id: &SandboxId, f: impl FnOnce(&mut Facts) -> T) -> T {
        let mut m = self.facts.lock().unwrap_or_else(|p| p.into_inner());
        let now = std::time::Instant::now();
        if m.len() >= USER_CACHE {
            m.retain(|_, f| now.duration_since(f.at) < GUEST_FACTS_TTL);
            if m.len() >= USER_CACHE {
                m.clear();
            }
        }
        let facts = m.entry(id.clone()).or_insert_with(|| Facts {
            at: now,
            accounts: HashMap::new(),
            names: None,
        });
        if now.duration_since(facts.at) >= GUEST_FACTS_TTL {
            *facts = Facts {
                at: now,
                accounts: HashMap::new(),
                names: None,
            };
        }
        f(facts)
    }

    /// The account `name` of sandbox `id`, if read lately.
    pub fn cached_account(&self, id: &SandboxId, name: &str) -> Option<space_proto::Account> {
        self.with_facts(id, |f| f.accounts.get(name).cloned())
    }

    /// Keeps an account just read from sandbox `id`.
    pub fn keep_account(&self, id: &SandboxId, account: &space_proto::Account) {
        self.with_facts(id, |f| {
            f.accounts.insert(account.name.clone(), account.clone());
        });
    }

    /// Sandbox `id`'s user and group names, if read lately.
    pub fn cached_names(&self, id: &SandboxId) -> Option<Arc<filesystem::Names>> {
        self.with_facts(id, |f| f.names.clone())
    }

    /// Keeps the names just read from sandbox `id`.
    pub fn keep_names(&self, id: &SandboxId, names: Arc<filesystem::Names>) {
        self.with_facts(id, |f| f.names = Some(names));
    }

    /// The sandbox and port a host names: `{port}-{id}.{domain}`.
    pub fn parse_host(&self, host: &str) -> Option<(u16, String)> {
        parse_host(&self.domain, host)
    }
}

fn parse_host(domain: &str, host: &str) -> Option<(u16, String)> {
    let host = host.to_ascii_lowercase();
    let label = host.strip_suffix(domain)?.strip_suffix('.')?;
    let (port, id) = label.split_once('-')?;
    let port: u16 = port.parse().ok().filter(|p| *p > 0)?;
    (!id.is_empty() && !id.contains('.')).then(|| (port, id.to_owned()))
}

/// The facade's state of the API's state.
pub fn state(st: &Shared) -> Arc<E2bState> {
    st.e2b.clone()
}

/// Path prefixes of E2B's REST API (none of them is space's own).
const E2B_PREFIXES: &[&str] = &[
    "/sandboxes",
    "/v2/",
    "/v3/",
    "/templates",
    "/volumes",
    "/volumecontent",
    "/snapshots",
    "/secrets",
    "/teams",
    "/api-keys",
    "/access-tokens",
];

/// Whether a request the router has no route for is an E2B client's: an E2B path, or E2B's
/// key header. Its error is then in E2B's shape, which the SDKs parse.
pub fn is_e2b_request(path: &str, headers: &axum::http::HeaderMap) -> bool {
    headers.contains_key("x-api-key")
        || E2B_PREFIXES
            .iter()
            .any(|p| path == p.trim_end_matches('/') || path.starts_with(p))
}

/// The answer to an E2B request for a route or method space does not serve, in E2B's shape.
pub fn unserved(
    status: axum::http::StatusCode,
    method: &str,
    path: &str,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let what = if status == axum::http::StatusCode::METHOD_NOT_ALLOWED {
        format!("{method} is not served on {path}")
    } else {
        format!("{method} {path} is not part of space's E2B API (docs/e2b.md)")
    };
    rest::E2bError::new(status, what).into_response()
}

/// E2B's REST routes, added to the API's router.
pub fn routes(r: Router<Shared>) -> Router<Shared> {
    r.route("/v2/sandboxes", post(rest::create).get(rest::list))
        .route("/sandboxes", post(rest::create))
        .route("/sandboxes/{id}", get(rest::get).delete(rest::kill))
        .route("/v2/sandboxes/{id}/connect", post(rest::connect))
        .route("/sandboxes/{id}/connect", post(rest::connect))
        .route("/sandboxes/{id}/timeout", post(rest::set_timeout))
        .route("/sandboxes/{id}/pause", post(rest::pause))
        .route("/sandboxes/metrics", get(metrics::many))
        .route("/sandboxes/{id}/metrics", get(metrics::one))
        .route("/templates/aliases/{alias}", get(rest::template_alias))
        .route("/sandboxes/{id}/snapshots", post(snapshots::create))
        .route("/snapshots", get(snapshots::list))
        .route(
            "/templates/{id}",
            axum::routing::delete(snapshots::delete_template),
        )
        .route("/sandboxes/{id}/fork", post(snapshots::fork))
        .route("/secrets", get(secrets::list).post(secrets::create))
        .route(
            "/secrets/{id}",
            get(secrets::get)
                .post(secrets::update)
                .delete(secrets::delete),
        )
        .route(
            "/templates/tags",
            post(rest::not_served).delete(rest::not_served),
        )
        .route("/templates/{id}/tags", get(rest::not_served))
        .route("/v3/templates", post(builds::request))
        .route("/templates/{id}/files/{hash}", get(builds::file_link))
        .route(
            &format!("{TEMPLATE_FILES_PATH}/{{hash}}"),
            axum::routing::put(builds::file_upload),
        )
        .route("/v2/templates/{id}/builds/{build}", post(builds::trigger))
        .route("/templates/{id}/builds/{build}/status", get(builds::status))
        .route(
            "/sandboxes/{id}/network",
            axum::routing::put(network::update),
        )
        .route("/volumes", post(volumes::create).get(volumes::list))
        .route("/volumes/{id}", get(volumes::get).delete(volumes::delete))
        .route(
            "/volumecontent/{id}/dir",
            get(volumes::list_dir).post(volumes::make_dir),
        )
        .route(
            "/volumecontent/{id}/path",
            get(volumes::stat)
                .patch(volumes::update_metadata)
                .delete(volumes::remove),
        )
        .route(
            "/volumecontent/{id}/file",
            get(volumes::read_file).put(volumes::write_file),
        )
}

/// Sends envd requests (by header or host) and sandbox-port hosts where they go, before the
/// API's own routes.
pub async fn dispatch(State(st): State<Shared>, req: Request, next: Next) -> Response {
    let e2b = state(&st);
    let by_header = req
        .headers()
        .get("e2b-sandbox-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let by_host = req
        .headers()
        .get(axum::http::header::HOST)
        .and_then(|v| v.to_str().ok())
        .and_then(|h| e2b.parse_host(h));
    let envd_id = match (&by_header, &by_host) {
        (Some(id), _) => Some(id.clone()),
        (None, Some((ENVD_PORT, id))) => Some(id.clone()),
        _ => None,
    };
    if let Some(id) = envd_id {
        let (parts, body) = req.into_parts();
        return envd::serve(
            st,
            e2b,
            &id,
            parts.method,
            parts.uri.path(),
            parts.uri.query(),
            parts.headers,
            axum::body::Body::new(body),
        )
        .await;
    }
    if let Some((port, id)) = by_host {
        let Ok(id) = id.parse::<SandboxId>() else {
            return envd::sandbox_gone(&id);
        };
        // A sandbox made public (as E2B creates make them) answers on its host to anyone;
        // another only to a request with its traffic token (403 without, as E2B answers).
        let info = match st.node.info(&id).await {
            Ok(sb) if rest::ports_public(&sb) => sb,
            Ok(sb) => {
                let token = req
                    .headers()
                    .get(TRAFFIC_TOKEN_HEADER)
                    .and_then(|v| v.to_str().ok());
                if !token.is_some_and(|t| e2b.traffic_token_ok(&id, t)) {
                    return rest::E2bError::new(
                        axum::http::StatusCode::FORBIDDEN,
                        format!(
                            "the ports of sandbox {id} are not public: send its \
                             trafficAccessToken as {TRAFFIC_TOKEN_HEADER}"
                        ),
                    )
                    .into_response();
                }
                sb
            }
            Err(_) => return envd::sandbox_gone(id.as_str()),
        };
        let rest = req.uri().path().trim_start_matches('/').to_owned();
        return crate::api::net::proxy_to(&st, None, &info, port, "", &rest, req, true)
            .await
            .unwrap_or_else(IntoResponse::into_response);
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_name_a_port_and_a_sandbox_under_the_domain() {
        let parse = parse_host;
        assert_eq!(
            parse("localhost:7070", "8000-sbx-1481ede9edc08bbf.localhost:7070"),
            Some((8000, "sbx-1481ede9edc08bbf".into()))
        );
        assert_eq!(
            parse("e.example.com", "49983-SBX-AB.E.example.com"),
            Some((49983, "sbx-ab".into()))
        );
        for host in [
            "localhost:7070",
            "sbx-1.localhost:7070",
            "0-sbx-1.localhost:7070",
            "x-sbx.localhost:7070",
            "8000-.localhost:7070",
            "8000-a.b.localhost:7070",
            "8000-sbx-1.otherlocalhost:7070",
        ] {
            assert_eq!(parse("localhost:7070", host), None, "{host}");
        }
    }
}
