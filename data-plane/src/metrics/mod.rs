//! The data plane's metrics: Triton's per-model inference families, drawn from the same
//! statistics the statistics extension reports (so the two always agree), plus the host and
//! GPU families of [`crate::system_metrics`] and the families models define
//! ([`crate::custom_metrics`]).
//!
//! ```text
//! VersionStats (per loaded version) ──┐
//! SystemMetrics (latest sample) ──────┤
//! CustomMetrics (models' families) ───┼─► DataPlaneMetrics::collect ─► Vec<Family>
//! MetricsConfig (which families) ─────┘        ├─► prometheus_router ─► GET :8002/metrics
//!                                              └─► OTLP export (the lead's exporter)
//! ```
//!
//! Every per-model series carries `model` and `version` labels (with `namespace` between them
//! under `--model-namespacing`, as in Triton; after one `_<key>` label per
//! `metric_tags` entry of the model's config, as in Triton); failures add `reason`. A model's
//! `model_metrics` may set the bucket bounds of its `nv_inference_first_response_histogram_ms`
//! (its statistics count into them, `VersionStats::with_first_response_buckets`). With a
//! response cache (`--cache-config`), Triton's `nv_cache_*` families: per model for versions
//! that use it, and the cache's own gauges.

pub mod config;

use std::sync::Arc;

use nereid_proto::pb::inference::{InferStatistics, ModelStatistics, StatisticDuration};
use nereid_telemetry::{Collect, Family, Kind, Labels, Value};

pub use self::config::{LatencyMetrics, MetricsConfig, MetricsConfigError};
use crate::custom_metrics::CustomMetrics;
use crate::manager::ModelManager;
use crate::request::LoadedVersion;
use crate::request::cache::ResponseCache;
use crate::stats::{FailureReason, Latency, window};
use crate::system_metrics::SystemMetrics;

/// Collects the data plane's metric families on demand (a scrape, an export tick).
pub struct DataPlaneMetrics {
    manager: Arc<ModelManager>,
    latencies: LatencyMetrics,
    /// `None` when neither CPU nor GPU metrics are reported.
    system: Option<Arc<SystemMetrics>>,
    /// The families models define (Python `pb_utils.MetricFamily`).
    custom: Option<Arc<CustomMetrics>>,
}

impl DataPlaneMetrics {
    pub fn new(
        manager: Arc<ModelManager>,
        latencies: LatencyMetrics,
        system: Option<Arc<SystemMetrics>>,
    ) -> DataPlaneMetrics {
        DataPlaneMetrics {
            manager,
            latencies,
            system,
            custom: None,
        }
    }

    /// Also reports the families models define in `custom`.
    pub fn with_custom_metrics(mut self, custom: Arc<CustomMetrics>) -> DataPlaneMetrics {
        self.custom = Some(custom);
        self
    }

    /// `GET /metrics` (and `/metrics/`) serving these metrics in Prometheus text.
    pub fn router(self: Arc<Self>) -> axum::Router {
        nereid_telemetry::prometheus_router(self)
    }
}

impl Collect for DataPlaneMetrics {
    fn collect(&self) -> Vec<Family> {
        let mut families =
            namespaced_model_families(&self.manager.all_versions_by_namespace(), &self.latencies);
        if let Some(cache) = self.manager.response_cache() {
            families.extend(cache_families(cache));
        }
        if let Some(system) = &self.system {
            families.extend(system.families());
        }
        if let Some(custom) = &self.custom {
            custom.merge_into(&mut families);
        }
        families
    }
}

/// One version's statistics as the families need them.
struct Row<'a> {
    version: &'a LoadedVersion,
    stats: ModelStatistics,
    labels: Labels,
}

