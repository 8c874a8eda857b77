//! Sandbox lifecycle routes: list, get, kill, pause, resume, suspend, restore, fork,
//! timeouts, console logs, snapshots and rollback; creates are [`create`]'s.

mod create;

pub use create::{
    create, create_sandbox, create_sandbox_once, idempotency_key, CreateBody, NewSandbox,
    TimeoutsBody,
};
use create::{created, own};

use std::time::Duration;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{json, Value};
use space_node_api::Sandbox;
use space_node_api::{SandboxId, SnapshotId, SnapshotKind, State as SbState, TimeoutAction};

use super::{ApiJson, ApiPath, ApiQuery, Caller, OptionalJson, Shared};
use crate::error::{node_error, ApiError, ApiResult};
use crate::quota::{self, Usage};
use crate::store::Principal;
use crate::store::TenantName;

/// Console bytes `logs` returns by default.
pub const DEFAULT_LOG_TAIL: usize = 64 * 1024;
/// The most console bytes `logs` returns.
pub const MAX_LOG_TAIL: usize = 1024 * 1024;

/// The API's JSON form of a sandbox, for `who`: an admin also sees the cluster node that
/// holds it (`node`; absent on `space up`).
pub fn sandbox_json(r: &Sandbox, who: &Principal) -> Value {
    let mut v = sandbox_view(r, &who.tenant);
    if who.admin {
        if let Some(node) = &r.node {
            v["node"] = json!(node);
        }
    }
    v
}

/// What every caller sees of a sandbox.
fn sandbox_view(r: &Sandbox, tenant: &TenantName) -> Value {
    let ms = |d: Option<Duration>| d.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let t = &r.options.timeouts;
    json!({
        "id": r.id.as_str(),
        "tenant": tenant.as_str(),
        "template": r.template.name.as_str(),
        "template_version": r.template.version.as_str(),
        "state": r.state.as_str(),
        "vcpus": r.vcpus,
        "memory_mib": r.memory_mib,
        "disk_mib": r.disk_mib,
        "env": r.options.env,
        "metadata": r.options.metadata,
        "timeouts": {
            "idle_ms": ms(t.idle),
            "max_lifetime_ms": ms(t.max_lifetime),
            "action": match t.action {
                TimeoutAction::Suspend => "suspend",
                TimeoutAction::Kill => "kill",
            },
        },
        "egress": r.options.egress,
        "secrets": r.options.secrets.iter().map(|b| json!({
            "name": b.name,
            "placeholder": b.placeholder,
        })).collect::<Vec<_>>(),
        "forked_from": r.forked_from.as_ref().map(|(s, snap)| json!({
            "sandbox": s.as_str(),
            "snapshot": snap.as_str(),
        })),
        "failure": r.failure,
        "auto_resume": r.options.auto_resume,
        "restore_point": r.restore_point.as_ref().map(|p| json!({
            "snapshot": p.as_str(),
            "location": r.snapshot(p).map_or("lost", |s| s.location()),
        })),
        "created_unix_ms": r.created_unix_ms,
        "state_since_unix_ms": r.state_since_unix_ms,
        "last_activity_unix_ms": r.last_activity_unix_ms,
    })
}

/// `GET /v1/sandboxes?state=S&template=T&metadata.K=V`
pub async fn list(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiQuery(query): ApiQuery<Vec<(String, String)>>,
) -> ApiResult<Json<Value>> {
    let mut state: Option<SbState> = None;
    let mut template: Option<String> = None;
    let mut metadata: Vec<(String, String)> = Vec::new();
    for (k, v) in query {
        if k == "state" {
            let s = crate::metrics::STATES
                .iter()
                .position(|s| *s == v)
                .ok_or_else(|| {
                    ApiError::invalid(format!(
                        "state {v:?} is not one of {}",
                        crate::metrics::STATES.join(", ")
                    ))
                })?;
            state = Some(
                [
                    SbState::Creating,
                    SbState::Running,
                    SbState::Paused,
                    SbState::Suspended,
                    SbState::Failed,
                    SbState::Terminated,
                ][s],
            );
        } else if k == "template" {
            if !TenantName::is_valid(&v) {
                return Err(ApiError::invalid_id(format!(
                    "template {:?} is not a template name ([a-z0-9][a-z0-9-]{{0,39}})",
                    v.chars().take(64).collect::<String>()
                )));
            }
            template = Some(v);
        } else if let Some(key) = k.strip_prefix("metadata.") {
            metadata.push((key.to_owned(), v));
        } else {
            return Err(ApiError::invalid(format!(
                "unknown filter {k:?}: use state, template or metadata.<key>"
            )));
        }
    }
    let filter = Filter {
        states: state.map(|s| vec![s]),
        template,
        metadata,
    };
    let out = list_sandboxes(&st, &who.tenant, &filter).await?;
    let list: Vec<Value> = out.iter().map(|r| sandbox_json(r, &who)).collect();
    Ok(Json(json!({ "sandboxes": list })))
}

