//! Sandbox lifecycle routes: create, list, get, kill, pause, resume, suspend, restore, fork,
//! timeouts, console logs, snapshots and rollback.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use schemars::JsonSchema;
use serde::{Deserialize, Deserializer};
use serde_json::{json, Value};
use sha2::Digest;
use space_node_api::Sandbox;
use space_node_api::{
    CreateRequest, SandboxId, SandboxOptions, SnapshotId, SnapshotKind, State as SbState,
    TemplateName, TimeoutAction, TimeoutPolicy, VersionReq,
};

use super::{ApiJson, ApiPath, ApiQuery, Caller, OptionalJson, Shared};
use crate::error::{node_error, ApiError, ApiResult};
use crate::quota::{self, Usage};
use crate::store::Principal;
use crate::store::{CreateKey, TenantName};

/// Console bytes `logs` returns by default.
pub const DEFAULT_LOG_TAIL: usize = 64 * 1024;
/// The most console bytes `logs` returns.
pub const MAX_LOG_TAIL: usize = 1024 * 1024;

/// The API's JSON form of a sandbox, for `who`: an admin also sees the cluster node that
/// holds it (`node`; absent on `space up`).
pub fn sandbox_json(r: &Sandbox, who: &Principal) -> Value {
    let mut v = sandbox_view(r, &who.tenant);
    if who.admin {
        if let Some(node) = &r.node {
            v["node"] = json!(node);
        }
    }
    v
}

/// What every caller sees of a sandbox.
fn sandbox_view(r: &Sandbox, tenant: &TenantName) -> Value {
    let ms = |d: Option<Duration>| d.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let t = &r.options.timeouts;
    json!({
        "id": r.id.as_str(),
        "tenant": tenant.as_str(),
        "template": r.template.name.as_str(),
        "template_version": r.template.version.as_str(),
        "state": r.state.as_str(),
        "vcpus": r.vcpus,
        "memory_mib": r.memory_mib,
        "disk_mib": r.disk_mib,
        "env": r.options.env,
        "metadata": r.options.metadata,
        "timeouts": {
            "idle_ms": ms(t.idle),
            "max_lifetime_ms": ms(t.max_lifetime),
            "action": match t.action {
                TimeoutAction::Suspend => "suspend",
                TimeoutAction::Kill => "kill",
            },
        },
        "egress": r.options.egress,
        "secrets": r.options.secrets.iter().map(|b| json!({
            "name": b.name,
            "placeholder": b.placeholder,
        })).collect::<Vec<_>>(),
        "forked_from": r.forked_from.as_ref().map(|(s, snap)| json!({
            "sandbox": s.as_str(),
            "snapshot": snap.as_str(),
        })),
        "failure": r.failure,
        "auto_resume": r.options.auto_resume,
        "restore_point": r.restore_point.as_ref().map(|p| json!({
            "snapshot": p.as_str(),
            "location": r.snapshot(p).map_or("lost", |s| s.location()),
        })),
        "created_unix_ms": r.created_unix_ms,
        "state_since_unix_ms": r.state_since_unix_ms,
        "last_activity_unix_ms": r.last_activity_unix_ms,
    })
}

/// `Some(v)` for a field that is present (`v` may be `None` for JSON null); used with
/// `#[serde(default)]`, so a missing field stays `None`.
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// Fields left out keep their value (on create: take the defaults, idle 15 min, no lifetime
/// limit, suspend); null means never.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "TimeoutsUpdate")]
pub struct TimeoutsBody {
    /// Milliseconds without activity before `action`; null: never.
    #[serde(default, deserialize_with = "present")]
    #[schemars(with = "Option<u64>", range(min = 1))]
    idle_ms: Option<Option<u64>>,
    /// Milliseconds from the create before `action`; null: never.
    #[serde(default, deserialize_with = "present")]
    #[schemars(with = "Option<u64>", range(min = 1))]
    max_lifetime_ms: Option<Option<u64>>,
    #[serde(default)]
    #[schemars(with = "Option<crate::api::shapes::TimeoutAction>")]
    action: Option<TimeoutAction>,
}

