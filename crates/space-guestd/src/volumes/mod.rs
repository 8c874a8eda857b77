//! Volumes in the guest: each mount is a FUSE file system served here, whose every operation
//! is one request to the host over the uplink (`POST /v1/volumes/{index}`, named by a path in
//! the volume; `docs/volumes.md`). What the kernel's FUSE needs kept (inode numbers and the
//! path each stands for, open files, directory listings) lives in this daemon, so in the
//! guest's memory: it is in every snapshot, and a restored or forked sandbox goes on with it.
//!
//! A gate stands before the host: the host holds it shut ([`Volumes::quiesce`]) before it
//! snapshots the guest, so no request is half done in a snapshot (one sent, its answer lost,
//! and sent again after a restore); requests made meanwhile wait. It opens again when the host
//! says so, on the next identity step (a restore, a fork), or after a minute in any case.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use space_proto::volume::{MountRequest, QuiesceRequest, VolumesState, MAX_IO};
use space_proto::ProtoError;

use crate::egress::Egress;

mod fs;
mod inodes;

use fs::{Inner, VolumeFs};
use inodes::Inodes;

/// The longest the gate stays shut without being opened.
const HOLD_LIMIT: Duration = Duration::from_secs(60);

struct GateState {
    held_since: Option<Instant>,
    in_flight: u32,
}

/// What requests pass before they go to the host.
struct Gate {
    state: Mutex<GateState>,
    changed: tokio::sync::Notify,
}

impl Gate {
    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until the gate is open, then counts one request in.
    async fn enter(&self) {
        loop {
            let wait = self.changed.notified();
            {
                let mut s = self.lock();
                let open = match s.held_since {
                    None => true,
                    Some(t) if t.elapsed() >= HOLD_LIMIT => {
                        s.held_since = None;
                        true
                    }
                    Some(_) => false,
                };
                if open {
                    s.in_flight += 1;
                    return;
                }
            }
            let _ = tokio::time::timeout(Duration::from_secs(1), wait).await;
        }
    }

    fn leave(&self) {
        let mut s = self.lock();
        s.in_flight = s.in_flight.saturating_sub(1);
        drop(s);
        self.changed.notify_waiters();
    }

    /// Shuts the gate and waits (at most `patience`) for requests under way; answers how
    /// many are left.
    async fn hold(&self, patience: Duration) -> u32 {
        self.lock().held_since = Some(Instant::now());
        let deadline = Instant::now() + patience;
        loop {
            let wait = self.changed.notified();
            let left = self.lock().in_flight;
            if left == 0 || Instant::now() >= deadline {
                return left;
            }
            let _ = tokio::time::timeout(Duration::from_millis(50), wait).await;
        }
    }

    fn open(&self) {
        self.lock().held_since = None;
        self.changed.notify_waiters();
    }
}

struct Mounted {
    index: u32,
    path: PathBuf,
    /// Keeps the FUSE loop running.
    _session: fuser::BackgroundSession,
}

/// Every volume mount of the guest, and the gate before the host.
pub struct Volumes {
    mounts: Mutex<Vec<Mounted>>,
    gate: Arc<Gate>,
}

impl Default for Volumes {
    fn default() -> Self {
        Volumes {
            mounts: Mutex::new(Vec::new()),
            gate: Arc::new(Gate {
                state: Mutex::new(GateState {
                    held_since: None,
                    in_flight: 0,
                }),
                changed: tokio::sync::Notify::new(),
            }),
        }
    }
}

fn state(v: &Volumes) -> VolumesState {
    VolumesState {
        mounts: v.mounts.lock().unwrap_or_else(|e| e.into_inner()).len() as u32,
        in_flight: v.gate.lock().in_flight,
    }
}

fn check_mount_path(path: &str) -> Result<PathBuf, ProtoError> {
    space_proto::volume::check_mount_path(path).map_err(ProtoError::invalid)?;
    Ok(PathBuf::from(path.trim_end_matches('/')))
}

impl Volumes {
    /// Opens the gate (after a restore or fork: the host that shut it is gone).
    pub fn release(&self) {
        self.gate.open();
    }

    /// `POST /v1/volumes/quiesce`.
    pub async fn quiesce(&self, req: QuiesceRequest) -> VolumesState {
        if req.hold {
            self.gate.hold(Duration::from_secs(10)).await;
        } else {
            self.gate.open();
        }
        state(self)
    }

