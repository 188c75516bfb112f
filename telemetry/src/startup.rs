//! A process's telemetry from its flags: `--trace-config` (Triton's vocabulary), the OTLP
//! metric export flags and the standard `OTEL_*` environment variables, then the running
//! pieces ([`Telemetry`]) and their shutdown.
//!
//! ```text
//! --trace-config level=TIMESTAMPS            global trace settings (level ×N, rate, count, mode)
//! --trace-config mode=triton|opentelemetry   Triton's JSON trace files (Triton's default) or OTLP;
//!                                            without `mode`, an `opentelemetry,` item picks OTLP
//! --trace-config opentelemetry,url=URL       span endpoint (default http://localhost:4318/v1/traces)
//! --trace-config opentelemetry,protocol=grpc  Nereid extension: OTLP/gRPC instead of HTTP
//! --trace-config opentelemetry,resource=k=v  resource attributes (×N; service.name among them)
//! --trace-config opentelemetry,bsp_max_queue_size=N | bsp_schedule_delay=MS | bsp_max_export_batch_size=N
//! --trace-config triton,file=F | triton,log-frequency=N   the trace file; a new F.<n> every N traces
//! env: OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT, OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL,
//!      OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES       (flags win over the environment)
//! ```

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use crate::logging::LogControl;
use crate::metrics::Collect;
use crate::otlp::{Batching, Endpoint, Protocol, ResourceAttributes, SpanExporter};
use crate::trace_config::{Settings, TraceMode, TraceSettingsStore, parse_levels};
use crate::tracer::{SpanSink, Tracer};
use crate::triton_file::TraceFile;
use crate::triton_trace::TritonSink;

/// Default OTLP/HTTP span endpoint, as Triton's.
pub const DEFAULT_TRACES_URL: &str = "http://localhost:4318/v1/traces";

/// Everything a process's telemetry needs, parsed and validated.
#[derive(Clone, Debug, PartialEq)]
pub struct TelemetryConfig {
    /// Triton's trace settings from `--trace-config` (level, rate, count, mode, and the
    /// `triton` mode's file and log-frequency): the global settings the trace setting API
    /// starts from.
    pub trace: Settings,
    /// Where OpenTelemetry-mode spans go: `opentelemetry,url`/`protocol`, else the `OTEL_*`
    /// traces or generic endpoint, else Triton's `http://localhost:4318/v1/traces`.
    pub spans: Endpoint,
    /// The span exporter's queue, batch size and delay (`opentelemetry,bsp_*`).
    pub batching: Batching,
    /// The OTLP resource attributes, `service.name` first: `opentelemetry,resource` items over
    /// `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES`, `service.name` defaulting to the
    /// process's name.
    pub resource: ResourceAttributes,
    /// OTLP metric export: endpoint and interval; `None` when not asked for.
    pub metrics: Option<(Endpoint, Duration)>,
}

impl Default for TelemetryConfig {
    /// Tracing off, Triton's default span endpoint, no metric export, no environment.
    fn default() -> TelemetryConfig {
        TelemetryConfig::parse(&[], &MetricsExportFlags::default(), "nereid", |_| None)
            .unwrap_or_else(|e| unreachable!("the defaults parse: {e}"))
    }
}

/// The OTLP metric export flags, as the binary parsed them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MetricsExportFlags {
    /// The OTLP metrics endpoint (`--otlp-metrics-endpoint`); `None`: no metric export.
    pub endpoint: Option<String>,
    /// `grpc` or `http/protobuf` (`--otlp-metrics-protocol`); `None`: HTTP/protobuf.
    pub protocol: Option<String>,
    /// Milliseconds between exports (`--otlp-metrics-interval-ms`); `None`: 60000.
    pub interval_ms: Option<u64>,
}

