//! Bringing an archived snapshot back into a directory: each file starts as a clone of its
//! base template file (or empty and sparse), zero chunks become holes, and the stored chunks
//! are fetched with parallel ranged reads, opened, decompressed, checked against their names
//! and written at every offset that uses them. Any chunk that fails stops the whole fetch with
//! an error naming it; the caller removes the half-made directory.
//!
//! Chunks stored whole come first; page deltas second, each put into a copy of the chunk it
//! applies to and then checked against its name. A whole chunk that deltas apply to is also
//! written where those deltas go, so each delta is patched in place; a delta on the base
//! template reads the template's chunk from the local template.

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinSet;

use crate::crypto::LineageKeys;
use crate::manifest::{ChunkLoc, DeltaOn, Manifest, Run};
use crate::pack::{decode_chunk, decode_stored, put_pages, verify, ChunkError};
use crate::store::{Archive, StoreError};

/// Ranged reads in flight at once.
pub const DEFAULT_PARALLEL_READS: usize = 8;
/// A ranged read covers at most this much of a pack.
pub(crate) const MAX_READ: u64 = 8 << 20;
/// Gap between chunks of one pack that a read bridges rather than splitting.
pub(crate) const MAX_GAP: u64 = 256 << 10;

/// Errors of a fetch.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The store failed or lacks a pack.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A chunk is corrupt.
    #[error("pack {pack}: {source}")]
    Chunk {
        /// The pack.
        pack: String,
        /// What is wrong with the chunk.
        source: ChunkError,
    },
    /// The base template is needed and not here.
    #[error("the snapshot's file {file} is based on {base}, which is not available here")]
    NoBase {
        /// The file.
        file: String,
        /// The base file.
        base: String,
    },
    /// Writing the destination.
    #[error("{op} {path}: {source}")]
    Io {
        /// What.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A pack returned fewer bytes than asked.
    #[error("pack {pack} is shorter than its manifest says (truncated in the store)")]
    Short {
        /// The pack.
        pack: String,
    },
}

/// What a fetch did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FetchReport {
    /// Stored chunks fetched and verified.
    pub chunks: u64,
    /// Of those, page deltas.
    pub deltas: u64,
    /// Bytes read from the store.
    pub fetched_bytes: u64,
    /// Ranged reads made.
    pub reads: u64,
    /// The ranged reads' own times, summed (they overlap: up to `parallel` at once).
    pub getting: Duration,
    /// Opening the chunks (decrypting, decompressing, checking each against its name),
    /// summed over the threads that did it.
    pub opening: Duration,
    /// Writing the chunks into the files, summed over the threads that did it.
    pub writing: Duration,
    /// Of the wall time, making the files durable.
    pub syncing: Duration,
    /// Wall time.
    pub elapsed: Duration,
}

/// Clones a file (a reflink on btrfs and XFS): the base template's files are cloned into the
/// destination before the chunks that differ are written over them.
pub type CloneFile = Arc<dyn Fn(&Path, &Path) -> std::io::Result<()> + Send + Sync>;

/// Makes `dest/<file>` for every file of `m`. `base_dir` holds the base template's files
/// (the names in [`crate::manifest::FileMap::base`]); `clone` copies one of them cheaply.
/// The files are synced before it returns.
pub async fn materialize(
    archive: &Archive,
    keys: Arc<LineageKeys>,
    m: &Manifest,
    dest: &Path,
    base_dir: Option<&Path>,
    clone: CloneFile,
    parallel: usize,
) -> Result<FetchReport, FetchError> {
    materialize_inner(archive, keys, m, dest, base_dir, clone, parallel, true).await
}

/// [`materialize`] without the sync: the data may still be only in the page cache when it
/// returns. For files a VM is about to start from, which need not survive the host (the
/// snapshot is in the store) and which syncing would first write out in full.
pub async fn materialize_unsynced(
    archive: &Archive,
    keys: Arc<LineageKeys>,
    m: &Manifest,
    dest: &Path,
    base_dir: Option<&Path>,
    clone: CloneFile,
    parallel: usize,
) -> Result<FetchReport, FetchError> {
    materialize_inner(archive, keys, m, dest, base_dir, clone, parallel, false).await
}

