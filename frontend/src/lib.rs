//! `nereid-frontend`: the KServe v2 / Triton HTTP and gRPC servers over any
//! [`InferenceService`](nereid_proto::InferenceService), written once. `nereid serve` and
//! `nereid worker` run them over the data plane, `nereid router` over its `RouterService`.
//!
//! ```text
//!  HTTP body (JSON / binary tensor extension) ──► http ─┐
//!                                                       ├─► InferRequest ──► InferenceService
//!  gRPC ModelInferRequest ──► grpc (nereid_proto::codec)┘        (data plane or router)
//!
//!  spawn(Frontends { http, grpc, metrics listeners }, service, stop) ─► one task per listener
//! ```
//!
//! Entry points, all re-exported here:
//! - [`router`] and [`HttpConfig`]: the axum router of the HTTP frontend (JSON, binary tensor
//!   extension, compression, generate, repository and settings endpoints), with the
//!   OpenAI-compatible routes under `/v1/` (`openai`: models, completions, chat completions,
//!   embeddings, streamed as server-sent events; docs/openai.md).
//! - [`routes`] and [`GrpcConfig`]: the tonic routes of `inference.GRPCInferenceService` and
//!   `grpc.health.v1.Health`.
//! - [`spawn`], [`Frontends`], [`bind`], [`BindError`], [`stopped`]: running them on listeners
//!   with graceful shutdown; [`PortsConfig`]: per port TLS, connection limits, first-byte and
//!   HTTP read deadlines, HTTP/2 stream limits and the accept backlog (`listener`,
//!   `listener_http`); [`serve_grpc_port`], [`serve_http_port`], [`serve_metrics_port`]: the one
//!   way every process serves a port.
//! - [`serve_stream_with`] and [`StreamHandler`]: the `ModelStreamInfer` skeleton (request
//!   orders, error modes, cancellation) the typed handler and the router's pass-through share.
//! - [`RequestBudget`]: the server-wide bound on bytes of requests still arriving (`budget`),
//!   charged by HTTP bodies (`listener_http`) and gRPC messages (`grpc_buffer`, which also
//!   keeps tonic from reserving a message's declared length before its bytes arrive).
//! - [`Corked`]: an HTTP/2 connection's writes held for one pass of its task, so the frames of
//!   every call answered meanwhile leave in one system call (`cork`; gRPC ports and the
//!   router's worker connections, on a current-thread runtime only).
//! - `orca`: the ORCA `endpoint-load-metrics` header on the generate and OpenAI routes, and in
//!   `ModelStreamInfer`'s initial metadata when asked (the router asks, to weigh workers' load).
//! - [`RestrictedApis`] (in [`HttpConfig`] and [`GrpcConfig`]): Triton's restricted APIs,
//!   endpoint categories put behind a header (`restrict`); [`RequestLimits`]: the request-level
//!   bounds both frontends check before decoding tensor data; [`FrontendOptions`]: both, with
//!   the gRPC message and stream buffer sizes, as the binary's flags set them.
//! - [`SharedMemory`]: the registry of client system shared-memory regions (`shm`), one per
//!   process, put in both [`HttpConfig`] and [`GrpcConfig`] so a region registered over one
//!   protocol serves the other; shared-memory inputs are read before the service runs and
//!   outputs written after it answers.
//!
//! The domain types, the `InferenceService` trait and the gRPC codec live in `nereid-proto`, so a
//! crate that only implements or calls the service does not depend on this one.

#![warn(missing_docs)]

mod app;
mod budget;
mod cork;
mod cuda;
mod forward;
#[doc(hidden)]
pub mod fuzzing;
mod grpc;
mod grpc_buffer;
mod http;
mod keepalive;
mod listener;
mod listener_http;
mod offload;
mod openai;
mod options;
mod orca;
mod restrict;
mod serve;
mod shm;

/// The HTTP application: KServe v2 routes and the OpenAI-compatible `/v1/` routes.
pub use app::router;
pub use budget::{BUDGET_FLAG, BudgetExceeded, DEFAULT_MAX_BUFFERED_REQUEST_BYTES, RequestBudget};
pub use cork::Corked;
pub use forward::HeaderForward;
/// The `ModelStreamInfer` skeleton, generic over a [`StreamHandler`]: the typed handler and the
/// router's pass-through share its reading, request orders, error reporting and cancellation.
pub use grpc::{
    DecoupledModels, ErrorMode, Flow, GRPC_ERROR_KEY, Origin, Outbox, Placed, SequenceKey,
    StreamHandler, Turn, serve_stream_with, shared_memory_refused,
};
pub use grpc::{GrpcConfig, InferCompression, grpc_request_context, open_routes, restrict, routes};
pub use http::{
    HttpConfig, HttpError, ModelAction, Route as HttpRoute, http_request_context, parse_route,
    read_body,
};
/// The `Inference-Header-Content-Length` header name and its parsing, and how a JSON parameter
/// value is read, as the typed path applies them (the router's pass-through scan uses the same).
pub use http::{INFER_HEADER_CONTENT_LENGTH, header_length, param_value};
pub use keepalive::GrpcKeepalive;
pub use listener::{
    Conn, DEFAULT_FIRST_BYTE_TIMEOUT, DEFAULT_LISTEN_BACKLOG, DEFAULT_MAX_CONNECTIONS, PortConfig,
};
pub use listener_http::{
    DEFAULT_BODY_READ_TIMEOUT, DEFAULT_HEADER_READ_TIMEOUT, DEFAULT_MAX_CONCURRENT_STREAMS,
    HttpServing, HttpTimeouts,
};
pub use nereid_proto::codec::RequestLimits;
pub use options::FrontendOptions;
pub use restrict::{ApiCategory, RequiredHeader, RestrictError, RestrictedApis};
pub use serve::{
    BindError, DEFAULT_METRICS_MAX_CONNECTIONS, Frontends, GrpcServing, PortsConfig, bind,
    bind_reusable, fit_ports_to_fd_limit, incoming, serve_grpc_port, serve_http_port,
    serve_metrics_port, spawn, stopped,
};
pub use shm::{RegionStatus, SharedMemory};
