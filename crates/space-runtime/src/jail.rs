//! The jail of a VMM process: an unprivileged user, its own mount, PID, IPC, UTS, network
//! and cgroup namespaces, the sandbox directory as its root, and a cgroup with limits.
//!
//! The runtime prepares everything on the host side ([`prepare`]): a uid, the cgroup, the
//! mount points and ownership in the sandbox directory, the kernel's place at `vmlinux` (a
//! mount point, or a clone), and a [`Prepared`] value holding every path as a C string and
//! every descriptor the child needs, so that the code between fork and exec only makes
//! system calls. In the child (see [`crate::process::Process::spawn_with`]):
//!
//! 1. join the cgroup (write `0` to each `cgroup.procs`), then `unshare` the namespaces and
//!    fork again, so QEMU is PID 1 of the new PID namespace;
//! 2. make every mount private; bind the sandbox directory onto itself with the mounts in it
//!    (a root must be a mount point; a lazy restore's files are mounts over their paths);
//!    bind the host paths QEMU needs to run (`/usr`; `/lib` and `/lib64` as links or binds,
//!    as on the host) read-only, and the kernel onto `vmlinux` when it is
//!    world-readable; mount a small tmpfs on `dev` with `null`, `urandom` and, under KVM,
//!    `kvm`;
//! 3. `pivot_root` into the sandbox directory and detach the old root, so no host path other
//!    than the read-only binds is reachable; remount the root `nosuid,nodev,noexec`;
//! 4. drop supplementary groups, switch gid and uid, set `no_new_privs`; exec QEMU, whose
//!    own `-sandbox` seccomp policy then applies.
//!
//! QEMU is dynamically linked: its libraries and modules (`accel-tcg-x86_64.so` on Debian)
//! are loaded from the bound `/usr` at exec and start, which is why the jail contains it.
//! Nothing else of the host file system is needed under `-nodefaults`: guest entropy comes
//! from `getrandom(2)` (QEMU's `rng-builtin`), and the migration stream of a snapshot or
//! restore is a descriptor passed over QMP (`getfd`). The sockets QEMU creates stay
//! reachable from the host at `<dir>/qmp.sock` and so on, because its root *is* that
//! directory.
//!
//! Ownership: the sandbox directory becomes `root:<vm gid>` with mode `1770` (the VM can
//! create its sockets and console log, and the sticky bit keeps it from replacing the
//! runtime's own files there, such as the pidfile); the VM's RAM file, disk and console log
//! become `<vm uid>:<vm gid>`. Snapshots and templates are never chowned: the runtime clones
//! their files into the sandbox directory first.

use std::collections::BTreeSet;
use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

use crate::accel::Accel;
use crate::cgroup::{Cgroup, CgroupError, Layout, Limits};
use crate::cmdline;

/// The namespaces a jailed VMM gets. The cgroup namespace is created after joining the VM's
/// cgroup, so QEMU sees that cgroup as its root.
pub const NAMESPACES: libc::c_int = libc::CLONE_NEWNS
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWCGROUP;

/// The tmpfs on `<dir>/dev` holds only device nodes.
const DEV_TMPFS_OPTIONS: &str = "size=16k,nr_inodes=16,mode=0755";

/// Which uid and gid jailed VMMs run as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JailUser {
    /// Every VM runs as the same user (e.g. `nobody`, 65534). Simple, but VMs are not
    /// isolated from each other on the host: a compromised QEMU can read and write the RAM
    /// and disk files of every other VM, and signal or ptrace them.
    Fixed {
        /// User id.
        uid: u32,
        /// Group id.
        gid: u32,
    },
    /// Every live VM gets its own uid (and the equal gid) from `first..first + count`, so a
    /// compromised QEMU reaches only its own files. The ids need no passwd entries; they must
    /// not be used by anything else on the host. Allocation is per node process; a restarted
    /// node claims the ids of the VMs it adopts before it starts new ones.
    Range {
        /// First id of the range.
        first: u32,
        /// Number of ids (the most VMs that can run at once).
        count: u32,
    },
}

