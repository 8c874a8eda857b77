//! Copies of volumes in the object store (`docs/volumes.md`, *Copies in the object store*):
//! what a volume's node sends up while the volume changes, and what a node that takes the
//! volume over brings down.
//!
//! A copy is made from a read-only btrfs snapshot of the volume, so it is one moment of the
//! whole tree: every write the volume acknowledged before the snapshot is in it. The tree is
//! walked through a [`Tree`] (beneath the snapshot, never following a link); each regular
//! file is one file of a `space-archive` manifest (named by number) and the tree itself
//! (directories, files, links, owners, modes, times) is the manifest's record. The chunks go
//! up as a snapshot's do (keyed hash, compressed, sealed under the volume's lineage key, which
//! the tenant's key wraps); a file with the inode, size and times it had in the previous copy
//! is not read again.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use space_archive::fetch::DEFAULT_PARALLEL_READS;
use space_archive::upload::{Known, SourceFile, Unchanged, UploadSpec};
use space_archive::volumes::{copy_name, VolumeHead};
use space_archive::Manifest;
use space_proto::volume::{join, EntryKind};
use space_volume::{Change, Tree};

use crate::archive::{key_error, ArchiveConfig};
use crate::error::{NodeError, Result};
use crate::record::now_ms;
use crate::sandbox::Ctx;
use crate::storage::DriverKind;
use crate::template::blocking;

/// Copies of a volume kept in the store: the newest and the one before it (a reader that
/// found the older head still finds its manifest).
const KEEP_COPIES: usize = 2;

/// The tree of a copy: the manifest's record.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct CopyRecord {
    /// `volume`.
    pub kind: String,
    /// The volume's size when copied.
    pub size_bytes: u64,
    /// Every entry, each directory before what is in it.
    pub entries: Vec<CopyEntry>,
}

/// One entry of a copied tree.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct CopyEntry {
    /// Its path in the volume.
    pub path: String,
    /// `d`, `f` or `l`.
    pub kind: char,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime_ns: i64,
    /// A file's name in the manifest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// A link's target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// A file's inode, size, mtime and ctime on the copying node: equal next time, the file
    /// is taken as unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stamp: Option<[i64; 4]>,
}

/// What the node knows of a volume's copies.
#[derive(Default)]
pub(crate) struct CopyState {
    /// The tree's change count the newest copy was made at.
    pub copied_changes: Option<u64>,
    /// The newest copy's number and manifest.
    pub last: Option<(u64, Arc<Manifest>)>,
    /// When the newest copy's snapshot was taken: writes acknowledged before are in it.
    pub synced_unix_ms: Option<u64>,
    /// Why the last attempt failed, if it did.
    pub error: Option<String>,
}

/// Whether volume copies can be made here: they need a snapshot of the live tree.
pub(crate) fn supported(ctx: &Ctx) -> bool {
    ctx.storage.kind() == DriverKind::Btrfs
}

fn archive_err(what: &str) -> impl Fn(space_archive::StoreError) -> NodeError + '_ {
    move |e| NodeError::Archive(format!("{what}: {e}"))
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// A file to upload: its name in the manifest, its path, its stamp.
type ToSend = (String, PathBuf, [i64; 4]);

/// Walks `tree` (a snapshot): its entries, and the files to upload under their numbers.
fn walk(tree: &Tree, dir: &Path) -> Result<(Vec<CopyEntry>, Vec<ToSend>)> {
    let mut entries = Vec::new();
    let mut files = Vec::new();
    let mut stack = vec![String::new()];
    let err = |path: &str| {
        let path = path.to_owned();
        move |e: nix::errno::Errno| {
            NodeError::internal(format!("walking the volume's snapshot at {path:?}: {e}"))
        }
    };
    while let Some(d) = stack.pop() {
        let mut after: Option<String> = None;
        let mut subdirs = Vec::new();
        loop {
            let (page, more) = tree.read_dir(&d, after.as_deref()).map_err(err(&d))?;
            for e in &page {
                let path = join(&d, &e.name);
                let a = &e.attr;
                let mut entry = CopyEntry {
                    path: path.clone(),
                    kind: 'f',
                    mode: a.mode,
                    uid: a.uid,
                    gid: a.gid,
                    mtime_ns: a.mtime_ns,
                    file: None,
                    target: None,
                    stamp: None,
                };
                match a.kind {
                    EntryKind::Dir => {
                        entry.kind = 'd';
                        subdirs.push(path);
                    }
                    EntryKind::Symlink => {
                        entry.kind = 'l';
                        entry.target = Some(tree.read_link(&entry.path).map_err(err(&path))?);
                    }
                    EntryKind::File => {
                        let name = format!("{:07}", files.len());
                        let stamp = [a.ino as i64, a.size as i64, a.mtime_ns, a.ctime_ns];
                        files.push((name.clone(), dir.join(&entry.path), stamp));
                        entry.file = Some(name);
                        entry.stamp = Some(stamp);
                    }
                    // The host makes no other kind; one that is there is not copied.
                    EntryKind::Other => continue,
                }
                entries.push(entry);
            }
            if !more {
                break;
            }
            after = page.last().map(|e| e.name.clone());
        }
        // Depth first, in name order.
        stack.extend(subdirs.into_iter().rev());
    }
    Ok((entries, files))
}

