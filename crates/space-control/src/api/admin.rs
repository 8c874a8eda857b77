//! Tenants and keys (admin), and the audit log.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{AdminCaller, ApiJson, ApiPath, ApiQuery, Caller, OptionalJson, Shared};
use crate::error::{ApiError, ApiResult};
use crate::keys;
use crate::masters::MasterKeyConfig;
use crate::store::{AuditFilter, Quotas, TenantName, DEFAULT_AUDIT_LIMIT, MAX_AUDIT_LIMIT};

fn tenant_name(raw: &str) -> ApiResult<TenantName> {
    raw.parse()
        .map_err(|e: crate::store::StoreError| ApiError::invalid_id(e.to_string()))
}

fn tenant_not_found(name: &TenantName) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "tenant_not_found",
        format!("no tenant {name}"),
    )
}

/// Quotas in a tenant create or update: fields left out keep their value (on create: take
/// the defaults).
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "QuotasUpdate")]
pub struct QuotasBody {
    /// Sandboxes that are not terminated (default 100).
    #[serde(default)]
    max_sandboxes: Option<u32>,
    /// vCPUs of the sandboxes with a VM (default 64).
    #[serde(default)]
    max_vcpus: Option<u32>,
    /// Memory of the sandboxes with a VM, MiB (default 65536).
    #[serde(default)]
    #[schemars(range(max = i64::MAX))]
    max_memory_mib: Option<u64>,
    /// How long a sandbox of the tenant may stay suspended before it is killed (audited as
    /// `sandbox.expire`), in ms; null: forever. In an update, null lifts the limit and leaving
    /// it out keeps it.
    #[serde(default, deserialize_with = "present")]
    #[schemars(with = "Option<u64>", range(max = i64::MAX))]
    max_suspended_ms: Option<Option<u64>>,
    /// The sizes of the tenant's volumes together, MiB (default 102400).
    #[serde(default)]
    #[schemars(range(max = i64::MAX))]
    max_volume_mib: Option<u64>,
}

fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<u64>>, D::Error> {
    Ok(Some(Option::<u64>::deserialize(d)?))
}

impl QuotasBody {
    /// `q` with the fields given here; a number past what the stores keep (a signed 64-bit
    /// integer) is refused.
    fn apply(&self, mut q: Quotas) -> ApiResult<Quotas> {
        let too_big =
            |field: &str| ApiError::invalid(format!("quotas.{field} is at most {}", i64::MAX));
        if self.max_memory_mib.is_some_and(|v| v > i64::MAX as u64) {
            return Err(too_big("max_memory_mib"));
        }
        if self.max_volume_mib.is_some_and(|v| v > i64::MAX as u64) {
            return Err(too_big("max_volume_mib"));
        }
        if self
            .max_suspended_ms
            .flatten()
            .is_some_and(|v| v > i64::MAX as u64)
        {
            return Err(too_big("max_suspended_ms"));
        }
        if let Some(v) = self.max_sandboxes {
            q.max_sandboxes = v;
        }
        if let Some(v) = self.max_vcpus {
            q.max_vcpus = v;
        }
        if let Some(v) = self.max_memory_mib {
            q.max_memory_mib = v;
        }
        if let Some(v) = self.max_suspended_ms {
            q.max_suspended_ms = v;
        }
        if let Some(v) = self.max_volume_mib {
            q.max_volume_mib = v;
        }
        Ok(q)
    }
}

/// Body of `PUT /v1/tenants/{name}/master-key`: a [`MasterKeyConfig`] with no field its
/// provider does not take (serde lets a unit variant ignore them).
pub struct MasterKeyBody(MasterKeyConfig);

impl<'de> Deserialize<'de> for MasterKeyBody {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        let deployment = v.get("provider").and_then(Value::as_str) == Some("deployment");
        if deployment && v.as_object().is_some_and(|o| o.len() != 1) {
            return Err(serde::de::Error::custom(
                "the deployment master key takes no field but provider",
            ));
        }
        MasterKeyConfig::deserialize(v)
            .map(MasterKeyBody)
            .map_err(serde::de::Error::custom)
    }
}

/// `GET /v1/tenants`
pub async fn list_tenants(
    State(st): State<Shared>,
    AdminCaller(_who): AdminCaller,
) -> ApiResult<Json<Value>> {
    Ok(Json(json!({ "tenants": st.store.tenants().await? })))
}

/// Body of `POST /v1/tenants`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "TenantCreateRequest")]
pub struct CreateTenantBody {
    #[schemars(with = "crate::api::shapes::Name")]
    name: String,
    #[serde(default, deserialize_with = "super::object_opt")]
    #[schemars(with = "Option<QuotasBody>")]
    quotas: Option<QuotasBody>,
}

