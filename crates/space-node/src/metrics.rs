//! Per-sandbox resource samples: every tick the sampler asks each running sandbox's driver
//! for its guest connection and its VMM's use of the host ([`Probe`]), asks the guest daemon
//! for its counters (`GET /v1/stats`), reads the gateway's byte counters, and appends one
//! [`MetricSample`] to the sandbox's [`Series`].
//!
//! A series is bounded: it holds at most [`CAPACITY`] samples, and when full, the older half
//! is merged pairwise ([`MetricSample::merge`]). Recent samples keep the sampling interval;
//! older ones cover longer spans, so a sandbox's whole life fits in the bound. Series live in
//! the node's memory: they survive pause, suspend and restore on this node, and end with the
//! sandbox (kill) or with the node process.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use space_node_api::MetricSample;
use space_proto::GuestStats;
use space_runtime::{GuestClient, HostUsage};

use crate::ids::SandboxId;
use crate::record::{now_ms, State};
use crate::sandbox::{reply, Handle, Request};

/// Most samples a series keeps.
pub const CAPACITY: usize = 1024;
/// How long a guest may take to answer its counters before the tick skips the sandbox.
const GUEST_PATIENCE: Duration = Duration::from_secs(3);

/// What a running sandbox's driver answers the sampler: its guest connection and what its
/// VMM uses of the host. Reading it is not activity for the idle timeout.
pub(crate) struct Probe {
    pub client: Option<GuestClient>,
    pub host: Option<HostUsage>,
    /// The VMM's pid: counters start over with a new VM.
    pub vm_pid: u32,
}

/// The cumulative counters a sample is the difference of.
#[derive(Debug, Clone, Copy)]
struct Counters {
    at: Instant,
    vm_pid: u32,
    guest_busy: u64,
    guest_total: u64,
    host_cpu_ns: u64,
    sent: u64,
    received: u64,
}

/// One sandbox's samples, oldest first, and the counters of its last sampling.
#[derive(Default)]
pub(crate) struct Series {
    samples: VecDeque<MetricSample>,
    last: Option<Counters>,
}

impl Series {
    fn push(&mut self, s: MetricSample) {
        if self.samples.len() >= CAPACITY {
            let half = CAPACITY / 2;
            let old: Vec<MetricSample> = self.samples.drain(..half).collect();
            for pair in old.chunks(2).rev() {
                let merged = match pair {
                    [a, b] => a.merge(b),
                    [a] => a.clone(),
                    _ => continue,
                };
                self.samples.push_front(merged);
            }
        }
        self.samples.push_back(s);
    }

    /// Samples whose span ends within `[start, end]`.
    fn range(&self, start: u64, end: u64) -> Vec<MetricSample> {
        self.samples
            .iter()
            .filter(|s| s.timestamp_unix_ms >= start && s.timestamp_unix_ms <= end)
            .cloned()
            .collect()
    }

    /// Turns a reading into a sample against the last one; the first reading of a VM (and
    /// one whose counters went backwards) only sets the base.
    fn record(&mut self, now: Counters, stats: &GuestStats, host_mem: u64, wall_ms: u64) -> bool {
        let last = self.last.replace(now);
        let Some(last) = last.filter(|l| l.vm_pid == now.vm_pid) else {
            return false;
        };
        let span = now.at.saturating_duration_since(last.at);
        if span.is_zero()
            || now.guest_total < last.guest_total
            || now.guest_busy < last.guest_busy
            || now.host_cpu_ns < last.host_cpu_ns
        {
            return false;
        }
        let ticks = (now.guest_total - last.guest_total) as f64;
        let busy = (now.guest_busy - last.guest_busy) as f64;
        let cpu_used_pct = if ticks > 0.0 {
            (busy / ticks * 100.0).clamp(0.0, 100.0)
        } else {
            0.0
        };
        let host_cpu_pct =
            (now.host_cpu_ns - last.host_cpu_ns) as f64 / span.as_nanos() as f64 * 100.0;
        self.push(MetricSample {
            timestamp_unix_ms: wall_ms,
            span_ms: span.as_millis() as u64,
            cpu_count: stats.cpu_count,
            cpu_used_pct,
            host_cpu_pct,
            mem_total_bytes: stats.mem_total_bytes,
            mem_used_bytes: stats
                .mem_total_bytes
                .saturating_sub(stats.mem_available_bytes),
            mem_cache_bytes: stats.mem_cache_bytes.min(stats.mem_total_bytes),
            host_mem_bytes: host_mem,
            disk_total_bytes: stats.disk_total_bytes,
            disk_used_bytes: stats.disk_used_bytes.min(stats.disk_total_bytes),
            net_sent_bytes: now.sent.saturating_sub(last.sent),
            net_received_bytes: now.received.saturating_sub(last.received),
        });
        true
    }
}

/// Every sandbox's series.
#[derive(Default)]
pub(crate) struct Metrics {
    series: Mutex<HashMap<SandboxId, Series>>,
}

impl Metrics {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SandboxId, Series>> {
        self.series.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The samples of `id` ending within `[start, end]` (none when it has no series yet).
    pub fn range(&self, id: &SandboxId, start: u64, end: u64) -> Vec<MetricSample> {
        self.lock()
            .get(id)
            .map(|s| s.range(start, end))
            .unwrap_or_default()
    }

