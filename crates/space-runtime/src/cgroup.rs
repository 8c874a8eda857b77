//! Per-VM control groups: CPU, memory and task limits for one QEMU, on cgroup v2 or v1.
//!
//! Every VM gets `<parent>/<name>` (by default `space/<sandbox>-<hash>`) in each hierarchy
//! that carries a controller we use: one directory under the unified (v2) mount, or one each
//! under the v1 `cpu`, `memory` and `pids` mounts. The VMM process joins it before it execs
//! (it writes `0` to `cgroup.procs` between fork and exec), so nothing QEMU does is ever
//! outside its limits. The directory is removed when the VM exits; [`sweep`] removes the
//! empty ones a crashed node left behind.
//!
//! Limits: CPU = as many CPUs as the VM has vCPUs (`cpu.max` / CFS quota over a 100 ms
//! period); memory = guest RAM + an overhead for QEMU itself; tasks = a fixed cap. The guest
//! RAM is a shared file mapping, so its pages are page cache charged to the cgroup of the VM
//! that touches them. Page cache is reclaimable: under the limit the kernel writes dirty
//! guest pages back to the `mem` file instead of killing QEMU, at the cost of I/O.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// CFS period the CPU quota is expressed in.
const CPU_PERIOD_US: u64 = 100_000;

/// Errors setting up control groups.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// No cgroup v2 mount with the needed controllers and no v1 mounts for them.
    #[error("no usable cgroup hierarchy for {0} (looked at /proc/self/mountinfo)")]
    NoHierarchy(&'static str),
    /// A cgroup file operation failed.
    #[error("{op} {path}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The cgroup exists and still has processes in it: another VM (or a survivor of a
    /// crash that was not adopted) uses the name.
    #[error("cgroup {0} is in use by other processes")]
    Busy(PathBuf),
}

/// Where the controllers are mounted on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    /// Unified hierarchy with `cpu`, `memory` and `pids` available at its root.
    V2 {
        /// Mount point (usually `/sys/fs/cgroup`).
        root: PathBuf,
    },
    /// Legacy hierarchies, one mount per controller (possibly shared, e.g. `cpu,cpuacct`).
    V1 {
        /// Mount point of the hierarchy with `cpu`.
        cpu: PathBuf,
        /// Mount point of the hierarchy with `memory`.
        memory: PathBuf,
        /// Mount point of the hierarchy with `pids`.
        pids: PathBuf,
    },
}

impl Layout {
    /// Finds the controllers from `/proc/self/mountinfo`, preferring v2 when its root offers
    /// all three controllers (a hybrid host mounts an empty v2 hierarchy next to v1 ones).
    pub fn detect() -> Result<Layout, CgroupError> {
        let text =
            std::fs::read_to_string("/proc/self/mountinfo").map_err(|source| CgroupError::Io {
                op: "reading",
                path: "/proc/self/mountinfo".into(),
                source,
            })?;
        let v2_controllers = |root: &Path| {
            std::fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default()
        };
        Layout::from_mountinfo(&text, v2_controllers)
    }

    /// The pure part of [`Layout::detect`]; `v2_controllers` reads a v2 root's
    /// `cgroup.controllers`.
    pub fn from_mountinfo(
        mountinfo: &str,
        v2_controllers: impl Fn(&Path) -> String,
    ) -> Result<Layout, CgroupError> {
        let mut v1: [Option<PathBuf>; 3] = Default::default();
        for line in mountinfo.lines() {
            let Some((left, right)) = line.split_once(" - ") else {
                continue;
            };
            let Some(mount_point) = left.split(' ').nth(4) else {
                continue;
            };
            let mut right = right.split(' ');
            let (fstype, _source, options) = (right.next(), right.next(), right.next());
            let mount_point = PathBuf::from(unescape(mount_point));
            match fstype {
                Some("cgroup2") => {
                    let have = v2_controllers(&mount_point);
                    let have: Vec<&str> = have.split_whitespace().collect();
                    if ["cpu", "memory", "pids"].iter().all(|c| have.contains(c)) {
                        return Ok(Layout::V2 { root: mount_point });
                    }
                }
                Some("cgroup") => {
                    let opts: Vec<&str> = options.unwrap_or("").split(',').collect();
                    for (i, c) in ["cpu", "memory", "pids"].iter().enumerate() {
                        if opts.contains(c) && v1[i].is_none() {
                            v1[i] = Some(mount_point.clone());
                        }
                    }
                }
                _ => {}
            }
        }
        let [cpu, memory, pids] = v1;
        Ok(Layout::V1 {
            cpu: cpu.ok_or(CgroupError::NoHierarchy("cpu"))?,
            memory: memory.ok_or(CgroupError::NoHierarchy("memory"))?,
            pids: pids.ok_or(CgroupError::NoHierarchy("pids"))?,
        })
    }

