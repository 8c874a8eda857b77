//! The QEMU implementation of [`Runtime`] and [`Vm`]: one `qemu-system-x86_64 -M microvm`
//! process per sandbox, driven over QMP.
//!
//! This module owns the sequences; the pieces live elsewhere (command line in
//! [`crate::cmdline`], protocol in [`crate::qmp`], file clones in [`crate::cow`], the child
//! process in [`crate::process`]).
//!
//! - Boot: create the RAM file, clone the disk in, start QEMU paused (`-S`) in the sandbox
//!   directory, connect QMP, enable the migration capabilities snapshots need, `cont`.
//! - Snapshot: `stop`; migrate device state only (`x-ignore-shared`: RAM is a shared file)
//!   into a file handed over with `getfd`; clone the RAM file and the disk while nothing runs;
//!   `cont` if it was running; write the manifest last. After the migration QEMU sits in
//!   `postmigrate`, from which `cont` resumes the same VM (and reactivates its disk).
//! - Restore: check the manifest, clone RAM and disk into the new directory, start QEMU with
//!   the same machine plus `-incoming defer`, `migrate-incoming` from the state file (passed
//!   read-only with `getfd`), `cont` unless asked to stay paused.
//!
//! - Adopt: a VMM started with [`QemuRuntimeConfig::detached`] outlives the node; a later
//!   node finds it through `qemu.pid` and `qemu.json` in the sandbox directory, checks that
//!   the process really is that VMM (start time, binary, root or working directory, command
//!   line), and reconnects QMP (QEMU's monitor socket accepts a new client once the previous
//!   one is gone).
//!
//! Every request races the QEMU process: if it exits, the request fails with
//! [`Error::Exited`] carrying the exit status and the console tail instead of waiting forever.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::future::Future;
use std::os::fd::AsFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::json;
use sha2::{Digest, Sha256};
use tokio::net::UnixStream;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use crate::accel::{self, Accel};
use crate::cgroup::{self, Cgroup, Layout};
use crate::cmdline::{self, QemuConfig};
use crate::console;
use crate::cow::{self, CloneMethod};
use crate::jail::{self, JailConfig, JailRecord, JailUser};
use crate::manifest::{self, KernelInfo, Manifest, FORMAT_VERSION};
use crate::process::{ExitInfo, Process, SpawnOptions};
use crate::qmp::{Event, QemuVersion, Qmp, QmpError, Status};
use crate::{BootSpec, Error, RestoreSpec, Result, Runtime, SnapshotInfo, Vm};

/// How long QEMU may take from exec to answering on QMP.
const QMP_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// Upper bound for saving or loading device state (tens of KiB; RAM is not in the stream).
const MIGRATION_TIMEOUT: Duration = Duration::from_secs(60);
/// Upper bound for a plain QMP command such as `stop`.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a lost QMP connection waits for the process exit status before reporting.
const EXIT_GRACE: Duration = Duration::from_secs(2);
/// How often the log files are checked against their cap.
const LOG_CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// Bytes of console and VMM log quoted in errors.
const ERROR_TAIL: usize = 4096;
/// Largest accepted guest: bounds the RAM file the runtime creates.
const MAX_MEMORY_MIB: u64 = 1 << 20;
/// Largest accepted vCPU count.
const MAX_VCPUS: u32 = 64;
/// Migration capabilities set on both ends: RAM stays in the shared file; state changes are
/// announced as events so completion is noticed without polling.
const MIGRATION_CAPABILITIES: &[&str] = &["x-ignore-shared", "events"];
/// Largest device state kept in memory for a repeated snapshot of a VM that stayed paused.
const MAX_CACHED_STATE: u64 = 16 << 20;
/// How long `cont` is retried while QEMU is still finalizing a migration.
const CONT_RETRY_FOR: Duration = Duration::from_secs(2);
/// `getfd` names.
const SNAPSHOT_FD: &str = "snapshot-out";
const RESTORE_FD: &str = "restore-in";

/// Identifies one version of a kernel file: path, size, mtime (seconds, nanoseconds), inode.
type KernelKey = (PathBuf, u64, (i64, i64), u64);

/// How long cleanup waits for the kernel to let go of an exited VMM's cgroup.
const CGROUP_REMOVE_PATIENCE: Duration = Duration::from_secs(2);

/// Settings of a [`QemuRuntime`].
#[derive(Debug, Clone)]
pub struct QemuRuntimeConfig {
    /// The QEMU binary (searched in `PATH` if it has no slash).
    pub qemu: PathBuf,
    /// Accelerator; `None` detects it (and honours `SPACE_ACCEL`).
    pub accel: Option<Accel>,
    /// Start VMMs so they outlive this process: in their own session, without a parent-death
    /// signal, with stdio on files. A restarted node re-adopts them with
    /// [`QemuRuntime::adopt`]. Off by default, so a test (or a crash of a node that does not
    /// adopt) leaves no VMs behind. A handle still kills its VM when dropped, unless it is
    /// let go with [`QemuVm::detach`].
    pub detached: bool,
    /// The jail of every VMM ([`crate::jail`]); `None` runs QEMU unconfined, as the calling
    /// user. The default is the default jail when running as root, else `None`.
    pub jail: Option<JailConfig>,
}

impl Default for QemuRuntimeConfig {
    fn default() -> Self {
        QemuRuntimeConfig {
            qemu: PathBuf::from("qemu-system-x86_64"),
            accel: None,
            detached: false,
            jail: jail::is_root().then(JailConfig::default),
        }
    }
}