    /// `POST /v1/volumes/mount`: mounts volume `req.index` at `req.path` (made if missing). A
    /// mount that is there already (a restored or forked guest) is left as it is.
    pub async fn mount(
        &self,
        egress: Arc<Egress>,
        req: MountRequest,
    ) -> Result<VolumesState, ProtoError> {
        let path = check_mount_path(&req.path)?;
        {
            let mounts = self.mounts.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(m) = mounts.iter().find(|m| m.index == req.index) {
                if m.path == path {
                    drop(mounts);
                    return Ok(state(self));
                }
                return Err(ProtoError::invalid(format!(
                    "volume {} is mounted at {} already",
                    req.index,
                    m.path.display()
                )));
            }
            if mounts.iter().any(|m| m.path == path) {
                return Err(ProtoError::invalid(format!(
                    "{} is a mount point already",
                    path.display()
                )));
            }
        }
        let fs = VolumeFs(Arc::new(Inner {
            index: req.index,
            egress,
            runtime: tokio::runtime::Handle::current(),
            gate: self.gate.clone(),
            inodes: Mutex::new(Inodes::new()),
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
        }));
        let name = req.name.clone();
        let read_only = req.read_only;
        let at = path.clone();
        let session = tokio::task::spawn_blocking(move || mount_fuse(fs, &at, &name, read_only))
            .await
            .map_err(|e| ProtoError::internal(format!("mounting: {e}")))??;
        self.mounts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Mounted {
                index: req.index,
                path,
                _session: session,
            });
        Ok(state(self))
    }
}

/// Opens `/dev/fuse`, mounts it at `path`, and starts the FUSE loop for `fs`.
fn mount_fuse(
    fs: VolumeFs,
    path: &Path,
    name: &str,
    read_only: bool,
) -> Result<fuser::BackgroundSession, ProtoError> {
    std::fs::create_dir_all(path)
        .map_err(|e| ProtoError::internal(format!("making {}: {e}", path.display())))?;
    let dev: OwnedFd = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .map_err(|e| ProtoError::internal(format!("/dev/fuse: {e}")))?
        .into();
    let data = format!(
        "fd={},rootmode=40000,user_id=0,group_id=0,allow_other,default_permissions,max_read={MAX_IO}",
        dev.as_raw_fd()
    );
    let mut flags = nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV;
    if read_only {
        flags |= nix::mount::MsFlags::MS_RDONLY;
    }
    let source = format!("space-volume:{name}");
    nix::mount::mount(
        Some(source.as_str()),
        path,
        Some("fuse"),
        flags,
        Some(data.as_str()),
    )
    .map_err(|e| ProtoError::internal(format!("mounting {}: {e}", path.display())))?;
    let config = fuser::Config::default();
    let session =
        fuser::Session::from_fd(fs, dev, fuser::SessionACL::All, config).and_then(|s| s.spawn());
    match session {
        // The kernel's readahead of 128 KiB is kept: 1 MiB read slower (`docs/volumes.md`).
        Ok(s) => Ok(s),
        Err(e) => {
            let _ = nix::mount::umount2(path, nix::mount::MntFlags::MNT_DETACH);
            Err(ProtoError::internal(format!(
                "starting FUSE on {}: {e}",
                path.display()
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_paths() {
        assert!(check_mount_path("/data").is_ok());
        assert!(check_mount_path("/home/user/work/").is_ok());
        for bad in ["data", "/", "/proc/x", "/dev", "/a/../b", "/a//b"] {
            assert!(check_mount_path(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn the_gate_waits_for_requests_under_way() {
        let v = Volumes::default();
        v.gate.enter().await;
        let held = tokio::time::timeout(
            Duration::from_millis(200),
            v.gate.hold(Duration::from_millis(100)),
        )
        .await;
        assert_eq!(
            held.unwrap(),
            1,
            "one request still under way after the patience"
        );
        v.gate.leave();
        assert_eq!(v.gate.hold(Duration::from_secs(1)).await, 0);
        // Shut: a new request waits until it opens.
        let gate = v.gate.clone();
        let entered = tokio::spawn(async move {
            gate.enter().await;
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!entered.is_finished());
        v.release();
        entered.await.unwrap();
    }
}
