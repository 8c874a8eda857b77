//! E2B's REST API for sandboxes (`docs/e2b.md`), on the same service calls as `/v1`: the
//! same tenants and keys (`X-API-KEY`), quotas, audit, timeouts and wake on access.
//!
//! E2B's sandbox maps onto a space sandbox so: its `timeout` is the maximum lifetime of the
//! current VM (no idle timeout), its end is `kill` unless `autoPause` (then `suspend`);
//! E2B's pause is persistent, so it is suspend; connect restores (or resumes) it; E2B's
//! `paused` state is space's Paused or Suspended.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use space_node_api::Sandbox;
use space_node_api::{SandboxId, State as SbState, TimeoutAction, TimeoutPolicy};

pub(crate) use super::times::{parse_rfc3339, rfc3339};
use super::{E2bState, ENVD_VERSION};
use crate::api::Shared;
use crate::error::{node_error, ApiError};
use crate::service::create::{self as creating, NewSandbox};
use crate::service::sandboxes::{self as service, Filter};
use crate::store::{NewAuditEvent, Principal};

/// The lifetime of a sandbox whose create names none (E2B's default).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// The template of a create that names none (E2B's default).
pub const DEFAULT_TEMPLATE: &str = "base";
/// Sandboxes per page of a listing, at most and by default.
pub const MAX_PAGE: usize = 100;
/// The metadata key that makes a sandbox's ports public on their `{port}-{id}.{domain}`
/// hosts (value `public`). E2B creates set it unless `network.allowPublicTraffic` is false;
/// E2B answers leave it out of the metadata they show.
pub const PORTS_KEY: &str = "space.e2b.ports";

/// An error as E2B's SDKs parse it: `{"code": <status>, "message"}`. `retry: false` adds
/// `Should-Retry: false`, which stops the Python SDK from sending a create again.
#[derive(Debug)]
pub struct E2bError {
    pub status: StatusCode,
    pub message: String,
    pub retry: bool,
    /// Seconds after which the request should be sent again (`Should-Retry: true`).
    pub retry_after: Option<u32>,
}

impl E2bError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> E2bError {
        E2bError {
            status,
            message: message.into(),
            retry: true,
            retry_after: None,
        }
    }

    pub(crate) fn not_found(id: &str) -> E2bError {
        E2bError::new(StatusCode::NOT_FOUND, format!("sandbox {id} not found"))
    }

    pub(crate) fn no_retry(mut self) -> E2bError {
        self.retry = false;
        self
    }
}

impl From<ApiError> for E2bError {
    fn from(e: ApiError) -> Self {
        // Over quota is "too many" for E2B (429); the rest keep their status.
        let status = if e.code == "quota_exceeded" {
            StatusCode::TOO_MANY_REQUESTS
        } else {
            e.status
        };
        let mut out = E2bError::new(status, e.message);
        // A create under the same idempotency key is running: the retry will find its sandbox.
        if e.code == "create_in_progress" {
            out.retry_after = Some(1);
        }
        out
    }
}

impl IntoResponse for E2bError {
    fn into_response(self) -> Response {
        let mut r = (
            self.status,
            Json(json!({"code": self.status.as_u16(), "message": self.message})),
        )
            .into_response();
        if let Some(after) = self.retry_after {
            r.headers_mut()
                .insert("should-retry", HeaderValue::from_static("true"));
            r.headers_mut()
                .insert("retry-after", HeaderValue::from(after));
        } else if !self.retry {
            r.headers_mut()
                .insert("should-retry", HeaderValue::from_static("false"));
        }
        r
    }
}

pub(crate) type E2bResult<T> = Result<T, E2bError>;

/// The caller of an E2B request: `X-API-KEY` is a space API key.
pub struct E2bCaller(pub Principal);