impl TimeoutsBody {
    /// `base` with the fields given here replaced.
    fn apply(&self, mut base: TimeoutPolicy) -> ApiResult<TimeoutPolicy> {
        for (name, field, slot) in [
            ("idle_ms", self.idle_ms, &mut base.idle),
            (
                "max_lifetime_ms",
                self.max_lifetime_ms,
                &mut base.max_lifetime,
            ),
        ] {
            match field {
                None => {}
                Some(Some(0)) => {
                    return Err(ApiError::invalid(format!(
                        "timeouts.{name} must be positive (null: never)"
                    )))
                }
                Some(v) => *slot = v.map(Duration::from_millis),
            }
        }
        if let Some(a) = self.action {
            base.action = a;
        }
        Ok(base)
    }
}

/// Body of `POST /v1/sandboxes`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "SandboxCreateRequest")]
pub struct CreateBody {
    #[schemars(with = "crate::api::shapes::Name")]
    template: String,
    /// The template's newest version when left out.
    #[serde(default)]
    #[schemars(with = "Option<crate::api::shapes::TemplateVersion>")]
    version: Option<String>,
    /// vCPUs (default: the template's).
    #[serde(default)]
    #[schemars(range(min = 1, max = 64))]
    vcpus: Option<u32>,
    /// Memory, MiB (default: the template's).
    #[serde(default)]
    #[schemars(range(min = 64, max = 1_048_576))]
    memory_mib: Option<u64>,
    /// The root disk, MiB: at least the template's image (`Template.image_mib`; a disk
    /// cannot shrink), at most the node's maximum (64 GiB by default). Default: the image's.
    #[serde(default)]
    #[schemars(range(min = 1, max = 65_536))]
    disk_mib: Option<u64>,
    /// Environment of every exec and PTY: names without `=` or NUL, values without NUL
    /// (256 KiB in all).
    #[serde(default)]
    #[schemars(extend(
        "propertyNames" = {"minLength": 1, "pattern": "^[^=\\u0000]+$"},
        "additionalProperties" = {"type": "string", "pattern": "^[^\\u0000]*$"}
    ))]
    env: BTreeMap<String, String>,
    /// Labels of the caller's own (64 KiB in all).
    #[serde(default)]
    metadata: BTreeMap<String, String>,
    #[serde(default, deserialize_with = "super::object_opt")]
    #[schemars(with = "Option<TimeoutsBody>")]
    timeouts: Option<TimeoutsBody>,
    /// Secrets of the tenant's vault to bind, each once: each gets a fresh placeholder in
    /// the environment variable of its name; the gateway replaces it on requests to the
    /// secret's hosts.
    #[serde(default)]
    #[schemars(
        with = "Vec<crate::api::shapes::SecretName>",
        extend("uniqueItems" = true)
    )]
    secrets: Vec<String>,
    #[serde(default, deserialize_with = "super::object_opt")]
    #[schemars(with = "Option<crate::api::shapes::EgressPolicy>")]
    egress: Option<space_node_api::policy::EgressPolicy>,
    #[serde(default)]
    auto_resume: Option<bool>,
}

fn created(v: Value) -> Response {
    (StatusCode::CREATED, Json(v)).into_response()
}

/// `POST /v1/sandboxes` (`Idempotency-Key` honoured)
pub async fn create(
    State(st): State<Shared>,
    Caller(who): Caller,
    headers: HeaderMap,
    ApiJson(body): ApiJson<CreateBody>,
) -> ApiResult<Response> {
    let result = match idempotency_key(&headers) {
        Ok(key) => create_inner(&st, &who, key.as_deref(), body).await,
        Err(e) => Err(e),
    };
    let sandbox = result
        .as_ref()
        .ok()
        .and_then(|v| v["id"].as_str().map(str::to_owned));
    st.audit(
        &who,
        sandbox.as_deref(),
        "sandbox.create",
        result.as_ref().err(),
        None,
    )
    .await;
    result.map(created)
}

