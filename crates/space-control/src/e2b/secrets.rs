//! E2B's secrets (`docs/e2b.md`, *Secrets*), kept in space's vault.
//!
//! A secret has an id (`sec_` and 32 hex digits), a name unique in the tenant (lower-cased,
//! as E2B stores it; `sec_` is the ids' prefix and no name's), metadata and a version. Its
//! value is a vault secret named `_E2B_` and the id's hex digits in capitals, bound to every
//! host (`*`): an E2B secret goes where the caller's header rules send it
//! (`network.rules`, `e2b::network`), as on E2B. Values are sealed like any vault value and
//! never answered; an update stores the next version in place of the last (space keeps one).

use std::collections::BTreeMap;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use space_node_api::secrets::SecretKind;

use super::rest::{self, E2bCaller, E2bError, E2bJson, E2bResult};
use super::times::rfc3339;
use crate::api::Shared;
use crate::error::ApiError;
use crate::store::{E2bSecretKey, E2bSecretRow, Principal, StoreError, TenantName};
use crate::vault::MAX_SECRETS_PER_TENANT;

/// The prefix of a secret's id.
pub const ID_PREFIX: &str = "sec_";
/// The longest name, in bytes.
pub const MAX_NAME: usize = 256;
/// Metadata bounds, as E2B's: entries, key bytes, value bytes, bytes in all.
pub const MAX_METADATA_ENTRIES: usize = 32;
pub const MAX_METADATA_KEY: usize = 128;
pub const MAX_METADATA_VALUE: usize = 1024;
pub const MAX_METADATA_BYTES: usize = 8192;

/// Body of `POST /secrets`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewSecret {
    name: String,
    value: String,
    #[serde(default)]
    metadata: Option<BTreeMap<String, String>>,
}

/// Body of `POST /secrets/{id}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretUpdate {
    value: String,
    #[serde(default)]
    metadata: Option<BTreeMap<String, String>>,
}

fn bad(message: impl Into<String>) -> E2bError {
    E2bError::new(StatusCode::BAD_REQUEST, message).no_retry()
}

fn not_found(id: &str) -> E2bError {
    let shown: String = id.chars().take(80).collect();
    E2bError::new(StatusCode::NOT_FOUND, format!("secret {shown:?} not found"))
}

/// The canonical form of a name: lower-cased, checked as E2B checks it (no braces, no
/// control characters, since it goes inside `${e2b.secrets.NAME}`).
pub fn canonical_name(name: &str) -> E2bResult<String> {
    let name = name.to_lowercase();
    if name.is_empty() || name.len() > MAX_NAME {
        return Err(bad(format!("a secret name is 1 to {MAX_NAME} bytes")));
    }
    if name.chars().any(|c| c == '{' || c == '}' || c.is_control()) {
        return Err(bad(format!(
            "secret name {:?} holds '{{', '}}' or a control character",
            name.chars().take(80).collect::<String>()
        )));
    }
    if name.starts_with(ID_PREFIX) {
        return Err(bad(format!(
            "a secret name may not start with {ID_PREFIX:?}, the prefix of secret ids"
        )));
    }
    Ok(name)
}

fn check_metadata(m: &BTreeMap<String, String>) -> E2bResult<String> {
    if m.len() > MAX_METADATA_ENTRIES {
        return Err(bad(format!(
            "metadata has {} entries; at most {MAX_METADATA_ENTRIES}",
            m.len()
        )));
    }
    let mut total = 0;
    for (k, v) in m {
        if k.is_empty() || k.len() > MAX_METADATA_KEY {
            return Err(bad(format!(
                "a metadata key is 1 to {MAX_METADATA_KEY} bytes"
            )));
        }
        if v.len() > MAX_METADATA_VALUE {
            return Err(bad(format!(
                "metadata value of {k:?} is {} bytes; at most {MAX_METADATA_VALUE}",
                v.len()
            )));
        }
        total += k.len() + v.len();
    }
    if total > MAX_METADATA_BYTES {
        return Err(bad(format!(
            "metadata is {total} bytes; at most {MAX_METADATA_BYTES}"
        )));
    }
    serde_json::to_string(m).map_err(|e| bad(e.to_string()))
}

