//! Requests to a sandbox's driver: each is one message, answered when the driver has handled
//! it (info, pause, suspend, restore, snapshots, rollback, the guest, timeouts, egress,
//! eviction, kill), and what the node answers without one (list, usage, the console's tail).

use super::*;

impl Node {
    /// Sends a request to the driver of `id` and waits for the answer. A sandbox without a
    /// driver (killed, or left by an earlier process) answers from its record: the request is
    /// refused for its state.
    pub(super) async fn call<T>(
        &self,
        id: &SandboxId,
        make: impl FnOnce(crate::sandbox::Reply<T>) -> Request,
    ) -> Result<T> {
        let (tx, rx) = crate::sandbox::reply();
        let req = make(tx);
        let handle = self
            .inner
            .sandboxes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned();
        let refused = |req: &Request| -> NodeError {
            match self.inner.ctx.records.read(id) {
                Ok(Some(r)) => NodeError::IllegalState {
                    id: id.clone(),
                    request: req.name(),
                    state: r.state,
                    legal: req.legal(),
                },
                Ok(None) => NodeError::NotFound(id.clone()),
                Err(e) => e.into(),
            }
        };
        let Some(handle) = handle else {
            if self.is_shutting_down() {
                return Err(NodeError::ShuttingDown);
            }
            return Err(refused(&req));
        };
        if let Err(tokio::sync::mpsc::error::SendError(req)) = handle.tx.send(req).await {
            if self.is_shutting_down() {
                return Err(NodeError::ShuttingDown);
            }
            // The driver is gone without its sandbox being finished with (a panic it could
            // not recover from): not a refusal.
            if let Some(why) = handle.status.fault() {
                return Err(NodeError::internal(format!("sandbox {id}: {why}")));
            }
            return Err(refused(&req));
        }
        rx.await.map_err(|_| NodeError::ShuttingDown)?
    }

    /// Makes the state driver of `id` panic in the middle of a request (after writing a
    /// transition's intent), for tests of panic isolation. Not part of any API.
    #[cfg(any(test, feature = "test-hooks"))]
    pub async fn inject_panic(&self, id: &SandboxId) -> Result<()> {
        self.call(id, Request::Panic).await
    }

    /// The sandbox's record as of now.
    pub async fn info(&self, id: &SandboxId) -> Result<SandboxInfo> {
        match self.call(id, Request::Info).await {
            // The sandbox's driver ended while the request waited (it was being killed): the
            // record says how it ended.
            Err(NodeError::ShuttingDown) if !self.is_shutting_down() => self
                .inner
                .ctx
                .records
                .read(id)?
                .ok_or_else(|| NodeError::NotFound(id.clone())),
            Err(NodeError::IllegalState { .. }) => self
                .inner
                .ctx
                .records
                .read(id)?
                .ok_or_else(|| NodeError::NotFound(id.clone())),
            other => other,
        }
    }

    /// Every sandbox with a record on this node (terminated ones included), oldest first.
    pub async fn list(&self) -> Result<Vec<SandboxInfo>> {
        let ctx = self.inner.ctx.clone();
        let all = blocking(move || Ok(ctx.records.list()?)).await?;
        Ok(all.into_iter().filter(|r| !r.is_pooled()).collect())
    }

