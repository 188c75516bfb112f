//! The router's one inference path. Every transport reduces a request to the same two things,
//! and [`RouterService::route`] does the rest:
//!
//! ```text
//! typed InferRequest (ModelInfer over the frontend) ─┐  Ask: model, version, sequence id
//! gRPC ModelInfer bytes (passthrough, wire_scan)  ───┼─► and flags; RequestContext: deadline,
//! HTTP .../infer body (http_passthrough, http_scan) ─┘  trace context; Payload: as it came
//!
//! route ─► admission (bounded in flight, else Overloaded; outcome and time counted)
//!       ─► trace: server span InferRequest (child of the client's traceparent)
//!       ─► with_retry: replica choice, scale from zero, retry once, hedging, ejection
//!         ─► traced_attempt: client span `forward`, its id the worker's traceparent
//!           ─► send: the payload to the chosen worker, naming the version choice resolved
//!                Typed ─► Workers::infer (prost, the worker's gRPC port)
//!                Grpc  ─► Workers::infer_raw (bytes + version field, the worker's gRPC port)
//!                Http  ─► HttpWorkers::infer (bytes, the worker's HTTP port)
//!       ◄─ Answer in the same form
//! ```
//!
//! What each transport checks before routing (tensor counts and shapes against the limits, the
//! version text, shared memory) it checks on its own view; the rest is the worker's to refuse,
//! with the same words a worker gives.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::body::Body;
use axum::http::{HeaderMap, Response};
use bytes::Bytes;
use nereid_proto::pb::inference::ModelInferRequest;
use nereid_proto::{InferResponse, RequestContext};
use nereid_telemetry::{AttrValue, RequestTrace, SpanKind};
use tracing::Instrument;

use super::RouterService;
use crate::choice::Ask;
use crate::error::RouterResult;
use crate::metrics::{Classify, Outcome};
use crate::raw_codec::RawMessage;
use crate::table::Endpoint;
use crate::wire::{WorkerRequest, decode_response};
use crate::wire_scan::version_suffix;

/// One inference request's payload, in the form its transport brought it; forwarded in that
/// form.
pub(crate) enum Payload<'a> {
    /// A request the frontend decoded, encoded once for the workers' gRPC ports.
    Typed(&'a ModelInferRequest),
    /// A client's `ModelInfer` message as bytes, and the version text it named (replaced by
    /// the version choice resolved, as a trailing field, when they differ).
    Grpc {
        message: &'a Bytes,
        version: &'a str,
    },
    /// An HTTP inference body, with the client's headers the worker needs.
    Http {
        headers: &'a HeaderMap,
        body: &'a Bytes,
    },
}

/// A worker's answer, in the form of the payload that asked.
pub(crate) enum Answer {
    Typed(InferResponse),
    /// The worker's `ModelInfer` response bytes; its errors come back as statuses (`Err`).
    Grpc(Bytes),
    /// The worker's HTTP status, headers and body.
    Http(Response<Body>),
    /// The chosen replica's worker reports no HTTP address: the HTTP payload was not sent;
    /// the caller hands the request to the typed path (gRPC to the worker).
    NoHttpAddress,
}

impl Classify for Answer {
    /// An HTTP answer by its status (a 400 the worker wrote is a failure, as over gRPC); a
    /// request handed to the typed path is counted there.
    fn outcome(&self) -> Outcome {
        match self {
            Answer::Typed(_) | Answer::Grpc(_) => Outcome::Success,
            Answer::Http(response) => Outcome::of_status(response.status()),
            Answer::NoHttpAddress => Outcome::HandedOn,
        }
    }
}

impl RouterService {
    /// Routes one inference request (see the module docs): `ask` says what choice needs,
    /// `context` carries the deadline and trace context, `payload` is sent as it is.
    pub(crate) async fn route(
        &self,
        ask: Ask<'_>,
        context: RequestContext,
        payload: Payload<'_>,
    ) -> RouterResult<Answer> {
        let (ask, payload) = (&ask, &payload);
        let routed = self.traced_request(ask.model, context, |trace, context| async move {
            // A sequence request changes state on the worker that accepted it: never retried.
            let retry = ask.sequence.is_none();
            // Each attempt boxed: retries and hedging hold several, and a request's future is
            // moved whole when its frontend boxes it.
            self.with_retry(ask, retry, context.deadline, |target| {
                Box::pin(traced_attempt(
                    trace.as_deref(),
                    target,
                    context.clone(),
                    move |target, context| self.send(target, ask.model, payload, context),
                ))
            })
            .await
        });
        self.admitted(ask.model, routed).await
    }

