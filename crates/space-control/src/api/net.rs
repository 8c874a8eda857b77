//! The credentials vault (`/v1/secrets`), egress policies (`/v1/sandboxes/{id}/egress`),
//! exposed ports (`/v1/sandboxes/{id}/ports`) and the two ways in: the public ingress URL
//! (`/ingress/{token}/...`) and the authenticated proxy
//! (`/v1/sandboxes/{id}/ports/{port}/proxy/...`).
//!
//! Both ways in proxy HTTP/1.1 (WebSocket upgrades included) to `127.0.0.1:<port>` inside the
//! guest over a [`space_proto::client::TcpTunnel`]: the prefix is stripped, the query kept,
//! `Host` set to `localhost:<port>` and `X-Forwarded-*` added; the caller's API key never
//! reaches the sandbox.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use hyper_util::rt::TokioIo;
use rand::rngs::OsRng;
use rand::Rng as _;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{json, Value};
use sha2::{Digest as _, Sha256};
use space_node_api::policy::{EgressPolicy, EgressRule};
use space_node_api::{SandboxId, State as SbState};

use super::{ApiJson, ApiPath, Caller, Shared};
use crate::error::{node_error, ApiError, ApiResult};
use crate::service::ports::check_port;
use crate::store::TenantName;
use crate::vault::validate_secret_name;

/// Length of an ingress token (characters of `[A-Za-z0-9]`, about 190 bits).
pub const INGRESS_TOKEN_LEN: usize = 32;
/// The most ports one sandbox may expose.
pub const MAX_PORTS_PER_SANDBOX: usize = 64;

const TOKEN_ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

pub(crate) fn token_hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

pub(crate) fn new_token() -> String {
    let mut rng = OsRng;
    (0..INGRESS_TOKEN_LEN)
        .map(|_| char::from(TOKEN_ALPHABET[rng.gen_range(0..TOKEN_ALPHABET.len())]))
        .collect()
}

fn is_token(s: &str) -> bool {
    s.len() == INGRESS_TOKEN_LEN && s.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// Parses and canonicalizes host patterns (rule syntax).
pub fn parse_rules(hosts: &[String], what: &str) -> ApiResult<Vec<EgressRule>> {
    hosts
        .iter()
        .map(|h| {
            h.parse::<EgressRule>()
                .map_err(|e| ApiError::invalid(format!("{what}: {e}")))
        })
        .collect()
}

// ---- secrets ----

/// `GET /v1/secrets`
pub async fn list_secrets(State(st): State<Shared>, Caller(who): Caller) -> ApiResult<Json<Value>> {
    let list = st.vault.list(&who.tenant).await?;
    Ok(Json(json!({ "secrets": list })))
}

/// Body of `PUT /v1/secrets/{name}`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "SecretSetRequest")]
#[schemars(extend(
    "if" = {"properties": {"kind": {"const": "totp"}}, "required": ["kind"]},
    "then" = {"properties": {"value": {"anyOf": [
        {"pattern": "^[ \t=-]*(?:[A-Za-z2-7][ \t=-]*){16,206}$"},
        {"pattern": "^otpauth://totp/[^?#%]*\\?secret=[A-Za-z2-7]{16,206}=*(?:&(?:algorithm=(?:SHA1|SHA256|SHA512)|digits=[678]|period=(?:[1-9][0-9]?|[12][0-9]{2}|300)|issuer=[^&%]*))*$"}
    ]}}}
))]
pub struct SecretBody {
    /// At most 65536 bytes of UTF-8; for `kind: totp`, the seed in base32 or an
    /// `otpauth://totp/...` URI.
    #[schemars(length(min = 1))]
    value: String,
    /// `value` (default): sent as it is; `totp`: a one-time password seed, whose current
    /// code is sent.
    #[serde(default)]
    #[schemars(with = "Option<crate::api::shapes::SecretKind>")]
    kind: Option<space_node_api::secrets::SecretKind>,
    /// Where the gateway may send the value.
    #[schemars(
        with = "Vec<crate::api::shapes::EgressRule>",
        length(min = 1, max = 64)
    )]
    hosts: Vec<String>,
}

impl std::fmt::Debug for SecretBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretBody")
            .field("hosts", &self.hosts)
            .finish_non_exhaustive()
    }
}

