//! A node's membership of a cluster (`space node --control URL`): it joins with a one-time
//! token (or, having joined before, rejoins with its secret as a new incarnation), serves the
//! node API with the certificate it got, and heartbeats.
//!
//! **Fencing.** Each heartbeat that succeeds moves the node's own deadline to the moment it
//! *sent* the heartbeat plus the lease, minus [`FENCE_MARGIN`]: the control plane renewed the
//! lease on the database's clock after that moment, so the node's deadline always falls
//! before the lease runs out, however long the answer took. The deadline is kept by a
//! watchdog process ([`crate::fence`]) as well as by the node: when it passes without a
//! renewal, the watchdog stops every QEMU process of the node (SIGSTOP) even if the node's
//! own process is stopped, stuck or dead, and the node refuses node API calls and commits
//! nothing to the object store. A later successful heartbeat of the same incarnation
//! unfences it (the guests continue). If the control plane answers that this incarnation is
//! no longer the member (it was taken for lost, its running sandboxes given away), the node
//! stays fenced and rejoins as a new incarnation. Every heartbeat's answer lists the
//! sandboxes this node still holds that the database gives to another node (they moved
//! while it was away): they are discarded (VM killed, local state dropped, nothing written to
//! the store) before the fence lifts. A member starts fenced, so that the guests a restarted
//! node process found running stay stopped until its first heartbeat says which moved.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;

use serde::de::DeserializeOwned;
use space_node_api::cluster::{
    report_json, AuditAnswer, AuditBatch, Claim, ClaimAnswer, Heartbeat, HeartbeatAnswer, Join,
    Membership as Granted, Rejoin, AUDIT_PATH, CLAIM_PATH, HEARTBEAT_PATH, JOIN_PATH,
    MAX_AUDIT_BATCH, REJOIN_PATH,
};

use crate::api::{Gate, Gated, Identity, LocalNode, NodeApi, NodeKey, NodeServer, TemplateBuild};
use crate::audit_spool::EgressSpool;
use crate::fence::Watchdog;
use crate::ids::SandboxId;

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
    /// The spool the node's gateway writes its audit events to, delivered from here to the
    /// control plane's audit log (`None`: the gateway's events are not audited).
    pub egress: Option<Arc<EgressSpool>>,
}

/// The control plane's refusal of a request: its status and message.
#[derive(Debug)]
struct Refused {
    status: u16,
    message: String,
}

/// What a node keeps of its membership across restarts (mode 0600).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Membership {
    node_id: String,
    secret: String,
}

/// A node taking part in a cluster.
pub struct Member {
    server: NodeServer,
    task: JoinHandle<()>,
    delivery: Option<JoinHandle<()>>,
    fence: Arc<Fence>,
    fenced: Arc<AtomicBool>,
    incarnation: Arc<std::sync::atomic::AtomicI64>,
    session: Session,
    secret: Arc<std::sync::Mutex<String>>,
}

impl std::fmt::Debug for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Member").finish_non_exhaustive()
    }
}

#[derive(Clone)]
struct Session {
    http: reqwest::Client,
    control: String,
    local: LocalNode,
    config: MemberConfig,
    path: PathBuf,
}

