//! A fake runtime for fast tests of what drives a runtime (the node's state machine,
//! recovery, pools): its "VM" is a real `space-guestd` process serving `ctl.sock` in the
//! sandbox directory, on the host, with no VMM around it.
//!
//! What is real: the guest daemon and its protocol (health, identity, exec, files), the
//! process (a pid, signals, an exit), the files the runtime contract names ([`crate::cmdline`]:
//! `mem`, `rootfs.ext4`, `console.log`, `ctl.sock`, snapshot manifests), and adoption by a
//! later runtime through a record in the directory. What is simulated: pause and resume are
//! SIGSTOP and SIGCONT (a paused fake answers nothing, as a paused guest); a snapshot clones
//! `mem` and `rootfs.ext4` and writes a small device-state file and a real manifest; a restore
//! clones them back and starts a new daemon, so a process started in the guest before does
//! not survive it. The daemon works on the host's file system (it is not PID 1 and changes
//! neither clock nor hostname): tests give it paths under their own directories.
//!
//! [`FakeRuntime::fail_next`] makes the next operation of a kind fail, for the error paths.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::net::UnixStream;
use tokio::sync::watch;

use crate::manifest::{KernelInfo, Manifest, FORMAT_VERSION};
use crate::node::{BoxFuture, NodeRuntime, NodeVm};
use crate::qemu::connect_in_dir;
use crate::qmp::{QemuVersion, Status};
use crate::{
    cmdline, console, cow, Accel, BootSpec, CloneMethod, Error, ExitInfo, GuestClient, Priority,
    RestoreSpec, Result, Runtime, SnapshotInfo, Vm,
};

/// The record a fake VM keeps in its directory, for adoption.
const FAKE_RECORD: &str = "fake-vm.json";

/// Operations [`FakeRuntime::fail_next`] can make fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FakeOp {
    /// [`Runtime::boot`].
    Boot,
    /// [`Runtime::restore`].
    Restore,
    /// [`Vm::snapshot`].
    Snapshot,
    /// [`Vm::pause`].
    Pause,
    /// [`Vm::resume`].
    Resume,
}

/// Failures to inject, shared by the runtime and its VMs.
#[derive(Debug, Default)]
struct Faults(Mutex<HashMap<FakeOp, u32>>);

impl Faults {
    fn check(&self, op: FakeOp) -> Result<()> {
        let mut f = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match f.get_mut(&op) {
            Some(n) if *n > 0 => {
                *n -= 1;
                Err(Error::Internal(format!(
                    "{op:?} failed (injected by the fake runtime)"
                )))
            }
            _ => Ok(()),
        }
    }
}

/// A runtime whose VMs are `space-guestd` processes (see the module docs).
#[derive(Debug)]
pub struct FakeRuntime {
    guestd: PathBuf,
    version: QemuVersion,
    faults: Arc<Faults>,
}

impl FakeRuntime {
    /// A runtime starting the `space-guestd` binary at `guestd`.
    pub fn new(guestd: impl Into<PathBuf>) -> FakeRuntime {
        FakeRuntime {
            guestd: guestd.into(),
            version: QemuVersion {
                major: 0,
                minor: 0,
                micro: 0,
                package: "space fake runtime".into(),
            },
            faults: Arc::default(),
        }
    }

    /// Makes the next `times` operations `op` (of this runtime or any of its VMs) fail with
    /// [`Error::Internal`], before they change anything.
    pub fn fail_next(&self, op: FakeOp, times: u32) {
        *self
            .faults
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(op)
            .or_default() += times;
    }

