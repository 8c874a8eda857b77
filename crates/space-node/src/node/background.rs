//! The node's background work: the reconcilers of timeouts, warm pools, rolling snapshots and
//! the archive, each callable at any time, and the loop that runs a pass every tick.

use super::*;

impl Node {
    /// Suspends (or kills, per policy) every Running or Paused sandbox whose idle timeout or
    /// maximum lifetime has passed. Takes no input and can run at any time: the driver checks
    /// the condition again before acting. Returns how many sandboxes it stopped.
    pub async fn reconcile_timeouts(&self) -> usize {
        reconcile(&self.inner).await
    }

    /// Brings the warm pools to their configured sizes and drops pools of templates that are
    /// gone or superseded ([`crate::pool`]). Takes no input; returns how many VMs it made.
    pub async fn reconcile_pools(&self) -> usize {
        self.inner.pools.reconcile().await
    }

    /// Size, readiness, hits and misses of every warm pool.
    pub fn pool_stats(&self) -> Vec<PoolStats> {
        self.inner.pools.stats()
    }

    /// Takes the rolling snapshots that are due and deletes what retention says
    /// ([`crate::scheduler`]). Takes no input and can run at any time.
    pub async fn reconcile_snapshots(&self) -> RollingReport {
        rolling_pass(&self.inner).await
    }

    /// Uploads what should be in the object store and is not (restore points of suspended
    /// sandboxes, snapshots taken on request, and every upload interval the newest full
    /// snapshot of each live sandbox), then evicts local copies over the cache limits. Takes
    /// no input and can run at any time.
    pub async fn reconcile_archive(&self) -> ArchiveReport {
        crate::archive::pass(
            &self.inner.ctx,
            handles_of(&self.inner),
            &self.inner.last_gc_ms,
        )
        .await
    }

    /// Deletes what nobody can use in the object store: packs no manifest references (older
    /// than `grace`, so uploads in progress keep theirs) and the objects of shredded lineages
    /// (`space_archive::gc`). The archive pass does this every hour with an hour of grace.
    pub async fn collect_garbage(&self, grace: Duration) -> Result<space_archive::gc::GcReport> {
        let cfg = self
            .archive()
            .ok_or_else(|| NodeError::Invalid("this node has no object store".into()))?;
        space_archive::gc::collect(&cfg.archive, &cfg.keyring, grace)
            .await
            .map_err(|e| NodeError::Archive(format!("garbage collection: {e}")))
    }
}

pub(super) async fn reconcile(inner: &Inner) -> usize {
    if Node::is_fenced(inner) {
        return 0;
    }
    let now = now_ms();
    let due: Vec<_> = inner
        .sandboxes
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter_map(|(id, h)| Some((id.clone(), h.clone(), h.status.expired(now)?)))
        .collect();
    let mut acted = 0;
    let mut waits = Vec::new();
    for (id, h, kind) in due {
        let (tx, rx) = crate::sandbox::reply();
        if h.tx.send(Request::Timeout(kind, tx)).await.is_ok() {
            waits.push((id, rx));
        }
    }
    for (id, rx) in waits {
        match rx.await {
            Ok(Ok(true)) => acted += 1,
            Ok(Ok(false)) | Err(_) => {}
            Ok(Err(e)) => tracing::error!(%id, error = %e, "acting on a timeout"),
        }
    }
    acted
}

/// Every sandbox handle, for a pass over them.
pub(super) fn handles_of(inner: &Inner) -> Vec<(SandboxId, Handle)> {
    inner
        .sandboxes
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .map(|(id, h)| (id.clone(), h.clone()))
        .collect()
}

pub(super) async fn rolling_pass(inner: &Inner) -> RollingReport {
    if Node::is_fenced(inner) {
        return RollingReport::default();
    }
    let handles: Vec<(SandboxId, Handle)> = inner
        .sandboxes
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .map(|(id, h)| (id.clone(), h.clone()))
        .collect();
    crate::scheduler::reconcile(&inner.ctx, handles, &inner.rolling).await
}

/// Runs one reconciler pass every `tick` until the node is dropped or shutting down. A pass
/// takes no input and may run at any time; a tick that is late is delayed, not doubled up.
/// A pass that panics is logged, and the next tick runs the next one.
pub(super) async fn reconcile_every<F, Fut>(inner: Weak<Inner>, tick: Duration, pass: F)
where
    F: Fn(Arc<Inner>) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut interval = tokio::time::interval(tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        let Some(inner) = inner.upgrade() else { return };
        if inner
            .shutting_down
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            return;
        }
        let one = std::panic::AssertUnwindSafe(pass(inner));
        if let Err(panic) = futures::FutureExt::catch_unwind(one).await {
            tracing::error!(
                panic = %template::panic_message(panic.as_ref()),
                "a reconciler pass panicked; the next tick runs it again"
            );
        }
    }
}