impl axum::extract::FromRequestParts<Shared> for E2bCaller {
    type Rejection = E2bError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        st: &Shared,
    ) -> Result<Self, E2bError> {
        let key = parts
            .headers
            .get("x-api-key")
            .and_then(|v| v.to_str().ok())
            .map(|k| format!("Bearer {}", k.trim()));
        match st.store.authenticate(key.as_deref()).await {
            Ok(p) => Ok(E2bCaller(p)),
            Err(e) => {
                let event = NewAuditEvent {
                    tenant: e.tenant().cloned(),
                    key_id: e.key_id().map(str::to_owned),
                    sandbox: None,
                    operation: "auth".into(),
                    result: "unauthorized".into(),
                    detail: Some(format!("E2B API: {e}")),
                };
                if let Err(e) = st.store.record(event).await {
                    tracing::error!(error = %e, "recording an authentication failure");
                }
                Err(E2bError::new(
                    StatusCode::UNAUTHORIZED,
                    format!("X-API-KEY is not a valid space API key: {e}"),
                ))
            }
        }
    }
}

/// A JSON body that answers E2B's error shape when it does not parse (and takes `{}` for
/// an empty body).
pub struct E2bJson<T>(pub T);

impl<T: serde::de::DeserializeOwned, S: Send + Sync> axum::extract::FromRequest<S> for E2bJson<T> {
    type Rejection = E2bError;

    async fn from_request(req: axum::extract::Request, st: &S) -> Result<Self, E2bError> {
        let bytes = axum::body::Bytes::from_request(req, st)
            .await
            .map_err(|e| E2bError::new(StatusCode::BAD_REQUEST, e.body_text()))?;
        let bytes: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
            b"{}"
        } else {
            &bytes
        };
        serde_json::from_slice(bytes)
            .map(E2bJson)
            .map_err(|e| E2bError::new(StatusCode::BAD_REQUEST, format!("invalid JSON body: {e}")))
    }
}

fn e2b_state(s: SbState) -> &'static str {
    match s {
        SbState::Paused | SbState::Suspended => "paused",
        _ => "running",
    }
}

/// When the sandbox's current VM ends by its lifetime (or, without one, never).
fn end_at(sb: &Sandbox) -> String {
    match sb.options.timeouts.max_lifetime {
        Some(l) => rfc3339(sb.started_unix_ms.saturating_add(l.as_millis() as u64)),
        None => "9999-12-31T23:59:59.000Z".into(),
    }
}

/// Whether sandbox `sb`'s ports answer anyone on their hosts (an E2B create that did not
/// say `allowPublicTraffic: false`).
pub(crate) fn ports_public(sb: &Sandbox) -> bool {
    sb.options.metadata.get(PORTS_KEY).map(String::as_str) == Some("public")
}

/// The fields every E2B sandbox answer has.
pub(crate) fn sandbox_json(e2b: &E2bState, sb: &Sandbox) -> Value {
    json!({
        "sandboxID": sb.id.as_str(),
        "templateID": sb.template.name.as_str(),
        "alias": sb.template.name.as_str(),
        "clientID": "space",
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": e2b.access_token(&sb.id),
        "trafficAccessToken": if ports_public(sb) {
            Value::Null
        } else {
            Value::String(e2b.traffic_token(&sb.id))
        },
        "domain": e2b.domain,
        "startedAt": rfc3339(sb.started_unix_ms.max(sb.created_unix_ms)),
        "endAt": end_at(sb),
        "cpuCount": sb.vcpus,
        "memoryMB": sb.memory_mib,
        "diskSizeMB": sb.disk_mib,
        "state": e2b_state(sb.state),
        "metadata": sb
            .options
            .metadata
            .iter()
            .filter(|(k, _)| k.as_str() != PORTS_KEY)
            .collect::<BTreeMap<_, _>>(),
        "lifecycle": {
            "onTimeout": match sb.options.timeouts.action {
                TimeoutAction::Suspend => "pause",
                TimeoutAction::Kill => "kill",
            },
            "autoResume": sb.options.auto_resume,
        },
        "volumeMounts": sb
            .options
            .volumes
            .iter()
            .map(|m| json!({"name": m.name, "path": m.path}))
            .collect::<Vec<_>>(),
    })
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct AutoResume {
    enabled: bool,
}

/// Body of `POST /v2/sandboxes` (fields the SDKs send that space does not act on, such as
/// `secure`, are accepted and ignored; see `docs/e2b.md`).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct CreateBody {
    #[serde(rename = "templateID")]
    template_id: Option<String>,
    timeout: Option<u64>,
    metadata: BTreeMap<String, String>,
    #[serde(rename = "envVars")]
    env_vars: BTreeMap<String, String>,
    #[serde(rename = "autoPause")]
    auto_pause: Option<bool>,
    #[serde(rename = "autoResume")]
    auto_resume: Option<AutoResume>,
    allow_internet_access: Option<bool>,
    network: Option<super::network::Network>,
    /// `false`: an automatic pause keeps the filesystem only (refused: see [`pause`]).
    #[serde(rename = "autoPauseMemory")]
    auto_pause_memory: Option<bool>,
    /// An MCP gateway in the sandbox (refused: space serves MCP itself).
    mcp: Option<Value>,
    #[serde(rename = "volumeMounts")]
    volume_mounts: Vec<E2bMount>,
}

