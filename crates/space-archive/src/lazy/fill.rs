//! Filling a lazy restore's files in: the loop that decides what to read next (what waiters
//! asked for, then the prefetch list, then the rest), the reads of the store with their
//! retries, and the installation of each opened and checked chunk into the slots still
//! missing.

use std::collections::{HashMap, HashSet, VecDeque};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use tokio::task::JoinSet;

use super::{pause_after, Chunk, Inner, Slot, Why, MAX_GAP, MAX_READ, MAX_URGENT, MAX_URGENT_READ};
use crate::fetch::{plan_reads, FetchError};
use crate::manifest::DeltaOn;
use crate::pack::{decode_chunk, decode_stored, put_pages, verify, ChunkError};
use crate::store::StoreError;

/// The background order: the prefetch list's chunks first, by pack and offset (so that
/// neighbours share a read: the whole list is wanted before the VM runs, in any order), then
/// the others the same way (the order uploads wrote them, roughly the files' order).
fn background_order(inner: &Inner) -> (VecDeque<u32>, HashSet<u32>) {
    let by_place = |&c: &u32| {
        let l = &inner.m.chunks[c as usize];
        (l.pack, l.offset)
    };
    let mut prefetch = inner.prefetch.clone();
    prefetch.sort_by_key(by_place);
    let mut prefetch = VecDeque::from(prefetch);
    let prefetched = inner.prefetch_set.clone();
    let mut rest: Vec<u32> = (0..inner.m.chunks.len() as u32)
        .filter(|c| !prefetched.contains(c))
        .filter(|&c| {
            inner.targets[c as usize]
                .iter()
                .any(|(fi, _)| inner.slot_chunk.contains_key(fi))
        })
        .collect();
    rest.sort_by_key(by_place);
    prefetch.extend(rest);
    (prefetch, prefetched)
}