/// Settings of the jail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JailConfig {
    /// The user VMMs run as.
    pub user: JailUser,
    /// Host paths visible (read-only) inside the jail, at the same place: what the QEMU
    /// binary, its dynamic loader, libraries and modules need. A path that is a symbolic link
    /// on the host (merged-`/usr` systems: `/lib -> usr/lib`) becomes the same link.
    pub host_paths: Vec<PathBuf>,
    /// Put each VM in its own cgroup with limits.
    pub cgroups: bool,
    /// Cgroup under which VM cgroups are created, relative to each hierarchy's root (under
    /// systemd, point it at a delegated subtree).
    pub cgroup_parent: PathBuf,
    /// Memory allowed on top of the guest RAM, for QEMU itself (TCG translation buffers,
    /// device state, I/O buffers).
    pub memory_overhead_mib: u64,
    /// Most tasks (threads) in a VM's cgroup.
    pub pids_max: u64,
    /// Cap CPU time at one CPU per vCPU.
    pub limit_cpu: bool,
}

impl Default for JailConfig {
    fn default() -> Self {
        JailConfig {
            user: JailUser::Range {
                first: 1_900_000_000,
                count: 65_536,
            },
            host_paths: ["/usr", "/lib", "/lib64"].map(PathBuf::from).to_vec(),
            cgroups: true,
            cgroup_parent: PathBuf::from("space"),
            memory_overhead_mib: 256,
            pids_max: 256,
            limit_cpu: true,
        }
    }
}

/// Errors preparing a jail.
#[derive(Debug, thiserror::Error)]
pub enum JailError {
    /// The jail needs root (mounts, `pivot_root`, `setuid`, cgroups).
    #[error("the jail needs root; run as root or turn the jail off")]
    NotRoot,
    /// Every uid of the configured range is in use.
    #[error("all {0} jail uids are in use")]
    NoFreeUid(u32),
    /// The QEMU binary would not be visible inside the jail.
    #[error("{0} is not under any of the jail's host paths")]
    BinaryOutside(PathBuf),
    /// A file operation on the sandbox directory failed.
    #[error("{op} {path}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// Setting up the cgroup failed.
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    /// Cloning the kernel into the sandbox directory failed.
    #[error(transparent)]
    Cow(#[from] crate::cow::CowError),
}

/// Whether this process runs as root (the jail's default depends on it).
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Uids of live jailed VMs of this process (for [`JailUser::Range`]).
fn uids_in_use() -> &'static Mutex<BTreeSet<u32>> {
    static IN_USE: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());
    &IN_USE
}

/// Picks the uid and gid of a new VM.
pub(crate) fn lease_ids(user: &JailUser) -> Result<(u32, u32), JailError> {
    match *user {
        JailUser::Fixed { uid, gid } => Ok((uid, gid)),
        JailUser::Range { first, count } => {
            let mut used = uids_in_use().lock().unwrap_or_else(|e| e.into_inner());
            let free = (0..count)
                .map(|i| first.saturating_add(i))
                .find(|id| !used.contains(id))
                .ok_or(JailError::NoFreeUid(count))?;
            used.insert(free);
            Ok((free, free))
        }
    }
}

/// Marks `uid` used (by an adopted VM).
pub(crate) fn claim_id(uid: u32) {
    uids_in_use()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(uid);
}

/// Returns `uid` to the range once its VM exited.
pub(crate) fn release_id(uid: u32) {
    uids_in_use()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&uid);
}

/// The cgroup name of a sandbox directory: its name (sanitized) plus a hash of its absolute
/// path, so equally named directories elsewhere (tests, two data roots) do not collide.
pub fn cgroup_name(dir: &Path) -> String {
    let leaf: String = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    let hash = Sha256::digest(dir.as_os_str().as_bytes());
    let short: String = hash[..4].iter().map(|b| format!("{b:02x}")).collect();
    format!("{leaf}-{short}")
}

/// What the jail of one VM consists of, as the runtime records it for adoption.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct JailRecord {
    /// The VMM's uid.
    pub uid: u32,
    /// The VMM's gid.
    pub gid: u32,
    /// Its cgroup, if cgroups are on.
    pub cgroup: Option<Cgroup>,
}

