//! `nereid-proto`: the wire contract and the domain API every Nereid process shares, with the
//! gRPC codec between them. No server lives here: the HTTP and gRPC frontends are
//! `nereid-frontend`, written once over [`InferenceService`].
//!
//! ```text
//!  pb (generated wire types) ◄── codec (both directions) ──► InferRequest / InferResponse
//!                                     ▲          ▲                 │
//!                  gRPC frontend ─────┘          └── router forwarder
//!                                                                  ▼
//!                              InferenceService (data plane or router) ─► ServiceError
//! ```
//!
//! - [`pb`]: prost/tonic types generated from Triton's `.proto` files (package `inference`),
//!   public as they are: they are the contract.
//! - the domain API, re-exported here: the request/response/tensor types ([`InferRequest`],
//!   [`InferResponse`], [`Tensor`], ...), the [`InferenceService`] trait and the types it
//!   answers with, [`ServiceError`] classified by meaning, [`DataType`], trace and log settings,
//!   W3C trace context and `grpc-timeout` ([`TraceContext`]), the client shared-memory
//!   references a request may carry ([`ShmPlan`], read and written by the frontends).
//! - [`codec`]: `ModelInferRequest` ⇄ [`InferRequest`], [`InferResponse`] ⇄
//!   `ModelInferResponse`, [`ServiceError`] ⇄ `tonic::Status`; the gRPC frontend decodes with it,
//!   the router's forwarder encodes with it.
//! - protobuf JSON and config text: [`message_to_json`], [`message_from_json`],
//!   [`parse_model_config`].
//! - `testing` (cargo feature `testing`): `testing::FakeService`, the fake service of other
//!   crates' tests.

#![warn(missing_docs)]

pub mod codec;
mod config_text;
mod datatype;
mod error;
mod json;
pub mod pb;
mod service;
mod settings;
mod shm_ref;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
mod trace_context;
mod types;

pub use config_text::{TextError, parse_model_config};
pub use datatype::DataType;
pub use error::{ServiceError, ServiceResult};
pub use json::{message_from_json, message_to_json, to_dynamic};
pub use service::{
    Credential, InferenceService, LoadRequest, ModelIndexEntry, ModelLoadReport, ModelMetadata,
    ResponseStream, ServerMetadata, StreamedResponse, TensorMetadata, UnloadRequest,
};
pub use settings::{LogSettings, LogValue, TraceSettings, TraceSettingsUpdate};
pub use shm_ref::{SHM_BYTE_SIZE, SHM_OFFSET, SHM_REGION, ShmInput, ShmOutput, ShmPlan, ShmRef};
pub use trace_context::{
    GRPC_TIMEOUT, MAX_TRACESTATE_LEN, TRACEPARENT, TRACESTATE, TraceContext, parse_grpc_timeout,
};
pub use types::{
    CorrelationId, Frontend, InferRequest, InferResponse, OpenSpan, ParamValue, Parameters,
    RESERVED_PARAMETER_KEYS, RequestContext, RequestOptions, RequestedOutput, ResponseHook,
    SEQUENCE_PARAMETER_KEYS, Tensor, bytes_elements, count_bytes_elements, element_count,
    format_shape, parse_version, push_bytes_element,
};
