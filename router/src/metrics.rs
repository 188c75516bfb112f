//! The router's own metrics (`nereid_router_*`), counted on the request path and turned into
//! [`Family`]s on a scrape.
//!
//! ```text
//! RouterService::infer ─► RouterMetrics::model(name) ─► ModelCounters (atomics: outcome,
//!                         │                             duration buckets, retries, activations)
//!                         ├─ retry ──────────────────► ModelCounters::retries
//!                         ├─ hedge ──────────────────► ModelCounters::hedges
//!                         └─ unreachable replica ────► RouterMetrics::ejected(node)
//! GET /metrics ─► collector::RouterCollector ─► in flight, table revision, outstanding per replica
//!                                            (from the service) + the counters above
//! ```
//!
//! The hot path costs a read-locked map lookup and a few relaxed atomic adds. Counters are kept
//! per model only for models the routing table knows when they are first counted; requests
//! naming any other model are counted under the model label [`OTHER_MODEL`], so a client cannot
//! grow the label set without bound.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use nereid_telemetry::{Family, Kind, Labels, Value};

use crate::table::RoutingTable;

/// The model label of requests for models the routing table does not know.
pub const OTHER_MODEL: &str = "_other";

/// Upper bounds (seconds) of `nereid_router_request_duration_seconds`.
pub const DURATION_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// A fixed-bucket histogram of durations: one atomic per bucket (not cumulative; the `+Inf`
/// bucket last), the sum in nanoseconds.
#[derive(Debug, Default)]
pub struct DurationHistogram {
    buckets: [AtomicU64; DURATION_BUCKETS.len() + 1],
    sum_nanos: AtomicU64,
}

impl DurationHistogram {
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let i = DURATION_BUCKETS
            .iter()
            .position(|bound| secs <= *bound)
            .unwrap_or(DURATION_BUCKETS.len());
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// The upper bound of the bucket holding quantile `q` of what was observed, once there
    /// are at least `min_count` observations; `None` before that, or when the quantile lies
    /// beyond the last bound.
    pub fn quantile_bound(&self, q: f64, min_count: u64) -> Option<Duration> {
        // Read on every request (the hedging timeout): a fixed array, no allocation.
        let counts: [u64; DURATION_BUCKETS.len() + 1] =
            std::array::from_fn(|i| self.buckets[i].load(Ordering::Relaxed));
        let total: u64 = counts.iter().sum();
        if total == 0 || total < min_count {
            return None;
        }
        let target = ((q * total as f64).ceil() as u64).max(1);
        let mut cumulative = 0;
        for (bound, n) in DURATION_BUCKETS.iter().zip(&counts) {
            cumulative += n;
            if cumulative >= target {
                return Some(Duration::from_secs_f64(*bound));
            }
        }
        None
    }

    /// Cumulative buckets, sum and count; the count is the buckets' total, so the two agree
    /// even while requests finish during the read.
    pub fn value(&self) -> Value {
        let mut cumulative = 0;
        let mut buckets = Vec::with_capacity(DURATION_BUCKETS.len());
        for (bound, n) in DURATION_BUCKETS.iter().zip(&self.buckets) {
            cumulative += n.load(Ordering::Relaxed);
            buckets.push((*bound, cumulative));
        }
        let count = cumulative + self.buckets[DURATION_BUCKETS.len()].load(Ordering::Relaxed);
        Value::Histogram {
            buckets,
            sum: self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9,
            count,
        }
    }
}

/// How one routed inference ends, for the counters: the same classification on every path
/// (typed, gRPC pass-through, HTTP pass-through, streams).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Success,
    /// An error from the router or from the worker, whatever the transport carried it as (a
    /// gRPC status, an HTTP 4xx/5xx the worker wrote).
    Failure,
    /// Not counted here: another path serves (and counts) the request.
    HandedOn,
}

impl Outcome {
    /// The outcome of an HTTP answer by its status: 2xx is a success.
    pub fn of_status(status: axum::http::StatusCode) -> Outcome {
        if status.is_success() {
            Outcome::Success
        } else {
            Outcome::Failure
        }
    }
}

