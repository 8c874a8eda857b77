//! Archiving a snapshot directory: cut every file into chunks, leave out zero chunks and
//! chunks equal to the base template's at the same offset, name the rest by keyed hash, store
//! each chunk the lineage does not have yet (compressed, sealed, packed), then write the flat
//! manifest. Only new chunks travel, so a snapshot after small writes costs a few chunks.
//!
//! A new chunk that differs from the base template's chunk at the same offset, or from the
//! previous snapshot's chunk there, in at most half its pages is stored as a page delta: only
//! those pages (see [`crate::manifest::Delta`]). The previous snapshot's chunk is used only
//! when its local file still holds exactly that chunk (its hash is checked), and a delta
//! always applies to a chunk stored whole or to the template, never to another delta.
//!
//! Order of writes: packs, then the manifest. A manifest is written only after every pack it
//! names is in the store, so a reader never sees a manifest whose chunks are missing; packs
//! left by an upload that failed before its manifest are referenced by nothing and garbage
//! collection removes them.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use object_store::path::Path as ObjPath;
use rand::RngCore;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::crypto::{ChunkId, LineageKeys};
use crate::manifest::{
    self, BaseRef, ChunkLoc, Delta, DeltaOn, FileMap, HostInfo, Manifest, Run, DELTA_PAGE, FORMAT,
};
use crate::pack::{encode_chunk, PackBuilder};
use crate::store::{Archive, StoreError};

/// Chunk size of new manifests (`docs/archive.md` says why).
pub const DEFAULT_CHUNK_SIZE: u32 = 256 << 10;
/// A pack is sent once it holds this much.
pub const DEFAULT_PACK_TARGET: usize = 32 << 20;
/// Packs in flight at once.
const PUTS_IN_FLIGHT: usize = 4;

/// Errors of an upload.
#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    /// The store failed; nothing new is referenced.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Reading a snapshot file failed.
    #[error("reading {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The spec is not valid.
    #[error("invalid upload: {0}")]
    Invalid(String),
}

/// One file to archive.
#[derive(Debug, Clone)]
pub struct SourceFile {
    /// Its name in the manifest (relative path).
    pub name: String,
    /// Where it is on this host.
    pub path: PathBuf,
    /// The base template's file at the same offsets: its name in the template archive and its
    /// path on this host.
    pub base: Option<(String, PathBuf)>,
    /// The file's chunks as an earlier manifest of the lineage has them, when the caller
    /// knows the file has not changed since (a volume's file of the same inode, size and
    /// times): used as they are without reading the file, when every chunk is known.
    pub unchanged: Option<Unchanged>,
}

/// A file's content as an earlier manifest describes it ([`SourceFile::unchanged`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unchanged {
    /// Its size.
    pub size: u64,
    /// Its chunks in order: `None` for a chunk of zeros.
    pub chunks: Vec<Option<ChunkId>>,
}

impl Unchanged {
    /// File `name` of `m`, unless it has runs on a base template.
    pub fn of(m: &Manifest, name: &str) -> Option<Unchanged> {
        let fm = m.file(name)?;
        let mut chunks = Vec::new();
        for r in &fm.runs {
            match r {
                Run::Zero(n) => chunks.extend(std::iter::repeat_n(None, usize::try_from(*n).ok()?)),
                Run::Base(_) => return None,
                Run::Chunks(c) => {
                    for &i in c {
                        chunks.push(Some(m.chunks.get(i as usize)?.id));
                    }
                }
            }
        }
        Some(Unchanged {
            size: fm.size,
            chunks,
        })
    }
}

