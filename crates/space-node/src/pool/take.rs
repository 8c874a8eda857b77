//! Handing a member to a create: one that is ready, or one being made that is worth waiting
//! for; resumed, given the create's identity, its disk grown. A member that fails is destroyed
//! and the create restores the normal way.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use space_runtime::Priority;
use tokio::sync::oneshot;

use crate::error::NodeError;
use crate::ids::TemplateRef;
use crate::record::SandboxRecord;
use crate::sandbox::{ensure_disk, identity, mount_volumes, Live};
use crate::scheduler::chain;

use super::member::destroy;
use super::{Member, Pools, State};

/// How long a take waits at most for a member being made that it claimed. Making one has its
/// own time limits (the guest's readiness); this only bounds a hung make.
const CLAIM_PATIENCE: Duration = Duration::from_secs(60);

/// What a take found.
enum Found {
    Ready(Box<Member>),
    Coming(oneshot::Receiver<Member>, PathBuf),
    Nothing,
}

impl Pools {
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
            mount_volumes(client, &wanted).await?;
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
}
