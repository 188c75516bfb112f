//! Telemetry shared by every Nereid process (`serve`, `worker`, `router`, `control-plane`).
//!
//! - [`metrics`]: one model of metric families ([`metrics::Family`]) that each component
//!   collects on demand, and the encoders over it: Prometheus text for `/metrics` (and the axum
//!   route serving it) and OTLP for users without Prometheus. Components never format metrics
//!   themselves, so the two views cannot drift apart.

pub mod metrics;