/// What to archive and under which names.
#[derive(Debug, Clone)]
pub struct UploadSpec {
    /// Owner of the lineage.
    pub tenant: String,
    /// The lineage.
    pub lineage: String,
    /// The sandbox (or template) the snapshot belongs to.
    pub sandbox: String,
    /// The snapshot id.
    pub snapshot: String,
    /// Where the manifest goes.
    pub manifest_path: ObjPath,
    /// Chunk size ([`DEFAULT_CHUNK_SIZE`]).
    pub chunk_size: u32,
    /// Pack size target ([`DEFAULT_PACK_TARGET`]).
    pub pack_target: usize,
    /// The template the `base` files belong to.
    pub base: Option<BaseRef>,
    /// The host that took the snapshot.
    pub host: Option<HostInfo>,
    /// The sandbox's record.
    pub record: serde_json::Value,
    /// The files.
    pub files: Vec<SourceFile>,
    /// The lineage's previous snapshot, when this host still has its files: chunks that
    /// changed in a few pages since then are stored as deltas.
    pub previous: Option<Previous>,
    /// What a restore of it fetches first ([`Manifest::prefetch`]).
    pub prefetch: Vec<(String, u64)>,
}

/// An earlier snapshot of the lineage whose files are on this host.
#[derive(Debug, Clone)]
pub struct Previous {
    /// Its manifest (every chunk it uses must be in the [`Known`] given with it).
    pub manifest: Arc<Manifest>,
    /// The directory holding its files under their manifest names.
    pub dir: PathBuf,
}

/// Chunks the lineage already has in the store, with where they are.
#[derive(Debug, Default, Clone)]
pub struct Known {
    chunks: HashMap<ChunkId, KnownChunk>,
}

#[derive(Debug, Clone)]
struct KnownChunk {
    pack: String,
    offset: u64,
    len: u32,
    plain_len: u32,
    delta: Option<(KnownOn, Vec<u64>)>,
}

#[derive(Debug, Clone)]
enum KnownOn {
    Base { file: String, index: u64 },
    Chunk(ChunkId),
}

impl KnownOn {
    fn of(m: &Manifest, on: &DeltaOn) -> Option<KnownOn> {
        Some(match on {
            DeltaOn::Base { file, index } => KnownOn::Base {
                file: file.clone(),
                index: *index,
            },
            DeltaOn::Chunk(i) => KnownOn::Chunk(m.chunks.get(*i as usize)?.id),
        })
    }
}

impl Known {
    /// Adds every chunk `m` references.
    pub fn add_manifest(&mut self, m: &Manifest) {
        for c in &m.chunks {
            let Some(pack) = m.packs.get(c.pack as usize) else {
                continue;
            };
            let delta = match &c.delta {
                None => None,
                Some(d) => match KnownOn::of(m, &d.on) {
                    Some(on) => Some((on, d.pages.clone())),
                    None => continue,
                },
            };
            self.chunks.entry(c.id).or_insert_with(|| KnownChunk {
                pack: pack.clone(),
                offset: c.offset,
                len: c.len,
                plain_len: c.plain_len,
                delta,
            });
        }
    }

    /// How many chunks are known.
    pub fn len(&self) -> usize {
        self.chunks.len()
    }

    /// None known.
    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }
}

/// What an upload did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UploadReport {
    /// Chunks in all files.
    pub chunks: u64,
    /// Zero chunks (not stored).
    pub zero: u64,
    /// Chunks equal to the base (not stored).
    pub base: u64,
    /// Chunks the lineage already had (not stored again).
    pub reused: u64,
    /// Chunks stored by this upload.
    pub new_chunks: u64,
    /// Of those, how many as page deltas.
    pub delta_chunks: u64,
    /// Their plaintext bytes.
    pub new_plain_bytes: u64,
    /// Bytes written to the store (packs and manifest).
    pub uploaded_bytes: u64,
    /// Packs written.
    pub packs: u64,
    /// The manifest object's size.
    pub manifest_bytes: u64,
    /// New chunks per file, in the spec's order.
    pub new_per_file: Vec<(String, u64)>,
    /// The manifest hash.
    pub manifest_hash: String,
    /// Wall time.
    pub elapsed: Duration,
}

struct Cut {
    files: Vec<FileMap>,
    packs: Vec<String>,
    chunks: Vec<ChunkLoc>,
    report: UploadReport,
}

struct PackOut {
    name: String,
    bytes: Vec<u8>,
}

fn new_pack_name() -> String {
    let mut b = [0u8; 16];
    rand::rngs::OsRng.fill_bytes(&mut b);
    hex::encode(b)
}

