//! What workers report of their load, and the load replica choice weighs: a pure book of
//! reports with no sockets and no clocks of its own.
//!
//! The router's own count of requests outstanding per replica misses the work a worker has
//! from elsewhere: other routers, clients that call the worker directly, and long streams
//! (LLM generations) that hold a replica for seconds. So when the router opens a stream to a
//! worker, it asks for the ORCA report on the model (`endpoint-load-metrics-format: text` and
//! `endpoint-load-metrics-model` in the stream's metadata; the worker answers in its initial
//! metadata, before it reads the request, see `nereid_frontend`'s `orca`):
//!
//! ```text
//! open stream to replica r ─► worker: endpoint-load-metrics: TEXT ...in_flight_requests=N
//!   LoadBook::report(r, N, own requests outstanding on r then, not counting this one, now)
//!     external(r) = N - own            (work r has that this router did not send)
//! choose ─► power of two choices on estimate(r) = own outstanding now + external(r)
//!           (external counts while the report is fresh: `--load-report-ttl-ms`, 2000)
//! ```
//!
//! Why this signal: it costs no extra call (the report rides on the stream the router opens
//! anyway), it is the worker's own figure for the model at that moment, and it covers every
//! source of work. The heartbeat figures the control plane keeps are a heartbeat old and do
//! not reach routers. A report goes stale: a replica that reported a deep queue gets no new
//! streams, so nothing would refresh it; once the report is older than the freshness window
//! the router weighs its own count alone again, sends the replica a stream, and learns its
//! load anew. Unary requests and the gRPC pass-through do not ask (short requests are
//! balanced well by the router's own counts).
//!
//! The latest report per model also answers the router's own ORCA header
//! ([`LoadBook::latest`]): the figures of the worker the router last opened a stream to for
//! that model.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use nereid_proto::ModelLoadReport;

/// How long a worker's report counts by default.
pub const DEFAULT_REPORT_TTL: Duration = Duration::from_secs(2);

/// One replica's last report.
#[derive(Clone, Copy, Debug)]
struct Report {
    /// Requests in flight on the replica's model that this router did not send.
    external: usize,
    at: Instant,
}

/// Workers' reports, per replica and the latest per model.
#[derive(Debug)]
pub struct LoadBook {
    ttl: Duration,
    replicas: HashMap<u64, Report>,
    models: HashMap<String, (ModelLoadReport, Instant)>,
}

impl LoadBook {
    /// A book whose reports count for `ttl`.
    pub fn new(ttl: Duration) -> LoadBook {
        LoadBook {
            ttl,
            replicas: HashMap::new(),
            models: HashMap::new(),
        }
    }

    /// Notes `load`, reported at `now` by `replica` of `model` while this router had `own`
    /// requests outstanding on it (not counting the one whose answer carried the report).
    pub fn report(
        &mut self,
        model: &str,
        replica: u64,
        load: ModelLoadReport,
        own: usize,
        now: Instant,
    ) {
        let in_flight = usize::try_from(load.in_flight_requests).unwrap_or(usize::MAX);
        self.replicas.insert(
            replica,
            Report {
                external: in_flight.saturating_sub(own),
                at: now,
            },
        );
        self.models.insert(model.to_string(), (load, now));
        let ttl = self.ttl;
        self.replicas
            .retain(|_, r| now.saturating_duration_since(r.at) <= ttl);
    }

    /// The load choice weighs for `replica`: `own` (this router's requests outstanding on it)
    /// plus, while its last report is fresh, the work it reported from elsewhere.
    pub fn estimate(&self, replica: u64, own: usize, now: Instant) -> usize {
        match self.replicas.get(&replica) {
            Some(r) if now.saturating_duration_since(r.at) <= self.ttl => {
                own.saturating_add(r.external)
            }
            _ => own,
        }
    }

    /// The latest fresh report on `model`, as its worker gave it.
    pub fn latest(&self, model: &str, now: Instant) -> Option<ModelLoadReport> {
        let (load, at) = self.models.get(model)?;
        (now.saturating_duration_since(*at) <= self.ttl).then_some(*load)
    }
}