impl TelemetryConfig {
    /// Parses `--trace-config` items and the metric export flags; `env` reads the environment
    /// (a closure, so tests pass their own). `service` is the default `service.name`.
    pub fn parse(
        trace_config: &[String],
        metrics: &MetricsExportFlags,
        service: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<TelemetryConfig, String> {
        let mut trace = Settings::default();
        let mut levels: Vec<String> = Vec::new();
        let mut url = None;
        let mut protocol = None;
        let mut resource: Vec<(String, String)> = Vec::new();
        let mut batching = Batching::default();
        let mut mode = None;
        for item in trace_config {
            let bad = |what: String| format!("--trace-config '{item}': {what}");
            let (section, setting) = match item.split_once(',') {
                Some((section, rest)) if !section.contains('=') => (Some(section), rest),
                _ => (None, item.as_str()),
            };
            let (key, value) = setting
                .split_once('=')
                .ok_or_else(|| bad("expected [<mode>,]<key>=<value>".into()))?;
            let number = |min: i64| -> Result<i64, String> {
                value
                    .trim()
                    .parse::<i64>()
                    .ok()
                    .filter(|n| *n >= min)
                    .ok_or_else(|| bad(format!("'{key}' must be an integer ≥ {min}")))
            };
            match (section, key) {
                (None, "level") => levels.push(value.to_string()),
                (None, "rate") => trace.rate = number(1)? as u64,
                (None, "count") => trace.count = number(-1)?,
                (None, "mode") => {
                    mode = Some(match value {
                        "opentelemetry" => TraceMode::OpenTelemetry,
                        "triton" => TraceMode::Triton,
                        other => {
                            return Err(bad(format!(
                                "unknown trace mode '{other}'; expected triton or opentelemetry"
                            )));
                        }
                    })
                }
                (Some("triton"), "file") => trace.file = value.to_string(),
                (Some("triton"), "log-frequency") => trace.log_frequency = number(0)? as u64,
                (Some("opentelemetry"), "url") => url = Some(value.to_string()),
                (Some("opentelemetry"), "protocol") => {
                    protocol = Some(Protocol::parse(value).ok_or_else(|| {
                        bad(format!(
                            "protocol must be 'grpc' or 'http/protobuf', got '{value}'"
                        ))
                    })?)
                }
                (Some("opentelemetry"), "resource") => {
                    let (k, v) = value
                        .split_once('=')
                        .ok_or_else(|| bad("resource must be <key>=<value>".into()))?;
                    resource.push((k.to_string(), v.to_string()));
                }
                (Some("opentelemetry"), "bsp_max_queue_size") => {
                    batching.max_queue = number(1)? as usize
                }
                (Some("opentelemetry"), "bsp_max_export_batch_size") => {
                    batching.max_batch = number(1)? as usize
                }
                (Some("opentelemetry"), "bsp_schedule_delay") => {
                    batching.delay = Duration::from_millis(number(1)? as u64)
                }
                (Some(section @ ("triton" | "opentelemetry")), key) => {
                    return Err(bad(format!("unknown {section} trace setting '{key}'")));
                }
                (Some(section), _) => return Err(bad(format!("unknown trace mode '{section}'"))),
                (None, key) => {
                    return Err(bad(format!(
                        "unknown trace setting '{key}'; expected level, rate, count or mode"
                    )));
                }
            }
        }
        if !levels.is_empty() {
            trace.level = parse_levels(&levels).map_err(|e| format!("--trace-config: {e}"))?;
        }
        // Triton's default mode, unless the items configure only OpenTelemetry.
        let otel_items = trace_config
            .iter()
            .any(|item| item.starts_with("opentelemetry,"));
        trace.mode = mode.unwrap_or(if otel_items {
            TraceMode::OpenTelemetry
        } else {
            TraceMode::Triton
        });
        let spans = endpoint(
            url,
            protocol,
            &env,
            "TRACES",
            "/v1/traces",
            DEFAULT_TRACES_URL,
        )?;
        let metrics = match &metrics.endpoint {
            None => None,
            Some(url) => {
                let protocol = match &metrics.protocol {
                    None => Protocol::HttpProtobuf,
                    Some(p) => Protocol::parse(p).ok_or_else(|| {
                        format!(
                            "--otlp-metrics-protocol must be 'grpc' or 'http/protobuf', got '{p}'"
                        )
                    })?,
                };
                let interval = metrics.interval_ms.unwrap_or(60_000);
                if interval == 0 {
                    return Err("--otlp-metrics-interval-ms must be at least 1".into());
                }
                Some((
                    Endpoint {
                        url: url.clone(),
                        protocol,
                    },
                    Duration::from_millis(interval),
                ))
            }
        };
        let mut attributes = Vec::new();
        if let Some(env_attrs) = env("OTEL_RESOURCE_ATTRIBUTES") {
            for pair in env_attrs.split(',').filter(|p| !p.trim().is_empty()) {
                let (k, v) = pair.split_once('=').ok_or_else(|| {
                    format!("OTEL_RESOURCE_ATTRIBUTES: '{pair}' is not key=value")
                })?;
                attributes.push((k.trim().to_string(), v.trim().to_string()));
            }
        }
        attributes.extend(resource);
        if let Some(name) = env("OTEL_SERVICE_NAME") {
            attributes.push(("service.name".into(), name));
        }
        // Later entries win: flags over OTEL_RESOURCE_ATTRIBUTES; service.name goes first.
        let mut merged: Vec<(String, String)> = Vec::new();
        for (k, v) in attributes {
            merged.retain(|(key, _)| *key != k);
            merged.push((k, v));
        }
        if !merged.iter().any(|(k, _)| k == "service.name") {
            merged.push(("service.name".into(), service.to_string()));
        }
        merged.sort_by_key(|(k, _)| k != "service.name");
        Ok(TelemetryConfig {
            trace,
            spans,
            batching,
            resource: ResourceAttributes(merged),
            metrics,
        })
    }
}

/// The span endpoint: the flag, else `OTEL_EXPORTER_OTLP_TRACES_*`, else the generic
/// `OTEL_EXPORTER_OTLP_*` (with `/v1/traces` appended for HTTP, as OTel specifies), else the
/// default.
fn endpoint(
    flag_url: Option<String>,
    flag_protocol: Option<Protocol>,
    env: &impl Fn(&str) -> Option<String>,
    signal: &str,
    path: &str,
    default: &str,
) -> Result<Endpoint, String> {
    let env_protocol = |name: &str| -> Result<Option<Protocol>, String> {
        env(name)
            .map(|p| {
                Protocol::parse(&p)
                    .ok_or_else(|| format!("{name} must be 'grpc' or 'http/protobuf', got '{p}'"))
            })
            .transpose()
    };
    let protocol = match flag_protocol {
        Some(p) => p,
        None => env_protocol(&format!("OTEL_EXPORTER_OTLP_{signal}_PROTOCOL"))?
            .or(env_protocol("OTEL_EXPORTER_OTLP_PROTOCOL")?)
            .unwrap_or(Protocol::HttpProtobuf),
    };
    let url = match flag_url {
        Some(url) => url,
        None => match env(&format!("OTEL_EXPORTER_OTLP_{signal}_ENDPOINT")) {
            Some(url) => url,
            None => match env("OTEL_EXPORTER_OTLP_ENDPOINT") {
                Some(base) if protocol == Protocol::HttpProtobuf => {
                    format!("{}{path}", base.trim_end_matches('/'))
                }
                Some(base) => base,
                None => default.to_string(),
            },
        },
    };
    Ok(Endpoint { url, protocol })
}

/// A process's running telemetry: the tracer, log control, and the exporter tasks.
pub struct Telemetry {
    /// Starts a request's trace when the trace settings sample it; hand a clone to each
    /// request path.
    pub tracer: Tracer,
    /// The log settings as `/v2/logging` reads and changes them.
    pub logs: Arc<LogControl>,
    /// The OTLP span exporter and its task (OpenTelemetry mode).
    spans: Option<(Arc<SpanExporter>, JoinHandle<()>)>,
    /// The trace file writer (Triton's mode).
    triton: Option<Arc<TritonSink>>,
    metrics_stop: Option<tokio::sync::oneshot::Sender<()>>,
    metrics_task: Option<JoinHandle<()>>,
}

impl Telemetry {
    /// Starts the exporters (on the current tokio runtime). `metrics` is what OTLP metric
    /// export pushes, when configured.
    pub fn start(
        config: &TelemetryConfig,
        logs: Arc<LogControl>,
        metrics: Option<Arc<dyn Collect>>,
    ) -> Result<Telemetry, String> {
        let settings = Arc::new(TraceSettingsStore::new(config.trace.clone()));
        let (tracer, spans, triton) = match config.trace.mode {
            TraceMode::OpenTelemetry => {
                let (spans, span_task) =
                    SpanExporter::start(&config.spans, &config.resource, config.batching)?;
                let sink: Arc<dyn SpanSink> = spans.clone();
                let tracer = Tracer::new(settings, Some(sink));
                (tracer, Some((spans, span_task)), None)
            }
            TraceMode::Triton => {
                // Without a file Triton takes traces and writes them nowhere; so does Nereid.
                let file = match config.trace.file.as_str() {
                    "" => None,
                    path => Some(TraceFile::start(path)?),
                };
                let sink = Arc::new(TritonSink::new(settings.clone(), file));
                (Tracer::triton(settings, sink.clone()), None, Some(sink))
            }
        };
        let mut telemetry = Telemetry {
            tracer,
            logs,
            spans,
            triton,
            metrics_stop: None,
            metrics_task: None,
        };
        if let Some(source) = metrics {
            telemetry.export_metrics(config, source)?;
        }
        Ok(telemetry)
    }