/// A device node to create in the jail's `/dev`.
struct DevNode {
    path: CString,
    mode: libc::mode_t,
    rdev: libc::dev_t,
    /// Owned by the VM user (else root).
    vm_owned: bool,
}

/// Everything the child needs to enter the jail, allocated before the fork.
pub struct Prepared {
    cgroup_procs: Vec<OwnedFd>,
    dir: CString,
    binds: Vec<(CString, CString)>,
    /// The host's kernel and its mount point `<dir>/vmlinux`, when it is bound in.
    kernel: Option<(CString, CString)>,
    dev: CString,
    dev_nodes: Vec<DevNode>,
    uid: libc::uid_t,
    gid: libc::gid_t,
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared")
            .field("dir", &self.dir)
            .field("uid", &self.uid)
            .field("gid", &self.gid)
            .finish()
    }
}

/// Steps of the jail setup, reported by number from the child.
const STEPS: &[&str] = &[
    "joining the cgroup",
    "making mounts private",
    "binding the sandbox directory",
    "binding host paths",
    "populating /dev",
    "pivot_root",
    "remounting the root",
    "dropping groups",
    "switching gid",
    "switching uid",
    "setting no_new_privs",
];

/// The name of step `n` (as written by the child).
pub(crate) fn step_name(n: u8) -> &'static str {
    STEPS
        .get(usize::from(n))
        .copied()
        .unwrap_or("an unknown step")
}

fn check(step: u8, rc: libc::c_long) -> Result<(), (u8, std::io::Error)> {
    if rc < 0 {
        Err((step, std::io::Error::last_os_error()))
    } else {
        Ok(())
    }
}

impl Prepared {
    /// Moves the calling process into the VM's cgroup. Runs between fork and exec: only
    /// `write(2)` on descriptors opened before the fork.
    pub(crate) fn enter_cgroups(&self) -> Result<(), (u8, std::io::Error)> {
        for fd in &self.cgroup_procs {
            // SAFETY: the descriptor is open (owned by `self`) and the buffer is a static
            // one-byte string.
            let rc = unsafe { libc::write(fd.as_raw_fd(), b"0".as_ptr().cast(), 1) };
            check(0, rc as libc::c_long)?;
        }
        Ok(())
    }

