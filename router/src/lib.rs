//! `nereid-router`: the cluster's front door. Clients speak KServe v2 HTTP and gRPC to it
//! exactly as to one `nereid serve`; it picks a worker replica per request and forwards.
//!
//! ```text
//! control plane ──Watch──► watch::watch_task ──► table::SharedTable (routing table)
//!                                                        │
//! client ──► nereid_frontend http / grpc ► service::RouterService ─┤ choice::Chooser (p2c on
//!                                          (admission limit)      │ load::LoadBook, affinity,
//!                                                                 │ version)
//!                                                                 ▼
//!                                          forward::Workers ──gRPC (pooled HTTP/2)──► worker
//! ```
//!
//! - `table`: the routing table built from watch events.
//! - `choice`: pure replica choice.
//! - `load`: workers' load reports (ORCA, asked for on every stream the router opens) and the
//!   load choice weighs: the router's own outstanding requests plus the work a worker reported
//!   from elsewhere.
//! - `version`: pure version resolution (traffic split, served versions).
//! - `random`: the seeded generator choice and splits draw from.
//! - `wire`: the shared codec (`nereid_proto::codec`) on the client side, its errors as
//!   [`RouterError`]s naming the worker.
//! - `forward`: one pooled channel per worker, calls and error classification; `raw_call`
//!   frames the pass-through's unary calls as bytes.
//! - `passthrough`: unary gRPC `ModelInfer` forwarded as bytes (`wire_scan` reads what
//!   routing needs, `raw_codec` moves the bytes); the router's gRPC routes.
//! - `grpc_routes`: the router's gRPC service, assembled from the two pass-through routes and
//!   the frontend's typed ones; `raw_serve` frames unary `ModelInfer` on the client's side.
//! - `stream_passthrough`: gRPC `ModelStreamInfer` forwarded the same way, each request on a
//!   worker stream of its own, over `nereid_frontend`'s stream skeleton (orders, error modes).
//! - `http_passthrough` (with `http_scan` and `http_forward`): HTTP inference forwarded as
//!   bytes to the workers' HTTP ports; the router's HTTP application.
//! - `service`: [`RouterService`], the `InferenceService` of cluster mode; `service::retry` its
//!   retries, hedging and ejection.
//! - `watch`: follows the control plane's watch with failover and resume.
//! - `control`: the control-plane connection (addresses, token, unary calls with failover).
//! - `activate`: scale from zero and repository load/unload through the control plane.
//! - `collector`: the router's `/metrics` collector (gauges read at scrape time).
//! - `metrics`: the router's `nereid_router_*` counters and its `/metrics` collector.
//! - `serve`: `nereid router`'s life: bind, serve, shut down.
//!
//! The modules are private; what the binary and the tests use is re-exported here.

#![warn(missing_docs)]

mod activate;
mod choice;
mod collector;
mod control;
mod error;
mod forward;
mod grpc_routes;
mod http_forward;
mod http_passthrough;
mod http_scan;
mod load;
mod metrics;
mod passthrough;
mod random;
mod raw_call;
mod raw_codec;
mod raw_serve;
mod serve;
mod service;
mod stream_passthrough;
mod table;
mod version;
mod watch;
mod wire;
mod wire_scan;

pub use activate::RepositoryControl;
pub use collector::RouterCollector;
pub use control::ControlPlaneConfig;
pub use error::{RouterError, RouterResult};
pub use forward::{ForwardConfig, Workers};
pub use grpc_routes::grpc_routes;
pub use http_passthrough::http_app;
pub use http_scan::{HttpScanError, HttpScanned, scan_http_request};
pub use passthrough::PassThroughConfig;
pub use random::SplitMix64;
pub use raw_codec::{RawCodec, RawMessage};
pub use serve::{RouterConfig, RouterServeError, run};
pub use service::{HedgeConfig, RouterService, RouterServiceConfig};
pub use table::{RoutingTable, SharedTable};
pub use wire::{WorkerRequest, encode_request};
