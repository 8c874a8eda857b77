//! Admission control: a node refuses to start a VM it has no room for, before anything is
//! made, rather than letting the host swap, OOM-kill a neighbour or fail half-way.
//!
//! Every request that starts a VM (create, fork, restore, a rollback of a sandbox without a
//! VM) asks [`Admission::admit`] first. The answer is a [`Ticket`] that holds the request's
//! charge until the VM is running and counted among the live ones (the caller drops it then),
//! so two concurrent creates cannot both take the last room.
//!
//! Accounting, per VM: **charge = guest RAM + [`AdmissionConfig::overhead_mib`]** (QEMU itself,
//! its TCG translation cache, page tables; the same allowance the jail's memory cgroup adds
//! on top of guest RAM). Live VMs are the sandboxes that are Running or Paused (a Suspended
//! or Failed sandbox holds no memory). A VM is admitted when both hold:
//!
//! 1. **commitment**: `committed + charge <= capacity`, where `committed` is the sum of the
//!    charges of the live VMs and of tickets not yet released, and `capacity` is
//!    [`AdmissionConfig::memory_budget_mib`] if set, else `MemTotal − reserve` (times
//!    [`AdmissionConfig::overcommit_percent`] / 100, by default 100). Guest RAM is a
//!    file mapping touched lazily, so a VM that just started uses little of it; counting the
//!    whole charge is what keeps the node safe when every guest uses all its RAM.
//! 2. **what the host has now**: `charge <= MemAvailable − reserve − (charges of tickets not
//!    yet released)`, from `/proc/meminfo`. This catches memory taken by anything else on
//!    the host. (Running VMs are already inside `MemAvailable`; tickets not yet released are
//!    VMs about to start, not yet in it.)
//!
//! `reserve` ([`AdmissionConfig::reserve_mib`]) is kept for the host: the node itself, page
//! cache for snapshots, other services. Two more limits, off by default: the number of live
//! VMs ([`AdmissionConfig::max_sandboxes`]) and the sum of their vCPUs
//! ([`AdmissionConfig::max_vcpus`]; vCPUs are time-shared, so this is an overcommit ceiling,
//! not the host's CPU count).
//!
//! Crash recovery and the VM monitor do not ask: they bring back VMs the node had already
//! admitted.

use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::error::{NodeError, Result};

/// Limits of a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdmissionConfig {
    /// Memory left to the host, MiB: subtracted from `MemAvailable` and `MemTotal`.
    pub reserve_mib: u64,
    /// Memory counted per VM on top of its guest RAM, MiB.
    pub overhead_mib: u64,
    /// A fixed memory budget for all VMs, MiB, instead of `MemTotal − reserve`.
    pub memory_budget_mib: Option<u64>,
    /// Most VMs (Running or Paused sandboxes) at once.
    pub max_sandboxes: Option<usize>,
    /// Most vCPUs of all VMs together.
    pub max_vcpus: Option<u32>,
    /// How much guest memory may be committed against `MemTotal − reserve`, in percent (100:
    /// none beyond it). Guest RAM is a file mapping that a guest touches lazily and whose
    /// pages the kernel can write back to the file, so committing more than the host has
    /// risks slowness when every guest uses all its RAM, not an out-of-memory kill. Applies
    /// only when no [`AdmissionConfig::memory_budget_mib`] is set (the budget is the
    /// operator's own number).
    pub overcommit_percent: u64,
    /// Space kept free on the data disk, MiB: below it the node refuses work that writes
    /// there (creates, forks, restores, snapshots other than a suspend's) with
    /// [`NodeError::DiskFull`]. A guest's RAM is a file on that disk whose blocks are taken
    /// as the guest first touches its pages (shared ones copied on write): on a disk with
    /// no room left, QEMU gets SIGBUS and the VM dies, so the reserve is kept for them.
    pub disk_reserve_mib: u64,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        AdmissionConfig {
            reserve_mib: 512,
            overhead_mib: 256,
            memory_budget_mib: None,
            max_sandboxes: None,
            max_vcpus: None,
            overcommit_percent: 100,
            disk_reserve_mib: 1024,
        }
    }
}

/// The size of one VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// vCPUs.
    pub vcpus: u32,
    /// Guest RAM, MiB.
    pub memory_mib: u64,
}

