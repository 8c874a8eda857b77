//! E2B's volumes (`docs/e2b.md`, *Volumes*) on [`crate::service::volumes`]:
//!
//! - `POST /volumes`, `GET /volumes`, `GET /volumes/{id}`, `DELETE /volumes/{id}` with the
//!   API key, answering `{volumeID, name, token}` (the token is the volume's content token,
//!   a MAC of its id: the same on every call and every replica);
//! - the volume content API, `/volumecontent/{id}/dir|path|file?path=P`, with that token as a
//!   bearer token: list, make a directory, stat, change mode or owner, remove, read, write.
//!   The SDK finds it at `E2B_VOLUME_API_URL`, which is this server's URL.

use axum::body::{Body, Bytes};
use axum::extract::{FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use space_proto::volume::{join, Attr, EntryKind};

use super::rest::{rfc3339, E2bCaller, E2bError, E2bJson, E2bResult};
use crate::api::Shared;
use crate::error::ApiError;
use crate::service::volumes as service;
use crate::store::VolumeRow;

/// The most entries a content listing answers.
const MAX_LISTING: usize = 100_000;
/// The deepest listing (`depth`).
const MAX_DEPTH: u32 = 16;

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct CreateBody {
    name: String,
}

fn volume_json(st: &Shared, row: &VolumeRow, with_token: bool) -> Value {
    let mut v = json!({"volumeID": row.id, "name": row.name});
    if with_token {
        v["token"] = json!(service::token(st, &row.id));
    }
    v
}

fn not_found(id: &str) -> E2bError {
    E2bError::new(StatusCode::NOT_FOUND, format!("volume {id} not found"))
}

/// The caller's volume of id `id`.
async fn owned(st: &Shared, who: &crate::store::Principal, id: &str) -> E2bResult<VolumeRow> {
    match st.store.volume_by_id(id).await {
        Ok(Some(row)) if row.tenant == who.tenant => Ok(row),
        Ok(_) => Err(not_found(id)),
        Err(e) => Err(E2bError::from(ApiError::from(e))),
    }
}

/// `POST /volumes` → 201 `{volumeID, name, token}`
pub async fn create(
    State(st): State<Shared>,
    E2bCaller(who): E2bCaller,
    E2bJson(body): E2bJson<CreateBody>,
) -> E2bResult<Response> {
    let v = service::create(&st, &who, &body.name, None).await?;
    let row = owned(&st, &who, &v.id).await?;
    Ok((StatusCode::CREATED, Json(volume_json(&st, &row, true))).into_response())
}

/// `GET /volumes` → `[{volumeID, name}]`
pub async fn list(State(st): State<Shared>, E2bCaller(who): E2bCaller) -> E2bResult<Json<Value>> {
    let rows = st
        .store
        .volumes(&who.tenant)
        .await
        .map_err(|e| E2bError::from(ApiError::from(e)))?;
    Ok(Json(Value::Array(
        rows.iter().map(|r| volume_json(&st, r, false)).collect(),
    )))
}

/// `GET /volumes/{id}` → `{volumeID, name, token}`
pub async fn get(
    State(st): State<Shared>,
    E2bCaller(who): E2bCaller,
    Path(id): Path<String>,
) -> E2bResult<Json<Value>> {
    let row = owned(&st, &who, &id).await?;
    Ok(Json(volume_json(&st, &row, true)))
}

/// `DELETE /volumes/{id}` → 204
pub async fn delete(
    State(st): State<Shared>,
    E2bCaller(who): E2bCaller,
    Path(id): Path<String>,
) -> E2bResult<StatusCode> {
    let row = owned(&st, &who, &id).await?;
    service::delete(&st, &who, &row.name).await?;
    Ok(StatusCode::NO_CONTENT)
}

// ---- the content API ----------------------------------------------------------------------

/// An error of the content API: `{"code": "<status>", "message"}`.
pub struct ContentError(StatusCode, String);

impl IntoResponse for ContentError {
    fn into_response(self) -> Response {
        (
            self.0,
            Json(json!({"code": self.0.as_u16().to_string(), "message": self.1})),
        )
            .into_response()
    }
}

impl From<ApiError> for ContentError {
    fn from(e: ApiError) -> Self {
        ContentError(e.status, e.message)
    }
}

pub type ContentResult<T> = Result<T, ContentError>;

/// The volume `id` whose content token the request bears.
async fn bearer(st: &Shared, headers: &HeaderMap, id: &str) -> ContentResult<VolumeRow> {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or_else(|| {
            ContentError(
                StatusCode::UNAUTHORIZED,
                "the volume's token is missing (Authorization: Bearer <token>)".into(),
            )
        })?;
    if !service::token_matches(st, id, token.trim()) {
        return Err(ContentError(
            StatusCode::UNAUTHORIZED,
            "that is not this volume's token".into(),
        ));
    }
    match st.store.volume_by_id(id).await {
        Ok(Some(row)) => Ok(row),
        Ok(None) => Err(ContentError(
            StatusCode::NOT_FOUND,
            format!("volume {id} not found"),
        )),
        Err(e) => Err(ApiError::from(e).into()),
    }
}

/// The query's pairs, each key once.
fn query(raw: Option<&str>) -> ContentResult<std::collections::BTreeMap<String, String>> {
    let bad = |m: String| ContentError(StatusCode::BAD_REQUEST, m);
    let mut out = std::collections::BTreeMap::new();
    for (k, v) in space_proto::query::parse_query(raw).map_err(|e| bad(format!("query: {e}")))? {
        if out.insert(k.clone(), v).is_some() {
            return Err(bad(format!("query parameter {k} given twice")));
        }
    }
    Ok(out)
}

fn path_of(q: &std::collections::BTreeMap<String, String>) -> ContentResult<String> {
    q.get("path").cloned().ok_or_else(|| {
        ContentError(
            StatusCode::BAD_REQUEST,
            "the path query parameter is missing".into(),
        )
    })
}

/// What every content route starts from: the volume the request's bearer token opens, and
/// the query (each parameter once).
pub struct Content {
    st: Shared,
    row: VolumeRow,
    q: std::collections::BTreeMap<String, String>,
}

impl FromRequestParts<Shared> for Content {
    type Rejection = ContentError;

    async fn from_request_parts(parts: &mut Parts, st: &Shared) -> ContentResult<Self> {
        let Path(id) = Path::<String>::from_request_parts(parts, st)
            .await
            .map_err(|e| ContentError(StatusCode::BAD_REQUEST, e.body_text()))?;
        let row = bearer(st, &parts.headers, &id).await?;
        let q = query(parts.uri.query())?;
        Ok(Content {
            st: st.clone(),
            row,
            q,
        })
    }
}

impl Content {
    /// The `path` parameter.
    fn path(&self) -> ContentResult<String> {
        path_of(&self.q)
    }
}

fn number<T: std::str::FromStr>(
    q: &std::collections::BTreeMap<String, String>,
    key: &str,
) -> ContentResult<Option<T>> {
    q.get(key)
        .map(|v| {
            v.parse().map_err(|_| {
                ContentError(
                    StatusCode::BAD_REQUEST,
                    format!("{key} must be a number, not {v:?}"),
                )
            })
        })
        .transpose()
}

fn flag(q: &std::collections::BTreeMap<String, String>, key: &str) -> bool {
    q.get(key).is_some_and(|v| v == "true" || v == "1")
}

/// E2B's `VolumeEntryStat` of the entry at `path` (absolute in the volume).
fn entry_stat(path: &str, a: &Attr, target: Option<String>) -> Value {
    let name = path.rsplit('/').next().unwrap_or("").to_owned();
    let time = |ns: i64| rfc3339((ns.max(0) / 1_000_000) as u64);
    let mut v = json!({
        "name": name,
        "type": match a.kind {
            EntryKind::File => "file",
            EntryKind::Dir => "directory",
            EntryKind::Symlink => "symlink",
            EntryKind::Other => "unknown",
        },
        "path": path,
        "size": a.size,
        "mode": a.mode,
        "uid": a.uid,
        "gid": a.gid,
        "atime": time(a.atime_ns),
        "mtime": time(a.mtime_ns),
        "ctime": time(a.ctime_ns),
    });
    if let Some(t) = target {
        v["target"] = json!(t);
    }
    v
}

fn absolute(rel: &str) -> String {
    format!("/{rel}")
}

async fn stat_json(st: &Shared, row: &VolumeRow, path: &str) -> ContentResult<Value> {
    let rel = service::rel_path(path)?;
    let (a, target) = service::attr(st, row, &rel).await?;
    Ok(entry_stat(&absolute(&rel), &a, target))
}

/// `GET /volumecontent/{id}/dir?path=P&depth=N`: the entries under `P`, `depth` levels deep
/// (1: its children).
pub async fn list_dir(c: Content) -> ContentResult<Json<Value>> {
    let (st, row, q) = (&c.st, &c.row, &c.q);
    let rel = service::rel_path(&c.path()?)?;
    let depth = number::<u32>(q, "depth")?.unwrap_or(1).clamp(1, MAX_DEPTH);
    let mut out = Vec::new();
    let mut level = vec![rel];
    for _ in 0..depth {
        let mut next = Vec::new();
        for dir in level {
            for e in service::entries(st, row, &dir, MAX_LISTING).await? {
                let p = join(&dir, &e.name);
                if e.attr.kind == EntryKind::Dir {
                    next.push(p.clone());
                }
                out.push(entry_stat(&absolute(&p), &e.attr, None));
                if out.len() >= MAX_LISTING {
                    return Ok(Json(Value::Array(out)));
                }
            }
        }
        level = next;
    }
    Ok(Json(Value::Array(out)))
}

/// `POST /volumecontent/{id}/dir?path=P&force=true`: 201 with the directory; an existing
/// path is 409, unless `force` and it is a directory; `force` makes missing parents.
pub async fn make_dir(c: Content) -> ContentResult<Response> {
    let (st, row, q) = (&c.st, &c.row, &c.q);
    let path = c.path()?;
    let force = flag(q, "force");
    let owner = owner_of(q)?;
    let mode = number::<u32>(q, "mode")?;
    match service::attr(st, row, &path).await {
        Ok((a, _)) if force && a.kind == EntryKind::Dir => {
            let v = stat_json(st, row, &path).await?;
            return Ok((StatusCode::CREATED, Json(v)).into_response());
        }
        Ok(_) => {
            return Err(ContentError(
                StatusCode::CONFLICT,
                format!("{path} exists already"),
            ))
        }
        Err(e) if e.status == StatusCode::NOT_FOUND => {}
        Err(e) => return Err(e.into()),
    }
    service::mkdir(st, row, &path, force, mode, owner).await?;
    let v = stat_json(st, row, &path).await?;
    Ok((StatusCode::CREATED, Json(v)).into_response())
}

fn owner_of(q: &std::collections::BTreeMap<String, String>) -> ContentResult<Option<(u32, u32)>> {
    let uid = number::<u32>(q, "uid")?;
    let gid = number::<u32>(q, "gid")?;
    Ok(match (uid, gid) {
        (None, None) => None,
        (u, g) => Some((u.unwrap_or(1000), g.unwrap_or(1000))),
    })
}

/// `GET /volumecontent/{id}/path?path=P`: the entry.
pub async fn stat(c: Content) -> ContentResult<Json<Value>> {
    let (st, row) = (&c.st, &c.row);
    Ok(Json(stat_json(st, row, &c.path()?).await?))
}

/// Body of `PATCH /volumecontent/{id}/path`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct MetadataBody {
    uid: Option<u32>,
    gid: Option<u32>,
    mode: Option<u32>,
}