/// `PUT /v1/secrets/{name}`: `201` for a new secret, `200` for a replaced one.
pub async fn put_secret(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(name): ApiPath<String>,
    ApiJson(body): ApiJson<SecretBody>,
) -> ApiResult<Response> {
    let result = async {
        validate_secret_name(&name)?;
        not_e2b_kept(&name)?;
        let rules = parse_rules(&body.hosts, "hosts")?;
        let hosts: Vec<String> = rules.iter().map(ToString::to_string).collect();
        Ok(st
            .vault
            .put(
                &who.tenant,
                &name,
                body.kind.unwrap_or_default(),
                body.value.as_bytes(),
                hosts,
            )
            .await?)
    }
    .await;
    st.audit(
        &who,
        None,
        "secret.set",
        result.as_ref().err(),
        result.as_ref().ok().map(|(info, created)| {
            format!(
                "secret={} kind={} {} hosts={}",
                info.name,
                info.kind.as_str(),
                if *created { "created" } else { "replaced" },
                info.hosts.join(",")
            )
        }),
    )
    .await;
    let (info, created) = result?;
    // Nodes that keep values in memory (a cluster's) ask for the new one.
    st.node.forget_secret(&info.name).await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(json!(info))).into_response())
}

/// The vault values of E2B's secrets (`_E2B_...`) change only with their records, through
/// E2B's `/secrets` (`docs/e2b.md`, *Secrets*).
fn not_e2b_kept(name: &str) -> ApiResult<()> {
    if name.starts_with("_E2B_") {
        return Err(ApiError::invalid(format!(
            "secret {name} holds the value of an E2B secret; change or delete it through \
             E2B's /secrets API"
        )));
    }
    Ok(())
}

fn secret_not_found(name: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "secret_not_found",
        format!("no secret {name} in this tenant"),
    )
}

/// `DELETE /v1/secrets/{name}`
pub async fn delete_secret(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(name): ApiPath<String>,
) -> ApiResult<StatusCode> {
    let result = async {
        validate_secret_name(&name)?;
        not_e2b_kept(&name)?;
        if st.vault.delete(&who.tenant, &name).await? {
            st.node.forget_secret(&name).await?;
            Ok(StatusCode::NO_CONTENT)
        } else {
            Err(secret_not_found(&name))
        }
    }
    .await;
    st.audit(
        &who,
        None,
        "secret.delete",
        result.as_ref().err(),
        Some(format!(
            "secret={}",
            name.chars().take(64).collect::<String>()
        )),
    )
    .await;
    result
}

/// Checks the header rules of `policy` against `tenant`'s vault: every secret a value names
/// exists, and each rule's host is one the secret may be sent to (covered by one of its host
/// patterns), so a rule cannot carry a value where a binding could not.
pub async fn check_header_secrets(
    st: &Shared,
    tenant: &TenantName,
    policy: &EgressPolicy,
) -> ApiResult<()> {
    for rule in &policy.headers {
        for name in rule.secrets() {
            let info = st
                .vault
                .info(tenant, name)
                .await?
                .ok_or_else(|| secret_not_found(name))?;
            let hosts = parse_rules(&info.hosts, "stored hosts")?;
            if !hosts.iter().any(|h| h.covers(&rule.host)) {
                return Err(ApiError::invalid(format!(
                    "header {} names secret {name}, which may not be sent to {} (it is bound \
                     to {})",
                    rule.name,
                    rule.host,
                    info.hosts.join(", ")
                )));
            }
        }
    }
    Ok(())
}

/// Resolves the secrets a create names into bindings with fresh placeholders; every name must
/// be a secret of `tenant`, and none may repeat.
pub async fn bindings(
    st: &Shared,
    tenant: &TenantName,
    names: &[String],
) -> ApiResult<Vec<space_node_api::SecretBinding>> {
    let mut out: Vec<space_node_api::SecretBinding> = Vec::new();
    for name in names {
        validate_secret_name(name)?;
        if out.iter().any(|b| &b.name == name) {
            return Err(ApiError::invalid(format!("secret {name} is named twice")));
        }
        let info = st
            .vault
            .info(tenant, name)
            .await?
            .ok_or_else(|| secret_not_found(name))?;
        let hosts = parse_rules(&info.hosts, "stored hosts")?;
        out.push(space_node_api::SecretBinding::new(name.clone(), hosts));
    }
    Ok(out)
}

// ---- egress policy ----