/// Makes a copy of volume `id` in the store if it changed since the last one; answers when
/// the newest copy's snapshot was taken.
pub(crate) async fn copy(ctx: &Arc<Ctx>, cfg: &ArchiveConfig, id: &str) -> Result<Option<u64>> {
    let _one = ctx.volumes.copy_lock.lock().await;
    let vols = &ctx.volumes;
    let changes = vols.open(id)?.changes();
    // Unchanged (every pass of the loop, for most volumes): nothing read from disk.
    let (copied, last, synced) =
        vols.with_copy(id, |c| (c.copied_changes, c.last.clone(), c.synced_unix_ms));
    if copied == Some(changes) {
        return Ok(synced);
    }
    let meta = vols.meta(id)?;
    if meta.tenant.is_empty() {
        return Err(NodeError::Invalid(format!(
            "volume {id} has no tenant recorded (made before copies were kept): it is not copied"
        )));
    }
    if ctx.fenced.load(std::sync::atomic::Ordering::SeqCst) {
        return Err(NodeError::Archive(
            "this node is fenced: no copy is made".into(),
        ));
    }
    let a = &cfg.archive;
    let head = a
        .volume_head(id)
        .await
        .map_err(archive_err("reading the volume's head"))?;
    if let Some(h) = &head {
        if h.epoch > meta.epoch {
            return Err(NodeError::Archive(format!(
                "volume {id} moved to another node (the store's copy is of epoch {}, this node's \
                 of {}): no copy is made",
                h.epoch, meta.epoch
            )));
        }
    }
    let keys = cfg
        .keyring
        .lineage_keys(&meta.tenant, id, true, false)
        .await
        .map_err(key_error)?;
    // The previous copy: from memory, or from the store after a restart.
    let last = match (last, &head) {
        (Some(l), _) => Some(l),
        (None, Some(h)) => Some((h.seq, Arc::new(read_manifest(cfg, &keys, h).await?))),
        (None, None) => None,
    };
    let seq = last
        .as_ref()
        .map(|(s, _)| *s)
        .max(head.as_ref().map(|h| h.seq))
        .unwrap_or(0)
        + 1;

    // The moment: the change count first, then the snapshot.
    let synced = now_ms();
    let snap = vols.dir.join(format!(".copy-{id}"));
    let (storage, root, s2) = (ctx.storage.clone(), vols.dir.join(id), snap.clone());
    blocking(move || {
        storage.delete_volume(&s2)?;
        Ok(storage.snapshot_volume(&root, &s2, true)?)
    })
    .await?;
    let made = async {
        let s2 = snap.clone();
        let (entries, files) = blocking(move || {
            let t = Tree::open(&s2, u64::MAX)
                .map_err(NodeError::io("opening the volume's snapshot", s2.clone()))?;
            walk(&t, &s2)
        })
        .await?;
        let mut known = Known::default();
        let mut stamps: HashMap<[i64; 4], String> = HashMap::new();
        if let Some((_, m)) = &last {
            known.add_manifest(m);
            if let Ok(r) = serde_json::from_value::<CopyRecord>(m.record.clone()) {
                for e in r.entries {
                    if let (Some(s), Some(f)) = (e.stamp, e.file) {
                        stamps.insert(s, f);
                    }
                }
            }
        }
        let sources = files
            .iter()
            .map(|(name, path, stamp)| SourceFile {
                name: name.clone(),
                path: path.clone(),
                base: None,
                unchanged: last
                    .as_ref()
                    .and_then(|(_, m)| stamps.get(stamp).and_then(|f| Unchanged::of(m, f))),
            })
            .collect();
        let record = CopyRecord {
            kind: "volume".into(),
            size_bytes: meta.size_bytes,
            entries,
        };
        let spec = UploadSpec {
            tenant: meta.tenant.clone(),
            lineage: id.to_owned(),
            sandbox: id.to_owned(),
            snapshot: copy_name(seq),
            manifest_path: a
                .volume_manifest_path(id, seq)
                .map_err(archive_err("manifest path"))?,
            chunk_size: cfg.chunk_size,
            pack_target: cfg.pack_target,
            base: None,
            host: None,
            record: serde_json::to_value(&record).expect("a record serializes"),
            files: sources,
            previous: None,
            prefetch: Vec::new(),
        };
        let (m, report) = space_archive::upload(a, keys.clone(), spec, &known)
            .await
            .map_err(|e| NodeError::Archive(format!("copying volume {id}: {e}")))?;
        // The head, unless the volume moved meanwhile or this node is fenced.
        if let Some(h) = a
            .volume_head(id)
            .await
            .map_err(archive_err("reading the volume's head"))?
        {
            if h.epoch > meta.epoch {
                return Err(NodeError::Archive(format!(
                    "volume {id} moved to another node while it was copied: the copy is dropped"
                )));
            }
        }
        if ctx.fenced.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(NodeError::Archive(
                "this node is fenced: the copy is dropped".into(),
            ));
        }
        a.put_volume_head(&VolumeHead {
            format: 1,
            volume: id.to_owned(),
            tenant: meta.tenant.clone(),
            seq,
            manifest_hash: report.manifest_hash.clone(),
            synced_unix_ms: synced,
            updated_unix_ms: now_ms(),
            epoch: meta.epoch,
            node: hostname(),
        })
        .await
        .map_err(archive_err("writing the volume's head"))?;
        tracing::info!(
            volume = %id, seq, files = m.files.len(), new_chunks = report.new_chunks,
            reused = report.reused, bytes = report.uploaded_bytes, took = ?report.elapsed,
            "volume copied"
        );
        Ok::<_, NodeError>(m)
    }
    .await;
    let (storage, s2) = (ctx.storage.clone(), snap.clone());
    if let Err(e) = blocking(move || Ok(storage.delete_volume(&s2)?)).await {
        tracing::warn!(volume = %id, error = %e, "removing a copy's snapshot");
    }
    let m = match made {
        Ok(m) => m,
        Err(e) => {
            vols.with_copy(id, |c| c.error = Some(e.to_string()));
            return Err(e);
        }
    };
    vols.with_copy(id, |c| {
        c.copied_changes = Some(changes);
        c.last = Some((seq, Arc::new(m)));
        c.synced_unix_ms = Some(synced);
        c.error = None;
    });
    // Older copies go; their packs go with garbage collection once nothing names them.
    match a.volume_copies(id).await {
        Ok(all) if all.len() > KEEP_COPIES => {
            for (s, p) in &all[..all.len() - KEEP_COPIES] {
                if *s < seq {
                    if let Err(e) = a.delete(p).await {
                        tracing::warn!(volume = %id, copy = s, error = %e, "deleting an old copy");
                    }
                }
            }
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(volume = %id, error = %e, "listing the volume's copies"),
    }
    Ok(Some(synced))
}

