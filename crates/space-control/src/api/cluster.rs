//! Cluster routes: join tokens and the node list for admins, and the routes nodes call
//! themselves (join, rejoin, heartbeat), which a node authenticates with a one-time join
//! token or its own secret instead of an API key. On `space up`, which has no cluster, every
//! one of them answers `404 not_a_cluster`.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Value};
use space_node_api::cluster::{
    AuditAnswer, AuditBatch, Claim, ClaimAnswer, Heartbeat, HeartbeatAnswer, Join, Membership,
    Rejoin, MAX_AUDIT_BATCH,
};
use space_node_api::secrets::EGRESS_OPERATIONS;

use super::{AdminCaller, ApiJson, ApiPath, OptionalJson, Shared};
use crate::cluster::{Cluster, GRACE, HEARTBEAT, LEAF_DAYS, LEASE};
use crate::error::{ApiError, ApiResult};
use crate::store::{NewAuditEvent, NodeJoin, NodeRow, NodeState, StoreError};

/// Longest a join token may be valid: a week.
pub const MAX_JOIN_TOKEN_SECS: u64 = 7 * 24 * 3600;
/// A join token's validity when the request names none: an hour.
pub const DEFAULT_JOIN_TOKEN_SECS: u64 = 3600;
/// Largest node report accepted, in bytes of JSON.
pub const MAX_REPORT_BYTES: usize = 256 * 1024;

fn ms(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Key events one heartbeat may carry.
const MAX_KEY_EVENTS: usize = 1000;
/// Sandboxes whose secret values one heartbeat may ask for.
const MAX_SECRETS_WANTED: usize = 100;

fn cluster(st: &Shared) -> ApiResult<&Cluster> {
    st.cluster.as_deref().ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_a_cluster",
            "this server runs one node in process (space up); it has no cluster",
        )
    })
}

fn node_json(n: &NodeRow) -> Value {
    let report = crate::cluster::report_of(n);
    json!({
        "id": n.id,
        "address": n.address,
        "incarnation": n.incarnation,
        "state": n.state.as_str(),
        "live": n.live,
        "lease_expires_ms": n.lease_expires_ms,
        "joined_unix_ms": n.joined_unix_ms,
        "accelerator": report.accelerator,
        "qemu": report.qemu,
        "memory_total_mib": report.memory_total_mib,
        "memory_free_mib": report.memory_free_mib,
        "cpus": report.cpus,
        "sandboxes": report.sandboxes.len(),
        "templates": report.templates.iter().map(|t| t.template.to_string()).collect::<Vec<_>>(),
    })
}

fn report_value(report: Value) -> ApiResult<Value> {
    let len = serde_json::to_vec(&report)
        .map(|v| v.len())
        .unwrap_or(usize::MAX);
    if len > MAX_REPORT_BYTES {
        return Err(ApiError::too_large(format!(
            "a node report is at most {MAX_REPORT_BYTES} bytes (this one is {len})"
        )));
    }
    Ok(report)
}

async fn audit_node(st: &Shared, node: &str, operation: &str, outcome: Option<&ApiError>) {
    let event = NewAuditEvent {
        tenant: None,
        key_id: None,
        sandbox: None,
        operation: operation.to_owned(),
        result: outcome.map_or("ok", |e| e.code).to_owned(),
        detail: Some(match outcome {
            Some(e) => format!("node {node}: {}", e.message),
            None => format!("node {node}"),
        }),
    };
    if let Err(e) = st.store.record(event).await {
        tracing::error!(error = %e, "recording a node event");
    }
}

/// Body of `POST /v1/cluster/join-tokens`.
#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "JoinTokenRequest")]
pub struct TokenBody {
    /// How long the token works, seconds (default 3600, at most a week).
    #[serde(default)]
    #[schemars(range(min = 1, max = 604_800))]
    ttl_s: Option<u64>,
}

