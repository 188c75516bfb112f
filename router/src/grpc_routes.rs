//! The router's gRPC service: `ModelInfer` and `ModelStreamInfer` through the pass-through
//! paths (`passthrough`, `stream_passthrough`), every other rpc through the frontend's typed
//! routes over the same [`RouterService`], all behind the frontend's restricted-API check.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::Poll;

use nereid_proto::InferenceService;
use tonic::codegen::{BoxFuture, http};

use crate::forward::{MODEL_INFER_PATH, MODEL_STREAM_INFER_PATH};
use crate::passthrough::{ModelInferRoute, PassThroughConfig};
use crate::raw_codec::RawCodec;
use crate::raw_serve;
use crate::service::RouterService;
use crate::stream_passthrough::ModelStreamInferRoute;

/// The router's gRPC routes: `ModelInfer` and `ModelStreamInfer` through the pass-through paths,
/// every other rpc through `nereid_frontend`'s typed routes over the same service; all behind
/// the frontend's restricted-API check.
pub fn grpc_routes(
    router: Arc<RouterService>,
    config: PassThroughConfig,
) -> tonic::service::Routes {
    let service: Arc<dyn InferenceService> = router.clone();
    let typed = nereid_frontend::open_routes(service, config.grpc.clone()).into_axum_router();
    let restricted = config.grpc.restricted.clone();
    let config = Arc::new(config);
    let stream = RawRoute::Stream(ModelStreamInferRoute::new(router.clone(), config.clone()));
    let unary = RawRoute::Unary(ModelInferRoute::new(router, config));
    let routes = typed
        .route_service(MODEL_INFER_PATH, unary)
        .route_service(MODEL_STREAM_INFER_PATH, stream);
    let routes = tonic::service::Routes::from(routes);
    nereid_frontend::restrict(routes, restricted)
}

/// tonic's server side of a pass-through rpc: bytes both ways, gzip and deflate accepted, the
/// frontend's message size limit.
fn raw_server(config: &PassThroughConfig) -> tonic::server::Grpc<RawCodec> {
    let max = config.grpc.max_message_size;
    tonic::server::Grpc::new(RawCodec)
        .accept_compressed(tonic::codec::CompressionEncoding::Gzip)
        .accept_compressed(tonic::codec::CompressionEncoding::Deflate)
        .max_decoding_message_size(max)
        .max_encoding_message_size(max)
}

/// The tower service of a pass-through rpc: unary calls framed by the router (`raw_serve`)
/// unless compressed, streams and compressed calls by tonic's server with the raw codec.
#[derive(Clone)]
enum RawRoute {
    Unary(ModelInferRoute),
    Stream(ModelStreamInferRoute),
}

impl tonic::codegen::Service<http::Request<axum::body::Body>> for RawRoute {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, call: http::Request<axum::body::Body>) -> Self::Future {
        let route = self.clone();
        Box::pin(async move {
            Ok(match route {
                RawRoute::Unary(rpc) if raw_serve::frames_itself(call.headers()) => {
                    raw_serve::serve_unary(rpc, call).await
                }
                RawRoute::Unary(rpc) => raw_server(rpc.config()).unary(rpc, call).await,
                RawRoute::Stream(rpc) => raw_server(rpc.config()).streaming(rpc, call).await,
            })
        })
    }
}