async fn read_manifest(
    cfg: &ArchiveConfig,
    keys: &space_archive::crypto::LineageKeys,
    h: &VolumeHead,
) -> Result<Manifest> {
    let a = &cfg.archive;
    let p = a
        .volume_manifest_path(&h.volume, h.seq)
        .map_err(archive_err("manifest path"))?;
    let object = a
        .get_bounded(&p, space_archive::manifest::MAX_MANIFEST_BYTES as u64)
        .await
        .map_err(archive_err("reading the volume's copy"))?
        .ok_or_else(|| {
            NodeError::Archive(format!(
                "copy {} of volume {} is not in the object store",
                h.seq, h.volume
            ))
        })?;
    Manifest::decode(
        &object,
        Some(&h.manifest_hash),
        keys,
        &h.volume,
        &copy_name(h.seq),
    )
    .map_err(|e| NodeError::Archive(format!("copy {} of volume {}: {e}", h.seq, h.volume)))
}

/// Brings volume `id` of `tenant` from its newest copy in the store into the new directory
/// `dest` (made here, on the volumes' filesystem); `None` when the store has no copy.
pub(crate) async fn restore(
    ctx: &Arc<Ctx>,
    cfg: &ArchiveConfig,
    id: &str,
    tenant: &str,
    dest: &Path,
) -> Result<Option<VolumeHead>> {
    let a = &cfg.archive;
    let Some(head) = a
        .volume_head(id)
        .await
        .map_err(archive_err("reading the volume's head"))?
    else {
        return Ok(None);
    };
    if head.tenant != tenant {
        return Err(NodeError::VolumeNotFound(id.to_owned()));
    }
    let keys = cfg
        .keyring
        .lineage_keys(tenant, id, false, true)
        .await
        .map_err(key_error)?;
    let m = read_manifest(cfg, &keys, &head).await?;
    let record: CopyRecord = serde_json::from_value(m.record.clone())
        .map_err(|e| NodeError::Archive(format!("copy {} of volume {id}: {e}", head.seq)))?;
    let (storage, d2) = (ctx.storage.clone(), dest.to_owned());
    blocking(move || {
        storage.delete_volume(&d2)?;
        Ok(storage.create_volume(&d2)?)
    })
    .await?;
    // The files come down into a directory of the new volume, then move into place.
    let staging = format!(".space-restore-{}", copy_name(head.seq));
    let clone = crate::archive::clone_with(ctx);
    std::fs::create_dir(dest.join(&staging))
        .map_err(NodeError::io("making", dest.join(&staging)))?;
    // Unsynced: one `syncfs` below makes the whole volume durable, rather than a sync per file.
    space_archive::materialize_unsynced(
        a,
        keys,
        &m,
        &dest.join(&staging),
        None,
        clone,
        DEFAULT_PARALLEL_READS,
    )
    .await
    .map_err(|e| NodeError::Archive(format!("fetching copy {} of volume {id}: {e}", head.seq)))?;
    let d2 = dest.to_owned();
    blocking(move || {
        build(&d2, &staging, &record)?;
        let root = std::fs::File::open(&d2).map_err(NodeError::io("opening", d2.clone()))?;
        nix::unistd::syncfs(std::os::fd::AsRawFd::as_raw_fd(&root))
            .map_err(|e| NodeError::io("syncing", d2.clone())(e.into()))
    })
    .await?;
    Ok(Some(head))
}

