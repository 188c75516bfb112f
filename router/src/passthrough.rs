//! The pass-through path of unary gRPC `ModelInfer`: the router reads only what routing needs
//! from the client's message and forwards its bytes to the chosen worker, whose answer goes
//! back to the client as the worker encoded it. No tensor is decoded or re-encoded.
//!
//! ```text
//! client ─ModelInfer─► the frontend's restricted-API check ─► ModelInferRoute (framed by
//!   raw_serve; a compressed call by tonic's server with RawCodec)
//!   ─► RouterService::infer_raw
//!        wire_scan::scan_request   model, version, sequence options, tensor names/shapes
//!        RequestLimits, shared memory refused, version parsed      (INVALID_ARGUMENT / ...)
//!        RouterService::route (service::route: admission, choice, retries, tracing)
//!          ─► Workers::infer_raw(client bytes + version field) ─► worker
//!   ◄─ the worker's response bytes, or its status
//! (grpc_routes puts ModelStreamInfer on stream_passthrough, with the same checks per message,
//! and every other rpc on the frontend's typed routes over RouterService)
//! ```
//!
//! Everything the typed path checks before forwarding is checked here on the scanned fields;
//! the rest (tensor shapes against the model, contents, custom parameters) is the worker's to
//! refuse, with the same messages a worker gives. The worker's response is not validated.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use nereid_frontend::{GrpcConfig, RequestLimits, grpc_request_context};
use nereid_proto::{RequestContext, ResponseHook, ServiceError, ServiceResult, parse_version};
use tonic::codegen::BoxFuture;
use tonic::metadata::MetadataMap;

use crate::choice::Ask;
use crate::raw_codec::RawMessage;
use crate::service::{Answer, Payload, RouterService};
use crate::wire_scan::{ScannedInput, scan_request};

/// What the pass-through path checks before forwarding, as the typed frontend would.
#[derive(Clone, Debug)]
pub struct PassThroughConfig {
    /// The gRPC frontend's settings (message sizes, limits, restricted APIs).
    pub grpc: GrpcConfig,
    /// Why a request naming shared memory is refused.
    pub shared_memory_off: String,
}

impl RouterService {
    /// Routes one `ModelInfer` message as bytes (see the module docs); `context` is what the
    /// call's metadata carried.
    pub async fn infer_raw(
        &self,
        message: Bytes,
        context: RequestContext,
        config: &PassThroughConfig,
    ) -> ServiceResult<Bytes> {
        let scanned = scan_request(&message)?;
        let version = checked_version(
            &scanned.model_name,
            &scanned.model_version,
            &scanned.inputs,
            scanned.outputs,
            scanned.shared_memory.as_deref(),
            &config.grpc.limits,
            &config.shared_memory_off,
        )?;
        let ask = Ask::of(&scanned.model_name, version, &scanned.options);
        let payload = Payload::Grpc {
            message: &message,
            version: &scanned.model_version,
        };
        match self.route(ask, context, payload).await? {
            Answer::Grpc(answer) => Ok(answer),
            _ => unreachable!("a gRPC payload is answered in kind"),
        }
    }
}

/// The checks every pass-through request gets before it is routed, on its scanned fields, as
/// the typed frontends make them: tensor counts and shapes against `limits`, the version
/// text, and no shared memory (`shared_memory_off` says why). The version to route to.
pub(crate) fn checked_version(
    model: &str,
    version: &str,
    inputs: &[ScannedInput],
    outputs: usize,
    shared_memory: Option<&str>,
    limits: &RequestLimits,
    shared_memory_off: &str,
) -> ServiceResult<Option<i64>> {
    limits.check_counts(inputs.len(), outputs)?;
    for input in inputs {
        limits.check_shape(model, &input.name, &input.shape)?;
    }
    let version = parse_version(version)?;
    if let Some(tensor) = shared_memory {
        return Err(ServiceError::unsupported(format!(
            "{tensor} names a shared-memory region; system shared memory is not available: {shared_memory_off}"
        )));
    }
    Ok(version)
}

/// The `ModelInfer` rpc of the pass-through path (served by `grpc_routes`).
#[derive(Clone)]
pub(crate) struct ModelInferRoute {
    router: Arc<RouterService>,
    config: Arc<PassThroughConfig>,
}

impl ModelInferRoute {
    pub(crate) fn new(router: Arc<RouterService>, config: Arc<PassThroughConfig>) -> Self {
        ModelInferRoute { router, config }
    }

    pub(crate) fn config(&self) -> &PassThroughConfig {
        &self.config
    }

    /// The worker's answer to one `ModelInfer` message whose call carried `metadata`, however
    /// the call was framed (`raw_serve`, or tonic's server for a compressed call).
    pub(crate) async fn answer(
        &self,
        message: Bytes,
        metadata: &MetadataMap,
    ) -> Result<Bytes, tonic::Status> {
        let mut context = grpc_request_context(metadata, Instant::now());
        let hook = ResponseHook::new();
        context.response_hook = hook.clone();
        let answer = self
            .router
            .infer_raw(message, context, &self.config)
            .await?;
        hook.finish(Instant::now());
        Ok(answer)
    }
}

/// A compressed call, inflated by tonic's server (`grpc_routes`).
impl tonic::server::UnaryService<Bytes> for ModelInferRoute {
    type Response = RawMessage;
    type Future = BoxFuture<tonic::Response<RawMessage>, tonic::Status>;

    fn call(&mut self, request: tonic::Request<Bytes>) -> Self::Future {
        let route = self.clone();
        Box::pin(async move {
            let (metadata, _, message) = request.into_parts();
            let answer = route.answer(message, &metadata).await?;
            Ok(tonic::Response::new(RawMessage::new(answer)))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request's future is moved whole (boxed by the frontend, polled through tonic), so its
    /// size is a per-request cost: retries, hedging and the rare paths (scale from zero, the
    /// typed client) keep their large futures boxed. It was 57 KiB before they were.
    #[test]
    fn a_pass_through_request_future_stays_small() {
        let router = RouterService::new(Default::default(), Arc::default());
        let config = PassThroughConfig {
            grpc: GrpcConfig::default(),
            shared_memory_off: String::new(),
        };
        let request = router.infer_raw(Bytes::new(), RequestContext::default(), &config);
        let size = std::mem::size_of_val(&request);
        assert!(size <= 16 << 10, "infer_raw's future is {size} bytes");
    }
}
