//! Warm pools: VMs restored from a template's snapshot ahead of any create, warmed, and kept
//! paused, so that a create becomes a resume plus the identity step.
//!
//! What this module owns:
//!
//! - **Members.** A member is a VM restored from the newest build of a template into its own
//!   sandbox directory, under the [`SandboxId`](crate::ids::SandboxId) it will keep when
//!   handed out (no rename on take: the runtime's pidfile and jail records name the
//!   directory). Its record is written before anything else, as `creating` with the intent
//!   `pool` ([`SandboxRecord::is_pooled`]), so a node that dies leaves members that crash
//!   recovery removes like any half-made create. Members are made with the VMM at background
//!   CPU priority ([`Priority::Background`](space_runtime::Priority::Background)): making them
//!   never slows a live sandbox. A take raises the priority before the VM runs for its user.
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
//!
//! This file holds the pools' state and their small entry points; the rest is split by
//! concern:
//!
//! - `config.rs`: [`PoolConfig`], its defaults, and [`PoolStats`];
//! - `take.rs`: `Pools::take`, a member handed to a create;
//! - `reconcile.rs`: `Pools::reconcile` and the background loop that runs it;
//! - `member.rs`: one member made (restored, warmed, paused) and destroyed;
//! - `demand.rs`: how a pool's size follows the creates.

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, Notify};

use crate::ids::TemplateRef;
use crate::record::SandboxRecord;
use crate::sandbox::{Ctx, Live};
use crate::template::Template;

mod config;
mod demand;
mod member;
mod reconcile;
mod take;

pub use config::{
    PoolConfig, PoolStats, DEFAULT_POOL_CEILING, DEFAULT_POOL_REFILLS, DEFAULT_POOL_SIZE,
    DEFAULT_POOL_WINDOW, STOCK_TEMPLATES,
};
use demand::Demand;
use reconcile::run_loop;

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

    /// Empties every pool for good (node shutdown): waits for a run in flight, then kills the
    /// members' VMs and removes their directories and records.
    pub async fn close(&self) {
        self.lock().closed = true;
        self.wake();
        self.reconcile().await;
    }
}