/// Puts the entries of `record` into the volume at `dest`, the files from `staging`.
fn build(dest: &Path, staging: &str, record: &CopyRecord) -> Result<()> {
    let tree = Tree::open(dest, u64::MAX)
        .map_err(NodeError::io("opening the volume", dest.to_path_buf()))?;
    let bad = |path: &str, what: &str, e: nix::errno::Errno| {
        NodeError::Archive(format!("restoring {path:?} ({what}): {e}"))
    };
    for e in &record.entries {
        if e.path == staging || e.path.starts_with(&format!("{staging}/")) {
            return Err(NodeError::Archive(format!("a copy names {:?}", e.path)));
        }
    }
    let owner = |e: &CopyEntry| (e.uid, e.gid);
    // Directories and files first; links last, so that no later step walks through one.
    for e in &record.entries {
        match e.kind {
            'd' => {
                tree.mkdir(&e.path, 0o700, owner(e))
                    .map_err(|x| bad(&e.path, "a directory", x))?;
            }
            'f' => {
                let f = e.file.as_deref().unwrap_or_default();
                tree.rename(&join(staging, f), &e.path, true, false)
                    .map_err(|x| bad(&e.path, "a file", x))?;
                tree.set_attr(
                    &e.path,
                    Change {
                        mode: Some(e.mode),
                        uid: Some(e.uid),
                        gid: Some(e.gid),
                        mtime_ns: Some(e.mtime_ns),
                        ..Change::default()
                    },
                )
                .map_err(|x| bad(&e.path, "a file's attributes", x))?;
            }
            _ => {}
        }
    }
    for e in record.entries.iter().filter(|e| e.kind == 'l') {
        let target = e.target.as_deref().unwrap_or_default();
        tree.symlink(&e.path, target, owner(e))
            .map_err(|x| bad(&e.path, "a link", x))?;
        let _ = tree.set_attr(
            &e.path,
            Change {
                mtime_ns: Some(e.mtime_ns),
                ..Change::default()
            },
        );
    }
    tree.remove_all(staging)
        .map_err(|x| bad(staging, "the staging directory", x))?;
    // Directory modes and times last, deepest first (filling them changed their times).
    for e in record.entries.iter().rev().filter(|e| e.kind == 'd') {
        tree.set_attr(
            &e.path,
            Change {
                mode: Some(e.mode),
                mtime_ns: Some(e.mtime_ns),
                ..Change::default()
            },
        )
        .map_err(|x| bad(&e.path, "a directory's attributes", x))?;
    }
    Ok(())
}