    /// Builds the jail around the calling process, which must be PID 1 of fresh namespaces,
    /// and drops to the VM user. Runs between fork and exec: only system calls on data
    /// allocated before the fork. Returns the failed step's number and the error.
    pub(crate) fn confine(&self) -> Result<(), (u8, std::io::Error)> {
        let null = std::ptr::null::<libc::c_char>();
        let root = c"/".as_ptr();
        let dot = c".".as_ptr();
        // SAFETY: every pointer passed below is either null where the call allows it or a
        // NUL-terminated string owned by `self` or static; the calls only read them.
        unsafe {
            let rc = libc::mount(
                null,
                root,
                null,
                libc::MS_REC | libc::MS_PRIVATE,
                null.cast(),
            );
            check(1, rc.into())?;
            let dir = self.dir.as_ptr();
            // With what is mounted in it: a lazy restore's files are mounts over their paths.
            check(
                2,
                libc::mount(dir, dir, null, libc::MS_BIND | libc::MS_REC, null.cast()).into(),
            )?;
            for (src, dst) in &self.binds {
                let rc = libc::mount(
                    src.as_ptr(),
                    dst.as_ptr(),
                    null,
                    libc::MS_BIND | libc::MS_REC,
                    null.cast(),
                );
                check(3, rc.into())?;
                let flags = libc::MS_BIND
                    | libc::MS_REMOUNT
                    | libc::MS_RDONLY
                    | libc::MS_NOSUID
                    | libc::MS_NODEV;
                check(
                    3,
                    libc::mount(null, dst.as_ptr(), null, flags, null.cast()).into(),
                )?;
            }
            if let Some((src, dst)) = &self.kernel {
                let rc = libc::mount(src.as_ptr(), dst.as_ptr(), null, libc::MS_BIND, null.cast());
                check(3, rc.into())?;
                let flags = libc::MS_BIND
                    | libc::MS_REMOUNT
                    | libc::MS_RDONLY
                    | libc::MS_NOSUID
                    | libc::MS_NODEV
                    | libc::MS_NOEXEC;
                check(
                    3,
                    libc::mount(null, dst.as_ptr(), null, flags, null.cast()).into(),
                )?;
            }
            let opts = c"size=16k,nr_inodes=16,mode=0755";
            debug_assert_eq!(opts.to_bytes(), DEV_TMPFS_OPTIONS.as_bytes());
            let rc = libc::mount(
                c"tmpfs".as_ptr(),
                self.dev.as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID | libc::MS_NOEXEC,
                opts.as_ptr().cast(),
            );
            check(4, rc.into())?;
            libc::umask(0);
            for node in &self.dev_nodes {
                let rc = libc::mknod(node.path.as_ptr(), libc::S_IFCHR | node.mode, node.rdev);
                check(4, rc.into())?;
                if node.vm_owned {
                    check(
                        4,
                        libc::chown(node.path.as_ptr(), self.uid, self.gid).into(),
                    )?;
                }
            }
            let flags = libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NOEXEC;
            let rc = libc::mount(null, self.dev.as_ptr(), null, flags, opts.as_ptr().cast());
            check(4, rc.into())?;

            check(5, libc::chdir(dir).into())?;
            check(5, libc::syscall(libc::SYS_pivot_root, dot, dot))?;
            // The old root now sits on top of the new one; detach it and everything under it.
            check(5, libc::umount2(dot, libc::MNT_DETACH).into())?;
            check(5, libc::chdir(root).into())?;
            let flags = libc::MS_BIND
                | libc::MS_REMOUNT
                | libc::MS_NOSUID
                | libc::MS_NODEV
                | libc::MS_NOEXEC;
            check(6, libc::mount(null, root, null, flags, null.cast()).into())?;
            // Files QEMU creates (console log, sockets) are its own.
            libc::umask(0o077);

            check(7, libc::setgroups(0, std::ptr::null()).into())?;
            check(8, libc::setresgid(self.gid, self.gid, self.gid).into())?;
            check(9, libc::setresuid(self.uid, self.uid, self.uid).into())?;
            check(
                10,
                libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0).into(),
            )?;
        }
        Ok(())
    }
}

/// The host side of one VM's jail.
pub(crate) struct Setup {
    pub prepared: Arc<Prepared>,
    pub record: JailRecord,
}

/// What [`prepare`] needs to know about the VM.
pub(crate) struct VmShape {
    pub accel: Accel,
    pub vcpus: u32,
    pub memory_mib: u64,
}

/// Prepares the jail of a VM in `dir`: ids, cgroup, mount points, ownership, and the kernel
/// placed at [`cmdline::KERNEL_FILE`]. On error nothing it allocated stays (files it
/// created in `dir` may).
pub(crate) fn prepare(
    config: &JailConfig,
    layout: Option<&Layout>,
    dir: &Path,
    kernel: &Path,
    shape: &VmShape,
) -> Result<Setup, JailError> {
    let (uid, gid) = lease_ids(&config.user)?;
    let mut cgroup = None;
    let result = prepare_inner(config, layout, dir, kernel, shape, uid, gid, &mut cgroup);
    if result.is_err() {
        if let Some(cg) = cgroup {
            let _ = cg.remove(std::time::Duration::ZERO);
        }
        if matches!(config.user, JailUser::Range { .. }) {
            release_id(uid);
        }
    }
    result
}

