//! E2B's sandbox metrics (`GET /sandboxes/{id}/metrics`, `GET /sandboxes/metrics`) from the
//! node's samples ([`space_api::MetricSample`]), in E2B's shape: `timestamp` (RFC 3339) and
//! `timestampUnix` (seconds), `cpuCount`, `cpuUsedPct`, `memUsed`, `memTotal`, `memCache`,
//! `diskUsed`, `diskTotal`. Times in queries are Unix seconds.

use std::collections::BTreeMap;

use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::Json;
use serde_json::{json, Value};
use space_api::MetricSample;

use super::rest::{owned, rfc3339, E2bCaller, E2bError, E2bResult};
use crate::api::Shared;
use crate::service::sandboxes as service;

/// Most sandboxes one `GET /sandboxes/metrics` names.
pub const MAX_IDS: usize = 100;

fn metric(s: &MetricSample) -> Value {
    json!({
        "timestamp": rfc3339(s.timestamp_unix_ms),
        "timestampUnix": s.timestamp_unix_ms / 1000,
        "cpuCount": s.cpu_count,
        "cpuUsedPct": s.cpu_used_pct,
        "memUsed": s.mem_used_bytes,
        "memTotal": s.mem_total_bytes,
        "memCache": s.mem_cache_bytes,
        "diskUsed": s.disk_used_bytes,
        "diskTotal": s.disk_total_bytes,
    })
}

/// The query's pairs, each key once.
fn pairs(raw: Option<&str>) -> E2bResult<BTreeMap<String, String>> {
    let list = space_proto::query::parse_query(raw)
        .map_err(|e| E2bError::new(StatusCode::BAD_REQUEST, format!("query: {e}")))?;
    let mut out = BTreeMap::new();
    for (k, v) in list {
        if out.insert(k.clone(), v).is_some() {
            return Err(E2bError::new(
                StatusCode::BAD_REQUEST,
                format!("query parameter {k} given twice"),
            ));
        }
    }
    Ok(out)
}

fn seconds(q: &BTreeMap<String, String>, key: &str) -> E2bResult<Option<u64>> {
    q.get(key)
        .map(|v| {
            v.parse::<u64>().map_err(|_| {
                E2bError::new(
                    StatusCode::BAD_REQUEST,
                    format!("{key} must be Unix seconds, got {v:?}"),
                )
            })
        })
        .transpose()
}

/// `GET /sandboxes/{id}/metrics?start=S&end=S`: the samples whose span ends within the
/// range (seconds, both ends included), oldest first.
pub async fn one(
    State(st): State<Shared>,
    E2bCaller(who): E2bCaller,
    Path(raw): Path<String>,
    RawQuery(query): RawQuery,
) -> E2bResult<Json<Value>> {
    let q = pairs(query.as_deref())?;
    let start = seconds(&q, "start")?.map_or(0, |s| s.saturating_mul(1000));
    let end = seconds(&q, "end")?.map_or(u64::MAX, |s| s.saturating_mul(1000).saturating_add(999));
    let (id, _) = owned(&st, &who, &raw).await?;
    let (start, end) = if start > end { (1, 0) } else { (start, end) };
    let samples = service::metrics(&st, &who, id.as_str(), start, end)
        .await
        .map_err(E2bError::from)?;
    Ok(Json(Value::Array(samples.iter().map(metric).collect())))
}

/// `GET /sandboxes/metrics?sandbox_ids=a,b`: the newest sample of each named sandbox of the
/// caller's that has one; ids that are not the caller's are left out.
pub async fn many(
    State(st): State<Shared>,
    E2bCaller(who): E2bCaller,
    RawQuery(query): RawQuery,
) -> E2bResult<Json<Value>> {
    let q = pairs(query.as_deref())?;
    let ids: Vec<&str> = q
        .get("sandbox_ids")
        .map(|v| v.split(',').filter(|s| !s.is_empty()).collect())
        .unwrap_or_default();
    if ids.is_empty() || ids.len() > MAX_IDS {
        return Err(E2bError::new(
            StatusCode::BAD_REQUEST,
            format!("sandbox_ids must name 1 to {MAX_IDS} sandboxes, comma-separated"),
        ));
    }
    let mut out = serde_json::Map::new();
    for raw in ids {
        let Ok((id, _)) = owned(&st, &who, raw).await else {
            continue;
        };
        if let Ok(mut samples) = service::metrics(&st, &who, id.as_str(), 0, u64::MAX).await {
            if let Some(s) = samples.pop() {
                out.insert(raw.to_owned(), metric(&s));
            }
        }
    }
    Ok(Json(json!({ "sandboxes": out })))
}
