//! `nereid-proto`: the wire contract and the protocol frontends, written once.
//!
//! ```text
//!  HTTP body (JSON / binary tensor extension) ──► http::  ─┐
//!                                                          ├─► types::InferRequest ──► InferenceService
//!  gRPC ModelInferRequest ──────────────────────► grpc::  ─┘            (data plane or router)
//! ```
//!
//! - [`pb`]: prost/tonic types generated from Triton's `.proto` files (package `inference`).
//! - [`types`]: the internal request/response/tensor types every frontend converts into.
//! - [`error`]: [`ServiceError`], classified by meaning; each transport maps it exhaustively.
//! - [`service`]: the [`InferenceService`] trait the frontends call.
//! - [`trace_context`]: W3C trace context and `grpc-timeout`, read from clients and passed on.
//! - [`http`] and [`grpc`]: the two frontends.

pub mod config_text;
pub mod datatype;
pub mod error;
pub mod grpc;
pub mod http;
pub mod json;
pub mod pb;
pub mod serve;
pub mod service;
pub mod settings;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod trace_context;
pub mod types;

pub use datatype::DataType;
pub use error::ServiceError;
pub use service::InferenceService;