    /// The directories that hold `parent`'s children, one per distinct hierarchy.
    pub fn parents(&self, parent: &Path) -> Vec<PathBuf> {
        let mut dirs: Vec<PathBuf> = match self {
            Layout::V2 { root } => vec![root.join(parent)],
            Layout::V1 { cpu, memory, pids } => {
                [cpu, memory, pids].iter().map(|m| m.join(parent)).collect()
            }
        };
        dirs.dedup();
        dirs
    }
}

/// `\040`-style escapes of mountinfo paths.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            let digits = std::str::from_utf8(&b[i + 1..i + 4]).ok();
            if let Some(v) = digits.and_then(|d| u8::from_str_radix(d, 8).ok()) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Limits of one VM's cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// CPU time as a number of whole CPUs (`None`: unlimited).
    pub cpus: Option<u32>,
    /// Memory in bytes, page cache included.
    pub memory_bytes: u64,
    /// Tasks (threads) in the cgroup.
    pub pids: u64,
}

/// One VM's cgroup: a directory in each hierarchy.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Cgroup {
    /// The directories (one under v2; one per hierarchy under v1).
    pub dirs: Vec<PathBuf>,
}

impl Cgroup {
    /// Creates (or reuses, if empty) `<parent>/<name>` in every hierarchy of `layout` and
    /// writes `limits`. Under v2 the controllers are enabled in `subtree_control` of every
    /// level from the root down to `parent`.
    pub fn create(
        layout: &Layout,
        parent: &Path,
        name: &str,
        limits: &Limits,
    ) -> Result<Cgroup, CgroupError> {
        let io = |op, path: &Path| {
            let path = path.to_owned();
            move |source| CgroupError::Io { op, path, source }
        };
        let mut dirs = Vec::new();
        for p in layout.parents(parent) {
            std::fs::create_dir_all(&p).map_err(io("creating", &p))?;
            let dir = p.join(name);
            match std::fs::create_dir(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    if !procs(&dir).is_empty() {
                        return Err(CgroupError::Busy(dir));
                    }
                }
                Err(e) => return Err(io("creating", &dir)(e)),
            }
            dirs.push(dir);
        }
        let cgroup = Cgroup { dirs };
        let result = cgroup.configure(layout, parent, limits);
        if result.is_err() {
            let _ = cgroup.remove_now();
        }
        result.map(|()| cgroup)
    }

    fn configure(
        &self,
        layout: &Layout,
        parent: &Path,
        limits: &Limits,
    ) -> Result<(), CgroupError> {
        match layout {
            Layout::V2 { root } => {
                // Enable the controllers on the way down (the root is never "internal").
                let mut level = root.clone();
                for part in std::iter::once(None).chain(parent.components().map(Some)) {
                    if let Some(c) = part {
                        level.push(c);
                    }
                    write_file(&level.join("cgroup.subtree_control"), "+cpu +memory +pids")?;
                }
                let dir = &self.dirs[0];
                let cpu = match limits.cpus {
                    Some(n) => format!("{} {CPU_PERIOD_US}", u64::from(n) * CPU_PERIOD_US),
                    None => format!("max {CPU_PERIOD_US}"),
                };
                write_file(&dir.join("cpu.max"), &cpu)?;
                write_file(&dir.join("memory.max"), &limits.memory_bytes.to_string())?;
                // No swap for a VM: its RAM is a file and has its own backing store.
                let _ = write_file(&dir.join("memory.swap.max"), "0");
                write_file(&dir.join("pids.max"), &limits.pids.to_string())?;
            }
            Layout::V1 { cpu, memory, pids } => {
                for dir in &self.dirs {
                    if dir.starts_with(cpu) {
                        write_file(&dir.join("cpu.cfs_period_us"), &CPU_PERIOD_US.to_string())?;
                        let quota = match limits.cpus {
                            Some(n) => (u64::from(n) * CPU_PERIOD_US).to_string(),
                            None => "-1".into(),
                        };
                        write_file(&dir.join("cpu.cfs_quota_us"), &quota)?;
                    }
                    if dir.starts_with(memory) {
                        write_file(
                            &dir.join("memory.limit_in_bytes"),
                            &limits.memory_bytes.to_string(),
                        )?;
                    }
                    if dir.starts_with(pids) {
                        write_file(&dir.join("pids.max"), &limits.pids.to_string())?;
                    }
                }
            }
        }
        Ok(())
    }

    /// `cgroup.procs` of every directory, opened for writing (close-on-exec), for a child
    /// to join between fork and exec.
    pub fn open_procs(&self) -> Result<Vec<OwnedFd>, CgroupError> {
        self.dirs
            .iter()
            .map(|d| {
                let path = d.join("cgroup.procs");
                OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .map(OwnedFd::from)
                    .map_err(|source| CgroupError::Io {
                        op: "opening",
                        path,
                        source,
                    })
            })
            .collect()
    }

    /// The cgroup `name` under `parent` as far as it exists (its directories that are
    /// there), or `None` when none is.
    pub fn existing(layout: &Layout, parent: &Path, name: &str) -> Option<Cgroup> {
        let dirs: Vec<PathBuf> = layout
            .parents(parent)
            .into_iter()
            .map(|p| p.join(name))
            .filter(|d| d.is_dir())
            .collect();
        (!dirs.is_empty()).then_some(Cgroup { dirs })
    }

    /// Whether no process is in any of its directories.
    pub fn is_empty(&self) -> bool {
        self.dirs.iter().all(|d| procs(d).is_empty())
    }

    /// The pids in the cgroup (of its first directory; every directory holds the same).
    pub fn procs(&self) -> Vec<u32> {
        self.dirs.first().map(|d| procs(d)).unwrap_or_default()
    }

    /// Removes the directories, retrying for up to `patience` while the kernel finishes
    /// tearing down an exited process. Gone already counts as removed.
    pub fn remove(&self, patience: Duration) -> Result<(), CgroupError> {
        let deadline = std::time::Instant::now() + patience;
        loop {
            match self.remove_now() {
                Ok(()) => return Ok(()),
                Err(e) if std::time::Instant::now() >= deadline => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }

    fn remove_now(&self) -> Result<(), CgroupError> {
        for d in &self.dirs {
            match std::fs::remove_dir(d) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => {
                    return Err(CgroupError::Io {
                        op: "removing",
                        path: d.clone(),
                        source,
                    })
                }
            }
        }
        Ok(())
    }
}