/// `POST /v1/cluster/join-tokens`: a one-time token a node joins with (admin).
pub async fn create_join_token(
    State(st): State<Shared>,
    AdminCaller(who): AdminCaller,
    OptionalJson(body): OptionalJson<TokenBody>,
) -> ApiResult<Response> {
    cluster(&st)?;
    let ttl = body
        .unwrap_or_default()
        .ttl_s
        .unwrap_or(DEFAULT_JOIN_TOKEN_SECS);
    if ttl == 0 || ttl > MAX_JOIN_TOKEN_SECS {
        return Err(ApiError::invalid(format!(
            "ttl_s must be 1 to {MAX_JOIN_TOKEN_SECS} seconds"
        )));
    }
    let result = st
        .store
        .create_join_token(ttl * 1000)
        .await
        .map_err(ApiError::from);
    st.audit(
        &who,
        None,
        "node.token",
        result.as_ref().err(),
        result.as_ref().ok().map(|t| format!("join token {}", t.id)),
    )
    .await;
    let t = result?;
    Ok((
        StatusCode::CREATED,
        Json(json!({"token": t.token, "id": t.id, "expires_unix_ms": t.expires_unix_ms})),
    )
        .into_response())
}

fn check_address(address: &str) -> ApiResult<()> {
    let ok = !address.is_empty()
        && address.len() <= 255
        && address
            .rsplit_once(':')
            .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0))
        && !address.chars().any(|c| c.is_control() || c.is_whitespace());
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid(format!(
            "address {:?} must be host:port",
            address.chars().take(80).collect::<String>()
        )))
    }
}

/// The address and public key of a join or rejoin, checked; the key's bytes.
fn node_key(address: &str, public_key: &str) -> ApiResult<Vec<u8>> {
    check_address(address)?;
    let key = B64
        .decode(public_key.as_bytes())
        .map_err(|e| ApiError::invalid(format!("public_key: {e}")))?;
    space_node_api::tls::check_node_key(&key)
        .map_err(|e| ApiError::invalid(format!("public_key: {e}")))?;
    Ok(key)
}

/// A certificate of the cluster CA for `node_id` over `key` (already checked by
/// [`node_key`], so a failure here is the CA's own: an internal fault), and its end of
/// validity.
fn certify(c: &Cluster, node_id: &str, key: &[u8]) -> ApiResult<(String, u64)> {
    c.ca().certify_node(node_id, key, LEAF_DAYS).map_err(|e| {
        tracing::error!(node = node_id, error = %e, "signing a node certificate failed");
        ApiError::internal(format!("signing the node certificate: {e}"))
    })
}

/// The answer of a join or rejoin.
fn membership(c: &Cluster, row: &NodeRow, cert: (String, u64), secret: &str) -> Membership {
    Membership {
        node_id: row.id.clone(),
        incarnation: row.incarnation,
        cert_pem: cert.0,
        not_after_unix: cert.1,
        ca_pem: c.ca().cert_pem().to_owned(),
        secret: secret.to_owned(),
        lease_ms: ms(LEASE),
        heartbeat_ms: ms(HEARTBEAT),
    }
}

fn secret() -> String {
    let bytes: [u8; 24] = rand::random();
    format!("spacenode_{}", hex::encode(bytes))
}

/// `POST /v1/cluster/join`: a node with a join token becomes a member; the answer carries
/// its certificate (over the public key it sent), the cluster CA, its incarnation and the
/// secret of its heartbeats.
pub async fn join(
    State(st): State<Shared>,
    ApiJson(body): ApiJson<Join>,
) -> ApiResult<Json<Membership>> {
    let c = cluster(&st)?;
    let node = body.node_id.clone();
    let result = async {
        let key = node_key(&body.address, &body.public_key)?;
        // The key is checked before the token is used, so a bad key does not burn it.
        let cert = certify(c, &body.node_id, &key)?;
        let secret = secret();
        let row = st
            .store
            .join_node(
                &body.token,
                NodeJoin {
                    id: body.node_id.clone(),
                    address: body.address.clone(),
                    token_hash: crate::keys::hash(&secret),
                    report: report_value(body.report)?,
                },
                ms(LEASE),
            )
            .await
            .map_err(|e| match e {
                StoreError::Invalid(m) => ApiError::unauthorized(m),
                other => other.into(),
            })?;
        Ok::<_, ApiError>(membership(c, &row, cert, &secret))
    }
    .await;
    audit_node(&st, &node, "node.join", result.as_ref().err()).await;
    result.map(Json)
}

