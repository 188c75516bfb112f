//! Telemetry flags shared by `serve`, `worker` and `router`: Triton's `--trace-config` and the
//! OTLP metric export. The `OTEL_*` environment variables fill what the flags leave; parsing
//! and validation live in `nereid_telemetry::TelemetryConfig`.

use clap::Args;
use nereid_telemetry::{MetricsExportFlags, TelemetryConfig};

#[derive(Args, Debug, Clone, Default)]
pub struct TelemetryArgs {
    /// Trace setting, Triton's syntax `[<mode>,]<key>=<value>` (repeat): level=OFF|TIMESTAMPS|TENSORS,
    /// rate=N (trace one request in N), count=N (-1: no limit), mode=triton|opentelemetry;
    /// triton,file=PATH (Triton's JSON trace file), triton,log-frequency=N (a new PATH.<n> every
    /// N traces; 0: one file at shutdown); opentelemetry,url=URL,
    /// opentelemetry,protocol=grpc|http/protobuf, opentelemetry,resource=KEY=VALUE,
    /// opentelemetry,bsp_schedule_delay=MS, ...
    #[arg(long = "trace-config", value_name = "[MODE,]KEY=VALUE")]
    pub trace_config: Vec<String>,
    /// Push metrics over OTLP to this endpoint (HTTP: the full URL, e.g.
    /// http://collector:4318/v1/metrics; gRPC: http://collector:4317). Off when unset.
    #[arg(long, env = "NEREID_OTLP_METRICS_ENDPOINT")]
    pub otlp_metrics_endpoint: Option<String>,
    /// OTLP protocol for metrics: http/protobuf (default) or grpc.
    #[arg(long, env = "NEREID_OTLP_METRICS_PROTOCOL")]
    pub otlp_metrics_protocol: Option<String>,
    /// Milliseconds between OTLP metric exports (default 60000).
    #[arg(long, env = "NEREID_OTLP_METRICS_INTERVAL_MS")]
    pub otlp_metrics_interval_ms: Option<u64>,
}

impl TelemetryArgs {
    /// The validated telemetry config; `service` is the default `service.name`.
    pub fn to_config(&self, service: &str) -> Result<TelemetryConfig, String> {
        TelemetryConfig::parse(
            &self.trace_config,
            &MetricsExportFlags {
                endpoint: self.otlp_metrics_endpoint.clone(),
                protocol: self.otlp_metrics_protocol.clone(),
                interval_ms: self.otlp_metrics_interval_ms,
            },
            service,
            |key| std::env::var(key).ok(),
        )
    }
}
