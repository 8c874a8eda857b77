//! An archived snapshot's files used before they have arrived: a restore starts its VM on
//! them at once, and the chunks it touches are fetched first.
//!
//! [`LazyFiles::open`] lays the files out as a fetch does (a clone of the base template's
//! file, holes where the zero chunks are) and fetches the files that are not lazy (the device
//! state and the runtime's manifest: small, and needed whole before the VM starts). Each
//! chunk-sized slot of a lazy file is then *present* (zero, base, or installed) or *missing*
//! (a stored chunk not yet here). [`LazyFiles::read_at`] and [`LazyFiles::write_at`] (what
//! the file system in front of the VM calls) wait for the slots they cover; a missing slot is
//! asked for at once. [`LazyFiles::hydrate`] (one task per restore) fetches what is asked for
//! first, then the prefetch list, then everything else in pack order, until every slot is
//! present: then the files are whole and the VM can go on without this.
//!
//! Every chunk is opened (AES-GCM), decompressed and checked against its name (the keyed hash
//! of its plaintext; a delta after its pages are put in) before a byte of it is written, and
//! a slot is written only while it is missing: a chunk that arrives twice, or one the guest
//! wrote meanwhile, is never written over. A read of the store that fails or stalls is tried
//! again a few times; then the restore fails, every waiter gets an error, and nothing is
//! installed after that.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::crypto::LineageKeys;
use crate::fetch::{
    chunk_targets, lay_out, open_bases, plan_reads, CloneFile, FetchError, MAX_GAP, MAX_READ,
};
use crate::manifest::{Manifest, Run};
use crate::store::Archive;

mod fill;

/// A read asked for by a waiter covers at most this much (its chunks and their neighbours
/// that are missing too).
const MAX_URGENT_READ: u64 = 1 << 20;
/// Reads asked for by waiters in flight at once.
const MAX_URGENT: usize = 16;

/// How a lazy restore fetches.
#[derive(Debug, Clone)]
pub struct LazyOptions {
    /// Files served lazily; the manifest's other files are fetched whole by `open`.
    pub lazy: Vec<String>,
    /// Background reads in flight at once; 0: none, only what waiters ask for (the slots
    /// nobody touches then never arrive).
    pub parallel: usize,
    /// The longest one read of the store may take before it is tried again.
    pub read_timeout: Duration,
    /// Tries of each read before the restore fails.
    pub attempts: u32,
    /// Slots to fetch first, in order: (file name, chunk index in the file).
    pub prefetch: Vec<(String, u64)>,
    /// Whether a restore with no `prefetch` of its own uses the manifest's
    /// ([`Manifest::prefetch`]); off to measure what the list saves.
    pub use_manifest_prefetch: bool,
    /// If set, the background (everything nobody asked for and the prefetch list does not
    /// name) waits until [`LazyFiles::release_background`] or this long after
    /// [`LazyFiles::hydrate`] starts, whichever comes first: while a VM starts, its own
    /// reads and the prefetch list have the machine to themselves.
    pub hold_background: Option<Duration>,
}

impl Default for LazyOptions {
    fn default() -> Self {
        LazyOptions {
            lazy: vec!["mem".into(), "rootfs.ext4".into()],
            parallel: crate::fetch::DEFAULT_PARALLEL_READS,
            read_timeout: Duration::from_secs(10),
            attempts: 3,
            prefetch: Vec::new(),
            use_manifest_prefetch: true,
            hold_background: None,
        }
    }
}

impl LazyOptions {
    /// The longest a waiter can wait for one read before the restore fails: every try,
    /// and the pauses between them.
    pub fn stall_limit(&self) -> Duration {
        let tries = self.attempts.max(1);
        self.read_timeout * tries + backoff(tries) + Duration::from_secs(5)
    }
}

/// The pause before try `n + 1` (after `n` failed), summed over all of them for `n = tries`.
fn backoff(tries: u32) -> Duration {
    (1..tries).map(pause_after).sum()
}

