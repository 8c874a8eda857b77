//! Sandbox operations: the view every protocol answers, listing, lifecycle, fork, timeouts,
//! snapshots and rollback. Each operation scopes the id to the caller's tenant, audits what
//! it changed, and answers typed values; creates are [`super::create`]'s.

use std::time::Duration;

use space_api as api;
use space_node_api::{
    Sandbox, SandboxId, SnapshotId, SnapshotKind, State as SbState, TimeoutAction, TimeoutPolicy,
};

use super::Shared;
use crate::error::{node_error, ApiError, ApiResult};
use crate::quota::{self, Usage};
use crate::store::{Principal, TenantName};

/// What `who` sees of a sandbox: an admin also sees the cluster node that holds it (`node`;
/// absent on `space up`).
pub fn view(r: &Sandbox, who: &Principal) -> api::Sandbox {
    let mut v = view_for(r, &who.tenant);
    if who.admin {
        v.node = r.node.clone();
    }
    v
}

/// What every caller of `tenant` sees of a sandbox.
pub fn view_for(r: &Sandbox, tenant: &TenantName) -> api::Sandbox {
    let ms = |d: Option<Duration>| d.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let t = &r.options.timeouts;
    let egress = &r.options.egress;
    api::Sandbox {
        id: r.id.to_string(),
        tenant: tenant.to_string(),
        template: r.template.name.to_string(),
        template_version: r.template.version.to_string(),
        state: r.state.as_str().to_owned(),
        vcpus: r.vcpus,
        memory_mib: r.memory_mib,
        disk_mib: r.disk_mib,
        env: r.options.env.clone(),
        metadata: r.options.metadata.clone(),
        timeouts: api::Timeouts {
            idle_ms: ms(t.idle),
            max_lifetime_ms: ms(t.max_lifetime),
            action: match t.action {
                TimeoutAction::Suspend => "suspend",
                TimeoutAction::Kill => "kill",
            }
            .to_owned(),
        },
        egress: api::EgressPolicy {
            default: egress.default.as_str().to_owned(),
            allow: egress.allow.iter().map(|r| r.to_string()).collect(),
            deny: egress.deny.iter().map(|r| r.to_string()).collect(),
            headers: egress
                .headers
                .iter()
                .map(|h| api::HeaderRule {
                    host: h.host.to_string(),
                    name: h.name.clone(),
                    value: h.value.clone(),
                })
                .collect(),
        },
        secrets: r
            .options
            .secrets
            .iter()
            .map(|b| api::SecretBinding {
                name: b.name.clone(),
                placeholder: b.placeholder.clone(),
            })
            .collect(),
        volumes: r
            .options
            .volumes
            .iter()
            .map(|m| api::VolumeMountSpec {
                name: m.name.clone(),
                path: m.path.clone(),
                read_only: m.read_only,
            })
            .collect(),
        forked_from: r.forked_from.as_ref().map(|(s, snap)| api::ForkedFrom {
            sandbox: s.to_string(),
            snapshot: snap.to_string(),
        }),
        failure: r.failure.clone(),
        auto_resume: r.options.auto_resume,
        restore_point: r.restore_point.as_ref().map(|p| api::RestorePoint {
            snapshot: p.to_string(),
            location: r.snapshot(p).map_or("lost", |s| s.location()).to_owned(),
        }),
        created_unix_ms: r.created_unix_ms,
        state_since_unix_ms: r.state_since_unix_ms,
        last_activity_unix_ms: r.last_activity_unix_ms,
        node: None,
    }
}

