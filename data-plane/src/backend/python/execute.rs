//! One batch through a stub: requests out, responses back.
//!
//! ```text
//!  requests ─► request objects + input tensors packed into one parent segment
//!           ─► (decoupled: register each request's stream on the link)
//!           ─► execute {id} ─► wait for execute_done {id} (or the stub's death)
//!  default:   responses[i] ─► outputs copied out of the stub segment (released) ─► the
//!             outputs request i asked for, in its order, with the response parameters
//!  decoupled: responses arrive as `response` messages on the reader thread; a request with a
//!             stream gets them there, one without is collected here until its final flag
//!  rescheduled (execute_done names it): RequestOutcome::Rescheduled, no response; a streamed
//!             request's stream stays registered (parked) for the next run of the same request
//! ```
//!
//! A rescheduled request is handed back only once the reader thread has delivered every
//! response the stub sent before its `execute_done` (which counts them), so its next run's
//! responses follow them in order and a fast loop cannot pile up stub segments. It keeps its
//! key from run to run (the scheduler's): responses a model's own thread sends later still
//! reach its stream. The parked stream is replaced when the request runs again, dropped when
//! the stub dies, and swept once its client is gone.
//!
//! There is no timeout on a model's `execute`: the wait ends with its answer or with the
//! stub's death (the reader reports both).

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use bytes::Bytes;
use crossbeam_channel::Receiver;

use super::convert::{self, ModelInfo};
use super::link::StreamTarget;
use super::shm::Packer;
use super::stub::{Stub, StubError};
use crate::backend::{
    BackendError, ModelResponse, Phases, RequestOutcome, RequestView, StreamEvent,
};
use nereid_stub_protocol::message::{ErrorObject, FromStub, ResponseObject, TensorRef, ToStub};

/// One outcome per request, or one error for all.
pub type BatchResult = Result<Vec<RequestOutcome>, BackendError>;

