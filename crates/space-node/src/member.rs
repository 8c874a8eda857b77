//! A node's membership of a cluster (`space node --control URL`): it joins with a one-time
//! token (or, having joined before, rejoins with its secret as a new incarnation), serves the
//! node API with the certificate it got, and heartbeats.
//!
//! **Fencing.** Each heartbeat that succeeds moves the node's own deadline to the moment it
//! *sent* the heartbeat plus the lease, minus [`FENCE_MARGIN`]: the control plane renewed the
//! lease on the database's clock after that moment, so the node's deadline always falls
//! before the lease runs out, however long the answer took. When the deadline passes without
//! a renewal the node fences itself: it pauses every running VM (a paused guest does nothing
//! and sends nothing) and refuses node API calls until a heartbeat succeeds again, when it
//! resumes them. If the control plane answers that this incarnation is no longer the member
//! (it was taken for lost, its sandboxes given away), the node kills the VMs it holds and
//! rejoins as a new incarnation. A heartbeat's answer also lists the sandboxes this node
//! still runs that the database gives to another node (they moved while it was away); their
//! VMs are killed at once.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;

use crate::api::{Identity, LocalNode, NodeApi, NodeKey, NodeServer};
use crate::ids::SandboxId;
use crate::record::State;

/// How long before the lease runs out a node that could not renew stops its VMs.
pub const FENCE_MARGIN: Duration = Duration::from_secs(3);
/// How long one heartbeat may take.
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(2);
/// The membership file, under the data directory's `state/`.
const MEMBERSHIP_FILE: &str = "membership.json";

/// A failure to join or to serve.
#[derive(Debug, thiserror::Error)]
#[error("cluster membership: {0}")]
pub struct MemberError(pub String);

fn err<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> MemberError + '_ {
    move |e| MemberError(format!("{what}: {e}"))
}

/// How a node takes part in a cluster.
#[derive(Debug, Clone)]
pub struct MemberConfig {
    /// The control plane's URL (any replica).
    pub control: String,
    /// A join token; needed the first time only.
    pub join_token: Option<String>,
    /// The node's id (a DNS label).
    pub node_id: String,
    /// The address control replicas reach its node API at (`host:port`).
    pub advertise: String,
    /// Where the node API listens.
    pub listen: std::net::SocketAddr,
}

/// What a node keeps of its membership across restarts (mode 0600).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Membership {
    node_id: String,
    secret: String,
}

#[derive(Debug, Clone, Deserialize)]
struct Granted {
    incarnation: i64,
    cert_pem: String,
    not_after_unix: u64,
    ca_pem: String,
    secret: String,
    lease_ms: u64,
    heartbeat_ms: u64,
}

/// A node taking part in a cluster.
pub struct Member {
    server: NodeServer,
    task: JoinHandle<()>,
    fenced: Arc<AtomicBool>,
    incarnation: Arc<std::sync::atomic::AtomicI64>,
}

impl std::fmt::Debug for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Member").finish_non_exhaustive()
    }
}

struct Session {
    http: reqwest::Client,
    control: String,
    local: LocalNode,
    config: MemberConfig,
    path: PathBuf,
}

impl Session {
    async fn post(
        &self,
        route: &str,
        body: serde_json::Value,
    ) -> Result<(u16, serde_json::Value), MemberError> {
        let resp = self
            .http
            .post(format!("{}{route}", self.control))
            .json(&body)
            .send()
            .await
            .map_err(err("reaching the control plane"))?;
        let status = resp.status().as_u16();
        let v = resp
            .json::<serde_json::Value>()
            .await
            .map_err(err("the control plane's answer"))?;
        Ok((status, v))
    }

    fn saved(&self) -> Option<Membership> {
        let text = std::fs::read_to_string(&self.path).ok()?;
        serde_json::from_str(&text).ok()
    }

    fn save(&self, m: &Membership) -> Result<(), MemberError> {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        let tmp = self.path.with_extension("tmp");
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(err("writing the membership"))?;
        f.write_all(&serde_json::to_vec(m).expect("serializes"))
            .and_then(|()| f.sync_all())
            .map_err(err("writing the membership"))?;
        std::fs::rename(&tmp, &self.path).map_err(err("writing the membership"))
    }

