//! The pass-through path of HTTP inference (`POST /v2/models/{m}[/versions/{v}]/infer`): the
//! router reads the model and version from the path and only what routing needs from the
//! body's JSON header, and forwards the body's bytes to the chosen worker's HTTP port, whose
//! answer goes back to the client as the worker wrote it. No tensor is decoded or re-encoded.
//!
//! ```text
//! client ─POST .../infer─► layer `intercept` (in front of nereid_frontend's typed routes)
//!   not an infer path, wrong method, restricted category without its header ─► typed routes
//!   body read (size limit, Content-Encoding inflated: the frontend's body rule)
//!   http_scan::scan_http_request   id, sequence options, tensor names/shapes, shared memory
//!     (a raw binary body, header length 0, has nothing to scan: forwarded as it is)
//!   checked_version: limits, version text, shared memory refused      (400 / 501 as typed)
//!   RouterService::route (service::route: admission, choice, retries, tracing)
//!     ─► HttpWorkers::infer(body) ─► worker's HTTP port
//!        the chosen worker reports no HTTP address ─► typed routes (gRPC to the worker)
//!   ◄─ the worker's status, headers and body; or the router's own error as {"error": ...}
//! ```
//!
//! With cluster TLS (`--cluster-tls-*`) the bytes go to the worker's gRPC port instead, whose
//! mutual TLS the workers' HTTP ports lack (see `http_forward`). The worker's response is not
//! validated.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use nereid_frontend::{
    ApiCategory, HttpConfig, HttpError, HttpRoute, ModelAction, header_length,
    http_request_context, parse_route, read_body,
};
use nereid_proto::{InferenceService, RequestContext, ServiceError, ServiceResult};

use crate::choice::Ask;
use crate::http_scan::{HttpScanned, scan_http_request};
use crate::passthrough::checked_version;
use crate::service::{Answer, Payload, RouterService};

/// The router's HTTP application: the typed routes of `nereid_frontend`, with inference taken
/// by the pass-through path.
pub fn http_app(
    router: Arc<RouterService>,
    config: HttpConfig,
    shared_memory_off: String,
) -> axum::Router {
    let service: Arc<dyn InferenceService> = router.clone();
    let typed = nereid_frontend::router(service, config.clone());
    let state = Arc::new(HttpPassThrough {
        router,
        config,
        shared_memory_off,
    });
    typed.layer(axum::middleware::from_fn_with_state(state, intercept))
}

/// What the layer holds.
struct HttpPassThrough {
    router: Arc<RouterService>,
    config: HttpConfig,
    shared_memory_off: String,
}

/// The layer: `POST .../infer` through the pass-through path, everything else (and the cases
/// the module docs list) to the typed routes.
async fn intercept(
    State(pass): State<Arc<HttpPassThrough>>,
    request: Request,
    next: Next,
) -> Response {
    let Some((model, version)) = infer_target(&request, &pass.config) else {
        return next.run(request).await;
    };
    let (parts, body) = request.into_parts();
    let body = match read_body(&parts.headers, body, pass.config.max_input_size).await {
        Ok(body) => body,
        Err(e) => return e.into_response(),
    };
    let scanned = match header_length(&parts.headers, body.len())
        .and_then(|len| scan_http_request(&body, len).map_err(ServiceError::from))
    {
        Ok(Some(scanned)) => scanned,
        // A raw binary body (header length 0): no JSON to scan, nothing in it routing needs.
        Ok(None) => HttpScanned::default(),
        Err(e) => return HttpError::from(e).into_response(),
    };
    let context = http_request_context(&parts.headers);
    let routed = pass
        .infer(&model, &version, &parts.headers, &body, scanned, context)
        .await;
    match routed {
        Ok(Answer::Http(response)) => response,
        Ok(_) => typed(next, parts, body).await,
        Err(e) => HttpError::from(e).into_response(),
    }
}

/// The model and version segments of a `POST .../infer` the pass-through path may take.
fn infer_target(request: &Request, config: &HttpConfig) -> Option<(String, String)> {
    if request.method() != Method::POST {
        return None;
    }
    let HttpRoute::Model {
        name,
        version,
        action: ModelAction::Infer,
    } = parse_route(request.uri().path())?
    else {
        return None;
    };
    // A restricted inference category is refused by the typed routes, with their message.
    config
        .restricted
        .check(ApiCategory::Inference, request.headers())
        .ok()?;
    Some((name, version))
}

/// The request, with the body already read, to the typed routes.
async fn typed(next: Next, parts: axum::http::request::Parts, body: Bytes) -> Response {
    // The body is read and inflated: it must not be inflated again.
    let mut parts = parts;
    parts.headers.remove(axum::http::header::CONTENT_ENCODING);
    parts.headers.remove(axum::http::header::CONTENT_LENGTH);
    next.run(Request::from_parts(parts, Body::from(body))).await
}

impl HttpPassThrough {
    /// Routes one HTTP inference body for the model and version path segments (see the
    /// module docs): `Answer::Http`, or `Answer::NoHttpAddress` when the chosen worker has no
    /// HTTP port.
    async fn infer(
        &self,
        model: &str,
        version: &str,
        headers: &HeaderMap,
        body: &Bytes,
        scanned: HttpScanned,
        context: RequestContext,
    ) -> ServiceResult<Answer> {
        let version = checked_version(
            model,
            version,
            &scanned.inputs,
            scanned.outputs,
            scanned.shared_memory.as_deref(),
            &self.config.limits,
            &self.shared_memory_off,
        )?;
        let ask = Ask::of(model, version, &scanned.options);
        Ok(self
            .router
            .route(ask, context, Payload::Http { headers, body })
            .await?)
    }
}
