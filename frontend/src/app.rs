//! The whole HTTP application of a port: the KServe v2 / Triton routes (`http`) and the
//! OpenAI-compatible routes under `/v1/` (`openai`), over one shared state.
//!
//! ```text
//! /v1/{*path} ─► openai::dispatch        (OpenAI error shape)
//! anything else ─► http::routes::dispatch  (Triton's paths, {"error": "..."})
//! ```

use std::sync::Arc;

use axum::routing::any;

use crate::http::{HttpConfig, HttpState, routes};
use crate::openai;
use nereid_proto::InferenceService;

/// An axum router serving both APIs over `service`, ready for
/// `axum::serve(listener, router).with_graceful_shutdown(..)`.
pub fn router(service: Arc<dyn InferenceService>, config: HttpConfig) -> axum::Router {
    let state = Arc::new(HttpState { service, config });
    axum::Router::new()
        .route("/v1/{*path}", any(openai::dispatch))
        .fallback(routes::dispatch)
        .with_state(state)
}