    /// Starts pushing `source` over OTLP when the config asks for metric export (for a
    /// process whose metric source exists only after [`Telemetry::start`]).
    pub fn export_metrics(
        &mut self,
        config: &TelemetryConfig,
        source: Arc<dyn Collect>,
    ) -> Result<(), String> {
        let Some((endpoint, interval)) = &config.metrics else {
            return Ok(());
        };
        if self.metrics_task.is_some() {
            return Err("OTLP metric export is already running".into());
        }
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = crate::otlp::start_metrics_exporter(
            endpoint,
            &config.resource,
            source,
            *interval,
            async {
                let _ = rx.await;
            },
        )?;
        self.metrics_stop = Some(tx);
        self.metrics_task = Some(task);
        Ok(())
    }

    /// Flushes queued spans (or writes the trace file's rest) and a last metric export,
    /// waiting at most `deadline`.
    pub async fn shutdown(self, deadline: Duration) {
        let span_task = self.spans.map(|(spans, task)| {
            spans.shutdown();
            task
        });
        if let Some(stop) = self.metrics_stop {
            let _ = stop.send(());
        }
        let triton = self.triton;
        let wait = async {
            if let Some(task) = span_task {
                let _ = task.await;
            }
            if let Some(sink) = &triton {
                sink.close().await;
            }
            if let Some(task) = self.metrics_task {
                let _ = task.await;
            }
        };
        if tokio::time::timeout(deadline, wait).await.is_err() {
            tracing::warn!("telemetry export did not finish before the exit deadline");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace_config::TraceLevel;

    fn parse(items: &[&str], env: &[(&str, &str)]) -> Result<TelemetryConfig, String> {
        let items: Vec<String> = items.iter().map(|s| s.to_string()).collect();
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        TelemetryConfig::parse(&items, &Default::default(), "nereid", move |k| {
            env.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone())
        })
    }

    #[test]
    fn triton_vocabulary_and_defaults() {
        let c = parse(&[], &[]).unwrap();
        assert!(c.trace.level.is_empty());
        assert_eq!(c.spans.url, DEFAULT_TRACES_URL);
        assert_eq!(c.spans.protocol, Protocol::HttpProtobuf);
        assert_eq!(
            c.resource.0,
            [("service.name".to_string(), "nereid".to_string())]
        );
        let c = parse(
            &[
                "level=TIMESTAMPS",
                "level=TENSORS",
                "rate=5",
                "count=10",
                "mode=opentelemetry",
                "opentelemetry,url=http://c:4317",
                "opentelemetry,protocol=grpc",
                "opentelemetry,resource=service.name=edge",
                "opentelemetry,resource=team=ml",
                "opentelemetry,bsp_schedule_delay=50",
                "triton,file=/tmp/t.json",
            ],
            &[],
        )
        .unwrap();
        assert_eq!(c.trace.level, [TraceLevel::Timestamps, TraceLevel::Tensors]);
        assert_eq!((c.trace.rate, c.trace.count), (5, 10));
        assert_eq!(c.trace.file, "/tmp/t.json");
        assert_eq!(c.spans.protocol, Protocol::Grpc);
        assert_eq!(c.batching.delay, Duration::from_millis(50));
        assert_eq!(c.resource.0[0], ("service.name".into(), "edge".into()));
    }

    #[test]
    fn the_mode_is_tritons_unless_chosen_or_only_opentelemetry_is_configured() {
        let mode = |items: &[&str]| parse(items, &[]).unwrap().trace.mode;
        assert_eq!(mode(&[]), TraceMode::Triton);
        assert_eq!(mode(&["triton,file=/tmp/t.json"]), TraceMode::Triton);
        assert_eq!(
            mode(&["opentelemetry,url=http://c:4318"]),
            TraceMode::OpenTelemetry
        );
        assert_eq!(mode(&["mode=opentelemetry"]), TraceMode::OpenTelemetry);
        assert_eq!(
            mode(&["mode=triton", "opentelemetry,url=http://c:4318"]),
            TraceMode::Triton
        );
        let c = parse(&["triton,file=/tmp/t.json", "triton,log-frequency=5"], &[]).unwrap();
        assert_eq!(
            (c.trace.file.as_str(), c.trace.log_frequency),
            ("/tmp/t.json", 5)
        );
    }

    #[test]
    fn environment_fills_what_flags_leave() {
        let c = parse(
            &[],
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/"),
                ("OTEL_SERVICE_NAME", "svc"),
                ("OTEL_RESOURCE_ATTRIBUTES", "a=1, b=2"),
            ],
        )
        .unwrap();
        assert_eq!(c.spans.url, "http://collector:4318/v1/traces");
        assert_eq!(c.resource.0[0], ("service.name".into(), "svc".into()));
        assert_eq!(c.resource.0.len(), 3);
        let c = parse(
            &["opentelemetry,url=http://flag:4318/v1/traces"],
            &[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://env")],
        )
        .unwrap();
        assert_eq!(c.spans.url, "http://flag:4318/v1/traces");
    }

    #[test]
    fn bad_items_name_the_item_and_the_problem() {
        let cases = [
            ("rate=0", "'rate' must be an integer ≥ 1"),
            ("level=LOUD", "must be OFF, TIMESTAMPS or TENSORS"),
            (
                "mode=zipkin",
                "unknown trace mode 'zipkin'; expected triton or",
            ),
            ("opentelemetry,protocol=udp", "protocol must be"),
            (
                "opentelemetry,colour=red",
                "unknown opentelemetry trace setting 'colour'",
            ),
            ("speed=3", "unknown trace setting 'speed'"),
            ("level", "expected [<mode>,]<key>=<value>"),
        ];
        for (item, message) in cases {
            let err = parse(&[item], &[]).unwrap_err();
            assert!(err.contains(item) || err.contains(message), "{err}");
            assert!(err.contains(message), "{item}: {err}");
        }
    }
}
