//! Per-model-version statistics, in the shape of Triton's statistics extension.
//!
//! Counters are updated once per request by the server after the request finishes (success or
//! failure), under a short mutex that is never held across an await. The same counters feed
//! the Prometheus metrics (the `metrics` module, which reads them), with a few things only the metrics report:
//!
//! ```text
//! submit ─► PendingMark (pending += 1) ─► batch starts executing / request dropped (pending -= 1)
//! success ─► cumulative counters + recent-latency windows (summaries) + first-response histogram
//! load    ─► LoadReport (how long the version took to load, the memory it holds)
//! ```
//!
//! [`window`] keeps the recent observations the latency summaries' quantiles are computed from.

pub mod window;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nereid_proto::pb::inference::{
    InferBatchStatistics, InferStatistics, ModelStatistics, StatisticDuration,
};
use parking_lot::Mutex;

use self::window::Window;

/// Upper bounds of `nv_inference_first_response_histogram_ms`'s buckets (Triton's defaults).
pub const FIRST_RESPONSE_BUCKETS_MS: [f64; 4] = [100.0, 500.0, 2000.0, 5000.0];

/// Where one successful request spent its time.
#[derive(Clone, Copy, Debug, Default)]
pub struct RequestTimings {
    pub total: Duration,
    pub queue: Duration,
    pub compute_input: Duration,
    pub compute_infer: Duration,
    pub compute_output: Duration,
}

/// Why a request failed, as Triton's `nv_inference_request_failure{reason}` labels it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureReason {
    /// Refused by the scheduler: queue full, queue timeout.
    Rejected,
    /// The client went away before the answer.
    Canceled,
    /// The backend failed while executing.
    Backend,
    /// Anything else (e.g. a request that does not fit the model).
    Other,
}

impl FailureReason {
    pub const ALL: [FailureReason; 4] = [
        FailureReason::Rejected,
        FailureReason::Canceled,
        FailureReason::Backend,
        FailureReason::Other,
    ];

    pub fn label(self) -> &'static str {
        match self {
            FailureReason::Rejected => "REJECTED",
            FailureReason::Canceled => "CANCELED",
            FailureReason::Backend => "BACKEND",
            FailureReason::Other => "OTHER",
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Counter {
    count: u64,
    ns: u64,
}

impl Counter {
    fn add(&mut self, d: Duration) {
        self.count += 1;
        self.ns = self
            .ns
            .saturating_add(d.as_nanos().min(u128::from(u64::MAX)) as u64);
    }

    fn to_proto(self) -> Option<StatisticDuration> {
        Some(StatisticDuration {
            count: self.count,
            ns: self.ns,
        })
    }
}

#[derive(Debug, Default)]
struct Inner {
    last_inference_ms: u64,
    inference_count: u64,
    execution_count: u64,
    success: Counter,
    fail: Counter,
    queue: Counter,
    compute_input: Counter,
    compute_infer: Counter,
    compute_output: Counter,
    cache_hit: Counter,
    cache_miss: Counter,
    batches: BTreeMap<u64, [Counter; 3]>,
    /// Failures by [`FailureReason`], in `FailureReason::ALL` order.
    failures_by_reason: [u64; 4],
    /// Recent successful requests' durations in microseconds, in [`Latency::ALL`] order.
    recent: [Window; 5],
    first_response: FirstResponse,
}

/// Cumulative first-response histogram (buckets of [`FIRST_RESPONSE_BUCKETS_MS`] unless the
/// model's `model_metrics` sets its own).
#[derive(Debug, Clone)]
struct FirstResponse {
    /// Upper bounds of the buckets, increasing.
    bounds: Vec<f64>,
    /// Observations at or below each bound (not yet cumulative across buckets).
    buckets: Vec<u64>,
    sum_ms: f64,
    count: u64,
}

impl FirstResponse {
    fn with_bounds(bounds: &[f64]) -> FirstResponse {
        FirstResponse {
            bounds: bounds.to_vec(),
            buckets: vec![0; bounds.len()],
            sum_ms: 0.0,
            count: 0,
        }
    }
}

impl Default for FirstResponse {
    fn default() -> FirstResponse {
        FirstResponse::with_bounds(&FIRST_RESPONSE_BUCKETS_MS)
    }
}

/// The latencies a successful request reports, in the order of the summaries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Latency {
    Request,
    Queue,
    ComputeInput,
    ComputeInfer,
    ComputeOutput,
}

impl Latency {
    pub const ALL: [Latency; 5] = [
        Latency::Request,
        Latency::Queue,
        Latency::ComputeInput,
        Latency::ComputeInfer,
        Latency::ComputeOutput,
    ];
}

/// What loading a version cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadReport {
    /// From the start of its instances' load to its scheduler running (warmup included).
    pub duration: Duration,
    /// Memory the version holds: for instances in this process, the C heap's growth across
    /// their load and warmup (loads measured one at a time, [`crate::probe::heap`]); for
    /// instances in processes of their own (Python stubs), those processes' anonymous memory
    /// after the load ([`crate::probe::host::process_anon_memory`]).
    pub memory_bytes: u64,
}

