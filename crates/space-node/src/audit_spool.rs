//! A cluster node's egress audit events, kept on disk until the control plane has them.
//!
//! On `space up` the gateway's events go straight to the audit log in the same process. A
//! node of a cluster has no database: its gateway writes each event to this spool (a queue
//! and a writer thread, so the gateway never waits for a disk), and the member delivers the
//! spool's oldest events to a control replica (`POST /v1/cluster/audit`) and drops them once
//! a replica has recorded them. A replica that cannot be reached, or a node that restarts,
//! loses nothing: the events wait in `<dir>/events.jsonl`, and `<dir>/carried` says how far
//! delivery got. Delivery is at least once (a batch whose answer was lost goes again).
//!
//! The spool is bounded: past [`MAX_SPOOL_BYTES`] waiting, new events are dropped, counted
//! and logged, as the in-process sink drops when its queue is full.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use space_node_api::secrets::{EgressAudit, EgressEvent, EgressRecord};

use crate::record::now_ms;

/// The spool's directory under a node's `<data>/state/`.
pub const SPOOL_DIR: &str = "egress-audit";
/// Events waiting on disk past which new ones are dropped: 64 MiB (about 200,000 events).
pub const MAX_SPOOL_BYTES: u64 = 64 << 20;
/// Events queued for the writer thread (before [`EgressSpool::open`], and under a burst).
const QUEUE: usize = 10_000;
/// Delivered bytes at the head of the file past which it is rewritten without them.
const COMPACT_AT: u64 = 8 << 20;
/// The longest line read back (an event is a few hundred bytes).
const MAX_LINE: usize = 64 << 10;

/// The spool: the gateway's [`EgressAudit`], and what the member delivers from.
pub struct EgressSpool {
    tx: SyncSender<EgressRecord>,
    rx: Mutex<Option<Receiver<EgressRecord>>>,
    dir: PathBuf,
    file: Arc<Mutex<Option<SpoolFile>>>,
    wake: Arc<tokio::sync::Notify>,
    dropped: Arc<AtomicU64>,
}

impl std::fmt::Debug for EgressSpool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EgressSpool")
            .field("dir", &self.dir)
            .field("dropped", &self.dropped())
            .finish_non_exhaustive()
    }
}

/// Events read from the spool, and how far they reach.
#[derive(Debug)]
pub struct SpoolBatch {
    /// Oldest first.
    pub events: Vec<EgressRecord>,
    /// Give this to [`EgressSpool::carried`] once the control plane recorded them.
    pub upto: u64,
}

struct SpoolFile {
    path: PathBuf,
    carried_path: PathBuf,
    log: File,
    /// Bytes in the file, all whole lines.
    len: u64,
    /// Bytes at its head already delivered.
    carried: u64,
}

impl EgressSpool {
    /// A spool in `dir`. Events queue in memory until [`EgressSpool::open`] (the directory
    /// may be on the data disk the node mounts when it opens).
    pub fn new(dir: impl Into<PathBuf>) -> Arc<EgressSpool> {
        let (tx, rx) = sync_channel(QUEUE);
        Arc::new(EgressSpool {
            tx,
            rx: Mutex::new(Some(rx)),
            dir: dir.into(),
            file: Arc::new(Mutex::new(None)),
            wake: Arc::new(tokio::sync::Notify::new()),
            dropped: Arc::new(AtomicU64::new(0)),
        })
    }

    /// Opens (or makes) the files and starts the writer thread. A second call does nothing.
    pub fn open(&self) -> std::io::Result<()> {
        let Some(rx) = self.rx.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return Ok(());
        };
        let spool = SpoolFile::open(&self.dir)?;
        *self.file.lock().unwrap_or_else(|e| e.into_inner()) = Some(spool);
        let (file, wake, dropped) = (self.file.clone(), self.wake.clone(), self.dropped.clone());
        std::thread::Builder::new()
            .name("egress-spool".into())
            .spawn(move || write_events(rx, &file, &wake, &dropped))?;
        Ok(())
    }

    /// Events dropped because the spool was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Up to `max` of the oldest events not delivered yet; `None` when there are none (or the
    /// spool is not open). Blocking file reads: call it off the runtime's threads.
    pub fn batch(&self, max: usize) -> std::io::Result<Option<SpoolBatch>> {
        let guard = self.file.lock().unwrap_or_else(|e| e.into_inner());
        let Some(f) = guard.as_ref() else {
            return Ok(None);
        };
        if f.carried >= f.len {
            return Ok(None);
        }
        let mut r = BufReader::new(File::open(&f.path)?);
        r.seek(SeekFrom::Start(f.carried))?;
        let mut events = Vec::new();
        let mut at = f.carried;
        let mut line = Vec::new();
        while events.len() < max && at < f.len {
            line.clear();
            let n = r
                .by_ref()
                .take(MAX_LINE as u64)
                .read_until(b'\n', &mut line)?;
            if n == 0 {
                break;
            }
            at += n as u64;
            // A line that does not parse (cut by a crash, or too long) is skipped: one event
            // lost is better than a spool that never drains.
            match serde_json::from_slice::<EgressRecord>(&line) {
                Ok(e) => events.push(e),
                Err(e) => tracing::warn!(error = %e, "an unreadable line in the egress spool"),
            }
        }
        Ok(Some(SpoolBatch { events, upto: at }))
    }

    /// The events up to `upto` are in the audit log: they go from the spool.
    pub fn carried(&self, upto: u64) -> std::io::Result<()> {
        let mut guard = self.file.lock().unwrap_or_else(|e| e.into_inner());
        let Some(f) = guard.as_mut() else {
            return Ok(());
        };
        f.carried = upto.clamp(f.carried, f.len);
        if f.carried == f.len {
            f.log.set_len(0)?;
            f.len = 0;
            f.carried = 0;
        } else if f.carried >= COMPACT_AT {
            f.compact()?;
        }
        f.save_carried()
    }

    /// Waits until an event is written, or `at_most`.
    pub async fn written(&self, at_most: Duration) {
        let _ = tokio::time::timeout(at_most, self.wake.notified()).await;
    }
}

