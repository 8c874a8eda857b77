//! A running QEMU: its process, its QMP session, and what it does with both.

use super::*;

/// One QEMU process and its QMP session. Dropping it kills and reaps the process; the sandbox
/// directory and its files stay.
pub struct QemuVm {
    pub(super) dir: PathBuf,
    /// The machine's shape, recorded in snapshots.
    pub(super) config: QemuConfig,
    pub(super) kernel: KernelInfo,
    /// Set once connected; every method after construction can rely on it.
    pub(super) qmp: Option<Qmp>,
    pub(super) process: Process,
    /// The VMM's uid, gid and cgroup, when it is jailed.
    pub(super) jail: Option<JailRecord>,
    /// What to release once the VMM is gone (taken by whoever sees the exit first; dropped
    /// unrun when the VM is detached).
    pub(super) cleanup: Arc<tokio::sync::Mutex<Option<Cleanup>>>,
    /// Runs the cleanup when the VMM exits on its own; aborted on drop and detach.
    pub(super) reaper: JoinHandle<()>,
    /// Serializes pause/resume/snapshot so they never interleave their QMP steps.
    pub(super) ops: tokio::sync::Mutex<()>,
    /// Keeps the log files under their cap; aborted on drop.
    pub(super) housekeeping: JoinHandle<()>,
    /// Device state of the last snapshot, kept while the VM has not run since. QEMU refuses to
    /// migrate out of `postmigrate` again ("paused due to previous migration"); as nothing ran
    /// in between, the same bytes are the state of the next snapshot.
    pub(super) last_state: Mutex<Option<Arc<Vec<u8>>>>,
    /// Where snapshots clone the RAM file and disk from ([`Vm::set_backing`]).
    pub(super) backing: Mutex<Option<crate::Backing>>,
    /// The channels' splice, when the VM was restored with one ([`crate::RestoreSpec::splice`]).
    pub(crate) splice: Option<crate::Splice>,
}

impl Drop for QemuVm {
    fn drop(&mut self) {
        self.housekeeping.abort();
        self.reaper.abort();
        if self.process.is_detached() {
            return;
        }
        self.process.terminate_blocking();
        // If the reaper is running the cleanup right now, it finishes it (a blocking task is
        // not cancelled by the abort above).
        let cleanup = self.cleanup.try_lock().ok().and_then(|mut c| c.take());
        if let Some(c) = cleanup {
            c.run();
        }
    }
}

impl std::fmt::Debug for QemuVm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QemuVm")
            .field("dir", &self.dir)
            .field("pid", &self.process.pid())
            .field("exit", &self.process.exit_status())
            .finish()
    }
}

impl QemuVm {
    pub(super) fn new(
        dir: &Path,
        config: QemuConfig,
        kernel: KernelInfo,
        process: Process,
        jail: Option<JailRecord>,
        cleanup: Cleanup,
    ) -> QemuVm {
        let cleanup = Arc::new(tokio::sync::Mutex::new(Some(cleanup)));
        let reaper = {
            let mut exit = process.exit_watch();
            let cleanup = cleanup.clone();
            tokio::spawn(async move {
                let _ = exit.wait_for(Option::is_some).await.is_ok();
                run_cleanup(&cleanup).await;
            })
        };
        QemuVm {
            dir: dir.to_owned(),
            config,
            kernel,
            qmp: None,
            process,
            jail,
            cleanup,
            reaper,
            ops: tokio::sync::Mutex::new(()),
            housekeeping: tokio::spawn(housekeeping(dir.to_owned())),
            last_state: Mutex::new(None),
            backing: Mutex::new(None),
            splice: None,
        }
    }

