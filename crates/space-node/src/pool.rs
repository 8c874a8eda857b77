//! Warm pools: VMs restored from a template's snapshot ahead of any create, warmed, and kept
//! paused, so that a create becomes a resume plus the identity step.
//!
//! What this module owns:
//!
//! - **Members.** A member is a VM restored from the newest build of a template into its own
//!   sandbox directory, under the [`SandboxId`] it will keep when handed out (no rename on
//!   take: the runtime's pidfile and jail records name the directory). Its record is written
//!   before anything else, as `creating` with `pending.request == "pool"`
//!   ([`SandboxRecord::is_pooled`]), so a node that dies leaves members that crash recovery
//!   removes like any half-made create.
//! - **Warming.** Under TCG a freshly restored QEMU has an empty translation cache and the
//!   guest's first exec costs ~100 ms. Before a member is paused it goes through the code paths a
//!   create will hit: the identity step (with a placeholder identity), one shell exec and a
//!   health round trip. It then keeps its guest connection across the pause (the connection is
//!   idle, nothing is in flight), so the take talks to it without reconnecting.
//! - **Take.** [`Pools::take`] pops a member under a lock (a member is handed out at most once,
//!   whatever the concurrency), resumes it and sends the caller's identity (fresh entropy and
//!   clock, the hostname and id, the environment). Anything that goes wrong destroys that member
//!   and returns `None`: the create falls back to the normal restore path; it never fails
//!   because of the pool.
//! - **The reconciler** ([`Pools::reconcile`]) takes no input and can run at any time (one run
//!   at a time): it works out which pools should exist (the newest build of every template whose
//!   configured size is not zero and that this runtime can restore), drops the members of pools
//!   that should not (new version, template gone, node shutting down) and members whose VM
//!   exited, and fills the others up to their size, one member per pool per round. A timer runs
//!   it every [`PoolConfig::tick`]; a take wakes it at once.
//!
//! Creates that ask for another vCPU count or memory size than the template's are cold boots
//! and never touch the pool.

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use space_proto::ExecSpec;
use space_runtime::Vm;
use tokio::sync::Notify;

use crate::error::{NodeError, Result};
use crate::ids::{SandboxId, TemplateName, TemplateRef};
use crate::record::{now_ms, Origin, SandboxOptions, SandboxRecord, POOL_REQUEST};
use crate::sandbox::{clear_vm_files, ensure_disk, identity, launch, Ctx, Launch, Live};
use crate::scheduler::chain;
use crate::template::{self, blocking, Template};

/// How many members each template's pool keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolConfig {
    /// Pool size per template name (the pool follows the newest build of the name). Zero
    /// disables the pool of that template.
    pub sizes: BTreeMap<TemplateName, usize>,
    /// Pool size of templates not listed in [`PoolConfig::sizes`].
    pub default_size: usize,
    /// How often the reconciler runs on its own (it also runs right after every take and every
    /// template build). `None`: never on its own; call [`crate::Node::reconcile_pools`].
    pub tick: Option<Duration>,
}

/// Members per stock template (`minimal`, `base`) by default: two concurrent creates are
/// served warm, and a refill (a restore, ~100-300 ms under TCG) is under way after each.
pub const DEFAULT_POOL_SIZE: usize = 2;

/// The stock templates, which get [`DEFAULT_POOL_SIZE`] members by default.
pub const STOCK_TEMPLATES: &[&str] = &["minimal", "base"];

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            sizes: STOCK_TEMPLATES
                .iter()
                .map(|n| {
                    (
                        n.parse().expect("stock template names are valid"),
                        DEFAULT_POOL_SIZE,
                    )
                })
                .collect(),
            default_size: 0,
            tick: Some(Duration::from_secs(5)),
        }
    }
}

impl PoolConfig {
    /// No pools at all.
    pub fn disabled() -> Self {
        PoolConfig {
            sizes: BTreeMap::new(),
            default_size: 0,
            tick: None,
        }
    }

    /// The pool size of `name`.
    pub fn size_for(&self, name: &TemplateName) -> usize {
        self.sizes.get(name).copied().unwrap_or(self.default_size)
    }
}