impl EgressAudit for EgressSpool {
    fn record(&self, event: EgressEvent) {
        match self.tx.try_send(EgressRecord::new(event, now_ms())) {
            Ok(()) => {}
            Err(TrySendError::Full(e)) | Err(TrySendError::Disconnected(e)) => {
                dropped_one(&self.dropped, &e, "the egress spool's queue is full");
            }
        }
    }
}

fn dropped_one(dropped: &AtomicU64, e: &EgressRecord, why: &str) {
    let n = dropped.fetch_add(1, Ordering::Relaxed);
    // The first drop and then every 1000th: a flood does not flood the log.
    if n.is_multiple_of(1000) {
        tracing::warn!(sandbox = %e.sandbox, operation = %e.operation, dropped = n + 1, "{why}; dropping egress audit events");
    }
}

fn write_events(
    rx: Receiver<EgressRecord>,
    file: &Mutex<Option<SpoolFile>>,
    wake: &tokio::sync::Notify,
    dropped: &AtomicU64,
) {
    while let Ok(e) = rx.recv() {
        let mut line = match serde_json::to_vec(&e) {
            Ok(l) => l,
            Err(err) => {
                tracing::error!(error = %err, "an egress event that does not serialize");
                continue;
            }
        };
        line.push(b'\n');
        let mut guard = file.lock().unwrap_or_else(|e| e.into_inner());
        let Some(f) = guard.as_mut() else { continue };
        if f.len - f.carried + line.len() as u64 > MAX_SPOOL_BYTES {
            dropped_one(
                dropped,
                &e,
                "the egress spool is full (the control plane has not taken its events)",
            );
            continue;
        }
        match f.log.write_all(&line) {
            Ok(()) => f.len += line.len() as u64,
            Err(err) => {
                // What went out of a failed write may be part of a line: the file is cut back
                // to the last whole one.
                tracing::error!(error = %err, "writing the egress spool");
                let _ = f.log.set_len(f.len);
                dropped_one(dropped, &e, "the egress spool cannot be written");
                continue;
            }
        }
        drop(guard);
        wake.notify_one();
    }
}

impl SpoolFile {
    fn open(dir: &Path) -> std::io::Result<SpoolFile> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join("events.jsonl");
        let carried_path = dir.join("carried");
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .read(true)
            .open(&path)?;
        // A crash may have cut the last line: the file ends at its last whole line.
        let len = whole_lines(&path)?;
        log.set_len(len)?;
        let carried = std::fs::read_to_string(&carried_path)
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(0)
            .min(len);
        Ok(SpoolFile {
            path,
            carried_path,
            log,
            len,
            carried,
        })
    }

    fn save_carried(&self) -> std::io::Result<()> {
        let tmp = self.carried_path.with_extension("tmp");
        std::fs::write(&tmp, self.carried.to_string())?;
        std::fs::rename(&tmp, &self.carried_path)
    }

    /// Rewrites the file without its delivered head.
    fn compact(&mut self) -> std::io::Result<()> {
        let tmp = self.path.with_extension("tmp");
        {
            let mut from = File::open(&self.path)?;
            from.seek(SeekFrom::Start(self.carried))?;
            let mut to = File::create(&tmp)?;
            std::io::copy(
                &mut Read::by_ref(&mut from).take(self.len - self.carried),
                &mut to,
            )?;
            to.sync_all()?;
        }
        std::fs::rename(&tmp, &self.path)?;
        self.log = OpenOptions::new()
            .append(true)
            .read(true)
            .open(&self.path)?;
        self.len -= self.carried;
        self.carried = 0;
        Ok(())
    }
}

