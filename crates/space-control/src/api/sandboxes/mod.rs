//! Sandbox lifecycle routes: list, get, kill, pause, resume, suspend, restore, fork,
//! timeouts, console logs, snapshots and rollback; creates are [`create`]'s. Each handler
//! reads its request and calls the operation in [`crate::service`].

mod create;

use create::created;
pub use create::{create, idempotency_key, CreateBody, TimeoutsBody};

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use schemars::JsonSchema;
use serde::Deserialize;
use space_api as api;
use space_node_api::SnapshotKind;

use super::{ApiJson, ApiPath, ApiQuery, Caller, OptionalJson, Shared};
use crate::error::{node_error, ApiResult};
use crate::service::sandboxes::{self as service, Filter};

/// Console bytes `logs` returns by default.
pub const DEFAULT_LOG_TAIL: usize = 64 * 1024;
/// The most console bytes `logs` returns.
pub const MAX_LOG_TAIL: usize = 1024 * 1024;

/// `GET /v1/sandboxes?state=S&template=T&metadata.K=V`
pub async fn list(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiQuery(query): ApiQuery<Vec<(String, String)>>,
) -> ApiResult<Json<api::SandboxList>> {
    let filter = Filter::parse(query)?;
    let sandboxes = service::list(&st, &who, &filter).await?;
    Ok(Json(api::SandboxList { sandboxes }))
}

/// `GET /v1/sandboxes/{id}`
pub async fn get(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(raw): ApiPath<String>,
) -> ApiResult<Json<api::Sandbox>> {
    service::get(&st, &who, &raw).await.map(Json)
}

async fn change(
    st: Shared,
    who: crate::store::Principal,
    raw: String,
    change: api::Lifecycle,
) -> ApiResult<Json<api::Sandbox>> {
    service::lifecycle(&st, &who, &raw, change).await.map(Json)
}

/// `DELETE /v1/sandboxes/{id}`
pub async fn kill(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(raw): ApiPath<String>,
) -> ApiResult<Json<api::Sandbox>> {
    change(st, who, raw, api::Lifecycle::Kill).await
}

/// `POST /v1/sandboxes/{id}/pause`
pub async fn pause(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(raw): ApiPath<String>,
) -> ApiResult<Json<api::Sandbox>> {
    change(st, who, raw, api::Lifecycle::Pause).await
}

/// `POST /v1/sandboxes/{id}/resume`
pub async fn resume(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(raw): ApiPath<String>,
) -> ApiResult<Json<api::Sandbox>> {
    change(st, who, raw, api::Lifecycle::Resume).await
}

/// `POST /v1/sandboxes/{id}/suspend`
pub async fn suspend(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(raw): ApiPath<String>,
) -> ApiResult<Json<api::Sandbox>> {
    change(st, who, raw, api::Lifecycle::Suspend).await
}

/// `POST /v1/sandboxes/{id}/restore`
pub async fn restore(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(raw): ApiPath<String>,
) -> ApiResult<Json<api::Sandbox>> {
    change(st, who, raw, api::Lifecycle::Restore).await
}

/// `POST /v1/sandboxes/{id}/fork`
pub async fn fork(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(raw): ApiPath<String>,
) -> ApiResult<Response> {
    service::fork(&st, &who, &raw).await.map(created)
}

/// `PUT /v1/sandboxes/{id}/timeouts`
pub async fn set_timeouts(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(raw): ApiPath<String>,
    ApiJson(body): ApiJson<TimeoutsBody>,
) -> ApiResult<Json<api::Sandbox>> {
    service::set_timeouts(&st, &who, &raw, move |t| body.apply(t))
        .await
        .map(Json)
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

/// Query of `metrics`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct MetricsQuery {
    /// The earliest end of a sample's span, ms since the Unix epoch (default: the start of
    /// the series).
    #[serde(default, deserialize_with = "super::whole_opt")]
    #[schemars(with = "Option<u64>")]
    start: Option<u64>,
    /// The latest, ms since the Unix epoch (default: now).
    #[serde(default, deserialize_with = "super::whole_opt")]
    #[schemars(with = "Option<u64>")]
    end: Option<u64>,
}

/// `GET /v1/sandboxes/{id}/metrics?start=MS&end=MS`
pub async fn metrics(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(raw): ApiPath<String>,
    ApiQuery(q): ApiQuery<MetricsQuery>,
) -> ApiResult<Json<api::MetricList>> {
    let start = q.start.unwrap_or(0);
    let end = q.end.unwrap_or(u64::MAX);
    // A range that ends before it starts holds no sample.
    let samples = if start > end {
        service::metrics(&st, &who, &raw, 0, 0)
            .await
            .map(|_| Vec::new())?
    } else {
        service::metrics(&st, &who, &raw, start, end).await?
    };
    Ok(Json(api::MetricList { samples }))
}

/// `GET /v1/sandboxes/{id}/snapshots`
pub async fn snapshots(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(raw): ApiPath<String>,
) -> ApiResult<Json<api::SnapshotList>> {
    let snapshots = service::snapshots(&st, &who, &raw).await?;
    Ok(Json(api::SnapshotList { snapshots }))
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
    let kind = body.unwrap_or_default().kind.unwrap_or(SnapshotKind::Disk);
    service::snapshot(&st, &who, &raw, kind).await.map(created)
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
) -> ApiResult<Json<api::Sandbox>> {
    service::rollback(&st, &who, &raw, &body.snapshot)
        .await
        .map(Json)
}