    /// Lets the VM go without killing it: QMP is disconnected, and the VMM, its cgroup and
    /// its files stay for [`QemuRuntime::adopt`]. Only a runtime with
    /// [`QemuRuntimeConfig::detached`] makes VMs that also survive this process's exit;
    /// others still die with it.
    pub fn detach(mut self) {
        self.process.detach();
        self.reaper.abort();
        // The VMM still uses its cgroup and uid: forget them without releasing. (The reaper
        // only takes the cleanup after an exit, and a detached VM has not exited.)
        if let Ok(mut c) = self.cleanup.try_lock() {
            c.take();
        }
        tracing::debug!(pid = self.pid(), dir = %self.dir.display(), "VM detached");
    }

    /// QEMU's run state (`query-status`): `running`, `paused`, `postmigrate`, ...
    pub async fn status(&self) -> Result<Status> {
        self.command(self.qmp().query_status()).await
    }

    /// The uid and gid the VMM runs as, when jailed.
    pub fn jail_ids(&self) -> Option<(u32, u32)> {
        self.jail.as_ref().map(|j| (j.uid, j.gid))
    }

    /// The VMM's cgroup, when jailed with cgroups.
    pub fn cgroup(&self) -> Option<&Cgroup> {
        self.jail.as_ref().and_then(|j| j.cgroup.as_ref())
    }

    /// The QMP session, for operations this type does not wrap.
    pub fn qmp(&self) -> &Qmp {
        self.qmp
            .as_ref()
            .expect("QMP is connected before a QemuVm is handed out")
    }

    /// QEMU's process id.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// QEMU's exit status, once it exited.
    pub fn exit_status(&self) -> Option<ExitInfo> {
        self.process.exit_status()
    }

    /// The last `max` bytes QEMU itself wrote to stderr, sanitized.
    pub fn vmm_log_tail(&self, max: usize) -> String {
        console::tail(&self.dir.join(cmdline::QEMU_LOG), max)
    }

    fn exited(&self, exit: ExitInfo) -> Error {
        Error::Exited {
            exit,
            console: self.console_tail(ERROR_TAIL),
            vmm_log: self.vmm_log_tail(ERROR_TAIL),
        }
    }

    /// Runs `fut` unless QEMU exits first; a QMP connection lost because QEMU died is reported
    /// as [`Error::Exited`].
    pub(super) async fn race_exit<T, E: Into<Error>>(
        &self,
        fut: impl Future<Output = Result<T, E>>,
    ) -> Result<T> {
        let mut exit = self.process.exit_watch();
        let exited = async move {
            // Dropping the borrow at once keeps this future `Send`.
            let _ = exit.wait_for(Option::is_some).await.is_ok();
        };
        tokio::select! {
            biased;
            _ = exited => {
                Err(self.exited(self.process.exit_status().unwrap_or(ExitInfo::UNKNOWN)))
            }
            result = fut => match result.map_err(Into::into) {
                Err(Error::Qmp(QmpError::Closed(_) | QmpError::Io(_))) | Err(Error::Timeout(_))
                    if self.settle_exit().await.is_some() =>
                {
                    Err(self.exited(self.process.exit_status().unwrap_or(ExitInfo::UNKNOWN)))
                }
                other => other,
            },
        }
    }

    /// After a lost connection, gives the exit watcher a moment to collect the status.
    async fn settle_exit(&self) -> Option<ExitInfo> {
        tokio::time::timeout(EXIT_GRACE, self.process.wait())
            .await
            .ok()
    }

    /// A QMP command with a time bound, raced against QEMU's exit.
    pub(super) async fn command<T>(
        &self,
        fut: impl Future<Output = Result<T, QmpError>>,
    ) -> Result<T> {
        self.race_exit(async {
            match tokio::time::timeout(COMMAND_TIMEOUT, fut).await {
                Ok(r) => r.map_err(Error::from),
                Err(_) => Err(Error::Timeout(format!(
                    "after {COMMAND_TIMEOUT:?} waiting for QEMU"
                ))),
            }
        })
        .await
    }

    /// The root disk's size in bytes (its file's length).
    pub async fn disk_bytes(&self) -> Result<u64> {
        let path = self.dir.join(cmdline::DISK_FILE);
        blocking(move || {
            std::fs::metadata(&path)
                .map(|m| m.len())
                .map_err(|source| Error::Io {
                    op: "stat",
                    path,
                    source,
                })
        })
        .await
    }