    /// Runs `forward` inside the request's trace when the tracer samples it: `forward` gets
    /// the trace for its attempts; the trace is failed (on an error), ended and closed once
    /// the frontend has sent the answer.
    async fn traced_request<T, F, Fut>(
        &self,
        model: &str,
        context: RequestContext,
        forward: F,
    ) -> RouterResult<T>
    where
        F: FnOnce(Option<Arc<Mutex<RequestTrace>>>, RequestContext) -> Fut,
        Fut: Future<Output = RouterResult<T>>,
    {
        let trace = self
            .tracer
            .start("InferRequest", SpanKind::Server, model, &context);
        let Some(trace) = trace else {
            return forward(None, context).await;
        };
        let span = tracing::info_span!("request", trace_id = %trace.trace_id());
        let trace = Arc::new(Mutex::new(trace));
        let result = forward(Some(trace.clone()), context.clone())
            .instrument(span)
            .await;
        if let Ok(trace) = Arc::try_unwrap(trace) {
            let mut trace = trace.into_inner().unwrap_or_else(|p| p.into_inner());
            if let Err(e) = &result {
                trace.fail(e.to_string());
            }
            trace.done(Instant::now());
            trace.close_after_send(&context);
        }
        result
    }

    /// Sends `payload` for `model` to `target`'s worker, naming the version choice resolved
    /// (the worker may serve several). For HTTP, `model` is the path segment as the client
    /// wrote it.
    async fn send(
        &self,
        target: Endpoint,
        model: &str,
        payload: &Payload<'_>,
        context: RequestContext,
    ) -> RouterResult<Answer> {
        match *payload {
            Payload::Typed(message) => {
                let mut message = message.clone();
                message.model_version = target.version.to_string();
                // Boxed: the typed client's future is the largest, and the typed path the rare
                // one (streams' metadata, cluster TLS); it stays out of the others' futures.
                let model_response = Box::pin(
                    self.workers
                        .infer(&target.addr, WorkerRequest { message, context }),
                )
                .await?;
                Ok(Answer::Typed(decode_response(
                    &target.addr,
                    model_response,
                )?))
            }
            Payload::Grpc { message, version } => {
                let raw = RawMessage {
                    head: message.clone(),
                    tail: version_suffix(version, &target.version.to_string()),
                };
                let answer = self
                    .workers
                    .infer_raw(&target.addr, raw, &context, model)
                    .await?;
                Ok(Answer::Grpc(answer))
            }
            Payload::Http { headers, body } => {
                let Some(addr) = self.http_workers.address(&target) else {
                    return Ok(Answer::NoHttpAddress);
                };
                let path = format!("/v2/models/{model}/versions/{}/infer", target.version);
                let response = self
                    .http_workers
                    .infer(addr, &path, headers, &context, body.clone())
                    .await?;
                Ok(Answer::Http(response))
            }
        }
    }
}

/// One forwarding attempt to `target`: `call` gets the context to send, whose `traceparent`
/// is a new client span `forward` of `trace` when the request is traced; the span is recorded
/// with the attempt's outcome.
async fn traced_attempt<T, F, Fut>(
    trace: Option<&Mutex<RequestTrace>>,
    target: Endpoint,
    mut context: RequestContext,
    call: F,
) -> RouterResult<T>
where
    F: FnOnce(Endpoint, RequestContext) -> Fut,
    Fut: Future<Output = RouterResult<T>>,
{
    let Some(trace) = trace else {
        return call(target, context).await;
    };
    let (span, child) = lock(trace).child_context();
    context.trace = Some(child);
    let attributes = vec![
        (
            "worker.address".to_string(),
            AttrValue::Text(target.addr.to_string()),
        ),
        ("model.version".to_string(), AttrValue::Int(target.version)),
    ];
    let started = Instant::now();
    let result = call(target, context).await;
    let error = result.as_ref().err().map(|e| e.to_string());
    lock(trace).call(span, "forward", started, Instant::now(), attributes, error);
    result
}

/// Locks a request's trace, whatever a panicking holder left.
fn lock(trace: &Mutex<RequestTrace>) -> std::sync::MutexGuard<'_, RequestTrace> {
    trace.lock().unwrap_or_else(|p| p.into_inner())
}