#[allow(clippy::too_many_arguments)]
async fn materialize_inner(
    archive: &Archive,
    keys: Arc<LineageKeys>,
    m: &Manifest,
    dest: &Path,
    base_dir: Option<&Path>,
    clone: CloneFile,
    parallel: usize,
    sync: bool,
) -> Result<FetchReport, FetchError> {
    let t0 = Instant::now();
    let io = |op: &'static str, path: &Path| {
        let path = path.to_owned();
        move |source| FetchError::Io { op, path, source }
    };
    // 1. Files, with their base content and holes.
    let handles = lay_out(m, dest, base_dir, &clone)?;

    // 2. Where every stored chunk goes.
    let targets = chunk_targets(m);

    // 3. Chunks stored whole, then the deltas that apply to them.
    let mut under: Vec<Vec<(usize, u64)>> = vec![Vec::new(); m.chunks.len()];
    for (i, c) in m.chunks.iter().enumerate() {
        if let (Some(DeltaOn::Chunk(r)), false) =
            (c.delta.as_ref().map(|d| &d.on), targets[i].is_empty())
        {
            let at = targets[i].clone();
            under[*r as usize].extend(at);
        }
    }
    let base_files = open_bases(m, base_dir, |i| !targets[i].is_empty())?;
    let ctx = Arc::new(Work {
        keys,
        chunks: m.chunks.clone(),
        chunk_size: m.chunk_size,
        targets,
        under,
        handles,
        names: m.files.iter().map(|f| dest.join(&f.name)).collect(),
        base_files,
        opening_ns: AtomicU64::new(0),
        writing_ns: AtomicU64::new(0),
    });
    let whole: Vec<u32> = (0..m.chunks.len() as u32)
        .filter(|&i| {
            let i = i as usize;
            m.chunks[i].delta.is_none() && !(ctx.targets[i].is_empty() && ctx.under[i].is_empty())
        })
        .collect();
    let deltas: Vec<u32> = (0..m.chunks.len() as u32)
        .filter(|&i| {
            let i = i as usize;
            m.chunks[i].delta.is_some() && !ctx.targets[i].is_empty()
        })
        .collect();
    let mut report = FetchReport::default();
    fetch_all(archive, m, &ctx, whole, parallel, &mut report).await?;
    report.deltas = deltas.len() as u64;
    fetch_all(archive, m, &ctx, deltas, parallel, &mut report).await?;
    let t_sync = Instant::now();
    if sync {
        for (f, p) in ctx.handles.iter().zip(ctx.names.iter()) {
            f.sync_all().map_err(io("syncing", p))?;
        }
    }
    report.syncing = t_sync.elapsed();
    report.opening = Duration::from_nanos(ctx.opening_ns.load(Ordering::Relaxed));
    report.writing = Duration::from_nanos(ctx.writing_ns.load(Ordering::Relaxed));
    report.elapsed = t0.elapsed();
    Ok(report)
}

/// Makes `dest/<file>` for every file of `m`, each with its base content (a clone of the base
/// template's file) and holes where its zero chunks are; stored chunks are still to be
/// written. Answers the files, open for reading and writing, in the manifest's order.
pub(crate) fn lay_out(
    m: &Manifest,
    dest: &Path,
    base_dir: Option<&Path>,
    clone: &CloneFile,
) -> Result<Vec<Arc<File>>, FetchError> {
    let io = |op: &'static str, path: &Path| {
        let path = path.to_owned();
        move |source| FetchError::Io { op, path, source }
    };
    let mut handles: Vec<Arc<File>> = Vec::with_capacity(m.files.len());
    for f in &m.files {
        let path = dest.join(&f.name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io("creating", parent))?;
        }
        let based = f.runs.iter().any(|r| matches!(r, Run::Base(_)));
        if based {
            let base_name = f.base.clone().unwrap_or_default();
            let src = match base_dir {
                Some(d) if d.join(&base_name).is_file() => d.join(&base_name),
                _ => {
                    return Err(FetchError::NoBase {
                        file: f.name.clone(),
                        base: base_name,
                    })
                }
            };
            clone(&src, &path).map_err(io("cloning the base into", &path))?;
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(!based)
            .open(&path)
            .map_err(io("creating", &path))?;
        file.set_len(f.size).map_err(io("sizing", &path))?;
        if based {
            let mut index = 0u64;
            for r in &f.runs {
                match r {
                    Run::Zero(n) => {
                        let start = index * m.chunk_size as u64;
                        let len = (n * m.chunk_size as u64).min(f.size - start);
                        punch_hole(&file, start, len).map_err(io("punching a hole in", &path))?;
                        index += n;
                    }
                    Run::Base(n) => index += n,
                    Run::Chunks(c) => index += c.len() as u64,
                }
            }
        }
        file.set_permissions(std::fs::Permissions::from_mode(f.mode & 0o777))
            .map_err(io("setting the mode of", &path))?;
        handles.push(Arc::new(file));
    }
    Ok(handles)
}

