//! Bringing an archived snapshot back into a directory: each file starts as a clone of its
//! base template file (or empty and sparse), zero chunks become holes, and the stored chunks
//! are fetched with parallel ranged reads, opened, decompressed, checked against their names
//! and written at every offset that uses them. Any chunk that fails stops the whole fetch with
//! an error naming it; the caller removes the half-made directory.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinSet;

use crate::crypto::LineageKeys;
use crate::manifest::{ChunkLoc, Manifest, Run};
use crate::pack::{decode_chunk, ChunkError};
use crate::store::{Archive, StoreError};

/// Ranged reads in flight at once.
pub const DEFAULT_PARALLEL_READS: usize = 8;
/// A ranged read covers at most this much of a pack.
const MAX_READ: u64 = 8 << 20;
/// Gap between chunks of one pack that a read bridges rather than splitting.
const MAX_GAP: u64 = 256 << 10;

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
    /// Bytes read from the store.
    pub fetched_bytes: u64,
    /// Ranged reads made.
    pub reads: u64,
    /// Wall time.
    pub elapsed: Duration,
}

/// Clones a file (a reflink on btrfs and XFS): the base template's files are cloned into the
/// destination before the chunks that differ are written over them.
pub type CloneFile = Arc<dyn Fn(&Path, &Path) -> std::io::Result<()> + Send + Sync>;

/// Makes `dest/<file>` for every file of `m`. `base_dir` holds the base template's files
/// (the names in [`crate::manifest::FileMap::base`]); `clone` copies one of them cheaply.
pub async fn materialize(
    archive: &Archive,
    keys: Arc<LineageKeys>,
    m: &Manifest,
    dest: &Path,
    base_dir: Option<&Path>,
    clone: CloneFile,
    parallel: usize,
) -> Result<FetchReport, FetchError> {
    let t0 = Instant::now();
    let io = |op: &'static str, path: &Path| {
        let path = path.to_owned();
        move |source| FetchError::Io { op, path, source }
    };
    // 1. Files, with their base content and holes.
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

    // 2. Where every stored chunk goes: chunk index -> (file, offset) list.
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

    // 3. Reads: per pack, chunks by offset, merged into ranges of at most MAX_READ.
    let mut by_pack: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for (i, c) in m.chunks.iter().enumerate() {
        if !targets[i].is_empty() {
            by_pack.entry(c.pack).or_default().push(i as u32);
        }
    }
    let mut reads: Vec<(u32, Vec<u32>)> = Vec::new();
    for (pack, mut list) in by_pack {
        list.sort_by_key(|&i| m.chunks[i as usize].offset);
        let mut cur: Vec<u32> = Vec::new();
        let (mut start, mut end) = (0u64, 0u64);
        for i in list {
            let c = &m.chunks[i as usize];
            let c_end = c.offset + c.len as u64;
            if !cur.is_empty() && (c.offset > end + MAX_GAP || c_end - start > MAX_READ) {
                reads.push((pack, std::mem::take(&mut cur)));
            }
            if cur.is_empty() {
                start = c.offset;
                end = c_end;
            }
            end = end.max(c_end);
            cur.push(i);
        }
        if !cur.is_empty() {
            reads.push((pack, cur));
        }
    }

    let chunks: Arc<Vec<ChunkLoc>> = Arc::new(m.chunks.clone());
    let targets = Arc::new(targets);
    let handles = Arc::new(handles);
    let names: Arc<Vec<PathBuf>> = Arc::new(m.files.iter().map(|f| dest.join(&f.name)).collect());
    let mut report = FetchReport::default();
    let mut set: JoinSet<Result<(u64, u64), FetchError>> = JoinSet::new();
    let mut queue = reads.into_iter();
    let parallel = parallel.max(1);
    loop {
        while set.len() < parallel {
            let Some((pack, list)) = queue.next() else {
                break;
            };
            let pack_name = m.packs[pack as usize].clone();
            let path = archive.pack_path(&m.lineage, &pack_name)?;
            let (a, keys, chunks, targets, handles, names) = (
                archive.clone(),
                keys.clone(),
                chunks.clone(),
                targets.clone(),
                handles.clone(),
                names.clone(),
            );
            set.spawn(async move {
                let first = &chunks[list[0] as usize];
                let start = first.offset;
                let end = list
                    .iter()
                    .map(|&i| chunks[i as usize].offset + chunks[i as usize].len as u64)
                    .max()
                    .unwrap_or(start);
                let bytes = a.get_range(&path, start..end).await?;
                if (bytes.len() as u64) < end - start {
                    return Err(FetchError::Short { pack: pack_name });
                }
                let fetched = bytes.len() as u64;
                let n = list.len() as u64;
                tokio::task::spawn_blocking(move || {
                    for &i in &list {
                        let c = &chunks[i as usize];
                        let lo = (c.offset - start) as usize;
                        let sealed = &bytes[lo..lo + c.len as usize];
                        let plain = decode_chunk(&keys, &c.id, c.plain_len as usize, sealed)
                            .map_err(|source| FetchError::Chunk {
                                pack: pack_name.clone(),
                                source,
                            })?;
                        for &(fi, off) in &targets[i as usize] {
                            handles[fi].write_all_at(&plain, off).map_err(|source| {
                                FetchError::Io {
                                    op: "writing",
                                    path: names[fi].clone(),
                                    source,
                                }
                            })?;
                        }
                    }
                    Ok((n, fetched))
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
            None => break,
            Some(Ok(Ok((n, bytes)))) => {
                report.chunks += n;
                report.fetched_bytes += bytes;
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
    for (f, p) in handles.iter().zip(names.iter()) {
        f.sync_all().map_err(io("syncing", p))?;
    }
    report.elapsed = t0.elapsed();
    Ok(report)
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
