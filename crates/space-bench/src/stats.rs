//! Samples and the tables the benchmarks print.
//!
//! A benchmark records one duration (or size) per run; this module turns those into
//! p50/p90/p99 rows and prints them as an aligned table, so every benchmark reports the same
//! way and the numbers can be quoted as they are.

use std::fmt::Write as _;
use std::time::Duration;

/// The runs of one measured operation.
#[derive(Debug, Clone, Default)]
pub struct Samples {
    values: Vec<f64>,
}

impl Samples {
    pub fn new() -> Self {
        Self::default()
    }

    /// Samples holding `values`.
    pub fn from_values(values: impl IntoIterator<Item = f64>) -> Self {
        Self {
            values: values.into_iter().collect(),
        }
    }

    pub fn push(&mut self, value: f64) {
        self.values.push(value);
    }

    pub fn push_duration(&mut self, d: Duration) {
        self.push(d.as_secs_f64() * 1e3);
    }

    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The `p`th percentile (0..=100) by nearest rank; `None` without samples.
    pub fn percentile(&self, p: f64) -> Option<f64> {
        if self.values.is_empty() {
            return None;
        }
        let mut sorted = self.values.clone();
        sorted.sort_by(|a, b| a.total_cmp(b));
        let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
        Some(sorted[rank.clamp(1, sorted.len()) - 1])
    }

    pub fn mean(&self) -> Option<f64> {
        if self.values.is_empty() {
            None
        } else {
            Some(self.values.iter().sum::<f64>() / self.values.len() as f64)
        }
    }
}

/// `a / b`, when both exist and `b` is not zero.
pub fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b != 0.0 => Some(a / b),
        _ => None,
    }
}

/// Throughput in MB/s (10^6 bytes per second) of moving `bytes` in `elapsed`.
pub fn mb_per_s(bytes: u64, elapsed: Duration) -> f64 {
    let secs = elapsed.as_secs_f64();
    if secs <= 0.0 {
        return f64::INFINITY;
    }
    bytes as f64 / 1e6 / secs
}

/// One row of a table: a name, a unit, and the samples behind it.
pub struct Row {
    pub name: String,
    pub unit: &'static str,
    pub samples: Samples,
}

/// A printed table of rows, each with n, p50, p90, p99 and mean.
#[derive(Default)]
pub struct Table {
    pub title: String,
    pub rows: Vec<Row>,
}

impl Table {
    pub fn new(title: impl Into<String>) -> Self {
        Self {
            title: title.into(),
            rows: Vec::new(),
        }
    }

    pub fn add(&mut self, name: impl Into<String>, unit: &'static str, samples: Samples) {
        self.rows.push(Row {
            name: name.into(),
            unit,
            samples,
        });
    }

    /// The p50 of the named row, for ratios.
    pub fn p50(&self, name: &str) -> Option<f64> {
        self.rows
            .iter()
            .find(|r| r.name == name)
            .and_then(|r| r.samples.percentile(50.0))
    }

    pub fn render(&self) -> String {
        let header = ["operation", "unit", "n", "p50", "p90", "p99", "mean"].map(String::from);
        let lines: Vec<Vec<String>> = self
            .rows
            .iter()
            .map(|r| {
                vec![
                    r.name.clone(),
                    r.unit.to_string(),
                    r.samples.len().to_string(),
                    fmt_value(r.samples.percentile(50.0)),
                    fmt_value(r.samples.percentile(90.0)),
                    fmt_value(r.samples.percentile(99.0)),
                    fmt_value(r.samples.mean()),
                ]
            })
            .collect();
        render_grid(&self.title, &header, &lines, |i| i < 2)
    }
}

/// A number with as many decimals as its size deserves; `-` when absent.
pub fn fmt_value(v: Option<f64>) -> String {
    match v {
        None => "-".to_string(),
        Some(v) if !v.is_finite() => "inf".to_string(),
        Some(v) if v.abs() >= 100.0 => format!("{v:.0}"),
        Some(v) if v.abs() >= 10.0 => format!("{v:.1}"),
        Some(v) => format!("{v:.2}"),
    }
}

/// A ratio as `1.23x`; `-` when absent.
pub fn fmt_ratio(v: Option<f64>) -> String {
    match v {
        Some(v) if v.is_finite() => format!("{v:.2}x"),
        _ => "-".to_string(),
    }
}