#[allow(clippy::too_many_arguments)]
fn prepare_inner(
    config: &JailConfig,
    layout: Option<&Layout>,
    dir: &Path,
    kernel: &Path,
    shape: &VmShape,
    uid: u32,
    gid: u32,
    cgroup_out: &mut Option<Cgroup>,
) -> Result<Setup, JailError> {
    let io = |op: &'static str, path: &Path| {
        let path = path.to_owned();
        move |source| JailError::Io { op, path, source }
    };
    let dir = std::path::absolute(dir).map_err(io("resolving", dir))?;
    let t0 = std::time::Instant::now();

    let mut binds = Vec::new();
    for host in &config.host_paths {
        let Some(name) = host
            .strip_prefix("/")
            .ok()
            .filter(|n| !n.as_os_str().is_empty())
        else {
            continue;
        };
        let inside = dir.join(name);
        let meta = match std::fs::symlink_metadata(host) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io("reading", host)(e)),
        };
        if meta.file_type().is_symlink() {
            let target = std::fs::read_link(host).map_err(io("reading", host))?;
            match std::fs::read_link(&inside) {
                Ok(t) if t == target => {}
                _ => {
                    let _ = std::fs::remove_file(&inside);
                    std::os::unix::fs::symlink(&target, &inside).map_err(io("linking", &inside))?;
                }
            }
        } else if meta.is_dir() {
            ensure_dir(&inside)?;
            binds.push((cstring(host), cstring(&inside)));
        }
    }
    let dev = dir.join("dev");
    ensure_dir(&dev)?;
    let mut dev_nodes = vec![
        DevNode {
            path: cstring(&dev.join("null")),
            mode: 0o666,
            rdev: libc::makedev(1, 3),
            vm_owned: false,
        },
        DevNode {
            path: cstring(&dev.join("urandom")),
            mode: 0o444,
            rdev: libc::makedev(1, 9),
            vm_owned: false,
        },
    ];
    if shape.accel == Accel::Kvm {
        dev_nodes.push(DevNode {
            path: cstring(&dev.join("kvm")),
            mode: 0o600,
            rdev: libc::makedev(10, 232),
            vm_owned: true,
        });
    }

    let mount_points = t0.elapsed();
    let kernel_bind = place_kernel(kernel, &dir.join(cmdline::KERNEL_FILE), uid, gid)?;
    let kernel_placed = t0.elapsed();
    for name in [cmdline::MEM_FILE, cmdline::DISK_FILE, cmdline::CONSOLE_LOG] {
        let p = dir.join(name);
        match std::os::unix::fs::chown(&p, Some(uid), Some(gid)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io("chowning", &p)(e)),
        }
    }
    std::os::unix::fs::chown(&dir, Some(0), Some(gid)).map_err(io("chowning", &dir))?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1770))
        .map_err(io("setting the mode of", &dir))?;

    let owned = t0.elapsed();
    let mut cgroup_procs = Vec::new();
    if config.cgroups {
        let layout = layout.ok_or(CgroupError::NoHierarchy("cpu"))?;
        let limits = Limits {
            cpus: config.limit_cpu.then_some(shape.vcpus),
            memory_bytes: (shape.memory_mib + config.memory_overhead_mib) << 20,
            pids: config.pids_max,
        };
        let cg = Cgroup::create(layout, &config.cgroup_parent, &cgroup_name(&dir), &limits)?;
        cgroup_procs = cg.open_procs().inspect_err(|_| {
            let _ = cg.remove(std::time::Duration::ZERO);
        })?;
        *cgroup_out = Some(cg);
    }
    tracing::debug!(
        ?mount_points, ?kernel_placed, kernel_bound = kernel_bind.is_some(), ?owned,
        cgroup = ?t0.elapsed(), "jail prepared"
    );

    Ok(Setup {
        prepared: Arc::new(Prepared {
            cgroup_procs,
            dir: cstring(&dir),
            binds,
            kernel: kernel_bind,
            dev: cstring(&dev),
            dev_nodes,
            uid,
            gid,
        }),
        record: JailRecord {
            uid,
            gid,
            cgroup: cgroup_out.clone(),
        },
    })
}

