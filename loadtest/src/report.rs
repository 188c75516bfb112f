//! Results as a human table (stdout), CSV and JSON, one row per concurrency / rate level.
//!
//! Each row's figures come from its measurement windows; its totals (`requests_total`,
//! `errors_total`, `first_errors`) from every request the level sent, warm-up and drain
//! included. The table shows the windows; the notes after it and [`totals_line`] the totals.
//!
//! The table has fixed column widths so rows can be printed as levels finish. Sweep rows carry
//! their grid point (instances, max batch size, queue delay) as extra leading columns. All
//! formatting is pure (strings in, strings out) and unit-tested; only [`write_file`] touches
//! the disk.

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use crate::error::LoadtestError;
use crate::stats::{Summary, Totals};

/// How a level applied load.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    /// A closed loop with this many requests in flight.
    Concurrency(u64),
    /// An open loop sending this many requests per second.
    RequestRate(f64),
}

impl Level {
    fn label(&self) -> String {
        match self {
            Level::Concurrency(c) => c.to_string(),
            Level::RequestRate(r) => format_rate(*r),
        }
    }
}

/// The batcher / instance settings a sweep row was measured with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct GridPoint {
    /// Instances per group (`instance_group.count`) the model was reloaded with.
    pub instances: u32,
    /// 0: dynamic batching off (the model's own max_batch_size kept).
    pub max_batch_size: u32,
    /// `dynamic_batching.max_queue_delay_microseconds` the model was reloaded with.
    pub max_queue_delay_us: u64,
}

/// One measured level.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LevelResult {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grid: Option<GridPoint>,
    pub level: Level,
    #[serde(flatten)]
    pub summary: Summary,
    pub stable: bool,
    pub windows: u32,
    #[serde(flatten)]
    pub totals: Totals,
}

fn format_rate(r: f64) -> String {
    if r.fract() == 0.0 {
        format!("{r:.0}")
    } else {
        format!("{r}")
    }
}

fn cpu(s: &Summary) -> String {
    s.client_cpu_percent
        .map_or_else(|| "n/a".into(), |c| format!("{c:.0}%"))
}

/// The header line (and its underline) of the table; `open` adds the send-rate columns.
pub fn table_header(level: &Level, grid: bool) -> String {
    let mut line = String::new();
    if grid {
        let _ = write!(
            line,
            "{:>9} {:>9} {:>9} ",
            "instances", "max_batch", "delay_us"
        );
    }
    let name = match level {
        Level::Concurrency(_) => "concurrency",
        Level::RequestRate(_) => "rate/s",
    };
    let _ = write!(
        line,
        "{name:>11} {:>11} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>6} {:>6}",
        "infer/s",
        "avg_us",
        "p50_us",
        "p90_us",
        "p95_us",
        "p99_us",
        "max_us",
        "errors",
        "cpu",
        "stable"
    );
    if matches!(level, Level::RequestRate(_)) {
        let _ = write!(line, " {:>9} {:>8}", "sent/s", "skipped");
    }
    let underline = "-".repeat(line.len());
    format!("{line}\n{underline}")
}

/// One table row.
pub fn table_row(r: &LevelResult) -> String {
    let s = &r.summary;
    let mut line = String::new();
    if let Some(g) = &r.grid {
        let _ = write!(
            line,
            "{:>9} {:>9} {:>9} ",
            g.instances, g.max_batch_size, g.max_queue_delay_us
        );
    }
    let _ = write!(
        line,
        "{:>11} {:>11.1} {:>9.0} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>6} {:>6}",
        r.level.label(),
        s.throughput,
        s.avg_us,
        s.p50_us,
        s.p90_us,
        s.p95_us,
        s.p99_us,
        s.max_us,
        s.errors,
        cpu(s),
        if r.stable { "yes" } else { "NO" }
    );
    if matches!(r.level, Level::RequestRate(_)) {
        let _ = write!(line, " {:>9.1} {:>8}", s.send_rate, s.skipped);
    }
    line
}

