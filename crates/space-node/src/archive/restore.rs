//! Snapshots coming back from the store: into the snapshot directory (a rollback, the cache
//! copy), or, for a restore, straight into the sandbox directory.

use std::sync::atomic::{AtomicU64, Ordering};

use space_archive::FetchReport;
use space_runtime::cmdline::{DISK_FILE, MEM_FILE};

use super::*;

/// A fresh hidden name for a fetch into `parent` (two fetches of one snapshot can overlap).
/// Recovery removes leftovers: they are not snapshot ids.
fn fetch_dir(parent: &Path, snap: &SnapshotId) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    parent.join(format!(".fetch-{snap}-{}-{n}", std::process::id()))
}

/// The keys, the manifest (hash checked) and this node's copy of its template, for a fetch
/// of archived snapshot `snap` of `r`.
async fn prepare(
    ctx: &Ctx,
    cfg: &ArchiveConfig,
    r: &SandboxRecord,
    snap: &SnapshotId,
    hash: &str,
) -> Result<(Arc<LineageKeys>, Manifest, crate::template::Template)> {
    // Always unwrapped anew: a disabled master key stops restores at once.
    let keys = cfg
        .keyring
        .lineage_keys(&r.tenant, r.lineage(), false, true)
        .await
        .map_err(key_error)?;
    let m = fetch_manifest(cfg, &keys, r.id.as_str(), snap.as_str(), hash).await?;
    check_host(ctx, &m)?;
    let base = m
        .base
        .clone()
        .ok_or_else(|| NodeError::Archive("a snapshot manifest without its template".into()))?;
    let t = local_template(ctx, cfg, &base).await?;
    Ok((keys, m, t))
}

/// Fetches archived full snapshot `snap` of `r` into its snapshot directory (a complete,
/// read-only volume, or nothing).
pub(crate) async fn fetch_snapshot(
    ctx: &Ctx,
    cfg: &ArchiveConfig,
    r: &SandboxRecord,
    snap: &SnapshotId,
    hash: &str,
) -> Result<()> {
    let t0 = std::time::Instant::now();
    let (keys, m, t) = prepare(ctx, cfg, r, snap, hash).await?;
    let final_dir = ctx.layout.snapshot_dir(r.id.as_str(), snap.as_str())?;
    let parent = ctx.layout.snapshots_of(r.id.as_str())?;
    std::fs::create_dir_all(&parent).map_err(NodeError::io("creating", &parent))?;
    let tmp = fetch_dir(&parent, snap);
    materialize_into(ctx, cfg, keys, &m, &tmp, Some(&t.dir)).await?;
    let placed = fix_kernel_path(&tmp.join("manifest.json"), &t.kernel()).and_then(|_| {
        let (s, d) = (ctx.storage.clone(), final_dir.clone());
        s.delete_volume(&d)?;
        std::fs::rename(&tmp, &final_dir).map_err(NodeError::io("placing", &final_dir))
    });
    if let Err(e) = placed {
        let _ = ctx.storage.delete_volume(&tmp);
        return Err(e);
    }
    ctx.storage.set_readonly(&final_dir)?;
    tracing::info!(id = %r.id, snapshot = %snap, took = ?t0.elapsed(), "snapshot fetched from the object store");
    Ok(())
}

/// Where [`fetch_for_restore`] left the device state and manifest for the runtime.
pub(crate) struct Incoming {
    dir: PathBuf,
    /// Keys unwrapped, the manifest fetched, opened and checked, the template found.
    pub(crate) prepared: Duration,
    /// What fetching the chunks did.
    pub(crate) fetch: FetchReport,
}

/// Where the time of a sandbox's last restore went (`Node::last_restore`): for the
/// benchmarks, and the log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RestoreReport {
    /// Whether the snapshot came from the object store (else from its local copy).
    pub from_store: bool,
    /// From the store: keys unwrapped, the manifest fetched, opened and checked, the
    /// template found.
    pub prepared: Duration,
    /// From the store: fetching, opening and writing the chunks.
    pub fetch: Option<FetchReport>,
    /// The VM started on the files and its device state loaded.
    pub vm_started: Duration,
    /// The guest answering: the identity step, disk and volumes (after `vm_started`).
    pub guest_ready: Duration,
    /// The whole restore, as the caller waited for it.
    pub total: Duration,
    /// A lazy restore: laying out the files, fetching the device state, mounting (part of
    /// `fetch`'s place: `fetch` is `None`).
    pub opened: Duration,
    /// A lazy restore: what filling the files in did, once they are whole.
    pub lazy: Option<space_archive::lazy::LazyReport>,
    /// A lazy restore with a prefetch list: the list's chunks, and how long the VM, its
    /// device state loaded, waited for them paused (part of `vm_started`).
    pub prefetch: Option<(usize, Duration)>,
    /// A lazy restore: how long moving the VM to a new VMM on its local files took, once they
    /// were whole (the guest stopped for most of it).
    pub handed_over: Option<Duration>,
}

impl Incoming {
    /// The directory to give the runtime as the snapshot.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Removes what is left once the VM has loaded (or failed to).
    pub(crate) fn remove(self) {
        if let Err(e) = remove_dir_if_any(&self.dir) {
            tracing::warn!(error = %e, "removing a fetched snapshot's leftovers");
        }
    }
}

