//! File routes: streamed download and upload, remove, list, stat, mkdir, rename, watch.
//!
//! Uploads stream to the guest, which writes a temporary file and renames it into place only
//! when the body ended cleanly. The server counts the bytes: an upload over the limit is cut
//! off by failing the stream before the chunk that passes the limit reaches the guest, so the
//! guest never commits it and the old file stays.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::{SinkExt, StreamExt};
use serde::Deserialize;
use serde_json::{json, Value};
use space_proto::WriteOptions;

use super::{ApiJson, ApiPath, ApiQuery, Caller, Shared};
use crate::error::{ApiError, ApiResult};

/// `?path=P` (and the flags some routes take).
#[derive(Debug, Deserialize)]
pub struct PathQuery {
    path: String,
    #[serde(default)]
    recursive: Option<bool>,
    #[serde(default)]
    mode: Option<String>,
    #[serde(default)]
    parents: Option<bool>,
}

use crate::service::files::{self as service, guest};

/// `GET /v1/sandboxes/{id}/files?path=P`
pub async fn download(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(raw): ApiPath<String>,
    ApiQuery(q): ApiQuery<PathQuery>,
) -> ApiResult<Response> {
    let reader = service::read(&st, &who, &raw, &q.path).await?;
    Ok((
        [(header::CONTENT_TYPE, "application/octet-stream")],
        Body::from_stream(reader),
    )
        .into_response())
}

pub(crate) fn parse_mode(m: &str) -> ApiResult<u32> {
    let digits = m.strip_prefix("0o").unwrap_or(m);
    match u32::from_str_radix(digits, 8) {
        Ok(v) if v <= 0o7777 && !digits.is_empty() => Ok(v),
        _ => Err(ApiError::invalid(format!(
            "mode {m:?} is not an octal file mode (0000 to 7777)"
        ))),
    }
}

/// `PUT /v1/sandboxes/{id}/files?path=P&mode=0644` with the raw bytes as body.
pub async fn upload(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(raw): ApiPath<String>,
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
    let mode = q.mode.as_deref().map(parse_mode).transpose()?;
    if let Some(len) = headers.get(header::CONTENT_LENGTH) {
        let len: u64 = len
            .to_str()
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| ApiError::invalid("Content-Length is not a number"))?;
        if len > limit {
            // Read what is sent (a bounded amount) before answering: closing on a client
            // that is still sending resets the connection, and the client loses the 413.
            if len <= DRAIN_BYTES {
                drain(body.into_data_stream()).await;
            }
            return Err(too_large());
        }
    }
    // The body is read here and handed to the guest through a small channel, so that after
    // the limit is passed the rest of it can still be read and dropped (a bounded amount):
    // answering while the client is still sending would make the close a reset, and the
    // client would lose the 413.
    let (tx, rx) = futures::channel::mpsc::channel::<Result<Bytes, std::io::Error>>(4);
    let options = WriteOptions {
        mode,
        create_parents: q.parents.unwrap_or(false),
        owner: None,
        xattrs: Default::default(),
        ..WriteOptions::default()
    };
    let pump = async move {
        let mut tx = tx;
        let mut body = body.into_data_stream();
        let mut seen: u64 = 0;
        while let Some(chunk) = body.next().await {
            let chunk = match chunk {
                Ok(c) => c,
                Err(e) => {
                    let _ = tx.send(Err(std::io::Error::other(e))).await;
                    return false;
                }
            };
            seen = seen.saturating_add(chunk.len() as u64);
            if seen > limit {
                let _ = tx
                    .send(Err(std::io::Error::other("upload over the limit")))
                    .await;
                drop(tx);
                drain(body).await;
                return true;
            }
            if tx.send(Ok(chunk)).await.is_err() {
                // The guest gave up (its error is the answer): read on (bounded) so that the
                // answer is not lost to a reset while the client still sends.
                drain(body).await;
                return false;
            }
        }
        false
    };
    let write = service::write(&st, &who, &raw, &q.path, options, rx);
    let (over, result) = tokio::join!(pump, write);
    if over {
        return Err(too_large());
    }
    Ok(Json(json!(result?)))
}