/// Lines to print after the table: unstable levels, failed requests (over the whole level),
/// levels the client could not drive at the asked rate.
pub fn notes(results: &[LevelResult]) -> Vec<String> {
    let mut out = Vec::new();
    for r in results {
        let at = match &r.grid {
            Some(g) => format!(
                "{} {} (instances {}, max_batch {}, delay {} us)",
                level_kind(&r.level),
                r.level.label(),
                g.instances,
                g.max_batch_size,
                g.max_queue_delay_us
            ),
            None => format!("{} {}", level_kind(&r.level), r.level.label()),
        };
        if !r.stable {
            out.push(format!(
                "warning: {at}: not stable after {} window(s): the last 3 differ by more than --stability-percentage",
                r.windows
            ));
        }
        let t = &r.totals;
        if t.errors_total > 0 {
            out.push(format!(
                "error: {at}: {} of {} request(s) failed ({} in the reported windows); first errors: {}",
                t.errors_total,
                t.requests_total,
                r.summary.errors,
                t.first_errors.join(" | ")
            ));
        }
        if let Level::RequestRate(rate) = r.level
            && (r.summary.skipped > 0 || r.summary.send_rate < rate * 0.95)
        {
            out.push(format!(
                "warning: {at}: could not keep up: sent {:.1}/s of {}/s, {} skipped at --max-outstanding",
                r.summary.send_rate,
                format_rate(rate),
                r.summary.skipped
            ));
        }
    }
    out
}

/// The line after the notes: every request of the run, warm-up and drain included.
pub fn totals_line(results: &[LevelResult]) -> String {
    let sent: u64 = results.iter().map(|r| r.totals.requests_total).sum();
    let failed: u64 = results.iter().map(|r| r.totals.errors_total).sum();
    format!("all levels: {sent} request(s) sent (warm-up and drain included), {failed} failed")
}

fn level_kind(level: &Level) -> &'static str {
    match level {
        Level::Concurrency(_) => "concurrency",
        Level::RequestRate(_) => "request rate",
    }
}

const CSV_COLUMNS: &str = "instances,max_batch_size,max_queue_delay_us,concurrency,request_rate,\
throughput_infer_per_sec,avg_us,p50_us,p90_us,p95_us,p99_us,max_us,requests,errors,\
client_cpu_percent,send_rate,skipped,stable,windows,first_error,requests_total,errors_total";

/// CSV with a header row; grid and level columns are empty where they do not apply. The
/// whole-level totals come last, so the older columns keep their positions.
pub fn csv(results: &[LevelResult]) -> String {
    let mut out = String::from(CSV_COLUMNS);
    out.push('\n');
    for r in results {
        let s = &r.summary;
        let (instances, max_batch, delay) = match &r.grid {
            Some(g) => (
                g.instances.to_string(),
                g.max_batch_size.to_string(),
                g.max_queue_delay_us.to_string(),
            ),
            None => Default::default(),
        };
        let (concurrency, rate) = match r.level {
            Level::Concurrency(c) => (c.to_string(), String::new()),
            Level::RequestRate(x) => (String::new(), format_rate(x)),
        };
        let _ = writeln!(
            out,
            "{instances},{max_batch},{delay},{concurrency},{rate},{:.3},{:.1},{},{},{},{},{},{},{},{},{:.3},{},{},{},{},{},{}",
            s.throughput,
            s.avg_us,
            s.p50_us,
            s.p90_us,
            s.p95_us,
            s.p99_us,
            s.max_us,
            s.requests,
            s.errors,
            s.client_cpu_percent
                .map_or_else(String::new, |c| format!("{c:.1}")),
            s.send_rate,
            s.skipped,
            r.stable,
            r.windows,
            csv_field(s.first_error.as_deref().unwrap_or("")),
            r.totals.requests_total,
            r.totals.errors_total,
        );
    }
    out
}

fn csv_field(text: &str) -> String {
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_string()
    }
}