/// Checks that `binary` (absolute) will be visible in a jail built from `config`.
pub(crate) fn check_binary(config: &JailConfig, binary: &Path) -> Result<(), JailError> {
    let real = std::fs::canonicalize(binary).map_err(|source| JailError::Io {
        op: "resolving",
        path: binary.to_owned(),
        source,
    })?;
    let visible = config.host_paths.iter().any(|h| {
        binary.starts_with(h) || std::fs::canonicalize(h).is_ok_and(|h| real.starts_with(h))
    });
    if visible {
        Ok(())
    } else {
        Err(JailError::BinaryOutside(binary.to_owned()))
    }
}

/// Makes the kernel visible in the jail at `dst`. A world-readable kernel is bound read-only
/// onto `dst` (an empty file here) by the child, which costs one mount whatever file system
/// either is on; the host path and mount point are returned for that. Any other kernel is
/// cloned to `dst` and owned by the VM (a full copy when no reflink is possible).
fn place_kernel(
    kernel: &Path,
    dst: &Path,
    uid: u32,
    gid: u32,
) -> Result<Option<(CString, CString)>, JailError> {
    match std::fs::remove_file(dst) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(JailError::Io {
                op: "removing stale",
                path: dst.to_owned(),
                source,
            })
        }
    }
    let meta = std::fs::metadata(kernel).map_err(|source| JailError::Io {
        op: "reading",
        path: kernel.to_owned(),
        source,
    })?;
    if meta.is_file() && meta.mode() & 0o004 != 0 {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o444)
            .open(dst)
            .map_err(|source| JailError::Io {
                op: "creating",
                path: dst.to_owned(),
                source,
            })?;
        let source = std::path::absolute(kernel).map_err(|source| JailError::Io {
            op: "resolving",
            path: kernel.to_owned(),
            source,
        })?;
        return Ok(Some((cstring(&source), cstring(dst))));
    }
    crate::cow::clone_file(kernel, dst)?;
    std::os::unix::fs::chown(dst, Some(uid), Some(gid)).map_err(|source| JailError::Io {
        op: "chowning",
        path: dst.to_owned(),
        source,
    })?;
    Ok(None)
}

fn ensure_dir(path: &Path) -> Result<(), JailError> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => {
            std::fs::remove_file(path).map_err(|source| JailError::Io {
                op: "replacing",
                path: path.to_owned(),
                source,
            })?;
            ensure_dir(path)
        }
        Err(_) => std::fs::create_dir(path).map_err(|source| JailError::Io {
            op: "creating",
            path: path.to_owned(),
            source,
        }),
    }
}

fn cstring(p: &Path) -> CString {
    // Paths from the file system never contain NUL bytes.
    CString::new(p.as_os_str().as_bytes()).expect("path without NUL bytes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_names_are_sanitized_and_distinct() {
        let a = cgroup_name(Path::new("/data/sandboxes/sbx-1"));
        let b = cgroup_name(Path::new("/other/sandboxes/sbx-1"));
        assert!(a.starts_with("sbx-1-") && b.starts_with("sbx-1-"));
        assert_ne!(a, b);
        assert!(cgroup_name(Path::new("/x/a b$c")).starts_with("a_b_c-"));
    }

    #[test]
    fn ranged_ids_are_unique_until_released() {
        let user = JailUser::Range {
            first: 4_000_000_000,
            count: 2,
        };
        let (a, _) = lease_ids(&user).unwrap();
        let (b, gb) = lease_ids(&user).unwrap();
        assert_ne!(a, b);
        assert_eq!(b, gb);
        assert!(matches!(lease_ids(&user), Err(JailError::NoFreeUid(2))));
        release_id(a);
        assert_eq!(lease_ids(&user).unwrap().0, a);
        release_id(a);
        release_id(b);
        let fixed = JailUser::Fixed {
            uid: 65534,
            gid: 65534,
        };
        assert_eq!(lease_ids(&fixed).unwrap(), (65534, 65534));
        assert_eq!(lease_ids(&fixed).unwrap(), (65534, 65534));
    }

    #[test]
    fn every_step_has_a_name() {
        assert_eq!(step_name(0), "joining the cgroup");
        assert_eq!(step_name(10), "setting no_new_privs");
        assert_eq!(step_name(200), "an unknown step");
    }
}