/// The host's memory as `/proc/meminfo` says, MiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemInfo {
    /// `MemTotal`.
    pub total_mib: u64,
    /// `MemAvailable`: what can be allocated without swapping (free + reclaimable).
    pub available_mib: u64,
}

impl MemInfo {
    /// Reads `/proc/meminfo`.
    pub fn read() -> Result<MemInfo> {
        let path = Path::new("/proc/meminfo");
        let text = std::fs::read_to_string(path).map_err(NodeError::io("reading", path))?;
        MemInfo::parse(&text)
            .ok_or_else(|| NodeError::internal("/proc/meminfo has no MemTotal or MemAvailable"))
    }

    fn parse(text: &str) -> Option<MemInfo> {
        let field = |name: &str| -> Option<u64> {
            text.lines().find_map(|l| {
                let rest = l.strip_prefix(name)?.strip_prefix(':')?;
                let kib: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
                Some(kib / 1024)
            })
        };
        Some(MemInfo {
            total_mib: field("MemTotal")?,
            available_mib: field("MemAvailable")?,
        })
    }
}

/// Charges of VMs admitted but not yet live.
#[derive(Default)]
struct Pending {
    next: u64,
    charges: Vec<(u64, Shape)>,
}

/// The node's admission control. Cheap to share.
pub(crate) struct Admission {
    config: AdmissionConfig,
    pending: Arc<Mutex<Pending>>,
}

/// An admitted VM's charge, counted until dropped (when the VM is live, or did not start).
pub(crate) struct Ticket {
    id: u64,
    pending: Arc<Mutex<Pending>>,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        p.charges.retain(|(id, _)| *id != self.id);
    }
}

impl Admission {
    pub fn new(config: AdmissionConfig) -> Self {
        Admission {
            config,
            pending: Arc::default(),
        }
    }

    /// All the memory VMs may take and what is free of it next to the `live` VMs (and those
    /// being admitted), MiB.
    pub fn memory(&self, live: &[Shape]) -> Result<(u64, u64)> {
        let mem = MemInfo::read()?;
        let c = &self.config;
        let p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let charge = |s: &Shape| s.memory_mib + c.overhead_mib;
        let committed: u64 = live
            .iter()
            .chain(p.charges.iter().map(|(_, s)| s))
            .map(charge)
            .sum();
        let capacity = c.memory_budget_mib.unwrap_or_else(|| {
            mem.total_mib.saturating_sub(c.reserve_mib) * c.overcommit_percent.max(1) / 100
        });
        let available = mem.available_mib.saturating_sub(c.reserve_mib);
        let free = capacity.saturating_sub(committed).min(available);
        Ok((capacity, free.saturating_sub(c.overhead_mib)))
    }

    /// Admits a VM of shape `want` next to the `live` ones, or refuses with
    /// [`NodeError::Capacity`] saying which limit it hit.
    pub fn admit(&self, want: Shape, live: &[Shape]) -> Result<Ticket> {
        let mem = MemInfo::read()?;
        self.admit_with(want, live, mem)
    }

