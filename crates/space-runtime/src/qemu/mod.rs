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
//!   read-only with `getfd`), `cont` unless asked to stay paused. With a splice, the streams
//!   it holds connect to the new QEMU's sockets before the state loads ([`crate::splice`]).
//! - Save state: a snapshot's first half only (device state, files synced, nothing cloned),
//!   the VM left stopped: the old half of moving a guest to a new QEMU on the same files.
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
use crate::{BootSpec, Error, Priority, RestoreSpec, Result, Runtime, SnapshotInfo, Vm};

mod record;
#[cfg(test)]
mod tests;
mod vm;

use record::*;
pub(crate) use record::{proc_start_ticks, proc_stat};
use vm::Cleanup;
pub use vm::QemuVm;

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

    /// Sets the CPU priority of the VMM this runtime started in `dir` while its handle does not
    /// exist yet (a restore still under way), from the record written right after the spawn.
    /// `Ok(false)` when no VMM of ours runs there (yet).
    pub fn set_priority_in(&self, dir: &Path, priority: Priority) -> Result<bool> {
        let Ok(record) = VmRecord::read(dir) else {
            return Ok(false);
        };
        if proc_start_ticks(record.pid) != Some(record.start_ticks) {
            return Ok(false);
        }
        let cgroup = record.jail.as_ref().and_then(|j| j.cgroup.as_ref());
        crate::priority::apply(record.pid, cgroup, priority).map_err(|source| Error::Io {
            op: "setting the CPU priority of QEMU in",
            path: dir.to_owned(),
            source,
        })?;
        Ok(true)
    }

    /// Removes the cgroups of VMs that are gone (empty ones under the jail's cgroup parent)
    /// and returns them. A node calls it at start, after adopting its VMs and before it
    /// starts new ones, with `own`, the directory its sandbox directories are in: the
    /// cgroups of those are removed at any age (nothing of the node's is being set up then),
    /// others only once they are old enough not to be another node's VM starting.
    pub fn sweep_cgroups(&self, own: &Path) -> Result<Vec<PathBuf>> {
        let (Some(jc), Some(layout)) = (&self.jail, &self.cgroups) else {
            return Ok(Vec::new());
        };
        let own = std::path::absolute(own).map_err(|source| Error::Io {
            op: "resolving",
            path: own.to_owned(),
            source,
        })?;
        let is_own = |name: &str| {
            name.rsplit_once('-')
                .is_some_and(|(leaf, _)| jail::cgroup_name(&own.join(leaf)) == name)
        };
        Ok(cgroup::sweep(layout, &jc.cgroup_parent, &is_own).map_err(jail::JailError::from)?)
    }

    /// Removes the cgroup of the VMs of sandbox directory `dir` when no process is left in
    /// it: for a directory whose VMM is gone without a handle that cleaned up after it
    /// (killed by a node that died before removing its cgroup, or a node that died between
    /// making the cgroup and starting QEMU in it). The sweep at start leaves such a cgroup
    /// while it is young, as it may be one being set up. Returns the directories removed
    /// (one the kernel does not let go of within a moment is left for the next sweep).
    pub async fn release_gone(&self, dir: &Path) -> Vec<PathBuf> {
        let (Some(jc), Some(layout)) = (&self.jail, &self.cgroups) else {
            return Vec::new();
        };
        let Ok(dir) = std::path::absolute(dir) else {
            return Vec::new();
        };
        let name = jail::cgroup_name(&dir);
        let Some(cgroup) = Cgroup::existing(layout, &jc.cgroup_parent, &name) else {
            return Vec::new();
        };
        if !cgroup.is_empty() {
            return Vec::new();
        }
        let dirs = cgroup.dirs.clone();
        let removed = tokio::task::spawn_blocking(move || cgroup.remove(CGROUP_REMOVE_PATIENCE))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string()));
        match removed {
            Ok(()) => dirs,
            Err(e) => {
                tracing::warn!(dir = %dir.display(), "leaving a gone VM's cgroup for the next sweep: {e}");
                Vec::new()
            }
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
        .map_err(|e| join_failed("hashing the kernel", e))?
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

    /// Starts QEMU for `config` in `dir` at `priority` and connects QMP. The machine is left
    /// paused.
    async fn start(
        &self,
        dir: &Path,
        mut config: QemuConfig,
        kernel: KernelInfo,
        priority: Priority,
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
        if priority != Priority::Normal {
            // Right after the spawn: QEMU has not started loading anything yet.
            vm.set_priority(priority)?;
        }
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
        let vm = self
            .start(&spec.dir, config, kernel, Priority::Normal)
            .await?;
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
        let mut vm = self.start(&spec.dir, config, kernel, spec.priority).await?;
        if let Some(splice) = &spec.splice {
            // Streams held across a change of VMM connect before the state loads, so the
            // guest finds its ports connected as they were when the state was saved.
            splice.switch().await?;
            vm.splice = Some(splice.clone());
        }
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

/// Runs blocking file work off the async threads. A panic in `f` is an error of the call,
/// not a panic carried on into the caller's task.
async fn blocking<T: Send + 'static, E: Into<Error> + Send + 'static>(
    f: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| join_failed("blocking file work", e))?
        .map_err(Into::into)
}

/// The error of blocking work that did not finish (it panicked, or the runtime is going).
fn join_failed(what: &str, e: tokio::task::JoinError) -> Error {
    let why = if e.is_panic() {
        let payload = e.into_panic();
        let text = payload
            .downcast_ref::<&'static str>()
            .map(|s| (*s).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "(no message)".to_owned());
        format!("it panicked: {text}")
    } else {
        "it was cancelled".to_owned()
    };
    tracing::error!(%why, "{what} failed");
    Error::Internal(format!("{what} failed: {why}"))
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