fn pause_after(n: u32) -> Duration {
    Duration::from_millis(200u64 << (2 * n.min(4)).min(10))
}

/// What a lazy restore did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LazyReport {
    /// Chunks fetched because a reader or writer waited for them.
    pub urgent_chunks: u64,
    /// Chunks fetched from the prefetch list.
    pub prefetched_chunks: u64,
    /// Chunks fetched in the background.
    pub background_chunks: u64,
    /// Bytes read from the store.
    pub fetched_bytes: u64,
    /// Ranged reads made (tries included).
    pub reads: u64,
    /// Reads tried again after a failure or a stall.
    pub retries: u64,
    /// Reads and writes that had to wait for a slot.
    pub waits: u64,
    /// Their waiting, summed.
    pub waited: Duration,
    /// From the start of [`LazyFiles::hydrate`] until every slot was present.
    pub hydrated_in: Duration,
    /// Reads served ([`LazyFiles::read_at`] and [`LazyFiles::try_read_at`]), and their bytes.
    pub served_reads: u64,
    /// Bytes of the reads served.
    pub served_read_bytes: u64,
    /// Writes served, and their bytes.
    pub served_writes: u64,
    /// Bytes of the writes served.
    pub served_write_bytes: u64,
}

/// A slot of a lazy file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Present,
    Missing,
    /// Being written by an install.
    Installing,
}

/// A stored chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// Not asked for.
    Idle,
    /// Asked for by a waiter, not yet in a read.
    Wanted,
    /// In a read.
    Fetching,
    /// Installed everywhere it was missing.
    Done,
}

/// Why a chunk is fetched, for the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Why {
    Urgent,
    Prefetch,
    Background,
}

struct State {
    /// Per lazy file (by manifest file index), per slot.
    slots: HashMap<usize, Vec<Slot>>,
    chunks: Vec<Chunk>,
    /// Chunks waiters asked for, oldest first.
    wanted: VecDeque<u32>,
    /// Slots still missing, over all lazy files.
    missing: u64,
    failed: Option<String>,
    /// Chunks of the prefetch list not yet installed.
    prefetch_left: usize,
    /// While set, the first-touch order of the slots that come from the store is kept in
    /// `touched`.
    recording: bool,
    touched: Vec<(usize, u64)>,
    touched_set: HashSet<(usize, u64)>,
    report: LazyReport,
}

struct Inner {
    archive: Archive,
    keys: Arc<LineageKeys>,
    m: Manifest,
    opts: LazyOptions,
    files: Vec<Arc<File>>,
    paths: Vec<PathBuf>,
    /// Chunk index -> (file index, byte offset) list.
    targets: Vec<Vec<(usize, u64)>>,
    /// Per lazy file, per slot: the stored chunk that belongs there (None: zero or base).
    slot_chunk: HashMap<usize, Vec<Option<u32>>>,
    base_files: HashMap<String, File>,
    /// (pack, offset) -> chunk index, for the neighbours of a chunk in its pack.
    by_pack: BTreeMap<(u32, u64), u32>,
    /// The prefetch list's chunks, in the list's order, each once.
    prefetch: Vec<u32>,
    prefetch_set: HashSet<u32>,
    state: Mutex<State>,
    changed: Condvar,
    /// Wakes [`LazyFiles::hydrate`] when a waiter asks for a chunk (or the background is
    /// released).
    asked: Notify,
    /// Set by [`LazyFiles::release_background`].
    released: AtomicBool,
    /// Woken when the last chunk of the prefetch list is installed, or the restore fails.
    prefetch_done: Notify,
}

impl Inner {
    /// The shared state, also after a thread panicked while it held it.
    fn lock_state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The files of one lazy restore; cheap to clone (one shared state).
#[derive(Clone)]
pub struct LazyFiles {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for LazyFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LazyFiles")
            .field("snapshot", &self.inner.m.snapshot)
            .field("lazy", &self.inner.opts.lazy)
            .finish()
    }
}

