//! The node's side of the object store (`docs/archive.md`): snapshots go up on suspend and on
//! a schedule, come back down when a restore finds no local copy, and a node with an empty data
//! directory finds every archived sandbox in the store.
//!
//! The format itself (chunks, packs, manifests, keys) is `space-archive`. This module decides
//! what goes up and when, names the base template of each file, keeps the record in step, and
//! materializes snapshots and templates into the data directory the way the rest of the node
//! expects them (a complete read-only volume, or nothing).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use space_archive::crypto::LineageKeys;
use space_archive::fetch::DEFAULT_PARALLEL_READS;
use space_archive::upload::{
    Known, Previous, SourceFile, UploadSpec, DEFAULT_CHUNK_SIZE, DEFAULT_PACK_TARGET,
};
use space_archive::{Archive, HostInfo, KeyError, Keyring, Manifest};

use crate::error::{NodeError, Result};
use crate::ids::{SandboxId, SnapshotId, VersionReq};
use crate::record::{now_ms, RemoteCopy, SandboxRecord, SnapshotKind, State};
use crate::sandbox::{Ctx, Request};
use crate::template::blocking;

pub use space_archive::keys::TEMPLATE_TENANT;
/// Files of a full snapshot, in upload order.
const SNAPSHOT_FILES: &[&str] = &["mem", "rootfs.ext4", "state", "manifest.json"];
/// Files of a template build.
const TEMPLATE_FILES: &[&str] = &[
    "vmlinux",
    "rootfs.ext4",
    "snapshot/mem",
    "snapshot/rootfs.ext4",
    "snapshot/state",
    "snapshot/manifest.json",
    "template.json",
];

/// [`ArchiveConfig::volume_copy_interval`] by default.
pub const DEFAULT_VOLUME_COPY_INTERVAL: Duration = Duration::from_secs(10);

/// How a node uses the object store.
#[derive(Clone)]
pub struct ArchiveConfig {
    /// The store.
    pub archive: Archive,
    /// The key hierarchy over it.
    pub keyring: Arc<Keyring>,
    /// Chunk size of new manifests.
    pub chunk_size: u32,
    /// Pack size target.
    pub pack_target: usize,
    /// The newest full snapshot of every running sandbox goes up this often (`None`: only on
    /// suspend and request).
    pub upload_interval: Option<Duration>,
    /// Local copies of snapshots of suspended sandboxes that are also in the store are a
    /// cache: evicted, least recently suspended first, while they take more than this.
    /// `Some(0)` evicts each right after its upload; `None` never evicts by size.
    pub cache_max_bytes: Option<u64>,
    /// ... and while the data directory's filesystem has less free space than this.
    pub min_free_bytes: u64,
    /// How often each volume that changed is copied to the store (`docs/volumes.md`): the
    /// most a node's loss can cost of a volume's acknowledged writes is about this plus one
    /// copy's time. `None`: only on request.
    pub volume_copy_interval: Option<Duration>,
    /// Whether this node collects the store's garbage (hourly). A node of a cluster does
    /// not: the control plane does, once for the whole shared store.
    pub collect_garbage: bool,
    /// How a restore from the store fetches: lazily with these options (the VM starts
    /// before its RAM and disk have arrived; `docs/archive.md`, *Lazy restore*), or, `None`,
    /// everything before the VM starts.
    pub lazy: Option<space_archive::lazy::LazyOptions>,
}

impl std::fmt::Debug for ArchiveConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArchiveConfig")
            .field("archive", &self.archive.name())
            .field("chunk_size", &self.chunk_size)
            .field("upload_interval", &self.upload_interval)
            .field("cache_max_bytes", &self.cache_max_bytes)
            .finish()
    }
}