    /// Disarms failures of `op` still to come; returns how many there were.
    pub fn clear(&self, op: FakeOp) -> u32 {
        self.faults
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&op)
            .unwrap_or(0)
    }

    fn start(&self, dir: &Path, shape: Shape, paused: bool) -> Result<FakeVm> {
        let io = |op: &'static str, path: &Path| {
            let path = path.to_owned();
            move |source| Error::Io { op, path, source }
        };
        let sock = dir.join(cmdline::CTL_SOCKET);
        match std::fs::remove_file(&sock) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io("removing", &sock)(e)),
        }
        let log_path = dir.join(cmdline::CONSOLE_LOG);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(io("opening", &log_path))?;
        let err = log.try_clone().map_err(io("opening", &log_path))?;
        let mut child = Command::new(&self.guestd)
            .arg("--listen")
            .arg(&sock)
            .current_dir(dir)
            .env("SPACE_GUESTD_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .map_err(io("starting", &self.guestd))?;
        let pid = child.id();
        if paused {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGSTOP);
        }
        let record = FakeRecord {
            pid,
            start_ticks: crate::qemu::proc_start_ticks(pid).unwrap_or(0),
            shape,
        };
        let bytes = serde_json::to_vec(&record).expect("a record serializes");
        if let Err(e) = std::fs::write(dir.join(FAKE_RECORD), bytes) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(io("writing", &dir.join(FAKE_RECORD))(e));
        }
        let (tx, rx) = watch::channel(None);
        std::thread::spawn(move || {
            let exit = match child.wait() {
                Ok(s) => {
                    use std::os::unix::process::ExitStatusExt as _;
                    ExitInfo {
                        code: s.code(),
                        signal: s.signal(),
                    }
                }
                Err(_) => ExitInfo::UNKNOWN,
            };
            let _ = tx.send(Some(exit));
        });
        Ok(self.vm(dir, record, rx))
    }

    fn vm(
        &self,
        dir: &Path,
        record: FakeRecord,
        exit: watch::Receiver<Option<ExitInfo>>,
    ) -> FakeVm {
        FakeVm {
            dir: dir.to_owned(),
            record,
            exit,
            detached: false.into(),
            priority: Mutex::new(Priority::Normal),
            faults: self.faults.clone(),
            version: self.version.clone(),
            backing: Mutex::new(None),
        }
    }

    /// A process that is not our child: its exit is noticed by polling `/proc`.
    fn watch_foreign(pid: u32, start_ticks: u64) -> watch::Receiver<Option<ExitInfo>> {
        let (tx, rx) = watch::channel(None);
        tokio::spawn(async move {
            loop {
                match crate::qemu::proc_stat(pid) {
                    Some((state, t)) if t == start_ticks && !matches!(state, 'Z' | 'X') => {}
                    _ => break,
                }
                if tx.is_closed() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let _ = tx.send(Some(ExitInfo::UNKNOWN));
        });
        rx
    }
}

/// The machine a fake VM pretends to be.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Shape {
    vcpus: u32,
    memory_mib: u64,
    kernel: KernelInfo,
    kernel_cmdline: String,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct FakeRecord {
    pid: u32,
    start_ticks: u64,
    shape: Shape,
}

fn kernel_info(path: &Path) -> Result<KernelInfo> {
    use sha2::Digest as _;
    let bytes = std::fs::read(path).map_err(|source| Error::Io {
        op: "reading",
        path: path.to_owned(),
        source,
    })?;
    let sha256 = sha2::Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    Ok(KernelInfo {
        path: path.to_owned(),
        size: bytes.len() as u64,
        sha256,
    })
}

fn clone_into(src: &Path, dst: &Path) -> Result<CloneMethod> {
    if src == dst {
        return Ok(CloneMethod::InPlace);
    }
    let _ = std::fs::remove_file(dst);
    Ok(cow::clone_file(src, dst)?)
}

impl Runtime for FakeRuntime {
    type Vm = FakeVm;

    async fn boot(&self, spec: BootSpec) -> Result<FakeVm> {
        self.faults.check(FakeOp::Boot)?;
        if spec.vcpus == 0 || spec.memory_mib == 0 {
            return Err(Error::Invalid("a VM needs a vCPU and memory".into()));
        }
        let kernel = kernel_info(&spec.kernel)?;
        clone_into(&spec.rootfs, &spec.dir.join(cmdline::DISK_FILE))?;
        let mem = spec.dir.join(cmdline::MEM_FILE);
        std::fs::File::create(&mem)
            .and_then(|f| f.set_len(spec.memory_mib << 20))
            .map_err(|source| Error::Io {
                op: "creating",
                path: mem.clone(),
                source,
            })?;
        let shape = Shape {
            vcpus: spec.vcpus,
            memory_mib: spec.memory_mib,
            kernel,
            kernel_cmdline: spec
                .kernel_cmdline
                .unwrap_or_else(|| cmdline::DEFAULT_KERNEL_CMDLINE.into()),
        };
        self.start(&spec.dir, shape, false)
    }