/// How old an empty cgroup must be before a sweep removes it: a cgroup made for a VM that
/// has not joined it yet is empty too, and another node on the host (or one starting a VM
/// while this one sweeps) may have just made it.
pub const SWEEP_GRACE: std::time::Duration = std::time::Duration::from_secs(60);

/// Removes every empty VM cgroup under `parent` older than [`SWEEP_GRACE`] (those of VMs
/// that exited while no node watched them), and every empty one whose name `own` claims at
/// any age (the caller's, none of which is being set up). Returns the directories removed.
pub fn sweep(
    layout: &Layout,
    parent: &Path,
    own: &dyn Fn(&str) -> bool,
) -> Result<Vec<PathBuf>, CgroupError> {
    let mut removed = Vec::new();
    for p in layout.parents(parent) {
        let entries = match std::fs::read_dir(&p) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(source) => {
                return Err(CgroupError::Io {
                    op: "reading",
                    path: p,
                    source,
                })
            }
        };
        for entry in entries.flatten() {
            let dir = entry.path();
            let young = entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_none_or(|age| age < SWEEP_GRACE)
                && !own(&entry.file_name().to_string_lossy());
            if entry.file_type().map(|t| t.is_dir()).unwrap_or(false)
                && !young
                && procs(&dir).is_empty()
                && std::fs::remove_dir(&dir).is_ok()
            {
                removed.push(dir);
            }
        }
    }
    Ok(removed)
}