/// The first-response histogram: cumulative bucket counts, sum (ms) and count.
#[derive(Clone, Debug, PartialEq)]
pub struct Histogram {
    pub buckets: Vec<(f64, u64)>,
    pub sum: f64,
    pub count: u64,
}

/// Statistics of one loaded model version.
#[derive(Debug, Default)]
pub struct VersionStats {
    inner: Mutex<Inner>,
    /// Requests between arrival and their answer (queued or executing).
    in_flight: AtomicU64,
    /// Requests handed to the scheduler that have not started executing.
    pending: AtomicU64,
    /// Requests received since the version loaded (heartbeats report it: the control plane's
    /// model cache evicts the least recently used models first).
    received: AtomicU64,
    load: Mutex<Option<LoadReport>>,
}

/// One request counted as pending on its version; stops counting when its batch starts
/// executing or it is answered without executing ([`PendingMark::release`]), at the latest
/// when dropped (e.g. the scheduler stopped). Counts down exactly once.
#[derive(Debug)]
pub struct PendingMark {
    stats: Arc<VersionStats>,
    counted: bool,
}

impl PendingMark {
    /// The request is no longer pending: its batch starts executing, or it is answered
    /// without executing (refused, timed out, canceled).
    pub fn release(&mut self) {
        if std::mem::take(&mut self.counted) {
            self.stats.pending.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Drop for PendingMark {
    fn drop(&mut self) {
        self.release();
    }
}

impl VersionStats {
    /// Statistics whose first-response histogram has buckets with these upper bounds
    /// (milliseconds, increasing: a model's `model_metrics` override); `None`: the defaults.
    pub fn with_first_response_buckets(bounds: Option<&[f64]>) -> VersionStats {
        let stats = VersionStats::default();
        if let Some(bounds) = bounds {
            stats.inner.lock().first_response = FirstResponse::with_bounds(bounds);
        }
        stats
    }

    /// A request for this version arrived; pair with [`VersionStats::request_finished`].
    pub fn request_started(&self) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.received.fetch_add(1, Ordering::Relaxed);
    }

    /// Requests received since the version loaded.
    pub fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    pub fn request_finished(&self) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }

    /// Requests received and not answered yet (queued or executing).
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Counts a request as pending until the returned mark says it executes (or is dropped).
    pub fn pending(self: &Arc<Self>) -> PendingMark {
        self.pending.fetch_add(1, Ordering::Relaxed);
        PendingMark {
            stats: self.clone(),
            counted: true,
        }
    }

    /// Requests received by the scheduler and not executing yet.
    pub fn pending_count(&self) -> u64 {
        self.pending.load(Ordering::Relaxed)
    }

    /// Keeps what loading the version cost.
    pub fn set_load(&self, report: LoadReport) {
        *self.load.lock() = Some(report);
    }

    /// What loading the version cost; `None` for versions without instances (ensembles).
    pub fn load(&self) -> Option<LoadReport> {
        *self.load.lock()
    }

    /// Recent successful requests' durations in microseconds, oldest first, by latency.
    pub fn recent(&self, latency: Latency) -> Vec<u64> {
        let index = Latency::ALL.iter().position(|l| *l == latency).unwrap_or(0);
        self.inner.lock().recent[index].values()
    }

    /// Time to the first (for non-decoupled models: the only) response of successful requests.
    pub fn first_response_histogram(&self) -> Histogram {
        let h = self.inner.lock().first_response.clone();
        let mut cumulative = 0;
        let buckets = h
            .bounds
            .iter()
            .zip(h.buckets)
            .map(|(&bound, n)| {
                cumulative += n;
                (bound, cumulative)
            })
            .collect();
        Histogram {
            buckets,
            sum: h.sum_ms,
            count: h.count,
        }
    }

    /// Records one execution of the model on a batch of `batch_size` inferences.
    pub fn record_execution(
        &self,
        batch_size: usize,
        input: Duration,
        infer: Duration,
        output: Duration,
    ) {
        let mut s = self.inner.lock();
        s.inference_count += batch_size as u64;
        s.execution_count += 1;
        let batch = s.batches.entry(batch_size as u64).or_default();
        batch[0].add(input);
        batch[1].add(infer);
        batch[2].add(output);
    }

    /// Records a request that produced a response (its share of the batch's compute time is
    /// the whole batch's, as in Triton).
    pub fn record_success(&self, t: RequestTimings) {
        let mut s = self.inner.lock();
        s.last_inference_ms = now_ms();
        s.success.add(t.total);
        s.queue.add(t.queue);
        s.compute_input.add(t.compute_input);
        s.compute_infer.add(t.compute_infer);
        s.compute_output.add(t.compute_output);
        let durations = [
            t.total,
            t.queue,
            t.compute_input,
            t.compute_infer,
            t.compute_output,
        ];
        for (window, d) in s.recent.iter_mut().zip(durations) {
            window.observe(d.as_micros().min(u128::from(u64::MAX)) as u64);
        }
        let ms = t.total.as_secs_f64() * 1000.0;
        let h = &mut s.first_response;
        if let Some(i) = h.bounds.iter().position(|&b| ms <= b) {
            h.buckets[i] += 1;
        }
        h.sum_ms += ms;
        h.count += 1;
    }

    /// Records a successful request of an ensemble. As in Triton its inferences count, but it
    /// executes nothing itself: its composing models count their own executions, queue and
    /// compute time.
    pub fn record_ensemble_success(&self, batch_size: usize, total: Duration) {
        let mut s = self.inner.lock();
        s.last_inference_ms = now_ms();
        s.inference_count += batch_size as u64;
        s.success.add(total);
    }

    /// Records a request answered from the response cache, as Triton counts it: a success
    /// (end to end `total`, no queue time) and a cache hit taking `lookup`; no inference,
    /// execution or compute time, and no latency-window observation.
    pub fn record_cache_hit(&self, total: Duration, lookup: Duration) {
        let mut s = self.inner.lock();
        s.last_inference_ms = now_ms();
        s.success.add(total);
        s.queue.add(Duration::ZERO);
        s.cache_hit.add(lookup);
    }

    /// Records a request that missed the response cache and was executed: `took` is the lookup
    /// plus the insertion of its answer, added to the request's duration as Triton does.
    pub fn record_cache_miss(&self, took: Duration) {
        let mut s = self.inner.lock();
        s.cache_miss.add(took);
        s.success.ns = s
            .success
            .ns
            .saturating_add(took.as_nanos().min(u128::from(u64::MAX)) as u64);
    }

    /// Records a request for this version that failed.
    pub fn record_failure(&self, total: Duration, reason: FailureReason) {
        let mut s = self.inner.lock();
        s.last_inference_ms = now_ms();
        s.fail.add(total);
        let index = FailureReason::ALL
            .iter()
            .position(|r| *r == reason)
            .unwrap_or(3);
        s.failures_by_reason[index] += 1;
    }

    /// Failure counts by reason, in `FailureReason::ALL` order.
    pub fn failures_by_reason(&self) -> [u64; 4] {
        self.inner.lock().failures_by_reason
    }

    /// The statistics message for `name`/`version`.
    pub fn snapshot(&self, name: &str, version: i64) -> ModelStatistics {
        let s = self.inner.lock();
        ModelStatistics {
            name: name.to_string(),
            version: version.to_string(),
            last_inference: s.last_inference_ms,
            inference_count: s.inference_count,
            execution_count: s.execution_count,
            inference_stats: Some(InferStatistics {
                success: s.success.to_proto(),
                fail: s.fail.to_proto(),
                queue: s.queue.to_proto(),
                compute_input: s.compute_input.to_proto(),
                compute_infer: s.compute_infer.to_proto(),
                compute_output: s.compute_output.to_proto(),
                cache_hit: s.cache_hit.to_proto(),
                cache_miss: s.cache_miss.to_proto(),
            }),
            batch_stats: s
                .batches
                .iter()
                .map(|(&batch_size, c)| InferBatchStatistics {
                    batch_size,
                    compute_input: c[0].to_proto(),
                    compute_infer: c[1].to_proto(),
                    compute_output: c[2].to_proto(),
                })
                .collect(),
            memory_usage: Vec::new(),
            // Triton fills this only from backends that report per-response statistics
            // (TRITONBACKEND_ModelInstanceReportResponseStatistics); its Python, ONNX Runtime and
            // PyTorch backends never do, so it stays empty there, decoupled models included
            // (tests/python/test_triton_diff.py::test_decoupled_response_statistics).
            response_stats: Default::default(),
        }
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_successes_failures_and_batches() {
        let s = VersionStats::default();
        let t = RequestTimings {
            total: Duration::from_micros(10),
            compute_infer: Duration::from_micros(4),
            ..Default::default()
        };
        s.record_execution(4, Duration::ZERO, t.compute_infer, Duration::ZERO);
        s.record_success(t);
        s.record_execution(1, Duration::ZERO, t.compute_infer, Duration::ZERO);
        s.record_success(t);
        s.record_failure(Duration::from_micros(3), FailureReason::Rejected);
        let m = s.snapshot("m", 1);
        assert_eq!((m.inference_count, m.execution_count), (5, 2));
        let i = m.inference_stats.unwrap();
        assert_eq!(
            i.success.unwrap(),
            StatisticDuration {
                count: 2,
                ns: 20_000
            }
        );
        assert_eq!(
            i.fail.unwrap(),
            StatisticDuration {
                count: 1,
                ns: 3_000
            }
        );
        assert_eq!(
            m.batch_stats
                .iter()
                .map(|b| b.batch_size)
                .collect::<Vec<_>>(),
            vec![1, 4]
        );
        assert!(m.last_inference > 0);
        assert_eq!(s.failures_by_reason(), [1, 0, 0, 0]);
        assert_eq!(s.recent(Latency::Request), vec![10, 10]);
        assert_eq!(s.recent(Latency::ComputeInfer), vec![4, 4]);
        let h = s.first_response_histogram();
        assert_eq!(h.count, 2);
        assert_eq!(h.buckets[0], (100.0, 2));
        assert_eq!(h.buckets[3], (5000.0, 2));
    }

    #[test]
    fn cache_hits_count_as_successes_without_compute() {
        let s = VersionStats::default();
        s.record_execution(1, Duration::ZERO, Duration::from_micros(4), Duration::ZERO);
        s.record_success(RequestTimings {
            total: Duration::from_micros(10),
            compute_infer: Duration::from_micros(4),
            ..Default::default()
        });
        s.record_cache_miss(Duration::from_micros(2));
        s.record_cache_hit(Duration::from_micros(3), Duration::from_micros(1));
        let m = s.snapshot("m", 1);
        assert_eq!((m.inference_count, m.execution_count), (1, 1));
        let i = m.inference_stats.unwrap();
        let d = |count: u64, us: u64| {
            Some(StatisticDuration {
                count,
                ns: us * 1000,
            })
        };
        assert_eq!(i.success, d(2, 15));
        assert_eq!(i.queue, d(2, 0));
        assert_eq!(i.compute_infer, d(1, 4));
        assert_eq!(i.cache_hit, d(1, 1));
        assert_eq!(i.cache_miss, d(1, 2));
        assert_eq!(
            s.recent(Latency::Request),
            vec![10],
            "a hit is not observed"
        );
    }

    #[test]
    fn histogram_buckets_are_cumulative() {
        let s = VersionStats::default();
        for ms in [50, 300, 300, 9000] {
            s.record_success(RequestTimings {
                total: Duration::from_millis(ms),
                ..Default::default()
            });
        }
        let h = s.first_response_histogram();
        assert_eq!(
            h.buckets,
            vec![(100.0, 1), (500.0, 3), (2000.0, 3), (5000.0, 3)]
        );
        assert_eq!((h.sum, h.count), (9650.0, 4));
        // A model's own bounds (model_metrics): values above the last count only in +Inf.
        let s = VersionStats::with_first_response_buckets(Some(&[0.0, 100.0]));
        for ms in [0, 50, 300] {
            s.record_success(RequestTimings {
                total: Duration::from_millis(ms),
                ..Default::default()
            });
        }
        let h = s.first_response_histogram();
        assert_eq!(h.buckets, vec![(0.0, 1), (100.0, 2)]);
        assert_eq!(h.count, 3);
    }

    #[test]
    fn pending_counts_down_once_and_returns_to_zero() {
        let s = Arc::new(VersionStats::default());
        let mut executed = s.pending();
        let dropped = s.pending();
        assert_eq!(s.pending_count(), 2);
        executed.release();
        executed.release();
        assert_eq!(s.pending_count(), 1);
        drop(executed);
        assert_eq!(s.pending_count(), 1);
        drop(dropped);
        assert_eq!(s.pending_count(), 0);
    }
}