/// Runs `requests` on `stub`, marking in `phases` when the inputs were sent and when the
/// stub's answer came in.
pub fn execute(
    stub: &Stub,
    requests: &[RequestView<'_>],
    model: &ModelInfo,
    phases: &mut Phases,
) -> BatchResult {
    if let Some(reason) = stub.link().death_reason() {
        return Err(BackendError::Execution(reason));
    }
    let mut packer = Packer::default();
    let objects = requests
        .iter()
        .map(|r| convert::request_object(r, model, &mut packer))
        .collect();
    let collected = model.decoupled.then(|| open_streams(stub, requests));
    let id = stub.next_execute_id();
    let sent = stub
        .link()
        .send_with_tensors(&packer, |segment| ToStub::Execute {
            id,
            requests: objects,
            segment,
        });
    if let Err(e) = sent {
        close_streams(stub, requests);
        if e.is_disconnect() {
            return Err(stub_failure(stub.lost(&e)));
        }
        return Err(BackendError::Execution(format!(
            "model '{}': cannot pass the requests to the Python stub: {e}",
            model.name
        )));
    }
    phases.inputs_sent = Some(Instant::now());
    let done = match wait_execute_done(stub, id, requests.len()) {
        Ok(done) => done,
        Err(e) => {
            close_streams(stub, requests);
            return Err(stub_failure(e));
        }
    };
    phases.answered = Some(Instant::now());
    match collected {
        Some(collector) => finish_decoupled(stub, requests, model, done, collector),
        None => finish_default(stub, requests, model, done),
    }
}

/// What `execute_done` carries.
struct ExecuteDone {
    responses: Vec<ResponseObject>,
    error: Option<ErrorObject>,
    segment: Option<String>,
    /// Per request, whether the model rescheduled it.
    rescheduled: Vec<bool>,
    /// With rescheduled requests (decoupled): the stub's `response` messages so far.
    responses_sent: Option<u64>,
}

/// The answer to `execute` `id` (a batch of `requests` requests), skipping stale answers.
fn wait_execute_done(stub: &Stub, id: u64, requests: usize) -> Result<ExecuteDone, StubError> {
    loop {
        match stub.wait_reply(None)? {
            FromStub::ExecuteDone {
                id: done,
                responses,
                error,
                segment,
                rescheduled: indexes,
                responses_sent,
            } if done == id => {
                let mut rescheduled = vec![false; requests];
                for i in indexes {
                    match rescheduled.get_mut(i) {
                        Some(r) => *r = true,
                        None => {
                            tracing::warn!(instance = %stub.spec().instance, index = i, "ignoring a rescheduled request index past the batch");
                        }
                    }
                }
                return Ok(ExecuteDone {
                    responses,
                    error,
                    segment,
                    rescheduled,
                    responses_sent,
                });
            }
            other => {
                tracing::warn!(instance = %stub.spec().instance, "ignoring an unexpected answer while executing: {other:?}");
            }
        }
    }
}

/// Default mode: one response per request, outputs read from the stub's segment.
fn finish_default(
    stub: &Stub,
    requests: &[RequestView<'_>],
    model: &ModelInfo,
    done: ExecuteDone,
) -> BatchResult {
    let ExecuteDone {
        responses,
        error,
        segment,
        rescheduled,
        ..
    } = done;
    let refs: Vec<&TensorRef> = responses.iter().flat_map(|r| &r.outputs).collect();
    // Copy everything out (and release the segment) before looking at the answer.
    let data = stub.link().take_bytes_deferred(segment.as_deref(), &refs);
    if let Some(error) = error {
        return Err(convert::backend_error(error));
    }
    if responses.len() != requests.len() {
        return Err(BackendError::Execution(format!(
            "model '{}': execute returned {} responses for {} requests",
            model.name,
            responses.len(),
            requests.len()
        )));
    }
    let mut data = data
        .map_err(|e| {
            BackendError::Execution(format!(
                "model '{}': cannot read the outputs of the Python model: {e}",
                model.name
            ))
        })?
        .into_iter();
    Ok(responses
        .into_iter()
        .zip(requests)
        .zip(rescheduled)
        .map(|((response, request), rescheduled)| {
            let bytes: Vec<Bytes> = data.by_ref().take(response.outputs.len()).collect();
            if rescheduled {
                return RequestOutcome::Rescheduled;
            }
            RequestOutcome::Answered(default_response(model, request, response, bytes))
        })
        .collect())
}

/// One default-mode response, its outputs read: the outputs `request` asked for, in its order.
fn default_response(
    model: &ModelInfo,
    request: &RequestView<'_>,
    response: ResponseObject,
    bytes: Vec<Bytes>,
) -> Result<ModelResponse, BackendError> {
    if let Some(error) = response.error {
        return Err(convert::backend_error(error));
    }
    let tensors = convert::tensors_from_refs(&response.outputs, bytes).map_err(|e| {
        BackendError::Execution(format!(
            "model '{}' returned an invalid output: {e}",
            model.name
        ))
    })?;
    Ok(ModelResponse {
        tensors: convert::select_outputs(tensors, request.outputs, &model.name)?,
        parameters: convert::response_parameters_from_json(response.parameters, &model.name)?,
    })
}

/// Registers every request's stream; returns the channel the stream-less ones report to.
fn open_streams(stub: &Stub, requests: &[RequestView<'_>]) -> Receiver<(u64, StreamEvent)> {
    // Unbounded: this thread drains it until every collected request is final.
    let (tx, rx) = crossbeam_channel::unbounded();
    for r in requests {
        let target = match r.stream {
            Some(sink) => StreamTarget::Sink(sink.clone()),
            None => StreamTarget::Collect(tx.clone()),
        };
        stub.link().open_stream(r.key, target, r.outputs.to_vec());
    }
    rx
}

fn close_streams(stub: &Stub, requests: &[RequestView<'_>]) {
    for r in requests {
        stub.link().close_stream(r.key);
    }
}

/// Decoupled mode: `execute` returned. If it failed, the error is the whole batch's (the data
/// plane ends each stream with it); else requests without a stream wait here for their final
/// response. A rescheduled request's stream is parked until it runs again; one without a
/// stream (a padding request) is closed, as nothing waits for it.
fn finish_decoupled(
    stub: &Stub,
    requests: &[RequestView<'_>],
    model: &ModelInfo,
    done: ExecuteDone,
    collector: Receiver<(u64, StreamEvent)>,
) -> BatchResult {
    if let Some(error) = done.error {
        // The data plane ends each request's stream with this error.
        close_streams(stub, requests);
        return Err(convert::backend_error(error));
    }
    let rescheduled = done.rescheduled;
    if let Some(sent) = done.responses_sent {
        stub.link().wait_delivered(sent);
    }
    for (r, _) in requests
        .iter()
        .zip(&rescheduled)
        .filter(|(_, again)| **again)
    {
        match r.stream {
            Some(_) => stub.link().park_stream(r.key),
            None => drop(stub.link().close_stream(r.key)),
        }
    }
    let mut collected = collect_responses(requests, &rescheduled, collector);
    Ok(requests
        .iter()
        .zip(rescheduled)
        .map(|(r, again)| match (again, r.stream) {
            (true, _) => RequestOutcome::Rescheduled,
            (false, Some(_)) => RequestOutcome::Answered(Ok(ModelResponse::default())),
            (false, None) => RequestOutcome::Answered(single_response(
                model,
                collected.remove(&r.key).unwrap_or_default(),
            )),
        })
        .collect())
}

/// Receives the stream-less requests' responses until each is final (or the stub died and
/// the channel closed); rescheduled ones are not waited for.
fn collect_responses(
    requests: &[RequestView<'_>],
    rescheduled: &[bool],
    collector: Receiver<(u64, StreamEvent)>,
) -> HashMap<u64, Vec<Result<ModelResponse, BackendError>>> {
    let mut open: HashSet<u64> = requests
        .iter()
        .zip(rescheduled)
        .filter(|(r, again)| r.stream.is_none() && !**again)
        .map(|(r, _)| r.key)
        .collect();
    let mut collected: HashMap<u64, Vec<_>> = HashMap::new();
    while !open.is_empty() {
        let (key, last) = match collector.recv() {
            Ok((key, StreamEvent::Response(result))) => {
                collected.entry(key).or_default().push(result);
                (key, false)
            }
            Ok((key, StreamEvent::LastResponse(result))) => {
                collected.entry(key).or_default().push(result);
                (key, true)
            }
            Ok((key, StreamEvent::Final | StreamEvent::Failed(_))) => (key, true),
            Err(_) => break,
        };
        if last {
            open.remove(&key);
        }
    }
    collected
}

/// A decoupled model answered a request that has no stream: exactly one response fits.
fn single_response(
    model: &ModelInfo,
    mut responses: Vec<Result<ModelResponse, BackendError>>,
) -> Result<ModelResponse, BackendError> {
    if let Some(failed) = responses.iter().position(Result::is_err) {
        return responses.swap_remove(failed);
    }
    match responses.len() {
        1 => responses.swap_remove(0),
        0 => Err(BackendError::Execution(format!(
            "model '{}' is decoupled and completed the request without a response",
            model.name
        ))),
        n => Err(BackendError::Unsupported(format!(
            "model '{}' is decoupled and sent {n} responses; this endpoint returns one response per request, use a streaming endpoint",
            model.name
        ))),
    }
}

fn stub_failure(e: StubError) -> BackendError {
    BackendError::Execution(e.to_string())
}
