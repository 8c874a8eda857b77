//! `POST /v1/sandboxes`: the body, its checks and defaults, quotas, the create on a node,
//! the owner's record, and creates made once per `Idempotency-Key`.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use schemars::JsonSchema;
use serde::{Deserialize, Deserializer};
use serde_json::Value;
use sha2::Digest;
use space_node_api::{
    CreateRequest, Sandbox, SandboxId, SandboxOptions, TemplateName, TimeoutAction, TimeoutPolicy,
    VersionReq,
};

use super::super::{ApiJson, Caller, Shared};
use super::sandbox_json;
use crate::error::{ApiError, ApiResult};
use crate::quota::{self, Usage};
use crate::store::{CreateKey, Principal, TenantName};

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
    pub(super) fn apply(&self, mut base: TimeoutPolicy) -> ApiResult<TimeoutPolicy> {
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
    #[serde(default, deserialize_with = "crate::api::object_opt")]
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
    #[serde(default, deserialize_with = "crate::api::object_opt")]
    #[schemars(with = "Option<crate::api::shapes::EgressPolicy>")]
    egress: Option<space_node_api::policy::EgressPolicy>,
    #[serde(default)]
    auto_resume: Option<bool>,
}

pub(super) fn created(v: Value) -> Response {
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
    crate::api::templates::check_visible(st, tenant, name.as_str()).await?;
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
    let secrets = crate::api::net::bindings(st, tenant, &body.secrets).await?;
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
pub(super) async fn own(st: &Shared, id: &SandboxId, tenant: &TenantName) -> ApiResult<()> {
    if let Err(e) = st.store.add_sandbox(id.as_str(), tenant).await {
        tracing::error!(%id, error = %e, "recording a new sandbox's tenant; killing it");
        if let Err(k) = st.node.kill(id).await {
            tracing::error!(%id, error = %k, "killing a sandbox no tenant owns");
        }
        return Err(e.into());
    }
    Ok(())
}
