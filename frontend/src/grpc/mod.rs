//! gRPC frontend: Triton's `inference.GRPCInferenceService` and `grpc.health.v1.Health`.
//!
//! ```text
//! tonic server (HTTP/2, prost decoding, message size limits from GrpcConfig)
//!   └─► restricted-API layer (only when some category is restricted): method path ─► category
//!       (crate::restrict); metadata lacks the header ─► UNAVAILABLE, handler never runs
//!   └─► handlers::GrpcFrontend ── one method per rpc, a thin translation
//!         ├─ infer::decode_call       metadata ─► RequestContext; message ─► InferRequest
//!         │    └─ nereid_proto::codec::decode_request  (the codec the router's forwarder shares;
//!         │                                             RequestLimits checked first)
//!         ├─ repository               load/unload parameters ─► LoadRequest / flag
//!         ├─ InferenceService         the one shared implementation (data plane or router)
//!         ├─ codec::encode_response   InferResponse ─► ModelInferResponse (raw outputs)
//!         ├─ stream                   ModelStreamInfer: concurrent requests, streamed answers
//!         │    └─ stream_order        sequences start in order; non-decoupled answers in order
//!         └─ codec (status)           ServiceError ─► tonic::Status (one exhaustive match)
//! ```
//!
//! [`routes`] is the whole public surface: the caller adds the routes to a
//! `tonic::transport::Server` and owns the listener and shutdown. Tensor bytes are `Bytes` from
//! prost decoding to the service and back, never copied. A cancelled rpc drops its handler
//! future, which drops the in-flight `InferenceService::infer` future and so cancels the request;
//! a closed `ModelStreamInfer` stream cancels every request still running on it. System shared
//! memory is served through `crate::shm` (its rpcs in `shm`, tensors in unary `ModelInfer`);
//! CUDA shared memory regions live in the same registry as system ones (`crate::shm`).

mod handlers;
mod infer;
pub use infer::request_context as grpc_request_context;
mod repository;
mod settings;
mod shm;
mod stream;
pub use stream::{
    DecoupledModels, ErrorMode, Flow, GRPC_ERROR_KEY, Origin, Outbox, Placed, StreamHandler,
    serve_with as serve_stream_with, shared_memory_refused,
};
mod stream_order;
pub use stream_order::{SequenceKey, Turn};
#[cfg(test)]
mod tests;

use std::sync::Arc;

use crate::forward::HeaderForward;
use crate::restrict::{RestrictedApis, grpc_category, grpc_refusal};
use crate::shm::SharedMemory;
use nereid_proto::InferenceService;
use nereid_proto::codec::RequestLimits;
use nereid_proto::pb::health::health_server::HealthServer;
use nereid_proto::pb::inference::grpc_inference_service_server::GrpcInferenceServiceServer;

/// Settings of the gRPC frontend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrpcConfig {
    /// Largest message, in bytes, accepted from or sent to a client. Triton uses `INT32_MAX`
    /// both ways; Nereid's default is 256 MiB, which bounds what one message may hold, and
    /// operators with larger single tensors raise it.
    pub max_message_size: usize,
    /// Responses one `ModelStreamInfer` stream holds for a client that reads slower than its
    /// models answer. When full, the stream's requests wait (back-pressure) instead of buffering
    /// without bound; raise it for many small responses (token streaming) on a slow link.
    pub stream_response_buffer: usize,
    /// The process's shared-memory registry (the same handle as the HTTP frontend's).
    pub shared_memory: SharedMemory,
    /// Rpc categories put behind a metadata header (`--grpc-restricted-protocol`); empty: all
    /// open.
    pub restricted: RestrictedApis,
    /// Input / output counts and tensor sizes an infer request may have (the HTTP frontend
    /// checks the same).
    pub limits: RequestLimits,
    /// Metadata copied into `ModelInfer` and `ModelStreamInfer` requests' parameters
    /// (`--grpc-header-forward-pattern`); default: none.
    pub header_forward: HeaderForward,
    /// `--grpc-infer-response-compression-level`: whether `ModelInfer` and `ModelStreamInfer`
    /// responses are gzip-compressed for clients that accept it.
    pub infer_compression: InferCompression,
}

/// `--grpc-infer-response-compression-level`, Triton's values. Any level but `none` compresses
/// the infer rpcs' responses with gzip when the client's `grpc-accept-encoding` lists it (tonic
/// compresses at one level, flate2's 6, whichever level is asked for); other rpcs' responses
/// are never compressed, as in Triton.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum InferCompression {
    /// `none`: responses go out uncompressed (the default).
    #[default]
    None,
    /// `low`: gzip when the client accepts it (tonic compresses at one fixed level).
    Low,
    /// `medium`: gzip when the client accepts it, the same as `low` in Nereid.
    Medium,
    /// `high`: gzip when the client accepts it, the same as `low` in Nereid.
    High,
}