/// A JSON array of level objects.
pub fn json(results: &[LevelResult]) -> String {
    serde_json::to_string_pretty(results).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

pub fn write_file(path: &Path, text: &str) -> Result<(), LoadtestError> {
    std::fs::write(path, text).map_err(|source| LoadtestError::Write {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::stats::{Tally, Window};

    fn result(level: Level, errors: bool) -> LevelResult {
        let mut w = Window::default();
        let mut tally = Tally::default();
        let mut record = |latency, result: Result<(), String>| {
            w.record(latency, &result);
            tally.record(&result);
        };
        record(Duration::from_micros(1500), Ok(()));
        if errors {
            record(Duration::ZERO, Err("HTTP 400: bad, \"input\"".into()));
        }
        w.elapsed = Duration::from_secs(1);
        w.sent = 2;
        // One more failure outside the reported windows (say, in the warm-up).
        if errors {
            tally.record(&Err("connection reset".into()));
        }
        LevelResult {
            grid: None,
            level,
            summary: w.summary(8),
            stable: !errors,
            windows: 3,
            totals: tally.totals(1 + 2 * u64::from(errors)),
        }
    }

    #[test]
    fn table_rows_line_up_with_the_header() {
        let r = result(Level::Concurrency(4), false);
        let header = table_header(&r.level, false);
        let row = table_row(&r);
        assert_eq!(header.lines().next().unwrap().len(), row.len());
        assert!(row.contains("8.0"), "1 request × batch 8 in 1 s: {row}");
        assert!(row.trim_end().ends_with("yes"));
        let mut g = result(Level::RequestRate(2.5), true);
        g.grid = Some(GridPoint {
            instances: 2,
            max_batch_size: 8,
            max_queue_delay_us: 100,
        });
        let header = table_header(&g.level, true);
        assert!(header.starts_with("instances"));
        assert_eq!(header.lines().next().unwrap().len(), table_row(&g).len());
        assert!(table_row(&g).contains("2.5"));
    }

    #[test]
    fn notes_flag_errors_instability_and_lag() {
        let notes = notes(&[
            result(Level::Concurrency(1), false),
            result(Level::RequestRate(100.0), true),
        ]);
        assert_eq!(notes.len(), 3, "{notes:?}");
        assert!(notes[0].contains("not stable"));
        assert!(
            notes[1].contains("2 of 3 request(s) failed (1 in the reported windows)"),
            "{}",
            notes[1]
        );
        assert!(
            notes[1].ends_with("first errors: HTTP 400: bad, \"input\" | connection reset"),
            "{}",
            notes[1]
        );
        assert!(notes[2].contains("sent 2.0/s of 100/s"));
    }

    #[test]
    fn csv_quotes_and_leaves_blanks() {
        let text = csv(&[
            result(Level::Concurrency(2), false),
            result(Level::RequestRate(5.0), true),
        ]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        let columns = lines[0].split(',').count();
        assert!(lines[1].starts_with(",,,2,,8.000,"));
        assert_eq!(lines[1].split(',').count(), columns);
        assert!(
            lines[2].ends_with(r#""HTTP 400: bad, ""input""",3,2"#),
            "{}",
            lines[2]
        );
        assert!(lines[1].ends_with(",1,0"), "{}", lines[1]);
    }

    #[test]
    fn totals_line_sums_every_level() {
        let rows = [
            result(Level::Concurrency(1), false),
            result(Level::Concurrency(2), true),
        ];
        assert_eq!(
            totals_line(&rows),
            "all levels: 4 request(s) sent (warm-up and drain included), 2 failed"
        );
    }

    #[test]
    fn json_is_an_array_of_flat_levels() {
        let v: serde_json::Value =
            serde_json::from_str(&json(&[result(Level::Concurrency(3), false)])).unwrap();
        assert_eq!(v[0]["level"]["concurrency"], 3);
        assert_eq!(v[0]["throughput"], 8.0);
        assert_eq!(v[0]["stable"], true);
        assert!(v[0].get("grid").is_none());
        assert_eq!(v[0]["requests_total"], 1);
        assert_eq!(v[0]["errors_total"], 0);
        assert_eq!(v[0]["first_errors"], serde_json::json!([]));
        let v: serde_json::Value =
            serde_json::from_str(&json(&[result(Level::Concurrency(3), true)])).unwrap();
        assert_eq!(
            (v[0]["errors"].as_u64(), v[0]["errors_total"].as_u64()),
            (Some(1), Some(2))
        );
        assert_eq!(v[0]["first_errors"][1], "connection reset");
    }
}
