//! Measurement windows, their summaries and the stability decision.
//!
//! ```text
//! workers ──record──► Recorder (short std-mutex sections, never across .await)
//!                        │ take() at each window end
//!                        ▼
//!                     Window ──summary()──► Summary ──► is_stable(last 3)?
//!                        │                                   │ yes, or max trials
//!                        └──────── Window::merge(last 3) ────┴──► the level's result
//!                     Tally (never reset: warm-up, every window, the drain) ──► Totals
//! ```
//!
//! Windows give the latency and throughput figures; the [`Tally`] accounts for every request of
//! the level, so a failure outside the reported windows is still counted (`--fail-on-errors`
//! and the fault tests rely on it). Everything except [`Recorder`] is a pure function of its
//! inputs and unit-tested. Latencies
//! are kept in microseconds in an HDR histogram (3 significant digits, 1 µs to 1 hour).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// Highest latency the histogram tracks, in microseconds (1 hour); longer ones saturate.
const MAX_LATENCY_US: u64 = 3_600_000_000;

#[allow(clippy::expect_used, reason = "constant bounds")]
fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_LATENCY_US, 3)
        .expect("constant histogram bounds are valid (1 <= low, high >= 2 * low, 3 sigfigs)")
}

/// What one measurement window saw (requests counted when they complete).
#[derive(Clone, Debug)]
pub struct Window {
    pub latencies: Histogram<u64>,
    /// Successful requests.
    pub ok: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    pub elapsed: Duration,
    /// Client process CPU time (user + system) spent during the window, when known.
    pub cpu: Option<Duration>,
    /// Open loop: requests sent, and requests skipped because `--max-outstanding` were in flight.
    pub sent: u64,
    pub skipped: u64,
}

impl Default for Window {
    fn default() -> Self {
        Window {
            latencies: new_histogram(),
            ok: 0,
            errors: 0,
            first_error: None,
            elapsed: Duration::ZERO,
            cpu: None,
            sent: 0,
            skipped: 0,
        }
    }
}

/// Numbers of a window (or of merged windows) as reported.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Summary {
    pub requests: u64,
    pub errors: u64,
    pub seconds: f64,
    /// Inferences per second: successful requests × batch size / seconds.
    pub throughput: f64,
    pub avg_us: f64,
    pub p50_us: u64,
    pub p90_us: u64,
    pub p95_us: u64,
    pub p99_us: u64,
    pub max_us: u64,
    /// Client CPU use in percent of one core.
    pub client_cpu_percent: Option<f64>,
    /// Open loop: requests actually sent per second, and skipped ones.
    pub send_rate: f64,
    pub skipped: u64,
    pub first_error: Option<String>,
}

impl Window {
    /// Adds one completed request.
    pub fn record(&mut self, latency: Duration, result: &Result<(), String>) {
        match result {
            Ok(()) => {
                self.ok += 1;
                let us = u64::try_from(latency.as_micros())
                    .unwrap_or(u64::MAX)
                    .max(1);
                self.latencies.saturating_record(us);
            }
            Err(e) => {
                self.errors += 1;
                if self.first_error.is_none() {
                    self.first_error = Some(e.clone());
                }
            }
        }
    }

    /// Pools several windows into one (histograms merged, counts and times summed).
    pub fn merge(windows: &[Window]) -> Window {
        let mut out = Window {
            cpu: windows.iter().map(|w| w.cpu).sum::<Option<Duration>>(),
            ..Window::default()
        };
        for w in windows {
            // Both histograms share bounds, so adding cannot fail; if it ever did the
            // percentiles would only miss that window's samples.
            let _ = out.latencies.add(&w.latencies);
            out.ok += w.ok;
            out.errors += w.errors;
            if out.first_error.is_none() {
                out.first_error.clone_from(&w.first_error);
            }
            out.elapsed += w.elapsed;
            out.sent += w.sent;
            out.skipped += w.skipped;
        }
        out
    }

    pub fn summary(&self, batch_size: u32) -> Summary {
        let secs = self.elapsed.as_secs_f64();
        let per_sec = |n: u64| if secs > 0.0 { n as f64 / secs } else { 0.0 };
        let h = &self.latencies;
        let pct = |q: f64| {
            if h.is_empty() {
                0
            } else {
                h.value_at_quantile(q)
            }
        };
        Summary {
            requests: self.ok,
            errors: self.errors,
            seconds: secs,
            throughput: per_sec(self.ok) * f64::from(batch_size),
            avg_us: if h.is_empty() { 0.0 } else { h.mean() },
            p50_us: pct(0.50),
            p90_us: pct(0.90),
            p95_us: pct(0.95),
            p99_us: pct(0.99),
            max_us: if h.is_empty() { 0 } else { h.max() },
            client_cpu_percent: self
                .cpu
                .filter(|_| secs > 0.0)
                .map(|c| 100.0 * c.as_secs_f64() / secs),
            send_rate: per_sec(self.sent),
            skipped: self.skipped,
            first_error: self.first_error.clone(),
        }
    }
}