impl ArchiveConfig {
    /// Defaults over `archive` and `keyring`: 256 KiB chunks, 32 MiB packs, a full snapshot
    /// of each running sandbox uploaded every minute (an idle guest's costs its vCPUs about
    /// 6 ms and the store under 0.1 MiB: `docs/archive.md`), a cache limited by free space
    /// (2 GiB kept free), lazy restores.
    pub fn new(archive: Archive, keyring: Arc<Keyring>) -> ArchiveConfig {
        ArchiveConfig {
            archive,
            keyring,
            chunk_size: DEFAULT_CHUNK_SIZE,
            pack_target: DEFAULT_PACK_TARGET,
            upload_interval: Some(Duration::from_secs(60)),
            cache_max_bytes: None,
            min_free_bytes: 2 << 30,
            volume_copy_interval: Some(DEFAULT_VOLUME_COPY_INTERVAL),
            collect_garbage: true,
            lazy: Some(space_archive::lazy::LazyOptions {
                hold_background: Some(BACKGROUND_HOLD),
                ..Default::default()
            }),
        }
    }
}

/// The longest a lazy restore holds its background reads back while its VM starts; they
/// begin [`BACKGROUND_GRACE`] after the guest answers, or after this, whichever is first.
pub(crate) const BACKGROUND_HOLD: Duration = Duration::from_secs(10);

/// How long after a lazily restored guest answers its background reads begin: its first
/// requests have the cores to themselves (on a small node the filling's reads, opening and
/// checking compete with the VM for them).
pub(crate) const BACKGROUND_GRACE: Duration = Duration::from_secs(1);

/// How restores from the store fetch, when a measurement compares them
/// ([`crate::Node::set_restore_mode`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum RestoreMode {
    /// As [`ArchiveConfig::lazy`] says.
    AsConfigured = 0,
    /// Everything before the VM starts.
    Eager = 1,
    /// Lazily (with [`ArchiveConfig::lazy`]'s options or the defaults), without the
    /// snapshot's prefetch list.
    LazyUnordered = 2,
    /// Lazily, with the snapshot's prefetch list.
    Lazy = 3,
}

impl RestoreMode {
    pub(crate) fn from_u8(n: u8) -> RestoreMode {
        match n {
            1 => RestoreMode::Eager,
            2 => RestoreMode::LazyUnordered,
            3 => RestoreMode::Lazy,
            _ => RestoreMode::AsConfigured,
        }
    }

    /// The lazy options a restore uses under this mode (`None`: eager).
    pub(crate) fn lazy_options(
        self,
        configured: Option<&space_archive::lazy::LazyOptions>,
    ) -> Option<space_archive::lazy::LazyOptions> {
        let or_default = || configured.cloned().unwrap_or_default();
        match self {
            RestoreMode::AsConfigured => configured.cloned(),
            RestoreMode::Eager => None,
            RestoreMode::Lazy => Some(or_default()),
            RestoreMode::LazyUnordered => {
                let mut o = or_default();
                o.prefetch = Vec::new();
                o.use_manifest_prefetch = false;
                Some(o)
            }
        }
    }
}

/// The node's storage driver's clone, as fetches use it.
pub(crate) fn clone_with(ctx: &Ctx) -> space_archive::CloneFile {
    let storage = ctx.storage.clone();
    Arc::new(move |src: &Path, dst: &Path| {
        storage
            .clone_file(src, dst)
            .map(|_| ())
            .map_err(|e| std::io::Error::other(e.to_string()))
    })
}

pub(crate) fn key_error(e: KeyError) -> NodeError {
    match e {
        KeyError::Store(s) => NodeError::Archive(s.to_string()),
        other => NodeError::Key(other.to_string()),
    }
}

fn archive_error<E: std::fmt::Display>(what: &str) -> impl Fn(E) -> NodeError + '_ {
    move |e| NodeError::Archive(format!("{what}: {e}"))
}