/// Archives the snapshot described by `spec` into `archive`, storing only chunks not in
/// `known`; returns the manifest (written) and what it cost.
pub async fn upload(
    archive: &Archive,
    keys: Arc<LineageKeys>,
    spec: UploadSpec,
    known: &Known,
) -> Result<(Manifest, UploadReport), UploadError> {
    let t0 = Instant::now();
    if !(manifest::MIN_CHUNK..=manifest::MAX_CHUNK).contains(&spec.chunk_size)
        || !spec.chunk_size.is_power_of_two()
    {
        return Err(UploadError::Invalid(format!(
            "chunk size {} is not a power of two in {}..={}",
            spec.chunk_size,
            manifest::MIN_CHUNK,
            manifest::MAX_CHUNK
        )));
    }
    if keys.lineage() != spec.lineage {
        return Err(UploadError::Invalid("keys of another lineage".into()));
    }
    let (tx, mut rx) = mpsc::channel::<PackOut>(2);
    let worker = {
        let (keys, files, known) = (keys.clone(), spec.files.clone(), known.clone());
        let previous = spec.previous.clone();
        let (cs, target) = (spec.chunk_size, spec.pack_target.max(1));
        tokio::task::spawn_blocking(move || {
            cut(&keys, &files, previous.as_ref(), &known, cs, target, tx)
        })
    };
    let mut puts: JoinSet<Result<u64, StoreError>> = JoinSet::new();
    let mut uploaded = 0u64;
    let mut failed: Option<StoreError> = None;
    while let Some(pack) = rx.recv().await {
        while puts.len() >= PUTS_IN_FLIGHT {
            match puts.join_next().await {
                Some(Ok(Ok(n))) => uploaded += n,
                Some(Ok(Err(e))) => failed = Some(e),
                Some(Err(e)) => failed = Some(join_error(e)),
                None => break,
            }
        }
        if failed.is_some() {
            break;
        }
        let path = archive.pack_path(&spec.lineage, &pack.name)?;
        let a = archive.clone();
        puts.spawn(async move {
            let n = pack.bytes.len() as u64;
            a.put(&path, Bytes::from(pack.bytes)).await.map(|_| n)
        });
    }
    // Stops the worker if we left the loop early (its sends fail).
    drop(rx);
    while let Some(r) = puts.join_next().await {
        match r {
            Ok(Ok(n)) => uploaded += n,
            Ok(Err(e)) => failed = failed.or(Some(e)),
            Err(e) => failed = failed.or(Some(join_error(e))),
        }
    }
    let cut = worker
        .await
        .map_err(|e| UploadError::Invalid(format!("the chunking task failed: {e}")))?;
    if let Some(e) = failed {
        return Err(e.into());
    }
    let mut cut = cut?;
    let m = Manifest {
        format: FORMAT,
        lineage: spec.lineage.clone(),
        tenant: spec.tenant.clone(),
        sandbox: spec.sandbox.clone(),
        snapshot: spec.snapshot.clone(),
        created_unix_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0),
        chunk_size: spec.chunk_size,
        base: spec.base.clone(),
        host: spec.host.clone(),
        record: spec.record.clone(),
        files: cut.files,
        packs: cut.packs,
        chunks: cut.chunks,
        prefetch: spec.prefetch.clone(),
    };
    m.validate()
        .map_err(|e| UploadError::Invalid(format!("made an invalid manifest: {e}")))?;
    let object = m.encode(&keys).map_err(|source| UploadError::Io {
        path: std::path::PathBuf::from(format!("{} (compressing it)", spec.manifest_path)),
        source,
    })?;
    if object.len() > manifest::MAX_MANIFEST_BYTES {
        return Err(UploadError::Invalid(format!(
            "the manifest is {} bytes, over the format's limit",
            object.len()
        )));
    }
    cut.report.manifest_hash = Manifest::hash(&object);
    cut.report.manifest_bytes = object.len() as u64;
    archive
        .put(&spec.manifest_path, Bytes::from(object))
        .await?;
    cut.report.uploaded_bytes = uploaded + cut.report.manifest_bytes;
    cut.report.elapsed = t0.elapsed();
    Ok((m, cut.report))
}