/// Fetches archived full snapshot `snap` of `r` for a restore into the sandbox directory
/// `sandbox_dir`: the RAM file and the disk straight into it, not synced (they are the VM's
/// own files, which never need to be durable: the snapshot is in the store). Going through
/// the snapshot directory instead would write every fetched byte out before the VM starts (a
/// reflink clone flushes its source). The snapshot's own local copy, the cache, is fetched
/// again later by the archive pass ([`fetch_snapshot`]).
pub(crate) async fn fetch_for_restore(
    ctx: &Ctx,
    cfg: &ArchiveConfig,
    r: &SandboxRecord,
    snap: &SnapshotId,
    hash: &str,
    sandbox_dir: &Path,
) -> Result<Incoming> {
    let t0 = std::time::Instant::now();
    let (keys, m, t) = prepare(ctx, cfg, r, snap, hash).await?;
    let prepared = t0.elapsed();
    let dir = sandbox_dir.join(".incoming");
    let fetch = materialize_to(ctx, cfg, keys, &m, &dir, Some(&t.dir), false).await?;
    let incoming = Incoming {
        dir,
        prepared,
        fetch,
    };
    let placed = (|| {
        fix_kernel_path(&incoming.dir.join("manifest.json"), &t.kernel())?;
        for f in ["mem", "rootfs.ext4"] {
            let to = sandbox_dir.join(f);
            std::fs::rename(incoming.dir.join(f), &to).map_err(NodeError::io("placing", &to))?;
        }
        Ok(())
    })();
    if let Err(e) = placed {
        for f in ["mem", "rootfs.ext4"] {
            let _ = std::fs::remove_file(sandbox_dir.join(f));
        }
        incoming.remove();
        return Err(e);
    }
    tracing::info!(id = %r.id, snapshot = %snap, took = ?t0.elapsed(), "snapshot fetched from the object store into the sandbox");
    Ok(incoming)
}

/// Where a lazy restore keeps its local files in the sandbox directory: the RAM file and
/// the disk fill in here while the VM runs on the mounts over `mem` and `rootfs.ext4`; the
/// device state and the runtime's manifest come whole.
pub(crate) const LAZY_DIR: &str = ".lazy";

/// What [`fetch_lazy`] made: the mounted files, and the directory to give the runtime as the
/// snapshot (the device state and the manifest).
pub(crate) struct LazyIncoming {
    /// Taken by whoever starts filling the files in.
    pub(crate) restore: Option<super::LazyRestore>,
    pub(crate) dir: PathBuf,
    /// Keys unwrapped, the manifest fetched, opened and checked, the template found.
    pub(crate) prepared: Duration,
    /// Laying the files out, fetching the device state, mounting.
    pub(crate) opened: Duration,
}

/// Makes archived full snapshot `snap` of `r` usable for a restore into `sandbox_dir` before
/// its RAM and disk have arrived: the files laid out in [`LAZY_DIR`] (base template clones,
/// holes), the device state and manifest fetched whole, and the RAM file and disk mounted
/// over their paths in the sandbox directory, served from there as their chunks arrive
/// (`space_archive::lazy`). The caller starts filling them in (`LazyFiles::hydrate`).
pub(crate) async fn fetch_lazy(
    ctx: &Ctx,
    cfg: &ArchiveConfig,
    opts: space_archive::lazy::LazyOptions,
    r: &SandboxRecord,
    snap: &SnapshotId,
    hash: &str,
    sandbox_dir: &Path,
) -> Result<LazyIncoming> {
    let t0 = std::time::Instant::now();
    let (keys, m, t) = prepare(ctx, cfg, r, snap, hash).await?;
    let prepared = t0.elapsed();
    let dir = sandbox_dir.join(LAZY_DIR);
    {
        let d = dir.clone();
        blocking(move || {
            remove_dir_if_any(&d)?;
            std::fs::create_dir_all(&d).map_err(NodeError::io("creating", &d))
        })
        .await?;
    }
    let mut opts = opts;
    opts.lazy = vec![MEM_FILE.into(), DISK_FILE.into()];
    if opts.prefetch.is_empty() && opts.use_manifest_prefetch {
        opts.prefetch = m.prefetch.clone();
    }
    let made = async {
        let files = space_archive::lazy::LazyFiles::open(
            &cfg.archive,
            keys,
            &m,
            &dir,
            Some(&t.dir),
            clone_with(ctx),
            opts,
        )
        .await
        .map_err(|e| {
            NodeError::Archive(format!(
                "fetching snapshot {} of {}: {e}",
                m.snapshot, m.sandbox
            ))
        })?;
        fix_kernel_path(&dir.join("manifest.json"), &t.kernel())?;
        let rt = tokio::runtime::Handle::current();
        let mut mounts = Vec::new();
        for name in [MEM_FILE, DISK_FILE] {
            let fi = files.lazy_file(name).ok_or_else(|| {
                NodeError::Archive(format!(
                    "snapshot {} of {} has no {name}",
                    m.snapshot, m.sandbox
                ))
            })?;
            let at = sandbox_dir.join(name);
            let (f, rt) = (files.clone(), rt.clone());
            mounts.push(
                blocking(move || super::lazy_mount::LazyMount::mount(&at, &f, fi, rt)).await?,
            );
        }
        Ok::<_, NodeError>(super::LazyRestore { files, mounts })
    }
    .await;
    match made {
        Ok(restore) => {
            tracing::info!(id = %r.id, snapshot = %snap, took = ?t0.elapsed(), "snapshot mounted from the object store into the sandbox, filling in");
            Ok(LazyIncoming {
                restore: Some(restore),
                dir,
                prepared,
                opened: t0.elapsed() - prepared,
            })
        }
        Err(e) => {
            for name in [MEM_FILE, DISK_FILE] {
                let _ = super::detach(&sandbox_dir.join(name));
            }
            let _ = remove_dir_if_any(&dir);
            Err(e)
        }
    }
}