/// Opens the base files that page deltas of `m` apply to (of the chunks `wanted` keeps),
/// each once, from `base_dir`; a missing one is an error naming it.
pub(crate) fn open_bases(
    m: &Manifest,
    base_dir: Option<&Path>,
    wanted: impl Fn(usize) -> bool,
) -> Result<HashMap<String, File>, FetchError> {
    let mut out = HashMap::new();
    for (i, c) in m.chunks.iter().enumerate() {
        let Some(DeltaOn::Base { file, .. }) = c.delta.as_ref().map(|d| &d.on) else {
            continue;
        };
        if !wanted(i) || out.contains_key(file) {
            continue;
        }
        match base_dir.map(|d| File::open(d.join(file))) {
            Some(Ok(f)) => {
                out.insert(file.clone(), f);
            }
            _ => {
                return Err(FetchError::NoBase {
                    file: "a page delta".into(),
                    base: file.clone(),
                })
            }
        }
    }
    Ok(out)
}

/// Where every stored chunk of `m` goes: chunk index -> (file index, byte offset) list.
pub(crate) fn chunk_targets(m: &Manifest) -> Vec<Vec<(usize, u64)>> {
    let mut targets: Vec<Vec<(usize, u64)>> = vec![Vec::new(); m.chunks.len()];
    for (fi, f) in m.files.iter().enumerate() {
        let mut index = 0u64;
        for r in &f.runs {
            match r {
                Run::Zero(n) | Run::Base(n) => index += n,
                Run::Chunks(c) => {
                    for &ci in c {
                        targets[ci as usize].push((fi, index * m.chunk_size as u64));
                        index += 1;
                    }
                }
            }
        }
    }
    targets
}

/// What the reads of one materialize share.
struct Work {
    keys: Arc<LineageKeys>,
    chunks: Vec<ChunkLoc>,
    chunk_size: u32,
    /// Chunk index -> (file, offset) list.
    targets: Vec<Vec<(usize, u64)>>,
    /// Chunk index -> where the deltas that apply to it go.
    under: Vec<Vec<(usize, u64)>>,
    handles: Vec<Arc<File>>,
    names: Vec<PathBuf>,
    base_files: HashMap<String, File>,
    /// Nanoseconds spent opening and writing chunks, summed over threads.
    opening_ns: AtomicU64,
    writing_ns: AtomicU64,
}

impl Work {
    fn write(&self, i: u32, plain: &[u8]) -> Result<(), FetchError> {
        let t = Instant::now();
        let r = self.write_all(i, plain);
        add_elapsed(&self.writing_ns, t);
        r
    }

    fn write_all(&self, i: u32, plain: &[u8]) -> Result<(), FetchError> {
        let i = i as usize;
        for &(fi, off) in self.targets[i].iter().chain(&self.under[i]) {
            self.handles[fi]
                .write_all_at(plain, off)
                .map_err(|source| FetchError::Io {
                    op: "writing",
                    path: self.names[fi].clone(),
                    source,
                })?;
        }
        Ok(())
    }

    /// Opens chunk `i` from its sealed bytes (from pack `pack`) and writes it where it goes.
    fn place(&self, pack: &str, i: u32, sealed: &[u8]) -> Result<(), FetchError> {
        let t = Instant::now();
        let plain = self.open(pack, i, sealed)?;
        add_elapsed(&self.opening_ns, t);
        self.write(i, &plain)
    }

    /// Opens chunk `i` from its sealed bytes: the whole chunk, checked against its name.
    fn open(&self, pack: &str, i: u32, sealed: &[u8]) -> Result<Vec<u8>, FetchError> {
        let c = &self.chunks[i as usize];
        let bad = |source| FetchError::Chunk {
            pack: pack.to_owned(),
            source,
        };
        let Some(d) = &c.delta else {
            return decode_chunk(&self.keys, &c.id, c.plain_len as usize, sealed).map_err(bad);
        };
        let pages =
            decode_stored(&self.keys, &c.id, d.stored_len(c.plain_len), sealed).map_err(bad)?;
        let len = c.plain_len as usize;
        let mut plain = vec![0u8; len];
        let short = |what: &str| FetchError::Chunk {
            pack: pack.to_owned(),
            source: ChunkError::Malformed {
                id: c.id,
                why: format!("the chunk it applies to ({what}) is shorter than it"),
            },
        };
        match &d.on {
            DeltaOn::Base { file, index } => {
                let f = &self.base_files[file];
                let off = index * self.chunk_size as u64;
                f.read_exact_at(&mut plain, off)
                    .map_err(|_| short(&format!("base file {file}, chunk {index}")))?;
            }
            DeltaOn::Chunk(_) => {
                // The first round wrote the chunk it applies to here.
                let (fi, off) = self.targets[i as usize][0];
                self.handles[fi]
                    .read_exact_at(&mut plain, off)
                    .map_err(|source| FetchError::Io {
                        op: "reading back",
                        path: self.names[fi].clone(),
                        source,
                    })?;
            }
        }
        put_pages(d, c.plain_len, &pages, &mut plain);
        verify(&self.keys, &c.id, &plain).map_err(bad)?;
        Ok(plain)
    }
}

