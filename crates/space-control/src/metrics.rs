//! Prometheus metrics of the API, in the text exposition format, written by hand.
//!
//! - `space_api_requests_total{operation, status}`: counter of answered requests;
//! - `space_api_request_duration_seconds{operation}`: histogram of the time to the response
//!   head (for streams: until the stream started);
//! - `space_sandboxes{state}`: gauge of the node's sandboxes per state;
//! - `space_pool_ready{template}`, `space_pool_size{template}` (the size it follows demand
//!   to), `space_pool_floor{template}`, `space_pool_making{template}`: warm pool gauges;
//! - `space_pool_hits_total{template}`, `space_pool_waits_total{template}`,
//!   `space_pool_misses_total{template}`: creates served by a ready member, by one being made
//!   (counted in the hits too), and not served;
//! - `space_egress_audit_dropped_total`: gateway audit events dropped on a full queue.
//!
//! `operation` is a route's operation name (bounded), never a raw path.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use space_node_api::Pool;

/// Upper bounds of the duration buckets, in seconds: 1 ms to 60 s.
pub const BUCKETS: [f64; 15] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// The states `space_sandboxes` always reports (zero when none).
pub const STATES: [&str; 6] = [
    "creating",
    "running",
    "paused",
    "suspended",
    "failed",
    "terminated",
];

#[derive(Debug, Default, Clone)]
struct Histogram {
    /// Per bucket (not cumulative); the last slot counts what is over the largest bound.
    counts: [u64; BUCKETS.len() + 1],
    sum: f64,
    count: u64,
}

#[derive(Debug, Default)]
struct Inner {
    requests: BTreeMap<(&'static str, u16), u64>,
    durations: BTreeMap<&'static str, Histogram>,
}

/// Request counters and latency histograms of one server.
#[derive(Debug, Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
    egress_audit_dropped: AtomicU64,
}

impl Metrics {
    /// Empty metrics.
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts one answered request.
    pub fn observe(&self, operation: &'static str, status: u16, seconds: f64) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        *inner.requests.entry((operation, status)).or_default() += 1;
        let h = inner.durations.entry(operation).or_default();
        let slot = BUCKETS
            .iter()
            .position(|b| seconds <= *b)
            .unwrap_or(BUCKETS.len());
        h.counts[slot] += 1;
        h.count += 1;
        if seconds.is_finite() && seconds > 0.0 {
            h.sum += seconds;
        }
    }

    /// Counts one dropped egress audit event; returns the total so far.
    pub fn egress_audit_dropped(&self) -> u64 {
        self.egress_audit_dropped.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// How many requests of `operation` were answered with `status` so far.
    pub fn requests(&self, operation: &str, status: u16) -> u64 {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner
            .requests
            .iter()
            .filter(|((op, st), _)| *op == operation && *st == status)
            .map(|(_, n)| *n)
            .sum()
    }

    /// The exposition text: the request metrics plus the given sandbox and pool gauges.
    pub fn render(&self, sandboxes: &BTreeMap<String, u64>, pools: &[Pool]) -> String {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = String::new();
        out.push_str("# HELP space_api_requests_total API requests answered.\n");
        out.push_str("# TYPE space_api_requests_total counter\n");
        for ((op, status), n) in &inner.requests {
            let _ = writeln!(
                out,
                "space_api_requests_total{{operation=\"{}\",status=\"{status}\"}} {n}",
                escape(op)
            );
        }
        out.push_str(
            "# HELP space_api_request_duration_seconds Time from request to response head.\n",
        );
        out.push_str("# TYPE space_api_request_duration_seconds histogram\n");
        for (op, h) in &inner.durations {
            let op = escape(op);
            let mut cumulative = 0;
            for (i, bound) in BUCKETS.iter().enumerate() {
                cumulative += h.counts[i];
                let _ = writeln!(
                    out,
                    "space_api_request_duration_seconds_bucket{{operation=\"{op}\",le=\"{bound}\"}} \
                     {cumulative}"
                );
            }
            let _ = writeln!(
                out,
                "space_api_request_duration_seconds_bucket{{operation=\"{op}\",le=\"+Inf\"}} {}",
                h.count
            );
            let _ = writeln!(
                out,
                "space_api_request_duration_seconds_sum{{operation=\"{op}\"}} {}",
                h.sum
            );
            let _ = writeln!(
                out,
                "space_api_request_duration_seconds_count{{operation=\"{op}\"}} {}",
                h.count
            );
        }
        drop(inner);
        out.push_str("# HELP space_sandboxes Sandboxes on the node per state.\n");
        out.push_str("# TYPE space_sandboxes gauge\n");
        for state in STATES {
            let n = sandboxes.get(state).copied().unwrap_or(0);
            let _ = writeln!(out, "space_sandboxes{{state=\"{state}\"}} {n}");
        }
        out.push_str("# HELP space_pool_ready Warm pool members ready now.\n");
        out.push_str("# TYPE space_pool_ready gauge\n");
        for p in pools {
            let _ = writeln!(
                out,
                "space_pool_ready{{template=\"{}\"}} {}",
                escape(p.template.name.as_str()),
                p.ready
            );
        }
        out.push_str(
            "# HELP space_egress_audit_dropped_total Gateway audit events dropped on a full queue.\n",
        );
        out.push_str("# TYPE space_egress_audit_dropped_total counter\n");
        let _ = writeln!(
            out,
            "space_egress_audit_dropped_total {}",
            self.egress_audit_dropped.load(Ordering::Relaxed)
        );
        let gauges: [PoolSeries; 6] = [
            (
                "space_pool_size",
                "gauge",
                "Warm pool size now (it follows demand between the floor and the ceiling).",
                |p| p.target as u64,
            ),
            ("space_pool_floor", "gauge", "Warm pool floor.", |p| {
                p.floor as u64
            }),
            (
                "space_pool_making",
                "gauge",
                "Warm pool members being made.",
                |p| p.making as u64,
            ),
            (
                "space_pool_hits_total",
                "counter",
                "Creates served from a warm pool.",
                |p| p.hits,
            ),
            (
                "space_pool_waits_total",
                "counter",
                "Creates served by a warm pool member that was still being made.",
                |p| p.waits,
            ),
            (
                "space_pool_misses_total",
                "counter",
                "Creates that found the warm pool empty.",
                |p| p.misses,
            ),
        ];
        for (name, kind, help, value) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for p in pools {
                let _ = writeln!(
                    out,
                    "{name}{{template=\"{}\"}} {}",
                    escape(p.template.name.as_str()),
                    value(p)
                );
            }
        }
        out
    }
}

