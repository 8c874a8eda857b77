//! A sandbox's resource samples ([`MetricSample`]): what a node keeps and the API serves
//! (`GET /v1/sandboxes/{id}/metrics`, E2B's `get_metrics`).

use serde::{Deserialize, Serialize};

/// What a sandbox used over one span of time. CPU shares are averages over the span; memory
/// and disk are as of its end; network bytes are what moved during it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricSample {
    /// The end of the span, ms since the Unix epoch.
    pub timestamp_unix_ms: u64,
    /// How long the span was, ms (the sampling interval; longer for old samples merged to
    /// keep a long life's series bounded).
    pub span_ms: u64,
    /// vCPUs of the VM.
    pub cpu_count: u32,
    /// Share of all vCPUs the guest kept busy, 0 to 100 (the guest kernel's count).
    pub cpu_used_pct: f64,
    /// CPU the VMM took on the host, in percent of one host core (emulation included: under
    /// TCG a guest busy on one vCPU costs about 100).
    pub host_cpu_pct: f64,
    /// Guest RAM, bytes.
    pub mem_total_bytes: u64,
    /// Guest RAM in use: total less what the guest kernel counts available.
    pub mem_used_bytes: u64,
    /// Of the guest's RAM, page cache and buffers.
    pub mem_cache_bytes: u64,
    /// Host memory charged to the VMM (its cgroup, else its resident set).
    pub host_mem_bytes: u64,
    /// Size of the guest's root filesystem, bytes.
    pub disk_total_bytes: u64,
    /// Bytes of it in use.
    pub disk_used_bytes: u64,
    /// Bytes the sandbox sent through the gateway during the span.
    pub net_sent_bytes: u64,
    /// Bytes it received through the gateway during the span.
    pub net_received_bytes: u64,
}

/// `GET /v1/sandboxes/{id}/metrics`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricList {
    /// Oldest first.
    pub samples: Vec<MetricSample>,
}

impl MetricSample {
    /// One sample covering `self` and `later`, the span right after it: shares weighted by
    /// span, levels as of the later end, traffic summed.
    pub fn merge(&self, later: &MetricSample) -> MetricSample {
        let (a, b) = (self.span_ms as f64, later.span_ms as f64);
        let avg = |x: f64, y: f64| {
            if a + b > 0.0 {
                (x * a + y * b) / (a + b)
            } else {
                (x + y) / 2.0
            }
        };
        MetricSample {
            timestamp_unix_ms: later.timestamp_unix_ms,
            span_ms: self.span_ms + later.span_ms,
            cpu_used_pct: avg(self.cpu_used_pct, later.cpu_used_pct),
            host_cpu_pct: avg(self.host_cpu_pct, later.host_cpu_pct),
            net_sent_bytes: self.net_sent_bytes.saturating_add(later.net_sent_bytes),
            net_received_bytes: self
                .net_received_bytes
                .saturating_add(later.net_received_bytes),
            ..later.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(ts: u64, cpu: f64, sent: u64) -> MetricSample {
        MetricSample {
            timestamp_unix_ms: ts,
            span_ms: 5000,
            cpu_count: 2,
            cpu_used_pct: cpu,
            host_cpu_pct: cpu * 2.0,
            mem_total_bytes: 100,
            mem_used_bytes: ts,
            mem_cache_bytes: 1,
            host_mem_bytes: 7,
            disk_total_bytes: 10,
            disk_used_bytes: 5,
            net_sent_bytes: sent,
            net_received_bytes: 2 * sent,
        }
    }

    #[test]
    fn merge_weights_shares_and_sums_traffic() {
        let mut a = sample(5000, 10.0, 3);
        a.span_ms = 15000;
        let b = sample(10000, 50.0, 4);
        let m = a.merge(&b);
        assert_eq!(m.timestamp_unix_ms, 10000);
        assert_eq!(m.span_ms, 20000);
        assert!((m.cpu_used_pct - 20.0).abs() < 1e-9, "{}", m.cpu_used_pct);
        assert!((m.host_cpu_pct - 40.0).abs() < 1e-9);
        assert_eq!((m.net_sent_bytes, m.net_received_bytes), (7, 14));
        assert_eq!(m.mem_used_bytes, 10000);
    }
}