    /// Grows the root disk to `bytes`, online: QMP `block_resize` extends the file (sparse)
    /// and virtio-blk tells the guest its new capacity with a configuration-change interrupt.
    /// The guest's filesystem is not touched: grow it from inside (the guest daemon's
    /// `grow_fs`). The same size is a no-op; a smaller one, or one that is not a multiple of
    /// 512 bytes, is refused (shrinking would cut the filesystem off). The VM may be running
    /// or paused (a paused guest sees the change when it resumes), but not stopped right
    /// after a snapshot: the disk is handed back to QEMU only by [`Vm::resume`].
    pub async fn resize_disk(&self, bytes: u64) -> Result<()> {
        let _op = self.ops.lock().await;
        self.check_alive()?;
        let current = self.disk_bytes().await?;
        if bytes == current {
            return Ok(());
        }
        if bytes < current {
            return Err(Error::Invalid(format!(
                "the root disk is {current} bytes; it cannot shrink to {bytes}"
            )));
        }
        if !bytes.is_multiple_of(512) || bytes > i64::MAX as u64 {
            return Err(Error::Invalid(format!(
                "disk size {bytes}: it must be a multiple of 512 bytes and below 2^63"
            )));
        }
        // The device state changes with the capacity: a cached one is stale now.
        *self.last_state.lock().unwrap_or_else(|e| e.into_inner()) = None;
        let args = json!({ "device": cmdline::DISK_DRIVE_ID, "size": bytes });
        self.command(self.qmp().execute("block_resize", Some(args)))
            .await?;
        tracing::debug!(dir = %self.dir.display(), from = current, to = bytes, "root disk grown");
        Ok(())
    }