/// An error of a lazy file's read or write, as the file system answers it.
#[derive(Debug, thiserror::Error)]
pub enum LazyError {
    /// The restore failed (the message says why); nothing more arrives.
    #[error("the restore failed: {0}")]
    Failed(String),
    /// Outside the file.
    #[error("offset {offset} and length {len} are outside the file ({size} bytes)")]
    OutOfRange {
        /// Where.
        offset: u64,
        /// How much.
        len: u64,
        /// The file's size.
        size: u64,
    },
    /// The file is not one of the lazy ones.
    #[error("file {0} is not served lazily")]
    NotLazy(usize),
    /// Reading or writing the local file.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl LazyFiles {
    /// Lays out every file of `m` in `dest` and fetches the ones that are not lazy; the lazy
    /// ones are usable at once through [`LazyFiles::read_at`] and [`LazyFiles::write_at`]
    /// while [`LazyFiles::hydrate`] runs.
    pub async fn open(
        archive: &Archive,
        keys: Arc<LineageKeys>,
        m: &Manifest,
        dest: &Path,
        base_dir: Option<&Path>,
        clone: CloneFile,
        opts: LazyOptions,
    ) -> Result<LazyFiles, FetchError> {
        let files = {
            let (m, dest, base_dir) = (m.clone(), dest.to_owned(), base_dir.map(Path::to_owned));
            tokio::task::spawn_blocking(move || lay_out(&m, &dest, base_dir.as_deref(), &clone))
                .await
                .map_err(|e| FetchError::Io {
                    op: "laying out",
                    path: PathBuf::new(),
                    source: std::io::Error::other(e.to_string()),
                })??
        };
        let targets = chunk_targets(m);
        let lazy: Vec<usize> = m
            .files
            .iter()
            .enumerate()
            .filter(|(_, f)| opts.lazy.contains(&f.name))
            .map(|(i, _)| i)
            .collect();
        let cs = m.chunk_size as u64;
        let mut slot_chunk = HashMap::new();
        let mut slots = HashMap::new();
        let mut missing = 0u64;
        for &fi in &lazy {
            let f = &m.files[fi];
            let mut per = Vec::with_capacity(f.size.div_ceil(cs) as usize);
            for r in &f.runs {
                match r {
                    Run::Zero(n) | Run::Base(n) => per.extend((0..*n).map(|_| None)),
                    Run::Chunks(c) => per.extend(c.iter().map(|&i| Some(i))),
                }
            }
            let s: Vec<Slot> = per
                .iter()
                .map(|c| match c {
                    Some(_) => Slot::Missing,
                    None => Slot::Present,
                })
                .collect();
            missing += s.iter().filter(|s| **s == Slot::Missing).count() as u64;
            slots.insert(fi, s);
            slot_chunk.insert(fi, per);
        }
        let base_files = open_bases(m, base_dir, |_| true)?;
        let prefetch = prefetch_chunks(m, &opts.prefetch, &slot_chunk);
        let inner = Arc::new(Inner {
            archive: archive.clone(),
            keys,
            m: m.clone(),
            opts,
            files,
            paths: m.files.iter().map(|f| dest.join(&f.name)).collect(),
            targets,
            slot_chunk,
            base_files,
            by_pack: m
                .chunks
                .iter()
                .enumerate()
                .map(|(i, l)| ((l.pack, l.offset), i as u32))
                .collect(),
            prefetch_set: prefetch.iter().copied().collect(),
            state: Mutex::new(State {
                slots,
                chunks: vec![Chunk::Idle; m.chunks.len()],
                wanted: VecDeque::new(),
                missing,
                failed: None,
                prefetch_left: prefetch.len(),
                recording: true,
                touched: Vec::new(),
                touched_set: HashSet::new(),
                report: LazyReport::default(),
            }),
            changed: Condvar::new(),
            asked: Notify::new(),
            released: AtomicBool::new(false),
            prefetch_done: Notify::new(),
            prefetch,
        });
        // The files that are not lazy, whole, now.
        let eager: Vec<u32> = (0..m.chunks.len() as u32)
            .filter(|&c| {
                inner.targets[c as usize]
                    .iter()
                    .any(|(fi, _)| !inner.slot_chunk.contains_key(fi))
            })
            .collect();
        for run in plan_reads(&inner.m, eager, MAX_READ) {
            fill::fetch_run(&inner, run, Why::Background).await?;
        }
        inner.lock_state().report = LazyReport::default();
        Ok(LazyFiles { inner })
    }

