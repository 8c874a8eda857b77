//! The transitions of a sandbox's state driver: pause, resume, snapshots, suspend,
//! restore, rollback, kill, discard, timeouts and the VM's own exit, each written to the
//! record as an intent first and as its outcome last.

use super::archiving::Fetched;
use super::*;
use crate::archive::RestoreReport;

impl Sandbox {
    pub(super) async fn pause(&mut self) -> Result<()> {
        self.vm()?;
        self.begin(Intent::Pause, Paused, None)?;
        if let Err(e) = self.vm()?.pause().await {
            self.abandon();
            return Err(e.into());
        }
        self.finish(Paused)
    }

    pub(super) async fn resume(&mut self) -> Result<()> {
        self.vm()?;
        self.begin(Intent::Resume, Running, None)?;
        if let Err(e) = self.vm()?.resume().await {
            self.abandon();
            return Err(e.into());
        }
        self.finish(Running)
    }

    /// Takes a snapshot of the live VM into a new read-only volume and lists it.
    pub(super) async fn snapshot(
        &mut self,
        kind: SnapshotKind,
        reason: SnapshotReason,
    ) -> Result<SnapshotRecord> {
        let label = match (kind, reason) {
            (_, SnapshotReason::Suspend) => "suspend",
            (_, SnapshotReason::Fork) => "fork",
            (_, SnapshotReason::PreRollback) => "undo",
            (SnapshotKind::Disk, _) => "disk",
            (SnapshotKind::Full, _) => "full",
        };
        if reason != SnapshotReason::Suspend {
            // A suspend lets the VM's memory go and writes little; anything else waits
            // for room.
            crate::admission::check_disk(self.ctx.layout.root(), self.ctx.disk_reserve_mib)?;
        }
        let id = self.new_snapshot_id(label);
        let state = self.record.state;
        self.begin(Intent::Snapshot, state, Some(&id))?;
        match self.take_snapshot(&id, kind, reason).await {
            Ok(rec) => {
                self.record.snapshots.push(rec.clone());
                self.record.pending = None;
                self.write()?;
                Ok(rec)
            }
            Err(e) => {
                self.abandon();
                Err(e)
            }
        }
    }

    pub(super) async fn take_snapshot(
        &mut self,
        id: &SnapshotId,
        kind: SnapshotKind,
        reason: SnapshotReason,
    ) -> Result<SnapshotRecord> {
        let sandbox = self.record.id.as_str();
        let parent = self.ctx.layout.snapshots_of(sandbox)?;
        let dir = self.ctx.layout.snapshot_dir(sandbox, id.as_str())?;
        std::fs::create_dir_all(&parent).map_err(NodeError::io("creating", &parent))?;
        let storage = self.ctx.storage.clone();
        // A lazy restore's files must be whole first (the snapshot clones what is behind
        // them).
        self.wait_filled().await?;
        {
            let (s, d) = (storage.clone(), dir.clone());
            blocking(move || Ok(s.create_volume(&d)?)).await?;
        }
        let taken = match kind {
            SnapshotKind::Full => self.full_snapshot(&dir).await,
            SnapshotKind::Disk => self.disk_snapshot(&dir).await,
        };
        let paused_for = match taken {
            Ok(p) => p,
            Err(e) => {
                let (s, d) = (storage.clone(), dir.clone());
                if let Err(cleanup) = blocking(move || Ok(s.delete_volume(&d)?)).await {
                    tracing::error!(error = %cleanup, "removing a failed snapshot");
                }
                return Err(e);
            }
        };
        let (s, d) = (storage, dir.clone());
        blocking(move || Ok(s.set_readonly(&d)?)).await?;
        Ok(SnapshotRecord {
            id: id.clone(),
            kind,
            reason,
            created_unix_ms: now_ms(),
            size_bytes: dir_size(&dir),
            paused_for_us: paused_for.as_micros() as u64,
            local: true,
            remote: None,
        })
    }

