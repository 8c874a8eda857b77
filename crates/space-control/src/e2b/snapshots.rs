//! E2B's snapshots and forks (`docs/e2b.md`).
//!
//! An E2B snapshot is a template, as in E2B: `POST /sandboxes/{id}/snapshots` saves the
//! sandbox as a template of the caller's tenant (a full one, with its memory and processes;
//! with `memory: false`, its disk alone, booted afresh), the snapshot's id is the template's
//! name, `Sandbox.create(snapshot_id)` makes a sandbox of its newest version and
//! `DELETE /templates/{id}` removes it. `GET /snapshots` lists the tenant's templates that
//! were saved from sandboxes. A fork is `count` forks of the sandbox (each its own full
//! snapshot: they are cheap copies on btrfs), each answered or failed on its own.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;
use space_node_api::template::saved_from;
use space_node_api::{TemplateInfo, TemplateRef};

use super::rest::{self, E2bCaller, E2bError, E2bJson, E2bResult};
use crate::api::Shared;
use crate::error::ApiError;
use crate::service::sandboxes as service;

/// Forks one request makes at most (E2B's bound).
pub const MAX_FORKS: u32 = 20;

/// Body of `POST /sandboxes/{id}/snapshots`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct SnapshotBody {
    /// The template's name (default: `snap-` and random hex); a name of the tenant's takes a
    /// new version.
    name: Option<String>,
    /// `false`: the filesystem alone.
    memory: Option<bool>,
}

fn snapshot_name() -> String {
    use rand::RngCore;
    let mut b = [0u8; 8];
    rand::rngs::OsRng.fill_bytes(&mut b);
    format!("snap-{}", hex::encode(b))
}

/// `POST /sandboxes/{id}/snapshots`: 201 `{snapshotID, names}`. The sandbox keeps running
/// (it is paused for the moment its snapshot takes).
pub async fn create(
    State(st): State<Shared>,
    E2bCaller(who): E2bCaller,
    Path(raw): Path<String>,
    E2bJson(body): E2bJson<SnapshotBody>,
) -> Response {
    let named = body.name.as_deref().is_some_and(|n| !n.is_empty());
    let name = body
        .name
        .filter(|n| !n.is_empty())
        .unwrap_or_else(snapshot_name);
    let result = async {
        rest::owned(&st, &who, &raw).await?;
        let memory = body.memory.unwrap_or(true);
        let t = crate::service::templates::save(&st, &who, &raw, &name, None, memory)
            .await
            .map_err(|e| {
                if e.status == StatusCode::NOT_FOUND {
                    E2bError::not_found(&raw)
                } else {
                    E2bError::from(e)
                }
            })?;
        Ok(t)
    }
    .await;
    let result = rest::audited(&st, &who, &raw, "template.save", result).await;
    match result {
        Ok(t) => (
            StatusCode::CREATED,
            Json(json!({
                "snapshotID": t.template.name.as_str(),
                "names": if named { vec![t.template.name.to_string()] } else { Vec::new() },
            })),
        )
            .into_response(),
        Err(e) => e.into_response(),
    }
}

/// One snapshot of a listing: a template name and the sandboxes its versions were saved from.
struct Listed<'a> {
    name: &'a str,
    newest_ms: u64,
    sources: Vec<&'a str>,
}

/// The caller's templates saved from sandboxes, by name, newest first.
fn snapshots<'a>(all: &'a [TemplateInfo], mine: impl Fn(&str) -> bool) -> Vec<Listed<'a>> {
    let mut out: Vec<Listed<'a>> = Vec::new();
    for t in all {
        let Some((sandbox, _)) = saved_from(&t.source) else {
            continue;
        };
        let name = t.template.name.as_str();
        if !mine(name) {
            continue;
        }
        match out.iter_mut().find(|l| l.name == name) {
            Some(l) => {
                l.newest_ms = l.newest_ms.max(t.created_unix_ms);
                l.sources.push(sandbox);
            }
            None => out.push(Listed {
                name,
                newest_ms: t.created_unix_ms,
                sources: vec![sandbox],
            }),
        }
    }
    out.sort_by(|a, b| b.newest_ms.cmp(&a.newest_ms).then(a.name.cmp(b.name)));
    out
}