/// A titled, aligned Markdown table; columns for which `left` holds are left-aligned, the
/// others right-aligned.
fn render_grid(
    title: &str,
    header: &[String],
    lines: &[Vec<String>],
    left: impl Fn(usize) -> bool,
) -> String {
    // Three is the narrowest column whose delimiter (`--:`) every Markdown renderer accepts.
    let mut widths: Vec<usize> = header.iter().map(|h| h.len().max(3)).collect();
    for l in lines {
        for (w, cell) in widths.iter_mut().zip(l.iter()) {
            *w = (*w).max(cell.len());
        }
    }
    let mut out = String::new();
    let _ = writeln!(out, "{title}");
    let row = |out: &mut String, cells: &[String]| {
        let mut line = String::from("|");
        for (i, (cell, w)) in cells.iter().zip(widths.iter()).enumerate() {
            if left(i) {
                let _ = write!(line, " {cell:<w$} |");
            } else {
                let _ = write!(line, " {cell:>w$} |");
            }
        }
        let _ = writeln!(out, "{line}");
    };
    row(&mut out, header);
    let sep: Vec<String> = widths
        .iter()
        .enumerate()
        .map(|(i, w)| {
            if left(i) {
                "-".repeat(*w)
            } else {
                format!("{}:", "-".repeat(w.saturating_sub(1)))
            }
        })
        .collect();
    row(&mut out, &sep);
    for l in lines {
        row(&mut out, l);
    }
    out
}

/// Ratios between rows of different tables, each with p50 and p90 and a note.
#[derive(Default)]
pub struct Summary {
    rows: Vec<[String; 4]>,
}

impl Summary {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `numerator / denominator` for p50 and p90.
    pub fn add(
        &mut self,
        name: impl Into<String>,
        numerator: &Samples,
        denominator: &Samples,
        note: impl Into<String>,
    ) {
        let at = |p| ratio(numerator.percentile(p), denominator.percentile(p));
        self.rows.push([
            name.into(),
            fmt_ratio(at(50.0)),
            fmt_ratio(at(90.0)),
            note.into(),
        ]);
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    pub fn render(&self) -> String {
        let header = ["ratio", "p50", "p90", "note"].map(String::from);
        let lines: Vec<Vec<String>> = self.rows.iter().map(|r| r.to_vec()).collect();
        render_grid("Summary", &header, &lines, |i| i == 0 || i == 3)
    }
}

/// Measured values against the targets (or others' reported numbers) they are read against.
#[derive(Default)]
pub struct Targets {
    rows: Vec<[String; 5]>,
}

/// Whether the p50 and the p90 are within their bounds, in words.
fn verdict(p50: Option<f64>, p90: Option<f64>, max50: f64, max90: f64) -> String {
    match (p50, p90) {
        (Some(a), Some(b)) if a <= max50 && b <= max90 => "met".into(),
        (Some(a), Some(_)) if a <= max50 => "p50 met, p90 missed".into(),
        (Some(_), Some(b)) if b <= max90 => "p90 met, p50 missed".into(),
        (Some(_), Some(_)) => "missed".into(),
        _ => "no samples".into(),
    }
}

impl Targets {
    pub fn new() -> Self {
        Self::default()
    }

    /// A time in ms whose p50 should be at most `max50` and whose p90 at most `max90`.
    pub fn time(&mut self, name: impl Into<String>, s: &Samples, max50: f64, max90: f64) {
        let (p50, p90) = (s.percentile(50.0), s.percentile(90.0));
        let target = if max50 == max90 {
            format!("<= {} ms", fmt_bound(max50))
        } else {
            format!(
                "p50 <= {} ms, p90 <= {} ms",
                fmt_bound(max50),
                fmt_bound(max90)
            )
        };
        self.rows.push([
            name.into(),
            ms_cell(p50),
            ms_cell(p90),
            target,
            verdict(p50, p90, max50, max90),
        ]);
    }

    /// `numerator / denominator` at p50 and at p90, each at most `max`.
    pub fn ratio(
        &mut self,
        name: impl Into<String>,
        numerator: &Samples,
        denominator: &Samples,
        max: f64,
    ) {
        let at = |p| ratio(numerator.percentile(p), denominator.percentile(p));
        let (p50, p90) = (at(50.0), at(90.0));
        self.rows.push([
            name.into(),
            fmt_ratio(p50),
            fmt_ratio(p90),
            format!("<= {max:.1}x"),
            verdict(p50, p90, max, max),
        ]);
    }

