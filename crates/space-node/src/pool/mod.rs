//! Warm pools: VMs restored from a template's snapshot ahead of any create, warmed, and kept
//! paused, so that a create becomes a resume plus the identity step.
//!
//! What this module owns:
//!
//! - **Members.** A member is a VM restored from the newest build of a template into its own
//!   sandbox directory, under the [`SandboxId`] it will keep when handed out (no rename on
//!   take: the runtime's pidfile and jail records name the directory). Its record is written
//!   before anything else, as `creating` with the intent `pool`
//!   ([`SandboxRecord::is_pooled`]), so a node that dies leaves members that crash recovery
//!   removes like any half-made create. Members are made with the VMM at background CPU
//!   priority ([`Priority::Background`]): making them never slows a live sandbox. A take
//!   raises the priority before the VM runs for its user.
//! - **Warming.** Under TCG a freshly restored QEMU has an empty translation cache and the
//!   guest's first exec costs ~100 ms. Before a member is paused it goes through the code paths a
//!   create will hit: the identity step (with a placeholder identity), one shell exec and a
//!   health round trip. It then keeps its guest connection across the pause (the connection is
//!   idle, nothing is in flight), so the take talks to it without reconnecting.
//! - **Size.** Each pool's size follows demand ([`demand`]): between the template's floor
//!   ([`PoolConfig::sizes`]) and a ceiling ([`PoolConfig::ceiling`], lowered further so that
//!   the pools' guest memory stays within a quarter of the node's available memory), from the
//!   creates of the last [`PoolConfig::window`]. A template with a floor of zero gets a pool
//!   while creates use it and loses it when they stop.
//! - **Take.** [`Pools::take`] pops a member under a lock (a member is handed out at most once,
//!   whatever the concurrency), resumes it and sends the caller's identity (fresh entropy and
//!   clock, the hostname and id, the environment). When no member is ready but one is being
//!   made and should be ready before a restore from scratch would be, the take claims it and
//!   waits for it. Anything that goes wrong destroys that member and returns `None`: the
//!   create falls back to the normal restore path; it never fails because of the pool.
//! - **The reconciler** ([`Pools::reconcile`]) takes no input and can run at any time (one run
//!   at a time): it works out which pools should exist (the newest build of every template
//!   with a floor or recent creates that this runtime can restore) and their sizes, drops the
//!   members of pools that should not (new version, template gone, node shutting down), members
//!   whose VM exited and members over the size, and makes members for the others, up to
//!   [`PoolConfig::refills`] at once across the node, the pool furthest under its size first.
//!   A timer runs it every [`PoolConfig::tick`]; a take wakes it at once.
//!
//! Creates that ask for another vCPU count or memory size than the template's are cold boots
//! and never touch the pool.

mod demand;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use futures::stream::{FuturesUnordered, StreamExt};
use space_proto::ExecSpec;
use space_runtime::Priority;
use tokio::sync::{oneshot, Notify};

use crate::error::{NodeError, Result};
use crate::ids::{SandboxId, TemplateName, TemplateRef};
use crate::record::{now_ms, Intent, Origin, SandboxOptions, SandboxRecord};
use crate::sandbox::{clear_vm_files, ensure_disk, identity, launch, Ctx, Launch, Live};
use crate::scheduler::chain;
use crate::template::{self, blocking, Template};
use demand::Demand;

/// How the warm pools are sized and refilled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolConfig {
    /// The floor of each template's pool by template name (the pool follows the newest build
    /// of the name): members kept even when nobody creates. Zero: a pool only while creates use
    /// the template.
    pub sizes: BTreeMap<TemplateName, usize>,
    /// The floor of templates not listed in [`PoolConfig::sizes`].
    pub default_size: usize,
    /// The most members demand grows a pool to (a floor above it wins). Zero: pools keep
    /// exactly their floors.
    pub ceiling: usize,
    /// How far back the creates that size a pool are counted.
    pub window: Duration,
    /// Members made at the same time, across all pools of the node (at least one).
    pub refills: usize,
    /// How often the reconciler runs on its own (it also runs right after every take and every
    /// template build). `None`: never on its own; call [`crate::Node::reconcile_pools`].
    pub tick: Option<Duration>,
}