/// Starts QEMU microVMs. Cheap to share; holds no per-VM state.
pub struct QemuRuntime {
    /// Absolute path of the QEMU binary (adoption compares the running executable with it).
    qemu: PathBuf,
    accel: Accel,
    detached: bool,
    jail: Option<JailConfig>,
    /// Where the cgroup controllers are, when the jail uses cgroups.
    cgroups: Option<Layout>,
    version: QemuVersion,
    /// Appended to every boot's kernel command line: under TCG the clock parameters from
    /// [`tsc`](crate::tsc); empty under KVM.
    cmdline_extra: String,
    /// SHA-256 of kernel images by (path, size, mtime, inode): hashing a kernel costs tens of
    /// milliseconds, too much for every restore.
    kernel_hashes: Mutex<HashMap<KernelKey, String>>,
}

impl QemuRuntime {
    /// Probes the QEMU binary's version and picks the accelerator.
    pub async fn new(config: QemuRuntimeConfig) -> Result<Self> {
        let qemu = resolve_binary(&config.qemu)?;
        let mut cgroups = None;
        if let Some(jc) = &config.jail {
            if !jail::is_root() {
                return Err(jail::JailError::NotRoot.into());
            }
            jail::check_binary(jc, &qemu)?;
            if jc.cgroups {
                cgroups = Some(Layout::detect().map_err(jail::JailError::from)?);
            }
        }
        let accel = match config.accel {
            Some(a) => a,
            None => accel::detect()?.accel,
        };
        let output = tokio::process::Command::new(&qemu)
            .arg("--version")
            .stdin(Stdio::null())
            .output()
            .await
            .map_err(|source| Error::Io {
                op: "running",
                path: config.qemu.clone(),
                source,
            })?;
        let text = String::from_utf8_lossy(&output.stdout);
        let version = parse_version_output(&text).ok_or_else(|| {
            Error::Invalid(format!(
                "cannot parse `{} --version`: {text:?}",
                config.qemu.display()
            ))
        })?;
        let cmdline_extra = match accel {
            Accel::Kvm => String::new(),
            Accel::Tcg => {
                let khz = tokio::task::spawn_blocking(crate::tsc::host_tsc_khz)
                    .await
                    .ok()
                    .flatten();
                if khz.is_none() {
                    tracing::warn!("could not measure the host TSC; guests calibrate their own");
                }
                crate::tsc::tcg_cmdline_extra(khz)
            }
        };
        tracing::info!(
            qemu = %version, %accel, %cmdline_extra, detached = config.detached,
            jailed = config.jail.is_some(), ?cgroups, "QEMU runtime ready"
        );
        Ok(QemuRuntime {
            qemu,
            accel,
            detached: config.detached,
            jail: config.jail,
            cgroups,
            version,
            cmdline_extra,
            kernel_hashes: Mutex::default(),
        })
    }

    /// The kernel command line of a boot: the caller's (or the default) plus what the
    /// accelerator needs, unless the caller already set those parameters.
    fn boot_cmdline(&self, requested: Option<&str>) -> String {
        let base = requested.unwrap_or(cmdline::DEFAULT_KERNEL_CMDLINE);
        if self.cmdline_extra.is_empty() || base.contains("tsc") {
            base.to_owned()
        } else {
            format!("{base} {}", self.cmdline_extra)
        }
    }

    /// The accelerator guests run under.
    pub fn accel(&self) -> Accel {
        self.accel
    }

    /// The QEMU version snapshots are written with and must match on restore.
    pub fn version(&self) -> &QemuVersion {
        &self.version
    }

    /// The jail VMMs run in, if any.
    pub fn jail(&self) -> Option<&JailConfig> {
        self.jail.as_ref()
    }

    /// Where the jail's cgroups live, if it uses cgroups.
    pub fn cgroup_layout(&self) -> Option<&Layout> {
        self.cgroups.as_ref()
    }

    /// Removes the cgroups of VMs that are gone (empty ones under the jail's cgroup parent)
    /// and returns them. A node calls it at start, after adopting its VMs and before it
    /// starts new ones.
    pub fn sweep_cgroups(&self) -> Result<Vec<PathBuf>> {
        match (&self.jail, &self.cgroups) {
            (Some(jc), Some(layout)) => {
                Ok(cgroup::sweep(layout, &jc.cgroup_parent).map_err(jail::JailError::from)?)
            }
            _ => Ok(Vec::new()),
        }
    }