async fn create_inner(
    st: &Shared,
    who: &Principal,
    key: Option<&str>,
    body: CreateBody,
) -> ApiResult<Value> {
    let timeouts = body
        .timeouts
        .as_ref()
        .map_or(Ok(TimeoutPolicy::default()), |b| {
            b.apply(TimeoutPolicy::default())
        })?;
    let new = NewSandbox {
        template: body.template,
        version: body.version,
        vcpus: body.vcpus,
        memory_mib: body.memory_mib,
        disk_mib: body.disk_mib,
        env: body.env,
        metadata: body.metadata,
        timeouts,
        secrets: body.secrets,
        egress: body.egress,
        auto_resume: body.auto_resume,
    };
    let info = create_sandbox_once(st, &who.tenant, key, new).await?;
    Ok(sandbox_json(&info, who))
}

/// What a create asks for, from either API.
#[derive(Debug, serde::Serialize)]
pub struct NewSandbox {
    pub template: String,
    pub version: Option<String>,
    pub vcpus: Option<u32>,
    pub memory_mib: Option<u64>,
    pub disk_mib: Option<u64>,
    pub env: BTreeMap<String, String>,
    pub metadata: BTreeMap<String, String>,
    pub timeouts: TimeoutPolicy,
    pub secrets: Vec<String>,
    pub egress: Option<space_node_api::policy::EgressPolicy>,
    pub auto_resume: Option<bool>,
}

/// Creates a sandbox for `tenant`: the template resolved once, the tenant's quota admitted,
/// the sandbox recorded as the tenant's.
pub async fn create_sandbox(
    st: &Shared,
    tenant: &TenantName,
    body: NewSandbox,
) -> ApiResult<Sandbox> {
    let name: TemplateName = body
        .template
        .parse()
        .map_err(|e: space_node_api::ids::IdError| ApiError::invalid_id(e.to_string()))?;
    let version: VersionReq = match &body.version {
        None => VersionReq::Latest,
        Some(v) => v
            .parse()
            .map_err(|e: space_node_api::ids::IdError| ApiError::invalid_id(e.to_string()))?,
    };
    super::templates::check_visible(st, tenant, name.as_str()).await?;
    // The template is resolved once: the create names the exact build it was sized by.
    let t = st.node.template(&name, &version).await?;
    let timeouts = body.timeouts;
    let need = Usage {
        sandboxes: 1,
        vcpus: body.vcpus.unwrap_or(t.vcpus),
        memory_mib: body.memory_mib.unwrap_or(t.memory_mib),
    };
    let egress = body.egress.unwrap_or_default();
    egress.validate().map_err(ApiError::invalid)?;
    let secrets = super::net::bindings(st, tenant, &body.secrets).await?;
    let req = CreateRequest {
        template: t.template.name.clone(),
        version: VersionReq::Exact(t.template.version.clone()),
        options: SandboxOptions {
            vcpus: body.vcpus,
            memory_mib: body.memory_mib,
            disk_mib: body.disk_mib,
            env: body.env,
            metadata: body.metadata,
            timeouts,
            egress,
            secrets,
            auto_resume: body.auto_resume.unwrap_or(true),
        },
        tenant: tenant.to_string(),
    };
    let guard = quota::admit(&st.quotas, st.node.as_ref(), &st.store, tenant, need).await?;
    let info = st.node.create(req).await?;
    own(st, &info.id, tenant).await?;
    drop(guard);
    Ok(info)
}

/// The `Idempotency-Key` header of a create, if any: 1 to 255 visible ASCII characters.
pub fn idempotency_key(headers: &HeaderMap) -> ApiResult<Option<String>> {
    let Some(v) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let key = v.to_str().unwrap_or("");
    if key.is_empty() || key.len() > 255 || !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ApiError::invalid(
            "Idempotency-Key is 1 to 255 visible ASCII characters",
        ));
    }
    Ok(Some(key.to_owned()))
}

