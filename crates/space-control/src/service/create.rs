//! Creates: the template resolved once, the tenant's quota admitted, the sandbox recorded as
//! the tenant's, at most once per idempotency key; audited as `sandbox.create`.

use std::collections::BTreeMap;

use axum::http::StatusCode;
use sha2::Digest;
use space_api as api;
use space_node_api::{
    CreateRequest, Sandbox, SandboxId, SandboxOptions, TemplateName, TimeoutPolicy, VersionReq,
};

use super::Shared;
use crate::error::{ApiError, ApiResult};
use crate::quota::{self, Usage};
use crate::store::{CreateKey, Principal, TenantName};

/// Creates a sandbox for the caller (once per `key`, when one is given) and audits it.
pub async fn create(
    st: &Shared,
    who: &Principal,
    key: Option<&str>,
    new: NewSandbox,
) -> ApiResult<api::Sandbox> {
    let result = create_sandbox_once(st, &who.tenant, key, new).await;
    st.audit(
        who,
        result.as_ref().ok().map(|s| s.id.as_str()),
        "sandbox.create",
        result.as_ref().err(),
        None,
    )
    .await;
    Ok(super::sandboxes::view(&result?, who))
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
    pub volumes: Vec<api::VolumeMountSpec>,
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
    crate::api::net::check_header_secrets(st, tenant, &egress).await?;
    let secrets = crate::api::net::bindings(st, tenant, &body.secrets).await?;
    let volumes = super::volumes::mounts(st, tenant, &body.volumes).await?;
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
            volumes,
        },
        tenant: tenant.to_string(),
    };
    let guard = quota::admit(&st.quotas, st.node.as_ref(), &st.store, tenant, need).await?;
    let info = st.node.create(req).await?;
    own(st, &info.id, tenant).await?;
    drop(guard);
    Ok(info)
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

/// Records that `tenant` owns the new sandbox `id`; if that fails, the sandbox is discarded
/// (nobody could reach it, so nothing of it stays, as after a failed create) and the failure
/// answered.
pub(crate) async fn own(st: &Shared, id: &SandboxId, tenant: &TenantName) -> ApiResult<()> {
    if let Err(e) = st.store.add_sandbox(id.as_str(), tenant).await {
        tracing::error!(%id, error = %e, "recording a new sandbox's tenant; discarding it");
        if let Err(k) = st.node.discard(id).await {
            tracing::error!(%id, error = %k, "discarding a sandbox no tenant owns");
        }
        return Err(e.into());
    }
    Ok(())
}