fn policy_json(p: &EgressPolicy) -> Value {
    json!(p)
}

/// `GET /v1/sandboxes/{id}/egress`
pub async fn get_egress(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(raw): ApiPath<String>,
) -> ApiResult<Json<Value>> {
    let id = st.scope(&who, &raw).await?;
    let info = st.node.info(&id).await.map_err(node_error(&id))?;
    Ok(Json(policy_json(&info.options.egress)))
}

/// `PUT /v1/sandboxes/{id}/egress`: replaces the policy; new connections use it at once.
pub async fn put_egress(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(raw): ApiPath<String>,
    ApiJson(policy): ApiJson<EgressPolicy>,
) -> ApiResult<Json<Value>> {
    let id = match st.scope(&who, &raw).await {
        Ok(id) => id,
        Err(e) => {
            st.audit(&who, Some(&raw), "egress.update", Some(&e), None)
                .await;
            return Err(e);
        }
    };
    let result = async {
        policy.validate().map_err(ApiError::invalid)?;
        check_header_secrets(&st, &who.tenant, &policy).await?;
        let info = st
            .node
            .set_egress(&id, policy.clone())
            .await
            .map_err(node_error(&id))?;
        Ok(info.options.egress)
    }
    .await;
    st.audit(
        &who,
        Some(id.as_str()),
        "egress.update",
        result.as_ref().err(),
        result.as_ref().ok().map(|p| {
            let rules = |v: &[EgressRule]| {
                v.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            };
            let headers: Vec<String> = p
                .headers
                .iter()
                .map(|h| format!("{}@{}", h.name, h.host))
                .collect();
            format!(
                "default={} allow={} deny={} headers={}",
                if p.default == space_node_api::policy::EgressDefault::Allow {
                    "allow"
                } else {
                    "deny"
                },
                rules(&p.allow),
                rules(&p.deny),
                headers.join(",")
            )
        }),
    )
    .await;
    Ok(Json(policy_json(&result?)))
}

// ---- exposed ports ----

/// Body of `POST /v1/sandboxes/{id}/ports`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "ExposeRequest")]
pub struct ExposeBody {
    /// A TCP port inside the sandbox.
    #[schemars(range(min = 1))]
    port: u16,
}

/// `POST /v1/sandboxes/{id}/ports`: exposes a port at a new URL (a port exposed already gets
/// a new URL; the old one stops working).
pub async fn expose(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(raw): ApiPath<String>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<ExposeBody>,
) -> ApiResult<Response> {
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    let exposed = crate::service::ports::expose(&st, &who, &raw, body.port, host).await?;
    Ok((StatusCode::CREATED, Json(exposed)).into_response())
}

/// `GET /v1/sandboxes/{id}/ports`: the exposed ports (never their URLs, which are shown once).
pub async fn list_ports(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(raw): ApiPath<String>,
) -> ApiResult<Json<Value>> {
    let id = st.scope(&who, &raw).await?;
    let list: Vec<Value> = st
        .store
        .ports(id.as_str())
        .await?
        .into_iter()
        .map(|p| json!({"port": p.port, "created_unix_ms": p.created_unix_ms}))
        .collect();
    Ok(Json(json!({ "ports": list })))
}

/// `DELETE /v1/sandboxes/{id}/ports/{port}`
pub async fn unexpose(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath((raw, port)): ApiPath<(String, String)>,
) -> ApiResult<StatusCode> {
    let port: u16 = super::parse_whole(&port)
        .ok_or_else(|| ApiError::invalid(format!("port {port:?} is not 1..65535")))?;
    let id = match st.scope(&who, &raw).await {
        Ok(id) => id,
        Err(e) => {
            st.audit(&who, Some(&raw), "port.unexpose", Some(&e), None)
                .await;
            return Err(e);
        }
    };
    let result = if st.store.unexpose_port(id.as_str(), port).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "port_not_found",
            format!("sandbox {id} does not expose port {port}"),
        ))
    };
    st.audit(
        &who,
        Some(id.as_str()),
        "port.unexpose",
        result.as_ref().err(),
        Some(format!("port={port}")),
    )
    .await;
    result
}

// ---- the ways in ----

fn ingress_not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        "no exposed port has this URL (it may have been revoked)",
    )
}