/// The length of `path` up to the end of its last whole line.
fn whole_lines(path: &Path) -> std::io::Result<u64> {
    let data = std::fs::read(path)?;
    Ok(data
        .iter()
        .rposition(|b| *b == b'\n')
        .map_or(0, |i| i as u64 + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(i: u16) -> EgressEvent {
        EgressEvent {
            sandbox: "sbx-0011223344556677".parse().unwrap(),
            operation: "egress.allow",
            host: format!("host-{i}.example.com"),
            port: i,
            detail: String::new(),
        }
    }

    async fn until_spooled(s: &EgressSpool, n: usize) -> SpoolBatch {
        // Bounded by time, and polled: the writer wakes a waiter once per event, and each
        // look reads the whole spool.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::time::Instant::now() < deadline {
            if let Some(b) = s.batch(usize::MAX).unwrap() {
                if b.events.len() >= n {
                    return b;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let got = s.batch(usize::MAX).unwrap().map(|b| b.events.len());
        panic!(
            "{n} events never reached the spool (got {got:?}, dropped {})",
            s.dropped()
        );
    }

    #[tokio::test]
    async fn events_wait_for_open_survive_a_restart_and_go_once_carried() {
        let dir = tempfile::tempdir().unwrap();
        let spool = EgressSpool::new(dir.path().join("egress"));
        // Before open: held in the queue, not lost.
        for i in 0..3 {
            spool.record(event(i));
        }
        assert!(spool.batch(10).unwrap().is_none());
        spool.open().unwrap();
        for i in 3..5 {
            spool.record(event(i));
        }
        let b = until_spooled(&spool, 5).await;
        let ports: Vec<u16> = b.events.iter().map(|e| e.port).collect();
        assert_eq!(ports, vec![0, 1, 2, 3, 4]);
        // Two delivered; the rest stays, across a restart of the node.
        let two = spool.batch(2).unwrap().unwrap();
        assert_eq!(two.events.len(), 2);
        spool.carried(two.upto).unwrap();
        drop(spool);
        let again = EgressSpool::new(dir.path().join("egress"));
        again.open().unwrap();
        let rest = again.batch(10).unwrap().unwrap();
        let ports: Vec<u16> = rest.events.iter().map(|e| e.port).collect();
        assert_eq!(ports, vec![2, 3, 4]);
        assert_eq!(rest.events[0].operation, "egress.allow");
        assert_eq!(rest.events[0].host, "host-2.example.com");
        again.carried(rest.upto).unwrap();
        assert!(again.batch(10).unwrap().is_none());
        // Emptied: the file is cut to nothing.
        assert_eq!(
            std::fs::metadata(dir.path().join("egress/events.jsonl"))
                .unwrap()
                .len(),
            0
        );
    }

    #[tokio::test]
    async fn a_cut_last_line_is_dropped_and_the_rest_reads() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("egress");
        let spool = EgressSpool::new(&d);
        spool.open().unwrap();
        spool.record(event(7));
        until_spooled(&spool, 1).await;
        drop(spool);
        // A crash in the middle of a write.
        let mut f = OpenOptions::new()
            .append(true)
            .open(d.join("events.jsonl"))
            .unwrap();
        f.write_all(b"{\"at_unix_ms\":1,\"sandbox\":\"sbx-00")
            .unwrap();
        let spool = EgressSpool::new(&d);
        spool.open().unwrap();
        spool.record(event(8));
        let b = until_spooled(&spool, 2).await;
        let ports: Vec<u16> = b.events.iter().map(|e| e.port).collect();
        assert_eq!(ports, vec![7, 8]);
    }

    #[tokio::test]
    async fn a_long_delivered_head_is_compacted_away() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("egress");
        let spool = EgressSpool::new(&d);
        spool.open().unwrap();
        // About 1 KiB an event: the head passes the mark after some 8,000 delivered.
        let big = |i: u16| EgressEvent {
            detail: "x".repeat(1000),
            ..event(i)
        };
        let mut port = 0u16;
        let mut pending = 0usize;
        loop {
            for _ in 0..500 {
                spool.record(big(port));
                port += 1;
            }
            pending += 500;
            let all = until_spooled(&spool, pending).await;
            // All but the newest delivered.
            let head = spool.batch(all.events.len() - 1).unwrap().unwrap();
            spool.carried(head.upto).unwrap();
            pending = 1;
            if head.upto >= COMPACT_AT {
                let len = std::fs::metadata(d.join("events.jsonl")).unwrap().len();
                assert!(len < 2 << 10, "not compacted: {len} bytes");
                break;
            }
            assert!(port < 20_000, "the head never reached {COMPACT_AT} bytes");
        }
        let rest = spool.batch(10).unwrap().unwrap();
        assert_eq!(rest.events.len(), 1);
        assert_eq!(rest.events[0].port, port - 1);
        // Written to after the compaction, read back in order.
        spool.record(big(port));
        let b = until_spooled(&spool, 2).await;
        let ports: Vec<u16> = b.events.iter().map(|e| e.port).collect();
        assert_eq!(ports, vec![port - 1, port]);
    }
}