    async fn restore(&self, spec: RestoreSpec) -> Result<FakeVm> {
        self.faults.check(FakeOp::Restore)?;
        let m = Manifest::read(&spec.snapshot.join(cmdline::MANIFEST_FILE))?;
        m.check_host(&self.version, Accel::Tcg)?;
        if !spec.files_in_place {
            for f in [cmdline::MEM_FILE, cmdline::DISK_FILE] {
                clone_into(&spec.snapshot.join(f), &spec.dir.join(f))?;
            }
        }
        let mut kernel = m.kernel.clone();
        if let Some(k) = &spec.kernel {
            kernel = kernel_info(k)?;
        }
        let shape = Shape {
            vcpus: m.vcpus,
            memory_mib: m.memory_mib,
            kernel,
            kernel_cmdline: m.kernel_cmdline,
        };
        let vm = self.start(&spec.dir, shape, spec.paused)?;
        *vm.priority.lock().unwrap_or_else(|e| e.into_inner()) = spec.priority;
        Ok(vm)
    }
}

impl NodeRuntime for FakeRuntime {
    fn boot(&self, spec: BootSpec) -> BoxFuture<'_, Result<Box<dyn NodeVm>>> {
        Box::pin(async move { Ok(Box::new(Runtime::boot(self, spec).await?) as Box<dyn NodeVm>) })
    }

    fn restore(&self, spec: RestoreSpec) -> BoxFuture<'_, Result<Box<dyn NodeVm>>> {
        Box::pin(
            async move { Ok(Box::new(Runtime::restore(self, spec).await?) as Box<dyn NodeVm>) },
        )
    }

    fn adopt<'a>(&'a self, dir: &'a Path) -> BoxFuture<'a, Result<Box<dyn NodeVm>>> {
        Box::pin(async move {
            let not = |reason: String| Error::NotAdoptable {
                dir: dir.to_owned(),
                reason,
            };
            let bytes =
                std::fs::read(dir.join(FAKE_RECORD)).map_err(|e| not(format!("no record: {e}")))?;
            let record: FakeRecord =
                serde_json::from_slice(&bytes).map_err(|e| not(format!("bad record: {e}")))?;
            match crate::qemu::proc_stat(record.pid) {
                Some((state, t)) if t == record.start_ticks && !matches!(state, 'Z' | 'X') => {}
                _ => return Err(not(format!("process {} is gone", record.pid))),
            }
            let exit = FakeRuntime::watch_foreign(record.pid, record.start_ticks);
            Ok(Box::new(self.vm(dir, record, exit)) as Box<dyn NodeVm>)
        })
    }

    fn release_gone<'a>(&'a self, _dir: &'a Path) -> BoxFuture<'a, Vec<PathBuf>> {
        Box::pin(async { Vec::new() })
    }

    fn sweep_cgroups(&self, _own: &Path) -> Result<Vec<PathBuf>> {
        Ok(Vec::new())
    }

    fn set_priority_in(&self, dir: &Path, _priority: Priority) -> Result<bool> {
        Ok(dir.join(FAKE_RECORD).is_file())
    }

    fn version(&self) -> &QemuVersion {
        &self.version
    }

    fn accel(&self) -> Accel {
        Accel::Tcg
    }
}

/// A fake VM: one `space-guestd` process. Dropping it kills the process unless detached.
#[derive(Debug)]
pub struct FakeVm {
    dir: PathBuf,
    record: FakeRecord,
    exit: watch::Receiver<Option<ExitInfo>>,
    detached: std::sync::atomic::AtomicBool,
    priority: Mutex<Priority>,
    faults: Arc<Faults>,
    version: QemuVersion,
    /// Where snapshots clone from ([`Vm::set_backing`]).
    backing: Mutex<Option<crate::Backing>>,
}

impl FakeVm {
    fn signal(&self, sig: Signal) -> Result<()> {
        Vm::check_alive(self)?;
        kill(Pid::from_raw(self.record.pid as i32), sig).map_err(|e| Error::Io {
            op: "signalling the fake VM in",
            path: self.dir.clone(),
            source: e.into(),
        })
    }