/// `POST /v1/cluster/rejoin`: a member that restarted or was lost comes back with its
/// secret as a new incarnation, with a fresh certificate.
pub async fn rejoin(
    State(st): State<Shared>,
    ApiJson(body): ApiJson<Rejoin>,
) -> ApiResult<Json<Membership>> {
    let c = cluster(&st)?;
    let node = body.node_id.clone();
    let result = async {
        let key = node_key(&body.address, &body.public_key)?;
        let row = st
            .store
            .rejoin_node(
                &body.node_id,
                &body.secret,
                &body.address,
                &report_value(body.report)?,
                ms(LEASE),
            )
            .await
            .map_err(|e| match e {
                StoreError::NotFound { .. } => ApiError::unauthorized(format!(
                    "node {} is unknown, was removed, or its secret is wrong",
                    body.node_id
                )),
                other => other.into(),
            })?;
        let cert = certify(c, &body.node_id, &key)?;
        Ok::<_, ApiError>(membership(c, &row, cert, &body.secret))
    }
    .await;
    audit_node(&st, &node, "node.rejoin", result.as_ref().err()).await;
    result.map(Json)
}

/// `POST /v1/cluster/heartbeat`: renews the node's lease (on the database's clock) and
/// records its report. `409 stale_incarnation` when the node must stop and rejoin.
pub async fn heartbeat(
    State(st): State<Shared>,
    ApiJson(body): ApiJson<Heartbeat>,
) -> ApiResult<Json<HeartbeatAnswer>> {
    cluster(&st)?;
    let cl = st.cluster.clone().expect("a cluster");
    let mut report = report_value(body.report)?;
    // Key events of the node's go to the audit log, not into its stored report.
    let key_events = report
        .as_object_mut()
        .and_then(|o| o.remove("key_events"))
        .unwrap_or_default();
    let key_events: Vec<space_node_api::settings::KeyEventReport> =
        serde_json::from_value(key_events).unwrap_or_default();
    match st
        .store
        .heartbeat(
            &body.node_id,
            body.incarnation,
            &body.secret,
            &report,
            ms(LEASE),
        )
        .await
    {
        Ok(row) => {
            for e in key_events.iter().take(MAX_KEY_EVENTS) {
                let mut event = crate::archive::key_audit_event(e);
                event.detail = event
                    .detail
                    .map(|d| format!("{d} on node {}", body.node_id));
                st.store.record(event).await?;
            }
            cl.configure_if_stale(&row, report["settings"].as_str())
                .await;
            let wanted: Vec<space_node_api::settings::SecretsWanted> =
                serde_json::from_value(report["secrets_wanted"].clone()).unwrap_or_default();
            if !wanted.is_empty() {
                send_secrets(&st, &row, wanted);
            }
            // What the node holds of a sandbox the database gives to another node at an
            // epoch as new as the node's (it moved while this node was away) must go: the
            // node discards what is listed. A sandbox the node holds under a newer epoch
            // than the database's is being moved to it (adopted, not yet recorded).
            let report: space_node_api::NodeReport =
                serde_json::from_value(report).unwrap_or_default();
            let held: std::collections::HashMap<String, u64> = report
                .sandboxes
                .iter()
                .filter(|u| !matches!(u.state, space_node_api::State::Terminated))
                .map(|u| (u.id.to_string(), u.epoch))
                .collect();
            let owners = st.store.owners(held.keys().cloned().collect()).await?;
            let foreign: Vec<String> = owners
                .iter()
                .filter(|(id, (owner, epoch))| {
                    let mine = held.get(*id).copied().unwrap_or(0);
                    owner.as_deref().is_some_and(|o| o != body.node_id)
                        && u64::try_from(*epoch).unwrap_or(0) >= mine
                })
                .map(|(id, _)| id.clone())
                .collect();
            if !foreign.is_empty() {
                tracing::warn!(node = %body.node_id, count = foreign.len(), "a node runs sandboxes that moved; it is told to kill them");
            }
            Ok(Json(HeartbeatAnswer {
                lease_ms: ms(LEASE),
                state: row.state.as_str().to_owned(),
                foreign,
            }))
        }
        Err(StoreError::NotFound { .. }) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "stale_incarnation",
            format!(
                "incarnation {} of node {} is not the cluster's member any more (lost, removed \
                 or replaced): stop its sandboxes and rejoin",
                body.incarnation, body.node_id
            ),
        )),
        Err(e) => Err(e.into()),
    }
}