/// `ANY /ingress/{token}` : redirects to the same path with a trailing slash, so relative
/// links of the app inside resolve under the prefix.
pub async fn ingress_root(ApiPath(token): ApiPath<String>) -> Response {
    if !is_token(&token) {
        return ingress_not_found().into_response();
    }
    (
        StatusCode::PERMANENT_REDIRECT,
        [(header::LOCATION, format!("/ingress/{token}/"))],
    )
        .into_response()
}

/// `ANY /ingress/{token}/` (the empty rest of the path).
pub async fn ingress_index(
    State(st): State<Shared>,
    ApiPath(token): ApiPath<String>,
    req: Request,
) -> Response {
    ingress_inner(st, token, String::new(), req).await
}

/// `ANY /ingress/{token}/{*path}`: anyone holding the URL reaches the port.
pub async fn ingress(
    State(st): State<Shared>,
    ApiPath((token, rest)): ApiPath<(String, String)>,
    req: Request,
) -> Response {
    ingress_inner(st, token, rest, req).await
}

async fn ingress_inner(st: Shared, token: String, rest: String, req: Request) -> Response {
    if !is_token(&token) {
        return ingress_not_found().into_response();
    }
    let found = match st.store.port_by_token(&token_hash(&token)).await {
        Ok(Some(f)) => f,
        Ok(None) => return ingress_not_found().into_response(),
        Err(e) => return ApiError::from(e).into_response(),
    };
    let Ok(id) = found.0.sandbox.parse::<SandboxId>() else {
        return ingress_not_found().into_response();
    };
    let prefix = format!("/ingress/{token}");
    proxy(&st, None, &id, found.0.port, &prefix, &rest, req, true)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// `ANY /v1/sandboxes/{id}/ports/{port}/proxy/{*path}` with the tenant's key: the port,
/// whether exposed or not.
pub async fn port_proxy(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath((raw, port, rest)): ApiPath<(String, u16, String)>,
    req: Request,
) -> ApiResult<Response> {
    let id = st.scope(&who, &raw).await?;
    let prefix = format!("/v1/sandboxes/{id}/ports/{port}/proxy");
    proxy(
        &st,
        Some(&who),
        &id,
        check_port(port)?,
        &prefix,
        &rest,
        req,
        false,
    )
    .await
}

/// `ANY /v1/sandboxes/{id}/ports/{port}/proxy/` (the empty rest of the path).
pub async fn port_proxy_index(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath((raw, port)): ApiPath<(String, u16)>,
    req: Request,
) -> ApiResult<Response> {
    let id = st.scope(&who, &raw).await?;
    let prefix = format!("/v1/sandboxes/{id}/ports/{port}/proxy");
    proxy(
        &st,
        Some(&who),
        &id,
        check_port(port)?,
        &prefix,
        "",
        req,
        false,
    )
    .await
}

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Headers named in Connection are hop-by-hop too.
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in named {
        headers.remove(n);
    }
    for h in space_node_api::headers::HOP_BY_HOP {
        headers.remove(*h);
    }
}

fn upgrade_of(headers: &HeaderMap) -> Option<HeaderValue> {
    let wants = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    if wants {
        headers.get(header::UPGRADE).cloned()
    } else {
        None
    }
}

#[allow(clippy::too_many_arguments)]
pub(crate) async fn proxy(
    st: &Shared,
    who: Option<&crate::store::Principal>,
    id: &SandboxId,
    port: u16,
    prefix: &str,
    rest: &str,
    req: Request,
    public: bool,
) -> ApiResult<Response> {
    let info = st.node.info(id).await.map_err(node_error(id))?;
    proxy_to(st, who, &info, port, prefix, rest, req, public).await
}