/// Which sandboxes a listing answers.
#[derive(Debug, Default)]
pub struct Filter {
    /// Any of these states; `None`: every state but Terminated.
    pub states: Option<Vec<SbState>>,
    pub template: Option<String>,
    /// Every one of these metadata pairs.
    pub metadata: Vec<(String, String)>,
}

/// The sandboxes of `tenant` that `filter` lets through, newest first.
pub async fn list_sandboxes(
    st: &Shared,
    tenant: &TenantName,
    filter: &Filter,
) -> ApiResult<Vec<Sandbox>> {
    let mut out: Vec<Sandbox> = Vec::new();
    // Terminated sandboxes are read only when asked for: the others are the node's live
    // ones, so a tenant's history does not make every listing read its records.
    let terminated = filter
        .states
        .as_ref()
        .is_some_and(|s| s.contains(&SbState::Terminated));
    let live: std::collections::HashSet<SandboxId> = if terminated {
        Default::default()
    } else {
        st.node.usage().await?.into_iter().map(|u| u.id).collect()
    };
    for id in st.store.sandboxes_of(tenant).await? {
        let Ok(id) = id.parse::<SandboxId>() else {
            continue;
        };
        if !terminated && !live.contains(&id) {
            continue;
        }
        let info = match st.node.info(&id).await {
            Ok(i) => i,
            Err(f) if f.code == space_node_api::FaultCode::NotFound => continue,
            Err(e) => return Err(e.into()),
        };
        let state_ok = match &filter.states {
            Some(s) => s.contains(&info.state),
            None => info.state != SbState::Terminated,
        };
        let template_ok = match &filter.template {
            Some(t) => info.template.name.as_str() == t,
            None => true,
        };
        let meta_ok = filter
            .metadata
            .iter()
            .all(|(k, v)| info.options.metadata.get(k) == Some(v));
        if state_ok && template_ok && meta_ok {
            out.push(info);
        }
    }
    out.sort_by(|a, b| (b.created_unix_ms, b.id.as_str()).cmp(&(a.created_unix_ms, a.id.as_str())));
    Ok(out)
}

/// `GET /v1/sandboxes/{id}`
pub async fn get(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(raw): ApiPath<String>,
) -> ApiResult<Json<Value>> {
    let id = st.scope(&who, &raw).await?;
    let info = st.node.info(&id).await.map_err(node_error(&id))?;
    Ok(Json(sandbox_json(&info, &who)))
}

/// Runs a lifecycle request on an owned sandbox, audits it, and answers the sandbox as it is
/// afterwards.
async fn lifecycle<F, Fut>(
    st: &Shared,
    who: &crate::store::Principal,
    raw: &str,
    operation: &'static str,
    op: F,
) -> ApiResult<Json<Value>>
where
    F: FnOnce(Shared, SandboxId) -> Fut,
    Fut: std::future::Future<Output = ApiResult<()>>,
{
    let id = scoped(st, who, raw, operation).await?;
    let result = async {
        op(st.clone(), id.clone()).await?;
        let info = st.node.info(&id).await.map_err(node_error(&id))?;
        Ok(Json(sandbox_json(&info, who)))
    }
    .await;
    st.audited(who, Some(id.as_str()), operation, result).await
}

/// [`super::AppState::scope`] for a lifecycle request: a refusal is audited too (with the
/// id as given), so attempts on other tenants' sandboxes leave a trace.
async fn scoped(
    st: &Shared,
    who: &crate::store::Principal,
    raw: &str,
    operation: &str,
) -> ApiResult<SandboxId> {
    let scoped = st.scope(who, raw).await;
    if let Err(e) = &scoped {
        st.audit(who, Some(raw), operation, Some(e), None).await;
    }
    scoped
}

/// `DELETE /v1/sandboxes/{id}`
pub async fn kill(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(raw): ApiPath<String>,
) -> ApiResult<Json<Value>> {
    lifecycle(&st, &who, &raw, "sandbox.kill", |st, id| async move {
        kill_sandbox(&st, &id).await
    })
    .await
}

/// Kills sandbox `id` and revokes its port URLs (a terminated sandbox has no ports).
pub async fn kill_sandbox(st: &Shared, id: &SandboxId) -> ApiResult<()> {
    st.node.kill(id).await.map_err(node_error(id))?;
    st.store.unexpose_all(id.as_str()).await?;
    Ok(())
}

/// `POST /v1/sandboxes/{id}/pause`
pub async fn pause(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(raw): ApiPath<String>,
) -> ApiResult<Json<Value>> {
    lifecycle(&st, &who, &raw, "sandbox.pause", |st, id| async move {
        st.node.pause(&id).await.map_err(node_error(&id))
    })
    .await
}

/// `POST /v1/sandboxes/{id}/resume`
pub async fn resume(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(raw): ApiPath<String>,
) -> ApiResult<Json<Value>> {
    lifecycle(&st, &who, &raw, "sandbox.resume", |st, id| async move {
        st.node.resume(&id).await.map_err(node_error(&id))
    })
    .await
}

