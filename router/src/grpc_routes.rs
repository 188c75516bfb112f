//! The router's gRPC service: `ModelInfer` and `ModelStreamInfer` through the pass-through
//! paths (`passthrough`, `stream_passthrough`), every other rpc through the frontend's typed
//! routes over the same [`RouterService`], all behind the frontend's restricted-API check.

use std::sync::Arc;

use nereid_proto::InferenceService;

use crate::forward::{MODEL_INFER_PATH, MODEL_STREAM_INFER_PATH};
use crate::passthrough::{ModelInferRoute, PassThroughConfig};
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
    let stream = ModelStreamInferRoute::new(router.clone(), config.clone());
    let raw = ModelInferRoute::new(router, config);
    let routes = typed
        .route_service(MODEL_INFER_PATH, raw)
        .route_service(MODEL_STREAM_INFER_PATH, stream);
    let routes = tonic::service::Routes::from(routes);
    nereid_frontend::restrict(routes, restricted)
}