/// [`create_sandbox`] at most once per idempotency key of the tenant (for a day): a create
/// sent again with the key answers the sandbox the first one made, while that one runs a
/// conflict to try again (`create_in_progress`), and with a different request
/// `idempotency_key_reused`.
pub async fn create_sandbox_once(
    st: &Shared,
    tenant: &TenantName,
    key: Option<&str>,
    body: NewSandbox,
) -> ApiResult<Sandbox> {
    let Some(key) = key else {
        return create_sandbox(st, tenant, body).await;
    };
    let request = serde_json::to_vec(&body).map_err(|e| ApiError::internal(e.to_string()))?;
    let fingerprint = hex::encode(sha2::Sha256::digest(&request));
    match st.store.begin_create_key(tenant, key, &fingerprint).await? {
        CreateKey::Fresh => {
            let made = create_sandbox(st, tenant, body).await;
            let id = made.as_ref().ok().map(|s| s.id.as_str());
            if let Err(e) = st.store.finish_create_key(tenant, key, id).await {
                // The sandbox stands; only a retry of this create could make a second.
                tracing::error!(error = %e, ?id, "recording the sandbox of an idempotency key");
            }
            made
        }
        CreateKey::Done(id) => {
            let id: SandboxId = id
                .parse()
                .map_err(|e: space_node_api::ids::IdError| ApiError::internal(e.to_string()))?;
            st.node.info(&id).await.map_err(|_| {
                ApiError::new(
                    StatusCode::CONFLICT,
                    "idempotency_key_reused",
                    format!("the sandbox {id} this Idempotency-Key made is gone"),
                )
            })
        }
        CreateKey::Busy => Err(ApiError::new(
            StatusCode::CONFLICT,
            "create_in_progress",
            "a create with this Idempotency-Key is still running; send it again shortly",
        )),
        CreateKey::Mismatch => Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "idempotency_key_reused",
            "this Idempotency-Key was used for a create that asked for something else",
        )),
    }
}

/// Records that `tenant` owns the new sandbox `id`; if that fails, the sandbox is killed
/// (nobody could reach it) and the failure answered.
async fn own(st: &Shared, id: &SandboxId, tenant: &TenantName) -> ApiResult<()> {
    if let Err(e) = st.store.add_sandbox(id.as_str(), tenant).await {
        tracing::error!(%id, error = %e, "recording a new sandbox's tenant; killing it");
        if let Err(k) = st.node.kill(id).await {
            tracing::error!(%id, error = %k, "killing a sandbox no tenant owns");
        }
        return Err(e.into());
    }
    Ok(())
}

/// `GET /v1/sandboxes?state=S&template=T&metadata.K=V`
pub async fn list(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiQuery(query): ApiQuery<Vec<(String, String)>>,
) -> ApiResult<Json<Value>> {
    let mut state: Option<SbState> = None;
    let mut template: Option<String> = None;
    let mut metadata: Vec<(String, String)> = Vec::new();
    for (k, v) in query {
        if k == "state" {
            let s = crate::metrics::STATES
                .iter()
                .position(|s| *s == v)
                .ok_or_else(|| {
                    ApiError::invalid(format!(
                        "state {v:?} is not one of {}",
                        crate::metrics::STATES.join(", ")
                    ))
                })?;
            state = Some(
                [
                    SbState::Creating,
                    SbState::Running,
                    SbState::Paused,
                    SbState::Suspended,
                    SbState::Failed,
                    SbState::Terminated,
                ][s],
            );
        } else if k == "template" {
            if !TenantName::is_valid(&v) {
                return Err(ApiError::invalid_id(format!(
                    "template {:?} is not a template name ([a-z0-9][a-z0-9-]{{0,39}})",
                    v.chars().take(64).collect::<String>()
                )));
            }
            template = Some(v);
        } else if let Some(key) = k.strip_prefix("metadata.") {
            metadata.push((key.to_owned(), v));
        } else {
            return Err(ApiError::invalid(format!(
                "unknown filter {k:?}: use state, template or metadata.<key>"
            )));
        }
    }
    let filter = Filter {
        states: state.map(|s| vec![s]),
        template,
        metadata,
    };
    let out = list_sandboxes(&st, &who.tenant, &filter).await?;
    let list: Vec<Value> = out.iter().map(|r| sandbox_json(r, &who)).collect();
    Ok(Json(json!({ "sandboxes": list })))
}