/// `POST /v1/sandboxes/{id}/suspend`
pub async fn suspend(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(raw): ApiPath<String>,
) -> ApiResult<Json<Value>> {
    lifecycle(&st, &who, &raw, "sandbox.suspend", |st, id| async move {
        st.node.suspend(&id).await.map_err(node_error(&id))?;
        Ok(())
    })
    .await
}

/// `POST /v1/sandboxes/{id}/restore`
pub async fn restore(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(raw): ApiPath<String>,
) -> ApiResult<Json<Value>> {
    let tenant = who.tenant.clone();
    lifecycle(&st, &who, &raw, "sandbox.restore", |st, id| async move {
        restore_sandbox(&st, &tenant, &id).await
    })
    .await
}

/// Restores suspended sandbox `id` of `tenant`, within the tenant's quota.
pub async fn restore_sandbox(st: &Shared, tenant: &TenantName, id: &SandboxId) -> ApiResult<()> {
    let info = st.node.info(id).await.map_err(node_error(id))?;
    // Only a suspended sandbox restores; anything else is refused by the node below
    // without starting a VM, so it needs no room.
    let need = if info.state == SbState::Suspended {
        Usage {
            sandboxes: 0,
            vcpus: info.vcpus,
            memory_mib: info.memory_mib,
        }
    } else {
        Usage::default()
    };
    let _guard = quota::admit(&st.quotas, st.node.as_ref(), &st.store, tenant, need).await?;
    st.node.restore(id).await.map_err(node_error(id))
}

/// `POST /v1/sandboxes/{id}/fork`
pub async fn fork(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(raw): ApiPath<String>,
) -> ApiResult<Response> {
    let id = scoped(&st, &who, &raw, "sandbox.fork").await?;
    let result = async {
        let parent = st.node.info(&id).await.map_err(node_error(&id))?;
        let need = Usage {
            sandboxes: 1,
            vcpus: parent.vcpus,
            memory_mib: parent.memory_mib,
        };
        let guard =
            quota::admit(&st.quotas, st.node.as_ref(), &st.store, &who.tenant, need).await?;
        let child = st.node.fork(&id).await.map_err(node_error(&id))?;
        own(&st, &child.id, &who.tenant).await?;
        drop(guard);
        Ok(child)
    }
    .await;
    st.audit(
        &who,
        Some(id.as_str()),
        "sandbox.fork",
        result.as_ref().err(),
        result.as_ref().ok().map(|c| format!("child {}", c.id)),
    )
    .await;
    let child = result?;
    Ok(created(sandbox_json(&child, &who)))
}

/// `PUT /v1/sandboxes/{id}/timeouts`
pub async fn set_timeouts(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(raw): ApiPath<String>,
    ApiJson(body): ApiJson<TimeoutsBody>,
) -> ApiResult<Json<Value>> {
    lifecycle(
        &st,
        &who,
        &raw,
        "sandbox.set_timeouts",
        |st, id| async move {
            let info = st.node.info(&id).await.map_err(node_error(&id))?;
            let policy = body.apply(info.options.timeouts)?;
            st.node
                .set_timeouts(&id, policy)
                .await
                .map_err(node_error(&id))?;
            Ok(())
        },
    )
    .await
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

/// `GET /v1/sandboxes/{id}/snapshots`
pub async fn snapshots(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(raw): ApiPath<String>,
) -> ApiResult<Json<Value>> {
    let id = st.scope(&who, &raw).await?;
    let list = st.node.info(&id).await.map_err(node_error(&id))?.snapshots;
    Ok(Json(json!({ "snapshots": list })))
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
    let id = scoped(&st, &who, &raw, "snapshot.create").await?;
    let kind = body.unwrap_or_default().kind.unwrap_or(SnapshotKind::Disk);
    let result = st.node.snapshot(&id, kind).await.map_err(node_error(&id));
    st.audit(
        &who,
        Some(id.as_str()),
        "snapshot.create",
        result.as_ref().err(),
        result.as_ref().ok().map(|s| format!("snapshot {}", s.id)),
    )
    .await;
    Ok(created(json!(result?)))
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
) -> ApiResult<Json<Value>> {
    let snap: SnapshotId = body
        .snapshot
        .parse()
        .map_err(|e: space_node_api::ids::IdError| ApiError::invalid_id(e.to_string()))?;
    lifecycle(&st, &who, &raw, "snapshot.rollback", |st, id| async move {
        // Looked up among this sandbox's own snapshots only.
        let info = st.node.info(&id).await.map_err(node_error(&id))?;
        if info.snapshot(&snap).is_none() {
            return Err(ApiError::snapshot_not_found(id.as_str(), snap.as_str()));
        }
        st.node.rollback(&id, &snap).await.map_err(node_error(&id))
    })
    .await
}