    /// The runtime's full snapshot into `dest`. QEMU sometimes refuses the `cont` that ends
    /// a snapshot for a moment after the migration reported completion ("Migration is not
    /// finalized yet"): the runtime then removes the snapshot's files and the VM stays
    /// stopped. The VM is resumed (a failed snapshot must not freeze a running sandbox) and
    /// the snapshot tried once more.
    pub(super) async fn full_snapshot(&self, dest: &Path) -> Result<Duration> {
        let running = self.record.state == Running;
        // A running guest's volume requests are held first, so none is half done in the
        // snapshot (`docs/volumes.md`); they go on once it is taken.
        let quiesced = match (
            &self.client,
            running && !self.record.options.volumes.is_empty(),
        ) {
            (Some(c), true) => match c.quiesce_volumes(true).await {
                Ok(s) if s.in_flight > 0 => {
                    tracing::warn!(id = %self.record.id, in_flight = s.in_flight, "snapshot with volume requests under way");
                    Some(c.clone())
                }
                Ok(_) => Some(c.clone()),
                Err(e) => {
                    tracing::warn!(id = %self.record.id, error = %e, "could not hold the guest's volume requests");
                    None
                }
            },
            _ => None,
        };
        let taken = self.full_snapshot_once(dest, running).await;
        if let Some(c) = quiesced {
            if let Err(e) = c.quiesce_volumes(false).await {
                tracing::debug!(id = %self.record.id, error = %e, "letting the guest's volume requests go");
            }
        }
        taken
    }

    async fn full_snapshot_once(&self, dest: &Path, running: bool) -> Result<Duration> {
        let mut attempt = 1;
        loop {
            match self.vm()?.snapshot(dest).await {
                Ok(info) => return Ok(info.paused_for),
                Err(e) => {
                    if running {
                        self.resume_after_failure().await;
                    }
                    let cont_refused = matches!(
                        &e,
                        space_runtime::Error::Qmp(space_runtime::qmp::QmpError::Command { command, .. })
                            if command == "cont"
                    );
                    if !cont_refused || attempt >= 2 {
                        return Err(e.into());
                    }
                    tracing::warn!(id = %self.record.id, error = %e, "snapshot: QEMU refused to continue; retrying");
                    attempt += 1;
                }
            }
        }
    }