impl Session {
    /// Sends `body` to `route` of the control plane: its answer, or the refusal's message.
    async fn post<B: Serialize, A: DeserializeOwned>(
        &self,
        route: &str,
        body: &B,
    ) -> Result<Result<A, Refused>, MemberError> {
        let resp = self
            .http
            .post(format!("{}{route}", self.control))
            .json(body)
            .send()
            .await
            .map_err(err("reaching the control plane"))?;
        let status = resp.status().as_u16();
        if status == 200 {
            let answer = resp
                .json::<A>()
                .await
                .map_err(err("the control plane's answer"))?;
            return Ok(Ok(answer));
        }
        let v = resp
            .json::<serde_json::Value>()
            .await
            .unwrap_or(serde_json::Value::Null);
        Ok(Err(Refused {
            status,
            message: v["error"]["message"]
                .as_str()
                .unwrap_or("(no message)")
                .to_owned(),
        }))
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
        let report = report_json(
            &self
                .local
                .report()
                .await
                .map_err(err("the node's report"))?,
        );
        let public_key = B64.encode(key.public_raw());
        let address = self.config.advertise.clone();
        let answer = match (self.saved(), &self.config.join_token) {
            (Some(m), _) if m.node_id == self.config.node_id => {
                let body = Rejoin {
                    node_id: m.node_id,
                    secret: m.secret,
                    address,
                    public_key,
                    report,
                };
                (REJOIN_PATH, self.post(REJOIN_PATH, &body).await?)
            }
            (_, Some(token)) => {
                let body = Join {
                    token: token.clone(),
                    node_id: self.config.node_id.clone(),
                    address,
                    public_key,
                    report,
                };
                (JOIN_PATH, self.post(JOIN_PATH, &body).await?)
            }
            (_, None) => {
                return Err(MemberError(format!(
                    "node {} has not joined this cluster yet: give it --join-token (from \
                     `space node token` on the control plane)",
                    self.config.node_id
                )))
            }
        };
        let granted: Granted = match answer {
            (_, Ok(g)) => g,
            (route, Err(r)) => {
                return Err(MemberError(format!(
                    "the control plane refused {route}: {}",
                    r.message
                )))
            }
        };
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
        // Fenced from the start: the guests this node process found running may have moved
        // while it was away; the first heartbeat names those, and lifts the fence.
        let watchdog = Watchdog::spawn().map_err(err("starting the fence watchdog"))?;
        let fenced = Arc::new(AtomicBool::new(false));
        let fence = Arc::new(Fence {
            flag: fenced.clone(),
            node: local.node().clone(),
            watchdog: std::sync::Mutex::new(Arc::new(watchdog)),
        });
        fence.raise();
        let api: Arc<dyn NodeApi> = Arc::new(Gated {
            inner: local.clone(),
            gate: FenceGate(fenced.clone()),
        });
        let server = NodeServer::start(api, config.listen, &identity)
            .await
            .map_err(err("serving the node API"))?;
        let incarnation = Arc::new(std::sync::atomic::AtomicI64::new(granted.incarnation));
        let secret = Arc::new(std::sync::Mutex::new(granted.secret.clone()));
        tracing::info!(node = %config.node_id, incarnation = granted.incarnation, addr = %server.local_addr(), "joined the cluster");
        let task = tokio::spawn(heartbeats(
            session.clone(),
            key,
            granted,
            fence.clone(),
            incarnation.clone(),
            secret.clone(),
        ));
        let delivery = config.egress.clone().map(|spool| {
            tokio::spawn(deliver_egress(
                session.clone(),
                spool,
                incarnation.clone(),
                secret.clone(),
            ))
        });
        Ok(Member {
            server,
            task,
            delivery,
            fence,
            fenced,
            incarnation,
            session,
            secret,
        })
    }

    /// Claims `name` in the cluster (`template:<name>@<version>`), or gives the claim up:
    /// answers whether this node holds it.
    pub async fn claim(&self, name: &str, release: bool) -> Result<bool, MemberError> {
        let secret = self
            .secret
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let body = Claim {
            node_id: self.session.config.node_id.clone(),
            incarnation: self.incarnation(),
            secret,
            name: name.to_owned(),
            ttl_ms: None,
            release,
        };
        match self
            .session
            .post::<_, ClaimAnswer>(CLAIM_PATH, &body)
            .await?
        {
            Ok(a) => Ok(a.held),
            Err(r) => Err(MemberError(format!(
                "the control plane refused claim {name}: {}",
                r.message
            ))),
        }
    }