fn join_error(e: tokio::task::JoinError) -> StoreError {
    StoreError::Config(format!("an upload task failed: {e}"))
}

fn push_run(runs: &mut Vec<Run>, next: Run) {
    match (runs.last_mut(), next) {
        (Some(Run::Zero(n)), Run::Zero(m)) => *n += m,
        (Some(Run::Base(n)), Run::Base(m)) => *n += m,
        (Some(Run::Chunks(a)), Run::Chunks(b)) => a.extend(b),
        (_, next) => runs.push(next),
    }
}

/// The data ranges of a file (holes left out), from `SEEK_DATA`/`SEEK_HOLE`; the whole file
/// when the filesystem does not say.
fn data_ranges(f: &File, size: u64) -> Vec<(u64, u64)> {
    use std::os::fd::AsRawFd;
    let fd = f.as_raw_fd();
    let mut out = Vec::new();
    let mut pos: i64 = 0;
    while (pos as u64) < size {
        // SAFETY: lseek on a file descriptor we own; it reads no memory of ours.
        let data = unsafe { libc::lseek(fd, pos, libc::SEEK_DATA) };
        if data < 0 {
            let errno = std::io::Error::last_os_error().raw_os_error();
            if errno == Some(libc::ENXIO) {
                break; // no data after pos
            }
            return vec![(0, size)];
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
        if hole < 0 {
            return vec![(0, size)];
        }
        out.push((data as u64, (hole as u64).min(size)));
        pos = hole;
    }
    out
}

fn overlaps(ranges: &[(u64, u64)], start: u64, end: u64) -> bool {
    // Ranges are sorted and disjoint: find the first that ends after `start`.
    let i = ranges.partition_point(|&(_, e)| e <= start);
    ranges.get(i).is_some_and(|&(s, _)| s < end)
}

/// The chunk table of the manifest being made.
#[derive(Default)]
struct Table {
    packs: Vec<String>,
    pack_index: HashMap<String, u32>,
    chunks: Vec<ChunkLoc>,
    by_id: HashMap<ChunkId, u32>,
}

impl Table {
    fn pack(&mut self, name: &str) -> u32 {
        if let Some(&i) = self.pack_index.get(name) {
            return i;
        }
        self.packs.push(name.to_owned());
        let i = (self.packs.len() - 1) as u32;
        self.pack_index.insert(name.to_owned(), i);
        i
    }

    fn push(&mut self, loc: ChunkLoc) -> u32 {
        let i = self.chunks.len() as u32;
        self.by_id.insert(loc.id, i);
        self.chunks.push(loc);
        i
    }

    /// The index of chunk `id` in this table, bringing it (and the chunk a delta applies to)
    /// over from `known`; `None` when it is not known or its delta cannot be used here
    /// (`whole`: only a chunk stored whole will do).
    fn reuse(
        &mut self,
        known: &Known,
        id: &ChunkId,
        base_files: &[String],
        whole: bool,
    ) -> Option<u32> {
        if let Some(&i) = self.by_id.get(id) {
            return (!whole || self.chunks[i as usize].delta.is_none()).then_some(i);
        }
        let k = known.chunks.get(id)?;
        let delta = match &k.delta {
            None => None,
            Some(_) if whole => return None,
            Some((on, pages)) => {
                let on = self.delta_on(known, on, base_files)?;
                Some(Delta {
                    on,
                    pages: pages.clone(),
                })
            }
        };
        let pack = self.pack(&k.pack);
        Some(self.push(ChunkLoc {
            id: *id,
            pack,
            offset: k.offset,
            len: k.len,
            plain_len: k.plain_len,
            delta,
        }))
    }

    fn delta_on(&mut self, known: &Known, on: &KnownOn, base_files: &[String]) -> Option<DeltaOn> {
        match on {
            KnownOn::Base { file, index } => base_files.contains(file).then(|| DeltaOn::Base {
                file: file.clone(),
                index: *index,
            }),
            KnownOn::Chunk(r) => self.reuse(known, r, base_files, true).map(DeltaOn::Chunk),
        }
    }
}

/// Pages of `a` that differ from `b` (same length), as a page map; and how many.
fn page_diff(a: &[u8], b: &[u8], words: usize) -> (Vec<u64>, u32) {
    let mut map = vec![0u64; words];
    let mut n = 0;
    for (q, (x, y)) in a
        .chunks(DELTA_PAGE as usize)
        .zip(b.chunks(DELTA_PAGE as usize))
        .enumerate()
    {
        if x != y {
            map[q / 64] |= 1 << (q % 64);
            n += 1;
        }
    }
    (map, n)
}

/// The previous snapshot's version of one file.
struct PrevFile<'a> {
    manifest: &'a Manifest,
    file: File,
    path: PathBuf,
    /// Chunk index -> index into the previous manifest's chunk table.
    at: Vec<Option<u32>>,
}