/// `GET /v1/nodes` (admin).
pub async fn list_nodes(
    State(st): State<Shared>,
    AdminCaller(_who): AdminCaller,
) -> ApiResult<Json<Value>> {
    cluster(&st)?;
    let nodes = st.store.nodes().await?;
    Ok(Json(json!({
        "nodes": nodes.iter().map(node_json).collect::<Vec<_>>(),
        "lease_ms": ms(LEASE),
        "grace_ms": ms(GRACE),
    })))
}

async fn set_state(
    st: &Shared,
    who: &crate::store::Principal,
    raw: &str,
    state: NodeState,
    operation: &str,
) -> ApiResult<Json<Value>> {
    cluster(st)?;
    let result = st
        .store
        .set_node_state(raw, state)
        .await
        .map_err(|e| match e {
            StoreError::NotFound { .. } => ApiError::new(
                StatusCode::NOT_FOUND,
                "node_not_found",
                format!("no node {}", raw.chars().take(80).collect::<String>()),
            ),
            other => other.into(),
        });
    st.audit(
        who,
        None,
        operation,
        result.as_ref().err(),
        Some(format!("node {}", raw.chars().take(80).collect::<String>())),
    )
    .await;
    result.map(|n| Json(node_json(&n)))
}

/// `POST /v1/nodes/{id}/drain` (admin): the node takes no new sandboxes.
pub async fn drain_node(
    State(st): State<Shared>,
    AdminCaller(who): AdminCaller,
    ApiPath(raw): ApiPath<String>,
) -> ApiResult<Json<Value>> {
    set_state(&st, &who, &raw, NodeState::Draining, "node.drain").await
}

/// `DELETE /v1/nodes/{id}` (admin): the node is out of the cluster; its heartbeats and
/// rejoins are refused from now on.
pub async fn remove_node(
    State(st): State<Shared>,
    AdminCaller(who): AdminCaller,
    ApiPath(raw): ApiPath<String>,
) -> ApiResult<Json<Value>> {
    set_state(&st, &who, &raw, NodeState::Removed, "node.remove").await
}

/// The longest claim a node may take.
const MAX_CLAIM_MS: u64 = 30 * 60 * 1000;

/// `POST /v1/cluster/claim`: a node claims work that one node of the cluster must do once
/// (building a stock template and publishing it to the object store), or gives the claim
/// up. Answers whether the node holds it.
pub async fn claim(
    State(st): State<Shared>,
    ApiJson(body): ApiJson<Claim>,
) -> ApiResult<Json<ClaimAnswer>> {
    cluster(&st)?;
    let valid = body.name.len() <= 128
        && body.name.starts_with("template:")
        && body
            .name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"@.:_-".contains(&b));
    if !valid {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_claim",
            format!(
                "claim name {:?}: a node claims `template:<name>@<version>`",
                body.name
            ),
        ));
    }
    if !st
        .store
        .node_authentic(&body.node_id, body.incarnation, &body.secret)
        .await?
    {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "stale_incarnation",
            format!(
                "incarnation {} of node {} is not the cluster's member",
                body.incarnation, body.node_id
            ),
        ));
    }
    let holder = format!("node:{}", body.node_id);
    if body.release {
        st.store.release_claim(&body.name, &holder).await?;
        return Ok(Json(ClaimAnswer { held: false }));
    }
    let ttl = body
        .ttl_ms
        .unwrap_or(MAX_CLAIM_MS)
        .clamp(1000, MAX_CLAIM_MS);
    let held = st.store.claim(&body.name, &holder, ttl).await?;
    Ok(Json(ClaimAnswer { held }))
}