    /// Waits (up to `wait`) for the control plane's settings; answers whether they came.
    pub async fn settled(&self, wait: Duration) -> bool {
        let until = Instant::now() + wait;
        while self.session.local.settings().digest().is_none() {
            if Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        true
    }

    /// Makes sure this node has each of `builds`, built once in the whole cluster: with an
    /// object store, a build published there is fetched; otherwise the node that wins the
    /// claim builds it and publishes it while the others wait for it. Without a store each
    /// node builds its own (its sandboxes then cannot move to another node).
    pub async fn provide_templates(&self, builds: Vec<TemplateBuild>) -> Result<(), MemberError> {
        let local = &self.session.local;
        let node = local.node().clone();
        for build in builds {
            let t = build.template.clone();
            let have = node
                .template(&t.name, &crate::ids::VersionReq::Exact(t.version.clone()))
                .is_ok();
            if node.archive().is_none() {
                if !have {
                    local
                        .build_template(build)
                        .await
                        .map_err(err(&format!("building template {t}")))?;
                }
                continue;
            }
            if have {
                // Built here before: it must be the published build (or become it).
                node.publish_template(&t)
                    .await
                    .map_err(err(&format!("publishing template {t}")))?;
                continue;
            }
            let claim = format!("template:{}@{}", t.name, t.version);
            loop {
                if node
                    .fetch_template(&t)
                    .await
                    .map_err(err(&format!("fetching template {t}")))?
                    .is_some()
                {
                    tracing::info!(template = %t, "template fetched from the object store");
                    break;
                }
                if self.claim(&claim, false).await? {
                    // The node that held the claim before may have published the build
                    // between the fetch above and this claim: look again before building.
                    let published = node.fetch_template(&t).await;
                    if !matches!(published, Ok(None)) {
                        let _ = self.claim(&claim, true).await;
                        published.map_err(err(&format!("fetching template {t}")))?;
                        tracing::info!(template = %t, "template fetched from the object store");
                        break;
                    }
                    let built = match local.build_template(build.clone()).await {
                        Ok(_) => node.publish_template(&t).await.map_err(|e| e.to_string()),
                        Err(e) => Err(e.to_string()),
                    };
                    let _ = self.claim(&claim, true).await;
                    built.map_err(|e| MemberError(format!("building template {t}: {e}")))?;
                    tracing::info!(template = %t, "template built and published");
                    break;
                }
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        }
        Ok(())
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

    /// The fence watchdog's pid.
    pub fn watchdog_pid(&self) -> u32 {
        self.fence.watchdog().pid()
    }

    /// Waits (up to `wait`) until the node is unfenced (its first heartbeat after joining).
    pub async fn unfenced(&self, wait: Duration) -> bool {
        let until = Instant::now() + wait;
        while self.fenced() {
            if Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        true
    }

    /// Stops heartbeating and serving; the watchdog is disarmed (the guests run on, for the
    /// next node process to adopt).
    pub async fn stop(self) {
        self.task.abort();
        if let Some(d) = &self.delivery {
            d.abort();
        }
        self.fence.watchdog().disarm();
        self.server.stop().await;
    }
}

/// The node's fence: the flag its API and its commits obey, and the watchdog that stops its
/// guests.
struct Fence {
    flag: Arc<AtomicBool>,
    node: crate::node::Node,
    watchdog: std::sync::Mutex<Arc<Watchdog>>,
}

impl Fence {
    fn watchdog(&self) -> Arc<Watchdog> {
        self.watchdog
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Stops the guests and refuses calls and commits, at once.
    fn raise(&self) {
        self.flag.store(true, Ordering::SeqCst);
        self.node.set_fenced(true);
        self.watchdog().fence_now(&self.node.vm_pids());
    }

    /// Moves the deadline to `deadline` (the guests run on, or again) and lifts the flag.
    fn renew(&self, deadline: Instant) {
        let mut w = self.watchdog.lock().unwrap_or_else(|e| e.into_inner());
        if !w.alive() {
            tracing::error!("the fence watchdog is gone: starting another");
            match Watchdog::spawn() {
                Ok(new) => *w = Arc::new(new),
                Err(e) => {
                    // Without a watchdog nothing stops the guests should this process hang:
                    // the node stays fenced until one can be started.
                    tracing::error!(error = %e, "starting the fence watchdog");
                    drop(w);
                    self.raise();
                    return;
                }
            }
        }
        w.arm(deadline, &self.node.vm_pids());
        drop(w);
        if self.flag.swap(false, Ordering::SeqCst) {
            self.node.set_fenced(false);
            tracing::warn!("lease renewed: unfenced");
        }
    }

    fn raised(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }
}

async fn heartbeats(
    session: Session,
    key: NodeKey,
    mut granted: Granted,
    fence: Arc<Fence>,
    incarnation: Arc<std::sync::atomic::AtomicI64>,
    secret: Arc<std::sync::Mutex<String>>,
) {
    let lease = Duration::from_millis(granted.lease_ms);
    let mut deadline = Instant::now() + lease.saturating_sub(FENCE_MARGIN);
    let mut tick = tokio::time::interval(Duration::from_millis(granted.heartbeat_ms.max(100)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        // A process that was stopped past its deadline fences before anything else.
        if Instant::now() >= deadline && !fence.raised() {
            tracing::warn!("the lease could not be renewed in time: fencing (guests stopped)");
            fence.raise();
        }
        fence.watchdog().set_vms(&fence.node.vm_pids());
        let sent = Instant::now();
        let (report, carried) = match session.local.report().await {
            Ok(r) => (report_json(&r), r.key_events.len()),
            Err(e) => {
                tracing::warn!(error = %e, "the node's report");
                (serde_json::Value::Null, 0)
            }
        };
        let body = Heartbeat {
            node_id: session.config.node_id.clone(),
            incarnation: granted.incarnation,
            secret: granted.secret.clone(),
            report,
        };
        let answer = tokio::time::timeout(
            HEARTBEAT_TIMEOUT,
            session.post::<_, HeartbeatAnswer>(HEARTBEAT_PATH, &body),
        )
        .await;
        match answer {
            Ok(Ok(Ok(answer))) => {
                session.local.settings().key_events_carried(carried);
                // Sandboxes that moved to another node while this one was away: their VMs
                // here must not run on, and what this node has of them is stale.
                for id in &answer.foreign {
                    let Ok(id) = id.parse::<SandboxId>() else {
                        continue;
                    };
                    tracing::warn!(%id, "the sandbox belongs to another node now: discarding it here");
                    // Its VM dies now, before the fence can lift; the rest of the discard
                    // (its driver, files and record) must not hold up the heartbeats.
                    fence.node.kill_vm_now(&id);
                    let local = session.local.clone();
                    tokio::spawn(async move {
                        if let Err(e) = local.discard(&id).await {
                            tracing::warn!(%id, error = %e, "discarding a sandbox that moved");
                        }
                    });
                }
                deadline = sent + lease.saturating_sub(FENCE_MARGIN);
                fence.renew(deadline);
                continue;
            }
            Ok(Ok(Err(Refused { status: 409, .. }))) => {
                // No longer the member: this incarnation was taken for lost and its running
                // sandboxes given to other nodes. It stays fenced (guests stopped, no
                // commits) while it rejoins; the new incarnation's first heartbeat names the
                // ones that moved, which are discarded, and the rest (still this node's) run
                // on.
                tracing::warn!(
                    incarnation = granted.incarnation,
                    "this incarnation is stale: rejoining"
                );
                if !fence.raised() {
                    fence.raise();
                }
                match session.enter(&key).await {
                    Ok(g) => {
                        tracing::info!(incarnation = g.incarnation, "rejoined the cluster");
                        incarnation.store(g.incarnation, Ordering::SeqCst);
                        *secret.lock().unwrap_or_else(|e| e.into_inner()) = g.secret.clone();
                        granted = g;
                        tick.reset_immediately();
                    }
                    Err(e) => tracing::warn!(error = %e, "rejoining"),
                }
                continue;
            }
            Ok(Ok(Err(r))) => {
                tracing::warn!(status = r.status, message = %r.message, "a heartbeat was refused");
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "a heartbeat failed"),
            Err(_) => tracing::warn!("a heartbeat took longer than {HEARTBEAT_TIMEOUT:?}"),
        }
        if Instant::now() >= deadline && !fence.raised() {
            tracing::warn!("the lease could not be renewed in time: fencing (guests stopped)");
            fence.raise();
        }
    }
}

/// Delivers the spool's events to the control plane's audit log, oldest first, a batch at a
/// time; what a replica refuses or cannot take waits in the spool and goes again.
async fn deliver_egress(
    session: Session,
    spool: Arc<EgressSpool>,
    incarnation: Arc<std::sync::atomic::AtomicI64>,
    secret: Arc<std::sync::Mutex<String>>,
) {
    let mut backoff = AUDIT_RETRY_MIN;
    loop {
        let s = spool.clone();
        let batch = match tokio::task::spawn_blocking(move || s.batch(MAX_AUDIT_BATCH)).await {
            Ok(Ok(Some(b))) => b,
            Ok(Ok(None)) => {
                spool.written(Duration::from_secs(5)).await;
                continue;
            }
            Ok(Err(e)) => {
                tracing::error!(error = %e, "reading the egress spool");
                tokio::time::sleep(AUDIT_RETRY_MAX).await;
                continue;
            }
            Err(_) => return,
        };
        let body = AuditBatch {
            node_id: session.config.node_id.clone(),
            incarnation: incarnation.load(Ordering::SeqCst),
            secret: secret.lock().unwrap_or_else(|e| e.into_inner()).clone(),
            events: batch.events,
        };
        let sent = tokio::time::timeout(
            HEARTBEAT_TIMEOUT * 5,
            session.post::<_, AuditAnswer>(AUDIT_PATH, &body),
        )
        .await;
        match sent {
            Ok(Ok(Ok(_))) => {
                let s = spool.clone();
                match tokio::task::spawn_blocking(move || s.carried(batch.upto)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => tracing::error!(error = %e, "writing the egress spool"),
                    Err(_) => return,
                }
                backoff = AUDIT_RETRY_MIN;
                continue;
            }
            Ok(Ok(Err(r))) => {
                tracing::warn!(status = r.status, message = %r.message, "audit events refused; kept for later");
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "delivering audit events; kept for later"),
            Err(_) => tracing::warn!("delivering audit events took too long; kept for later"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(AUDIT_RETRY_MAX);
    }
}

/// The first wait after a failed delivery of audit events, doubled up to the most.
const AUDIT_RETRY_MIN: Duration = Duration::from_millis(500);
const AUDIT_RETRY_MAX: Duration = Duration::from_secs(10);

/// What a member's node API asks before every call: that the node is not fenced (the flag is
/// up while it is).
pub struct FenceGate(pub Arc<AtomicBool>);

impl Gate for FenceGate {
    fn admit(&self, _call: &'static str) -> crate::api::NodeResult<()> {
        if self.0.load(Ordering::SeqCst) {
            Err(crate::api::Fault::new(
                crate::api::FaultCode::Unavailable,
                "this node is fenced: it could not renew its lease",
            ))
        } else {
            Ok(())
        }
    }
}