/// What a routed call returns, classified for the counters. An `Err` is always a failure.
pub trait Classify {
    fn outcome(&self) -> Outcome;
}

/// What the router counts per model.
#[derive(Debug, Default)]
pub struct ModelCounters {
    pub success: AtomicU64,
    pub failure: AtomicU64,
    pub retries: AtomicU64,
    /// Requests sent to a second replica because the first attempt stalled.
    pub hedges: AtomicU64,
    pub scale_from_zero: AtomicU64,
    pub duration: DurationHistogram,
}

impl ModelCounters {
    /// Counts one finished inference request.
    pub fn finish(&self, took: Duration, outcome: Outcome) {
        let counter = match outcome {
            Outcome::Success => &self.success,
            Outcome::Failure => &self.failure,
            Outcome::HandedOn => return,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        self.duration.observe(took);
    }

    /// Counts a finished call by its result.
    pub fn finish_result<T: Classify, E>(&self, took: Duration, result: &Result<T, E>) {
        let outcome = match result {
            Ok(answer) => answer.outcome(),
            Err(_) => Outcome::Failure,
        };
        self.finish(took, outcome);
    }
}

/// The router's cumulative counters.
#[derive(Debug, Default)]
pub struct RouterMetrics {
    models: RwLock<HashMap<String, Arc<ModelCounters>>>,
    other: Arc<ModelCounters>,
    ejections: Mutex<BTreeMap<String, u64>>,
}

impl RouterMetrics {
    /// The counters of `model`; `known` (asked only the first time) says whether the routing
    /// table knows it, else the request counts under [`OTHER_MODEL`].
    pub fn model(&self, model: &str, known: impl FnOnce() -> bool) -> Arc<ModelCounters> {
        if let Some(c) = self
            .models
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(model)
        {
            return c.clone();
        }
        if !known() {
            return self.other.clone();
        }
        self.models
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .entry(model.to_string())
            .or_default()
            .clone()
    }

    /// Counts one ejection of a replica on `node`.
    pub fn ejected(&self, node: &str) {
        let mut e = self.ejections.lock().unwrap_or_else(|p| p.into_inner());
        *e.entry(node.to_string()).or_default() += 1;
    }