/// How many distinct error messages a level's [`Totals`] keep.
pub const KEPT_ERROR_MESSAGES: usize = 5;

/// The completions of a whole level, from its first warm-up request to the last one drained.
/// Unlike a [`Window`] it is never reset.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Tally {
    pub ok: u64,
    pub errors: u64,
    /// The first [`KEPT_ERROR_MESSAGES`] distinct error messages, in order of appearance.
    pub messages: Vec<String>,
}

/// Every request a level sent, as reported (`requests_total`, `errors_total`, `first_errors`
/// in the JSON).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Totals {
    /// Requests sent at this level: warm-up, measurement windows and the drain at the end.
    pub requests_total: u64,
    /// Of those, failed ones, including any still unanswered when the level ended.
    pub errors_total: u64,
    /// The first few distinct error messages of the whole level.
    pub first_errors: Vec<String>,
}

impl Tally {
    pub fn record(&mut self, result: &Result<(), String>) {
        match result {
            Ok(()) => self.ok += 1,
            Err(e) => {
                self.errors += 1;
                self.note(e);
            }
        }
    }

    fn note(&mut self, message: &str) {
        if self.messages.len() < KEPT_ERROR_MESSAGES && !self.messages.iter().any(|m| m == message)
        {
            self.messages.push(message.to_string());
        }
    }

    /// The level's totals once its load has stopped, given how many requests were `started`.
    /// A request started but never completed (abandoned when the drain outlived the request
    /// timeout) counts as failed: no request goes unaccounted.
    pub fn totals(&self, started: u64) -> Totals {
        let completed = self.ok + self.errors;
        let unanswered = started.saturating_sub(completed);
        let mut tally = self.clone();
        if unanswered > 0 {
            tally.note(&format!(
                "{unanswered} request(s) still unanswered when the level ended (abandoned after --request-timeout-secs)"
            ));
        }
        Totals {
            requests_total: started.max(completed),
            errors_total: self.errors + unanswered,
            first_errors: tally.messages,
        }
    }
}

/// The current window and the level's tally, updated together.
#[derive(Debug, Default)]
struct Recorded {
    window: Window,
    tally: Tally,
}

/// Collects completions from all workers into the current window and the level's tally.
#[derive(Debug, Default)]
pub struct Recorder {
    current: Mutex<Recorded>,
    /// Requests handed to the client so far (counted before sending, outside the lock).
    started: AtomicU64,
}

impl Recorder {
    fn lock(&self) -> std::sync::MutexGuard<'_, Recorded> {
        // A panic while holding this lock cannot leave the window half-updated in a way that
        // matters for statistics, so a poisoned lock is used as is.
        self.current.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A request is about to be sent; call before [`Recorder::record`] for the same request.
    pub fn started(&self) {
        self.started.fetch_add(1, Ordering::Relaxed);
    }

    pub fn record(&self, latency: Duration, result: &Result<(), String>) {
        let mut r = self.lock();
        r.window.record(latency, result);
        r.tally.record(result);
    }

    pub fn sent(&self) {
        self.lock().window.sent += 1;
    }

    pub fn skipped(&self) {
        self.lock().window.skipped += 1;
    }

    /// Ends the current window and starts a fresh one (the tally goes on).
    pub fn take(&self) -> Window {
        std::mem::take(&mut self.lock().window)
    }

    /// Every request of the level so far; read it after the load has stopped and drained.
    pub fn totals(&self) -> Totals {
        let started = self.started.load(Ordering::Relaxed);
        self.lock().tally.totals(started)
    }
}

/// How many of the latest windows must agree for a level to be stable.
pub const STABLE_WINDOWS: usize = 3;

/// Whether the last [`STABLE_WINDOWS`] windows agree: their throughput and their p99 latency
/// each lie within `percentage` % of the respective mean (perf_analyzer's rule).
pub fn is_stable(windows: &[Summary], percentage: f64) -> bool {
    if windows.len() < STABLE_WINDOWS {
        return false;
    }
    let last = &windows[windows.len() - STABLE_WINDOWS..];
    let throughput: Vec<f64> = last.iter().map(|s| s.throughput).collect();
    let p99: Vec<f64> = last.iter().map(|s| s.p99_us as f64).collect();
    within(&throughput, percentage) && within(&p99, percentage)
}