impl InferCompression {
    /// The level named as in Triton's flag (any case), or `None` for an unknown name.
    pub fn from_name(name: &str) -> Option<InferCompression> {
        match name.to_ascii_lowercase().as_str() {
            "none" => Some(InferCompression::None),
            "low" => Some(InferCompression::Low),
            "medium" => Some(InferCompression::Medium),
            "high" => Some(InferCompression::High),
            _ => None,
        }
    }
}

impl GrpcConfig {
    /// Default of [`GrpcConfig::stream_response_buffer`].
    pub const DEFAULT_STREAM_RESPONSE_BUFFER: usize = 32;
    /// Default of [`GrpcConfig::max_message_size`]: 256 MiB.
    pub const DEFAULT_MAX_MESSAGE_SIZE: usize = 256 * 1024 * 1024;
}

impl Default for GrpcConfig {
    fn default() -> Self {
        GrpcConfig {
            max_message_size: Self::DEFAULT_MAX_MESSAGE_SIZE,
            stream_response_buffer: Self::DEFAULT_STREAM_RESPONSE_BUFFER,
            shared_memory: SharedMemory::default(),
            restricted: RestrictedApis::default(),
            limits: RequestLimits::default(),
            header_forward: HeaderForward::default(),
            infer_compression: InferCompression::None,
        }
    }
}

/// tonic routes serving `inference.GRPCInferenceService` and `grpc.health.v1.Health` over
/// `service`, ready for
/// `tonic::transport::Server::builder().add_routes(routes).serve_with_incoming_shutdown(..)`.
pub fn routes(service: Arc<dyn InferenceService>, config: GrpcConfig) -> tonic::service::Routes {
    let restricted = config.restricted.clone();
    restrict(open_routes(service, config), restricted)
}

/// [`routes`] without the restricted-API check, for a server that adds routes of its own and
/// then puts them all behind [`restrict`].
pub fn open_routes(
    service: Arc<dyn InferenceService>,
    config: GrpcConfig,
) -> tonic::service::Routes {
    let frontend = Arc::new(handlers::GrpcFrontend::new(service, config.clone()));
    let mut inference = GrpcInferenceServiceServer::from_arc(frontend.clone())
        .max_decoding_message_size(config.max_message_size)
        .max_encoding_message_size(config.max_message_size)
        .accept_compressed(tonic::codec::CompressionEncoding::Gzip)
        .accept_compressed(tonic::codec::CompressionEncoding::Deflate);
    let compress = config.infer_compression != InferCompression::None;
    if compress {
        inference = inference.send_compressed(tonic::codec::CompressionEncoding::Gzip);
    }
    let health = HealthServer::from_arc(frontend)
        .max_decoding_message_size(config.max_message_size)
        .max_encoding_message_size(config.max_message_size);
    let routes = tonic::service::Routes::new(inference).add_service(health);
    if !compress {
        return routes;
    }
    // tonic compresses every rpc of a service alike; like Triton, only the infer rpcs' answers
    // are compressed: for the others the client's accepted encodings are hidden from tonic.
    let router = routes
        .into_axum_router()
        .layer(axum::middleware::map_request(uncompressed_unless_infer));
    tonic::service::Routes::from(router)
}

/// The infer rpcs, whose responses `--grpc-infer-response-compression-level` compresses.
const COMPRESSED_RPCS: [&str; 2] = [
    "/inference.GRPCInferenceService/ModelInfer",
    "/inference.GRPCInferenceService/ModelStreamInfer",
];

/// Removes `grpc-accept-encoding` from calls of rpcs other than [`COMPRESSED_RPCS`], so tonic
/// answers them uncompressed.
async fn uncompressed_unless_infer(mut call: axum::extract::Request) -> axum::extract::Request {
    if !COMPRESSED_RPCS.contains(&call.uri().path()) {
        call.headers_mut().remove("grpc-accept-encoding");
    }
    call
}

/// `routes` behind the restricted-API check: a call to an rpc of a restricted category
/// without its header is refused with Triton's UNAVAILABLE.
pub fn restrict(
    routes: tonic::service::Routes,
    restricted: RestrictedApis,
) -> tonic::service::Routes {
    if restricted.is_empty() {
        return routes;
    }
    let restricted = Arc::new(restricted);
    let router = routes
        .into_axum_router()
        .layer(axum::middleware::from_fn(move |call, next| {
            refuse_restricted(restricted.clone(), call, next)
        }));
    tonic::service::Routes::from(router)
}

/// Passes a call on when its rpc's category is open or its metadata carries the header, else
/// answers Triton's UNAVAILABLE without running the handler (a stream is refused at its start).
async fn refuse_restricted(
    restricted: Arc<RestrictedApis>,
    call: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let Some(category) = grpc_category(call.uri().path()) else {
        return next.run(call).await;
    };
    match restricted.check(category, call.headers()) {
        Ok(()) => next.run(call).await,
        Err(missing) => tonic::Status::unavailable(grpc_refusal(missing)).into_http(),
    }
}