/// Splits `wanted` into reads: per pack, by offset, each covering at most `max` bytes with
/// gaps of at most [`MAX_GAP`].
pub(crate) fn plan_reads(m: &Manifest, wanted: Vec<u32>, max: u64) -> Vec<Vec<u32>> {
    let mut by_pack: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for i in wanted {
        by_pack
            .entry(m.chunks[i as usize].pack)
            .or_default()
            .push(i);
    }
    let mut reads = Vec::new();
    for (_, mut list) in by_pack {
        list.sort_by_key(|&i| m.chunks[i as usize].offset);
        list.dedup();
        let mut cur: Vec<u32> = Vec::new();
        let (mut start, mut end) = (0u64, 0u64);
        for i in list {
            let c = &m.chunks[i as usize];
            let c_end = c.offset + c.len as u64;
            if !cur.is_empty() && (c.offset > end + MAX_GAP || c_end - start > max) {
                reads.push(std::mem::take(&mut cur));
            }
            if cur.is_empty() {
                start = c.offset;
                end = c_end;
            }
            end = end.max(c_end);
            cur.push(i);
        }
        if !cur.is_empty() {
            reads.push(cur);
        }
    }
    reads
}

/// Fetches chunks `wanted` of `m` with ranged reads (per pack, by offset, merged into ranges
/// of at most [`MAX_READ`]), `parallel` at a time, and places each.
async fn fetch_all(
    archive: &Archive,
    m: &Manifest,
    work: &Arc<Work>,
    wanted: Vec<u32>,
    parallel: usize,
    report: &mut FetchReport,
) -> Result<(), FetchError> {
    let reads: Vec<(u32, Vec<u32>)> = plan_reads(m, wanted, MAX_READ)
        .into_iter()
        .map(|r| (m.chunks[r[0] as usize].pack, r))
        .collect();
    let mut set: JoinSet<Result<(u64, u64, Duration), FetchError>> = JoinSet::new();
    let mut queue = reads.into_iter();
    let parallel = parallel.max(1);
    loop {
        while set.len() < parallel {
            let Some((pack, list)) = queue.next() else {
                break;
            };
            let pack_name = m.packs[pack as usize].clone();
            let path = archive.pack_path(&m.lineage, &pack_name)?;
            let (a, work) = (archive.clone(), work.clone());
            set.spawn(async move {
                let chunks = &work.chunks;
                let start = chunks[list[0] as usize].offset;
                let end = list
                    .iter()
                    .map(|&i| chunks[i as usize].offset + chunks[i as usize].len as u64)
                    .max()
                    .unwrap_or(start);
                let t_get = Instant::now();
                let bytes = a.get_range(&path, start..end).await?;
                let got = t_get.elapsed();
                if (bytes.len() as u64) < end - start {
                    return Err(FetchError::Short { pack: pack_name });
                }
                let fetched = bytes.len() as u64;
                let n = list.len() as u64;
                tokio::task::spawn_blocking(move || {
                    for &i in &list {
                        let c = &work.chunks[i as usize];
                        let lo = (c.offset - start) as usize;
                        work.place(&pack_name, i, &bytes[lo..lo + c.len as usize])?;
                    }
                    Ok((n, fetched, got))
                })
                .await
                .map_err(|e| FetchError::Io {
                    op: "writing chunks",
                    path: PathBuf::new(),
                    source: std::io::Error::other(e.to_string()),
                })?
            });
            report.reads += 1;
        }
        match set.join_next().await {
            None => return Ok(()),
            Some(Ok(Ok((n, bytes, got)))) => {
                report.chunks += n;
                report.fetched_bytes += bytes;
                report.getting += got;
            }
            Some(Ok(Err(e))) => return Err(e),
            Some(Err(e)) => {
                return Err(FetchError::Io {
                    op: "fetching",
                    path: PathBuf::new(),
                    source: std::io::Error::other(e.to_string()),
                })
            }
        }
    }
}

fn add_elapsed(total_ns: &AtomicU64, since: Instant) {
    let ns = u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX);
    total_ns.fetch_add(ns, Ordering::Relaxed);
}

fn punch_hole(f: &File, start: u64, len: u64) -> std::io::Result<()> {
    if len == 0 {
        return Ok(());
    }
    // SAFETY: fallocate on a descriptor we own; no memory is passed.
    let r = unsafe {
        libc::fallocate(
            f.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            start as libc::off_t,
            len as libc::off_t,
        )
    };
    if r == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() != Some(libc::EOPNOTSUPP) {
        return Err(e);
    }
    // No hole punching here: write the zeros.
    let zeros = vec![0u8; 1 << 20];
    let mut off = start;
    while off < start + len {
        let n = (start + len - off).min(zeros.len() as u64) as usize;
        f.write_all_at(&zeros[..n], off)?;
        off += n as u64;
    }
    Ok(())
}
