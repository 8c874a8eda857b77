//! A sandbox's step of rolling snapshots and retention, run when [`crate::scheduler`] sends
//! [`Request::Rolling`]: the due snapshot (Running only), then retention over the sandbox's
//! snapshots (planned by the scheduler's policy) and the deletion of what the plan drops. Also
//! the fingerprint of the VM's disk image ([`DiskMark`]) that tells the schedule whether the
//! disk changed.
//!
//! **Disk changed.** The driver compares a fingerprint of the VM's disk file on the host
//! ([`DiskMark`]: inode, size, mtime, ctime) with the one taken when the disk was last known
//! to be held by a snapshot or an origin. QEMU writes the image through the host page cache,
//! and every write moves mtime, so a `stat` answers the question without waking the guest.
//! The fingerprint is taken
//!
//! - when a driver takes a VM that just started (create, fork, restore, rollback): the disk is
//!   then its origin's. An adopted VM starts without one (it may have been written since its
//!   last snapshot);
//! - inside every disk snapshot, with the vCPUs stopped, right before the clone (exact);
//! - right before a rolling full snapshot (conservative: a write between the `stat` and the
//!   pause counts as a change, so at worst one disk snapshot too many).
//!
//! A fingerprint that cannot be taken counts as changed. Limit: a write still in the guest's
//! page cache has not reached the image; it is seen once the guest writes it back (Linux: dirty
//! data older than 30 s, checked every 5 s; ext4 commits metadata every 5 s). The disk snapshot
//! itself runs `sync` in the guest first, so it captures everything dirty at that moment, and
//! the full snapshots hold the guest's memory, page cache included.
//!
//! **Schedule anchors.** The VM's start counts as a full snapshot for the schedule: the VM's
//! origin (the template's snapshot, a restore point, a fork point) brings that state back, so a
//! new sandbox gets its first full snapshot one full interval after it started, not at once.
//!

use std::os::unix::fs::MetadataExt;

use crate::retention::{Due, RollingSchedule, ScheduleInput};
use crate::scheduler::{delete_volumes, plan_deletions};

use super::*;

/// The disk image inside a sandbox directory.
pub(super) const DISK_FILE: &str = "rootfs.ext4";

/// A fingerprint of a disk image file: any write through QEMU changes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct DiskMark {
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl DiskMark {
    /// The fingerprint of `path`; `None` if it cannot be read (which counts as changed).
    pub fn of(path: &Path) -> Option<DiskMark> {
        let m = std::fs::metadata(path).ok()?;
        Some(DiskMark {
            ino: m.ino(),
            size: m.size(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        })
    }
}

impl Sandbox {
    /// One scheduler step for this sandbox: the due snapshot (Running only), then retention.
    pub(super) async fn rolling(&mut self, job: RollingJob) -> Result<RollingOutcome> {
        let mut out = RollingOutcome::default();
        if self.record.state == State::Running {
            out.taken = self.rolling_snapshot(&job.schedule).await?;
        }
        if !job.prune {
            return Ok(out);
        }
        let doomed = plan_deletions(&self.record, &job.retention, &job.in_use, now_ms());
        if !doomed.is_empty() {
            let remote = crate::archive::archived(&self.record, &doomed);
            self.record.snapshots.retain(|s| !doomed.contains(&s.id));
            self.write()?;
            delete_volumes(&self.ctx, &self.record.id, &doomed).await;
            crate::archive::delete_remote(&self.ctx, &self.record.id, &remote).await;
        }
        out.deleted = doomed;
        Ok(out)
    }

    async fn rolling_snapshot(
        &mut self,
        schedule: &RollingSchedule,
    ) -> Result<Option<SnapshotRecord>> {
        let newest = |kind| {
            self.record
                .snapshots
                .iter()
                .filter(|s| s.kind == kind)
                .map(|s| s.created_unix_ms)
                .max()
        };
        let started = self.record.started_unix_ms;
        let last_full = Some(newest(SnapshotKind::Full).map_or(started, |t| t.max(started)));
        let last_disk = newest(SnapshotKind::Disk);
        let now_mark = DiskMark::of(&self.disk_file());
        let disk_changed = now_mark.is_none() || now_mark != self.disk_mark;
        let step = schedule.step(&ScheduleInput {
            now_unix_ms: now_ms(),
            last_disk_unix_ms: last_disk,
            last_full_unix_ms: last_full,
            disk_changed,
        });
        let kind = match step.due {
            Due::None => return Ok(None),
            Due::Disk => SnapshotKind::Disk,
            Due::Full => SnapshotKind::Full,
        };
        let snap = match self.snapshot(kind, SnapshotReason::Rolling).await {
            Ok(s) => s,
            Err(e) => {
                // Whatever the failed attempt left, the next run must not think the disk is held.
                self.disk_mark = None;
                return Err(e);
            }
        };
        if kind == SnapshotKind::Full {
            // Taken before the snapshot: a write in between shows up as a change next time.
            self.disk_mark = now_mark;
        }
        tracing::debug!(id = %self.record.id, snapshot = %snap.id, paused_us = snap.paused_for_us, "rolling snapshot");
        Ok(Some(snap))
    }
}
