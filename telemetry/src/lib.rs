//! Telemetry shared by every Nereid process (`serve`, `worker`, `router`, `control-plane`).
//!
//! - [`metrics`]: one model of metric families ([`metrics::Family`]) that each component
//!   collects on demand, and the encoders over it: Prometheus text for `/metrics` (and the axum
//!   route serving it) and OTLP ([`otlp`]) for users without Prometheus. Components never format
//!   metrics themselves, so the two views cannot drift apart.
//! - [`trace_config`]: Triton's trace settings (`--trace-config`, the trace setting API) and
//!   the sampling decision; [`tracer`]: a traced request's spans; [`span`]: span records, W3C
//!   ids and the clock; [`otlp`]: the batching OTLP exporter (gRPC or HTTP/protobuf) for spans
//!   and metrics; [`startup`]: the flags (`--trace-config`, OTLP metric export, `OTEL_*`) and
//!   the running pieces with their shutdown.
//! - [`logging`]: the process's log subscriber (text or JSON) with run-time control behind
//!   `/v2/logging`.

pub mod logging;
pub mod metrics;
pub mod otlp;
pub mod span;
pub mod startup;
pub mod trace_config;
pub mod tracer;