impl<'a> PrevFile<'a> {
    fn open(prev: &'a Previous, name: &str) -> Option<PrevFile<'a>> {
        let m = &prev.manifest;
        let fm = m.file(name)?;
        if m.chunk_size == 0 {
            return None;
        }
        let path = prev.dir.join(name);
        let file = File::open(&path).ok()?;
        if file.metadata().ok()?.len() != fm.size {
            return None;
        }
        let mut at = Vec::new();
        for r in &fm.runs {
            match r {
                Run::Zero(n) | Run::Base(n) => {
                    at.extend(std::iter::repeat_n(None, usize::try_from(*n).ok()?))
                }
                Run::Chunks(c) => at.extend(c.iter().map(|&i| Some(i))),
            }
        }
        Some(PrevFile {
            manifest: m,
            file,
            path,
            at,
        })
    }
}

/// The map of a file that has not changed, from its chunks in `known`; `None` (nothing
/// touched) when one of them is not there or the sizes do not agree.
fn reuse_file(
    table: &mut Table,
    known: &Known,
    base_files: &[String],
    sf: &SourceFile,
    u: &Unchanged,
    cs: u32,
    report: &mut UploadReport,
) -> Option<FileMap> {
    if manifest::chunk_count(u.size, cs) != u.chunks.len() as u64
        || u.chunks
            .iter()
            .flatten()
            .any(|id| !known.chunks.contains_key(id) && !table.by_id.contains_key(id))
    {
        return None;
    }
    let mut runs = Vec::new();
    for c in &u.chunks {
        match c {
            None => push_run(&mut runs, Run::Zero(1)),
            Some(id) => {
                let idx = table.reuse(known, id, base_files, false)?;
                push_run(&mut runs, Run::Chunks(vec![idx]));
            }
        }
    }
    let zero = u.chunks.iter().filter(|c| c.is_none()).count() as u64;
    report.chunks += u.chunks.len() as u64;
    report.zero += zero;
    report.reused += u.chunks.len() as u64 - zero;
    Some(FileMap {
        name: sf.name.clone(),
        size: u.size,
        mode: 0o600,
        base: None,
        runs,
    })
}

fn cut(
    keys: &LineageKeys,
    files: &[SourceFile],
    previous: Option<&Previous>,
    known: &Known,
    cs: u32,
    target: usize,
    tx: mpsc::Sender<PackOut>,
) -> Result<Cut, UploadError> {
    let mut report = UploadReport::default();
    let mut table = Table::default();
    let mut maps = Vec::with_capacity(files.len());
    let mut current = PackBuilder::default();
    let mut current_name = new_pack_name();
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| UploadError::Io { path, source }
    };
    let base_files: Vec<String> = files
        .iter()
        .filter_map(|f| f.base.as_ref().map(|(n, _)| n.clone()))
        .collect();
    let pages_per_chunk = cs.div_ceil(DELTA_PAGE);
    let words = pages_per_chunk.div_ceil(64) as usize;
    let mut buf = vec![0u8; cs as usize];
    let mut base_buf = vec![0u8; cs as usize];
    let mut prev_buf = vec![0u8; cs as usize];
    for sf in files {
        if !manifest::safe_relative_path(&sf.name) {
            return Err(UploadError::Invalid(format!("file name {:?}", sf.name)));
        }
        if let Some(u) = &sf.unchanged {
            if let Some(map) = reuse_file(&mut table, known, &base_files, sf, u, cs, &mut report) {
                maps.push(map);
                report.new_per_file.push((sf.name.clone(), 0));
                continue;
            }
        }
        let f = File::open(&sf.path).map_err(io(&sf.path))?;
        let meta = f.metadata().map_err(io(&sf.path))?;
        let size = meta.len();
        let ranges = data_ranges(&f, size);
        let base = match &sf.base {
            Some((name, path)) => {
                let bf = File::open(path).map_err(io(path))?;
                let bsize = bf.metadata().map_err(io(path))?.len();
                Some((name.clone(), bf, bsize, path.clone()))
            }
            None => None,
        };
        let prev = previous
            .filter(|p| p.manifest.chunk_size == cs)
            .and_then(|p| PrevFile::open(p, &sf.name));
        let mut runs = Vec::new();
        let new_before = report.new_chunks;
        let count = manifest::chunk_count(size, cs);
        for index in 0..count {
            let off = index * cs as u64;
            let len = manifest::chunk_len(size, cs, index) as usize;
            report.chunks += 1;
            if !overlaps(&ranges, off, off + len as u64) {
                report.zero += 1;
                push_run(&mut runs, Run::Zero(1));
                continue;
            }
            let chunk = &mut buf[..len];
            f.read_exact_at(chunk, off).map_err(io(&sf.path))?;
            if chunk.iter().all(|&b| b == 0) {
                report.zero += 1;
                push_run(&mut runs, Run::Zero(1));
                continue;
            }
            // The base file's chunk here, when it has one (held in `base_buf`).
            let mut base_here: Option<&str> = None;
            if let Some((name, bf, bsize, bpath)) = &base {
                if off + len as u64 <= *bsize {
                    let b = &mut base_buf[..len];
                    bf.read_exact_at(b, off).map_err(io(bpath))?;
                    if b == chunk {
                        report.base += 1;
                        push_run(&mut runs, Run::Base(1));
                        continue;
                    }
                    base_here = Some(name);
                }
            }
            let id = keys.chunk_id(chunk);
            if let Some(idx) = table.reuse(known, &id, &base_files, false) {
                report.reused += 1;
                push_run(&mut runs, Run::Chunks(vec![idx]));
                continue;
            }
            // A delta candidate: what it applies to, its page map, how many pages.
            let mut best: Option<(KnownOn, Vec<u64>, u32)> = base_here.map(|name| {
                let (map, n) = page_diff(chunk, &base_buf[..len], words);
                (
                    KnownOn::Base {
                        file: name.to_owned(),
                        index,
                    },
                    map,
                    n,
                )
            });
            if let Some(p) = &prev {
                if let Some(candidate) =
                    prev_candidate(keys, p, index, chunk, &mut prev_buf, words)?
                {
                    if best.as_ref().is_none_or(|b| candidate.2 < b.2) {
                        best = Some(candidate);
                    }
                }
            }
            let delta =
                best.filter(|(_, _, n)| *n * 2 <= pages_per_chunk)
                    .and_then(|(on, pages, _)| {
                        let on = table.delta_on(known, &on, &base_files)?;
                        Some(Delta { on, pages })
                    });
            let sealed = match &delta {
                Some(d) => {
                    let mut payload = Vec::with_capacity(d.stored_len(len as u32));
                    for r in d.ranges(len as u32) {
                        payload.extend_from_slice(&chunk[r]);
                    }
                    report.delta_chunks += 1;
                    encode_chunk(keys, &id, &payload)
                }
                None => encode_chunk(keys, &id, chunk),
            };
            let (offset, slen) = current.push(&sealed);
            let pack = table.pack(&current_name);
            let idx = table.push(ChunkLoc {
                id,
                pack,
                offset,
                len: slen,
                plain_len: len as u32,
                delta,
            });
            report.new_chunks += 1;
            report.new_plain_bytes += len as u64;
            if current.len() >= target {
                let full = std::mem::take(&mut current);
                let name = std::mem::replace(&mut current_name, new_pack_name());
                report.packs += 1;
                if tx
                    .blocking_send(PackOut {
                        name,
                        bytes: full.finish(),
                    })
                    .is_err()
                {
                    return Err(UploadError::Invalid("the upload stopped".into()));
                }
            }
            push_run(&mut runs, Run::Chunks(vec![idx]));
        }
        report
            .new_per_file
            .push((sf.name.clone(), report.new_chunks - new_before));
        maps.push(FileMap {
            name: sf.name.clone(),
            size,
            mode: meta.mode() & 0o7777,
            base: base.as_ref().map(|(n, ..)| n.clone()),
            runs,
        });
    }
    if !current.is_empty() {
        report.packs += 1;
        if tx
            .blocking_send(PackOut {
                name: current_name,
                bytes: current.finish(),
            })
            .is_err()
        {
            return Err(UploadError::Invalid("the upload stopped".into()));
        }
    }
    Ok(Cut {
        files: maps,
        packs: table.packs,
        chunks: table.chunks,
        report,
    })
}