    /// The manifest index of file `name`, if it is served lazily.
    pub fn lazy_file(&self, name: &str) -> Option<usize> {
        let i = self.inner.m.files.iter().position(|f| f.name == name)?;
        self.inner.slot_chunk.contains_key(&i).then_some(i)
    }

    /// The size of file `fi` of the manifest.
    pub fn size(&self, fi: usize) -> u64 {
        self.inner.m.files.get(fi).map(|f| f.size).unwrap_or(0)
    }

    /// Where file `fi` is on the local disk (complete once hydrated).
    pub fn path(&self, fi: usize) -> Option<&Path> {
        self.inner.paths.get(fi).map(PathBuf::as_path)
    }

    /// Whether every slot is present.
    pub fn complete(&self) -> bool {
        let st = self.lock();
        st.failed.is_none() && st.missing == 0
    }

    /// Why the restore failed, if it did.
    pub fn failed(&self) -> Option<String> {
        self.lock().failed.clone()
    }

    /// Fails the restore from outside (the VM went away): every waiter gets an error and
    /// nothing more is installed.
    pub fn fail(&self, why: &str) {
        fail(&self.inner, why.to_owned());
    }

    /// Ends recording and answers the slots read or written until then that come from the
    /// store (not zero, not the base template's), in the order they were first touched:
    /// (file name, chunk index in the file). Whether a slot had arrived when touched does
    /// not matter: the list is what the next restore of this state fetches first.
    pub fn take_touched(&self) -> Vec<(String, u64)> {
        let mut st = self.lock();
        st.recording = false;
        let touched = std::mem::take(&mut st.touched);
        st.touched_set.clear();
        touched
            .into_iter()
            .map(|(fi, slot)| (self.inner.m.files[fi].name.clone(), slot))
            .collect()
    }

    /// Lets the background start now if [`LazyOptions::hold_background`] holds it (the VM
    /// has started and answered); nothing otherwise. Recording of what is touched ends here
    /// too: the list is what the VM needed to start and answer.
    pub fn release_background(&self) {
        self.lock().recording = false;
        self.inner.released.store(true, Ordering::Release);
        self.inner.asked.notify_one();
    }

    /// Resolves once every chunk of the prefetch list is here (at once without a list), or
    /// the restore failed. A VM held back until then does not wait for those chunks one at
    /// a time.
    pub async fn prefetched(&self) {
        loop {
            let woken = self.inner.prefetch_done.notified();
            {
                let st = self.lock();
                if st.prefetch_left == 0 || st.failed.is_some() {
                    return;
                }
            }
            woken.await;
        }
    }

    /// The chunks in the prefetch list.
    pub fn prefetch_len(&self) -> usize {
        self.inner.prefetch.len()
    }

    /// What the restore has done so far.
    pub fn report(&self) -> LazyReport {
        self.lock().report.clone()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner.lock_state()
    }

    /// Reads `buf.len()` bytes of lazy file `fi` at `offset`, waiting for what has not
    /// arrived (asking for it first). Blocks: call it from a thread that may.
    pub fn read_at(&self, fi: usize, offset: u64, buf: &mut [u8]) -> Result<(), LazyError> {
        self.wait_for(fi, offset, buf.len() as u64, Served::Read)?;
        self.inner.files[fi].read_exact_at(buf, offset)?;
        Ok(())
    }