/// `POST /v1/tenants`: the tenant and a first, non-admin key.
pub async fn create_tenant(
    State(st): State<Shared>,
    AdminCaller(who): AdminCaller,
    ApiJson(body): ApiJson<CreateTenantBody>,
) -> ApiResult<Response> {
    let name = tenant_name(&body.name)?;
    let quotas = body.quotas.unwrap_or_default().apply(Quotas::default())?;
    let result = st
        .store
        .create_tenant_with_key(&name, quotas, false, Some("first"))
        .await
        .map(|(tenant, key)| json!({"tenant": tenant, "key": key}))
        .map_err(ApiError::from);
    st.audit(
        &who,
        None,
        "tenant.create",
        result.as_ref().err(),
        Some(format!("tenant {name}")),
    )
    .await;
    Ok((StatusCode::CREATED, Json(result?)).into_response())
}

/// Body of `PATCH /v1/tenants/{name}`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "TenantUpdateRequest")]
pub struct UpdateTenantBody {
    #[serde(deserialize_with = "super::object")]
    #[schemars(with = "QuotasBody")]
    quotas: QuotasBody,
}

/// `PATCH /v1/tenants/{name}`
pub async fn update_tenant(
    State(st): State<Shared>,
    AdminCaller(who): AdminCaller,
    ApiPath(raw): ApiPath<String>,
    ApiJson(body): ApiJson<UpdateTenantBody>,
) -> ApiResult<Json<Value>> {
    let name = tenant_name(&raw)?;
    let result = async {
        let current = st
            .store
            .tenant(&name)
            .await?
            .ok_or_else(|| tenant_not_found(&name))?;
        let tenant = st
            .store
            .set_quotas(&name, body.quotas.apply(current.quotas)?)
            .await?;
        Ok::<_, ApiError>(json!(tenant))
    }
    .await;
    st.audit(
        &who,
        None,
        "tenant.update",
        result.as_ref().err(),
        Some(format!("tenant {name}")),
    )
    .await;
    result.map(Json)
}

fn master_json(config: &MasterKeyConfig, id: Option<String>) -> Value {
    let mut v = json!(config);
    v["id"] = json!(id);
    v
}

fn key_error(e: space_archive::KeyError) -> ApiError {
    match e {
        space_archive::KeyError::Store(s) => ApiError::new(
            StatusCode::BAD_GATEWAY,
            "archive_unavailable",
            s.to_string(),
        ),
        other => ApiError::new(StatusCode::FORBIDDEN, "key_unavailable", other.to_string()),
    }
}

fn archive_needed() -> ApiError {
    ApiError::conflict("this deployment has no object store, so no master keys".to_owned())
}

/// `GET /v1/tenants/{name}/master-key`
pub async fn get_master_key(
    State(st): State<Shared>,
    AdminCaller(_who): AdminCaller,
    ApiPath(raw): ApiPath<String>,
) -> ApiResult<Json<Value>> {
    let name = tenant_name(&raw)?;
    if st.store.tenant(&name).await?.is_none() {
        return Err(tenant_not_found(&name));
    }
    let masters = st.masters.as_ref().ok_or_else(archive_needed)?;
    let config = st.store.master_key_config(&name).await?;
    let id = masters.build(&config).ok().map(|m| m.id());
    Ok(Json(master_json(&config, id)))
}

/// `PUT /v1/tenants/{name}/master-key`: the tenant key is rewrapped from the current master
/// onto the new one (no data is rewritten), then the choice is recorded.
pub async fn put_master_key(
    State(st): State<Shared>,
    AdminCaller(who): AdminCaller,
    ApiPath(raw): ApiPath<String>,
    ApiJson(MasterKeyBody(body)): ApiJson<MasterKeyBody>,
) -> ApiResult<Json<Value>> {
    let name = tenant_name(&raw)?;
    let result = async {
        if st.store.tenant(&name).await?.is_none() {
            return Err(tenant_not_found(&name));
        }
        body.validate().map_err(ApiError::invalid)?;
        let masters = st.masters.as_ref().ok_or_else(archive_needed)?;
        let keyring = st.keyring.clone().ok_or_else(archive_needed)?;
        let old = masters
            .build(&st.store.master_key_config(&name).await?)
            .map_err(key_error)?;
        let new = masters.build(&body).map_err(key_error)?;
        if old.id() != new.id() {
            keyring
                .rotate(name.as_str(), old.as_ref(), new.as_ref())
                .await
                .map_err(key_error)?;
        }
        st.store.set_master_key_config(&name, &body).await?;
        Ok::<_, ApiError>((master_json(&body, Some(new.id())), old.id(), new.id()))
    }
    .await;
    let detail = match &result {
        Ok((_, old, new)) => format!("tenant {name}: master key {new} (was {old})"),
        Err(_) => format!("tenant {name}"),
    };
    st.audit(
        &who,
        None,
        "tenant.master_key",
        result.as_ref().err(),
        Some(detail),
    )
    .await;
    result.map(|(v, _, _)| Json(v))
}

/// `GET /v1/tenants/{name}/keys`
pub async fn list_keys(
    State(st): State<Shared>,
    AdminCaller(_who): AdminCaller,
    ApiPath(raw): ApiPath<String>,
) -> ApiResult<Json<Value>> {
    let name = tenant_name(&raw)?;
    if st.store.tenant(&name).await?.is_none() {
        return Err(tenant_not_found(&name));
    }
    Ok(Json(json!({ "keys": st.store.keys(&name).await? })))
}

