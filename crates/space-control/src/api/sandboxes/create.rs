//! `POST /v1/sandboxes`: the body, its checks and defaults, and the `Idempotency-Key` header;
//! the create itself is [`crate::service::create`]'s.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use schemars::JsonSchema;
use serde::{Deserialize, Deserializer};
use space_node_api::{TimeoutAction, TimeoutPolicy};

use super::super::{ApiJson, Caller, Shared};
use crate::error::{ApiError, ApiResult};
use crate::service;
use crate::service::create::NewSandbox;

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
    pub fn apply(&self, mut base: TimeoutPolicy) -> ApiResult<TimeoutPolicy> {
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
    /// The tenant's volumes to mount (at most 8; each volume and each path once).
    #[serde(default)]
    #[schemars(with = "Vec<crate::api::shapes::VolumeMount>", length(max = 8))]
    volumes: Vec<space_api::VolumeMountSpec>,
}

pub(super) fn created<T: serde::Serialize>(v: T) -> Response {
    (StatusCode::CREATED, Json(v)).into_response()
}

/// `POST /v1/sandboxes` (`Idempotency-Key` honoured)
pub async fn create(
    State(st): State<Shared>,
    Caller(who): Caller,
    headers: HeaderMap,
    ApiJson(body): ApiJson<CreateBody>,
) -> ApiResult<Response> {
    let key = match idempotency_key(&headers) {
        Ok(key) => key,
        Err(e) => {
            st.audit(&who, None, "sandbox.create", Some(&e), None).await;
            return Err(e);
        }
    };
    let new = match body.into_new() {
        Ok(new) => new,
        Err(e) => {
            st.audit(&who, None, "sandbox.create", Some(&e), None).await;
            return Err(e);
        }
    };
    service::create::create(&st, &who, key.as_deref(), new)
        .await
        .map(created)
}

impl CreateBody {
    /// What the body asks for, its timeouts checked and the defaults filled in.
    pub fn into_new(self) -> ApiResult<NewSandbox> {
        let timeouts = self
            .timeouts
            .as_ref()
            .map_or(Ok(TimeoutPolicy::default()), |b| {
                b.apply(TimeoutPolicy::default())
            })?;
        Ok(NewSandbox {
            template: self.template,
            version: self.version,
            vcpus: self.vcpus,
            memory_mib: self.memory_mib,
            disk_mib: self.disk_mib,
            env: self.env,
            metadata: self.metadata,
            timeouts,
            secrets: self.secrets,
            volumes: self.volumes,
            egress: self.egress,
            auto_resume: self.auto_resume,
        })
    }
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