/// What this host is, as a manifest records it.
pub(crate) fn host_info(ctx: &Ctx) -> HostInfo {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |name: &str| {
        cpuinfo
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_owned())
            .unwrap_or_default()
    };
    HostInfo {
        qemu: ctx.runtime.version().to_string(),
        accel: ctx.runtime.accel().to_string(),
        cpu_model: field("model name"),
        cpu_flags: blake3::hash(field("flags").as_bytes()).to_hex().to_string(),
    }
}

/// Refuses a snapshot this host cannot load: another QEMU build or accelerator, or under KVM
/// another CPU feature set (the guest saw the host's CPU).
pub(crate) fn check_host(ctx: &Ctx, m: &Manifest) -> Result<()> {
    let Some(h) = &m.host else { return Ok(()) };
    let me = host_info(ctx);
    if h.qemu != me.qemu || h.accel != me.accel {
        return Err(NodeError::Invalid(format!(
            "snapshot {} of {} was taken with QEMU {} under {}; this node runs QEMU {} under {}",
            m.snapshot, m.sandbox, h.qemu, h.accel, me.qemu, me.accel
        )));
    }
    if me.accel == "kvm" && h.cpu_flags != me.cpu_flags {
        return Err(NodeError::Invalid(format!(
            "snapshot {} of {} was taken under KVM on a {} with other CPU features than this \
             node's {}",
            m.snapshot, m.sandbox, h.cpu_model, me.cpu_model
        )));
    }
    Ok(())
}

mod adopt;
mod background;
mod lazy_mount;
mod restore;
mod templates;

pub(crate) use adopt::{adopt_archived, adopt_moved};
pub use background::ArchiveReport;
pub(crate) use background::{pass, shred_expired, UploadJob, ARCHIVE_TICK};
pub(crate) use lazy_mount::{detach, LazyRestore};
pub use restore::RestoreReport;

pub(crate) use restore::{
    fetch_for_restore, fetch_lazy, fetch_snapshot, Incoming, LazyIncoming, LAZY_DIR,
};
pub use space_archive::gc::GC_EVERY;
pub(crate) use templates::{local_template, published, template_base};

/// Points a runtime snapshot manifest at this node's copy of the kernel.
pub(super) fn fix_kernel_path(manifest: &Path, kernel: &Path) -> Result<()> {
    let mut m = space_runtime::Manifest::read(manifest)
        .map_err(|e| NodeError::Archive(format!("fetched snapshot manifest: {e}")))?;
    m.kernel.path = kernel.to_owned();
    std::fs::remove_file(manifest).map_err(NodeError::io("replacing", manifest))?;
    m.write(manifest)
        .map_err(|e| NodeError::Archive(format!("writing {}: {e}", manifest.display())))
}

/// Fetches `m` into a new volume `dir` (removed again on any failure), synced.
pub(super) async fn materialize_into(
    ctx: &Ctx,
    cfg: &ArchiveConfig,
    keys: Arc<LineageKeys>,
    m: &Manifest,
    dir: &Path,
    base_dir: Option<&Path>,
) -> Result<()> {
    materialize_to(ctx, cfg, keys, m, dir, base_dir, true)
        .await
        .map(drop)
}