/// `PATCH /volumecontent/{id}/path?path=P` `{uid?, gid?, mode?}`: the entry after.
pub async fn update_metadata(c: Content, body: Bytes) -> ContentResult<Json<Value>> {
    let (st, row) = (&c.st, &c.row);
    let path = c.path()?;
    let m: MetadataBody = if body.iter().all(u8::is_ascii_whitespace) {
        MetadataBody::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| ContentError(StatusCode::BAD_REQUEST, format!("invalid JSON body: {e}")))?
    };
    if m.mode.is_some_and(|v| v > 0o7777) {
        return Err(ContentError(
            StatusCode::BAD_REQUEST,
            "mode is at most 0o7777".into(),
        ));
    }
    service::set_attr(st, row, &path, m.mode, m.uid, m.gid).await?;
    Ok(Json(stat_json(st, row, &path).await?))
}

/// `DELETE /volumecontent/{id}/path?path=P`: 204; a directory goes with what is in it.
pub async fn remove(c: Content) -> ContentResult<StatusCode> {
    let (st, row) = (&c.st, &c.row);
    let path = c.path()?;
    if service::rel_path(&path)?.is_empty() {
        return Err(ContentError(
            StatusCode::NOT_FOUND,
            "the volume's root cannot be removed".into(),
        ));
    }
    service::remove(st, row, &path).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /volumecontent/{id}/file?path=P`: the bytes.
pub async fn read_file(c: Content) -> ContentResult<Response> {
    let (st, row) = (&c.st, &c.row);
    let bytes = service::read(st, row, &c.path()?, st.max_upload_bytes).await?;
    Ok((
        [(header::CONTENT_TYPE, "application/octet-stream")],
        Body::from(bytes),
    )
        .into_response())
}

/// `PUT /volumecontent/{id}/file?path=P&force=true` with the bytes: 201 with the file. An
/// existing file is 409 unless `force`; a directory there is 409; a missing parent 404.
pub async fn write_file(c: Content, body: Body) -> ContentResult<Response> {
    let (st, row, q) = (&c.st, &c.row, &c.q);
    let path = c.path()?;
    let force = flag(q, "force");
    let mode = number::<u32>(q, "mode")?;
    let owner = owner_of(q)?;
    let limit = st.max_upload_bytes;
    let bytes = axum::body::to_bytes(body, usize::try_from(limit).unwrap_or(usize::MAX))
        .await
        .map_err(|_| {
            ContentError(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("over this server's limit of {limit} bytes"),
            )
        })?;
    if let Ok((a, _)) = service::attr(st, row, &path).await {
        if a.kind == EntryKind::Dir {
            return Err(ContentError(
                StatusCode::CONFLICT,
                format!("{path} is a directory"),
            ));
        }
        if !force {
            return Err(ContentError(
                StatusCode::CONFLICT,
                format!("{path} exists already (force=true replaces it)"),
            ));
        }
    }
    service::write(st, row, &path, &bytes, mode, owner, !force, false).await?;
    let v = stat_json(st, row, &path).await?;
    Ok((StatusCode::CREATED, Json(v)).into_response())
}