    /// A time in ms next to numbers someone else reported (`their50`/`their90` ms): no
    /// verdict, the ratio ours/theirs instead.
    pub fn reference(
        &mut self,
        name: impl Into<String>,
        s: &Samples,
        who: &str,
        their50: f64,
        their90: f64,
    ) {
        let (p50, p90) = (s.percentile(50.0), s.percentile(90.0));
        self.rows.push([
            name.into(),
            ms_cell(p50),
            ms_cell(p90),
            format!(
                "{who}: p50 {} ms, p90 {} ms",
                fmt_bound(their50),
                fmt_bound(their90)
            ),
            format!(
                "ours/theirs {} / {}",
                fmt_ratio(ratio(p50, Some(their50))),
                fmt_ratio(ratio(p90, Some(their90)))
            ),
        ]);
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    pub fn render(&self) -> String {
        let header = ["measure", "p50", "p90", "target", "verdict"].map(String::from);
        let lines: Vec<Vec<String>> = self.rows.iter().map(|r| r.to_vec()).collect();
        render_grid("Targets", &header, &lines, |i| i == 0 || i >= 3)
    }
}

/// A bound as written down: `25`, `1.5`.
fn fmt_bound(v: f64) -> String {
    if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v}")
    }
}

fn ms_cell(v: Option<f64>) -> String {
    match v {
        Some(_) => format!("{} ms", fmt_value(v)),
        None => "-".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let mut s = Samples::new();
        for v in 1..=100 {
            s.push(v as f64);
        }
        assert_eq!(s.percentile(50.0), Some(50.0));
        assert_eq!(s.percentile(90.0), Some(90.0));
        assert_eq!(s.percentile(99.0), Some(99.0));
        assert_eq!(s.percentile(100.0), Some(100.0));
        assert_eq!(s.percentile(0.0), Some(1.0));
        assert_eq!(s.mean(), Some(50.5));
    }

    #[test]
    fn empty_samples_have_no_percentiles() {
        assert_eq!(Samples::new().percentile(50.0), None);
    }

    #[test]
    fn ratios_and_throughput() {
        assert_eq!(ratio(Some(3.0), Some(2.0)), Some(1.5));
        assert_eq!(ratio(Some(3.0), Some(0.0)), None);
        assert_eq!(ratio(None, Some(2.0)), None);
        assert_eq!(mb_per_s(16_000_000, Duration::from_millis(500)), 32.0);
        assert_eq!(fmt_ratio(Some(1.234)), "1.23x");
        assert_eq!(fmt_ratio(None), "-");
        assert_eq!(fmt_value(Some(f64::INFINITY)), "inf");
    }

    #[test]
    fn summary_divides_percentiles() {
        let mut a = Samples::new();
        let mut b = Samples::new();
        for v in 1..=10 {
            a.push(v as f64 * 3.0);
            b.push(v as f64 * 2.0);
        }
        let mut s = Summary::new();
        s.add("a/b", &a, &b, "target <= 2x");
        let text = s.render();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "Summary");
        assert!(lines[3].contains("| 1.50x |"), "{text}");
        assert!(lines[3].contains("target <= 2x"), "{text}");
        assert_eq!(lines[1].len(), lines[3].len());
    }

    #[test]
    fn table_aligns_columns() {
        let mut t = Table::new("t");
        let mut s = Samples::new();
        s.push(1.5);
        s.push(250.0);
        t.add("boot", "ms", s);
        let text = t.render();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "t");
        assert_eq!(lines[1].len(), lines[3].len());
        assert!(lines[3].contains("| boot "));
        assert!(lines[3].contains(" 250 |"));
        assert_eq!(t.p50("boot"), Some(1.5));
    }

    #[test]
    fn targets_judge_p50_and_p90() {
        let mut s = Samples::new();
        for v in 1..=10 {
            s.push(v as f64 * 4.0);
        }
        let mut t = Targets::new();
        t.time("fast", &s, 25.0, 40.0);
        t.time("slow", &s, 5.0, 5.0);
        t.time("tail", &s, 25.0, 30.0);
        t.reference("theirs", &s, "X", 40.0, 72.0);
        let text = t.render();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "Targets");
        assert!(
            lines[3].contains("| 20.0 ms |") && lines[3].contains("| met "),
            "{text}"
        );
        assert!(
            lines[4].contains("<= 5 ms") && lines[4].contains("| missed "),
            "{text}"
        );
        assert!(lines[5].contains("p50 met, p90 missed"), "{text}");
        assert!(lines[6].contains("ours/theirs 0.50x / 0.50x"), "{text}");
        assert_eq!(lines[1].len(), lines[6].len());
    }
}