/// Fetches `m` into `dir` (a plain directory, made anew, removed again on any failure) with
/// `volume`: as a new volume, synced; else as a plain directory, not synced (files a VM is
/// about to start from).
async fn materialize_to(
    ctx: &Ctx,
    cfg: &ArchiveConfig,
    keys: Arc<LineageKeys>,
    m: &Manifest,
    dir: &Path,
    base_dir: Option<&Path>,
    volume: bool,
) -> Result<space_archive::FetchReport> {
    let remove = {
        let (s, d) = (ctx.storage.clone(), dir.to_owned());
        move || {
            if volume {
                Ok(s.delete_volume(&d)?)
            } else {
                remove_dir_if_any(&d)
            }
        }
    };
    {
        let (s, d, remove) = (ctx.storage.clone(), dir.to_owned(), remove.clone());
        blocking(move || {
            remove()?;
            if volume {
                Ok(s.create_volume(&d)?)
            } else {
                std::fs::create_dir_all(&d).map_err(NodeError::io("creating", &d))
            }
        })
        .await?;
    }
    let clone = clone_with(ctx);
    let a = &cfg.archive;
    let r = if volume {
        space_archive::materialize(a, keys, m, dir, base_dir, clone, DEFAULT_PARALLEL_READS).await
    } else {
        space_archive::materialize_unsynced(
            a,
            keys,
            m,
            dir,
            base_dir,
            clone,
            DEFAULT_PARALLEL_READS,
        )
        .await
    };
    match r {
        Ok(report) => {
            tracing::debug!(dir = %dir.display(), chunks = report.chunks, deltas = report.deltas, bytes = report.fetched_bytes, reads = report.reads, syncing = ?report.syncing, took = ?report.elapsed, "fetched");
            Ok(report)
        }
        Err(e) => {
            let _ = blocking(remove).await;
            Err(NodeError::Archive(format!(
                "fetching snapshot {} of {}: {e}",
                m.snapshot, m.sandbox
            )))
        }
    }
}

fn remove_dir_if_any(dir: &Path) -> Result<()> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(NodeError::io("removing", dir)(e)),
    }
}

// ---- sandbox snapshots ---------------------------------------------------------------

/// The chunks the lineage already has that a new upload of `r` can reuse: those of the
/// sandbox's newest archived snapshot, or for a fork's first upload, its parent's; with that
/// snapshot's files when this node has them, for page deltas.
async fn known_chunks(
    ctx: &Ctx,
    cfg: &ArchiveConfig,
    r: &SandboxRecord,
    keys: &LineageKeys,
) -> (Known, Option<Previous>) {
    let mut known = Known::default();
    let a = &cfg.archive;
    let newest = r.snapshots.iter().rev().find_map(|s| {
        s.remote
            .as_ref()
            .map(|rc| (r.id.to_string(), s.id.to_string(), rc.manifest_hash.clone()))
    });
    let from = match newest {
        Some(x) => Some(x),
        None => match &r.forked_from {
            Some((parent, _)) => a
                .head(parent.as_str())
                .await
                .ok()
                .flatten()
                .filter(|h| h.lineage == r.lineage())
                .map(|h| (h.sandbox, h.snapshot, h.manifest_hash)),
            None => None,
        },
    };
    let mut previous = None;
    if let Some((sandbox, snapshot, hash)) = from {
        match fetch_manifest(cfg, keys, &sandbox, &snapshot, &hash).await {
            Ok(m) => {
                known.add_manifest(&m);
                previous = ctx
                    .layout
                    .snapshot_dir(&sandbox, &snapshot)
                    .ok()
                    .filter(|d| full_snapshot_present(d))
                    .map(|dir| Previous {
                        manifest: Arc::new(m),
                        dir,
                    });
            }
            Err(e) => {
                tracing::warn!(id = %r.id, error = %e, "previous manifest unreadable; uploading every chunk")
            }
        }
    }
    (known, previous)
}

async fn fetch_manifest(
    cfg: &ArchiveConfig,
    keys: &LineageKeys,
    sandbox: &str,
    snapshot: &str,
    hash: &str,
) -> Result<Manifest> {
    let a = &cfg.archive;
    let p = a
        .manifest_path(sandbox, snapshot)
        .map_err(archive_error("manifest path"))?;
    let object = a
        .get_bounded(&p, space_archive::manifest::MAX_MANIFEST_BYTES as u64)
        .await
        .map_err(|e| NodeError::Archive(e.to_string()))?
        .ok_or_else(|| {
            NodeError::Archive(format!(
                "the manifest of snapshot {snapshot} of {sandbox} is not in the object store"
            ))
        })?;
    Manifest::decode(&object, Some(hash), keys, sandbox, snapshot)
        .map_err(|e| NodeError::Archive(format!("snapshot {snapshot} of {sandbox}: {e}")))
}