pub(super) async fn drive(inner: &Arc<Inner>) -> Result<(), FetchError> {
    let (mut queue, prefetched) = background_order(inner);
    // Until this instant (if held), only waiters' chunks and the prefetch list are read.
    let held_until = inner
        .opts
        .hold_background
        .map(|d| tokio::time::Instant::now() + d);
    let holding = || {
        held_until.is_some_and(|t| tokio::time::Instant::now() < t)
            && !inner.released.load(Ordering::Acquire)
    };
    let held = |next: Option<&u32>| holding() && next.is_some_and(|c| !prefetched.contains(c));
    let mut set: JoinSet<Result<(), FetchError>> = JoinSet::new();
    let mut background = 0usize;
    let mut urgent = 0usize;
    let mut kinds: HashMap<tokio::task::Id, bool> = HashMap::new();
    loop {
        // What waiters asked for first.
        let wanted: Vec<u32> = {
            let mut st = inner.lock_state();
            if let Some(why) = &st.failed {
                return Err(FetchError::Io {
                    op: "restoring",
                    path: PathBuf::new(),
                    source: std::io::Error::other(why.clone()),
                });
            }
            if urgent >= MAX_URGENT {
                Vec::new()
            } else {
                let mut out = Vec::new();
                while let Some(c) = st.wanted.pop_front() {
                    if st.chunks[c as usize] == Chunk::Wanted {
                        st.chunks[c as usize] = Chunk::Fetching;
                        out.push(c);
                    }
                }
                // Their neighbours in the pack that nobody fetches yet come along.
                let extra: Vec<u32> = neighbours(inner, &out, &st.chunks);
                for &c in &extra {
                    st.chunks[c as usize] = Chunk::Fetching;
                }
                out.extend(extra);
                out
            }
        };
        if !wanted.is_empty() {
            for run in plan_reads(&inner.m, wanted, MAX_URGENT_READ) {
                let i2 = inner.clone();
                let h = set.spawn(async move { fetch_run(&i2, run, Why::Urgent).await });
                kinds.insert(h.id(), true);
                urgent += 1;
            }
        }
        // Then the prefetch list and the background, while there is room: the prefetch
        // list's chunks are few, scattered and wanted soon, so more of them are read at once.
        loop {
            skip_taken(inner, &mut queue);
            let room = match queue.front() {
                Some(c) if inner.opts.parallel > 0 && prefetched.contains(c) => {
                    inner.opts.parallel.max(PREFETCH_PARALLEL)
                }
                _ => inner.opts.parallel,
            };
            if background >= room || held(queue.front()) {
                break;
            }
            let hold = holding();
            let run = {
                let mut st = inner.lock_state();
                let mut run: Vec<u32> = Vec::new();
                let (mut pack, mut start, mut end) = (u32::MAX, 0u64, 0u64);
                let mut max = MAX_READ;
                while let Some(&c) = queue.front() {
                    if st.chunks[c as usize] != Chunk::Idle {
                        queue.pop_front();
                        continue;
                    }
                    let l = &inner.m.chunks[c as usize];
                    let l_end = l.offset + l.len as u64;
                    if !run.is_empty()
                        && ((hold && !prefetched.contains(&c))
                            || l.pack != pack
                            || l.offset < end
                            || l.offset > end + MAX_GAP
                            || l_end - start > max)
                    {
                        break;
                    }
                    if run.is_empty() {
                        (pack, start) = (l.pack, l.offset);
                        if prefetched.contains(&c) {
                            max = PREFETCH_READ;
                        }
                    }
                    end = l_end;
                    st.chunks[c as usize] = Chunk::Fetching;
                    run.push(c);
                    queue.pop_front();
                }
                run
            };
            if run.is_empty() {
                break;
            }
            let why = if prefetched.contains(&run[0]) {
                Why::Prefetch
            } else {
                Why::Background
            };
            let i2 = inner.clone();
            let h = set.spawn(async move { fetch_run(&i2, run, why).await });
            kinds.insert(h.id(), false);
            background += 1;
        }
        if set.is_empty() {
            {
                let st = inner.lock_state();
                if st.missing == 0 {
                    return Ok(());
                }
                if inner.opts.parallel > 0 && st.wanted.is_empty() && queue.is_empty() {
                    // Every chunk was fetched; a slot still missing would be a chunk
                    // without a place, which the manifest's validation rules out.
                    return Err(FetchError::Io {
                        op: "restoring",
                        path: PathBuf::new(),
                        source: std::io::Error::other(format!(
                            "{} slots are still missing after every chunk was fetched",
                            st.missing
                        )),
                    });
                }
            }
            // Nothing in flight: wait for a waiter to ask (no background reads), or for
            // the background to be let go.
            tokio::select! {
                _ = inner.asked.notified() => {}
                _ = hold_ends(held_until), if held(queue.front()) => {}
            }
            continue;
        }
        tokio::select! {
            _ = inner.asked.notified() => {}
            _ = hold_ends(held_until), if held(queue.front()) => {}
            done = set.join_next_with_id() => {
                let Some(done) = done else { continue };
                let (id, r) = match done {
                    Ok((id, r)) => (id, r),
                    Err(e) => {
                        return Err(FetchError::Io {
                            op: "fetching",
                            path: PathBuf::new(),
                            source: std::io::Error::other(e.to_string()),
                        })
                    }
                };
                if kinds.remove(&id) == Some(true) {
                    urgent -= 1;
                } else {
                    background -= 1;
                }
                r?;
            }
        }
    }
}

/// Reads of the prefetch list in flight at once.
const PREFETCH_PARALLEL: usize = 32;
/// The most one read of the prefetch list covers: the list is wanted all at once, so more
/// reads in parallel beat fewer larger ones.
const PREFETCH_READ: u64 = 2 << 20;

/// Drops the chunks at the front of `queue` that are fetched or being fetched already.
fn skip_taken(inner: &Inner, queue: &mut VecDeque<u32>) {
    let st = inner.lock_state();
    while queue
        .front()
        .is_some_and(|&c| st.chunks[c as usize] != Chunk::Idle)
    {
        queue.pop_front();
    }
}