/// Which sandboxes a listing answers.
#[derive(Debug, Default)]
pub struct Filter {
    /// Any of these states; `None`: every state but Terminated.
    pub states: Option<Vec<SbState>>,
    pub template: Option<String>,
    /// Every one of these metadata pairs.
    pub metadata: Vec<(String, String)>,
}

/// The sandboxes of `tenant` that `filter` lets through, newest first.
pub async fn list_sandboxes(
    st: &Shared,
    tenant: &TenantName,
    filter: &Filter,
) -> ApiResult<Vec<Sandbox>> {
    let mut out: Vec<Sandbox> = Vec::new();
    // Terminated sandboxes are read only when asked for: the others are the node's live
    // ones, so a tenant's history does not make every listing read its records.
    let terminated = filter
        .states
        .as_ref()
        .is_some_and(|s| s.contains(&SbState::Terminated));
    let live: std::collections::HashSet<SandboxId> = if terminated {
        Default::default()
    } else {
        st.node.usage().await?.into_iter().map(|u| u.id).collect()
    };
    for id in st.store.sandboxes_of(tenant).await? {
        let Ok(id) = id.parse::<SandboxId>() else {
            continue;
        };
        if !terminated && !live.contains(&id) {
            continue;
        }
        let info = match st.node.info(&id).await {
            Ok(i) => i,
            Err(f) if f.code == space_node_api::FaultCode::NotFound => continue,
            Err(e) => return Err(e.into()),
        };
        let state_ok = match &filter.states {
            Some(s) => s.contains(&info.state),
            None => info.state != SbState::Terminated,
        };
        let template_ok = match &filter.template {
            Some(t) => info.template.name.as_str() == t,
            None => true,
        };
        let meta_ok = filter
            .metadata
            .iter()
            .all(|(k, v)| info.options.metadata.get(k) == Some(v));
        if state_ok && template_ok && meta_ok {
            out.push(info);
        }
    }
    out.sort_by(|a, b| (b.created_unix_ms, b.id.as_str()).cmp(&(a.created_unix_ms, a.id.as_str())));
    Ok(out)
}

/// `GET /v1/sandboxes/{id}`
pub async fn get(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(raw): ApiPath<String>,
) -> ApiResult<Json<Value>> {
    let id = st.scope(&who, &raw).await?;
    let info = st.node.info(&id).await.map_err(node_error(&id))?;
    Ok(Json(sandbox_json(&info, &who)))
}

/// Runs a lifecycle request on an owned sandbox, audits it, and answers the sandbox as it is
/// afterwards.
async fn lifecycle<F, Fut>(
    st: &Shared,
    who: &crate::store::Principal,
    raw: &str,
    operation: &'static str,
    op: F,
) -> ApiResult<Json<Value>>
where
    F: FnOnce(Shared, SandboxId) -> Fut,
    Fut: std::future::Future<Output = ApiResult<()>>,
{
    let id = scoped(st, who, raw, operation).await?;
    let result = async {
        op(st.clone(), id.clone()).await?;
        let info = st.node.info(&id).await.map_err(node_error(&id))?;
        Ok(Json(sandbox_json(&info, who)))
    }
    .await;
    st.audited(who, Some(id.as_str()), operation, result).await
}

/// [`super::AppState::scope`] for a lifecycle request: a refusal is audited too (with the
/// id as given), so attempts on other tenants' sandboxes leave a trace.
async fn scoped(
    st: &Shared,
    who: &crate::store::Principal,
    raw: &str,
    operation: &str,
) -> ApiResult<SandboxId> {
    let scoped = st.scope(who, raw).await;
    if let Err(e) = &scoped {
        st.audit(who, Some(raw), operation, Some(e), None).await;
    }
    scoped
}

