//! `space metrics` (one sandbox's samples) and `space top` (the newest sample of every running
//! sandbox, redrawn every few seconds).

use std::io::{IsTerminal, Write};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Result;
use serde_json::Value;
use space_api::{MetricList, MetricSample};

use crate::cli::{MetricsArgs, TopArgs};
use crate::client::{seg, Client};
use crate::output::{self, field};

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

async fn samples(c: &Client, id: &str, since_ms: Option<u64>) -> Result<Vec<MetricSample>> {
    let query: Vec<(String, String)> = since_ms
        .map(|s| vec![("start".to_owned(), s.to_string())])
        .unwrap_or_default();
    let path = format!("/v1/sandboxes/{}/metrics", seg(id)?);
    let list: MetricList = c.get(&path, &query).await?;
    Ok(list.samples)
}

/// Bytes as a short size (`512B`, `3.2K`, `41M`, `1.5G`).
fn size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "K", "M", "G", "T"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 || v >= 10.0 {
        format!("{v:.0}{}", UNITS[unit])
    } else {
        format!("{v:.1}{}", UNITS[unit])
    }
}

/// Bytes over a sample's span as a rate.
fn rate(bytes: u64, span_ms: u64) -> String {
    if span_ms == 0 {
        return "-".into();
    }
    format!("{}/s", size(bytes.saturating_mul(1000) / span_ms))
}

fn columns(s: &MetricSample) -> Vec<String> {
    vec![
        format!("{:.1}", s.cpu_used_pct),
        format!("{:.1}", s.host_cpu_pct),
        format!("{}/{}", size(s.mem_used_bytes), size(s.mem_total_bytes)),
        size(s.host_mem_bytes),
        format!("{}/{}", size(s.disk_used_bytes), size(s.disk_total_bytes)),
        rate(s.net_sent_bytes, s.span_ms),
        rate(s.net_received_bytes, s.span_ms),
    ]
}

const HEADERS: [&str; 7] = [
    "CPU%", "HOST%", "MEM", "HOST MEM", "DISK", "NET OUT", "NET IN",
];

/// `space metrics ID [--since SECS]`.
pub async fn metrics(c: &Client, a: MetricsArgs, json: bool) -> Result<()> {
    let since = a
        .since
        .map(|s| now_ms().saturating_sub(s.saturating_mul(1000)));
    let list = samples(c, &a.id, since).await?;
    if json {
        output::json(&serde_json::to_value(MetricList { samples: list })?);
        return Ok(());
    }
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|s| {
            let mut row = vec![
                output::age(&serde_json::json!({"t": s.timestamp_unix_ms}), "t"),
                output::duration(s.span_ms / 1000),
            ];
            row.extend(columns(s));
            row
        })
        .collect();
    let mut headers = vec!["WHEN", "SPAN"];
    headers.extend(HEADERS);
    output::print_table(&headers, &rows);
    Ok(())
}

/// The newest sample of each running sandbox: `(sandbox, sample)`, a sandbox without one yet
/// (started less than a sampling interval ago) with `None`.
async fn newest(c: &Client, window_ms: u64) -> Result<Vec<(Value, Option<MetricSample>)>> {
    let list: Value = c
        .get(
            "/v1/sandboxes",
            &[("state".to_owned(), "running".to_owned())],
        )
        .await?;
    let sandboxes = list
        .get("sandboxes")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let since = now_ms().saturating_sub(window_ms);
    let mut out = Vec::new();
    for sb in sandboxes {
        let id = field(&sb, "id");
        // A sandbox that ended between the list and this call is left out.
        let Ok(mut s) = samples(c, &id, Some(since)).await else {
            continue;
        };
        out.push((sb, s.pop()));
    }
    Ok(out)
}

/// `space top [--interval SECS] [--once]`.
pub async fn top(c: &Client, a: TopArgs, json: bool) -> Result<()> {
    let interval = Duration::from_secs(a.interval);
    // Wide enough to find the newest sample whatever the server's sampling interval.
    let window_ms = (a.interval * 1000).max(60_000);
    let live = !json && !a.once && std::io::stdout().is_terminal();
    loop {
        let rows = newest(c, window_ms).await?;
        if json {
            let v: Vec<Value> = rows
                .iter()
                .map(|(sb, s)| serde_json::json!({"id": sb.get("id"), "sample": s}))
                .collect();
            output::json(&Value::Array(v));
            return Ok(());
        }
        let table: Vec<Vec<String>> = rows
            .iter()
            .map(|(sb, s)| {
                let mut row = vec![field(sb, "id"), field(sb, "template")];
                match s {
                    Some(s) => row.extend(columns(s)),
                    None => row.extend(HEADERS.iter().map(|_| "-".to_owned())),
                }
                row
            })
            .collect();
        let mut headers = vec!["ID", "TEMPLATE"];
        headers.extend(HEADERS);
        let text = output::table(&headers, &table);
        if live {
            // Home and clear, then the table: a redraw in place.
            print!(
                "\x1b[H\x1b[2J{} running, every {}s\n\n{text}",
                rows.len(),
                a.interval
            );
            std::io::stdout().flush()?;
        } else {
            print!("{text}");
        }
        if !live {
            return Ok(());
        }
        tokio::time::sleep(interval).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_rates() {
        assert_eq!(size(512), "512B");
        assert_eq!(size(3 * 1024 + 200), "3.2K");
        assert_eq!(size(41 << 20), "41M");
        assert_eq!(rate(10_000, 5000), "2.0K/s");
        assert_eq!(rate(1, 0), "-");
    }
}