fn procs(dir: &Path) -> Vec<u32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

fn write_file(path: &Path, value: &str) -> Result<(), CgroupError> {
    OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|mut f| f.write_all(value.as_bytes()))
        .map_err(|source| CgroupError::Io {
            op: "writing",
            path: path.to_owned(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn hybrid_hosts_use_v1_and_pure_v2_hosts_use_v2() {
        let layout = Layout::from_mountinfo(HYBRID, |_| String::new()).unwrap();
        assert_eq!(
            layout,
            Layout::V1 {
                cpu: "/sys/fs/cgroup/cpu,cpuacct".into(),
                memory: "/sys/fs/cgroup/memory".into(),
                pids: "/sys/fs/cgroup/pids".into(),
            }
        );
        let v2 = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
        let layout =
            Layout::from_mountinfo(v2, |_| "cpuset cpu io memory hugetlb pids".into()).unwrap();
        assert_eq!(
            layout,
            Layout::V2 {
                root: "/sys/fs/cgroup".into()
            }
        );
        // A v2 mount without the controllers and no v1 mounts: nothing to use.
        assert!(matches!(
            Layout::from_mountinfo(v2, |_| "cpuset io".into()),
            Err(CgroupError::NoHierarchy("cpu"))
        ));
        assert_eq!(unescape("/a\\040b"), "/a b");
    }

    #[test]
    fn v2_files_are_written_and_removed() {
        // A plain directory standing in for a v2 root: the files are ordinary files there.
        let root = tempfile::tempdir().unwrap();
        let layout = Layout::V2 {
            root: root.path().to_owned(),
        };
        let parent = Path::new("space");
        std::fs::create_dir_all(root.path().join("space/vm-1")).unwrap();
        for f in [
            "cgroup.subtree_control",
            "space/cgroup.subtree_control",
            "space/vm-1/cpu.max",
            "space/vm-1/memory.max",
            "space/vm-1/pids.max",
            "space/vm-1/cgroup.procs",
        ] {
            std::fs::write(root.path().join(f), "").unwrap();
        }
        let limits = Limits {
            cpus: Some(2),
            memory_bytes: 384 << 20,
            pids: 256,
        };
        let cg = Cgroup::create(&layout, parent, "vm-1", &limits).unwrap();
        let read =
            |f: &str| std::fs::read_to_string(root.path().join("space/vm-1").join(f)).unwrap();
        assert_eq!(read("cpu.max"), "200000 100000");
        assert_eq!(read("memory.max"), (384u64 << 20).to_string());
        assert_eq!(read("pids.max"), "256");
        assert_eq!(
            std::fs::read_to_string(root.path().join("space/cgroup.subtree_control")).unwrap(),
            "+cpu +memory +pids"
        );
        std::fs::write(root.path().join("space/vm-1/cgroup.procs"), "42\n").unwrap();
        assert_eq!(cg.procs(), [42]);
        assert!(matches!(
            Cgroup::create(&layout, parent, "vm-1", &limits),
            Err(CgroupError::Busy(_))
        ));
    }
}