/// Resolves when the background's hold runs out (never if there is none).
async fn hold_ends(until: Option<tokio::time::Instant>) {
    match until {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// Missing chunks next to `these` in their packs that nobody is fetching, so that one read
/// brings a little more than it must (what is near in a pack is near in the file).
fn neighbours(inner: &Inner, these: &[u32], chunks: &[Chunk]) -> Vec<u32> {
    let mut out = Vec::new();
    let taken: HashSet<u32> = these.iter().copied().collect();
    for &c in these {
        let l = &inner.m.chunks[c as usize];
        let mut size = l.len as u64;
        for (&(pack, _), &n) in inner.by_pack.range((l.pack, l.offset + 1)..) {
            if pack != l.pack || size >= MAX_URGENT_READ {
                break;
            }
            if chunks[n as usize] != Chunk::Idle || taken.contains(&n) || out.contains(&n) {
                break;
            }
            size += inner.m.chunks[n as usize].len as u64;
            out.push(n);
        }
    }
    out
}

/// One ranged read of a pack, tried again after a failure or a stall.
async fn read_range(
    inner: &Inner,
    pack: u32,
    range: std::ops::Range<u64>,
) -> Result<Bytes, FetchError> {
    let name = inner.m.packs[pack as usize].clone();
    let path = inner.archive.pack_path(&inner.m.lineage, &name)?;
    let tries = inner.opts.attempts.max(1);
    let mut last: Option<FetchError> = None;
    for n in 0..tries {
        if n > 0 {
            tokio::time::sleep(pause_after(n)).await;
            inner.lock_state().report.retries += 1;
        }
        if inner.lock_state().failed.is_some() {
            break;
        }
        inner.lock_state().report.reads += 1;
        let got = tokio::time::timeout(
            inner.opts.read_timeout,
            inner.archive.get_range(&path, range.clone()),
        )
        .await;
        match got {
            Ok(Ok(bytes)) if (bytes.len() as u64) < range.end - range.start => {
                // A short pack does not grow back: no retry.
                return Err(FetchError::Short { pack: name });
            }
            Ok(Ok(bytes)) => {
                inner.lock_state().report.fetched_bytes += bytes.len() as u64;
                return Ok(bytes);
            }
            Ok(Err(e @ StoreError::Missing { .. })) => return Err(e.into()),
            Ok(Err(e)) => last = Some(e.into()),
            Err(_) => {
                last = Some(FetchError::Io {
                    op: "reading",
                    path: PathBuf::from(path.to_string()),
                    source: std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!(
                            "the object store did not answer within {:?}",
                            inner.opts.read_timeout
                        ),
                    ),
                })
            }
        }
    }
    Err(last.unwrap_or_else(|| FetchError::Io {
        op: "reading",
        path: PathBuf::from(path.to_string()),
        source: std::io::Error::other("the restore failed meanwhile"),
    }))
}

/// Fetches chunks `run` (one pack, close together), and the chunks their deltas apply to,
/// opens and checks them, and installs them.
pub(super) async fn fetch_run(
    inner: &Arc<Inner>,
    run: Vec<u32>,
    why: Why,
) -> Result<(), FetchError> {
    let m = &inner.m;
    // The chunks deltas of the run apply to come along (from wherever they are).
    let mut need: Vec<u32> = run.clone();
    for &c in &run {
        if let Some(DeltaOn::Chunk(r)) = m.chunks[c as usize].delta.as_ref().map(|d| &d.on) {
            if !need.contains(r) {
                need.push(*r);
            }
        }
    }
    let mut sealed: HashMap<u32, Bytes> = HashMap::new();
    for read in plan_reads(m, need, u64::MAX) {
        let pack = m.chunks[read[0] as usize].pack;
        let start = m.chunks[read[0] as usize].offset;
        let end = read
            .iter()
            .map(|&i| m.chunks[i as usize].offset + m.chunks[i as usize].len as u64)
            .max()
            .unwrap_or(start);
        let bytes = read_range(inner, pack, start..end).await?;
        for &i in &read {
            let c = &m.chunks[i as usize];
            let lo = (c.offset - start) as usize;
            sealed.insert(i, bytes.slice(lo..lo + c.len as usize));
        }
    }
    let i2 = inner.clone();
    let gone = |e: String| FetchError::Io {
        op: "installing chunks",
        path: PathBuf::new(),
        source: std::io::Error::other(e),
    };
    let nice = match why {
        Why::Urgent => {
            return tokio::task::spawn_blocking(move || install_all(&i2, &run, &sealed, why))
                .await
                .map_err(|e| gone(e.to_string()))?;
        }
        Why::Prefetch => PREFETCH_NICE,
        Why::Background => BACKGROUND_NICE,
    };
    // Nobody waits for these yet: opening and checking them (most of a restore's CPU) yields
    // to the VM, which starts on the same cores (the prefetch list while QEMU starts, the
    // background while the guest runs).
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("lazy-fill".into())
        .spawn(move || {
            lower_priority(nice);
            let _ = tx.send(install_all(&i2, &run, &sealed, why));
        })
        .map_err(|e| gone(e.to_string()))?;
    rx.await
        .map_err(|_| gone("the installing thread ended early".into()))?
}

/// How much lower than the node the threads that install background chunks run (a nice
/// value: at 10 a thread gets about a tenth of a core another wants).
const BACKGROUND_NICE: libc::c_int = 10;
/// The same for the prefetch list's chunks, read while QEMU starts: at 5 a thread gets
/// about a third of what a thread at 0 gets of a core both want.
const PREFETCH_NICE: libc::c_int = 5;

/// Lowers the calling thread's CPU priority to `nice` (Linux keeps a nice value per thread).
fn lower_priority(nice: libc::c_int) {
    // SAFETY: gettid has no preconditions; setpriority reads only its integer arguments,
    // and on Linux PRIO_PROCESS with a thread id changes that one thread.
    let r = unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice)
    };
    if r != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "lowering a filling thread's priority");
    }
}