/// [`proxy`] to a sandbox whose record the caller has read already.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn proxy_to(
    st: &Shared,
    who: Option<&crate::store::Principal>,
    info: &space_node_api::Sandbox,
    port: u16,
    prefix: &str,
    rest: &str,
    mut req: Request,
    public: bool,
) -> ApiResult<Response> {
    let id = &info.id;
    match info.state {
        // A sleeping sandbox is woken by the request (when its auto_resume allows).
        SbState::Running | SbState::Paused | SbState::Suspended => {}
        SbState::Terminated => {
            return Err(if public {
                ingress_not_found()
            } else {
                ApiError::new(
                    StatusCode::CONFLICT,
                    "illegal_state",
                    format!("sandbox {id} is terminated"),
                )
            })
        }
        s => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "illegal_state",
                format!("sandbox {id} is {s}; its ports answer only while it is running"),
            ))
        }
    }
    let guest = st.guest(who, id).await?;
    let tunnel = guest.tcp(port).await.map_err(|e| {
        ApiError::new(
            StatusCode::BAD_GATEWAY,
            "guest_error",
            format!(
                "port {port} of sandbox {id} did not answer: {}",
                crate::error::chain(&e)
            ),
        )
    })?;
    if let Err(e) = st.node.touch(id).await {
        tracing::debug!(%id, error = %e, "touching a sandbox for an ingress request");
    }
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tunnel))
        .await
        .map_err(|e| ApiError::guest(format!("port {port} of sandbox {id}: {e}")))?;
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "an ingress connection ended");
        }
    });

    let upgrade = upgrade_of(req.headers());
    let tls = crate::listen::over_tls(&req);
    let client_upgrade = upgrade.as_ref().map(|_| hyper::upgrade::on(&mut req));
    let (parts, body) = req.into_parts();
    let mut path_and_query = format!("/{rest}");
    if let Some(q) = parts.uri.query() {
        path_and_query.push('?');
        path_and_query.push_str(q);
    }
    let mut headers = parts.headers.clone();
    let original_host = headers.get(header::HOST).cloned();
    strip_hop_by_hop(&mut headers);
    // The tenant's key is for the API, not for the app inside.
    headers.remove(header::AUTHORIZATION);
    headers.insert(
        header::HOST,
        HeaderValue::from_str(&format!("localhost:{port}"))
            .map_err(|e| ApiError::internal(e.to_string()))?,
    );
    if let Some(h) = original_host {
        headers.insert("x-forwarded-host", h);
    }
    let proto = if tls { "https" } else { "http" };
    headers.insert("x-forwarded-proto", HeaderValue::from_static(proto));
    if let Ok(v) = HeaderValue::from_str(prefix) {
        headers.insert("x-forwarded-prefix", v);
    }
    if let Some(u) = &upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, u.clone());
    }
    let mut out = hyper::Request::builder()
        .method(parts.method.clone())
        .uri(&path_and_query)
        .version(http::Version::HTTP_11)
        .body(body)
        .map_err(|e| ApiError::invalid(format!("the request cannot be passed on: {e}")))?;
    *out.headers_mut() = headers;

    let mut resp = sender
        .send_request(out)
        .await
        .map_err(|e| ApiError::guest(format!("port {port} of sandbox {id}: {e}")))?;

    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        let Some(client_upgrade) = client_upgrade else {
            return Err(ApiError::guest(format!(
                "port {port} of sandbox {id} switched protocols unasked"
            )));
        };
        let upstream_upgrade = hyper::upgrade::on(&mut resp);
        let id = id.clone();
        tokio::spawn(async move {
            let (client, upstream) = match tokio::try_join!(client_upgrade, upstream_upgrade) {
                Ok(pair) => pair,
                Err(e) => {
                    tracing::debug!(%id, error = %e, "an ingress upgrade failed");
                    return;
                }
            };
            let mut client = TokioIo::new(client);
            let mut upstream = TokioIo::new(upstream);
            let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
        });
        let (parts, _) = resp.into_parts();
        return Ok(Response::from_parts(parts, Body::empty()));
    }

    let (mut parts, body) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    Ok(Response::from_parts(parts, Body::new(body)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_random_and_well_formed() {
        let a = new_token();
        let b = new_token();
        assert!(is_token(&a) && is_token(&b));
        assert_ne!(a, b);
        assert!(!is_token("short"));
        assert!(!is_token(&format!("{}-", &a[..31])));
        assert_eq!(token_hash(&a).len(), 64);
        assert_ne!(token_hash(&a), token_hash(&b));
    }

    #[test]
    fn hop_by_hop_headers_are_dropped() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-private"),
        );
        h.insert("x-private", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert("x-kept", HeaderValue::from_static("yes"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert_eq!(h["x-kept"], "yes");
        let mut ws = HeaderMap::new();
        ws.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, Upgrade"),
        );
        ws.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        assert_eq!(upgrade_of(&ws).unwrap(), "websocket");
        ws.insert(header::CONNECTION, HeaderValue::from_static("close"));
        assert!(upgrade_of(&ws).is_none());
    }
}