fn within(values: &[f64], percentage: f64) -> bool {
    let mean = values.iter().sum::<f64>() / values.len() as f64;
    let tolerance = mean.abs() * percentage / 100.0;
    values.iter().all(|v| (v - mean).abs() <= tolerance)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(throughput: f64, p99_us: u64) -> Summary {
        let w = Window {
            elapsed: Duration::from_secs(1),
            ..Window::default()
        };
        let mut s = w.summary(1);
        s.throughput = throughput;
        s.p99_us = p99_us;
        s
    }

    #[test]
    fn stability_needs_three_agreeing_windows() {
        let a = summary(1000.0, 500);
        assert!(!is_stable(&[a.clone(), a.clone()], 10.0));
        assert!(is_stable(&[a.clone(), a.clone(), a.clone()], 10.0));
        // Only the last three count.
        assert!(is_stable(
            &[summary(10.0, 9000), a.clone(), a.clone(), a.clone()],
            10.0
        ));
    }

    #[test]
    fn stability_checks_throughput_and_p99() {
        let t = [
            summary(1000.0, 500),
            summary(1100.0, 500),
            summary(950.0, 500),
        ];
        assert!(is_stable(&t, 10.0));
        assert!(!is_stable(&t, 5.0));
        let p = [
            summary(1000.0, 500),
            summary(1000.0, 700),
            summary(1000.0, 500),
        ];
        assert!(!is_stable(&p, 10.0), "p99 moved by 24% of the mean");
        let zero = [summary(0.0, 0), summary(0.0, 0), summary(0.0, 0)];
        assert!(is_stable(&zero, 10.0));
    }

    #[test]
    fn window_summary_and_merge() {
        let mut a = Window::default();
        for us in 1..=100u64 {
            a.record(Duration::from_micros(us * 10), &Ok(()));
        }
        a.record(Duration::from_millis(5), &Err("boom".into()));
        a.elapsed = Duration::from_secs(2);
        a.cpu = Some(Duration::from_millis(500));
        let s = a.summary(4);
        assert_eq!(s.requests, 100);
        assert_eq!(s.errors, 1);
        assert_eq!(s.first_error.as_deref(), Some("boom"));
        assert!(
            (s.throughput - 200.0).abs() < 1e-9,
            "100 requests × 4 / 2 s"
        );
        assert!((s.p50_us as i64 - 500).abs() <= 1);
        assert!((s.p99_us as i64 - 990).abs() <= 1);
        assert!((s.max_us as i64 - 1000).abs() <= 1);
        assert_eq!(s.client_cpu_percent, Some(25.0));

        let mut b = Window::default();
        b.record(Duration::from_millis(100), &Ok(()));
        b.record(Duration::ZERO, &Err("later".into()));
        b.elapsed = Duration::from_secs(2);
        b.cpu = Some(Duration::from_millis(300));
        let m = Window::merge(&[a, b]).summary(1);
        assert_eq!(m.requests, 101);
        assert_eq!(m.errors, 2);
        assert_eq!(m.first_error.as_deref(), Some("boom"));
        assert!((m.max_us as i64 - 100_000).abs() <= 100);
        assert_eq!(m.client_cpu_percent, Some(20.0));
    }

    #[test]
    fn empty_window_reports_zeros() {
        let s = Window::default().summary(1);
        assert_eq!(
            (s.throughput, s.p99_us, s.max_us, s.avg_us),
            (0.0, 0, 0, 0.0)
        );
        assert_eq!(s.client_cpu_percent, None);
    }

    #[test]
    fn tally_counts_every_request_and_keeps_distinct_messages() {
        let mut t = Tally::default();
        for i in 0..20 {
            t.record(&Ok(()));
            t.record(&Err(format!("error {}", i % 7)));
            t.record(&Err("error 0".into()));
        }
        let totals = t.totals(60);
        assert_eq!((totals.requests_total, totals.errors_total), (60, 40));
        assert_eq!(
            totals.first_errors,
            ["error 0", "error 1", "error 2", "error 3", "error 4"]
        );
        assert_eq!(Tally::default().totals(0), Totals::default());
    }

    #[test]
    fn unanswered_requests_count_as_failed() {
        let mut t = Tally::default();
        t.record(&Ok(()));
        t.record(&Ok(()));
        let totals = t.totals(5);
        assert_eq!((totals.requests_total, totals.errors_total), (5, 3));
        assert!(
            totals.first_errors[0].starts_with("3 request(s) still unanswered"),
            "{:?}",
            totals.first_errors
        );
    }

    #[test]
    fn recorder_tally_survives_windows() {
        let r = Recorder::default();
        for result in [Ok(()), Err("warm-up failure".to_string())] {
            r.started();
            r.record(Duration::from_micros(3), &result);
        }
        let warmup = r.take();
        assert_eq!((warmup.ok, warmup.errors), (1, 1));
        r.started();
        r.record(Duration::from_micros(3), &Ok(()));
        let _window = r.take();
        // In flight when the last window closed, completed during the drain.
        r.started();
        r.record(Duration::from_micros(3), &Err("late failure".into()));
        let totals = r.totals();
        assert_eq!((totals.requests_total, totals.errors_total), (4, 2));
        assert_eq!(totals.first_errors, ["warm-up failure", "late failure"]);
    }

    #[test]
    fn recorder_take_starts_a_new_window() {
        let r = Recorder::default();
        r.record(Duration::from_micros(3), &Ok(()));
        r.sent();
        r.skipped();
        let w = r.take();
        assert_eq!((w.ok, w.sent, w.skipped), (1, 1, 1));
        assert_eq!(r.take().ok, 0);
    }
}