/// One per-pool series: name, type, help text, and its value for a pool.
type PoolSeries = (&'static str, &'static str, &'static str, fn(&Pool) -> u64);

/// Escapes a label value (backslash, double quote, newline).
fn escape(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

/// The cluster's nodes as gauges: whether each is live, its state, its memory and how many
/// sandboxes it holds (from its last report).
pub fn render_nodes(nodes: &[crate::store::NodeRow]) -> String {
    let mut out = String::new();
    let gauge = |out: &mut String, name: &str, help: &str| {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} gauge");
    };
    gauge(&mut out, "space_node_up", "1 while the node's lease runs.");
    for n in nodes {
        let _ = writeln!(
            out,
            "space_node_up{{node=\"{}\"}} {}",
            escape(&n.id),
            u8::from(n.live)
        );
    }
    gauge(&mut out, "space_node_state", "1 for the node's state.");
    for n in nodes {
        let _ = writeln!(
            out,
            "space_node_state{{node=\"{}\",state=\"{}\"}} 1",
            escape(&n.id),
            n.state.as_str()
        );
    }
    gauge(
        &mut out,
        "space_node_incarnation",
        "The node's incarnation.",
    );
    for n in nodes {
        let _ = writeln!(
            out,
            "space_node_incarnation{{node=\"{}\"}} {}",
            escape(&n.id),
            n.incarnation
        );
    }
    let reports: Vec<_> = nodes
        .iter()
        .map(|n| (escape(&n.id), crate::cluster::report_of(n)))
        .collect();
    gauge(
        &mut out,
        "space_node_memory_free_mib",
        "Memory still free for guests, MiB.",
    );
    for (id, r) in &reports {
        let _ = writeln!(
            out,
            "space_node_memory_free_mib{{node=\"{id}\"}} {}",
            r.memory_free_mib
        );
    }
    gauge(
        &mut out,
        "space_node_memory_total_mib",
        "Memory guests may take in all, MiB.",
    );
    for (id, r) in &reports {
        let _ = writeln!(
            out,
            "space_node_memory_total_mib{{node=\"{id}\"}} {}",
            r.memory_total_mib
        );
    }
    gauge(
        &mut out,
        "space_node_sandboxes",
        "Sandboxes the node holds.",
    );
    for (id, r) in &reports {
        let _ = writeln!(
            out,
            "space_node_sandboxes{{node=\"{id}\"}} {}",
            r.sandboxes.len()
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let m = Metrics::new();
        m.observe("sandbox.create", 201, 0.0004);
        m.observe("sandbox.create", 201, 0.2);
        m.observe("sandbox.create", 429, 100.0);
        assert_eq!(m.requests("sandbox.create", 201), 2);
        let text = m.render(&BTreeMap::new(), &[]);
        assert!(text
            .contains("space_api_requests_total{operation=\"sandbox.create\",status=\"201\"} 2\n"));
        assert!(text.contains(
            "space_api_request_duration_seconds_bucket{operation=\"sandbox.create\",le=\"0.001\"} 1\n"
        ));
        assert!(text.contains(
            "space_api_request_duration_seconds_bucket{operation=\"sandbox.create\",le=\"0.25\"} 2\n"
        ));
        assert!(text.contains(
            "space_api_request_duration_seconds_bucket{operation=\"sandbox.create\",le=\"60\"} 2\n"
        ));
        assert!(text.contains(
            "space_api_request_duration_seconds_bucket{operation=\"sandbox.create\",le=\"+Inf\"} 3\n"
        ));
        assert!(text.contains("space_sandboxes{state=\"running\"} 0\n"));
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
