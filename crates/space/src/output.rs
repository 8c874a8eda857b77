//! Output: aligned tables for people, exactly one JSON value for scripts.

use std::io::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value;

/// Prints `value` as one pretty JSON document on stdout.
pub fn json(value: &Value) {
    let mut out = std::io::stdout().lock();
    let _ = serde_json::to_writer_pretty(&mut out, value);
    let _ = writeln!(out);
}

/// Renders rows under `headers` with columns padded to their widest cell.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let mut text = String::new();
    let mut line = |cells: Vec<&str>| {
        let n = cells.len();
        for (i, cell) in cells.into_iter().enumerate() {
            text.push_str(cell);
            if i + 1 < n {
                let pad = widths[i].saturating_sub(cell.chars().count()) + 2;
                text.push_str(&" ".repeat(pad));
            }
        }
        text.push('\n');
    };
    line(headers.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).take(headers.len()).collect());
    }
    text
}

/// Prints a table on stdout.
pub fn print_table(headers: &[&str], rows: &[Vec<String>]) {
    print!("{}", table(headers, rows));
}

/// A field of `v` as display text: strings bare, null as `-`, anything else as JSON.
pub fn field(v: &Value, key: &str) -> String {
    text(v.get(key).unwrap_or(&Value::Null))
}

/// A JSON value as display text: strings bare, null as `-`, anything else as JSON.
pub fn text(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => sanitize(s),
        other => sanitize(&other.to_string()),
    }
}

/// Replaces control characters so that text from the server cannot drive the terminal.
pub fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// Milliseconds since the epoch as an age ("3m ago"); `-` when absent.
pub fn age(v: &Value, key: &str) -> String {
    let Some(ms) = v.get(key).and_then(Value::as_u64) else {
        return "-".into();
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    format!("{} ago", duration(now.saturating_sub(ms) / 1000))
}

/// Seconds as a short duration (`45s`, `12m`, `3h`, `2d`).
pub fn duration(secs: u64) -> String {
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 2 * 3600 => format!("{}m", s / 60),
        s if s < 2 * 86400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

/// Milliseconds (a timeout) as text; null is `never`.
pub fn millis(v: Option<&Value>) -> String {
    match v.and_then(Value::as_u64) {
        Some(ms) if ms % 1000 == 0 => duration(ms / 1000),
        Some(ms) => format!("{ms}ms"),
        None => "never".into(),
    }
}

/// A map of strings as `k=v,k=v` (`-` when empty).
pub fn pairs(v: Option<&Value>) -> String {
    let Some(map) = v.and_then(Value::as_object).filter(|m| !m.is_empty()) else {
        return "-".into();
    };
    map.iter()
        .map(|(k, v)| format!("{}={}", sanitize(k), text(v)))
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_columns_to_the_widest_cell() {
        let t = table(
            &["ID", "STATE"],
            &[
                vec!["sb-long-id".into(), "running".into()],
                vec!["sb-1".into(), "paused".into()],
            ],
        );
        assert_eq!(
            t,
            "ID          STATE\nsb-long-id  running\nsb-1        paused\n"
        );
    }

    #[test]
    fn values_render_for_people() {
        let v = serde_json::json!({"a": null, "b": "x\u{1b}[2J", "c": 3, "m": {"k": "v"}});
        assert_eq!(field(&v, "a"), "-");
        assert_eq!(field(&v, "b"), "x?[2J");
        assert_eq!(field(&v, "c"), "3");
        assert_eq!(pairs(v.get("m")), "k=v");
        assert_eq!(millis(Some(&serde_json::json!(900000))), "15m");
        assert_eq!(millis(Some(&Value::Null)), "never");
        assert_eq!(duration(3 * 86400), "3d");
    }
}