type Pick = fn(&Row<'_>) -> Option<f64>;

/// A version's labels: one `_<key>` per `metric_tags` entry of its config (sorted, as Triton
/// writes them), then `model`, `namespace` (with `--model-namespacing`) and `version`.
fn model_labels(v: &LoadedVersion, namespace: Option<&str>) -> Labels {
    let mut tags: Vec<(&String, &String)> = v.config.wire().metric_tags.iter().collect();
    tags.sort();
    let mut labels = Labels::none();
    for (key, value) in tags {
        labels = labels.and(&format!("_{key}"), value.as_str());
    }
    labels = labels.and("model", v.name.as_str());
    if let Some(namespace) = namespace {
        labels = labels.and("namespace", namespace);
    }
    labels.and("version", v.version.to_string())
}

/// The per-model families over `versions`, each with its namespace (`--model-namespacing`:
/// the `namespace` label), as `latencies` selects them.
pub fn namespaced_model_families(
    versions: &[(Option<String>, Arc<LoadedVersion>)],
    latencies: &LatencyMetrics,
) -> Vec<Family> {
    let rows: Vec<Row<'_>> = versions
        .iter()
        .map(|(namespace, v)| Row {
            version: v,
            stats: v.stats.snapshot(&v.name, v.version),
            labels: model_labels(v, namespace.as_deref()),
        })
        .collect();
    let mut out = Vec::new();
    let mut failure = Family::counter(
        "nv_inference_request_failure",
        "Number of failed inference requests, all batch sizes",
    );
    for row in &rows {
        let counts = row.version.stats.failures_by_reason();
        for (reason, count) in FailureReason::ALL.iter().zip(counts) {
            failure.number(
                row.labels.clone().and("reason", reason.label()),
                count as f64,
            );
        }
    }
    let counters: [(&str, &str, Kind, Pick); 4] = [
        (
            "nv_inference_request_success",
            "Number of successful inference requests, all batch sizes",
            Kind::Counter,
            |r| Some(duration(&r.stats, |i| &i.success).count as f64),
        ),
        (
            "nv_inference_count",
            "Number of inferences performed (does not include cached requests)",
            Kind::Counter,
            |r| Some(r.stats.inference_count as f64),
        ),
        (
            "nv_inference_exec_count",
            "Number of model executions performed (does not include cached requests)",
            Kind::Counter,
            |r| Some(r.stats.execution_count as f64),
        ),
        (
            "nv_inference_pending_request_count",
            "Instantaneous number of pending requests awaiting execution per-model.",
            Kind::Gauge,
            |r| Some(r.version.stats.pending_count() as f64),
        ),
    ];
    let (first, rest) = counters.split_at(1);
    push(&mut out, &rows, first);
    out.push(failure);
    push(&mut out, &rows, rest);
    if latencies.counter {
        push(&mut out, &rows, &DURATION_COUNTERS);
    }
    if latencies.summary {
        out.extend(summaries(&rows, &latencies.quantiles));
    }
    if latencies.histogram {
        let mut h = Family::new(
            "nv_inference_first_response_histogram_ms",
            "Duration from request to first response in milliseconds",
            Kind::Histogram,
        );
        for row in &rows {
            let v = row.version.stats.first_response_histogram();
            h.sample(
                row.labels.clone(),
                Value::Histogram {
                    buckets: v.buckets,
                    sum: v.sum,
                    count: v.count,
                },
            );
        }
        out.push(h);
    }
    push(&mut out, &rows, &LOAD_GAUGES);
    push(&mut out, &rows, &CACHE_COUNTERS);
    out
}

/// Triton's per-model response cache counters, for versions that use the cache.
const CACHE_COUNTERS: [(&str, &str, Kind, Pick); 4] = [
    (
        "nv_cache_num_hits_per_model",
        "Number of cache hits per model",
        Kind::Counter,
        |r| cached(r, |i| &i.cache_hit).map(|d| d.count as f64),
    ),
    (
        "nv_cache_num_misses_per_model",
        "Number of cache misses per model",
        Kind::Counter,
        |r| cached(r, |i| &i.cache_miss).map(|d| d.count as f64),
    ),
    (
        "nv_cache_hit_duration_per_model",
        "Total cache hit duration per model, in microseconds",
        Kind::Counter,
        |r| cached(r, |i| &i.cache_hit).map(micros),
    ),
    (
        "nv_cache_miss_duration_per_model",
        "Total cache miss (insert + lookup) duration per model, in microseconds",
        Kind::Counter,
        |r| cached(r, |i| &i.cache_miss).map(micros),
    ),
];

/// A cache statistic of a version that uses the response cache.
fn cached(
    r: &Row<'_>,
    f: fn(&InferStatistics) -> &Option<StatisticDuration>,
) -> Option<StatisticDuration> {
    r.version.cache.as_ref().map(|_| duration(&r.stats, f))
}

/// The response cache's own gauges (Triton's local cache reports these, without labels).
pub fn cache_families(cache: &ResponseCache) -> Vec<Family> {
    let c = cache.counters();
    let gauges: [(&str, &str, f64); 8] = [
        (
            "nv_cache_num_entries",
            "Number of responses stored in response cache",
            c.entries as f64,
        ),
        (
            "nv_cache_num_lookups",
            "Number of cache lookups in response cache",
            c.lookups as f64,
        ),
        (
            "nv_cache_num_hits",
            "Number of cache hits in response cache",
            c.hits as f64,
        ),
        (
            "nv_cache_num_misses",
            "Number of cache misses in response cache",
            c.misses as f64,
        ),
        (
            "nv_cache_num_evictions",
            "Number of cache evictions in response cache",
            c.evictions as f64,
        ),
        (
            "nv_cache_util",
            "Cache utilization [0.0 - 1.0]",
            c.utilization,
        ),
        (
            "nv_cache_lookup_duration",
            "Total cache lookup duration (hit and miss), in microseconds",
            c.lookup_time.as_micros() as f64,
        ),
        (
            "nv_cache_insertion_duration",
            "Total cache insertion duration, in microseconds",
            c.insertion_time.as_micros() as f64,
        ),
    ];
    gauges
        .into_iter()
        .map(|(name, help, value)| {
            let mut family = Family::new(name, help, Kind::Gauge);
            family.number(Labels::default(), value);
            family
        })
        .collect()
}

/// The cumulative latency counters (`counter_latencies`), in microseconds.
const DURATION_COUNTERS: [(&str, &str, Kind, Pick); 5] = [
    (
        "nv_inference_request_duration_us",
        "Cumulative inference request duration in microseconds (includes cached requests)",
        Kind::Counter,
        |r| Some(micros(duration(&r.stats, |i| &i.success))),
    ),
    (
        "nv_inference_queue_duration_us",
        "Cumulative inference queuing duration in microseconds (includes cached requests)",
        Kind::Counter,
        |r| Some(micros(duration(&r.stats, |i| &i.queue))),
    ),
    (
        "nv_inference_compute_input_duration_us",
        "Cumulative compute input duration in microseconds (does not include cached requests)",
        Kind::Counter,
        |r| Some(micros(duration(&r.stats, |i| &i.compute_input))),
    ),
    (
        "nv_inference_compute_infer_duration_us",
        "Cumulative compute inference duration in microseconds (does not include cached requests)",
        Kind::Counter,
        |r| Some(micros(duration(&r.stats, |i| &i.compute_infer))),
    ),
    (
        "nv_inference_compute_output_duration_us",
        "Cumulative inference compute output duration in microseconds (does not include cached requests)",
        Kind::Counter,
        |r| Some(micros(duration(&r.stats, |i| &i.compute_output))),
    ),
];

/// What loading each version cost (absent for ensembles, which load no instances).
const LOAD_GAUGES: [(&str, &str, Kind, Pick); 2] = [
    (
        "nv_model_load_duration_secs",
        "Model load time in seconds",
        Kind::Gauge,
        |r| r.version.stats.load().map(|l| l.duration.as_secs_f64()),
    ),
    (
        "nereid_model_memory_bytes",
        "Memory the model version holds: C heap its load kept, or its Python stubs' anonymous memory, in bytes",
        Kind::Gauge,
        |r| r.version.stats.load().map(|l| l.memory_bytes as f64),
    ),
];

fn push(out: &mut Vec<Family>, rows: &[Row<'_>], specs: &[(&str, &str, Kind, Pick)]) {
    for (name, help, kind, pick) in specs {
        let mut family = Family::new(*name, *help, *kind);
        for row in rows {
            if let Some(v) = pick(row) {
                family.number(row.labels.clone(), v);
            }
        }
        out.push(family);
    }
}

/// The summaries (`summary_latencies`): quantiles over recent requests; `_sum` and `_count`
/// are the cumulative counters', so they agree with `*_duration_us` and the statistics.
fn summaries(rows: &[Row<'_>], quantiles: &[(f64, f64)]) -> Vec<Family> {
    type Of = fn(&InferStatistics) -> &Option<StatisticDuration>;
    let specs: [(&str, &str, Latency, Of); 5] = [
        (
            "nv_inference_request_summary_us",
            "Summary of inference request duration in microseconds (includes cached requests)",
            Latency::Request,
            |i| &i.success,
        ),
        (
            "nv_inference_queue_summary_us",
            "Summary of inference queuing duration in microseconds (includes cached requests)",
            Latency::Queue,
            |i| &i.queue,
        ),
        (
            "nv_inference_compute_input_summary_us",
            "Summary of compute input duration in microseconds (does not include cached requests)",
            Latency::ComputeInput,
            |i| &i.compute_input,
        ),
        (
            "nv_inference_compute_infer_summary_us",
            "Summary of compute inference duration in microseconds (does not include cached requests)",
            Latency::ComputeInfer,
            |i| &i.compute_infer,
        ),
        (
            "nv_inference_compute_output_summary_us",
            "Summary of inference compute output duration in microseconds (does not include cached requests)",
            Latency::ComputeOutput,
            |i| &i.compute_output,
        ),
    ];
    let qs: Vec<f64> = quantiles.iter().map(|(q, _)| *q).collect();
    specs
        .iter()
        .map(|(name, help, latency, of)| {
            let mut family = Family::new(*name, *help, Kind::Summary);
            for row in rows {
                let total = duration(&row.stats, *of);
                let recent = row.version.stats.recent(*latency);
                family.sample(
                    row.labels.clone(),
                    Value::Summary {
                        quantiles: window::quantiles(recent, &qs),
                        sum: micros(total),
                        count: total.count,
                    },
                );
            }
            family
        })
        .collect()
}

fn duration(
    s: &ModelStatistics,
    f: fn(&InferStatistics) -> &Option<StatisticDuration>,
) -> StatisticDuration {
    s.inference_stats
        .as_ref()
        .and_then(|i| *f(i))
        .unwrap_or_default()
}

/// Whole microseconds of a cumulative duration, as Triton's `*_us` counters report them.
fn micros(d: StatisticDuration) -> f64 {
    (d.ns / 1000) as f64
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use nereid_proto::pb::inference::ModelConfig;
    use nereid_telemetry::render_prometheus;

    use super::*;
    use crate::config::ValidModelConfig;
    use crate::request::Runner;
    use crate::scheduler::Scheduler;
    use crate::scheduler::policy::BatchPolicy;
    use crate::stats::{LoadReport, RequestTimings, VersionStats};

    /// The families of versions without namespaces.
    fn model_families(versions: &[Arc<LoadedVersion>], latencies: &LatencyMetrics) -> Vec<Family> {
        let versions: Vec<(Option<String>, Arc<LoadedVersion>)> =
            versions.iter().map(|v| (None, v.clone())).collect();
        namespaced_model_families(&versions, latencies)
    }

    /// A version with no instances (nothing executes), whose statistics the test fills.
    fn version(name: &str) -> Arc<LoadedVersion> {
        version_with(name, ModelConfig::default())
    }

    fn version_with(name: &str, wire: ModelConfig) -> Arc<LoadedVersion> {
        let config = Arc::new(ValidModelConfig::unchecked(wire));
        let stats = Arc::new(VersionStats::with_first_response_buckets(
            config.metrics.first_response_buckets.as_deref(),
        ));
        let scheduler = Scheduler::start(
            name,
            BatchPolicy::from_config(&config),
            Vec::new(),
            Vec::new(),
            stats.clone(),
            4,
        )
        .unwrap();
        LoadedVersion::for_test(name, config, Runner::Batched(scheduler), stats)
    }

    fn filled() -> Arc<LoadedVersion> {
        let v = version("m");
        let t = RequestTimings {
            total: Duration::from_micros(1500),
            queue: Duration::from_micros(500),
            ..Default::default()
        };
        v.stats
            .record_execution(2, Duration::ZERO, Duration::ZERO, Duration::ZERO);
        v.stats.record_success(t);
        v.stats.record_success(t);
        v.stats
            .record_failure(Duration::from_micros(1), FailureReason::Backend);
        v.stats.set_load(LoadReport {
            duration: Duration::from_millis(250),
            memory_bytes: 4096,
        });
        v
    }

    #[test]
    fn metric_tags_become_labels_before_model_and_version() {
        let mut wire = ModelConfig::default();
        wire.metric_tags.insert("team".into(), "vision".into());
        wire.metric_tags.insert("cost_center".into(), "42".into());
        let v = version_with("t", wire);
        let text = render_prometheus(&model_families(&[v], &LatencyMetrics::default()));
        let line = "nv_inference_request_success{_cost_center=\"42\",_team=\"vision\",model=\"t\",version=\"1\"} 0\n";
        assert!(text.contains(line), "missing {line:?} in\n{text}");
        assert!(text.contains(
            "nv_inference_request_failure{_cost_center=\"42\",_team=\"vision\",model=\"t\",version=\"1\",reason=\"BACKEND\"} 0\n"
        ));
    }

    #[test]
    fn model_metrics_buckets_replace_the_histogram_defaults() {
        let wire = nereid_proto::parse_model_config(
            r#"name: "h"
               model_metrics { metric_control: [ {
                 metric_identifier: { family: "nv_inference_first_response_histogram_ms" }
                 histogram_options: { buckets: [ -1, 0.0, 1, 2.5 ] } } ] }"#,
        )
        .unwrap();
        let v = version_with("h", wire);
        v.stats.record_success(RequestTimings {
            total: Duration::from_micros(1500),
            ..Default::default()
        });
        let latencies = LatencyMetrics {
            histogram: true,
            ..Default::default()
        };
        let text = render_prometheus(&model_families(&[v, filled()], &latencies));
        let h = "nv_inference_first_response_histogram_ms_bucket";
        for line in [
            format!("{h}{{model=\"h\",version=\"1\",le=\"-1\"}} 0\n"),
            format!("{h}{{model=\"h\",version=\"1\",le=\"0\"}} 0\n"),
            format!("{h}{{model=\"h\",version=\"1\",le=\"1\"}} 0\n"),
            format!("{h}{{model=\"h\",version=\"1\",le=\"2.5\"}} 1\n"),
            format!("{h}{{model=\"h\",version=\"1\",le=\"+Inf\"}} 1\n"),
            // Another model keeps Triton's defaults.
            format!("{h}{{model=\"m\",version=\"1\",le=\"5000\"}} 2\n"),
        ] {
            assert!(text.contains(&line), "missing {line:?} in\n{text}");
        }
        assert!(
            !text.contains("model=\"h\",version=\"1\",le=\"100\""),
            "{text}"
        );
    }

    #[test]
    fn a_namespace_is_a_label_between_model_and_version() {
        let versions = [
            (Some("/r/addsub_repo".to_string()), version("m")),
            (Some("/r/subadd_repo".to_string()), version("m")),
        ];
        let text = render_prometheus(&namespaced_model_families(
            &versions,
            &LatencyMetrics::default(),
        ));
        for ns in ["/r/addsub_repo", "/r/subadd_repo"] {
            let line = format!(
                "nv_inference_request_success{{model=\"m\",namespace=\"{ns}\",version=\"1\"}} 0\n"
            );
            assert!(text.contains(&line), "missing {line:?} in\n{text}");
        }
    }

    #[test]
    fn default_families_with_triton_names_and_labels() {
        let text = render_prometheus(&model_families(&[filled()], &LatencyMetrics::default()));
        for line in [
            "nv_inference_request_success{model=\"m\",version=\"1\"} 2\n",
            "nv_inference_request_failure{model=\"m\",version=\"1\",reason=\"BACKEND\"} 1\n",
            "nv_inference_request_failure{model=\"m\",version=\"1\",reason=\"REJECTED\"} 0\n",
            "nv_inference_count{model=\"m\",version=\"1\"} 2\n",
            "nv_inference_exec_count{model=\"m\",version=\"1\"} 1\n",
            "nv_inference_pending_request_count{model=\"m\",version=\"1\"} 0\n",
            "# TYPE nv_inference_pending_request_count gauge\n",
            "nv_inference_request_duration_us{model=\"m\",version=\"1\"} 3000\n",
            "nv_inference_queue_duration_us{model=\"m\",version=\"1\"} 1000\n",
            "nv_model_load_duration_secs{model=\"m\",version=\"1\"} 0.25\n",
            "nereid_model_memory_bytes{model=\"m\",version=\"1\"} 4096\n",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
        assert!(!text.contains("_summary_us"));
        assert!(!text.contains("_histogram_ms"));
    }

    #[test]
    fn latency_config_switches_families() {
        let latencies = LatencyMetrics {
            counter: false,
            summary: true,
            quantiles: vec![(0.5, 0.05), (0.9, 0.01)],
            histogram: true,
        };
        let text = render_prometheus(&model_families(&[filled()], &latencies));
        assert!(!text.contains("_duration_us"), "{text}");
        for line in [
            "nv_inference_request_summary_us{model=\"m\",version=\"1\",quantile=\"0.5\"} 1500\n",
            "nv_inference_request_summary_us{model=\"m\",version=\"1\",quantile=\"0.9\"} 1500\n",
            "nv_inference_request_summary_us_sum{model=\"m\",version=\"1\"} 3000\n",
            "nv_inference_request_summary_us_count{model=\"m\",version=\"1\"} 2\n",
            "nv_inference_queue_summary_us_sum{model=\"m\",version=\"1\"} 1000\n",
            "nv_inference_compute_output_summary_us_count{model=\"m\",version=\"1\"} 2\n",
            "nv_inference_first_response_histogram_ms_bucket{model=\"m\",version=\"1\",le=\"100\"} 2\n",
            "nv_inference_first_response_histogram_ms_count{model=\"m\",version=\"1\"} 2\n",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
        assert!(!text.contains("quantile=\"0.99\""));
    }
}