fn view(row: &E2bSecretRow) -> Value {
    let metadata: Value = serde_json::from_str(&row.metadata).unwrap_or_else(|_| json!({}));
    json!({
        "secretID": format!("{ID_PREFIX}{}", row.id),
        "name": row.name,
        "currentVersion": row.version,
        "metadata": metadata,
        "createdAt": rfc3339(row.created_unix_ms),
        "updatedAt": rfc3339(row.updated_unix_ms),
    })
}

/// The secret `key` (an id, `sec_...`, or a name) of `tenant`.
pub async fn find(st: &Shared, tenant: &TenantName, key: &str) -> E2bResult<E2bSecretRow> {
    let name;
    let lookup = match key.strip_prefix(ID_PREFIX) {
        Some(hex) => E2bSecretKey::Id(hex),
        None => {
            name = key.to_lowercase();
            E2bSecretKey::Name(&name)
        }
    };
    st.store
        .e2b_secret(tenant, lookup)
        .await
        .map_err(ApiError::from)?
        .ok_or_else(|| not_found(key))
}

fn seal(
    st: &Shared,
    tenant: &TenantName,
    id: &str,
    value: &str,
    created: Option<u64>,
) -> E2bResult<crate::store::SecretRow> {
    st.vault
        .seal_row(
            tenant,
            &E2bSecretRow::vault_name_of(id),
            SecretKind::Value,
            value.as_bytes(),
            vec!["*".to_owned()],
            created,
        )
        .map_err(|e| match e {
            StoreError::Invalid(m) => bad(m),
            other => ApiError::from(other).into(),
        })
}

async fn audit(st: &Shared, who: &Principal, op: &str, name: &str, err: Option<&E2bError>) {
    let err = err.map(|e| ApiError::new(e.status, "e2b", e.message.clone()));
    st.audit(
        who,
        None,
        op,
        err.as_ref(),
        Some(format!(
            "E2B API secret={}",
            name.chars().take(64).collect::<String>()
        )),
    )
    .await;
}

/// `POST /secrets`: 201 the new secret (version 1); 409 when the name is taken.
pub async fn create(
    State(st): State<Shared>,
    E2bCaller(who): E2bCaller,
    E2bJson(body): E2bJson<NewSecret>,
) -> E2bResult<Response> {
    let result = async {
        let name = canonical_name(&body.name)?;
        let metadata = check_metadata(&body.metadata.unwrap_or_default())?;
        let id = {
            use rand::RngCore;
            let mut b = [0u8; 16];
            rand::rngs::OsRng.fill_bytes(&mut b);
            hex::encode(b)
        };
        let sealed = seal(&st, &who.tenant, &id, &body.value, None)?;
        let row = E2bSecretRow {
            id,
            tenant: who.tenant.clone(),
            name,
            metadata,
            version: 1,
            created_unix_ms: sealed.created_unix_ms,
            updated_unix_ms: sealed.updated_unix_ms,
        };
        st.store
            .insert_e2b_secret(&row, &sealed, MAX_SECRETS_PER_TENANT)
            .await
            .map_err(|e| match e {
                StoreError::Conflict(m) => E2bError::new(StatusCode::CONFLICT, m).no_retry(),
                StoreError::Invalid(m) => bad(m),
                other => ApiError::from(other).into(),
            })?;
        Ok((StatusCode::CREATED, Json(view(&row))).into_response())
    }
    .await;
    audit(&st, &who, "secret.set", &body.name, result.as_ref().err()).await;
    result
}

/// `POST /secrets/{id}`: stores the next version (and replaces the metadata when given).
pub async fn update(
    State(st): State<Shared>,
    E2bCaller(who): E2bCaller,
    Path(key): Path<String>,
    E2bJson(body): E2bJson<SecretUpdate>,
) -> E2bResult<Json<Value>> {
    let result = async {
        let row = find(&st, &who.tenant, &key).await?;
        let metadata = body.metadata.as_ref().map(check_metadata).transpose()?;
        let sealed = seal(
            &st,
            &who.tenant,
            &row.id,
            &body.value,
            Some(row.created_unix_ms),
        )?;
        let updated = st
            .store
            .update_e2b_secret(&who.tenant, &row.id, &sealed, metadata)
            .await
            .map_err(ApiError::from)?
            .ok_or_else(|| not_found(&key))?;
        // Nodes that keep values in memory (a cluster's) ask for the new one.
        st.node
            .forget_secret(&sealed.name)
            .await
            .map_err(ApiError::from)?;
        Ok(Json(view(&updated)))
    }
    .await;
    audit(&st, &who, "secret.set", &key, result.as_ref().err()).await;
    result
}

