//! Volume routes (`docs/api.md`, *Volumes*): make, list, show and delete the tenant's volumes,
//! and the file API on a volume no sandbox needs to mount. Everything is
//! [`crate::service::volumes`]'s; these parse and answer.

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{json, Value};
use space_api as api;

use super::files::{parse_mode, MkdirBody, RenameBody};
use super::{ApiJson, ApiPath, ApiQuery, Caller, Shared};
use crate::error::{ApiError, ApiResult};
use crate::service::volumes as service;

/// Body of `POST /v1/volumes`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "VolumeCreateRequest")]
pub struct CreateBody {
    #[schemars(with = "crate::api::shapes::VolumeName")]
    name: String,
    /// Its size, MiB (default 10 GiB); the tenant's volumes together stay under its
    /// `max_volume_mib`.
    #[serde(default)]
    #[schemars(range(min = 1, max = 16_777_216))]
    size_mib: Option<u64>,
}

/// `POST /v1/volumes` → `201 Volume`
pub async fn create(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiJson(body): ApiJson<CreateBody>,
) -> ApiResult<Response> {
    let v = service::create(&st, &who, &body.name, body.size_mib).await?;
    Ok((StatusCode::CREATED, Json(v)).into_response())
}

/// `GET /v1/volumes`
pub async fn list(
    State(st): State<Shared>,
    Caller(who): Caller,
) -> ApiResult<Json<api::VolumeList>> {
    let volumes = service::list(&st, &who).await?;
    Ok(Json(api::VolumeList { volumes }))
}

/// `GET /v1/volumes/{name}`
pub async fn get(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(name): ApiPath<String>,
) -> ApiResult<Json<api::Volume>> {
    Ok(Json(service::get(&st, &who, &name).await?))
}

/// `DELETE /v1/volumes/{name}` → 204
pub async fn delete(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(name): ApiPath<String>,
) -> ApiResult<StatusCode> {
    service::delete(&st, &who, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `?path=P` and the flags some routes take.
#[derive(Debug, Deserialize)]
pub struct PathQuery {
    path: String,
    #[serde(default)]
    mode: Option<String>,
    #[serde(default)]
    parents: Option<bool>,
}

/// `GET /v1/volumes/{name}/files?path=P`: the file's bytes.
pub async fn download(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(name): ApiPath<String>,
    ApiQuery(q): ApiQuery<PathQuery>,
) -> ApiResult<Response> {
    let row = service::row(&st, &who.tenant, &name).await?;
    let bytes = service::read(&st, &row, &q.path, st.max_upload_bytes).await?;
    Ok((
        [(header::CONTENT_TYPE, "application/octet-stream")],
        Body::from(bytes),
    )
        .into_response())
}

/// `PUT /v1/volumes/{name}/files?path=P&mode=0644&parents=true` with the bytes as body.
pub async fn upload(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(name): ApiPath<String>,
    ApiQuery(q): ApiQuery<PathQuery>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Json<Value>> {
    let limit = st.max_upload_bytes;
    let too_large = || {
        ApiError::too_large(format!(
            "the upload is over this server's limit of {limit} bytes; nothing was written"
        ))
    };
    if let Some(len) = headers.get(header::CONTENT_LENGTH) {
        let len: u64 = len
            .to_str()
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| ApiError::invalid("Content-Length is not a number"))?;
        if len > limit {
            return Err(too_large());
        }
    }
    let mode = q.mode.as_deref().map(parse_mode).transpose()?;
    let bytes: Bytes = axum::body::to_bytes(body, usize::try_from(limit).unwrap_or(usize::MAX))
        .await
        .map_err(|_| too_large())?;
    let row = service::row(&st, &who.tenant, &name).await?;
    let stat = service::write(
        &st,
        &row,
        &q.path,
        &bytes,
        mode,
        None,
        false,
        q.parents.unwrap_or(false),
    )
    .await?;
    Ok(Json(json!(stat)))
}

/// `DELETE /v1/volumes/{name}/files?path=P`: a file, or a directory and what is in it.
pub async fn remove(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(name): ApiPath<String>,
    ApiQuery(q): ApiQuery<PathQuery>,
) -> ApiResult<StatusCode> {
    let row = service::row(&st, &who.tenant, &name).await?;
    service::remove(&st, &row, &q.path).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /v1/volumes/{name}/files/list?path=P`
pub async fn list_dir(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(name): ApiPath<String>,
    ApiQuery(q): ApiQuery<PathQuery>,
) -> ApiResult<Json<Value>> {
    let row = service::row(&st, &who.tenant, &name).await?;
    let entries = service::list_dir(&st, &row, &q.path, MAX_LISTING).await?;
    Ok(Json(json!({ "entries": entries })))
}

/// The most entries one listing answers.
const MAX_LISTING: usize = 100_000;

/// `GET /v1/volumes/{name}/files/stat?path=P`
pub async fn stat(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(name): ApiPath<String>,
    ApiQuery(q): ApiQuery<PathQuery>,
) -> ApiResult<Json<Value>> {
    let row = service::row(&st, &who.tenant, &name).await?;
    Ok(Json(json!(service::stat(&st, &row, &q.path).await?)))
}

/// `POST /v1/volumes/{name}/files/mkdir`
pub async fn mkdir(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(name): ApiPath<String>,
    ApiJson(body): ApiJson<MkdirBody>,
) -> ApiResult<Json<Value>> {
    if service::rel_path(&body.path)?.is_empty() {
        return Err(ApiError::invalid(
            "path names the volume's root, which exists",
        ));
    }
    let row = service::row(&st, &who.tenant, &name).await?;
    let parents = body.parents.unwrap_or(true);
    let stat = service::mkdir(&st, &row, &body.path, parents, None, None).await?;
    Ok(Json(json!(stat)))
}

/// `POST /v1/volumes/{name}/files/rename`
pub async fn rename(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(name): ApiPath<String>,
    ApiJson(body): ApiJson<RenameBody>,
) -> ApiResult<Json<Value>> {
    if service::rel_path(&body.from)?.is_empty() || service::rel_path(&body.to)?.is_empty() {
        return Err(ApiError::invalid("the volume's root cannot be renamed"));
    }
    let row = service::row(&st, &who.tenant, &name).await?;
    let stat = service::rename(&st, &row, &body.from, &body.to).await?;
    Ok(Json(json!(stat)))
}