/// One of `volumeMounts`: a volume by name, mounted at `path`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct E2bMount {
    name: String,
    path: String,
}

pub(crate) fn lifetime(seconds: u64) -> E2bResult<Duration> {
    if seconds == 0 {
        return Err(E2bError::new(
            StatusCode::BAD_REQUEST,
            "timeout must be at least one second",
        ));
    }
    Ok(Duration::from_secs(seconds))
}

/// `POST /v2/sandboxes` (and the older `POST /sandboxes`): 201 with the sandbox.
pub async fn create(
    State(st): State<Shared>,
    E2bCaller(who): E2bCaller,
    headers: HeaderMap,
    E2bJson(body): E2bJson<CreateBody>,
) -> Response {
    let e2b = super::state(&st);
    let result = async {
        let key = crate::api::sandboxes::idempotency_key(&headers)?;
        let timeout = match body.timeout {
            Some(s) => lifetime(s)?,
            None => DEFAULT_TIMEOUT,
        };
        if body.mcp.as_ref().is_some_and(|m| !m.is_null()) {
            return Err(E2bError::new(
                StatusCode::BAD_REQUEST,
                "the mcp option (an MCP gateway inside the sandbox) is not served: space serves \
                 MCP itself at /mcp (docs/mcp.md)",
            ));
        }
        if body.auto_pause_memory == Some(false) {
            return Err(E2bError::new(
                StatusCode::BAD_REQUEST,
                "a filesystem-only automatic pause is not served: space's pause keeps memory \
                 and filesystem (lifecycle mode \"full\")",
            ));
        }
        let network = body.network.unwrap_or_default();
        let egress = network
            .egress(&st, &who.tenant, body.allow_internet_access)
            .await?;
        let mut metadata = body.metadata;
        let public = network.allow_public_traffic.unwrap_or(true);
        if public {
            metadata.insert(PORTS_KEY.into(), "public".into());
        }
        let new = NewSandbox {
            template: body
                .template_id
                .clone()
                .unwrap_or_else(|| DEFAULT_TEMPLATE.into()),
            version: None,
            vcpus: None,
            memory_mib: None,
            disk_mib: None,
            env: body.env_vars,
            metadata,
            timeouts: TimeoutPolicy {
                idle: None,
                max_lifetime: Some(timeout),
                action: if body.auto_pause == Some(true) {
                    TimeoutAction::Suspend
                } else {
                    TimeoutAction::Kill
                },
            },
            secrets: Vec::new(),
            egress,
            auto_resume: Some(body.auto_resume.is_some_and(|a| a.enabled)),
            volumes: body
                .volume_mounts
                .iter()
                .map(|m| space_api::VolumeMountSpec {
                    name: m.name.clone(),
                    path: m.path.clone(),
                    read_only: false,
                })
                .collect(),
        };
        creating::create_sandbox_once(&st, &who.tenant, key.as_deref(), new)
            .await
            .map_err(E2bError::from)
    }
    .await;
    st.audit(
        &who,
        result.as_ref().ok().map(|s| s.id.as_str()),
        "sandbox.create",
        result
            .as_ref()
            .err()
            .map(|e| ApiError::new(e.status, "e2b", e.message.clone()))
            .as_ref(),
        Some("E2B API".into()),
    )
    .await;
    match result {
        Ok(sb) => (StatusCode::CREATED, Json(sandbox_json(&e2b, &sb))).into_response(),
        // A create is never sent again by the SDK's retries (a failure after the sandbox
        // existed must not make a second one), unless its idempotency key's create is
        // still running.
        Err(e) if e.retry_after.is_some() => e.into_response(),
        Err(e) => e.no_retry().into_response(),
    }
}