/// A delta against the previous snapshot's chunk at `index`, if that chunk is stored (whole
/// or as a delta) and the local file still holds it. A delta on a delta becomes a delta on
/// what the older one applies to, with both page maps: the pages where `chunk` equals the
/// previous chunk and the previous chunk equals its own base are the base's.
fn prev_candidate(
    keys: &LineageKeys,
    p: &PrevFile<'_>,
    index: u64,
    chunk: &[u8],
    prev_buf: &mut [u8],
    words: usize,
) -> Result<Option<(KnownOn, Vec<u64>, u32)>, UploadError> {
    let Some(Some(pi)) = p.at.get(index as usize) else {
        return Ok(None);
    };
    let Some(loc) = p.manifest.chunks.get(*pi as usize) else {
        return Ok(None);
    };
    if loc.plain_len as usize != chunk.len() {
        return Ok(None);
    }
    let old = &mut prev_buf[..chunk.len()];
    let off = index * p.manifest.chunk_size as u64;
    p.file
        .read_exact_at(old, off)
        .map_err(|source| UploadError::Io {
            path: p.path.clone(),
            source,
        })?;
    if keys.chunk_id(old) != loc.id {
        return Ok(None);
    }
    let (mut map, _) = page_diff(chunk, old, words);
    let on = match &loc.delta {
        None => KnownOn::Chunk(loc.id),
        Some(d) => {
            for (w, bits) in map.iter_mut().zip(&d.pages) {
                *w |= bits;
            }
            match KnownOn::of(p.manifest, &d.on) {
                Some(on) => on,
                None => return Ok(None),
            }
        }
    };
    let n = map.iter().map(|w| w.count_ones()).sum();
    Ok(Some((on, map, n)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_merge() {
        let mut r = Vec::new();
        for x in [
            Run::Zero(1),
            Run::Zero(2),
            Run::Base(1),
            Run::Chunks(vec![0]),
            Run::Chunks(vec![1]),
            Run::Zero(1),
        ] {
            push_run(&mut r, x);
        }
        assert_eq!(
            r,
            vec![
                Run::Zero(3),
                Run::Base(1),
                Run::Chunks(vec![0, 1]),
                Run::Zero(1)
            ]
        );
    }

    #[test]
    fn holes_are_found() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sparse");
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&p)
            .unwrap();
        f.set_len(16 << 20).unwrap();
        f.write_all_at(b"x", 8 << 20).unwrap();
        let r = data_ranges(&f, 16 << 20);
        assert!(!r.is_empty());
        assert!(overlaps(&r, 8 << 20, (8 << 20) + 1));
        // On filesystems that report holes, the start is one.
        if r[0].0 > 0 {
            assert!(!overlaps(&r, 0, 4096));
        }
    }
}