    /// One sampling of every running sandbox in `handles`; series of sandboxes no longer
    /// there (or terminated) are dropped. Answers how many samples it took.
    pub async fn sample(&self, handles: Vec<(SandboxId, Handle)>) -> usize {
        {
            let live: std::collections::HashSet<&SandboxId> = handles
                .iter()
                .filter(|(_, h)| h.status.state() != State::Terminated)
                .map(|(id, _)| id)
                .collect();
            self.lock().retain(|id, _| live.contains(id));
        }
        let running = handles
            .into_iter()
            .filter(|(_, h)| h.status.state() == State::Running);
        let readings = futures::future::join_all(running.map(|(id, h)| async move {
            let r = read(&h).await;
            (id, r)
        }))
        .await;
        let wall = now_ms();
        let mut taken = 0;
        let mut series = self.lock();
        for (id, reading) in readings {
            let Some((counters, stats, host_mem)) = reading else {
                continue;
            };
            let s = series.entry(id).or_default();
            taken += usize::from(s.record(counters, &stats, host_mem, wall));
        }
        taken
    }
}

/// One reading of a running sandbox, or `None` when its driver is busy, it stopped running,
/// or its guest did not answer in time (the tick skips it).
async fn read(h: &Handle) -> Option<(Counters, GuestStats, u64)> {
    let (tx, rx) = reply();
    h.tx.try_send(Request::Probe(tx)).ok()?;
    let probe = tokio::time::timeout(GUEST_PATIENCE, rx)
        .await
        .ok()?
        .ok()?
        .ok()?;
    let client = probe.client?;
    let host = probe.host?;
    let stats = tokio::time::timeout(GUEST_PATIENCE, client.stats())
        .await
        .ok()?
        .ok()?;
    let (sent, received) = h.status.egress.traffic();
    let counters = Counters {
        at: Instant::now(),
        vm_pid: probe.vm_pid,
        guest_busy: stats.cpu_busy_ticks,
        guest_total: stats.cpu_total_ticks,
        host_cpu_ns: host.cpu_ns,
        sent,
        received,
    };
    Some((counters, stats, host.memory_bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counters(at: Instant, pid: u32, busy: u64, total: u64, host_ns: u64) -> Counters {
        Counters {
            at,
            vm_pid: pid,
            guest_busy: busy,
            guest_total: total,
            host_cpu_ns: host_ns,
            sent: busy * 10,
            received: busy * 20,
        }
    }

    fn stats() -> GuestStats {
        GuestStats {
            cpu_count: 2,
            mem_total_bytes: 1000,
            mem_available_bytes: 600,
            mem_cache_bytes: 5000,
            disk_total_bytes: 100,
            disk_used_bytes: 40,
            ..GuestStats::default()
        }
    }

    #[test]
    fn samples_are_differences_and_a_new_vm_starts_over() {
        let t0 = Instant::now();
        let mut s = Series::default();
        s.record(counters(t0, 1, 100, 1000, 0), &stats(), 7, 1);
        assert!(s.samples.is_empty(), "the first reading only sets the base");
        let t1 = t0 + Duration::from_secs(2);
        s.record(counters(t1, 1, 150, 1200, 1_000_000_000), &stats(), 7, 2);
        let x = s.samples.back().unwrap();
        assert_eq!(x.span_ms, 2000);
        assert!((x.cpu_used_pct - 25.0).abs() < 1e-9, "{}", x.cpu_used_pct);
        assert!((x.host_cpu_pct - 50.0).abs() < 1e-9, "{}", x.host_cpu_pct);
        assert_eq!(x.mem_used_bytes, 400);
        assert_eq!(
            x.mem_cache_bytes, 1000,
            "a guest's cache is at most its RAM"
        );
        assert_eq!((x.net_sent_bytes, x.net_received_bytes), (500, 1000));
        // A restored VM's counters start from zero: a base, no sample.
        s.record(
            counters(t1 + Duration::from_secs(2), 2, 5, 50, 0),
            &stats(),
            7,
            3,
        );
        assert_eq!(s.samples.len(), 1);
        // Counters that go backwards on the same VM (a lying guest) make no sample.
        s.record(
            counters(t1 + Duration::from_secs(4), 2, 1, 60, 0),
            &stats(),
            7,
            4,
        );
        assert_eq!(s.samples.len(), 1);
        assert_eq!(s.range(2, 2).len(), 1);
        assert!(s.range(3, 9).is_empty());
    }

    #[test]
    fn a_long_life_stays_bounded_and_keeps_its_start() {
        let mut s = Series::default();
        let one = |ts: u64| MetricSample {
            timestamp_unix_ms: ts,
            span_ms: 1,
            cpu_count: 1,
            cpu_used_pct: 0.0,
            host_cpu_pct: 0.0,
            mem_total_bytes: 0,
            mem_used_bytes: 0,
            mem_cache_bytes: 0,
            host_mem_bytes: 0,
            disk_total_bytes: 0,
            disk_used_bytes: 0,
            net_sent_bytes: 1,
            net_received_bytes: 0,
        };
        for ts in 1..=10 * CAPACITY as u64 {
            s.push(one(ts));
        }
        assert!(s.samples.len() <= CAPACITY);
        let total: u64 = s.samples.iter().map(|x| x.span_ms).sum();
        assert_eq!(total, 10 * CAPACITY as u64, "no span lost in merging");
        let sent: u64 = s.samples.iter().map(|x| x.net_sent_bytes).sum();
        assert_eq!(sent, 10 * CAPACITY as u64, "no traffic lost in merging");
        let ts: Vec<u64> = s.samples.iter().map(|x| x.timestamp_unix_ms).collect();
        assert!(ts.windows(2).all(|w| w[0] < w[1]), "in order");
        assert_eq!(*ts.last().unwrap(), 10 * CAPACITY as u64);
        assert_eq!(
            s.samples.back().unwrap().span_ms,
            1,
            "recent ones at full resolution"
        );
    }
}