/// `DELETE /v1/sandboxes/{id}`
pub async fn kill(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(raw): ApiPath<String>,
) -> ApiResult<Json<Value>> {
    lifecycle(&st, &who, &raw, "sandbox.kill", |st, id| async move {
        kill_sandbox(&st, &id).await
    })
    .await
}

/// Kills sandbox `id` and revokes its port URLs (a terminated sandbox has no ports).
pub async fn kill_sandbox(st: &Shared, id: &SandboxId) -> ApiResult<()> {
    st.node.kill(id).await.map_err(node_error(id))?;
    st.store.unexpose_all(id.as_str()).await?;
    Ok(())
}

/// `POST /v1/sandboxes/{id}/pause`
pub async fn pause(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(raw): ApiPath<String>,
) -> ApiResult<Json<Value>> {
    lifecycle(&st, &who, &raw, "sandbox.pause", |st, id| async move {
        st.node.pause(&id).await.map_err(node_error(&id))
    })
    .await
}

/// `POST /v1/sandboxes/{id}/resume`
pub async fn resume(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(raw): ApiPath<String>,
) -> ApiResult<Json<Value>> {
    lifecycle(&st, &who, &raw, "sandbox.resume", |st, id| async move {
        st.node.resume(&id).await.map_err(node_error(&id))
    })
    .await
}

/// `POST /v1/sandboxes/{id}/suspend`
pub async fn suspend(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(raw): ApiPath<String>,
) -> ApiResult<Json<Value>> {
    lifecycle(&st, &who, &raw, "sandbox.suspend", |st, id| async move {
        st.node.suspend(&id).await.map_err(node_error(&id))?;
        Ok(())
    })
    .await
}

/// `POST /v1/sandboxes/{id}/restore`
pub async fn restore(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(raw): ApiPath<String>,
) -> ApiResult<Json<Value>> {
    let tenant = who.tenant.clone();
    lifecycle(&st, &who, &raw, "sandbox.restore", |st, id| async move {
        restore_sandbox(&st, &tenant, &id).await
    })
    .await
}

/// Restores suspended sandbox `id` of `tenant`, within the tenant's quota.
pub async fn restore_sandbox(st: &Shared, tenant: &TenantName, id: &SandboxId) -> ApiResult<()> {
    let info = st.node.info(id).await.map_err(node_error(id))?;
    // Only a suspended sandbox restores; anything else is refused by the node below
    // without starting a VM, so it needs no room.
    let need = if info.state == SbState::Suspended {
        Usage {
            sandboxes: 0,
            vcpus: info.vcpus,
            memory_mib: info.memory_mib,
        }
    } else {
        Usage::default()
    };
    let _guard = quota::admit(&st.quotas, st.node.as_ref(), &st.store, tenant, need).await?;
    st.node.restore(id).await.map_err(node_error(id))
}

/// `POST /v1/sandboxes/{id}/fork`
pub async fn fork(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(raw): ApiPath<String>,
) -> ApiResult<Response> {
    let id = scoped(&st, &who, &raw, "sandbox.fork").await?;
    let result = async {
        let parent = st.node.info(&id).await.map_err(node_error(&id))?;
        let need = Usage {
            sandboxes: 1,
            vcpus: parent.vcpus,
            memory_mib: parent.memory_mib,
        };
        let guard =
            quota::admit(&st.quotas, st.node.as_ref(), &st.store, &who.tenant, need).await?;
        let child = st.node.fork(&id).await.map_err(node_error(&id))?;
        own(&st, &child.id, &who.tenant).await?;
        drop(guard);
        Ok(child)
    }
    .await;
    st.audit(
        &who,
        Some(id.as_str()),
        "sandbox.fork",
        result.as_ref().err(),
        result.as_ref().ok().map(|c| format!("child {}", c.id)),
    )
    .await;
    let child = result?;
    Ok(created(sandbox_json(&child, &who)))
}