/// The caller's sandbox `raw` as it is now, or 404 (another tenant's, unknown, terminated).
pub(crate) async fn owned(
    st: &Shared,
    who: &Principal,
    raw: &str,
) -> E2bResult<(SandboxId, Sandbox)> {
    let id = st
        .scope(who, raw)
        .await
        .map_err(|_| E2bError::not_found(raw))?;
    let sb = st.node.info(&id).await.map_err(|f| match f.code {
        space_node_api::FaultCode::NotFound => E2bError::not_found(raw),
        _ => E2bError::from(ApiError::from(f)),
    })?;
    if matches!(sb.state, SbState::Terminated | SbState::Failed) {
        return Err(E2bError::not_found(raw));
    }
    Ok((id, sb))
}

/// Audits `operation` on `id` for `who`, with the outcome of `result`.
pub(crate) async fn audited<T>(
    st: &Shared,
    who: &Principal,
    id: &str,
    operation: &str,
    result: E2bResult<T>,
) -> E2bResult<T> {
    let err = result
        .as_ref()
        .err()
        .map(|e| ApiError::new(e.status, "e2b", e.message.clone()));
    st.audit(
        who,
        Some(id),
        operation,
        err.as_ref(),
        Some("E2B API".into()),
    )
    .await;
    result
}

/// `GET /sandboxes/{id}`
pub async fn get(
    State(st): State<Shared>,
    E2bCaller(who): E2bCaller,
    Path(raw): Path<String>,
) -> E2bResult<Json<Value>> {
    let (_, sb) = owned(&st, &who, &raw).await?;
    Ok(Json(sandbox_json(&super::state(&st), &sb)))
}

