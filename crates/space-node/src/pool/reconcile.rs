//! The reconciler: which pools should exist and how large (each template's newest build, its
//! floor, the demand, a share of the host's memory), what goes (other builds, exited and
//! surplus members), what is made (the pool furthest under its size first, a few at a time),
//! and the background loop that runs it.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use futures::stream::{FuturesUnordered, StreamExt};
use tokio::sync::Notify;

use crate::error::Result;
use crate::ids::{TemplateName, TemplateRef};
use crate::record::SandboxRecord;
use crate::scheduler::chain;
use crate::template::{self, blocking, Template};

use super::demand;
use super::member::{destroy, pooled_record};
use super::{InFlight, Member, Pools, State};

/// How often a long reconciler run lists the templates again.
const LIST_AGAIN: Duration = Duration::from_secs(5);

/// The share of the node's available memory the pools' guest memory may grow to (one in
/// this many bytes).
const MEMORY_SHARE: u64 = 4;

/// A member being made: its pool, its directory, and how making it ended.
type Making<'a> =
    Pin<Box<dyn std::future::Future<Output = (TemplateRef, PathBuf, Result<Member>)> + Send + 'a>>;

/// How making a member ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Finished {
    Made,
    Failed,
}

impl Pools {
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

pub(super) async fn run_loop(pools: Weak<Pools>, wake: Arc<Notify>, tick: Duration) {
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