/// One pool as [`crate::Node::pool_stats`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolStats {
    /// The template build the pool holds VMs of.
    pub template: TemplateRef,
    /// How many members it keeps.
    pub target: usize,
    /// How many are ready (restored, warmed, paused) right now.
    pub ready: usize,
    /// Creates served from the pool.
    pub hits: u64,
    /// Creates that found it empty and restored the normal way.
    pub misses: u64,
}

/// A VM made ahead of a create.
struct Member {
    record: SandboxRecord,
    dir: PathBuf,
    live: Live,
}

#[derive(Default)]
struct Pool {
    target: usize,
    members: VecDeque<Member>,
    hits: u64,
    misses: u64,
}

#[derive(Default)]
struct State {
    pools: BTreeMap<TemplateRef, Pool>,
    /// Members taken out by a take because their VM had exited: the reconciler removes them.
    dead: Vec<Member>,
    /// Set by shutdown: no more takes, and the reconciler empties every pool.
    closed: bool,
}

/// The warm pools of a node.
pub(crate) struct Pools {
    ctx: Arc<Ctx>,
    config: PoolConfig,
    state: Mutex<State>,
    /// Wakes the background loop (after a take, a template build, shutdown). Its own `Arc` so
    /// the loop can wait on it without keeping the pools alive.
    wake: Arc<Notify>,
    /// One reconciler run at a time: runs are idempotent, and shutdown waits for the one in
    /// flight before emptying the pools.
    run: tokio::sync::Mutex<()>,
}

impl Pools {
    /// The pools of a node; empty until the first reconciler run.
    pub fn new(ctx: Arc<Ctx>, config: PoolConfig) -> Arc<Pools> {
        Arc::new(Pools {
            ctx,
            config,
            state: Mutex::default(),
            wake: Arc::new(Notify::new()),
            run: tokio::sync::Mutex::new(()),
        })
    }

