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
//!     raw binary body (header length 0) ─► typed routes (nothing to scan)
//!   checked_version: limits, version text, shared memory refused      (400 / 501 as typed)
//!   admission ─► traced_request ─► with_retry (choice, scale from zero, retry once, ejection)
//!     ─► traced_attempt ─► HttpWorkers::infer(body) ─► worker's HTTP port
//!        the chosen worker reports no HTTP address ─► typed routes (gRPC to the worker)
//!   ◄─ the worker's status, headers and body; or the router's own error as {"error": ...}
//! ```
//!
//! Not used with cluster TLS (`--cluster-tls-*`): the workers' HTTP ports are not part of the
//! cluster's mutual TLS, so HTTP inference then takes the typed path, over the TLS gRPC
//! connections. The worker's response is not validated.

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
use crate::error::RouterResult;
use crate::http_scan::{HttpScanned, scan_http_request};
use crate::metrics::{Classify, Outcome};
use crate::passthrough::checked_version;
use crate::service::{RouterService, traced_attempt};

/// The router's HTTP application: the typed routes of `nereid_frontend`, with inference taken
/// by the pass-through path unless `pass_through` is off.
pub fn http_app(
    router: Arc<RouterService>,
    config: HttpConfig,
    shared_memory_off: String,
    pass_through: bool,
) -> axum::Router {
    let service: Arc<dyn InferenceService> = router.clone();
    let typed = nereid_frontend::router(service, config.clone());
    if !pass_through {
        return typed;
    }
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

/// One HTTP inference request as the pass-through path forwards it.
struct HttpCall<'a> {
    /// The raw path segments (as Triton matches them, not percent-decoded).
    model: &'a str,
    version: &'a str,
    headers: &'a HeaderMap,
    body: Bytes,
    scanned: HttpScanned,
}

/// What forwarding came to.
enum Forwarded {
    /// The worker's answer.
    Response(Response),
    /// The chosen replica's worker reports no HTTP address: the typed path serves it.
    NoHttpAddress,
}

impl Classify for Forwarded {
    /// The worker's answer by its HTTP status (a 400 it wrote is a failure, as over gRPC);
    /// a request handed to the typed path is counted there.
    fn outcome(&self) -> Outcome {
        match self {
            Forwarded::Response(response) => Outcome::of_status(response.status()),
            Forwarded::NoHttpAddress => Outcome::HandedOn,
        }
    }
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
        Ok(None) => return typed(next, parts, body).await,
        Err(e) => return HttpError::from(e).into_response(),
    };
    let call = HttpCall {
        model: &model,
        version: &version,
        headers: &parts.headers,
        body: body.clone(),
        scanned,
    };
    let context = http_request_context(&parts.headers);
    match pass.router.infer_http(call, context, &pass).await {
        Ok(Forwarded::Response(response)) => response,
        Ok(Forwarded::NoHttpAddress) => typed(next, parts, body).await,
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

impl RouterService {
    /// Routes one HTTP inference body (see the module docs).
    async fn infer_http(
        &self,
        call: HttpCall<'_>,
        context: RequestContext,
        pass: &HttpPassThrough,
    ) -> ServiceResult<Forwarded> {
        let scanned = &call.scanned;
        let version = checked_version(
            call.model,
            call.version,
            &scanned.inputs,
            scanned.outputs,
            scanned.shared_memory.as_deref(),
            &pass.config.limits,
            &pass.shared_memory_off,
        )?;
        let call = &call;
        let routed = self.traced_request(call.model, context, |trace, context| async move {
            let ask = Ask {
                model: call.model,
                version,
                sequence: call.scanned.options.sequence_id.as_ref(),
                start: call.scanned.options.sequence_start,
                end: call.scanned.options.sequence_end,
            };
            // A sequence request changes state on the worker that accepted it: never retried.
            let retry = ask.sequence.is_none();
            self.with_retry(&ask, retry, context.deadline, |target| {
                traced_attempt(
                    trace.as_deref(),
                    target,
                    context.clone(),
                    move |target, context| self.forward_http(call, target, context),
                )
            })
            .await
        });
        Ok(self.admitted(call.model, routed).await?)
    }

    async fn forward_http(
        &self,
        call: &HttpCall<'_>,
        target: crate::table::Endpoint,
        context: RequestContext,
    ) -> RouterResult<Forwarded> {
        let Some(addr) = target.http_addr.as_deref() else {
            return Ok(Forwarded::NoHttpAddress);
        };
        // The worker may serve several versions: name the one choice resolved.
        let path = format!(
            "/v2/models/{}/versions/{}/infer",
            call.model, target.version
        );
        let response = self
            .http_workers
            .infer(addr, &path, call.headers, &context, call.body.clone())
            .await?;
        Ok(Forwarded::Response(response))
    }
}