/// `GET /snapshots?sandboxID=&name=&limit=&nextToken=`: the caller's snapshots, newest
/// first; `x-next-token` names where the next page starts.
pub async fn list(
    State(st): State<Shared>,
    E2bCaller(who): E2bCaller,
    Query(q): Query<Vec<(String, String)>>,
) -> E2bResult<Response> {
    let (mut sandbox, mut name, mut after) = (None, None, None);
    let mut limit = rest::MAX_PAGE;
    for (k, v) in &q {
        match k.as_str() {
            "sandboxID" => sandbox = Some(v.clone()),
            // `name:tag` names a version; the snapshot is the name.
            "name" => name = Some(v.split(':').next().unwrap_or_default().to_owned()),
            "nextToken" => after = Some(v.clone()),
            "limit" => limit = rest::page_limit(v)?,
            other => {
                return Err(E2bError::new(
                    StatusCode::BAD_REQUEST,
                    format!("unknown query parameter {other:?}"),
                ))
            }
        }
    }
    let all = st.node.templates().await.map_err(ApiError::from)?;
    let owners: std::collections::BTreeMap<String, String> = st
        .store
        .template_owners()
        .await
        .map_err(ApiError::from)?
        .into_iter()
        .collect();
    let tenant = who.tenant.as_str();
    let mut listed = snapshots(&all, |n| owners.get(n).is_some_and(|o| o == tenant));
    if let Some(s) = &sandbox {
        listed.retain(|l| l.sources.iter().any(|x| x == s));
    }
    if let Some(n) = &name {
        listed.retain(|l| l.name == n);
    }
    rest::paged(
        &listed,
        |l| l.name,
        after.as_deref(),
        limit,
        |l| json!({"snapshotID": l.name, "names": [l.name]}),
    )
}

/// `DELETE /templates/{id}`: every version of the caller's template `id` (a snapshot or a
/// build). 204; 404 when the caller has none; 409 while a sandbox made from it runs.
pub async fn delete_template(
    State(st): State<Shared>,
    E2bCaller(who): E2bCaller,
    Path(id): Path<String>,
) -> E2bResult<StatusCode> {
    let result = async {
        let not_found = || E2bError::new(StatusCode::NOT_FOUND, format!("template {id} not found"));
        let name = id.split(':').next().unwrap_or_default();
        let owner = st
            .store
            .template_owner(name)
            .await
            .map_err(ApiError::from)?;
        if owner.as_deref() != Some(who.tenant.as_str()) && !who.admin {
            return Err(not_found());
        }
        let all = st.node.templates().await.map_err(ApiError::from)?;
        let versions: Vec<TemplateRef> = all
            .iter()
            .filter(|t| t.template.name.as_str() == name)
            .map(|t| t.template.clone())
            .collect();
        if versions.is_empty() {
            return Err(not_found());
        }
        for v in &versions {
            crate::service::templates::delete(&st, &who, v).await?;
        }
        Ok(StatusCode::NO_CONTENT)
    }
    .await;
    rest::audited(&st, &who, &id, "template.delete", result).await
}

/// Body of `POST /sandboxes/{id}/fork`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ForkBody {
    /// Seconds the forks live (default: E2B's create default).
    timeout: Option<u64>,
    /// How many (1 to [`MAX_FORKS`], default 1).
    count: Option<u32>,
}

/// `POST /sandboxes/{id}/fork`: 201 with one `{sandbox}` or `{error: {code, message}}` per
/// fork asked for. The source keeps running, its id and lifetime untouched.
pub async fn fork(
    State(st): State<Shared>,
    E2bCaller(who): E2bCaller,
    Path(raw): Path<String>,
    E2bJson(body): E2bJson<ForkBody>,
) -> E2bResult<Response> {
    let count = body.count.unwrap_or(1);
    if !(1..=MAX_FORKS).contains(&count) {
        return Err(E2bError::new(
            StatusCode::BAD_REQUEST,
            format!("count must be 1 to {MAX_FORKS}"),
        ));
    }
    let timeout = match body.timeout {
        Some(s) => rest::lifetime(s)?,
        None => rest::DEFAULT_TIMEOUT,
    };
    // The source must be the caller's and alive: otherwise the whole request fails.
    rest::owned(&st, &who, &raw).await?;
    let e2b = super::state(&st);
    let mut out = Vec::new();
    for _ in 0..count {
        let one = async {
            let child = service::fork_sandbox(&st, &who, &raw).await?;
            rest::end_in(&st, &child, timeout).await?;
            let child = st
                .node
                .info(&child.id)
                .await
                .map_err(crate::error::node_error(&child.id))?;
            Ok::<_, E2bError>(child)
        }
        .await;
        out.push(match one {
            Ok(child) => json!({"sandbox": rest::sandbox_json(&e2b, &child)}),
            Err(e) => json!({"error": {"code": e.status.as_u16(), "message": e.message}}),
        });
    }
    Ok((StatusCode::CREATED, Json(out)).into_response())
}