    async fn kernel_info(&self, path: &Path) -> Result<KernelInfo> {
        let path = std::path::absolute(path).map_err(|source| Error::Io {
            op: "resolving",
            path: path.to_owned(),
            source,
        })?;
        let meta = std::fs::metadata(&path).map_err(|source| Error::Io {
            op: "reading kernel",
            path: path.clone(),
            source,
        })?;
        if !meta.is_file() {
            return Err(Error::Invalid(format!(
                "kernel {} is not a file",
                path.display()
            )));
        }
        let key = (
            path.clone(),
            meta.len(),
            (meta.mtime(), meta.mtime_nsec()),
            meta.ino(),
        );
        if let Some(hash) = self
            .kernel_hashes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
        {
            return Ok(KernelInfo {
                path,
                size: meta.len(),
                sha256: hash.clone(),
            });
        }
        let p = path.clone();
        let hash = tokio::task::spawn_blocking(move || -> std::io::Result<String> {
            let mut f = File::open(&p)?;
            let mut h = Sha256::new();
            std::io::copy(&mut f, &mut h)?;
            Ok(hex(&h.finalize()))
        })
        .await
        .expect("hashing task panicked")
        .map_err(|source| Error::Io {
            op: "hashing kernel",
            path: path.clone(),
            source,
        })?;
        self.kernel_hashes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, hash.clone());
        Ok(KernelInfo {
            path,
            size: meta.len(),
            sha256: hash,
        })
    }

    /// Starts QEMU for `config` in `dir` and connects QMP. The machine is left paused.
    async fn start(
        &self,
        dir: &Path,
        mut config: QemuConfig,
        kernel: KernelInfo,
    ) -> Result<QemuVm> {
        for name in [
            cmdline::QMP_SOCKET,
            cmdline::CTL_SOCKET,
            cmdline::EGRESS_SOCKET,
            cmdline::PID_FILE,
            cmdline::RECORD_FILE,
        ] {
            remove_if_exists(&dir.join(name))?;
        }
        let log_path = dir.join(cmdline::QEMU_LOG);
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(&log_path)
            .map_err(|source| Error::Io {
                op: "creating",
                path: log_path.clone(),
                source,
            })?;
        let out = log.try_clone().map_err(|source| Error::Io {
            op: "opening",
            path: log_path,
            source,
        })?;
        let t0 = Instant::now();
        let setup = match &self.jail {
            Some(jc) => {
                let (jc, layout) = (jc.clone(), self.cgroups.clone());
                let (d, k) = (dir.to_owned(), config.kernel.clone());
                let shape = jail::VmShape {
                    accel: config.accel,
                    vcpus: config.vcpus,
                    memory_mib: config.memory_mib,
                };
                let setup =
                    blocking(move || jail::prepare(&jc, layout.as_ref(), &d, &k, &shape)).await?;
                config.kernel = PathBuf::from(cmdline::KERNEL_FILE);
                Some(setup)
            }
            None => None,
        };
        let prepared = t0.elapsed();
        let cleanup = Cleanup::for_jail(self.jail.as_ref(), setup.as_ref().map(|s| &s.record));
        let mut cmd = Command::new(&self.qemu);
        cmd.args(cmdline::build(&config))
            .current_dir(dir)
            // Nothing of the host's environment (credentials included) reaches the VMM.
            .env_clear()
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(log);
        let options = SpawnOptions {
            die_with_parent: !self.detached,
            new_session: self.detached,
            jail: setup.as_ref().map(|s| s.prepared.clone()),
        };
        let started = Instant::now();
        let process = match Process::spawn_with(cmd, options).await {
            Ok(p) => p,
            Err(e) => {
                cleanup.run();
                return Err(e.into());
            }
        };
        tracing::debug!(
            pid = process.pid(), dir = %dir.display(), jailed = setup.is_some(),
            jail_prepared = ?prepared, spawned = ?started.elapsed(), "QEMU started"
        );
        let record = VmRecord {
            pid: process.pid(),
            start_ticks: proc_start_ticks(process.pid()).unwrap_or(0),
            qemu: self.qemu.clone(),
            config: config.clone(),
            kernel: kernel.clone(),
            jail: setup.map(|s| s.record),
        };
        let mut vm = QemuVm::new(dir, config, kernel, process, record.jail.clone(), cleanup);
        let d = dir.to_owned();
        blocking(move || record.write(&d)).await?;
        let qmp = vm.race_exit(connect_qmp(dir, QMP_CONNECT_TIMEOUT)).await?;
        if qmp.version() != &self.version {
            return Err(Error::Invalid(format!(
                "QEMU reports version {} but {} was probed at start; was it upgraded?",
                qmp.version(),
                self.version
            )));
        }
        vm.qmp = Some(qmp);
        vm.command(
            vm.qmp()
                .enable_migration_capabilities(MIGRATION_CAPABILITIES),
        )
        .await?;
        tracing::debug!(elapsed = ?started.elapsed(), "QMP connected");
        Ok(vm)
    }

    /// Takes over the VMM running in `dir`, started by an earlier node process (or by this
    /// one and let go with [`QemuVm::detach`]).
    ///
    /// Reads `qemu.pid` and `qemu.json`, opens a pidfd for the pid (pinning that process),
    /// and accepts it only if its start time, executable, root (jailed) or working directory
    /// (unjailed) and full command line match what the runtime recorded when it started it;
    /// anything else is [`Error::NotAdoptable`] and nothing is signalled. Then reconnects QMP
    /// and asks QEMU its run state ([`QemuVm::status`]). The VMM is not our child (unless this
    /// process started it), so its exit is noticed through the pidfd and its exit status is
    /// [`ExitInfo::UNKNOWN`].
    ///
    /// The adopted handle behaves like a started one: dropping it kills the VM unless it is
    /// detached again. A VM whose last snapshot left it in `postmigrate` (snapshotted while
    /// paused, not resumed since) cannot be snapshotted again before it is resumed: the
    /// device-state copy that covers this case lives in the handle that took the snapshot.
    pub async fn adopt(&self, dir: &Path) -> Result<QemuVm> {
        let not = |reason: String| Error::NotAdoptable {
            dir: dir.to_owned(),
            reason,
        };
        let pid_text = std::fs::read_to_string(dir.join(cmdline::PID_FILE))
            .map_err(|e| not(format!("reading {}: {e}", cmdline::PID_FILE)))?;
        let pid: u32 = pid_text
            .trim()
            .parse()
            .map_err(|_| not(format!("{} holds {:?}", cmdline::PID_FILE, pid_text.trim())))?;
        let record = VmRecord::read(dir).map_err(not)?;
        if record.pid != pid || pid <= 1 {
            return Err(not(format!(
                "{} says {pid} but {} says {}",
                cmdline::PID_FILE,
                cmdline::RECORD_FILE,
                record.pid
            )));
        }
        if record.qemu != self.qemu {
            return Err(not(format!(
                "started with {} but this runtime uses {}",
                record.qemu.display(),
                self.qemu.display()
            )));
        }
        if record.config.accel != self.accel {
            return Err(not(format!(
                "started under {} but this runtime uses {}",
                record.config.accel, self.accel
            )));
        }
        let pidfd = match crate::process::pidfd_open(pid) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {
                return Err(not(format!("process {pid} is gone")))
            }
            Err(e) => return Err(not(format!("pidfd_open({pid}): {e}"))),
        };
        verify_process(pid, &record, dir).map_err(not)?;
        // The checks read /proc/<pid>; they were about the pinned process only if it is still
        // alive now (a pid is not reused while its process, or its zombie, exists).
        if crate::process::pidfd_exited(std::os::fd::AsFd::as_fd(&pidfd)) {
            return Err(not(format!("process {pid} exited during adoption")));
        }
        let process = Process::adopt(pid, pidfd)?;
        if let Some(j) = &record.jail {
            if matches!(
                self.jail.as_ref().map(|c| &c.user),
                Some(JailUser::Range { .. })
            ) {
                jail::claim_id(j.uid);
            }
        }
        let cleanup = Cleanup::for_jail(self.jail.as_ref(), record.jail.as_ref());
        let mut vm = QemuVm::new(
            dir,
            record.config.clone(),
            record.kernel.clone(),
            process,
            record.jail.clone(),
            cleanup,
        );
        let qmp = vm.race_exit(connect_qmp(dir, QMP_CONNECT_TIMEOUT)).await?;
        if qmp.version() != &self.version {
            // Leave it running: it is not ours to kill if we cannot drive it.
            vm.detach();
            return Err(not(format!(
                "QEMU reports version {} but this runtime expects {}",
                qmp.version(),
                self.version
            )));
        }
        vm.qmp = Some(qmp);
        let status = vm.status().await?;
        tracing::info!(pid, dir = %dir.display(), state = %status.status, "adopted VM");
        Ok(vm)
    }

    async fn boot_inner(&self, spec: &BootSpec, created: &mut Vec<PathBuf>) -> Result<QemuVm> {
        validate_shape(spec.vcpus, spec.memory_mib)?;
        require_dir(&spec.dir)?;
        let kernel = self.kernel_info(&spec.kernel).await?;

        let mem = spec.dir.join(cmdline::MEM_FILE);
        let f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&mem)
            .map_err(|source| Error::Io {
                op: "creating",
                path: mem.clone(),
                source,
            })?;
        created.push(mem.clone());
        f.set_len(spec.memory_mib << 20)
            .map_err(|source| Error::Io {
                op: "sizing",
                path: mem.clone(),
                source,
            })?;
        drop(f);

        let disk = spec.dir.join(cmdline::DISK_FILE);
        if !same_file(&spec.rootfs, &disk) {
            let src = spec.rootfs.clone();
            let dst = disk.clone();
            let method = blocking(move || cow::clone_file(&src, &dst)).await?;
            created.push(disk);
            tracing::debug!(?method, "root disk cloned");
        }

        let config = QemuConfig {
            accel: self.accel,
            vcpus: spec.vcpus,
            memory_mib: spec.memory_mib,
            kernel: kernel.path.clone(),
            kernel_cmdline: self.boot_cmdline(spec.kernel_cmdline.as_deref()),
            incoming: false,
        };
        let vm = self.start(&spec.dir, config, kernel).await?;
        vm.cont().await?;
        Ok(vm)
    }

    async fn restore_inner(
        &self,
        spec: &RestoreSpec,
        created: &mut Vec<PathBuf>,
    ) -> Result<QemuVm> {
        let t0 = Instant::now();
        let manifest = Manifest::read(&spec.snapshot.join(cmdline::MANIFEST_FILE))?;
        manifest.check_host(&self.version, self.accel)?;
        validate_shape(manifest.vcpus, manifest.memory_mib)?;
        let mem = spec.dir.join(cmdline::MEM_FILE);
        let disk = spec.dir.join(cmdline::DISK_FILE);
        let (snap_mem, snap_disk) = if spec.files_in_place {
            (mem.clone(), disk.clone())
        } else {
            (
                spec.snapshot.join(cmdline::MEM_FILE),
                spec.snapshot.join(cmdline::DISK_FILE),
            )
        };
        let snap_state = spec.snapshot.join(cmdline::STATE_FILE);
        check_size(&snap_mem, manifest.memory_bytes())?;
        check_size(&snap_state, manifest.state_bytes)?;
        if spec.files_in_place && !snap_disk.is_file() {
            return Err(Error::Invalid(format!(
                "{} is missing",
                snap_disk.display()
            )));
        }
        let kernel_path = spec
            .kernel
            .clone()
            .unwrap_or_else(|| manifest.kernel.path.clone());
        let kernel = self.kernel_info(&kernel_path).await?;
        if kernel.size != manifest.kernel.size || kernel.sha256 != manifest.kernel.sha256 {
            return Err(manifest::ManifestError::Kernel {
                path: kernel.path,
                size: manifest.kernel.size,
                sha256: manifest.kernel.sha256.clone(),
            }
            .into());
        }
        require_dir(&spec.dir)?;
        let state = File::open(&snap_state).map_err(|source| Error::Io {
            op: "opening",
            path: snap_state.clone(),
            source,
        })?;

        let (mem_clone, disk_clone) = if spec.files_in_place {
            // The caller's files: they count as made by this restore, so a failure removes
            // them like clones.
            created.push(mem.clone());
            created.push(disk.clone());
            (CloneMethod::InPlace, CloneMethod::InPlace)
        } else {
            for p in [&mem, &disk] {
                if p.exists() {
                    return Err(Error::Invalid(format!("{} already exists", p.display())));
                }
            }
            let (m, d) = (mem.clone(), disk.clone());
            let clones = tokio::join!(
                blocking(move || cow::clone_file(&snap_mem, &m)),
                blocking(move || cow::clone_file(&snap_disk, &d)),
            );
            // Record what exists before reporting a failure of either clone.
            if clones.0.is_ok() {
                created.push(mem);
            }
            if clones.1.is_ok() {
                created.push(disk);
            }
            (clones.0?, clones.1?)
        };
        let cloned = t0.elapsed();

        let config = QemuConfig {
            accel: self.accel,
            vcpus: manifest.vcpus,
            memory_mib: manifest.memory_mib,
            kernel: kernel.path.clone(),
            kernel_cmdline: manifest.kernel_cmdline.clone(),
            incoming: true,
        };
        let vm = self.start(&spec.dir, config, kernel).await?;
        let started = t0.elapsed();
        let qmp = vm.qmp();
        vm.command(qmp.getfd(RESTORE_FD, state.as_fd())).await?;
        drop(state);
        let events = qmp.subscribe();
        let uri = json!({ "uri": format!("fd:{RESTORE_FD}") });
        vm.command(qmp.execute("migrate-incoming", Some(uri)))
            .await?;
        vm.wait_migration(events).await?;
        let loaded = t0.elapsed();
        if !spec.paused {
            vm.cont().await?;
        }
        tracing::debug!(
            ?mem_clone, ?disk_clone, ?cloned, ?started, ?loaded, total = ?t0.elapsed(),
            "restored {}", spec.dir.display()
        );
        Ok(vm)
    }
}