/// Reads an ORCA `endpoint-load-metrics` value in the text form
/// (`TEXT named_metrics.pending_requests=2, named_metrics.in_flight_requests=3`); `None`
/// when it is not one or names neither figure.
pub fn parse_text_report(value: &str) -> Option<ModelLoadReport> {
    let rest = value.trim().strip_prefix("TEXT")?;
    let mut load = ModelLoadReport::default();
    let mut found = false;
    for pair in rest.split(',') {
        let Some((key, number)) = pair.trim().split_once('=') else {
            continue;
        };
        let Ok(number) = number.trim().parse::<f64>() else {
            continue;
        };
        // Figures are counts; a fractional or negative one is read as the nearest count.
        let count = number.max(0.0).round() as u64;
        match key.trim() {
            "named_metrics.pending_requests" => load.pending_requests = count,
            "named_metrics.in_flight_requests" => load.in_flight_requests = count,
            _ => continue,
        }
        found = true;
    }
    found.then_some(load)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::choice::power_of_two;
    use crate::random::SplitMix64;
    use crate::table::Endpoint;

    fn load(pending: u64, in_flight: u64) -> ModelLoadReport {
        ModelLoadReport {
            pending_requests: pending,
            in_flight_requests: in_flight,
        }
    }

    fn endpoint(replica: u64) -> Endpoint {
        Endpoint {
            replica,
            version: 1,
            node: "n".into(),
            addr: "a:1".into(),
            http_addr: None,
        }
    }

    #[test]
    fn a_replica_reporting_a_deep_queue_loses_to_an_idle_one_with_equal_own_counts() {
        let now = Instant::now();
        let mut book = LoadBook::new(Duration::from_secs(2));
        // Replica 1 reports 6 requests in flight (4 waiting), none of them this router's.
        book.report("m", 1, load(4, 6), 0, now);
        book.report("m", 2, load(0, 0), 0, now);
        let (a, b) = (endpoint(1), endpoint(2));
        let candidates = [&a, &b];
        // The router's own counts are equal (one each).
        let own = |_: u64| 1;
        let mut rng = SplitMix64::new(11);
        for _ in 0..100 {
            let chosen = power_of_two(&candidates, |r| book.estimate(r, own(r), now), &mut rng);
            assert_eq!(chosen.map(|e| e.replica), Some(2));
        }
        assert_eq!(book.estimate(1, 1, now), 7);
        assert_eq!(book.estimate(2, 1, now), 1);
    }

    #[test]
    fn the_routers_own_requests_are_not_counted_twice() {
        let now = Instant::now();
        let mut book = LoadBook::new(Duration::from_secs(2));
        // The worker's 3 in flight are the router's own 3: nothing from elsewhere.
        book.report("m", 1, load(0, 3), 3, now);
        assert_eq!(book.estimate(1, 4, now), 4);
        // More of the router's own than the worker saw (some not arrived yet): no negative.
        book.report("m", 1, load(0, 1), 3, now);
        assert_eq!(book.estimate(1, 3, now), 3);
    }

    #[test]
    fn a_stale_report_stops_counting_so_the_replica_is_tried_again() {
        let now = Instant::now();
        let mut book = LoadBook::new(Duration::from_secs(2));
        book.report("m", 1, load(9, 10), 0, now);
        assert_eq!(book.estimate(1, 0, now + Duration::from_secs(2)), 10);
        assert_eq!(book.estimate(1, 0, now + Duration::from_secs(3)), 0);
        assert_eq!(
            book.latest("m", now + Duration::from_secs(1)),
            Some(load(9, 10))
        );
        assert_eq!(book.latest("m", now + Duration::from_secs(3)), None);
        assert_eq!(book.latest("other", now), None);
        // A newer report from another replica drops the stale one from the book.
        book.report("m", 2, load(0, 0), 0, now + Duration::from_secs(3));
        assert!(!book.replicas.contains_key(&1));
        assert_eq!(
            book.latest("m", now + Duration::from_secs(3)),
            Some(load(0, 0))
        );
    }

    #[test]
    fn text_reports_parse() {
        assert_eq!(
            parse_text_report(
                "TEXT named_metrics.pending_requests=2, named_metrics.in_flight_requests=3"
            ),
            Some(load(2, 3))
        );
        assert_eq!(
            parse_text_report("TEXT named_metrics.in_flight_requests=7.0, cpu_utilization=0.5"),
            Some(load(0, 7))
        );
        assert_eq!(parse_text_report("TEXT cpu_utilization=0.5"), None);
        assert_eq!(parse_text_report(r#"JSON {"named_metrics":{}}"#), None);
        assert_eq!(parse_text_report(""), None);
    }
}