    fn admit_with(&self, want: Shape, live: &[Shape], mem: MemInfo) -> Result<Ticket> {
        let c = &self.config;
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let charge = |s: &Shape| s.memory_mib + c.overhead_mib;
        let all = || live.iter().chain(p.charges.iter().map(|(_, s)| s));
        let count = all().count();
        let need = charge(&want);
        let (capacity, what) = match c.memory_budget_mib {
            Some(b) => (b, format!("the node's budget of {b} MiB")),
            None => {
                let cap =
                    mem.total_mib.saturating_sub(c.reserve_mib) * c.overcommit_percent.max(1) / 100;
                let over = if c.overcommit_percent == 100 {
                    String::new()
                } else {
                    format!(", committed to {}%", c.overcommit_percent)
                };
                (
                    cap,
                    format!(
                        "{cap} MiB (MemTotal {} MiB minus a {} MiB reserve{over})",
                        mem.total_mib, c.reserve_mib
                    ),
                )
            }
        };
        // A VM this node could not hold even empty is no matter of waiting: refuse it as a
        // request (400), not as a full node (503).
        let vcpus_over = c.max_vcpus.is_some_and(|max| want.vcpus > max);
        if need > capacity || vcpus_over {
            return Err(NodeError::Invalid(format!(
                "a sandbox of {} MiB and {} vCPUs is larger than this node can ever hold \
                 (memory: {what}, {} MiB overhead a VM; vCPUs: {})",
                want.memory_mib,
                want.vcpus,
                c.overhead_mib,
                c.max_vcpus
                    .map_or_else(|| "no limit".to_owned(), |m| m.to_string())
            )));
        }
        if let Some(max) = c.max_sandboxes {
            if count >= max {
                return Err(NodeError::Capacity(format!(
                    "this node runs its maximum of {max} sandboxes (running or paused); \
                     suspend or kill one first"
                )));
            }
        }
        if let Some(max) = c.max_vcpus {
            let used: u64 = all().map(|s| u64::from(s.vcpus)).sum();
            if used + u64::from(want.vcpus) > u64::from(max) {
                return Err(NodeError::Capacity(format!(
                    "not enough vCPUs on this node: requested {}, {used} of {max} in use",
                    want.vcpus
                )));
            }
        }
        let committed: u64 = all().map(charge).sum();
        if committed + need > capacity {
            return Err(NodeError::Capacity(format!(
                "not enough memory on this node: requested {} MiB + {} MiB overhead, {committed} \
                 MiB committed to {count} VMs of {what}",
                want.memory_mib, c.overhead_mib
            )));
        }
        let starting: u64 = p.charges.iter().map(|(_, s)| charge(s)).sum();
        let available = mem
            .available_mib
            .saturating_sub(c.reserve_mib)
            .saturating_sub(starting);
        if need > available {
            return Err(NodeError::Capacity(format!(
                "not enough memory on this node: requested {} MiB + {} MiB overhead, available \
                 {available} MiB (MemAvailable {} MiB minus a {} MiB reserve{})",
                want.memory_mib,
                c.overhead_mib,
                mem.available_mib,
                c.reserve_mib,
                if starting > 0 {
                    format!(" and {starting} MiB for VMs being started")
                } else {
                    String::new()
                }
            )));
        }
        p.next += 1;
        let id = p.next;
        p.charges.push((id, want));
        Ok(Ticket {
            id,
            pending: self.pending.clone(),
        })
    }
}