/// `DELETE /v1/sandboxes/{id}/files?path=P&recursive=true`
pub async fn remove(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(raw): ApiPath<String>,
    ApiQuery(q): ApiQuery<PathQuery>,
) -> ApiResult<StatusCode> {
    service::remove(&st, &who, &raw, &q.path, q.recursive.unwrap_or(false)).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /v1/sandboxes/{id}/files/list?path=P`
pub async fn list(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(raw): ApiPath<String>,
    ApiQuery(q): ApiQuery<PathQuery>,
) -> ApiResult<Json<Value>> {
    let entries = service::list(&st, &who, &raw, &q.path).await?;
    Ok(Json(json!({ "entries": entries })))
}

/// `GET /v1/sandboxes/{id}/files/stat?path=P`
pub async fn stat(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(raw): ApiPath<String>,
    ApiQuery(q): ApiQuery<PathQuery>,
) -> ApiResult<Json<Value>> {
    let stat = service::stat(&st, &who, &raw, &q.path).await?;
    Ok(Json(json!(stat)))
}

/// Body of `mkdir`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MkdirBody {
    pub(crate) path: String,
    #[serde(default, deserialize_with = "super::bool_present")]
    pub(crate) parents: Option<bool>,
}

/// `POST /v1/sandboxes/{id}/files/mkdir`
pub async fn mkdir(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(raw): ApiPath<String>,
    ApiJson(body): ApiJson<MkdirBody>,
) -> ApiResult<Json<Value>> {
    let parents = body.parents.unwrap_or(true);
    let stat = service::mkdir(&st, &who, &raw, &body.path, parents).await?;
    Ok(Json(json!(stat)))
}

/// Body of `rename`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RenameBody {
    pub(crate) from: String,
    pub(crate) to: String,
}

/// `POST /v1/sandboxes/{id}/files/rename`
pub async fn rename(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(raw): ApiPath<String>,
    ApiJson(body): ApiJson<RenameBody>,
) -> ApiResult<Json<Value>> {
    let renamed = service::rename(&st, &who, &raw, &body.from, &body.to).await?;
    Ok(Json(json!(renamed)))
}

/// `GET /v1/sandboxes/{id}/files/watch?path=P&recursive=true`: NDJSON events until the
/// client goes away (dropping the stream ends the watch in the guest).
pub async fn watch(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(raw): ApiPath<String>,
    ApiQuery(q): ApiQuery<PathQuery>,
) -> ApiResult<Response> {
    let (id, g) = guest(&st, &who, &raw).await?;
    let events = st
        .guest_call(&id, g.watch(&q.path, q.recursive.unwrap_or(false)))
        .await?;
    let body = futures::stream::unfold(Some(events), |state| async move {
        let mut events = state?;
        let (v, more) = match events.next().await {
            Ok(Some(ev)) => (json!(ev), true),
            Ok(None) => return None,
            Err(e) => {
                let e = ApiError::from(e);
                (
                    json!({"type": "error", "code": e.code, "message": e.message}),
                    false,
                )
            }
        };
        let mut line = serde_json::to_vec(&v).unwrap_or_default();
        line.push(b'\n');
        Some((
            Ok::<_, std::convert::Infallible>(Bytes::from(line)),
            more.then_some(events),
        ))
    });
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(body),
    )
        .into_response())
}

/// How much of an over-limit upload is still read (and dropped) before the 413 goes out.
const DRAIN_BYTES: u64 = 64 << 20;
/// How long that may take.
const DRAIN_TIME: Duration = Duration::from_secs(5);

/// Reads and drops what is left of a request body, up to [`DRAIN_BYTES`] and [`DRAIN_TIME`].
async fn drain(mut body: axum::body::BodyDataStream) {
    let mut left = DRAIN_BYTES;
    let _ = tokio::time::timeout(DRAIN_TIME, async {
        while let Some(Ok(chunk)) = body.next().await {
            left = left.saturating_sub(chunk.len() as u64);
            if left == 0 {
                break;
            }
        }
    })
    .await;
}