    /// Joins (first time) or rejoins (known secret); returns what was granted.
    async fn enter(&self, key: &NodeKey) -> Result<Granted, MemberError> {
        let report = serde_json::to_value(
            self.local
                .report()
                .await
                .map_err(err("the node's report"))?,
        )
        .expect("serializes");
        let public_key = B64.encode(key.public_raw());
        let (route, body) = match (self.saved(), &self.config.join_token) {
            (Some(m), _) if m.node_id == self.config.node_id => (
                "/v1/cluster/rejoin",
                serde_json::json!({
                    "node_id": m.node_id, "secret": m.secret, "address": self.config.advertise,
                    "public_key": public_key, "report": report,
                }),
            ),
            (_, Some(token)) => (
                "/v1/cluster/join",
                serde_json::json!({
                    "token": token, "node_id": self.config.node_id,
                    "address": self.config.advertise, "public_key": public_key, "report": report,
                }),
            ),
            (_, None) => {
                return Err(MemberError(format!(
                    "node {} has not joined this cluster yet: give it --join-token (from \
                     `space node token` on the control plane)",
                    self.config.node_id
                )))
            }
        };
        let (status, v) = self.post(route, body).await?;
        if status != 200 {
            return Err(MemberError(format!(
                "the control plane refused {route}: {}",
                v["error"]["message"].as_str().unwrap_or("(no message)")
            )));
        }
        let granted: Granted = serde_json::from_value(v).map_err(err("the membership granted"))?;
        self.save(&Membership {
            node_id: self.config.node_id.clone(),
            secret: granted.secret.clone(),
        })?;
        Ok(granted)
    }
}

impl Member {
    /// Joins the cluster and serves the node API; heartbeats from then on.
    pub async fn start(
        local: LocalNode,
        data_dir: &Path,
        config: MemberConfig,
    ) -> Result<Member, MemberError> {
        let session = Session {
            http: reqwest::Client::builder()
                .timeout(HEARTBEAT_TIMEOUT * 5)
                .build()
                .map_err(err("an HTTP client"))?,
            control: config.control.trim_end_matches('/').to_owned(),
            local: local.clone(),
            path: data_dir.join("state").join(MEMBERSHIP_FILE),
            config: config.clone(),
        };
        let key = NodeKey::generate().map_err(err("the node key"))?;
        let granted = session.enter(&key).await?;
        let identity = Identity::new(
            &key.leaf(&granted.cert_pem, granted.not_after_unix),
            &granted.ca_pem,
        )
        .map_err(err("the node certificate"))?;
        let fenced = Arc::new(AtomicBool::new(false));
        let api: Arc<dyn NodeApi> = Arc::new(Fenced {
            inner: local.clone(),
            fenced: fenced.clone(),
        });
        let server = NodeServer::start(api, config.listen, &identity)
            .await
            .map_err(err("serving the node API"))?;
        let incarnation = Arc::new(std::sync::atomic::AtomicI64::new(granted.incarnation));
        tracing::info!(node = %config.node_id, incarnation = granted.incarnation, addr = %server.local_addr(), "joined the cluster");
        let task = tokio::spawn(heartbeats(
            session,
            key,
            granted,
            fenced.clone(),
            incarnation.clone(),
        ));
        Ok(Member {
            server,
            task,
            fenced,
            incarnation,
        })
    }

    /// Where the node API listens.
    pub fn local_addr(&self) -> std::net::SocketAddr {
        self.server.local_addr()
    }

    /// Whether the node is fenced now.
    pub fn fenced(&self) -> bool {
        self.fenced.load(Ordering::SeqCst)
    }

    /// The current incarnation.
    pub fn incarnation(&self) -> i64 {
        self.incarnation.load(Ordering::SeqCst)
    }

    /// Stops heartbeating and serving.
    pub async fn stop(self) {
        self.task.abort();
        self.server.stop().await;
    }
}

async fn running(local: &LocalNode) -> Vec<SandboxId> {
    local
        .usage()
        .await
        .unwrap_or_default()
        .into_iter()
        .filter(|u| u.state == State::Running)
        .map(|u| u.id)
        .collect()
}