/// Sets the lifetime of sandbox `sb` so that it ends `timeout` from now.
pub(crate) async fn end_in(st: &Shared, sb: &Sandbox, timeout: Duration) -> E2bResult<()> {
    let now = space_node_api::sandbox::now_ms();
    let lived = Duration::from_millis(now.saturating_sub(sb.started_unix_ms));
    let policy = TimeoutPolicy {
        max_lifetime: Some(lived + timeout),
        ..sb.options.timeouts
    };
    st.node
        .set_timeouts(&sb.id, policy)
        .await
        .map_err(node_error(&sb.id))?;
    Ok(())
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct TimeoutBody {
    timeout: Option<u64>,
}

/// `POST /v2/sandboxes/{id}/connect` (and `/sandboxes/{id}/connect`): 200 for a sandbox
/// that ran, 201 for one this call woke (restored or resumed). A timeout only extends.
pub async fn connect(
    State(st): State<Shared>,
    E2bCaller(who): E2bCaller,
    Path(raw): Path<String>,
    E2bJson(body): E2bJson<TimeoutBody>,
) -> Response {
    let result = async {
        let (id, sb) = owned(&st, &who, &raw).await?;
        let woke = match sb.state {
            SbState::Suspended => {
                service::restore_sandbox(&st, &who.tenant, &id).await?;
                true
            }
            SbState::Paused => {
                st.node.resume(&id).await.map_err(node_error(&id))?;
                true
            }
            _ => false,
        };
        let mut sb = st.node.info(&id).await.map_err(node_error(&id))?;
        if let Some(s) = body.timeout {
            let wanted = lifetime(s)?;
            let now = space_node_api::sandbox::now_ms();
            let ends = sb
                .options
                .timeouts
                .max_lifetime
                .map(|l| sb.started_unix_ms.saturating_add(l.as_millis() as u64));
            if ends.is_some_and(|e| e < now.saturating_add(wanted.as_millis() as u64)) {
                end_in(&st, &sb, wanted).await?;
                sb = st.node.info(&id).await.map_err(node_error(&id))?;
            }
        }
        Ok((woke, sb))
    }
    .await;
    let result = audited(&st, &who, &raw, "sandbox.connect", result).await;
    match result {
        Ok((woke, sb)) => {
            let status = if woke {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            (status, Json(sandbox_json(&super::state(&st), &sb))).into_response()
        }
        Err(e) => e.into_response(),
    }
}

/// `DELETE /sandboxes/{id}`: 204.
pub async fn kill(
    State(st): State<Shared>,
    E2bCaller(who): E2bCaller,
    Path(raw): Path<String>,
) -> E2bResult<StatusCode> {
    let result = async {
        let (id, _) = owned(&st, &who, &raw).await?;
        service::kill_sandbox(&st, &id).await?;
        Ok(StatusCode::NO_CONTENT)
    }
    .await;
    audited(&st, &who, &raw, "sandbox.kill", result).await
}

/// `POST /sandboxes/{id}/timeout`: the sandbox ends `timeout` seconds from now (0: now). 204.
pub async fn set_timeout(
    State(st): State<Shared>,
    E2bCaller(who): E2bCaller,
    Path(raw): Path<String>,
    E2bJson(body): E2bJson<TimeoutBody>,
) -> E2bResult<StatusCode> {
    let result = async {
        // E2B's minimum is 0 here: the sandbox's time is up now, and its end (kill, or pause
        // with autoPause) follows at the timeout reconciler's next pass.
        let timeout = Duration::from_secs(body.timeout.ok_or_else(|| {
            E2bError::new(StatusCode::BAD_REQUEST, "timeout (seconds) is required")
        })?);
        let (_, sb) = owned(&st, &who, &raw).await?;
        end_in(&st, &sb, timeout).await?;
        Ok(StatusCode::NO_CONTENT)
    }
    .await;
    audited(&st, &who, &raw, "sandbox.set_timeouts", result).await
}

/// Body of `POST /sandboxes/{id}/pause`.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct PauseBody {
    /// `false`: keep the filesystem only (E2B's `mode="filesystem"`).
    memory: Option<bool>,
    /// Refuse the pause when the guest agent does not answer. A suspend here does not need
    /// the guest (it is the VMM's snapshot), so it is taken either way.
    #[allow(dead_code)]
    require_healthy_guest: Option<bool>,
}

/// `POST /sandboxes/{id}/pause`: suspends (memory and files kept, persistently). 204; 409
/// when it is paused already. A filesystem-only pause (`memory: false`) is refused (501), not
/// taken with memory: a suspend here always keeps the memory (`docs/e2b.md`).
pub async fn pause(
    State(st): State<Shared>,
    E2bCaller(who): E2bCaller,
    Path(raw): Path<String>,
    E2bJson(body): E2bJson<PauseBody>,
) -> E2bResult<StatusCode> {
    let result = async {
        if body.memory == Some(false) {
            return Err(E2bError::new(
                StatusCode::NOT_IMPLEMENTED,
                "a filesystem-only pause is not served: space's pause keeps memory and \
                 filesystem (pause with mode=\"full\")",
            )
            .no_retry());
        }
        let (id, sb) = owned(&st, &who, &raw).await?;
        if sb.state == SbState::Suspended {
            return Err(E2bError::new(
                StatusCode::CONFLICT,
                format!("sandbox {raw} is already paused"),
            ));
        }
        st.node.suspend(&id).await.map_err(node_error(&id))?;
        Ok(StatusCode::NO_CONTENT)
    }
    .await;
    audited(&st, &who, &raw, "sandbox.suspend", result).await
}

/// Decodes a percent-encoded string once (`+` stays `+`); `None` for broken escapes.
fn unescape(s: &str) -> Option<String> {
    space_proto::query::decode_component(s)
}

/// The metadata filter of a listing: `k=v&k2=v2`, each key and value escaped once more.
fn metadata_filter(raw: &str) -> E2bResult<Vec<(String, String)>> {
    let bad = || {
        E2bError::new(
            StatusCode::BAD_REQUEST,
            format!("metadata filter {raw:?} is not k=v&k2=v2"),
        )
    };
    let mut out = Vec::new();
    for pair in raw.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').ok_or_else(bad)?;
        let (k, v) = (unescape(k).ok_or_else(bad)?, unescape(v).ok_or_else(bad)?);
        // One more layer, as the SDKs encode it.
        out.push((unescape(&k).unwrap_or(k), unescape(&v).unwrap_or(v)));
    }
    Ok(out)
}

