//! Measurement windows, their summaries and the stability decision.
//!
//! ```text
//! workers ──record──► Recorder (short std-mutex sections, never across .await)
//!                        │ take() at each window end
//!                        ▼
//!                     Window ──summary()──► Summary ──► is_stable(last 3)?
//!                        │                                   │ yes, or max trials
//!                        └──────── Window::merge(last 3) ────┴──► the level's result
//! ```
//!
//! Everything except [`Recorder`] is a pure function of its inputs and unit-tested. Latencies
//! are kept in microseconds in an HDR histogram (3 significant digits, 1 µs to 1 hour).

use std::sync::Mutex;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// Highest latency the histogram tracks, in microseconds (1 hour); longer ones saturate.
const MAX_LATENCY_US: u64 = 3_600_000_000;

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

/// Collects completions from all workers into the current window.
#[derive(Debug, Default)]
pub struct Recorder {
    current: Mutex<Window>,
}

impl Recorder {
    fn lock(&self) -> std::sync::MutexGuard<'_, Window> {
        // A panic while holding this lock cannot leave the window half-updated in a way that
        // matters for statistics, so a poisoned lock is used as is.
        self.current.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn record(&self, latency: Duration, result: &Result<(), String>) {
        self.lock().record(latency, result);
    }

    pub fn sent(&self) {
        self.lock().sent += 1;
    }

    pub fn skipped(&self) {
        self.lock().skipped += 1;
    }

    /// Ends the current window and starts a fresh one.
    pub fn take(&self) -> Window {
        std::mem::take(&mut *self.lock())
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