    /// Reads like [`LazyFiles::read_at`] when every slot it covers is present, without
    /// waiting; answers `None` (and asks for nothing) when one is not. For the file system's
    /// own thread, which must not wait for the store.
    pub fn try_read_at(
        &self,
        fi: usize,
        offset: u64,
        buf: &mut [u8],
    ) -> Option<Result<(), LazyError>> {
        match self.present_for(fi, offset, buf.len() as u64, Served::Read) {
            Ok(false) => None,
            Ok(true) => Some(
                self.inner.files[fi]
                    .read_exact_at(buf, offset)
                    .map_err(LazyError::from),
            ),
            Err(e) => Some(Err(e)),
        }
    }

    /// Writes `data` into lazy file `fi` at `offset`, once the slots it covers are here (a
    /// write never races an install). Blocks: call it from a thread that may.
    pub fn write_at(&self, fi: usize, offset: u64, data: &[u8]) -> Result<(), LazyError> {
        self.wait_for(fi, offset, data.len() as u64, Served::Write)?;
        self.inner.files[fi].write_all_at(data, offset)?;
        Ok(())
    }

    /// Writes like [`LazyFiles::write_at`] when every slot it covers is present, without
    /// waiting; answers `None` (and asks for nothing) when one is not.
    pub fn try_write_at(
        &self,
        fi: usize,
        offset: u64,
        data: &[u8],
    ) -> Option<Result<(), LazyError>> {
        // A slot once present stays present, and installs write only missing slots: the
        // write below cannot race one.
        match self.present_for(fi, offset, data.len() as u64, Served::Write) {
            Ok(false) => None,
            Ok(true) => Some(
                self.inner.files[fi]
                    .write_all_at(data, offset)
                    .map_err(LazyError::from),
            ),
            Err(e) => Some(Err(e)),
        }
    }

    /// Whether every slot of the range is present (counted as served, as `what`, when it is).
    fn present_for(
        &self,
        fi: usize,
        offset: u64,
        len: u64,
        what: Served,
    ) -> Result<bool, LazyError> {
        let (first, last) = self.slot_range(fi, offset, len)?;
        let mut st = self.lock();
        if let Some(why) = &st.failed {
            return Err(LazyError::Failed(why.clone()));
        }
        if len == 0 {
            return Ok(true);
        }
        let here = match st.slots.get(&fi) {
            Some(v) => v[first as usize..=last as usize]
                .iter()
                .all(|s| *s == Slot::Present),
            None => true,
        };
        if here {
            if st.recording {
                self.record_touch(&mut st, fi, first, last);
            }
            what.count(&mut st.report, len);
        }
        Ok(here)
    }

    /// Notes slots `first..=last` of file `fi` that come from the store as touched (the
    /// first time only).
    fn record_touch(&self, st: &mut State, fi: usize, first: u64, last: u64) {
        let per = &self.inner.slot_chunk[&fi];
        for slot in first..=last {
            if per[slot as usize].is_some() && st.touched_set.insert((fi, slot)) {
                st.touched.push((fi, slot));
            }
        }
    }