/// Uploads full snapshot `snap` of `r` (its files in `dir`), with `r` as the record the
/// manifest carries; writes the sandbox's head. Returns the remote copy to record.
pub(crate) async fn upload_snapshot(
    ctx: &Ctx,
    cfg: &ArchiveConfig,
    r: &SandboxRecord,
    snap: &SnapshotId,
    dir: &Path,
) -> Result<RemoteCopy> {
    let t = crate::template::resolve(
        &ctx.layout,
        &r.template.name,
        &VersionReq::Exact(r.template.version.clone()),
    )?;
    let base = template_base(ctx, cfg, &t).await?;
    let keys = cfg
        .keyring
        .lineage_keys(&r.tenant, r.lineage(), true, false)
        .await
        .map_err(key_error)?;
    let (known, previous) = known_chunks(ctx, cfg, r, &keys).await;
    let a = &cfg.archive;
    let spec = UploadSpec {
        tenant: r.tenant.clone(),
        lineage: r.lineage().to_owned(),
        sandbox: r.id.to_string(),
        snapshot: snap.to_string(),
        manifest_path: a
            .manifest_path(r.id.as_str(), snap.as_str())
            .map_err(archive_error("manifest path"))?,
        chunk_size: cfg.chunk_size,
        pack_target: cfg.pack_target,
        base: Some(base),
        host: Some(host_info(ctx)),
        record: serde_json::to_value(r).expect("a record serializes"),
        files: SNAPSHOT_FILES
            .iter()
            .map(|f| SourceFile {
                name: (*f).into(),
                path: dir.join(f),
                base: match *f {
                    "mem" => Some(("snapshot/mem".into(), t.dir.join("snapshot/mem"))),
                    "rootfs.ext4" => Some((
                        "snapshot/rootfs.ext4".into(),
                        t.dir.join("snapshot/rootfs.ext4"),
                    )),
                    _ => None,
                },
                unchanged: None,
            })
            .collect(),
        previous,
        prefetch: r.prefetch.clone(),
    };
    let (m, report) = space_archive::upload(a, keys, spec, &known)
        .await
        .map_err(|e| NodeError::Archive(format!("uploading snapshot {snap} of {}: {e}", r.id)))?;
    let head = space_archive::Head {
        format: 1,
        sandbox: r.id.to_string(),
        tenant: r.tenant.clone(),
        lineage: r.lineage().to_owned(),
        snapshot: snap.to_string(),
        manifest_hash: report.manifest_hash.clone(),
        updated_unix_ms: now_ms(),
        terminated: false,
        epoch: r.epoch,
    };
    commit_head(ctx, cfg, r, &head)
        .await
        .map_err(|e| NodeError::Archive(format!("committing snapshot {snap} of {}: {e}", r.id)))?;
    tracing::info!(
        id = %r.id, snapshot = %snap, new_chunks = report.new_chunks, deltas = report.delta_chunks, reused = report.reused,
        zero = report.zero, base = report.base, bytes = report.uploaded_bytes,
        per_file = ?report.new_per_file, took = ?report.elapsed, "snapshot archived"
    );
    Ok(RemoteCopy {
        manifest_hash: report.manifest_hash,
        uploaded_unix_ms: now_ms(),
        uploaded_bytes: report.uploaded_bytes,
        new_chunks: report.new_chunks,
        stored_bytes: m.stored_bytes(),
    })
}

/// Whether a full snapshot's files are complete in `dir`.
pub(crate) fn full_snapshot_present(dir: &Path) -> bool {
    let Ok(m) = space_runtime::Manifest::read(&dir.join("manifest.json")) else {
        return false;
    };
    let len = |n: &str| std::fs::metadata(dir.join(n)).map(|m| m.len()).ok();
    len("mem") == Some(m.memory_bytes())
        && len("state") == Some(m.state_bytes)
        && len("rootfs.ext4").is_some()
}