    /// Starts the background loop if [`PoolConfig::tick`] is set.
    pub fn spawn_loop(self: &Arc<Self>) {
        if let Some(tick) = self.config.tick {
            tokio::spawn(run_loop(Arc::downgrade(self), self.wake.clone(), tick));
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Asks the background loop to reconcile now.
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// Pool size, readiness and hit counts per pool.
    pub fn stats(&self) -> Vec<PoolStats> {
        self.lock()
            .pools
            .iter()
            .map(|(t, p)| PoolStats {
                template: t.clone(),
                target: p.target,
                ready: p.members.len(),
                hits: p.hits,
                misses: p.misses,
            })
            .collect()
    }

    /// Hands out a member of `template`'s pool for the create described by `record`: resumed,
    /// with `record`'s identity, and `record.id` set to the member's id. `None` when the pool is
    /// empty or the member failed (it is destroyed); the caller then restores the normal way.
    /// `record` is left as it was in that case.
    pub async fn take(&self, template: &TemplateRef, record: &mut SandboxRecord) -> Option<Live> {
        let member = {
            let mut st = self.lock();
            if st.closed {
                return None;
            }
            let State { pools, dead, .. } = &mut *st;
            let pool = pools.get_mut(template)?;
            let mut found = None;
            while let Some(m) = pool.members.pop_front() {
                if m.live.vm.check_alive().is_ok() {
                    found = Some(m);
                    break;
                }
                dead.push(m);
            }
            match found {
                Some(m) => {
                    pool.hits += 1;
                    Some(m)
                }
                None => {
                    pool.misses += 1;
                    None
                }
            }
        };
        self.wake();
        let member = member?;
        let t0 = Instant::now();
        let mut wanted = record.clone();
        wanted.id = member.record.id.clone();
        let handed = async {
            let client = member.live.client.as_ref().ok_or_else(|| {
                NodeError::Invalid("a warm-pool member without a guest connection".into())
            })?;
            member.live.vm.resume().await?;
            client
                .identity(&identity(&self.ctx, &wanted))
                .await
                .map_err(|source| NodeError::Guest {
                    what: "identity",
                    source,
                })?;
            // Members have the template's disk; a larger one is grown now.
            ensure_disk(&member.live.vm, client, &wanted).await?;
            Ok::<_, NodeError>(())
        }
        .await;
        match handed {
            Ok(()) => {
                tracing::debug!(id = %wanted.id, %template, took = ?t0.elapsed(), "create from the warm pool");
                *record = wanted;
                Some(member.live)
            }
            Err(e) => {
                tracing::warn!(id = %member.record.id, %template, error = %chain(&e), "a warm-pool member failed on take; restoring instead");
                destroy(&self.ctx, member).await;
                None
            }
        }
    }

    /// Brings every pool to its size; drops pools and members that should not exist. Takes no
    /// input, can run at any time. Returns how many members it made.
    pub async fn reconcile(&self) -> usize {
        let _run = self.run.lock().await;
        let desired = if self.lock().closed {
            BTreeMap::new()
        } else {
            match self.desired().await {
                Ok(d) => d,
                Err(e) => {
                    tracing::error!(error = %chain(&e), "warm pools: listing templates");
                    return 0;
                }
            }
        };
        // Drop what should not be there.
        let doomed: Vec<Member> = {
            let mut st = self.lock();
            let mut doomed = std::mem::take(&mut st.dead);
            st.pools.retain(|t, pool| {
                let keep = desired.contains_key(t);
                if !keep {
                    doomed.extend(pool.members.drain(..));
                }
                keep
            });
            for (t, (_, size)) in &desired {
                let pool = st.pools.entry(t.clone()).or_default();
                pool.target = *size;
                let (alive, exited): (VecDeque<Member>, VecDeque<Member>) = pool
                    .members
                    .drain(..)
                    .partition(|m| m.live.vm.check_alive().is_ok());
                pool.members = alive;
                doomed.extend(exited);
                while pool.members.len() > pool.target {
                    doomed.extend(pool.members.pop_back());
                }
            }
            doomed
        };
        for m in doomed {
            destroy(&self.ctx, m).await;
        }
        // Fill, one member per pool per round, so one template does not starve another.
        let mut made = 0;
        let mut active: Vec<&Template> = desired.values().map(|(t, _)| t).collect();
        while !active.is_empty() {
            let mut next = Vec::new();
            for t in active {
                let short = {
                    let st = self.lock();
                    !st.closed
                        && st
                            .pools
                            .get(t.template_ref())
                            .is_some_and(|p| p.members.len() < p.target)
                };
                if !short {
                    continue;
                }
                let member = match self.make(t).await {
                    Ok(m) => m,
                    Err(e) => {
                        // Tried again at the next run; no retry loop here.
                        tracing::error!(template = %t.template_ref(), error = %chain(&e), "warm pools: making a member");
                        continue;
                    }
                };
                let extra = {
                    let mut st = self.lock();
                    let closed = st.closed;
                    match st.pools.get_mut(t.template_ref()) {
                        Some(p) if !closed && p.members.len() < p.target => {
                            p.members.push_back(member);
                            None
                        }
                        _ => Some(member),
                    }
                };
                match extra {
                    Some(m) => destroy(&self.ctx, m).await,
                    None => {
                        made += 1;
                        next.push(t);
                    }
                }
            }
            active = next;
        }
        made
    }

    /// Empties every pool for good (node shutdown): waits for a run in flight, then kills the
    /// members' VMs and removes their directories and records.
    pub async fn close(&self) {
        self.lock().closed = true;
        self.wake();
        self.reconcile().await;
    }

    /// The pools that should exist: the newest build of each template name with a non-zero
    /// size that this runtime can restore, with its size.
    async fn desired(&self) -> Result<BTreeMap<TemplateRef, (Template, usize)>> {
        let ctx = self.ctx.clone();
        let all = blocking(move || template::list(&ctx.layout)).await?;
        let mut newest: BTreeMap<TemplateName, Template> = BTreeMap::new();
        for t in all {
            let name = t.manifest.template.name.clone();
            let key = |t: &Template| {
                (
                    t.manifest.created_unix_ms,
                    t.manifest.template.version.clone(),
                )
            };
            match newest.get(&name) {
                Some(n) if key(n) >= key(&t) => {}
                _ => {
                    newest.insert(name, t);
                }
            }
        }
        Ok(newest
            .into_iter()
            .filter_map(|(name, t)| {
                let size = self.config.size_for(&name);
                (size > 0 && t.check_runtime(&self.ctx.runtime).is_ok())
                    .then(|| (t.template_ref().clone(), (t, size)))
            })
            .collect())
    }

    /// Restores, warms and pauses one member of `t`'s pool. Leaves nothing behind on failure.
    async fn make(&self, t: &Template) -> Result<Member> {
        let ctx = &self.ctx;
        let t0 = Instant::now();
        let record = pooled_record(t);
        let dir = ctx.layout.sandbox_dir(record.id.as_str())?;
        ctx.records.write(&record)?;
        let made = async {
            let (s, d) = (ctx.storage.clone(), dir.clone());
            blocking(move || Ok(s.create_volume(&d)?)).await?;
            let live = launch(
                ctx,
                &dir,
                Launch::Restore {
                    snapshot: t.snapshot(),
                },
                &record,
            )
            .await?;
            let member = Member {
                record: record.clone(),
                dir: dir.clone(),
                live,
            };
            match warm(&member.live).await {
                Ok(()) => Ok(member),
                Err(e) => {
                    destroy(ctx, member).await;
                    Err(e)
                }
            }
        }
        .await;
        match made {
            Ok(m) => {
                tracing::debug!(id = %m.record.id, template = %t.template_ref(), took = ?t0.elapsed(), "warm-pool member ready");
                Ok(m)
            }
            Err(e) => {
                // `launch` removed its VM's files; the volume and the record are ours to remove.
                let (s, d) = (ctx.storage.clone(), dir.clone());
                let _ = blocking(move || {
                    if d.exists() {
                        s.delete_volume(&d)?;
                    }
                    Ok(())
                })
                .await
                .map_err(
                    |c| tracing::error!(error = %chain(&c), "removing a failed warm-pool member"),
                );
                let _ = ctx.records.remove(&record.id);
                Err(e)
            }
        }
    }
}

/// Runs the code paths a create from the pool hits (the identity step already ran in
/// `launch`), so their translation is cached, then stops the vCPUs.
async fn warm(live: &Live) -> Result<()> {
    let guest = |what| move |source| NodeError::Guest { what, source };
    let client = live
        .client
        .as_ref()
        .ok_or_else(|| NodeError::Invalid("a new VM without a guest connection".into()))?;
    let out = client
        .run(ExecSpec::shell("true"))
        .await
        .map_err(guest("warm-up exec"))?;
    if !out.status.success() {
        return Err(NodeError::Invalid(format!(
            "warm-up exec in a pooled VM failed: {:?}",
            out.status
        )));
    }
    client.health().await.map_err(guest("warm-up health"))?;
    live.vm.pause().await?;
    Ok(())
}

/// The record of a new member: `creating`, pending `pool`, default options. A take replaces
/// everything but the id with the create's record.
fn pooled_record(t: &Template) -> SandboxRecord {
    let m = &t.manifest;
    let mut r = crate::node::new_record(
        SandboxId::generate(),
        m.template.clone(),
        SandboxOptions::default(),
        crate::node::MachineShape {
            vcpus: m.vcpus,
            memory_mib: m.memory_mib,
            disk_mib: t.image_mib(),
        },
        Origin::Template,
        None,
        crate::node::Owner {
            tenant: crate::record::DEFAULT_TENANT.to_owned(),
            lineage: None,
        },
    );
    r.guest = m.guest.clone();
    if let Some(p) = r.pending.as_mut() {
        p.request = POOL_REQUEST.to_owned();
        p.started_unix_ms = now_ms();
    }
    r
}

/// Kills a member's VM and removes its directory and record.
async fn destroy(ctx: &Ctx, m: Member) {
    let Member { record, dir, live } = m;
    drop(live.client);
    let _ = live.vm.kill().await;
    drop(live.vm);
    let (s, d) = (ctx.storage.clone(), dir);
    if let Err(e) = blocking(move || {
        clear_vm_files(&d)?;
        Ok(s.delete_volume(&d)?)
    })
    .await
    {
        tracing::error!(id = %record.id, error = %chain(&e), "removing a warm-pool member's directory");
    }
    if let Err(e) = ctx.records.remove(&record.id) {
        tracing::error!(id = %record.id, error = %chain(&e), "removing a warm-pool member's record");
    }
}

async fn run_loop(pools: Weak<Pools>, wake: Arc<Notify>, tick: Duration) {
    loop {
        {
            let Some(p) = pools.upgrade() else { return };
            if p.lock().closed {
                return;
            }
            p.reconcile().await;
        }
        tokio::select! {
            _ = wake.notified() => {}
            _ = tokio::time::sleep(tick) => {}
        }
    }
}