    fn exited(&self) -> Option<ExitInfo> {
        *self.exit.borrow()
    }

    /// Stops the process and waits until the kernel says it is stopped: SIGSTOP is delivered
    /// later than `kill` returns, and a VM must not run on once `pause` has answered (QEMU's
    /// `stop` answers when the vCPUs are stopped).
    async fn stop(&self) -> Result<()> {
        self.signal(Signal::SIGSTOP)?;
        let until = Instant::now() + std::time::Duration::from_secs(2);
        while !self.paused() && self.exited().is_none() && Instant::now() < until {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        Ok(())
    }

    /// The priority last set ([`Vm::set_priority`] or the restore's).
    pub fn priority(&self) -> Priority {
        *self.priority.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn paused(&self) -> bool {
        matches!(
            crate::qemu::proc_stat(self.record.pid),
            Some(('T' | 't', _))
        )
    }
}

impl Drop for FakeVm {
    fn drop(&mut self) {
        if !self.detached.load(std::sync::atomic::Ordering::Relaxed) && self.exited().is_none() {
            let _ = kill(Pid::from_raw(self.record.pid as i32), Signal::SIGKILL);
        }
    }
}

impl Vm for FakeVm {
    fn dir(&self) -> &Path {
        &self.dir
    }

    async fn pause(&self) -> Result<()> {
        self.faults.check(FakeOp::Pause)?;
        self.stop().await
    }

    async fn resume(&self) -> Result<()> {
        self.faults.check(FakeOp::Resume)?;
        self.signal(Signal::SIGCONT)
    }

    async fn snapshot(&self, dest: &Path) -> Result<SnapshotInfo> {
        self.faults.check(FakeOp::Snapshot)?;
        Vm::check_alive(self)?;
        let io = |op: &'static str, path: &Path| {
            let path = path.to_owned();
            move |source| Error::Io { op, path, source }
        };
        std::fs::create_dir_all(dest).map_err(io("creating", dest))?;
        let was_running = !self.paused();
        let t0 = Instant::now();
        if was_running {
            self.stop().await?;
        }
        let backing = self
            .backing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let (src_mem, src_disk) = match backing {
            Some(b) => (b.mem, b.disk),
            None => (
                self.dir.join(cmdline::MEM_FILE),
                self.dir.join(cmdline::DISK_FILE),
            ),
        };
        let cloned = (|| {
            let mem = clone_into(&src_mem, &dest.join(cmdline::MEM_FILE))?;
            let disk = clone_into(&src_disk, &dest.join(cmdline::DISK_FILE))?;
            Ok::<_, Error>((mem, disk))
        })();
        let paused_for = if was_running {
            let _ = self.signal(Signal::SIGCONT);
            t0.elapsed()
        } else {
            Duration::ZERO
        };
        let (mem_clone, disk_clone) = cloned?;
        let state = format!("fake device state of pid {}\n", self.record.pid);
        let state_path = dest.join(cmdline::STATE_FILE);
        std::fs::write(&state_path, &state).map_err(io("writing", &state_path))?;
        let s = &self.record.shape;
        let manifest = Manifest {
            format: FORMAT_VERSION,
            qemu: self.version.clone(),
            accel: Accel::Tcg,
            vcpus: s.vcpus,
            memory_mib: s.memory_mib,
            kernel: s.kernel.clone(),
            kernel_cmdline: s.kernel_cmdline.clone(),
            state_bytes: state.len() as u64,
            created_unix_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
        };
        manifest.write(&dest.join(cmdline::MANIFEST_FILE))?;
        Ok(SnapshotInfo {
            dir: dest.to_owned(),
            state_bytes: state.len() as u64,
            mem_clone,
            disk_clone,
            paused_for,
            manifest,
        })
    }

    fn set_backing(&self, backing: Option<crate::Backing>) {
        *self.backing.lock().unwrap_or_else(|e| e.into_inner()) = backing;
    }

    async fn kill(&self) -> Result<ExitInfo> {
        if let Some(exit) = self.exited() {
            return Ok(exit);
        }
        let _ = kill(Pid::from_raw(self.record.pid as i32), Signal::SIGKILL);
        Ok(Vm::wait(self).await)
    }

    async fn wait(&self) -> ExitInfo {
        let mut rx = self.exit.clone();
        let exit = match rx.wait_for(Option::is_some).await {
            Ok(v) => v.unwrap_or(ExitInfo::UNKNOWN),
            Err(_) => ExitInfo::UNKNOWN,
        };
        exit
    }

    fn check_alive(&self) -> Result<()> {
        match self.exited() {
            None => Ok(()),
            Some(exit) => Err(Error::Exited {
                exit,
                console: Vm::console_tail(self, 2048),
                vmm_log: String::new(),
            }),
        }
    }

    fn set_priority(&self, priority: Priority) -> Result<()> {
        Vm::check_alive(self)?;
        *self.priority.lock().unwrap_or_else(|e| e.into_inner()) = priority;
        Ok(())
    }

    async fn connect_ctl(&self) -> Result<UnixStream> {
        Vm::check_alive(self)?;
        connect_in_dir(&self.dir, cmdline::CTL_SOCKET).await
    }

    async fn connect_egress(&self) -> Result<UnixStream> {
        Err(Error::Invalid("a fake VM has no egress port".into()))
    }

    fn console_tail(&self, max: usize) -> String {
        console::tail(&self.dir.join(cmdline::CONSOLE_LOG), max)
    }
}

impl NodeVm for FakeVm {
    fn dir(&self) -> &Path {
        &self.dir
    }
    fn pid(&self) -> u32 {
        self.record.pid
    }
    fn pause(&self) -> BoxFuture<'_, Result<()>> {
        Box::pin(Vm::pause(self))
    }
    fn resume(&self) -> BoxFuture<'_, Result<()>> {
        Box::pin(Vm::resume(self))
    }
    fn snapshot<'a>(&'a self, dest: &'a Path) -> BoxFuture<'a, Result<SnapshotInfo>> {
        Box::pin(Vm::snapshot(self, dest))
    }
    fn set_backing(&self, backing: Option<crate::Backing>) {
        Vm::set_backing(self, backing)
    }
    fn kill(&self) -> BoxFuture<'_, Result<ExitInfo>> {
        Box::pin(Vm::kill(self))
    }
    fn wait(&self) -> BoxFuture<'_, ExitInfo> {
        Box::pin(Vm::wait(self))
    }
    fn check_alive(&self) -> Result<()> {
        Vm::check_alive(self)
    }
    fn status(&self) -> BoxFuture<'_, Result<Status>> {
        Box::pin(async move {
            Vm::check_alive(self)?;
            let running = !self.paused();
            Ok(Status {
                running,
                status: if running { "running" } else { "paused" }.into(),
            })
        })
    }
    fn set_priority(&self, priority: Priority) -> Result<()> {
        Vm::set_priority(self, priority)
    }
    fn connect_ctl(&self) -> BoxFuture<'_, Result<UnixStream>> {
        Box::pin(Vm::connect_ctl(self))
    }
    fn console_tail(&self, max: usize) -> String {
        Vm::console_tail(self, max)
    }
    fn wait_ready(&self, timeout: Duration) -> BoxFuture<'_, Result<GuestClient>> {
        Box::pin(Vm::wait_ready(self, timeout))
    }
    fn disk_bytes(&self) -> BoxFuture<'_, Result<u64>> {
        Box::pin(async move {
            let disk = self.dir.join(cmdline::DISK_FILE);
            std::fs::metadata(&disk)
                .map(|m| m.len())
                .map_err(|source| Error::Io {
                    op: "reading the size of",
                    path: disk,
                    source,
                })
        })
    }
    fn resize_disk(&self, bytes: u64) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            let disk = self.dir.join(cmdline::DISK_FILE);
            std::fs::OpenOptions::new()
                .write(true)
                .open(&disk)
                .and_then(|f| f.set_len(bytes))
                .map_err(|source| Error::Io {
                    op: "growing",
                    path: disk,
                    source,
                })
        })
    }
    fn detach(self: Box<Self>) {
        self.detached
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }
    fn host_usage(&self) -> Option<crate::HostUsage> {
        // A fake VM has no process of its own: its use is none while it is alive.
        Vm::check_alive(self)
            .ok()
            .map(|()| crate::HostUsage::default())
    }
}