/// A snapshot as the API answers it.
pub fn snapshot_view(s: &space_node_api::Snapshot) -> api::Snapshot {
    api::Snapshot {
        id: s.id.to_string(),
        kind: s.kind.as_str().to_owned(),
        reason: s.reason.as_str().to_owned(),
        created_unix_ms: s.created_unix_ms,
        size_bytes: s.size_bytes,
        paused_for_us: s.paused_for_us,
        local: s.local,
        remote: s.remote.as_ref().map(|r| api::RemoteCopy {
            manifest_hash: r.manifest_hash.clone(),
            uploaded_unix_ms: r.uploaded_unix_ms,
            uploaded_bytes: r.uploaded_bytes,
            new_chunks: r.new_chunks,
            stored_bytes: r.stored_bytes,
        }),
    }
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

impl Filter {
    /// The filter of a query: `state`, `template` and `metadata.<key>` pairs.
    pub fn parse(query: impl IntoIterator<Item = (String, String)>) -> ApiResult<Filter> {
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
        Ok(Filter {
            states: state.map(|s| vec![s]),
            template,
            metadata,
        })
    }

    /// The filter a client asked for.
    pub fn of(f: &api::SandboxFilter) -> ApiResult<Filter> {
        let mut pairs: Vec<(String, String)> = Vec::new();
        if let Some(s) = &f.state {
            pairs.push(("state".into(), s.clone()));
        }
        if let Some(t) = &f.template {
            pairs.push(("template".into(), t.clone()));
        }
        for (k, v) in &f.metadata {
            pairs.push((format!("metadata.{k}"), v.clone()));
        }
        Filter::parse(pairs)
    }
}

/// The caller's sandboxes that `filter` lets through, newest first.
pub async fn list(st: &Shared, who: &Principal, filter: &Filter) -> ApiResult<Vec<api::Sandbox>> {
    let all = list_sandboxes(st, &who.tenant, filter).await?;
    Ok(all.iter().map(|r| view(r, who)).collect())
}

/// The sandboxes of `tenant` that `filter` lets through, newest first, as the node has them.
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

/// One sandbox of the caller's.
pub async fn get(st: &Shared, who: &Principal, raw: &str) -> ApiResult<api::Sandbox> {
    let id = st.scope(who, raw).await?;
    let info = st.node.info(&id).await.map_err(node_error(&id))?;
    Ok(view(&info, who))
}

/// Runs a change on an owned sandbox, audits it under `operation`, and answers the sandbox
/// as it is afterwards.
async fn changed<F, Fut>(
    st: &Shared,
    who: &Principal,
    raw: &str,
    operation: &'static str,
    op: F,
) -> ApiResult<api::Sandbox>
where
    F: FnOnce(Shared, SandboxId) -> Fut,
    Fut: std::future::Future<Output = ApiResult<()>>,
{
    let id = scoped(st, who, raw, operation).await?;
    let result = async {
        op(st.clone(), id.clone()).await?;
        let info = st.node.info(&id).await.map_err(node_error(&id))?;
        Ok(view(&info, who))
    }
    .await;
    st.audited(who, Some(id.as_str()), operation, result).await
}

/// [`crate::api::AppState::scope`] for a change: a refusal is audited too (with the id as
/// given), so attempts on other tenants' sandboxes leave a trace.
pub(crate) async fn scoped(
    st: &Shared,
    who: &Principal,
    raw: &str,
    operation: &str,
) -> ApiResult<SandboxId> {
    let scoped = st.scope(who, raw).await;
    if let Err(e) = &scoped {
        st.audit(who, Some(raw), operation, Some(e), None).await;
    }
    scoped
}

/// Pauses, resumes, suspends, restores or kills a sandbox of the caller's.
pub async fn lifecycle(
    st: &Shared,
    who: &Principal,
    raw: &str,
    change: api::Lifecycle,
) -> ApiResult<api::Sandbox> {
    let tenant = who.tenant.clone();
    changed(st, who, raw, change.operation(), |st, id| async move {
        match change {
            api::Lifecycle::Pause => st.node.pause(&id).await.map_err(node_error(&id)),
            api::Lifecycle::Resume => st.node.resume(&id).await.map_err(node_error(&id)),
            api::Lifecycle::Suspend => st
                .node
                .suspend(&id)
                .await
                .map(drop)
                .map_err(node_error(&id)),
            api::Lifecycle::Restore => restore_sandbox(&st, &tenant, &id).await,
            api::Lifecycle::Kill => kill_sandbox(&st, &id).await,
        }
    })
    .await
}

/// Kills sandbox `id` and revokes its port URLs (a terminated sandbox has no ports).
pub async fn kill_sandbox(st: &Shared, id: &SandboxId) -> ApiResult<()> {
    st.node.kill(id).await.map_err(node_error(id))?;
    st.store.unexpose_all(id.as_str()).await?;
    Ok(())
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

/// Forks a sandbox of the caller's within the tenant's quota; answers the child.
pub async fn fork(st: &Shared, who: &Principal, raw: &str) -> ApiResult<api::Sandbox> {
    Ok(view(&fork_sandbox(st, who, raw).await?, who))
}

/// [`fork`], answering the node's view of the child.
pub async fn fork_sandbox(st: &Shared, who: &Principal, raw: &str) -> ApiResult<Sandbox> {
    let id = scoped(st, who, raw, "sandbox.fork").await?;
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
        super::create::own(st, &child.id, &who.tenant).await?;
        drop(guard);
        Ok(child)
    }
    .await;
    st.audit(
        who,
        Some(id.as_str()),
        "sandbox.fork",
        result.as_ref().err(),
        result.as_ref().ok().map(|c| format!("child {}", c.id)),
    )
    .await;
    result
}

/// Sets a sandbox's timeouts to what `apply` makes of its current ones.
pub async fn set_timeouts(
    st: &Shared,
    who: &Principal,
    raw: &str,
    apply: impl FnOnce(TimeoutPolicy) -> ApiResult<TimeoutPolicy> + Send,
) -> ApiResult<api::Sandbox> {
    changed(st, who, raw, "sandbox.set_timeouts", |st, id| async move {
        let info = st.node.info(&id).await.map_err(node_error(&id))?;
        let policy = apply(info.options.timeouts)?;
        st.node
            .set_timeouts(&id, policy)
            .await
            .map_err(node_error(&id))?;
        Ok(())
    })
    .await
}

/// A sandbox's snapshots, oldest first.
pub async fn snapshots(st: &Shared, who: &Principal, raw: &str) -> ApiResult<Vec<api::Snapshot>> {
    let id = st.scope(who, raw).await?;
    let list = st.node.info(&id).await.map_err(node_error(&id))?.snapshots;
    Ok(list.iter().map(snapshot_view).collect())
}

/// The resource samples of a sandbox of the caller's whose span ends within `[start_ms,
/// end_ms]`, oldest first. Reading them does not wake the sandbox or count as activity.
pub async fn metrics(
    st: &Shared,
    who: &Principal,
    raw: &str,
    start_ms: u64,
    end_ms: u64,
) -> ApiResult<Vec<api::MetricSample>> {
    let id = st.scope(who, raw).await?;
    st.node
        .metrics(&id, start_ms, end_ms)
        .await
        .map_err(node_error(&id))
}

/// Takes a snapshot of a sandbox of the caller's.
pub async fn snapshot(
    st: &Shared,
    who: &Principal,
    raw: &str,
    kind: SnapshotKind,
) -> ApiResult<api::Snapshot> {
    let id = scoped(st, who, raw, "snapshot.create").await?;
    let result = st.node.snapshot(&id, kind).await.map_err(node_error(&id));
    st.audit(
        who,
        Some(id.as_str()),
        "snapshot.create",
        result.as_ref().err(),
        result.as_ref().ok().map(|s| format!("snapshot {}", s.id)),
    )
    .await;
    Ok(snapshot_view(&result?))
}

/// Rolls a sandbox of the caller's back to one of its own snapshots.
pub async fn rollback(
    st: &Shared,
    who: &Principal,
    raw: &str,
    snapshot: &str,
) -> ApiResult<api::Sandbox> {
    let snap: SnapshotId = snapshot
        .parse()
        .map_err(|e: space_node_api::ids::IdError| ApiError::invalid_id(e.to_string()))?;
    changed(st, who, raw, "snapshot.rollback", |st, id| async move {
        // Looked up among this sandbox's own snapshots only.
        let info = st.node.info(&id).await.map_err(node_error(&id))?;
        if info.snapshot(&snap).is_none() {
            return Err(ApiError::snapshot_not_found(id.as_str(), snap.as_str()));
        }
        st.node.rollback(&id, &snap).await.map_err(node_error(&id))
    })
    .await
}