/// The floor of each stock template (`minimal`, `base`) by default: two concurrent creates are
/// served warm, and a refill (a restore, ~100-300 ms under TCG) is under way after each.
pub const DEFAULT_POOL_SIZE: usize = 2;

/// The stock templates, which get [`DEFAULT_POOL_SIZE`] members by default.
pub const STOCK_TEMPLATES: &[&str] = &["minimal", "base"];

/// How large a pool grows on demand by default.
pub const DEFAULT_POOL_CEILING: usize = 16;

/// How far back creates count by default.
pub const DEFAULT_POOL_WINDOW: Duration = Duration::from_secs(60);

/// Members made at once by default: two VMs restoring keep two host CPUs busy, and a third
/// would only queue behind them.
pub const DEFAULT_POOL_REFILLS: usize = 2;

/// How often a long reconciler run lists the templates again.
const LIST_AGAIN: Duration = Duration::from_secs(5);

/// The share of the node's available memory the pools' guest memory may grow to (one in
/// this many bytes).
const MEMORY_SHARE: u64 = 4;

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
            ceiling: DEFAULT_POOL_CEILING,
            window: DEFAULT_POOL_WINDOW,
            refills: DEFAULT_POOL_REFILLS,
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
            ceiling: 0,
            window: DEFAULT_POOL_WINDOW,
            refills: DEFAULT_POOL_REFILLS,
            tick: None,
        }
    }

    /// Pools of exactly the given sizes, whatever the demand, refilled one member at a time.
    pub fn fixed(sizes: BTreeMap<TemplateName, usize>, tick: Option<Duration>) -> Self {
        PoolConfig {
            sizes,
            ceiling: 0,
            refills: 1,
            tick,
            ..PoolConfig::disabled()
        }
    }

    /// The floor of `name`'s pool.
    pub fn size_for(&self, name: &TemplateName) -> usize {
        self.sizes.get(name).copied().unwrap_or(self.default_size)
    }
}

/// One pool as [`crate::Node::pool_stats`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolStats {
    /// The template build the pool holds VMs of.
    pub template: TemplateRef,
    /// How many members it keeps now (it follows demand).
    pub target: usize,
    /// The least it keeps.
    pub floor: usize,
    /// How many are ready (restored, warmed, paused) right now.
    pub ready: usize,
    /// How many are being made.
    pub making: usize,
    /// Creates served from the pool (a member that was ready, or one being made that the
    /// create waited for).
    pub hits: u64,
    /// Of the hits, the creates that waited for a member being made.
    pub waits: u64,
    /// Creates that found it empty and restored the normal way.
    pub misses: u64,
}

/// A VM made ahead of a create.
struct Member {
    record: SandboxRecord,
    dir: PathBuf,
    live: Live,
}

/// A member being made.
struct InFlight {
    started: Instant,
    /// Its sandbox directory (unique: named after its id).
    dir: PathBuf,
    /// A take waits for it: it is made at normal priority from now on.
    claimed: Arc<AtomicBool>,
}

#[derive(Default)]
struct Pool {
    target: usize,
    floor: usize,
    members: VecDeque<Member>,
    /// The members being made, oldest first.
    making: Vec<InFlight>,
    /// Takes waiting for a member being made, first come first served; never more than
    /// `making`.
    waiters: VecDeque<oneshot::Sender<Member>>,
    demand: Demand,
    hits: u64,
    waits: u64,
    misses: u64,
}

impl Pool {
    /// How long a take arriving now would wait for the next member being made that no other
    /// take claimed, if that is sooner than a restore from scratch. A member ends warm, while
    /// a restore ends cold and pays the warm-up at its first exec; so the wait is weighed
    /// against the restore plus the warm-up, which is what making a member takes.
    fn claimable(&self, now: Instant) -> Option<&InFlight> {
        let next = self.making.get(self.waiters.len())?;
        let make = self.demand.make_time();
        let left = make.saturating_sub(now.saturating_duration_since(next.started));
        (left < make.max(self.demand.restore_time())).then_some(next)
    }