/// `GET /secrets/{id}`
pub async fn get(
    State(st): State<Shared>,
    E2bCaller(who): E2bCaller,
    Path(key): Path<String>,
) -> E2bResult<Json<Value>> {
    Ok(Json(view(&find(&st, &who.tenant, &key).await?)))
}

/// `DELETE /secrets/{id}`: 204; every version is gone, and requests whose header rules name
/// it are refused from then on.
pub async fn delete(
    State(st): State<Shared>,
    E2bCaller(who): E2bCaller,
    Path(key): Path<String>,
) -> E2bResult<StatusCode> {
    let result = async {
        let row = find(&st, &who.tenant, &key).await?;
        if !st
            .store
            .delete_e2b_secret(&who.tenant, &row.id)
            .await
            .map_err(ApiError::from)?
        {
            return Err(not_found(&key));
        }
        st.node
            .forget_secret(&row.vault_name())
            .await
            .map_err(ApiError::from)?;
        Ok(StatusCode::NO_CONTENT)
    }
    .await;
    audit(&st, &who, "secret.delete", &key, result.as_ref().err()).await;
    result
}

/// `GET /secrets?limit=&nextToken=`: the tenant's secrets, oldest first, paged by
/// `x-next-token`.
pub async fn list(
    State(st): State<Shared>,
    E2bCaller(who): E2bCaller,
    Query(q): Query<Vec<(String, String)>>,
) -> E2bResult<Response> {
    let mut after = None;
    let mut limit = rest::MAX_PAGE;
    for (k, v) in &q {
        match k.as_str() {
            "nextToken" => after = Some(v.clone()),
            "limit" => limit = rest::page_limit(v)?,
            other => return Err(bad(format!("unknown query parameter {other:?}"))),
        }
    }
    let all = st
        .store
        .e2b_secrets(&who.tenant)
        .await
        .map_err(ApiError::from)?;
    rest::paged(&all, |r| r.id.as_str(), after.as_deref(), limit, view)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_lower_cased_and_checked() {
        assert_eq!(canonical_name("OpenAI-Key").unwrap(), "openai-key");
        assert_eq!(canonical_name("my key/é").unwrap(), "my key/é");
        for bad in ["", "a{b", "a}b", "new\nline", "sec_abc", "SEC_x"] {
            assert!(canonical_name(bad).is_err(), "{bad:?}");
        }
        assert!(canonical_name(&"x".repeat(MAX_NAME + 1)).is_err());
    }

    #[test]
    fn metadata_is_bounded_as_on_e2b() {
        let ok: BTreeMap<String, String> = [("team".to_owned(), "ml".to_owned())].into();
        assert_eq!(check_metadata(&ok).unwrap(), r#"{"team":"ml"}"#);
        let many: BTreeMap<String, String> = (0..=MAX_METADATA_ENTRIES)
            .map(|i| (format!("k{i}"), "v".to_owned()))
            .collect();
        assert!(check_metadata(&many).is_err());
        let long_key: BTreeMap<String, String> =
            [("k".repeat(MAX_METADATA_KEY + 1), String::new())].into();
        assert!(check_metadata(&long_key).is_err());
        let long_value: BTreeMap<String, String> =
            [("k".to_owned(), "v".repeat(MAX_METADATA_VALUE + 1))].into();
        assert!(check_metadata(&long_value).is_err());
        let heavy: BTreeMap<String, String> = (0..9)
            .map(|i| (format!("k{i}"), "v".repeat(1000)))
            .collect();
        assert!(check_metadata(&heavy).is_err());
    }
}