/// Body of `POST /v1/tenants/{name}/keys`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "KeyCreateRequest")]
pub struct CreateKeyBody {
    /// An admin key (default false).
    #[serde(default)]
    admin: bool,
    /// A note for people: at most 200 characters, no control characters.
    #[serde(default)]
    #[schemars(length(max = 200), pattern(r"^[^\u0000-\u001f\u007f-\u009f]*$"))]
    label: Option<String>,
}

/// `POST /v1/tenants/{name}/keys`
pub async fn create_key(
    State(st): State<Shared>,
    AdminCaller(who): AdminCaller,
    ApiPath(raw): ApiPath<String>,
    OptionalJson(body): OptionalJson<CreateKeyBody>,
) -> ApiResult<Response> {
    let name = tenant_name(&raw)?;
    let body = body.unwrap_or_default();
    let result = async {
        if st.store.tenant(&name).await?.is_none() {
            return Err(tenant_not_found(&name));
        }
        Ok(st
            .store
            .create_key(&name, body.admin, body.label.as_deref())
            .await?)
    }
    .await;
    st.audit(
        &who,
        None,
        "key.create",
        result.as_ref().err(),
        result.as_ref().ok().map(|k| {
            format!(
                "key {} of tenant {name}{}",
                k.info.id,
                if k.info.admin { " (admin)" } else { "" }
            )
        }),
    )
    .await;
    Ok((StatusCode::CREATED, Json(json!(result?))).into_response())
}

/// `DELETE /v1/keys/{key_id}`
pub async fn revoke_key(
    State(st): State<Shared>,
    AdminCaller(who): AdminCaller,
    ApiPath(raw): ApiPath<String>,
) -> ApiResult<StatusCode> {
    if !keys::is_key_id(&raw) {
        return Err(ApiError::invalid_id(format!(
            "key id {:?} must be k plus 15 lowercase letters or digits",
            raw.chars().take(64).collect::<String>()
        )));
    }
    let result = st.store.revoke_key(&raw).await.map_err(ApiError::from);
    st.audit(
        &who,
        None,
        "key.revoke",
        result.as_ref().err(),
        Some(format!("key {raw}")),
    )
    .await;
    result.map(|_| StatusCode::NO_CONTENT)
}

/// Query of `GET /v1/audit`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct AuditQuery {
    /// Only events about this sandbox.
    #[serde(default)]
    #[schemars(with = "Option<crate::api::shapes::SandboxId>")]
    sandbox: Option<String>,
    /// Only events of this operation (`sandbox.create`, `auth`, ...).
    #[serde(default)]
    #[schemars(pattern(r"^[a-z0-9_.]{1,64}$"))]
    operation: Option<String>,
    /// Only events at or after this time.
    #[serde(default, deserialize_with = "super::whole_opt")]
    #[schemars(with = "Option<u64>")]
    since_unix_ms: Option<u64>,
    /// At most this many events (default 100).
    #[serde(default, deserialize_with = "super::whole_opt")]
    #[schemars(with = "Option<u32>", range(min = 1, max = 1000))]
    limit: Option<u32>,
    /// An admin key's filter: only this tenant's events (a tenant key sees its own only).
    #[serde(default)]
    #[schemars(with = "Option<crate::api::shapes::Name>")]
    tenant: Option<String>,
}

/// `GET /v1/audit`: a tenant key sees its tenant's events; an admin key sees all (or one
/// tenant's with `tenant=`).
pub async fn audit(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiQuery(q): ApiQuery<AuditQuery>,
) -> ApiResult<Json<Value>> {
    let limit = q.limit.unwrap_or(DEFAULT_AUDIT_LIMIT);
    if limit == 0 || limit > MAX_AUDIT_LIMIT {
        return Err(ApiError::invalid(format!(
            "limit must be 1..={MAX_AUDIT_LIMIT}, not {limit}"
        )));
    }
    if let Some(s) = &q.sandbox {
        s.parse::<space_node_api::SandboxId>()
            .map_err(|e| ApiError::invalid_id(e.to_string()))?;
    }
    if let Some(op) = &q.operation {
        let ok = (1..=64).contains(&op.len())
            && op
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_.".contains(&b));
        if !ok {
            return Err(ApiError::invalid(
                "operation is 1 to 64 of [a-z0-9_.] (sandbox.create, auth, ...)",
            ));
        }
    }
    let named = q.tenant.as_deref().map(tenant_name).transpose()?;
    let tenant = if who.admin {
        named
    } else {
        Some(who.tenant.clone())
    };
    let filter = AuditFilter {
        tenant,
        sandbox: q.sandbox,
        operation: q.operation,
        since_unix_ms: q.since_unix_ms,
        limit,
    };
    Ok(Json(json!({ "events": st.store.audit(&filter).await? })))
}