async fn heartbeats(
    session: Session,
    key: NodeKey,
    mut granted: Granted,
    fenced: Arc<AtomicBool>,
    incarnation: Arc<std::sync::atomic::AtomicI64>,
) {
    let lease = Duration::from_millis(granted.lease_ms);
    let mut deadline = Instant::now() + lease.saturating_sub(FENCE_MARGIN);
    let mut paused: Vec<SandboxId> = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(granted.heartbeat_ms.max(100)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let sent = Instant::now();
        let report = match session.local.report().await {
            Ok(r) => serde_json::to_value(r).expect("serializes"),
            Err(e) => {
                tracing::warn!(error = %e, "the node's report");
                serde_json::Value::Null
            }
        };
        let body = serde_json::json!({
            "node_id": session.config.node_id,
            "incarnation": granted.incarnation,
            "secret": granted.secret,
            "report": report,
        });
        let answer = tokio::time::timeout(
            HEARTBEAT_TIMEOUT,
            session.post("/v1/cluster/heartbeat", body),
        )
        .await;
        match answer {
            Ok(Ok((200, v))) => {
                deadline = sent + lease.saturating_sub(FENCE_MARGIN);
                // Sandboxes that moved to another node while this one was away: their VMs
                // here must not run on.
                for id in v["foreign"].as_array().into_iter().flatten() {
                    let Some(id) = id.as_str().and_then(|s| s.parse::<SandboxId>().ok()) else {
                        continue;
                    };
                    tracing::warn!(%id, "the sandbox belongs to another node now: killing its VM here");
                    paused.retain(|p| p != &id);
                    if let Err(e) = session.local.kill(&id).await {
                        tracing::warn!(%id, error = %e, "killing a sandbox that moved");
                    }
                }
                if fenced.swap(false, Ordering::SeqCst) {
                    tracing::warn!("lease renewed: unfencing");
                    for id in paused.drain(..) {
                        if let Err(e) = session.local.resume(&id).await {
                            tracing::warn!(%id, error = %e, "resuming after a fence");
                        }
                    }
                }
                continue;
            }
            Ok(Ok((409, _))) => {
                // No longer the member: what this incarnation ran was given away.
                tracing::warn!(
                    incarnation = granted.incarnation,
                    "this incarnation is stale: killing its VMs and rejoining"
                );
                fenced.store(true, Ordering::SeqCst);
                paused.clear();
                let all = session.local.usage().await.unwrap_or_default();
                for u in all {
                    if matches!(u.state, State::Running | State::Paused) {
                        let _ = session.local.kill(&u.id).await;
                    }
                }
                match session.enter(&key).await {
                    Ok(g) => {
                        tracing::info!(incarnation = g.incarnation, "rejoined the cluster");
                        incarnation.store(g.incarnation, Ordering::SeqCst);
                        granted = g;
                        deadline = Instant::now() + lease.saturating_sub(FENCE_MARGIN);
                        fenced.store(false, Ordering::SeqCst);
                    }
                    Err(e) => tracing::warn!(error = %e, "rejoining"),
                }
                continue;
            }
            Ok(Ok((status, v))) => {
                tracing::warn!(status, answer = %v, "a heartbeat was refused");
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "a heartbeat failed"),
            Err(_) => tracing::warn!("a heartbeat took longer than {HEARTBEAT_TIMEOUT:?}"),
        }
        if Instant::now() >= deadline && !fenced.swap(true, Ordering::SeqCst) {
            tracing::warn!(
                "the lease could not be renewed in time: fencing (pausing every running VM)"
            );
            for id in running(&session.local).await {
                match session.local.pause(&id).await {
                    Ok(()) => paused.push(id),
                    Err(e) => tracing::warn!(%id, error = %e, "pausing to fence"),
                }
            }
        }
    }
}

/// The node API of a member: refuses every call while the node is fenced.
struct Fenced {
    inner: LocalNode,
    fenced: Arc<AtomicBool>,
}

impl Fenced {
    fn check(&self) -> crate::api::NodeResult<()> {
        if self.fenced.load(Ordering::SeqCst) {
            Err(crate::api::Fault::new(
                crate::api::FaultCode::Unavailable,
                "this node is fenced: it could not renew its lease",
            ))
        } else {
            Ok(())
        }
    }
}

macro_rules! fenced_calls {
    ($($name:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {
        #[async_trait::async_trait]
        impl NodeApi for Fenced {
            $(async fn $name(&self, $($arg: $ty),*) -> crate::api::NodeResult<$ret> {
                self.check()?;
                self.inner.$name($($arg),*).await
            })*
        }
    };
}

fenced_calls! {
    status() -> crate::api::NodeStatus;
    create(req: crate::sandbox::CreateRequest) -> crate::api::Sandbox;
    fork(id: &SandboxId) -> crate::api::Sandbox;
    info(id: &SandboxId) -> crate::api::Sandbox;
    list() -> Vec<crate::api::Sandbox>;
    usage() -> Vec<crate::api::Usage>;
    pause(id: &SandboxId) -> ();
    resume(id: &SandboxId) -> ();
    suspend(id: &SandboxId) -> crate::api::Snapshot;
    restore(id: &SandboxId) -> ();
    kill(id: &SandboxId) -> ();
    touch(id: &SandboxId) -> ();
    snapshot(id: &SandboxId, kind: crate::record::SnapshotKind) -> crate::api::Snapshot;
    rollback(id: &SandboxId, snapshot: &crate::ids::SnapshotId) -> ();
    set_timeouts(id: &SandboxId, timeouts: crate::record::TimeoutPolicy) -> crate::api::Sandbox;
    set_egress(id: &SandboxId, policy: crate::gateway::EgressPolicy) -> crate::api::Sandbox;
    console_tail(id: &SandboxId, max_bytes: usize) -> Vec<u8>;
    guest(id: &SandboxId) -> (space_proto::GuestClient, Option<crate::api::Woke>);
    templates() -> Vec<crate::api::TemplateInfo>;
    template(name: &crate::ids::TemplateName, version: &crate::ids::VersionReq) -> crate::api::TemplateInfo;
    images() -> Vec<String>;
    build_template(build: crate::api::TemplateBuild) -> crate::api::TemplateInfo;
    delete_template(template: &crate::ids::TemplateRef) -> ();
    pools() -> Vec<crate::api::Pool>;
    ca_pem() -> String;
}