/// `GET /v2/sandboxes?metadata=&state=running,paused&order=desc|asc&startedAfter=&limit=
/// &nextToken=`: by start time, newest first unless `order=asc`, only those started at or after
/// `startedAfter`; `x-next-token` names where the next page starts.
pub async fn list(
    State(st): State<Shared>,
    E2bCaller(who): E2bCaller,
    Query(q): Query<Vec<(String, String)>>,
) -> E2bResult<Response> {
    let mut filter = Filter::default();
    let mut limit = MAX_PAGE;
    let mut after: Option<String> = None;
    let mut states: Option<Vec<SbState>> = None;
    let mut oldest_first = false;
    let mut started_after: Option<u64> = None;
    for (k, v) in &q {
        match k.as_str() {
            "metadata" => filter.metadata.extend(metadata_filter(v)?),
            "state" => {
                let mut s = Vec::new();
                for one in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                    match one {
                        "running" => s.extend([SbState::Running, SbState::Creating]),
                        "paused" => s.extend([SbState::Paused, SbState::Suspended]),
                        other => {
                            return Err(E2bError::new(
                                StatusCode::BAD_REQUEST,
                                format!("state {other:?} is not running or paused"),
                            ))
                        }
                    }
                }
                states = Some(s);
            }
            "limit" => limit = page_limit(v)?,
            "nextToken" => after = Some(v.clone()),
            "template" => filter.template = Some(v.clone()),
            "order" => {
                oldest_first = match v.as_str() {
                    "asc" => true,
                    "desc" => false,
                    other => {
                        return Err(E2bError::new(
                            StatusCode::BAD_REQUEST,
                            format!("order {other:?} is not asc or desc"),
                        ))
                    }
                }
            }
            "startedAfter" => {
                started_after = Some(parse_rfc3339(v).ok_or_else(|| {
                    E2bError::new(
                        StatusCode::BAD_REQUEST,
                        format!("startedAfter {v:?} is not an RFC 3339 time"),
                    )
                })?)
            }
            other => {
                return Err(E2bError::new(
                    StatusCode::BAD_REQUEST,
                    format!("unknown query parameter {other:?}"),
                ))
            }
        }
    }
    filter.states = Some(states.unwrap_or_else(|| {
        vec![
            SbState::Creating,
            SbState::Running,
            SbState::Paused,
            SbState::Suspended,
        ]
    }));
    let mut all = service::list_sandboxes(&st, &who.tenant, &filter).await?;
    // By start time as `startedAt` says it, newest first unless `order=asc`; the id breaks
    // ties so pages stay stable.
    let started = |s: &Sandbox| s.started_unix_ms.max(s.created_unix_ms);
    if let Some(after) = started_after {
        all.retain(|s| started(s) >= after);
    }
    all.sort_by(|a, b| {
        let o = started(a).cmp(&started(b)).then_with(|| a.id.cmp(&b.id));
        if oldest_first {
            o
        } else {
            o.reverse()
        }
    });
    let e2b = super::state(&st);
    paged(
        &all,
        |s| s.id.as_str(),
        after.as_deref(),
        limit,
        |s| sandbox_json(&e2b, s),
    )
}