    /// Makes sure a Running sandbox's vCPUs run again after a failed operation stopped them.
    /// Returns whether they do.
    pub(super) async fn resume_after_failure(&self) -> bool {
        for _ in 0..10 {
            let Ok(vm) = self.vm() else { break };
            if vm.resume().await.is_ok() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tracing::error!(id = %self.record.id, "could not resume the VM after a failed operation");
        false
    }

    /// Disk-only snapshot: the guest flushes its page cache (`sync`), the vCPUs stop, the
    /// disk file is cloned, the vCPUs go on. Returns how long they were stopped. A paused
    /// sandbox is not woken for the `sync`: its snapshot is crash-consistent.
    pub(super) async fn disk_snapshot(&mut self, dest: &Path) -> Result<Duration> {
        let running = self.record.state == Running;
        if running {
            let client = self.guest().await?;
            let mut spec = ExecSpec::shell("sync");
            spec.timeout_ms = Some(60_000);
            let out = client.run(spec).await.map_err(|source| NodeError::Guest {
                what: "sync before a disk snapshot",
                source,
            })?;
            if !out.status.success() {
                return Err(NodeError::internal(format!(
                    "`sync` in the guest failed: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                )));
            }
        }
        let vm = self.vm()?;
        let t0 = Instant::now();
        if running {
            vm.pause().await?;
        }
        let (s, src, dst) = (
            self.ctx.storage.clone(),
            self.disk_file(),
            dest.join("rootfs.ext4"),
        );
        let own = self.dir.join("rootfs.ext4");
        let cloned = blocking(move || {
            if own != src {
                // A lazy restore's disk: what the VM wrote reaches the local file behind it.
                std::fs::File::open(&own)
                    .and_then(|f| f.sync_all())
                    .map_err(NodeError::io("syncing", &own))?;
            }
            let mark = DiskMark::of(&src);
            s.clone_file(&src, &dst)?;
            Ok(mark)
        })
        .await;
        let resumed = if running { vm.resume().await } else { Ok(()) };
        let paused_for = if running {
            t0.elapsed()
        } else {
            Duration::ZERO
        };
        self.disk_mark = cloned?;
        if resumed.is_err() && !self.resume_after_failure().await {
            resumed?;
        }
        Ok(paused_for)
    }

    /// Full snapshot, then the VM goes. With an object store the snapshot is uploaded first
    /// and the VM stays (stopped) until its manifest is committed; if the upload fails and
    /// `require_remote`, the VM runs on as before and the error is answered (nothing lost);
    /// otherwise the sandbox is suspended on its local copy and a later pass uploads it.
    pub(super) async fn suspend(&mut self, require_remote: bool) -> Result<SnapshotRecord> {
        self.vm()?;
        let id = self.new_snapshot_id("suspend");
        self.begin(Intent::Suspend, Suspended, Some(&id))?;
        let archive = self.ctx.archive.get().cloned();
        // Stopped for the whole upload: the state uploaded is the state that stays.
        let stopped_here = archive.is_some() && self.record.state == Running;
        if stopped_here {
            if let Err(e) = self.vm()?.pause().await {
                self.abandon();
                return Err(e.into());
            }
        }
        let mut snap = match self
            .take_snapshot(&id, SnapshotKind::Full, SnapshotReason::Suspend)
            .await
        {
            Ok(s) => s,
            Err(e) => {
                if stopped_here {
                    self.resume_after_failure().await;
                }
                self.abandon();
                return Err(e);
            }
        };
        if let Some(cfg) = &archive {
            let mut after = self.record.clone();
            after.snapshots.push(snap.clone());
            after.restore_point = Some(id.clone());
            after.state = Suspended;
            after.pending = None;
            let dir = self
                .ctx
                .layout
                .snapshot_dir(self.record.id.as_str(), id.as_str())?;
            match crate::archive::upload_snapshot(&self.ctx, cfg, &after, &id, &dir).await {
                Ok(remote) => snap.remote = Some(remote),
                Err(e) if require_remote => {
                    // The snapshot stays listed (an ordinary full snapshot now).
                    self.record.snapshots.push(snap);
                    if stopped_here {
                        self.resume_after_failure().await;
                    }
                    self.abandon();
                    return Err(e);
                }
                Err(e) => {
                    tracing::warn!(id = %self.record.id, error = %e, "suspended on the local copy only; the upload is retried later");
                }
            }
        }
        self.record.snapshots.push(snap.clone());
        self.record.restore_point = Some(id);
        self.stop_vm().await;
        self.finish(Suspended)?;
        if snap.remote.is_some() && archive.as_ref().and_then(|c| c.cache_max_bytes) == Some(0) {
            self.evict_local(&snap.id).await;
        }
        Ok(self.record.snapshot(&snap.id).cloned().unwrap_or(snap))
    }

    /// Kills the VM and frees its RAM and disk files (the logs stay).
    pub(super) async fn stop_vm(&mut self) {
        drop(self.client.take());
        if let Some(vm) = self.vm.take() {
            let _ = vm.kill().await;
        }
        self.end_filling();
        if let Err(e) = clear_vm_files(&self.dir) {
            tracing::error!(id = %self.record.id, error = %e, "freeing a stopped VM's files");
        }
    }

    pub(super) async fn restore(&mut self) -> Result<()> {
        let point =
            self.record.restore_point.clone().ok_or_else(|| {
                NodeError::internal("a suspended sandbox without a restore point")
            })?;
        self.begin(Intent::Restore, Running, Some(&point))?;
        let t0 = Instant::now();
        if let Err(e) = clear_vm_files(&self.dir) {
            self.abandon();
            return Err(e);
        }
        let (how, fetched) = match self.restore_source(&point).await {
            Ok(x) => x,
            Err(e) => {
                self.abandon();
                return Err(e);
            }
        };
        // A lazy restore's files fill in from now on: the VM reads them as it starts.
        let (fetched, filling) = match fetched {
            Fetched::Lazy(mut l) => {
                let f = l.restore.take().map(super::lazy::Filling::start);
                (Fetched::Lazy(l), f)
            }
            other => (other, None),
        };
        let t_launch = Instant::now();
        let launched = launch(&self.ctx, &self.dir, how, &self.record).await;
        let mut report = RestoreReport::default();
        match fetched {
            Fetched::Local => {}
            Fetched::Whole(incoming) => {
                report.from_store = true;
                report.prepared = incoming.prepared;
                report.fetch = Some(incoming.fetch.clone());
                incoming.remove();
                self.caching.push((point.clone(), None));
            }
            Fetched::Lazy(l) => {
                report.from_store = true;
                report.prepared = l.prepared;
                report.opened = l.opened;
                self.caching.push((point.clone(), None));
            }
        }
        match launched {
            Ok(live) => {
                if let Some(filling) = filling {
                    let behind = self.dir.join(crate::archive::LAZY_DIR);
                    live.vm.set_backing(Some(space_runtime::Backing {
                        mem: behind.join("mem"),
                        disk: behind.join("rootfs.ext4"),
                    }));
                    filling.release_background_after(crate::archive::BACKGROUND_GRACE);
                    self.lazy = Some(filling);
                }
                report.vm_started = live.started;
                report.prefetch = live.prefetch;
                report.guest_ready = t_launch.elapsed().saturating_sub(live.started);
                report.total = t0.elapsed();
                tracing::debug!(id = %self.record.id, ?report, "restored");
                *self
                    .status
                    .last_restore
                    .lock()
                    .unwrap_or_else(|e| e.into_inner()) = Some(report);
                self.vm = Some(live.vm);
                self.client = live.client;
                self.record.origin = Origin::Snapshot {
                    sandbox: self.record.id.clone(),
                    snapshot: point,
                };
                self.record.restore_point = None;
                self.set_started();
                self.finish(Running)
            }
            Err(e) => {
                // The VM is gone (and its files with the launch's cleanup); so is the filling,
                // whose failure, if it failed, is why.
                let why = filling.as_ref().and_then(|f| f.failed());
                if filling.is_some() {
                    drop(filling);
                    // A VM that failed as it loaded leaves the mount points and the local
                    // files behind them.
                    if let Err(e) = clear_vm_files(&self.dir) {
                        tracing::error!(id = %self.record.id, error = %e, "freeing a failed restore's files");
                    }
                }
                self.abandon();
                match why {
                    Some(why) => Err(NodeError::Archive(format!(
                        "the restore from the object store failed: {why}"
                    ))),
                    None => Err(e),
                }
            }
        }
    }

    pub(super) async fn rollback(&mut self, target: SnapshotId) -> Result<()> {
        let snap =
            self.record
                .snapshot(&target)
                .cloned()
                .ok_or_else(|| NodeError::SnapshotNotFound {
                    sandbox: self.record.id.clone(),
                    snapshot: target.clone(),
                    owner: None,
                })?;
        let snap_dir = self
            .ctx
            .layout
            .snapshot_dir(self.record.id.as_str(), target.as_str())?;
        // Everything that can be checked is checked before the current VM is touched.
        let how = match snap.kind {
            SnapshotKind::Full => {
                // An archived snapshot whose local copy was evicted comes back first.
                let snap_dir = self.ensure_local(&target).await?;
                // The node wrote this manifest: one it cannot read is its own fault.
                let m = space_runtime::Manifest::read(&snap_dir.join("manifest.json")).map_err(
                    |e| NodeError::internal(format!("snapshot {target} cannot be restored: {e}")),
                )?;
                m.check_host(self.ctx.runtime.version(), self.ctx.runtime.accel())
                    .map_err(|e| {
                        NodeError::Invalid(format!("snapshot {target} cannot be restored: {e}"))
                    })?;
                Launch::Restore { snapshot: snap_dir }
            }
            SnapshotKind::Disk => {
                let disk = snap_dir.join("rootfs.ext4");
                if !disk.is_file() {
                    return Err(NodeError::internal(format!(
                        "snapshot {target} has no disk image"
                    )));
                }
                let t = template::resolve(
                    &self.ctx.layout,
                    &self.record.template.name,
                    &VersionReq::Exact(self.record.template.version.clone()),
                )?;
                Launch::Boot {
                    kernel: t.kernel(),
                    rootfs: disk,
                    vcpus: self.record.vcpus,
                    memory_mib: self.record.memory_mib,
                    kernel_cmdline: Some(t.manifest.kernel_cmdline.clone()),
                }
            }
        };
        self.begin(Intent::Rollback, Running, Some(&target))?;
        // An undo point first, so a failure below loses nothing.
        if self.vm.is_some() {
            let undo = self.new_snapshot_id("undo");
            match self
                .take_snapshot(&undo, SnapshotKind::Full, SnapshotReason::PreRollback)
                .await
            {
                Ok(s) => {
                    self.record.snapshots.push(s);
                    self.record.restore_point = Some(undo);
                }
                Err(e) => {
                    self.abandon();
                    return Err(e);
                }
            }
        }
        let before = self.record.state;
        self.stop_vm().await;
        match launch(&self.ctx, &self.dir, how, &self.record).await {
            Ok(live) => {
                self.vm = Some(live.vm);
                self.client = live.client;
                self.record.origin = match snap.kind {
                    SnapshotKind::Full => Origin::Snapshot {
                        sandbox: self.record.id.clone(),
                        snapshot: target,
                    },
                    SnapshotKind::Disk => Origin::DiskSnapshot { snapshot: target },
                };
                self.record.restore_point = None;
                self.record.failure = None;
                self.set_started();
                self.finish(Running)
            }
            Err(e) => {
                // The old VM is gone: fall back to the undo point (or stay where we were).
                let fallback = if self.record.restore_point.is_some() {
                    Suspended
                } else {
                    before
                };
                self.finish(fallback)?;
                Err(e)
            }
        }
    }

    pub(super) async fn guest(&mut self) -> Result<GuestClient> {
        if let Some(c) = &self.client {
            if !c.is_closed() {
                return Ok(c.clone());
            }
        }
        // The connection died (the guest daemon restarted it, or a client misbehaved): a new
        // one, the same way a restore makes one.
        drop(self.client.take());
        let client = self.vm()?.wait_ready(self.ctx.ready_timeout).await?;
        self.client = Some(client.clone());
        Ok(client)
    }

    pub(super) async fn kill(&mut self) -> Result<()> {
        self.begin(Intent::Kill, Terminated, None)?;
        self.stop_vm().await;
        let (s, d) = (self.ctx.storage.clone(), self.dir.clone());
        if let Err(e) = blocking(move || Ok(s.delete_volume(&d)?)).await {
            // The VM is gone either way; the directory is retried by whoever cleans up next.
            tracing::error!(id = %self.record.id, error = %e, "removing a killed sandbox's directory");
            self.record.failure = Some(format!("removing the sandbox directory: {e}"));
        }
        self.record.restore_point = None;
        self.finish(Terminated)?;
        crate::archive::mark_terminated(&self.ctx, &self.record).await;
        Ok(())
    }

    pub(super) async fn discard(&mut self) -> Result<()> {
        self.stop_vm().await;
        let (s, d) = (self.ctx.storage.clone(), self.dir.clone());
        blocking(move || Ok(s.delete_volume(&d)?)).await?;
        // What it has in the store is left alone (another node may own it now).
        let snaps = self.ctx.layout.snapshots_of(self.record.id.as_str())?;
        for snap in &self.record.snapshots {
            let dir = snaps.join(snap.id.as_str());
            if dir.exists() {
                let s = self.ctx.storage.clone();
                blocking(move || Ok(s.delete_volume(&dir)?)).await?;
            }
        }
        let _ = std::fs::remove_dir(&snaps);
        self.ctx.records.remove(&self.record.id)?;
        self.ctx
            .discarding
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.record.id);
        tracing::warn!(id = %self.record.id, "sandbox discarded: its local state dropped");
        Ok(())
    }

    pub(super) fn set_timeouts(&mut self, policy: TimeoutPolicy) -> Result<SandboxRecord> {
        let old = self.record.options.timeouts;
        self.record.options.timeouts = policy;
        if let Err(e) = self.write() {
            self.record.options.timeouts = old;
            return Err(e);
        }
        *self
            .status
            .timeouts
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = policy;
        Ok(self.record.clone())
    }

    pub(super) fn set_egress(&mut self, policy: EgressPolicy) -> Result<SandboxRecord> {
        let old = std::mem::replace(&mut self.record.options.egress, policy.clone());
        if let Err(e) = self.write() {
            self.record.options.egress = old;
            return Err(e);
        }
        self.status.egress.set_policy(policy);
        Ok(self.record.clone())
    }

    pub(super) async fn timeout(&mut self, kind: TimeoutKind) -> Result<bool> {
        // Activity may have come in since the reconciler looked.
        if self.status.expired(now_ms()) != Some(kind) {
            return Ok(false);
        }
        let action = self.record.options.timeouts.action;
        tracing::info!(id = %self.record.id, ?kind, ?action, "timeout");
        match action {
            TimeoutAction::Suspend => self.suspend(false).await.map(|_| true),
            TimeoutAction::Kill => self.kill().await.map(|_| true),
        }
    }

    pub(super) async fn vm_exited(&mut self, exit: String) {
        let console = self
            .vm
            .as_ref()
            .map(|vm| vm.console_tail(2048))
            .unwrap_or_default();
        tracing::error!(id = %self.record.id, %exit, "sandbox VM exited on its own\n{console}");
        drop(self.client.take());
        drop(self.vm.take());
        self.end_filling();
        let discarding = self
            .ctx
            .discarding
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&self.record.id);
        let fenced = self.ctx.fenced.load(Ordering::SeqCst);
        if self.ctx.auto_restore && !discarding && !fenced {
            self.record.last_activity_unix_ms =
                self.status.last_activity_ms.load(Ordering::Relaxed);
            let why = format!("the VM exited ({exit})");
            match crate::recovery::relaunch(&self.ctx, &mut self.record, &self.dir, &why).await {
                Ok(live) => {
                    self.vm = Some(live.vm);
                    self.client = live.client;
                    self.status.set_state(self.record.state);
                    let started = self.record.started_unix_ms;
                    self.status.started_ms.store(started, Ordering::Relaxed);
                    return;
                }
                // The record says Failed already, with the reason.
                Err(_) => return self.status.set_state(self.record.state),
            }
        }
        if let Err(e) = clear_vm_files(&self.dir) {
            tracing::error!(id = %self.record.id, error = %e, "freeing an exited VM's files");
        }
        self.record.failure = Some(format!("the VM exited ({exit})"));
        if let Err(e) = self.finish(Failed) {
            tracing::error!(id = %self.record.id, error = %e, "writing a sandbox record");
        }
    }
}