impl Runtime for QemuRuntime {
    type Vm = QemuVm;

    async fn boot(&self, spec: BootSpec) -> Result<QemuVm> {
        let mut created = Vec::new();
        let result = self.boot_inner(&spec, &mut created).await;
        if result.is_err() {
            remove_all(&created);
        }
        result
    }

    async fn restore(&self, spec: RestoreSpec) -> Result<QemuVm> {
        let mut created = Vec::new();
        let result = self.restore_inner(&spec, &mut created).await;
        if result.is_err() {
            remove_all(&created);
        }
        result
    }
}

/// One QEMU process and its QMP session. Dropping it kills and reaps the process; the sandbox
/// directory and its files stay.
pub struct QemuVm {
    dir: PathBuf,
    /// The machine's shape, recorded in snapshots.
    config: QemuConfig,
    kernel: KernelInfo,
    /// Set once connected; every method after construction can rely on it.
    qmp: Option<Qmp>,
    process: Process,
    /// The VMM's uid, gid and cgroup, when it is jailed.
    jail: Option<JailRecord>,
    /// What to release once the VMM is gone (taken by whoever sees the exit first; dropped
    /// unrun when the VM is detached).
    cleanup: Arc<tokio::sync::Mutex<Option<Cleanup>>>,
    /// Runs the cleanup when the VMM exits on its own; aborted on drop and detach.
    reaper: JoinHandle<()>,
    /// Serializes pause/resume/snapshot so they never interleave their QMP steps.
    ops: tokio::sync::Mutex<()>,
    /// Keeps the log files under their cap; aborted on drop.
    housekeeping: JoinHandle<()>,
    /// Device state of the last snapshot, kept while the VM has not run since. QEMU refuses to
    /// migrate out of `postmigrate` again ("paused due to previous migration"); as nothing ran
    /// in between, the same bytes are the state of the next snapshot.
    last_state: Mutex<Option<Arc<Vec<u8>>>>,
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
    fn new(
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
    async fn race_exit<T, E: Into<Error>>(
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
    async fn command<T>(&self, fut: impl Future<Output = Result<T, QmpError>>) -> Result<T> {
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
    async fn cont(&self) -> Result<()> {
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
    async fn wait_migration(&self, mut events: broadcast::Receiver<Event>) -> Result<()> {
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

    async fn snapshot_inner(&self, dest: &Path) -> Result<SnapshotInfo> {
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
        let saved = self.save_stopped(dest, reuse).await;
        if was_running || saved.is_err() {
            *self.last_state.lock().unwrap_or_else(|e| e.into_inner()) = None;
        }
        let paused_for = stopped_at.elapsed();
        if was_running {
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
    /// from the previous snapshot when the VM has not run since), then RAM and disk.
    async fn save_stopped(
        &self,
        dest: &Path,
        reuse: Option<Arc<Vec<u8>>>,
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
            self.wait_migration(events).await?;
            let len = std::fs::metadata(&state_path).map_err(io("reading"))?.len();
            let cached = if len <= MAX_CACHED_STATE {
                std::fs::read(&state_path).ok().map(Arc::new)
            } else {
                None
            };
            *self.last_state.lock().unwrap_or_else(|e| e.into_inner()) = cached;
        }

        let (src_mem, dst_mem) = (
            self.dir.join(cmdline::MEM_FILE),
            dest.join(cmdline::MEM_FILE),
        );
        let (src_disk, dst_disk) = (
            self.dir.join(cmdline::DISK_FILE),
            dest.join(cmdline::DISK_FILE),
        );
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
        let result = self.snapshot_inner(dest).await;
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

    async fn connect_ctl(&self) -> Result<UnixStream> {
        self.check_alive()?;
        connect_in_dir(&self.dir, cmdline::CTL_SOCKET).await
    }

    async fn connect_egress(&self) -> Result<UnixStream> {
        self.check_alive()?;
        connect_in_dir(&self.dir, cmdline::EGRESS_SOCKET).await
    }

    fn console_tail(&self, max: usize) -> String {
        console::tail(&self.dir.join(cmdline::CONSOLE_LOG), max)
    }
}

/// What a VM holds on the host besides its process: its cgroup, and its uid when uids are
/// leased per VM.
struct Cleanup {
    cgroup: Option<Cgroup>,
    leased_uid: Option<u32>,
}

impl Cleanup {
    fn for_jail(config: Option<&JailConfig>, record: Option<&JailRecord>) -> Cleanup {
        let leased = matches!(config.map(|c| &c.user), Some(JailUser::Range { .. }));
        Cleanup {
            cgroup: record.and_then(|r| r.cgroup.clone()),
            leased_uid: record.filter(|_| leased).map(|r| r.uid),
        }
    }

    /// Releases everything; call only once the VMM is gone. Blocks up to
    /// [`CGROUP_REMOVE_PATIENCE`].
    fn run(self) {
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

/// What the runtime records about a VMM it started (`qemu.json`), to recognise it later.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct VmRecord {
    pid: u32,
    /// Start time in clock ticks after boot (`/proc/<pid>/stat` field 22): with the pid, it
    /// identifies one process for the life of the host.
    start_ticks: u64,
    /// The QEMU binary (absolute).
    qemu: PathBuf,
    /// The machine (its command line is rebuilt from this and compared).
    config: QemuConfig,
    /// The kernel as snapshots must record it.
    kernel: KernelInfo,
    /// The jail, if any.
    jail: Option<JailRecord>,
}

/// Largest `qemu.json` accepted.
const MAX_RECORD_BYTES: u64 = 64 << 10;

impl VmRecord {
    /// Writes `qemu.json`, then `qemu.pid`, each atomically (unique temporary file, rename).
    /// Owned by root with mode 0600: a jailed VMM can neither read nor, thanks to the sticky
    /// directory, replace them.
    fn write(&self, dir: &Path) -> Result<()> {
        let json = serde_json::to_vec_pretty(self).expect("record serializes");
        write_atomic(&dir.join(cmdline::RECORD_FILE), &json)?;
        write_atomic(
            &dir.join(cmdline::PID_FILE),
            format!("{}\n", self.pid).as_bytes(),
        )
    }

    fn read(dir: &Path) -> std::result::Result<VmRecord, String> {
        let path = dir.join(cmdline::RECORD_FILE);
        let f = File::open(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
        use std::io::Read;
        let mut bytes = Vec::new();
        f.take(MAX_RECORD_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| format!("reading {}: {e}", path.display()))?;
        if bytes.len() as u64 > MAX_RECORD_BYTES {
            return Err(format!("{} is too large", path.display()));
        }
        serde_json::from_slice(&bytes).map_err(|e| format!("parsing {}: {e}", path.display()))
    }
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    let tmp = path.with_file_name(format!(
        ".{}.{}.tmp",
        name.unwrap_or_default(),
        rand_suffix()
    ));
    let io = |op, p: &Path| {
        let p = p.to_owned();
        move |source| Error::Io {
            op,
            path: p,
            source,
        }
    };
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io("creating", &tmp))?;
    let written = f.write_all(bytes).map_err(io("writing", &tmp));
    drop(f);
    let renamed = written.and_then(|()| std::fs::rename(&tmp, path).map_err(io("renaming", &tmp)));
    if renamed.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    renamed
}

fn rand_suffix() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{}-{nanos}", std::process::id())
}

/// Field 22 of `/proc/<pid>/stat`, and the state (field 3).
fn proc_stat(pid: u32) -> Option<(char, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may contain anything.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    let start = fields.get(19)?.parse().ok()?;
    Some((state, start))
}

fn proc_start_ticks(pid: u32) -> Option<u64> {
    proc_stat(pid).map(|(_, t)| t)
}

/// Checks that `pid` is the VMM `record` describes, running for `dir`.
fn verify_process(pid: u32, record: &VmRecord, dir: &Path) -> std::result::Result<(), String> {
    let (state, start) = proc_stat(pid).ok_or_else(|| format!("process {pid} is gone"))?;
    if matches!(state, 'Z' | 'X') {
        return Err(format!("process {pid} has exited"));
    }
    if start != record.start_ticks {
        return Err(format!(
            "pid {pid} now belongs to another process (started at tick {start}, \
             the VMM at {})",
            record.start_ticks
        ));
    }
    let same = |a: &Path, b: &Path| match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    };
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    if !same(&proc_dir.join("exe"), &record.qemu) {
        return Err(format!(
            "process {pid} does not run {}",
            record.qemu.display()
        ));
    }
    let place = if record.jail.is_some() { "root" } else { "cwd" };
    if !same(&proc_dir.join(place), dir) {
        return Err(format!(
            "process {pid} runs elsewhere (its {place} is not {})",
            dir.display()
        ));
    }
    let cmdline = std::fs::read(proc_dir.join("cmdline"))
        .map_err(|e| format!("reading the command line of {pid}: {e}"))?;
    let mut expected: Vec<u8> = Vec::new();
    for arg in
        std::iter::once(record.qemu.clone().into_os_string()).chain(cmdline::build(&record.config))
    {
        use std::os::unix::ffi::OsStrExt;
        expected.extend_from_slice(arg.as_bytes());
        expected.push(0);
    }
    if cmdline != expected {
        return Err(format!(
            "process {pid} has another command line than the one recorded"
        ));
    }
    Ok(())
}

/// The absolute path of `binary`: as is if it names a path, else found in `PATH`.
fn resolve_binary(binary: &Path) -> Result<PathBuf> {
    let io = |source| Error::Io {
        op: "finding",
        path: binary.to_owned(),
        source,
    };
    if binary.as_os_str().as_encoded_bytes().contains(&b'/') {
        return std::path::absolute(binary).map_err(io);
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    for d in std::env::split_paths(&path) {
        let candidate = d.join(binary);
        if std::fs::metadata(&candidate).is_ok_and(|m| m.is_file() && m.mode() & 0o111 != 0) {
            return std::path::absolute(&candidate).map_err(io);
        }
    }
    Err(io(std::io::ErrorKind::NotFound.into()))
}

/// Connects to QEMU's QMP socket, retrying while QEMU creates it.
async fn connect_qmp(dir: &Path, timeout: Duration) -> Result<Qmp> {
    let deadline = Instant::now() + timeout;
    let mut last = None;
    while Instant::now() < deadline {
        match connect_in_dir(dir, cmdline::QMP_SOCKET).await {
            Ok(stream) => {
                let remaining = deadline.saturating_duration_since(Instant::now());
                return match tokio::time::timeout(remaining, Qmp::connect(stream)).await {
                    Ok(r) => r.map_err(Error::from),
                    Err(_) => Err(Error::Timeout("waiting for the QMP greeting".into())),
                };
            }
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Err(Error::Timeout(format!(
        "after {timeout:?} waiting for QEMU's QMP socket in {} ({})",
        dir.display(),
        last.map(|e| e.to_string()).unwrap_or_default()
    )))
}

/// Connects to the Unix socket `name` in `dir`. Paths too long for `sockaddr_un` go through
/// `/proc/self/fd/<dirfd>/name`, which resolves to the same socket.
pub async fn connect_in_dir(dir: &Path, name: &str) -> Result<UnixStream> {
    let path = dir.join(name);
    let io = |source| Error::Io {
        op: "connecting to",
        path: path.clone(),
        source,
    };
    if path.as_os_str().len() < 100 {
        return UnixStream::connect(&path).await.map_err(io);
    }
    let dir_fd = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
        .open(dir)
        .map_err(io)?;
    use std::os::fd::AsRawFd;
    let short = format!("/proc/self/fd/{}/{name}", dir_fd.as_raw_fd());
    let result = UnixStream::connect(&short).await.map_err(io);
    drop(dir_fd);
    result
}

/// Keeps the log files of one sandbox under their cap.
async fn housekeeping(dir: PathBuf) {
    let logs = [dir.join(cmdline::CONSOLE_LOG), dir.join(cmdline::QEMU_LOG)];
    let mut tick = tokio::time::interval(LOG_CHECK_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        for log in &logs {
            match console::rotate_if_large(log, console::LOG_CAP) {
                Ok(true) => tracing::debug!(log = %log.display(), "log rotated"),
                Ok(false) => {}
                Err(e) => tracing::debug!(log = %log.display(), "log rotation failed: {e}"),
            }
        }
    }
}

/// Runs blocking file work off the async threads.
async fn blocking<T: Send + 'static, E: Into<Error> + Send + 'static>(
    f: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .expect("blocking file task panicked")
        .map_err(Into::into)
}

fn validate_shape(vcpus: u32, memory_mib: u64) -> Result<()> {
    if vcpus == 0 || vcpus > MAX_VCPUS {
        return Err(Error::Invalid(format!(
            "vcpus must be 1..={MAX_VCPUS}, not {vcpus}"
        )));
    }
    if !(16..=MAX_MEMORY_MIB).contains(&memory_mib) {
        return Err(Error::Invalid(format!(
            "memory must be 16..={MAX_MEMORY_MIB} MiB, not {memory_mib}"
        )));
    }
    Ok(())
}

fn require_dir(dir: &Path) -> Result<()> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(Error::Invalid(format!(
            "{} is not a directory",
            dir.display()
        ))),
        Err(source) => Err(Error::Io {
            op: "opening sandbox directory",
            path: dir.to_owned(),
            source,
        }),
    }
}

fn check_size(path: &Path, expected: u64) -> Result<()> {
    let found = std::fs::metadata(path)
        .map_err(|source| Error::Io {
            op: "reading snapshot file",
            path: path.to_owned(),
            source,
        })?
        .len();
    if found != expected {
        return Err(manifest::ManifestError::Size {
            path: path.to_owned(),
            found,
            expected,
        }
        .into());
    }
    Ok(())
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

fn remove_if_exists(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(Error::Io {
            op: "removing stale",
            path: path.to_owned(),
            source,
        }),
    }
}

fn remove_all(paths: &[PathBuf]) {
    for p in paths {
        let _ = std::fs::remove_file(p);
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Parses `qemu-system-x86_64 --version`:
/// `QEMU emulator version 7.2.22 (Debian 1:7.2+dfsg-7+deb12u18+b3)`.
fn parse_version_output(text: &str) -> Option<QemuVersion> {
    let line = text.lines().next()?;
    let rest = line.split("version ").nth(1)?;
    let (number, package) = match rest.split_once(' ') {
        Some((n, p)) => (n, p.trim()),
        None => (rest.trim(), ""),
    };
    let mut parts = number.split('.').map(|p| p.parse::<u32>());
    let major = parts.next()?.ok()?;
    let minor = parts.next()?.ok()?;
    let micro = match parts.next() {
        Some(p) => p.ok()?,
        None => 0,
    };
    let package = package
        .strip_prefix('(')
        .and_then(|p| p.strip_suffix(')'))
        .unwrap_or("")
        .trim();
    Some(QemuVersion {
        major,
        minor,
        micro,
        package: package.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_qemu_version_lines() {
        let v = parse_version_output(
            "QEMU emulator version 7.2.22 (Debian 1:7.2+dfsg-7+deb12u18+b3)\nCopyright (c) 2003-2022\n",
        )
        .unwrap();
        assert_eq!((v.major, v.minor, v.micro), (7, 2, 22));
        assert_eq!(v.package, "Debian 1:7.2+dfsg-7+deb12u18+b3");
        let v = parse_version_output("QEMU emulator version 8.0.0\n").unwrap();
        assert_eq!(
            (v.major, v.minor, v.micro, v.package.as_str()),
            (8, 0, 0, "")
        );
        assert!(parse_version_output("something else").is_none());
        assert!(parse_version_output("").is_none());
    }

    #[test]
    fn shapes_are_bounded() {
        assert!(validate_shape(1, 256).is_ok());
        assert!(validate_shape(0, 256).is_err());
        assert!(validate_shape(65, 256).is_err());
        assert!(validate_shape(1, 8).is_err());
        assert!(validate_shape(1, u64::MAX).is_err());
    }

    #[tokio::test]
    async fn long_socket_paths_connect_through_proc() {
        let base = tempfile::tempdir().unwrap();
        let deep = base.path().join("d".repeat(60)).join("e".repeat(60));
        std::fs::create_dir_all(&deep).unwrap();
        assert!(deep.join("x.sock").as_os_str().len() > 108);
        // Bind through the same /proc indirection the client uses.
        let dir_fd = File::open(&deep).unwrap();
        use std::os::fd::AsRawFd;
        let listener =
            tokio::net::UnixListener::bind(format!("/proc/self/fd/{}/x.sock", dir_fd.as_raw_fd()))
                .unwrap();
        let (accepted, connected) =
            tokio::join!(listener.accept(), connect_in_dir(&deep, "x.sock"));
        accepted.unwrap();
        connected.unwrap();
        assert!(connect_in_dir(&deep, "missing.sock").await.is_err());
    }

    #[tokio::test]
    async fn boot_refuses_bad_specs_without_leaving_files() {
        let rt = QemuRuntime::new(QemuRuntimeConfig {
            accel: Some(Accel::Tcg),
            ..Default::default()
        })
        .await
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let spec = BootSpec {
            dir: dir.path().to_owned(),
            kernel: dir.path().join("no-kernel"),
            rootfs: dir.path().join("no-rootfs"),
            vcpus: 1,
            memory_mib: 128,
            kernel_cmdline: None,
        };
        let err = rt.boot(spec.clone()).await.unwrap_err();
        assert!(err.to_string().contains("no-kernel"), "{err}");

        std::fs::write(dir.path().join("kernel"), b"not really a kernel").unwrap();
        let spec = BootSpec {
            kernel: dir.path().join("kernel"),
            ..spec
        };
        let err = rt.boot(spec.clone()).await.unwrap_err();
        assert!(matches!(err, Error::Cow(_)), "{err}");
        assert!(!dir.path().join(cmdline::MEM_FILE).exists());

        let err = rt.boot(BootSpec { vcpus: 0, ..spec }).await.unwrap_err();
        assert!(matches!(err, Error::Invalid(_)), "{err}");
    }

    #[tokio::test]
    async fn qemu_failing_at_start_reports_its_stderr() {
        let rt = QemuRuntime::new(QemuRuntimeConfig {
            accel: Some(Accel::Tcg),
            ..Default::default()
        })
        .await
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("kernel"), b"not an ELF kernel").unwrap();
        std::fs::write(dir.path().join("disk"), vec![0u8; 1 << 20]).unwrap();
        let spec = BootSpec {
            dir: dir.path().to_owned(),
            kernel: dir.path().join("kernel"),
            rootfs: dir.path().join("disk"),
            vcpus: 1,
            memory_mib: 64,
            kernel_cmdline: None,
        };
        let err = rt.boot(spec).await.unwrap_err();
        match &err {
            Error::Exited { exit, vmm_log, .. } => {
                assert_eq!(exit.code, Some(1), "{err}");
                assert!(vmm_log.contains("kernel"), "{err}");
            }
            other => panic!("expected Exited, got {other}"),
        }
        // Files the runtime created for the failed boot are gone.
        assert!(!dir.path().join(cmdline::MEM_FILE).exists());
        assert!(!dir.path().join(cmdline::DISK_FILE).exists());
    }
}