    /// Restarts the vCPUs. Right after a migration QEMU announces completion before it has
    /// finished tearing the migration down, and refuses `cont` meanwhile ("Migration is not
    /// finalized yet"); that refusal is retried briefly instead of failing the operation.
    pub(super) async fn cont(&self) -> Result<()> {
        let deadline = Instant::now() + CONT_RETRY_FOR;
        let mut delay = Duration::from_millis(1);
        loop {
            match self.command(self.qmp().execute("cont", None)).await {
                Err(Error::Qmp(QmpError::Command { desc, .. }))
                    if desc.contains("not finalized") && Instant::now() < deadline =>
                {
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_millis(20));
                }
                r => return r.map(drop),
            }
        }
    }

    /// Waits until the current migration (either direction) completes or fails. Polls
    /// `query-migrate` whenever a MIGRATION event arrives, and every few milliseconds in case
    /// events were dropped.
    pub(super) async fn wait_migration(
        &self,
        mut events: broadcast::Receiver<Event>,
    ) -> Result<()> {
        let qmp = self.qmp();
        let wait = async {
            loop {
                let info = qmp.query_migrate().await?;
                match info.status.as_deref() {
                    Some("completed") => return Ok(()),
                    Some(s @ ("failed" | "cancelled")) => {
                        let why = info.error_desc.unwrap_or_else(|| s.to_owned());
                        return Err(Error::Migration(why));
                    }
                    _ => {}
                }
                let next_event = async {
                    loop {
                        match events.recv().await {
                            Ok(e) if e.name == "MIGRATION" => return,
                            Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => continue,
                            Err(broadcast::error::RecvError::Closed) => {
                                std::future::pending::<()>().await
                            }
                        }
                    }
                };
                let _ = tokio::time::timeout(Duration::from_millis(20), next_event).await;
            }
        };
        self.race_exit(async {
            match tokio::time::timeout(MIGRATION_TIMEOUT, wait).await {
                Ok(r) => r,
                Err(_) => Err(Error::Timeout(format!(
                    "after {MIGRATION_TIMEOUT:?} waiting for migration"
                ))),
            }
        })
        .await
    }

    async fn snapshot_inner(&self, dest: &Path, files: bool) -> Result<SnapshotInfo> {
        let qmp = self.qmp();
        let status = self.command(qmp.query_status()).await?;
        let was_running = status.running;
        let stopped_at = Instant::now();
        if was_running {
            self.command(qmp.execute("stop", None)).await?;
        }
        let reuse = if status.status == "postmigrate" {
            self.cached_state()
        } else {
            None
        };
        let saved = self.save_stopped(dest, reuse, files).await;
        if was_running || saved.is_err() {
            *self.last_state.lock().unwrap_or_else(|e| e.into_inner()) = None;
        }
        let paused_for = stopped_at.elapsed();
        if was_running && (files || saved.is_err()) {
            // Resume even when saving failed: a failed snapshot must not freeze the sandbox.
            let resumed = self.cont().await;
            if saved.is_ok() {
                resumed?;
            }
        }
        let (state_bytes, mem_clone, disk_clone) = saved?;
        let manifest = Manifest {
            format: FORMAT_VERSION,
            qemu: qmp.version().clone(),
            accel: self.config.accel,
            vcpus: self.config.vcpus,
            memory_mib: self.config.memory_mib,
            kernel: self.kernel.clone(),
            kernel_cmdline: self.config.kernel_cmdline.clone(),
            state_bytes,
            created_unix_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
        };
        let m = manifest.clone();
        let path = dest.join(cmdline::MANIFEST_FILE);
        blocking(move || m.write(&path)).await?;
        Ok(SnapshotInfo {
            dir: dest.to_owned(),
            state_bytes,
            mem_clone,
            disk_clone,
            paused_for: if was_running {
                paused_for
            } else {
                Duration::ZERO
            },
            manifest,
        })
    }

    fn cached_state(&self) -> Option<Arc<Vec<u8>>> {
        self.last_state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The part of a snapshot that needs the vCPUs stopped: device state (migrated, or reused
    /// from the previous snapshot when the VM has not run since), then RAM and disk (synced
    /// only, not cloned, without `files`).
    async fn save_stopped(
        &self,
        dest: &Path,
        reuse: Option<Arc<Vec<u8>>>,
        files: bool,
    ) -> Result<(u64, CloneMethod, CloneMethod)> {
        let qmp = self.qmp();
        let state_path = dest.join(cmdline::STATE_FILE);
        let mut state = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&state_path)
            .map_err(|source| Error::Io {
                op: "creating",
                path: state_path.clone(),
                source,
            })?;
        let io = |op| {
            let path = state_path.clone();
            move |source| Error::Io { op, path, source }
        };
        if let Some(bytes) = reuse {
            use std::io::Write;
            state.write_all(&bytes).map_err(io("writing"))?;
            drop(state);
        } else {
            self.command(qmp.getfd(SNAPSHOT_FD, state.as_fd())).await?;
            drop(state);
            let events = qmp.subscribe();
            let uri = json!({ "uri": format!("fd:{SNAPSHOT_FD}") });
            self.command(qmp.execute("migrate", Some(uri))).await?;
            if let Err(e) = self.wait_migration(events).await {
                // QEMU says only "failed" when writing the state failed; a full disk is the
                // usual reason, and one the caller must be told about as such.
                return Err(match e {
                    Error::Migration(_) if no_room_in(dest) => Error::Io {
                        op: "writing the device state to",
                        path: state_path,
                        source: std::io::Error::from_raw_os_error(libc::ENOSPC),
                    },
                    e => e,
                });
            }
            let len = std::fs::metadata(&state_path).map_err(io("reading"))?.len();
            let cached = if len <= MAX_CACHED_STATE {
                std::fs::read(&state_path).ok().map(Arc::new)
            } else {
                None
            };
            *self.last_state.lock().unwrap_or_else(|e| e.into_inner()) = cached;
        }

        let (own_mem, dst_mem) = (
            self.dir.join(cmdline::MEM_FILE),
            dest.join(cmdline::MEM_FILE),
        );
        let (own_disk, dst_disk) = (
            self.dir.join(cmdline::DISK_FILE),
            dest.join(cmdline::DISK_FILE),
        );
        let backing = self
            .backing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let (src_mem, src_disk) = match backing {
            Some(b) => {
                // What the VM changed reaches the backing files when its own are synced.
                for p in [own_mem, own_disk] {
                    blocking(move || {
                        std::fs::File::open(&p)
                            .and_then(|f| f.sync_all())
                            .map_err(|source| Error::Io {
                                op: "syncing",
                                path: p.clone(),
                                source,
                            })
                    })
                    .await?;
                }
                (b.mem, b.disk)
            }
            None => (own_mem, own_disk),
        };
        if !files {
            let len = std::fs::metadata(&state_path).map_err(io("reading"))?.len();
            return Ok((len, CloneMethod::InPlace, CloneMethod::InPlace));
        }
        let (mem, disk) = tokio::join!(
            blocking(move || cow::clone_file(&src_mem, &dst_mem)),
            blocking(move || cow::clone_file(&src_disk, &dst_disk)),
        );
        let state_bytes = std::fs::metadata(&state_path)
            .map_err(|source| Error::Io {
                op: "reading",
                path: state_path,
                source,
            })?
            .len();
        Ok((state_bytes, mem?, disk?))
    }
}

