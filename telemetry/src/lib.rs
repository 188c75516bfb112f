//! Telemetry shared by every Nereid process (`serve`, `worker`, `router`, `control-plane`).
//!
//! - `metrics`: one model of metric families ([`Family`]) that each component
//!   collects on demand, and the encoders over it: Prometheus text for `/metrics` (and the axum
//!   route serving it) and OTLP (`otlp`) for users without Prometheus. Components never format
//!   metrics themselves, so the two views cannot drift apart.
//! - `trace_config`: Triton's trace settings (`--trace-config`, the trace setting API) and
//!   the sampling decision; `tracer`: a traced request's spans; `span`: span records, W3C
//!   ids and the clock; `otlp`: the batching OTLP exporter (gRPC or HTTP/protobuf) for spans
//!   and metrics; `triton_trace` and `triton_file`: Triton's own trace mode (its JSON trace
//!   objects, and the files they go to with `log-frequency` rotation); `startup`: the flags
//!   (`--trace-config`, OTLP metric export, `OTEL_*`) and the running pieces with their
//!   shutdown.
//! - [`logging`]: the process's log subscriber (text or JSON) with run-time control behind
//!   `/v2/logging`.
//!
//! The modules are private except `logging`, whose functions ([`logging::init`],
//! [`logging::control`]) need their namespace. What other crates use is re-exported here:
//! the metric model ([`Family`], [`Labels`], [`Value`], [`Kind`], [`Collect`]) and its
//! Prometheus rendering ([`render_prometheus`], [`prometheus_router`]); a traced request
//! ([`Tracer`], [`RequestTrace`], [`SpanKind`], [`AttrValue`]); and start-up
//! ([`TelemetryConfig`] parsed from [`MetricsExportFlags`] and the trace flags, [`Telemetry`]
//! running).

#![warn(missing_docs)]

pub mod logging;
mod metrics;
mod otlp;
mod span;
mod startup;
mod trace_config;
mod tracer;
mod triton_file;
mod triton_trace;

pub use metrics::{Collect, Family, Kind, Labels, Value, prometheus_router, render_prometheus};
pub use span::{AttrValue, SpanKind};
pub use startup::{MetricsExportFlags, Telemetry, TelemetryConfig};
pub use tracer::{RequestTrace, Tracer};
