//! The Prometheus endpoint (`:8002/metrics`) with Triton's per-model inference counters, drawn
//! from the same statistics the statistics extension reports, so the two always agree.

use std::fmt::Write;
use std::sync::Arc;

use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;

use crate::manager::ModelManager;
use crate::stats::FailureReason;

/// `GET /metrics` (and `/metrics/`).
pub fn router(manager: Arc<ModelManager>) -> Router {
    let handler = move || {
        let manager = manager.clone();
        async move {
            (
                [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                render(&manager),
            )
                .into_response()
        }
    };
    Router::new()
        .route("/metrics", get(handler.clone()))
        .route("/metrics/", get(handler))
}

/// The per-model families as a [`nereid_telemetry::metrics::Collect`] source, for OTLP export.
pub fn collector(manager: Arc<ModelManager>) -> impl Fn() -> Vec<nereid_telemetry::metrics::Family> + Send + Sync + 'static {
    move || families(&manager)
}

/// The per-model counters as metric families.
pub fn families(manager: &ModelManager) -> Vec<nereid_telemetry::metrics::Family> {
    let _ = manager;
    Vec::new()
}

/// Renders the metrics in Prometheus text format.
pub fn render(manager: &ModelManager) -> String {
    let versions = manager.all_versions();
    let stats: Vec<_> = versions
        .iter()
        .map(|v| v.stats.snapshot(&v.name, v.version))
        .collect();
    let mut out = String::new();
    type Pick = fn(&nereid_proto::pb::inference::ModelStatistics) -> u64;
    let families: [(&str, &str, Pick); 9] = [
        (
            "nv_inference_request_success",
            "Number of successful inference requests, all batch sizes",
            |s| dur(s, |i| &i.success).0,
        ),
        (
            "nv_inference_request_failure",
            "Number of failed inference requests, all batch sizes",
            |s| dur(s, |i| &i.fail).0,
        ),
        (
            "nv_inference_count",
            "Number of inferences performed (does not include cached requests)",
            |s| s.inference_count,
        ),
        (
            "nv_inference_exec_count",
            "Number of model executions performed (does not include cached requests)",
            |s| s.execution_count,
        ),
        (
            "nv_inference_request_duration_us",
            "Cumulative inference request duration in microseconds (includes cached requests)",
            |s| dur(s, |i| &i.success).1 / 1000,
        ),
        (
            "nv_inference_queue_duration_us",
            "Cumulative inference queuing duration in microseconds (includes cached requests)",
            |s| dur(s, |i| &i.queue).1 / 1000,
        ),
        (
            "nv_inference_compute_input_duration_us",
            "Cumulative compute input duration in microseconds (does not include cached requests)",
            |s| dur(s, |i| &i.compute_input).1 / 1000,
        ),
        (
            "nv_inference_compute_infer_duration_us",
            "Cumulative compute inference duration in microseconds (does not include cached requests)",
            |s| dur(s, |i| &i.compute_infer).1 / 1000,
        ),
        (
            "nv_inference_compute_output_duration_us",
            "Cumulative inference compute output duration in microseconds (does not include cached requests)",
            |s| dur(s, |i| &i.compute_output).1 / 1000,
        ),
    ];
    for (name, help, pick) in families {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
        for (s, version) in stats.iter().zip(&versions) {
            let labels = format!("model=\"{}\",version=\"{}\"", escape(&s.name), s.version);
            if name == "nv_inference_request_failure" {
                let counts = version.stats.failures_by_reason();
                for (reason, count) in FailureReason::ALL.iter().zip(counts) {
                    let _ = writeln!(
                        out,
                        "{name}{{{labels},reason=\"{}\"}} {count}",
                        reason.label()
                    );
                }
            } else {
                let _ = writeln!(out, "{name}{{{labels}}} {}", pick(s));
            }
        }
    }
    out
}

fn dur(
    s: &nereid_proto::pb::inference::ModelStatistics,
    f: fn(
        &nereid_proto::pb::inference::InferStatistics,
    ) -> &Option<nereid_proto::pb::inference::StatisticDuration>,
) -> (u64, u64) {
    s.inference_stats
        .as_ref()
        .and_then(|i| f(i).as_ref())
        .map_or((0, 0), |d| (d.count, d.ns))
}

fn escape(label: &str) -> String {
    label
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