    /// State and shape of every sandbox on this node that is not terminated, read without
    /// waiting for any driver (for quota and capacity accounting on a hot path; a request in
    /// flight may change a state right after).
    pub fn usage(&self) -> Vec<SandboxUsage> {
        self.inner
            .sandboxes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(id, h)| SandboxUsage {
                id: id.clone(),
                state: h.status.state(),
                vcpus: h.status.vcpus,
                memory_mib: h.status.memory_mib,
                epoch: h.status.epoch,
            })
            .filter(|u| u.state != State::Terminated)
            .collect()
    }

    /// Stops the vCPUs (Running only); memory stays.
    pub async fn pause(&self, id: &SandboxId) -> Result<()> {
        self.call(id, Request::Pause).await
    }

    /// Restarts the vCPUs (Paused only).
    pub async fn resume(&self, id: &SandboxId) -> Result<()> {
        self.call(id, Request::Resume).await
    }

    /// Full snapshot, then the VM exits and its RAM file is freed (Running or Paused).
    pub async fn suspend(&self, id: &SandboxId) -> Result<SnapshotRecord> {
        self.call(id, Request::Suspend).await
    }

    /// Back to Running from the suspend snapshot, with a new identity step (Suspended only).
    pub async fn restore(&self, id: &SandboxId) -> Result<()> {
        let _ticket = self.admit_for(id)?;
        self.call(id, Request::Restore).await
    }

    /// Takes a snapshot now (Running or Paused).
    pub async fn snapshot(&self, id: &SandboxId, kind: SnapshotKind) -> Result<SnapshotRecord> {
        self.call(id, |r| Request::Snapshot(kind, r)).await
    }

    /// The sandbox's snapshots, oldest first (any state, terminated included).
    pub async fn snapshots(&self, id: &SandboxId) -> Result<Vec<SnapshotRecord>> {
        Ok(self.info(id).await?.snapshots)
    }

    /// Replaces the sandbox's VM with one started from one of its own snapshots: a full one
    /// brings back memory and disk, a disk-only one cold-boots on a clone of that disk.
    /// Legal when Running, Paused, Suspended or Failed; ends Running.
    pub async fn rollback(&self, id: &SandboxId, snapshot: &SnapshotId) -> Result<()> {
        let snap = snapshot.clone();
        let _ticket = self.admit_for(id)?;
        match self.call(id, |r| Request::Rollback(snap, r)).await {
            Err(NodeError::SnapshotNotFound {
                sandbox,
                snapshot,
                owner: None,
            }) => {
                // Say whose snapshot it is, if it is anyone's on this node.
                let owner = self.list().await.ok().and_then(|all| {
                    all.into_iter()
                        .find(|r| r.snapshot(&snapshot).is_some())
                        .map(|r| r.id)
                });
                Err(NodeError::SnapshotNotFound {
                    sandbox,
                    snapshot,
                    owner,
                })
            }
            other => other,
        }
    }

    /// A client for the guest daemon (exec, files, ...) while the sandbox is Running. A
    /// Paused sandbox is refused rather than resumed: resuming is the caller's decision.
    /// Counts as activity; traffic on the client afterwards does not pass through the node.
    pub async fn guest(&self, id: &SandboxId) -> Result<GuestClient> {
        self.call(id, Request::Guest).await
    }

    /// Replaces the idle timeout, maximum lifetime and timeout action of a sandbox that is not
    /// terminated; the reconciler uses the new values from its next pass.
    pub async fn set_timeouts(
        &self,
        id: &SandboxId,
        timeouts: TimeoutPolicy,
    ) -> Result<SandboxInfo> {
        validate_timeouts(&timeouts)?;
        self.call(id, |r| Request::SetTimeouts(timeouts, r)).await
    }

    /// Replaces the egress policy of a sandbox that is not terminated. New connections use it
    /// at once (open ones are not cut); it is kept in the record and copied by fork.
    pub async fn set_egress(&self, id: &SandboxId, policy: EgressPolicy) -> Result<SandboxInfo> {
        policy.validate().map_err(NodeError::Invalid)?;
        self.call(id, |r| Request::SetEgress(policy, r)).await
    }

    /// The deployment CA's certificate (PEM) that guests trust for intercepted TLS.
    pub fn ca_pem(&self) -> String {
        self.inner.ctx.gateway.ca_pem()
    }

    /// The last `max_bytes` of the sandbox's serial console (kernel messages and whatever the
    /// guest writes there), continuing into the rotated copy when the current file holds
    /// less. Empty once the sandbox directory is gone (killed).
    pub async fn console_tail(&self, id: &SandboxId, max_bytes: usize) -> Result<Vec<u8>> {
        // The id must be one of ours; the file itself needs no actor.
        self.info(id).await?;
        let path = self
            .inner
            .ctx
            .layout
            .sandbox_dir(id.as_str())?
            .join(space_runtime::cmdline::CONSOLE_LOG);
        blocking(move || {
            space_runtime::console::raw_tail(&path, max_bytes)
                .map_err(NodeError::io("reading", &path))
        })
        .await
    }

    /// Like [`Node::guest`], but a Paused sandbox is resumed and a Suspended one restored
    /// (from this node's copy or the object store) first, unless its `auto_resume` is off
    /// (then the refusal is answered as is). Says what it woke. Concurrent callers wake the
    /// sandbox once: the others find it running.
    pub async fn guest_waking(&self, id: &SandboxId) -> Result<(GuestClient, Option<Wake>)> {
        let mut woke = None;
        for _ in 0..3 {
            let err = match self.guest(id).await {
                Ok(c) => return Ok((c, woke)),
                Err(e) => e,
            };
            let NodeError::IllegalState { state, .. } = &err else {
                return Err(err);
            };
            let state = *state;
            if !matches!(state, State::Paused | State::Suspended) {
                return Err(err);
            }
            if !self.info(id).await?.options.auto_resume {
                return Err(err);
            }
            let r = match state {
                State::Paused => self.resume(id).await.map(|_| Wake::Resumed),
                _ => self.restore(id).await.map(|_| Wake::Restored),
            };
            match r {
                Ok(w) => woke = Some(w),
                // Someone else woke it in between.
                Err(NodeError::IllegalState { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        self.guest(id).await.map(|c| (c, woke))
    }

    /// Drops this node's copy of an archived snapshot of a Suspended sandbox (a restore
    /// fetches it again). Answers whether it did (false: not archived, or not here).
    pub async fn evict_local(&self, id: &SandboxId, snapshot: &SnapshotId) -> Result<bool> {
        let snap = snapshot.clone();
        self.call(id, |r| Request::Evict(snap, r)).await
    }

    /// Changes how this node's restores from the store fetch (measurements compare them).
    pub fn set_restore_mode(&self, mode: crate::archive::RestoreMode) {
        self.inner
            .ctx
            .restore_mode
            .store(mode as u8, std::sync::atomic::Ordering::Relaxed);
    }

    /// Where the time of the last restore of sandbox `id` on this node went, if it was
    /// restored here.
    pub fn last_restore(&self, id: &SandboxId) -> Option<crate::archive::RestoreReport> {
        let sandboxes = self.lock_sandboxes();
        let status = &sandboxes.get(id)?.status;
        let report = status
            .last_restore
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        report
    }

    /// The resource samples of a sandbox of this node whose span ends within `[start_ms,
    /// end_ms]`, oldest first ([`crate::metrics`]); none for one that has not run a full
    /// sampling interval here, or that was killed (its series ends with it).
    pub async fn metrics(
        &self,
        id: &SandboxId,
        start_ms: u64,
        end_ms: u64,
    ) -> Result<Vec<space_node_api::MetricSample>> {
        if !self.lock_sandboxes().contains_key(id) {
            // Known (terminated, its record kept) or not found: either way no samples.
            self.info(id).await?;
            return Ok(Vec::new());
        }
        Ok(self.inner.metrics.range(id, start_ms, end_ms))
    }

    /// Takes one metrics sample of every running sandbox now (what the sampler does every
    /// [`NodeConfig::metrics_tick`]); answers how many it took.
    pub async fn sample_metrics(&self) -> usize {
        self.inner
            .metrics
            .sample(super::background::handles_of(&self.inner))
            .await
    }

    /// Counts as activity for the idle timeout (for callers that use a client they hold).
    pub async fn touch(&self, id: &SandboxId) -> Result<()> {
        self.call(id, Request::Touch).await
    }

    /// Kills the VM and removes the sandbox directory; the record (Terminated) and the
    /// snapshots stay.
    pub async fn kill(&self, id: &SandboxId) -> Result<()> {
        self.call(id, Request::Kill).await?;
        self.inner
            .sandboxes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id);
        Ok(())
    }
}

/// What [`Node::guest_waking`] did before answering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// The sandbox was Paused and was resumed.
    Resumed,
    /// The sandbox was Suspended and was restored.
    Restored,
}

impl Wake {
    /// `resume` or `restore`.
    pub fn as_str(self) -> &'static str {
        match self {
            Wake::Resumed => "resume",
            Wake::Restored => "restore",
        }
    }
}

/// What [`Node::usage`] tells of one sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxUsage {
    /// The sandbox.
    pub id: SandboxId,
    /// Its state now.
    pub state: State,
    /// vCPUs of its VM (when it has one).
    pub vcpus: u32,
    /// Guest RAM of its VM in MiB (when it has one).
    pub memory_mib: u64,
    /// The ownership epoch this node holds it under (0: its first owner).
    pub epoch: u64,
}