fn install_all(
    inner: &Inner,
    run: &[u32],
    sealed: &HashMap<u32, Bytes>,
    why: Why,
) -> Result<(), FetchError> {
    let m = &inner.m;
    let pack_of = |i: u32| m.packs[m.chunks[i as usize].pack as usize].clone();
    let mut whole: HashMap<u32, Vec<u8>> = HashMap::new();
    let open_whole = |i: u32, whole: &mut HashMap<u32, Vec<u8>>| -> Result<(), FetchError> {
        if whole.contains_key(&i) {
            return Ok(());
        }
        let c = &m.chunks[i as usize];
        let plain = decode_chunk(&inner.keys, &c.id, c.plain_len as usize, &sealed[&i]).map_err(
            |source| FetchError::Chunk {
                pack: pack_of(i),
                source,
            },
        )?;
        whole.insert(i, plain);
        Ok(())
    };
    for &i in run {
        let c = &m.chunks[i as usize];
        let plain = match &c.delta {
            None => {
                open_whole(i, &mut whole)?;
                whole[&i].clone()
            }
            Some(d) => {
                let bad = |source| FetchError::Chunk {
                    pack: pack_of(i),
                    source,
                };
                let pages =
                    decode_stored(&inner.keys, &c.id, d.stored_len(c.plain_len), &sealed[&i])
                        .map_err(bad)?;
                let len = c.plain_len as usize;
                let mut plain = match &d.on {
                    DeltaOn::Base { file, index } => {
                        let mut b = vec![0u8; len];
                        let off = index * m.chunk_size as u64;
                        inner.base_files[file]
                            .read_exact_at(&mut b, off)
                            .map_err(|_| FetchError::Chunk {
                                pack: pack_of(i),
                                source: ChunkError::Malformed {
                                    id: c.id,
                                    why: format!(
                                        "the chunk it applies to (base file {file}, chunk \
                                         {index}) is shorter than it"
                                    ),
                                },
                            })?;
                        b
                    }
                    DeltaOn::Chunk(r) => {
                        open_whole(*r, &mut whole)?;
                        let mut b = whole[r].clone();
                        b.resize(len, 0);
                        b
                    }
                };
                put_pages(d, c.plain_len, &pages, &mut plain);
                verify(&inner.keys, &c.id, &plain).map_err(bad)?;
                plain
            }
        };
        install(inner, i, &plain)?;
        let mut st = inner.lock_state();
        let before = std::mem::replace(&mut st.chunks[i as usize], Chunk::Done);
        if before != Chunk::Done && inner.prefetch_set.contains(&i) {
            st.prefetch_left -= 1;
            if st.prefetch_left == 0 {
                inner.prefetch_done.notify_waiters();
            }
        }
        match why {
            Why::Urgent => st.report.urgent_chunks += 1,
            Why::Prefetch => st.report.prefetched_chunks += 1,
            Why::Background => st.report.background_chunks += 1,
        }
    }
    Ok(())
}

/// Writes the opened chunk `i` wherever it goes and is still missing.
fn install(inner: &Inner, i: u32, plain: &[u8]) -> Result<(), FetchError> {
    let cs = inner.m.chunk_size as u64;
    for &(fi, off) in &inner.targets[i as usize] {
        let lazy = inner.slot_chunk.contains_key(&fi);
        if lazy {
            let mut st = inner.lock_state();
            if st.failed.is_some() {
                return Ok(());
            }
            let slot =
                &mut st.slots.get_mut(&fi).expect("a lazy file's slots")[(off / cs) as usize];
            if *slot != Slot::Missing {
                continue;
            }
            *slot = Slot::Installing;
        }
        let written = inner.files[fi].write_all_at(plain, off);
        if lazy {
            let mut st = inner.lock_state();
            let slot =
                &mut st.slots.get_mut(&fi).expect("a lazy file's slots")[(off / cs) as usize];
            if written.is_ok() {
                *slot = Slot::Present;
                st.missing -= 1;
            } else {
                *slot = Slot::Missing;
            }
            drop(st);
            inner.changed.notify_all();
        }
        written.map_err(|source| FetchError::Io {
            op: "writing",
            path: inner.paths[fi].clone(),
            source,
        })?;
    }
    Ok(())
}