impl QemuVm {
    /// [`Vm::snapshot`], or with `files` false [`QemuVm::save_state`].
    pub(super) async fn snapshot_into(&self, dest: &Path, files: bool) -> Result<SnapshotInfo> {
        let _op = self.ops.lock().await;
        self.check_alive()?;
        let created = match std::fs::create_dir(dest) {
            Ok(()) => true,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let empty = std::fs::read_dir(dest)
                    .map_err(|source| Error::Io {
                        op: "reading",
                        path: dest.to_owned(),
                        source,
                    })?
                    .next()
                    .is_none();
                if !empty {
                    return Err(Error::Invalid(format!("{} is not empty", dest.display())));
                }
                false
            }
            Err(source) => {
                return Err(Error::Io {
                    op: "creating",
                    path: dest.to_owned(),
                    source,
                })
            }
        };
        let result = self.snapshot_inner(dest, files).await;
        if result.is_err() {
            // Leave no half snapshot behind, but never remove a directory we did not make.
            for name in [
                cmdline::STATE_FILE,
                cmdline::MEM_FILE,
                cmdline::DISK_FILE,
                cmdline::MANIFEST_FILE,
            ] {
                let _ = std::fs::remove_file(dest.join(name));
            }
            if created {
                let _ = std::fs::remove_dir(dest);
            }
        }
        result
    }

    /// Stops the VM and writes its device state and manifest into `dest` (which must not
    /// exist or be empty), with its RAM file and disk synced (to their backing files, when
    /// set) but not cloned: what a new VMM needs to go on with this VM on the same files.
    /// The VM stays stopped; this VMM can only be killed or resumed afterwards.
    pub async fn save_state(&self, dest: &Path) -> Result<SnapshotInfo> {
        self.snapshot_into(dest, false).await
    }
}

impl Vm for QemuVm {
    fn dir(&self) -> &Path {
        &self.dir
    }

    async fn pause(&self) -> Result<()> {
        let _op = self.ops.lock().await;
        self.command(self.qmp().execute("stop", None))
            .await
            .map(drop)
    }

    async fn resume(&self) -> Result<()> {
        let _op = self.ops.lock().await;
        *self.last_state.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.cont().await
    }

    async fn snapshot(&self, dest: &Path) -> Result<SnapshotInfo> {
        self.snapshot_into(dest, true).await
    }

    fn set_backing(&self, backing: Option<crate::Backing>) {
        *self.backing.lock().unwrap_or_else(|e| e.into_inner()) = backing;
    }