    /// Hands a new member to the first take still waiting; gives it back if none is.
    fn hand_over(&mut self, mut member: Member) -> Option<Member> {
        while let Some(w) = self.waiters.pop_front() {
            match w.send(member) {
                Ok(()) => return None,
                Err(m) => member = m,
            }
        }
        Some(member)
    }
}

#[derive(Default)]
struct State {
    pools: BTreeMap<TemplateRef, Pool>,
    /// Members taken out by a take because their VM had exited: the reconciler removes them.
    dead: Vec<Member>,
    /// Set by shutdown: no more takes, and the reconciler empties every pool.
    closed: bool,
    /// Set when templates were built or removed: the reconciler lists them again.
    relist: bool,
}

/// The templates the reconciler last listed (newest build per name, with its floor), and when.
#[derive(Default)]
struct Listing {
    at: Option<Instant>,
    desired: BTreeMap<TemplateRef, (Template, usize)>,
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
    /// flight before emptying the pools. It keeps the last listing of the templates, so that a
    /// run woken by a take starts making at once.
    run: tokio::sync::Mutex<Listing>,
}

/// A member being made: its pool, its directory, and how making it ended.
type Making<'a> =
    Pin<Box<dyn std::future::Future<Output = (TemplateRef, PathBuf, Result<Member>)> + Send + 'a>>;

/// How long a take waits at most for a member being made that it claimed. Making one has its
/// own time limits (the guest's readiness); this only bounds a hung make.
const CLAIM_PATIENCE: Duration = Duration::from_secs(60);

/// How making a member ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Finished {
    Made,
    Failed,
}

/// What a take found.
enum Found {
    Ready(Box<Member>),
    Coming(oneshot::Receiver<Member>, PathBuf),
    Nothing,
}