    /// The counter families, series sorted by model (or node).
    /// The counter families; `nodes` are the workers the routing table knows, listed in the
    /// ejection counter at 0 until their first ejection (series exist before they move).
    pub fn families(&self, nodes: &[String]) -> Vec<Family> {
        let mut models: Vec<(String, Arc<ModelCounters>)> = self
            .models
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        models.sort_by(|a, b| a.0.cmp(&b.0));
        let other = &self.other;
        if other.success.load(Ordering::Relaxed) + other.failure.load(Ordering::Relaxed) > 0 {
            models.push((OTHER_MODEL.to_string(), other.clone()));
        }

        let mut requests = Family::counter(
            "nereid_router_requests_total",
            "Inference requests through this router, by model and outcome (success, failure).",
        );
        let mut duration = Family::new(
            "nereid_router_request_duration_seconds",
            "Time from a request's arrival at the router to its answer (a stream: to its opening), by model.",
            Kind::Histogram,
        );
        let mut retries = Family::counter(
            "nereid_router_retries_total",
            "Requests re-sent to another replica after the first failed before running, by model.",
        );
        let mut hedges = Family::counter(
            "nereid_router_hedges_total",
            "Requests also sent to a second replica because the first attempt stalled (its replica left the ready set, or it ran past the attempt timeout), by model.",
        );
        let mut activations = Family::counter(
            "nereid_router_scale_from_zero_total",
            "Requests that found no ready replica of a min_replicas 0 model and waited for its activation (the model cache's misses), by model.",
        );
        for (model, c) in &models {
            let load = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
            let of = |outcome: &str| Labels::of([("model", model.as_str()), ("outcome", outcome)]);
            requests.number(of("success"), load(&c.success));
            requests.number(of("failure"), load(&c.failure));
            let by_model = || Labels::of([("model", model.as_str())]);
            duration.sample(by_model(), c.duration.value());
            retries.number(by_model(), load(&c.retries));
            hedges.number(by_model(), load(&c.hedges));
            activations.number(by_model(), load(&c.scale_from_zero));
        }
        let mut ejections = Family::counter(
            "nereid_router_ejections_total",
            "Times a replica on this node was ejected (avoided for a while) after it could not be reached.",
        );
        let mut by_node = self
            .ejections
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        for node in nodes {
            by_node.entry(node.clone()).or_default();
        }
        for (node, n) in &by_node {
            ejections.number(Labels::of([("node", node.as_str())]), *n as f64);
        }
        vec![requests, duration, retries, hedges, ejections, activations]
    }
}

/// Outstanding requests per (model, version, node), every ready endpoint listed (0 when idle),
/// plus replicas that still have requests after they stopped being ready.
pub fn replica_in_flight(table: &RoutingTable, outstanding: &HashMap<u64, usize>) -> Family {
    let mut by_series: BTreeMap<(String, i64, String), usize> = BTreeMap::new();
    for model in table.models() {
        for version in table.ready_versions(&model.name) {
            for e in table.ready(&model.name, version) {
                let n = outstanding.get(&e.replica).copied().unwrap_or(0);
                *by_series
                    .entry((model.name.clone(), version, e.node.to_string()))
                    .or_default() += n;
            }
        }
    }
    for r in table.replicas() {
        if let Some(n) = outstanding.get(&r.id)
            && table.endpoint(&r.model, r.id).is_none()
        {
            *by_series
                .entry((r.model.clone(), r.version, r.node.clone()))
                .or_default() += n;
        }
    }
    let mut family = Family::gauge(
        "nereid_router_replica_in_flight",
        "Requests this router has outstanding on each replica, as replica choice weighs them.",
    );
    for ((model, version, node), n) in by_series {
        family.number(
            Labels::of([("model", model.as_str())])
                .and("version", version.to_string())
                .and("node", node),
            n as f64,
        );
    }
    family
}

#[cfg(test)]
mod tests {
    use nereid_proto::pb::cluster::{
        Model, Node, NodeAddresses, NodeStatus, Replica, ReplicaState, StateSnapshot, WatchEvent,
        watch_event,
    };
    use nereid_telemetry::render_prometheus;

    use super::*;

    #[test]
    fn durations_fall_in_cumulative_buckets_with_a_matching_count() {
        let h = DurationHistogram::default();
        h.observe(Duration::from_micros(300));
        h.observe(Duration::from_millis(3));
        h.observe(Duration::from_secs(60));
        let Value::Histogram {
            buckets,
            sum,
            count,
        } = h.value()
        else {
            panic!("not a histogram");
        };
        assert_eq!(count, 3);
        assert_eq!(buckets[0], (0.0005, 1));
        assert_eq!(buckets[3], (0.005, 2));
        assert_eq!(buckets.last(), Some(&(10.0, 2)));
        assert!((sum - 60.0033).abs() < 1e-9, "{sum}");
    }

    #[test]
    fn quantile_bounds_need_enough_observations() {
        let h = DurationHistogram::default();
        assert_eq!(h.quantile_bound(0.99, 1), None);
        for _ in 0..98 {
            h.observe(Duration::from_micros(300));
        }
        h.observe(Duration::from_millis(40));
        h.observe(Duration::from_millis(40));
        assert_eq!(h.quantile_bound(0.99, 200), None, "too few");
        assert_eq!(h.quantile_bound(0.99, 10), Some(Duration::from_millis(50)));
        assert_eq!(
            h.quantile_bound(0.5, 10),
            Some(Duration::from_secs_f64(0.0005))
        );
        h.observe(Duration::from_secs(60));
        h.observe(Duration::from_secs(60));
        assert_eq!(h.quantile_bound(0.99, 10), None, "beyond the last bound");
    }