/// `POST /v1/cluster/audit`: a member delivers its gateway's audit events, recorded as on
/// `space up` (the sandbox's tenant, the operation, `denied`/`exfiltration`/`ok`, the
/// detail) at the time they happened, all in one transaction. An event naming an operation
/// the gateway does not make is left out; the rest of the batch is recorded.
pub async fn audit(
    State(st): State<Shared>,
    ApiJson(body): ApiJson<AuditBatch>,
) -> ApiResult<Json<AuditAnswer>> {
    cluster(&st)?;
    if body.events.len() > MAX_AUDIT_BATCH {
        return Err(ApiError::invalid(format!(
            "{} events: a delivery carries at most {MAX_AUDIT_BATCH}",
            body.events.len()
        )));
    }
    if !st
        .store
        .node_authentic(&body.node_id, body.incarnation, &body.secret)
        .await?
    {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "stale_incarnation",
            format!(
                "incarnation {} of node {} is not the cluster's member",
                body.incarnation, body.node_id
            ),
        ));
    }
    let now = space_node_api::sandbox::now_ms();
    let mut tenants: std::collections::HashMap<String, Option<crate::store::TenantName>> =
        Default::default();
    let mut events = Vec::with_capacity(body.events.len());
    for e in body.events {
        if !EGRESS_OPERATIONS.contains(&e.operation.as_str()) {
            tracing::warn!(node = %body.node_id, operation = %e.operation.chars().take(64).collect::<String>(), "a node delivered an event of no gateway operation; left out");
            continue;
        }
        let tenant = match tenants.get(e.sandbox.as_str()) {
            Some(t) => t.clone(),
            None => {
                let t = st.store.sandbox_tenant(e.sandbox.as_str()).await?;
                tenants.insert(e.sandbox.as_str().to_owned(), t.clone());
                t
            }
        };
        let event = crate::egress::egress_audit_event(
            tenant,
            e.sandbox.as_str(),
            &e.operation,
            &e.host,
            e.port,
            &e.detail,
        );
        events.push((e.at_unix_ms.min(now), event));
    }
    let recorded = st.store.record_all_at(events).await?;
    Ok(Json(AuditAnswer { recorded }))
}

/// Sends node `row` the secret values its sandboxes lack, in the background (each sandbox
/// once at a time): only for sandboxes the database gives to that node, only their tenant's
/// secrets, only the names they are bound to.
fn send_secrets(st: &Shared, row: &NodeRow, wanted: Vec<space_node_api::settings::SecretsWanted>) {
    use space_node_api::NodeApi as _;
    let Some(cluster) = st.cluster.clone() else {
        return;
    };
    for w in wanted.into_iter().take(MAX_SECRETS_WANTED) {
        if !cluster.start_sending_secrets(&w.id) {
            continue;
        }
        let (st, row, cluster) = (st.clone(), row.clone(), cluster.clone());
        tokio::spawn(async move {
            let id = w.id.clone();
            let sent = async {
                let owner = st.store.sandbox_node(id.as_str()).await?;
                if owner.as_ref().map(|(n, _)| n.as_str()) != Some(row.id.as_str()) {
                    return Ok::<_, ApiError>(false);
                }
                let Some(tenant) = st.store.sandbox_tenant(id.as_str()).await? else {
                    return Ok(false);
                };
                let mut values = std::collections::BTreeMap::new();
                for name in w.names.iter().take(64) {
                    if let Some(stored) = st.vault.value(&tenant, name).await? {
                        values.insert(name.clone(), stored.to_wire());
                    }
                }
                let client = cluster
                    .client(&row)
                    .map_err(|e| ApiError::internal(e.to_string()))?;
                client
                    .set_secrets(&id, space_node_api::SecretMap(values))
                    .await?;
                Ok(true)
            }
            .await;
            match sent {
                Ok(true) => tracing::info!(%id, node = %row.id, "secret values sent"),
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(%id, node = %row.id, error = %e.message, "sending secret values")
                }
            }
            cluster.done_sending_secrets(&id);
        });
    }
}