impl Pools {
    /// The pools of a node; empty until the first reconciler run.
    pub fn new(ctx: Arc<Ctx>, config: PoolConfig) -> Arc<Pools> {
        Arc::new(Pools {
            ctx,
            config,
            state: Mutex::default(),
            wake: Arc::new(Notify::new()),
            run: tokio::sync::Mutex::new(Listing::default()),
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

    /// Templates were built or removed: the next run lists them again, and runs now.
    pub fn templates_changed(&self) {
        self.lock().relist = true;
        self.wake();
    }

    /// Size, readiness and hit counts per pool.
    pub fn stats(&self) -> Vec<PoolStats> {
        self.lock()
            .pools
            .iter()
            .map(|(t, p)| PoolStats {
                template: t.clone(),
                target: p.target,
                floor: p.floor,
                ready: p.members.len(),
                making: p.making.len(),
                hits: p.hits,
                waits: p.waits,
                misses: p.misses,
            })
            .collect()
    }

    /// Tells the pool of `template` that a create found nothing to take and restored in
    /// `took`: what a wait for a member being made is weighed against.
    pub fn restored(&self, template: &TemplateRef, took: Duration) {
        if let Some(p) = self.lock().pools.get_mut(template) {
            p.demand.restored(took);
        }
    }

    /// Hands out a member of `template`'s pool for the create described by `record`: resumed,
    /// with `record`'s identity, and `record.id` set to the member's id. `None` when the pool is
    /// empty or the member failed (it is destroyed); the caller then restores the normal way.
    /// `record` is left as it was in that case.
    pub async fn take(&self, template: &TemplateRef, record: &mut SandboxRecord) -> Option<Live> {
        if self.config.ceiling == 0 && self.config.size_for(&template.name) == 0 {
            // This template never gets a pool: nothing to take, no demand to record.
            return None;
        }
        let found = {
            let mut st = self.lock();
            if st.closed {
                return None;
            }
            let now = Instant::now();
            let State { pools, dead, .. } = &mut *st;
            // Demand counts even before the template has a pool: it is what makes one.
            let pool = pools.entry(template.clone()).or_default();
            pool.demand.take(now);
            let mut found = Found::Nothing;
            while let Some(m) = pool.members.pop_front() {
                if m.live.vm.check_alive().is_ok() {
                    found = Found::Ready(Box::new(m));
                    break;
                }
                dead.push(m);
            }
            if let Found::Nothing = found {
                if let Some(next) = pool.claimable(now) {
                    next.claimed.store(true, Ordering::SeqCst);
                    let dir = next.dir.clone();
                    let (tx, rx) = oneshot::channel();
                    pool.waiters.push_back(tx);
                    found = Found::Coming(rx, dir);
                }
            }
            match found {
                Found::Ready(_) => pool.hits += 1,
                Found::Nothing => pool.misses += 1,
                Found::Coming(..) => {}
            }
            found
        };
        self.wake();
        let member = match found {
            Found::Ready(m) => *m,
            Found::Nothing => return None,
            Found::Coming(rx, dir) => {
                // A create waits for it now: it is live work, no longer made in the background
                // (the make raises it too once the VM's handle exists, in case the restore had
                // not started QEMU yet).
                if let Err(e) = self.ctx.runtime.set_priority_in(&dir, Priority::Normal) {
                    tracing::debug!(error = %e, "raising a claimed warm-pool member");
                }
                // Until it is made or its make fails (which drops the sender): a restore from
                // scratch now would compete with it for the same CPUs.
                let got = tokio::time::timeout(CLAIM_PATIENCE, rx).await;
                let mut st = self.lock();
                let pool = st.pools.entry(template.clone()).or_default();
                match got {
                    Ok(Ok(m)) => {
                        pool.hits += 1;
                        pool.waits += 1;
                        m
                    }
                    _ => {
                        pool.misses += 1;
                        return None;
                    }
                }
            }
        };
        let t0 = Instant::now();
        let mut wanted = record.clone();
        wanted.id = member.record.id.clone();
        let handed = async {
            let client = member.live.client.as_ref().ok_or_else(|| {
                NodeError::internal("a warm-pool member without a guest connection")
            })?;
            member.live.vm.set_priority(Priority::Normal)?;
            member.live.vm.resume().await?;
            client
                .identity(&identity(&self.ctx, &wanted))
                .await
                .map_err(|source| NodeError::Guest {
                    what: "identity",
                    source,
                })?;
            // Members have the template's disk; a larger one is grown now.
            ensure_disk(&*member.live.vm, client, &wanted).await?;
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
    /// input, can run at any time. Returns once no pool is short and nothing is being made, with
    /// how many members it made.
    pub async fn reconcile(&self) -> usize {
        let mut listing = self.run.lock().await;
        let mut made = 0;
        let mut making: FuturesUnordered<Making<'_>> = FuturesUnordered::new();
        // Pools whose make failed in this run wait for the next one.
        let mut failed = BTreeSet::new();
        loop {
            // The templates are listed again when they changed, and now and then anyway.
            let (relist, closed) = {
                let mut st = self.lock();
                (std::mem::take(&mut st.relist), st.closed)
            };
            if closed {
                listing.desired.clear();
            } else if relist || listing.at.is_none_or(|t| t.elapsed() >= LIST_AGAIN) {
                match self.templates().await {
                    Ok(d) => listing.desired = d,
                    Err(e) => {
                        tracing::error!(error = %chain(&e), "warm pools: listing templates");
                        listing.desired.clear();
                    }
                }
                listing.at = Some(Instant::now());
            }
            let desired = &listing.desired;
            for m in self.settle(desired) {
                destroy(&self.ctx, m).await;
            }
            let refills = self.config.refills.max(1);
            while making.len() < refills {
                let Some((t, record, dir, claimed)) = self.next_short(desired, &failed) else {
                    break;
                };
                making.push(Box::pin(async move {
                    let made = self.make(&t, record, dir.clone(), claimed).await;
                    (t.template_ref().clone(), dir, made)
                }));
            }
            if making.is_empty() {
                break;
            }
            tokio::select! {
                Some((t, dir, result)) = making.next() => {
                    match self.finish(&t, &dir, result).await {
                        Finished::Made => made += 1,
                        Finished::Failed => {
                            failed.insert(t);
                        }
                    }
                }
                _ = self.wake.notified() => {}
            }
        }
        made
    }

    /// Sets every pool's floor and size for `desired` (each template's newest build and its
    /// floor), and takes out what should go: pools of other builds, members whose VM exited,
    /// members over the size. Returns those members, for the caller to destroy.
    fn settle(&self, desired: &BTreeMap<TemplateRef, (Template, usize)>) -> Vec<Member> {
        let now = Instant::now();
        let available = available_memory_mib();
        let mut st = self.lock();
        let closed = st.closed;
        let State { pools, dead, .. } = &mut *st;
        let mut doomed = std::mem::take(dead);
        let mut dropped = Vec::new();
        for (t, pool) in pools.iter_mut() {
            let keep = !closed
                && desired.get(t).is_some_and(|(_, floor)| {
                    *floor > 0 || pool.demand.is_recent(now, self.config.window)
                });
            if !keep {
                doomed.extend(pool.members.drain(..));
                // A take waiting here restores instead.
                pool.waiters.clear();
                pool.target = 0;
                if pool.making.is_empty() {
                    dropped.push(t.clone());
                }
            }
        }
        for t in dropped {
            pools.remove(&t);
        }
        if closed {
            return doomed;
        }
        for (t, (_, floor)) in desired {
            if *floor > 0 {
                pools.entry(t.clone()).or_default();
            }
        }
        // The memory the pools' guests may use: a share of what is available, plus what their
        // members hold already (available memory does not count it any more).
        let held: u64 = pools
            .iter()
            .filter_map(|(t, p)| {
                let (template, _) = desired.get(t)?;
                Some((p.members.len() + p.making.len()) as u64 * template.manifest.memory_mib)
            })
            .sum();
        let budget = (available / MEMORY_SHARE).saturating_add(held);
        let active = pools.len().max(1) as u64;
        for (t, pool) in pools.iter_mut() {
            let Some((template, floor)) = desired.get(t) else {
                continue;
            };
            let by_memory = budget / active / template.manifest.memory_mib.max(1);
            let ceiling = self.config.ceiling.min(by_memory as usize);
            let wanted = pool.demand.wanted(now, self.config.window);
            pool.floor = *floor;
            pool.target = demand::target(*floor, ceiling, wanted);
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
    }

    /// The pool furthest under its size, counting members being made, marked as making one
    /// more, with the new member's record and directory; `None` when none is short.
    #[allow(clippy::type_complexity)]
    fn next_short(
        &self,
        desired: &BTreeMap<TemplateRef, (Template, usize)>,
        failed: &BTreeSet<TemplateRef>,
    ) -> Option<(Template, SandboxRecord, PathBuf, Arc<AtomicBool>)> {
        let mut st = self.lock();
        if st.closed {
            return None;
        }
        let (t, pool) = st
            .pools
            .iter_mut()
            .filter(|(t, _)| desired.contains_key(*t) && !failed.contains(*t))
            .map(|(t, p)| {
                let have = p.members.len() + p.making.len();
                (p.target.saturating_sub(have), t, p)
            })
            .filter(|(short, _, _)| *short > 0)
            .max_by_key(|(short, _, _)| *short)
            .map(|(_, t, p)| (t.clone(), p))?;
        let (template, _) = desired.get(&t)?;
        let record = pooled_record(template);
        let dir = match self.ctx.layout.sandbox_dir(record.id.as_str()) {
            Ok(d) => d,
            Err(e) => {
                tracing::error!(error = %chain(&e), "warm pools: a member's directory");
                return None;
            }
        };
        let claimed = Arc::new(AtomicBool::new(false));
        pool.making.push(InFlight {
            started: Instant::now(),
            dir: dir.clone(),
            claimed: claimed.clone(),
        });
        Some((template.clone(), record, dir, claimed))
    }

    /// Puts a member that was being made where it belongs: to a waiting take, into the pool, or
    /// away.
    async fn finish(&self, t: &TemplateRef, dir: &Path, result: Result<Member>) -> Finished {
        let (outcome, spare) = {
            let mut st = self.lock();
            let closed = st.closed;
            match (st.pools.get_mut(t), result) {
                (None, Ok(m)) => (Finished::Made, Some(m)),
                (None, Err(_)) => (Finished::Failed, None),
                (Some(pool), result) => {
                    let started = match pool.making.iter().position(|m| m.dir == dir) {
                        Some(i) => pool.making.remove(i).started,
                        None => Instant::now(),
                    };
                    match result {
                        Ok(member) => {
                            pool.demand.made(started.elapsed());
                            let spare = if closed {
                                Some(member)
                            } else {
                                match pool.hand_over(member) {
                                    Some(m) if pool.members.len() < pool.target => {
                                        pool.members.push_back(m);
                                        None
                                    }
                                    spare => spare,
                                }
                            };
                            (Finished::Made, spare)
                        }
                        Err(e) => {
                            // Tried again at the next run; no retry loop here. A take that
                            // waits for more members than are being made restores instead.
                            tracing::error!(template = %t, error = %chain(&e), "warm pools: making a member");
                            pool.waiters.truncate(pool.making.len());
                            (Finished::Failed, None)
                        }
                    }
                }
            }
        };
        if let Some(m) = spare {
            destroy(&self.ctx, m).await;
        }
        outcome
    }

    /// Empties every pool for good (node shutdown): waits for a run in flight, then kills the
    /// members' VMs and removes their directories and records.
    pub async fn close(&self) {
        self.lock().closed = true;
        self.wake();
        self.reconcile().await;
    }

    /// The newest build of each template name that this runtime can restore, with its floor.
    async fn templates(&self) -> Result<BTreeMap<TemplateRef, (Template, usize)>> {
        if self.config.ceiling == 0
            && self.config.default_size == 0
            && self.config.sizes.values().all(|n| *n == 0)
        {
            return Ok(BTreeMap::new());
        }
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
                let floor = self.config.size_for(&name);
                ((floor > 0 || self.config.ceiling > 0)
                    && t.check_runtime(&*self.ctx.runtime).is_ok())
                .then(|| (t.template_ref().clone(), (t, floor)))
            })
            .collect())
    }

    /// Restores, warms and pauses one member of `t`'s pool, with `record` in `dir`, at
    /// background priority until `claimed` is set. Leaves nothing behind on failure.
    async fn make(
        &self,
        t: &Template,
        record: SandboxRecord,
        dir: PathBuf,
        claimed: Arc<AtomicBool>,
    ) -> Result<Member> {
        let ctx = &self.ctx;
        let t0 = Instant::now();
        ctx.records.write(&record)?;
        let made = async {
            let (s, d) = (ctx.storage.clone(), dir.clone());
            blocking(move || Ok(s.create_volume(&d)?)).await?;
            let live = launch(
                ctx,
                &dir,
                Launch::RestoreInBackground {
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
            let warmed = async {
                if claimed.load(Ordering::SeqCst) {
                    // Claimed while QEMU was starting: raised here for sure.
                    member.live.vm.set_priority(Priority::Normal)?;
                }
                warm(&member.live).await
            };
            match warmed.await {
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
        .ok_or_else(|| NodeError::internal("a new VM without a guest connection"))?;
    let out = client
        .run(ExecSpec::shell("true"))
        .await
        .map_err(guest("warm-up exec"))?;
    if !out.status.success() {
        return Err(NodeError::internal(format!(
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
        p.request = Intent::Pool;
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

/// `MemAvailable` of the host in MiB (unbounded when unknown).
fn available_memory_mib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("MemAvailable:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(u64::MAX, |kib| kib / 1024)
}

async fn run_loop(pools: Weak<Pools>, wake: Arc<Notify>, tick: Duration) {
    loop {
        {
            let Some(p) = pools.upgrade() else { return };
            if p.lock().closed {
                return;
            }
            // A pass that panics is logged and the loop goes on: the pools keep refilling.
            let pass = std::panic::AssertUnwindSafe(p.reconcile());
            if let Err(panic) = futures::FutureExt::catch_unwind(pass).await {
                tracing::error!(
                    panic = %template::panic_message(panic.as_ref()),
                    "a warm-pool pass panicked; the next one tries again"
                );
            }
        }
        tokio::select! {
            _ = wake.notified() => {}
            _ = tokio::time::sleep(tick) => {}
        }
    }
}