    #[test]
    fn outcomes_are_classified_once_for_every_path() {
        struct Answer(Outcome);
        impl Classify for Answer {
            fn outcome(&self) -> Outcome {
                self.0
            }
        }
        let c = ModelCounters::default();
        c.finish_result::<Answer, ()>(Duration::ZERO, &Ok(Answer(Outcome::Success)));
        c.finish_result::<Answer, ()>(Duration::ZERO, &Ok(Answer(Outcome::Failure)));
        c.finish_result::<Answer, ()>(Duration::ZERO, &Err(()));
        c.finish_result::<Answer, ()>(Duration::ZERO, &Ok(Answer(Outcome::HandedOn)));
        assert_eq!(c.success.load(Ordering::Relaxed), 1);
        assert_eq!(c.failure.load(Ordering::Relaxed), 2);
        let statuses = [
            (200, Outcome::Success),
            (400, Outcome::Failure),
            (503, Outcome::Failure),
        ];
        for (code, outcome) in statuses {
            let status = axum::http::StatusCode::from_u16(code).unwrap();
            assert_eq!(Outcome::of_status(status), outcome, "{code}");
        }
    }

    #[test]
    fn unknown_models_share_one_label_and_known_ones_get_their_own() {
        let m = RouterMetrics::default();
        m.model("resnet", || true)
            .finish(Duration::from_millis(1), Outcome::Success);
        m.model("resnet", || panic!("asked again"))
            .finish(Duration::from_millis(1), Outcome::Failure);
        m.model("typo-1", || false)
            .finish(Duration::ZERO, Outcome::Failure);
        m.model("typo-2", || false)
            .finish(Duration::ZERO, Outcome::Failure);
        m.model("resnet", || true)
            .retries
            .fetch_add(1, Ordering::Relaxed);
        m.ejected("w1");
        let text = render_prometheus(&m.families(&["w2".to_string()]));
        for line in [
            "nereid_router_requests_total{model=\"resnet\",outcome=\"success\"} 1",
            "nereid_router_requests_total{model=\"resnet\",outcome=\"failure\"} 1",
            "nereid_router_requests_total{model=\"_other\",outcome=\"failure\"} 2",
            "nereid_router_retries_total{model=\"resnet\"} 1",
            "nereid_router_ejections_total{node=\"w1\"} 1",
            "nereid_router_ejections_total{node=\"w2\"} 0",
            "nereid_router_request_duration_seconds_count{model=\"resnet\"} 2",
            "nereid_router_scale_from_zero_total{model=\"resnet\"} 0",
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
        assert!(!text.contains("typo"), "{text}");
    }

    #[test]
    fn replica_in_flight_lists_ready_replicas_with_their_outstanding_requests() {
        let node = |id: &str| Node {
            id: id.into(),
            addresses: Some(NodeAddresses {
                data_grpc: format!("{id}:8001"),
                ..Default::default()
            }),
            status: NodeStatus::Up as i32,
            ..Default::default()
        };
        let replica = |id: u64, node: &str, state: ReplicaState| Replica {
            id,
            model: "m".into(),
            version: 1,
            node: node.into(),
            state: state as i32,
            ..Default::default()
        };
        let mut table = RoutingTable::default();
        table.apply(&WatchEvent {
            revision: 3,
            event: Some(watch_event::Event::Snapshot(StateSnapshot {
                models: vec![Model {
                    name: "m".into(),
                    ..Default::default()
                }],
                nodes: vec![node("a"), node("b")],
                replicas: vec![
                    replica(1, "a", ReplicaState::Ready),
                    replica(2, "b", ReplicaState::Ready),
                    replica(3, "b", ReplicaState::Unloading),
                ],
            })),
        });
        let outstanding = HashMap::from([(1, 4), (3, 2)]);
        let text = render_prometheus(&[replica_in_flight(&table, &outstanding)]);
        assert!(
            text.contains(
                "nereid_router_replica_in_flight{model=\"m\",version=\"1\",node=\"a\"} 4"
            )
        );
        // Node b: its ready replica is idle, the unloading one still finishes two requests.
        assert!(
            text.contains(
                "nereid_router_replica_in_flight{model=\"m\",version=\"1\",node=\"b\"} 2"
            )
        );
    }
}