    /// The slots `[offset, offset + len)` of lazy file `fi` covers, first and last (`(1, 0)`
    /// for an empty range), or why the range is refused.
    fn slot_range(&self, fi: usize, offset: u64, len: u64) -> Result<(u64, u64), LazyError> {
        let size = self.size(fi);
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(LazyError::OutOfRange { offset, len, size });
        }
        if !self.inner.slot_chunk.contains_key(&fi) {
            return Err(LazyError::NotLazy(fi));
        }
        if len == 0 {
            return Ok((1, 0));
        }
        let cs = self.inner.m.chunk_size as u64;
        Ok((offset / cs, (offset + len - 1) / cs))
    }

    /// Waits until every slot of `[offset, offset + len)` of file `fi` is present.
    fn wait_for(&self, fi: usize, offset: u64, len: u64, what: Served) -> Result<(), LazyError> {
        let (first, last) = self.slot_range(fi, offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let per = &self.inner.slot_chunk[&fi];
        let t0 = Instant::now();
        let limit = self.inner.opts.stall_limit();
        let mut st = self.lock();
        if st.recording {
            self.record_touch(&mut st, fi, first, last);
        }
        let mut waited = false;
        loop {
            if let Some(why) = &st.failed {
                return Err(LazyError::Failed(why.clone()));
            }
            let mut here = true;
            let mut asked = false;
            for slot in first..=last {
                let s = st.slots.get(&fi).map(|v| v[slot as usize]);
                match s {
                    Some(Slot::Present) | None => {}
                    Some(Slot::Installing) => here = false,
                    Some(Slot::Missing) => {
                        here = false;
                        if let Some(c) = per[slot as usize] {
                            if st.chunks[c as usize] == Chunk::Idle {
                                st.chunks[c as usize] = Chunk::Wanted;
                                st.wanted.push_back(c);
                                asked = true;
                            }
                        }
                    }
                }
            }
            if here {
                break;
            }
            if asked {
                self.inner.asked.notify_one();
            }
            waited = true;
            let left = limit.saturating_sub(t0.elapsed());
            if left.is_zero() {
                let why = format!(
                    "a read of {} waited {:?} for the object store",
                    self.inner.m.files[fi].name, limit
                );
                st.failed = Some(why.clone());
                self.inner.changed.notify_all();
                return Err(LazyError::Failed(why));
            }
            st = self
                .inner
                .changed
                .wait_timeout(st, left.min(Duration::from_millis(500)))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        if waited {
            st.report.waits += 1;
            st.report.waited += t0.elapsed();
        }
        what.count(&mut st.report, len);
        Ok(())
    }

    /// Fetches every missing chunk: the ones waiters ask for first, then the prefetch list,
    /// then the rest in pack order; answers once every slot is present (the files are then
    /// whole), or the error that failed the restore (after which nothing is installed).
    pub async fn hydrate(&self) -> Result<LazyReport, FetchError> {
        let t0 = Instant::now();
        let r = fill::drive(&self.inner).await;
        if let Err(e) = &r {
            fail(&self.inner, e.to_string());
        }
        r?;
        let mut st = self.lock();
        st.report.hydrated_in = t0.elapsed();
        Ok(st.report.clone())
    }
}

/// What a served range was, for the report.
#[derive(Debug, Clone, Copy)]
enum Served {
    Read,
    Write,
}

impl Served {
    fn count(self, r: &mut LazyReport, len: u64) {
        match self {
            Served::Read => {
                r.served_reads += 1;
                r.served_read_bytes += len;
            }
            Served::Write => {
                r.served_writes += 1;
                r.served_write_bytes += len;
            }
        }
    }
}

fn fail(inner: &Inner, why: String) {
    let mut st = inner.lock_state();
    if st.failed.is_none() {
        st.failed = Some(why);
    }
    drop(st);
    inner.changed.notify_all();
    inner.asked.notify_one();
    inner.prefetch_done.notify_waiters();
}

/// The chunks of prefetch list `list` ((file name, slot) pairs), in its order, each once;
/// slots that are not lazy or hold no stored chunk are left out.
fn prefetch_chunks(
    m: &Manifest,
    list: &[(String, u64)],
    slot_chunk: &HashMap<usize, Vec<Option<u32>>>,
) -> Vec<u32> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for (name, slot) in list {
        let Some(fi) = m.files.iter().position(|f| &f.name == name) else {
            continue;
        };
        let Some(c) = slot_chunk
            .get(&fi)
            .and_then(|per| per.get(*slot as usize))
            .copied()
            .flatten()
        else {
            continue;
        };
        if seen.insert(c) {
            out.push(c);
        }
    }
    out
}