/// The snapshots among `ids` that have a copy in the store.
pub(crate) fn archived(r: &SandboxRecord, ids: &[SnapshotId]) -> Vec<SnapshotId> {
    r.snapshots
        .iter()
        .filter(|s| s.remote.is_some() && ids.contains(&s.id))
        .map(|s| s.id.clone())
        .collect()
}

/// Deletes the manifests of archived snapshots that retention dropped (their packs go with
/// garbage collection once nothing references them). Failures are logged: an unlisted
/// manifest is only space.
pub(crate) async fn delete_remote(ctx: &Ctx, id: &SandboxId, snaps: &[SnapshotId]) {
    let Some(cfg) = ctx.archive.get() else { return };
    for s in snaps {
        let r = match cfg.archive.manifest_path(id.as_str(), s.as_str()) {
            Ok(p) => cfg.archive.delete(&p).await,
            Err(e) => Err(e),
        };
        if let Err(e) = r {
            tracing::warn!(%id, snapshot = %s, error = %e, "retention: deleting an archived manifest");
        }
    }
}

/// Why a head is not written.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CommitError {
    #[error("{0}")]
    Store(#[from] space_archive::StoreError),
    #[error(
        "the sandbox moved to another node (the store's head is of epoch {theirs}, this \
         node's ownership is of epoch {ours}): nothing is committed"
    )]
    Moved { ours: u64, theirs: u64 },
    #[error("this node is fenced (it could not renew its lease): nothing is committed")]
    Fenced,
}

/// Writes `head` for `r` unless this node may no longer commit for the sandbox: while the
/// node is fenced, or when the store's head is of a newer ownership epoch than the
/// record's (the sandbox was moved to another node, which wrote since). The check is made
/// just before the write; a node fences well before the control plane may move its
/// sandboxes (`docs/cluster.md`), so no commit started before the fence lands after a move.
pub(crate) async fn commit_head(
    ctx: &Ctx,
    cfg: &ArchiveConfig,
    r: &SandboxRecord,
    head: &space_archive::Head,
) -> std::result::Result<(), CommitError> {
    if ctx.fenced.load(std::sync::atomic::Ordering::SeqCst) {
        return Err(CommitError::Fenced);
    }
    if let Some(current) = cfg.archive.head(r.id.as_str()).await? {
        if current.epoch > r.epoch {
            return Err(CommitError::Moved {
                ours: r.epoch,
                theirs: current.epoch,
            });
        }
    }
    if ctx.fenced.load(std::sync::atomic::Ordering::SeqCst) {
        return Err(CommitError::Fenced);
    }
    Ok(cfg.archive.put_head(head).await?)
}

/// Marks a killed sandbox's head as terminated, so no node brings it back from the store.
pub(crate) async fn mark_terminated(ctx: &Ctx, r: &SandboxRecord) {
    let Some(cfg) = ctx.archive.get() else { return };
    if !r.snapshots.iter().any(|s| s.remote.is_some()) {
        return;
    }
    let result = async {
        let Some(mut head) = cfg.archive.head(r.id.as_str()).await? else {
            return Ok(());
        };
        head.terminated = true;
        head.updated_unix_ms = now_ms();
        head.epoch = head.epoch.max(r.epoch);
        commit_head(ctx, cfg, r, &head).await
    }
    .await;
    if let Err(e) = result {
        tracing::error!(id = %r.id, error = %e, "marking a killed sandbox's head in the object store");
    }
}

/// Removes the local copy of a snapshot that is in the store.
pub(crate) async fn evict(ctx: &Ctx, id: &SandboxId, snap: &SnapshotId) -> Result<()> {
    let dir = ctx.layout.snapshot_dir(id.as_str(), snap.as_str())?;
    let s = ctx.storage.clone();
    blocking(move || Ok(s.delete_volume(&dir)?)).await
}
