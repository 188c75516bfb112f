//! Decoupled models (`model_transaction_policy { decoupled: true }`): zero or more responses per
//! request, streamed back over gRPC `ModelStreamInfer` and HTTP `generate_stream`.
//!
//! ```text
//! infer_stream: check ─► ValidRequest.stream = sink ─► scheduler.submit (runs execute)
//!   backend ──StreamEvent::Response──► sink ─► rx ─┐ hold one response back, so the one
//!   backend ──StreamEvent::Final─────► sink ─► rx ─┴► before Final goes out with last = true
//!   queue rejection / execute failed as a whole ─► StreamEvent::Failed ends the stream
//! ```
//!
//! Plain `infer` refuses decoupled models the way Triton does (UNSUPPORTED). The stream ends
//! when the model sent its final flag or dropped every sender (a crashed stub).

use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use nereid_proto::ServiceError;
use nereid_proto::error::ServiceResult;
use nereid_proto::service::{ResponseStream, StreamedResponse};
use nereid_proto::types::{InferRequest, InferResponse, Tensor};
use tokio::sync::mpsc;

use crate::backend::{BackendError, StreamEvent};
use crate::manager::LoadedVersion;
use crate::request_check;
use crate::server::{backend_error, failure_reason, record_success};
use crate::stats::FailureReason;

/// Whether a model version answers through a response stream.
pub(crate) fn is_decoupled(loaded: &LoadedVersion) -> bool {
    loaded
        .config
        .model_transaction_policy
        .as_ref()
        .is_some_and(|p| p.decoupled)
}

/// Triton's answer to a unary infer call on a decoupled model.
pub(crate) fn refuse_unary(loaded: &LoadedVersion) -> ServiceError {
    ServiceError::unsupported(format!(
        "model '{}' uses the decoupled transaction policy: the HTTP infer end point and the ModelInfer RPC don't support models with decoupled transaction policy; use ModelStreamInfer or generate_stream",
        loaded.name
    ))
}

/// Runs `request` on a decoupled model version and streams its responses.
pub(crate) fn infer_stream(
    loaded: Arc<LoadedVersion>,
    request: InferRequest,
) -> ServiceResult<ResponseStream> {
    let started = Instant::now();
    let id = request.id.clone();
    let mut valid = request_check::check(&loaded.config, request).inspect_err(|_| {
        loaded
            .stats
            .record_failure(started.elapsed(), FailureReason::Other)
    })?;
    let (sink, events) = mpsc::unbounded_channel();
    let failures = sink.clone();
    valid.stream = Some(sink);
    let task_loaded = loaded.clone();
    let task_id = id.clone();
    tokio::spawn(async move {
        let loaded = task_loaded;
        let error = match loaded.submit(valid).await {
            Ok(result) => match result.outputs {
                Ok(_) => {
                    record_success(&loaded, started, result.timings);
                    None
                }
                Err(e) => {
                    loaded
                        .stats
                        .record_failure(started.elapsed(), FailureReason::Backend);
                    Some(backend_error(&loaded.name, &task_id, e))
                }
            },
            Err(e) => {
                loaded
                    .stats
                    .record_failure(started.elapsed(), failure_reason(&e));
                Some(e)
            }
        };
        if let Some(e) = error {
            let _ = failures.send(StreamEvent::Failed(e));
        }
    });
    Ok(responses(loaded, id, events))
}

/// Turns the backend's events into stream items, holding one response back so the response
/// right before `Final` carries `last: true`.
fn responses(
    loaded: Arc<LoadedVersion>,
    id: String,
    events: mpsc::UnboundedReceiver<StreamEvent>,
) -> ResponseStream {
    let state = (events, None::<ServiceResult<InferResponse>>, false);
    let stream = futures::stream::unfold(state, move |(mut events, mut held, done)| {
        let loaded = loaded.clone();
        let id = id.clone();
        async move {
            if done {
                return None;
            }
            loop {
                match events.recv().await {
                    Some(StreamEvent::Response(r)) => {
                        let next = r
                            .map(|outputs| response(&loaded, &id, outputs))
                            .map_err(|e| stream_error(&loaded, &id, e));
                        if let Some(previous) = held.replace(next) {
                            return Some((item(previous, false), (events, held, false)));
                        }
                    }
                    Some(StreamEvent::Failed(e)) => {
                        // Whatever was held goes first; the failure ends the stream.
                        let first = match held.take() {
                            Some(previous) => item(previous, false),
                            None => return Some((Err(e), (events, None, true))),
                        };
                        held = Some(Err(e));
                        return Some((first, (events, held, false)));
                    }
                    Some(StreamEvent::Final) => {
                        let last = match held.take() {
                            Some(previous) => item(previous, true),
                            None => Ok(StreamedResponse {
                                response: None,
                                last: true,
                            }),
                        };
                        return Some((last, (events, None, true)));
                    }
                    // Every sender is gone without a final flag (the model's process died).
                    None => {
                        return held
                            .take()
                            .map(|previous| (item(previous, true), (events, None, true)));
                    }
                }
            }
        }
    });
    stream.boxed()
}

fn item(r: ServiceResult<InferResponse>, last: bool) -> ServiceResult<StreamedResponse> {
    r.map(|response| StreamedResponse {
        response: Some(response),
        last,
    })
}

fn response(loaded: &LoadedVersion, id: &str, outputs: Vec<Tensor>) -> InferResponse {
    InferResponse {
        model_name: loaded.name.clone(),
        model_version: loaded.version.to_string(),
        id: id.to_string(),
        parameters: Default::default(),
        outputs,
    }
}

fn stream_error(loaded: &LoadedVersion, id: &str, e: BackendError) -> ServiceError {
    backend_error(&loaded.name, id, e)
}