/// `PUT /v1/sandboxes/{id}/timeouts`
pub async fn set_timeouts(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(raw): ApiPath<String>,
    ApiJson(body): ApiJson<TimeoutsBody>,
) -> ApiResult<Json<Value>> {
    lifecycle(
        &st,
        &who,
        &raw,
        "sandbox.set_timeouts",
        |st, id| async move {
            let info = st.node.info(&id).await.map_err(node_error(&id))?;
            let policy = body.apply(info.options.timeouts)?;
            st.node
                .set_timeouts(&id, policy)
                .await
                .map_err(node_error(&id))?;
            Ok(())
        },
    )
    .await
}

/// Query of `logs`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct LogsQuery {
    /// How many bytes from the end (at most 1 MiB; more is cut to 1 MiB).
    #[serde(default, deserialize_with = "super::whole_opt")]
    #[schemars(with = "Option<u64>", extend("default" = 65536))]
    tail_bytes: Option<u64>,
}

/// `GET /v1/sandboxes/{id}/logs?tail_bytes=N`
pub async fn logs(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(raw): ApiPath<String>,
    ApiQuery(q): ApiQuery<LogsQuery>,
) -> ApiResult<Response> {
    let id = st.scope(&who, &raw).await?;
    let n = q.tail_bytes.map_or(DEFAULT_LOG_TAIL, |n| {
        usize::try_from(n).unwrap_or(MAX_LOG_TAIL).min(MAX_LOG_TAIL)
    });
    let bytes = st
        .node
        .console_tail(&id, n)
        .await
        .map_err(node_error(&id))?;
    Ok((
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        String::from_utf8_lossy(&bytes.0).into_owned(),
    )
        .into_response())
}

/// `GET /v1/sandboxes/{id}/snapshots`
pub async fn snapshots(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(raw): ApiPath<String>,
) -> ApiResult<Json<Value>> {
    let id = st.scope(&who, &raw).await?;
    let list = st.node.info(&id).await.map_err(node_error(&id))?.snapshots;
    Ok(Json(json!({ "snapshots": list })))
}

/// Body of `POST /v1/sandboxes/{id}/snapshots`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "SnapshotCreateRequest")]
pub struct SnapshotBody {
    /// `disk` (the default) or `full` (memory too).
    #[serde(default)]
    #[schemars(with = "Option<crate::api::shapes::SnapshotKind>")]
    kind: Option<SnapshotKind>,
}

/// `POST /v1/sandboxes/{id}/snapshots`
pub async fn snapshot(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(raw): ApiPath<String>,
    OptionalJson(body): OptionalJson<SnapshotBody>,
) -> ApiResult<Response> {
    let id = scoped(&st, &who, &raw, "snapshot.create").await?;
    let kind = body.unwrap_or_default().kind.unwrap_or(SnapshotKind::Disk);
    let result = st.node.snapshot(&id, kind).await.map_err(node_error(&id));
    st.audit(
        &who,
        Some(id.as_str()),
        "snapshot.create",
        result.as_ref().err(),
        result.as_ref().ok().map(|s| format!("snapshot {}", s.id)),
    )
    .await;
    Ok(created(json!(result?)))
}

/// Body of `POST /v1/sandboxes/{id}/rollback`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "RollbackRequest")]
pub struct RollbackBody {
    #[schemars(with = "crate::api::shapes::SnapshotId")]
    snapshot: String,
}

/// `POST /v1/sandboxes/{id}/rollback`
pub async fn rollback(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(raw): ApiPath<String>,
    ApiJson(body): ApiJson<RollbackBody>,
) -> ApiResult<Json<Value>> {
    let snap: SnapshotId = body
        .snapshot
        .parse()
        .map_err(|e: space_node_api::ids::IdError| ApiError::invalid_id(e.to_string()))?;
    lifecycle(&st, &who, &raw, "snapshot.rollback", |st, id| async move {
        // Looked up among this sandbox's own snapshots only.
        let info = st.node.info(&id).await.map_err(node_error(&id))?;
        if info.snapshot(&snap).is_none() {
            return Err(ApiError::snapshot_not_found(id.as_str(), snap.as_str()));
        }
        st.node.rollback(&id, &snap).await.map_err(node_error(&id))
    })
    .await
}