/// A page size from `limit`: 1 to [`MAX_PAGE`].
pub(crate) fn page_limit(v: &str) -> E2bResult<usize> {
    v.parse::<usize>()
        .ok()
        .filter(|l| (1..=MAX_PAGE).contains(l))
        .ok_or_else(|| {
            E2bError::new(
                StatusCode::BAD_REQUEST,
                format!("limit must be 1 to {MAX_PAGE}"),
            )
        })
}

/// The page of `items` after the one whose key is `after` (the `nextToken` of the previous
/// page), at most `limit` of them, each as `json` makes it; `x-next-token` names the last one
/// when more follow.
pub(crate) fn paged<T>(
    items: &[T],
    key: impl Fn(&T) -> &str,
    after: Option<&str>,
    limit: usize,
    json: impl Fn(&T) -> Value,
) -> E2bResult<Response> {
    let start = match after {
        Some(t) => items
            .iter()
            .position(|i| key(i) == t)
            .map(|i| i + 1)
            .ok_or_else(|| {
                E2bError::new(
                    StatusCode::BAD_REQUEST,
                    format!("nextToken {t:?} is not valid"),
                )
            })?,
        None => 0,
    };
    let page: Vec<&T> = items.iter().skip(start).take(limit).collect();
    let body: Vec<Value> = page.iter().map(|i| json(i)).collect();
    let mut r = Json(body).into_response();
    if start + page.len() < items.len() {
        if let Some(last) = page.last() {
            if let Ok(v) = HeaderValue::from_str(key(last)) {
                r.headers_mut().insert("x-next-token", v);
            }
        }
    }
    Ok(r)
}

/// `GET /templates/aliases/{alias}`: 200 `{templateID, public}` when the caller may create
/// from template `alias` (its tenant's, or a shared one: `public`), else 404. Another
/// tenant's template is 404, not E2B's 403: its existence is not told.
pub async fn template_alias(
    State(st): State<Shared>,
    E2bCaller(who): E2bCaller,
    Path(alias): Path<String>,
) -> E2bResult<Json<Value>> {
    let visible = crate::service::templates::list(&st, &who).await?;
    match visible.iter().find(|t| t.name == alias) {
        Some(t) => Ok(Json(json!({
            "templateID": t.name,
            "public": t.owner.is_none(),
        }))),
        None => Err(E2bError::new(
            StatusCode::NOT_FOUND,
            format!("template {alias:?} not found"),
        )),
    }
}

/// Routes of E2B's API that space does not serve (`docs/e2b.md`): 501 in E2B's error shape.
pub async fn not_served(uri: axum::http::Uri) -> E2bError {
    let path = uri.path();
    let why = "space numbers template versions and keeps no tags";
    E2bError::new(
        StatusCode::NOT_IMPLEMENTED,
        format!("{path} is not served by space's E2B API: {why} (docs/e2b.md)"),
    )
    .no_retry()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_filters_decode_as_the_sdks_encode() {
        // What both SDKs send for {"user id": "a/b&c=d"}, once the query layer decoded it.
        let py = "user%2520id=a%252Fb%2526c%253Dd";
        assert_eq!(
            metadata_filter(py).unwrap(),
            [("user id".to_string(), "a/b&c=d".to_string())]
        );
        assert_eq!(
            metadata_filter("a=1&b=2").unwrap(),
            [("a".into(), "1".into()), ("b".into(), "2".into())]
        );
        assert!(metadata_filter("nope").is_err());
    }
}