/// Refuses with [`NodeError::DiskFull`] when the filesystem of `root` has less than
/// `reserve_mib` free ([`AdmissionConfig::disk_reserve_mib`]).
pub(crate) fn check_disk(root: &std::path::Path, reserve_mib: u64) -> Result<()> {
    if reserve_mib == 0 {
        return Ok(());
    }
    let s = nix::sys::statvfs::statvfs(root).map_err(|e| {
        NodeError::internal(format!("reading the free space of {}: {e}", root.display()))
    })?;
    let free_mib = (s.blocks_available() as u64).saturating_mul(s.fragment_size() as u64) >> 20;
    if free_mib < reserve_mib {
        return Err(NodeError::DiskFull(format!(
            "{free_mib} MiB free on the data disk {}, under the {reserve_mib} MiB this node \
             keeps for the memory of running VMs; make room (delete snapshots or sandboxes, \
             grow the disk) and send the request again",
            root.display()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: Shape = Shape {
        vcpus: 1,
        memory_mib: 256,
    };
    const HOST: MemInfo = MemInfo {
        total_mib: 4096,
        available_mib: 3000,
    };

    #[test]
    fn parses_meminfo() {
        let text = "MemTotal:       24684004 kB\nMemFree:        18563204 kB\n\
                    MemAvailable:   24039344 kB\nBuffers:          123 kB\n";
        assert_eq!(
            MemInfo::parse(text),
            Some(MemInfo {
                total_mib: 24105,
                available_mib: 23475
            })
        );
        assert_eq!(MemInfo::parse("MemTotal: 1 kB\n"), None);
        // The real file parses.
        let m = MemInfo::read().unwrap();
        assert!(m.total_mib >= m.available_mib && m.total_mib > 0);
    }

    #[test]
    fn tickets_count_until_dropped() {
        let a = Admission::new(AdmissionConfig {
            memory_budget_mib: Some(1100),
            ..Default::default()
        });
        let t1 = a.admit_with(SMALL, &[], HOST).unwrap();
        let t2 = a.admit_with(SMALL, &[], HOST).unwrap();
        let e = a.admit_with(SMALL, &[], HOST).err().unwrap();
        assert!(e.is_refusal());
        assert!(
            e.to_string()
                .contains("1024 MiB committed to 2 VMs of the node's budget of 1100 MiB"),
            "{e}"
        );
        drop((t1, t2));
        // Live VMs count the same as tickets.
        let e = a.admit_with(SMALL, &[SMALL, SMALL], HOST).err().unwrap();
        assert!(e.to_string().contains("committed"), "{e}");
        let _t = a.admit_with(SMALL, &[SMALL], HOST).unwrap();
    }

    #[test]
    fn overcommit_raises_the_commitment_but_not_what_the_host_has() {
        // 4096 − 512 = 3584 MiB of commitment: 7 VMs of 256 + 256 MiB.
        let host = MemInfo {
            total_mib: 4096,
            available_mib: 4000,
        };
        let plain = Admission::new(AdmissionConfig::default());
        let live = vec![SMALL; 7];
        let e = plain.admit_with(SMALL, &live, host).err().unwrap();
        assert!(e.to_string().contains("3584 MiB (MemTotal"), "{e}");
        let over = Admission::new(AdmissionConfig {
            overcommit_percent: 200,
            ..Default::default()
        });
        let t = over.admit_with(SMALL, &live, host).unwrap();
        drop(t);
        let e = over
            .admit_with(SMALL, &vec![SMALL; 14], host)
            .err()
            .unwrap();
        assert!(
            e.to_string().contains(
                "7168 MiB (MemTotal 4096 MiB minus a 512 MiB reserve, committed to 200%)"
            ),
            "{e}"
        );
        // What the host has now still bounds each VM.
        let short = MemInfo {
            total_mib: 4096,
            available_mib: 900,
        };
        assert!(over.admit_with(SMALL, &[], short).is_err());
        // An explicit budget is the operator's number: no overcommit on it.
        let budget = Admission::new(AdmissionConfig {
            memory_budget_mib: Some(1100),
            overcommit_percent: 300,
            ..Default::default()
        });
        assert!(budget.admit_with(SMALL, &[SMALL, SMALL], HOST).is_err());
    }

    #[test]
    fn available_memory_and_reserve() {
        let a = Admission::new(AdmissionConfig::default());
        let big = Shape {
            vcpus: 1,
            memory_mib: 2400,
        };
        let e = a.admit_with(big, &[], HOST).err().unwrap();
        assert_eq!(
            e.to_string(),
            "not enough memory on this node: requested 2400 MiB + 256 MiB overhead, available \
             2488 MiB (MemAvailable 3000 MiB minus a 512 MiB reserve)"
        );
        let ok = Shape {
            vcpus: 1,
            memory_mib: 2000,
        };
        let t = a.admit_with(ok, &[], HOST).unwrap();
        // A VM still starting is not in MemAvailable yet.
        let e = a.admit_with(SMALL, &[], HOST).err().unwrap();
        assert!(e.to_string().contains("for VMs being started"), "{e}");
        drop(t);
    }

    #[test]
    fn count_and_vcpu_limits() {
        let a = Admission::new(AdmissionConfig {
            max_sandboxes: Some(2),
            max_vcpus: Some(3),
            ..Default::default()
        });
        let two = Shape {
            vcpus: 2,
            memory_mib: 256,
        };
        let _t = a.admit_with(two, &[], HOST).unwrap();
        let e = a.admit_with(two, &[], HOST).err().unwrap();
        assert!(e.to_string().contains("requested 2, 2 of 3 in use"), "{e}");
        let _u = a.admit_with(SMALL, &[], HOST).unwrap();
        let e = a.admit_with(SMALL, &[], HOST).err().unwrap();
        assert!(e.to_string().contains("maximum of 2 sandboxes"), "{e}");
        // A VM that would not fit an empty node is a bad request, whatever runs now.
        let wide = Shape {
            vcpus: 4,
            memory_mib: 256,
        };
        let e = a.admit_with(wide, &[], HOST).err().unwrap();
        assert!(matches!(e, NodeError::Invalid(_)), "{e:?}");
        let tall = Shape {
            vcpus: 1,
            memory_mib: HOST.total_mib,
        };
        let e = a.admit_with(tall, &[], HOST).err().unwrap();
        assert!(matches!(e, NodeError::Invalid(_)), "{e:?}");
        assert!(
            e.to_string()
                .contains("larger than this node can ever hold"),
            "{e}"
        );
    }
}