    async fn kill(&self) -> Result<ExitInfo> {
        self.process.kill().map_err(|source| Error::Io {
            op: "killing QEMU in",
            path: self.dir.clone(),
            source,
        })?;
        let exit = self.process.wait().await;
        run_cleanup(&self.cleanup).await;
        Ok(exit)
    }

    async fn wait(&self) -> ExitInfo {
        let exit = self.process.wait().await;
        run_cleanup(&self.cleanup).await;
        exit
    }

    fn check_alive(&self) -> Result<()> {
        match self.process.exit_status() {
            Some(exit) => Err(self.exited(exit)),
            None => Ok(()),
        }
    }

    fn set_priority(&self, priority: Priority) -> Result<()> {
        self.check_alive()?;
        crate::priority::apply(self.pid(), self.cgroup(), priority).map_err(|source| Error::Io {
            op: "setting the CPU priority of QEMU in",
            path: self.dir.clone(),
            source,
        })
    }

    async fn connect_ctl(&self) -> Result<UnixStream> {
        self.check_alive()?;
        match &self.splice {
            Some(s) => s.connect(cmdline::CTL_SOCKET).await,
            None => connect_in_dir(&self.dir, cmdline::CTL_SOCKET).await,
        }
    }

    async fn connect_egress(&self) -> Result<UnixStream> {
        self.check_alive()?;
        match &self.splice {
            Some(s) => s.connect(cmdline::EGRESS_SOCKET).await,
            None => connect_in_dir(&self.dir, cmdline::EGRESS_SOCKET).await,
        }
    }

    fn console_tail(&self, max: usize) -> String {
        console::tail(&self.dir.join(cmdline::CONSOLE_LOG), max)
    }
}

/// What a VM holds on the host besides its process: its cgroup, and its uid when uids are
/// leased per VM.
pub(super) struct Cleanup {
    pub(super) cgroup: Option<Cgroup>,
    pub(super) leased_uid: Option<u32>,
}

impl Cleanup {
    pub(super) fn for_jail(config: Option<&JailConfig>, record: Option<&JailRecord>) -> Cleanup {
        let leased = matches!(config.map(|c| &c.user), Some(JailUser::Range { .. }));
        Cleanup {
            cgroup: record.and_then(|r| r.cgroup.clone()),
            leased_uid: record.filter(|_| leased).map(|r| r.uid),
        }
    }

    /// Releases everything; call only once the VMM is gone. Blocks up to
    /// [`CGROUP_REMOVE_PATIENCE`].
    pub(super) fn run(self) {
        if let Some(cg) = self.cgroup {
            if let Err(e) = cg.remove(CGROUP_REMOVE_PATIENCE) {
                tracing::warn!("leaving the cgroup of an exited VM for the next sweep: {e}");
            }
        }
        if let Some(uid) = self.leased_uid {
            jail::release_id(uid);
        }
    }
}

/// Runs the cleanup unless it ran already; returns once it has run, whoever ran it (the lock
/// is held meanwhile).
async fn run_cleanup(cleanup: &tokio::sync::Mutex<Option<Cleanup>>) {
    let mut guard = cleanup.lock().await;
    if let Some(c) = guard.take() {
        let _ = tokio::task::spawn_blocking(move || c.run()).await;
    }
}

/// Whether the filesystem of `dir` has no room for a few MiB more: probed by reserving them
/// in a scratch file (removed again), since free-space counts of copy-on-write filesystems
/// do not say whether a write fits.
fn no_room_in(dir: &Path) -> bool {
    const PROBE: i64 = 4 << 20;
    let probe = dir.join(".space-room-probe");
    let Ok(f) = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&probe)
    else {
        return true;
    };
    // SAFETY: fallocate on a descriptor owned by `f`, with integer arguments only.
    let rc = unsafe { libc::fallocate(std::os::fd::AsRawFd::as_raw_fd(&f), 0, 0, PROBE) };
    let full = rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOSPC);
    drop(f);
    let _ = std::fs::remove_file(&probe);
    full
}
