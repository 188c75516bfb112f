//! Decoupled models (`model_transaction_policy { decoupled: true }`): zero or more responses per
//! request, streamed back over gRPC `ModelStreamInfer` and HTTP `generate_stream`.
//!
//! ```text
//! infer_stream: check ─► ValidRequest.stream = sink ─► scheduler.submit (runs execute)
//!   backend ──StreamEvent::Response─────► sink ─► rx ─► a response, last = false
//!   backend ──StreamEvent::LastResponse─► sink ─► rx ─► a response, last = true (sent by the
//!                                                       model with the final flag)
//!   backend ──StreamEvent::Final────────► sink ─► rx ─► an empty item, last = true (the flag
//!                                                       alone)
//!   queue rejection / execute failed as a whole ─► StreamEvent::Failed ends the stream
//! ```
//!
//! As Triton, every response goes out as the model sent it: none is held back to carry a
//! final flag the model sent separately.
//!
//! A decoupled ensemble streams through [`run_ensemble`]: its checked request goes to
//! `ensemble::execute_stream`, whose items become this version's responses; the outcome is
//! counted when the last item (or an error) goes out, as cancelled if the client drops it first.
//!
//! Plain `infer` refuses decoupled models the way Triton does (UNSUPPORTED). The stream ends
//! when the model sent its final flag or dropped every sender (a crashed stub). The request's
//! [`Outcome`] lives in the task that awaits the scheduler, so a stream counts as in flight
//! until the model has finished with it. A traced request's trace is shared by that task (which
//! records its phases) and the response stream (which records each response handed on, and
//! the end); it ships once both are done with it.

use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use nereid_proto::{
    Frontend, InferRequest, InferResponse, ParamValue, ResponseStream, ServiceError, ServiceResult,
    StreamedResponse,
};
use tokio::sync::mpsc;

use nereid_telemetry::{AttrValue, RequestTrace};
use parking_lot::Mutex;

use super::outcome::{Outcome, backend_error, record_phases};
use super::{LoadedVersion, Runner, StreamContext};
use crate::backend::{BackendError, ModelResponse, StreamEvent, TRACE_PARAMETER};
use crate::classification::{self, Classify};
use crate::ensemble::{self, EnsemblePlan, EnsembleRequest, EnsembleStreamed};
use crate::request_check;
use crate::stats::FailureReason;

/// Triton's answer to a unary infer call on a decoupled model, in the words of the frontend
/// that received it (an internal call, which has none, gets both).
pub(super) fn refuse_unary(loaded: &LoadedVersion, frontend: Option<Frontend>) -> ServiceError {
    ServiceError::unsupported(match frontend {
        Some(Frontend::Grpc) => {
            "ModelInfer RPC doesn't support models with decoupled transaction policy".to_string()
        }
        Some(Frontend::Http) => {
            "HTTP end point doesn't support models with decoupled transaction policy".to_string()
        }
        None => format!(
            "model '{}' uses the decoupled transaction policy: the HTTP infer end point and the ModelInfer RPC don't support models with decoupled transaction policy; use ModelStreamInfer or generate_stream",
            loaded.name
        ),
    })
}

/// The stream of a model that answers once: its one response, marked last.
pub(crate) fn single(response: InferResponse) -> ResponseStream {
    futures::stream::once(async move {
        Ok(StreamedResponse {
            response: Some(response),
            last: true,
        })
    })
    .boxed()
}

/// Runs `request` on a decoupled model version and streams its responses.
pub(super) fn run(
    loaded: Arc<LoadedVersion>,
    request: InferRequest,
    started: Instant,
    trace: Option<RequestTrace>,
) -> ServiceResult<ResponseStream> {
    if !matches!(loaded.runner, Runner::Decoupled(_)) {
        return Err(ServiceError::internal(format!(
            "model '{}' is not decoupled",
            loaded.name
        )));
    }
    let mut outcome = Outcome::start(loaded.clone(), started);
    let mut valid =
        request_check::check(&loaded.config, request).map_err(|e| outcome.refused_unchecked(e))?;
    let id = valid.id.clone();
    let classify = std::mem::take(&mut valid.classify);
    let trace = trace.map(|mut t| {
        if t.wants_tensors() {
            for tensor in &valid.inputs {
                t.tensor(true, tensor);
            }
        }
        let traceparent = t.context().traceparent().to_string();
        valid
            .parameters
            .insert(TRACE_PARAMETER.into(), ParamValue::String(traceparent));
        t.attribute("model.version", AttrValue::Text(loaded.version.to_string()));
        if !id.is_empty() {
            t.attribute("request.id", AttrValue::Text(id.clone()));
        }
        Arc::new(Mutex::new(t))
    });
    let task_trace = trace.clone();
    let (sink, events) = mpsc::unbounded_channel();
    let failures = sink.clone();
    valid.stream = Some(sink);
    let task_id = id.clone();
    tokio::spawn(async move {
        let loaded = outcome.loaded().clone();
        let Runner::Decoupled(scheduler) = &loaded.runner else {
            return;
        };
        let submitted = Instant::now();
        let error = match scheduler.submit(valid).await {
            Ok(result) => match result.outputs {
                Ok(_) => {
                    if let Some(trace) = &task_trace {
                        record_phases(&mut trace.lock(), submitted, &result.timings);
                    }
                    outcome.succeeded(result.timings);
                    None
                }
                Err(e) => Some(outcome.failed(
                    FailureReason::Backend,
                    backend_error(&loaded.name, &task_id, e),
                )),
            },
            Err(e) => Some(outcome.refused(e)),
        };
        if let Some(e) = error {
            let _ = failures.send(StreamEvent::Failed(e));
        }
    });
    let stream = responses(loaded, id, classify, events);
    Ok(match trace {
        Some(trace) => traced(stream, trace),
        None => stream,
    })
}

/// Records in `trace` each response `stream` hands on; the last item (or an error) ends the
/// request.
fn traced(stream: ResponseStream, trace: Arc<Mutex<RequestTrace>>) -> ResponseStream {
    stream
        .inspect(move |item| {
            let now = Instant::now();
            let mut trace = trace.lock();
            match item {
                Ok(r) => {
                    if let Some(response) = &r.response {
                        trace.response(now);
                        if trace.wants_tensors() {
                            for tensor in &response.outputs {
                                trace.tensor(false, tensor);
                            }
                        }
                    }
                    if r.last {
                        trace.done(now);
                    }
                }
                Err(e) => {
                    trace.fail(e.to_string());
                    trace.done(now);
                }
            }
        })
        .boxed()
}

/// Runs `request` on a decoupled ensemble version (`plan`) and streams its responses.
pub(super) fn run_ensemble(
    loaded: Arc<LoadedVersion>,
    plan: Arc<EnsemblePlan>,
    request: InferRequest,
    started: Instant,
    ctx: StreamContext<'_>,
) -> ServiceResult<ResponseStream> {
    let mut outcome = Outcome::start(loaded.clone(), started);
    if let Some(reason) = (ctx.unavailable)(&loaded) {
        let e = ServiceError::unavailable(format!(
            "ensemble '{}' is not available: {reason}",
            loaded.name
        ));
        return Err(outcome.failed(FailureReason::Other, e));
    }
    let mut valid =
        request_check::check(&loaded.config, request).map_err(|e| outcome.refused_unchecked(e))?;
    let id = valid.id.clone();
    let classify = std::mem::take(&mut valid.classify);
    let batch_size = valid.batch_size;
    let request = EnsembleRequest {
        id: valid.id,
        options: valid.options,
        parameters: valid.parameters,
        inputs: valid.inputs,
        outputs: valid.outputs,
    };
    let items = ensemble::execute_stream(plan, request, ctx.step);
    // Taken by the item that ends the stream; dropped with the stream otherwise (cancelled).
    let mut outcome = Some(outcome);
    let stream = items.map(move |item| {
        let item = item.and_then(|EnsembleStreamed { outputs, last }| {
            let response = outputs
                .map(|tensors| {
                    let batching = loaded.config.batching();
                    classification::apply(tensors, &classify, &loaded.labels, batching)
                })
                .transpose()?
                .map(|tensors| loaded.response(id.clone(), tensors.into()));
            Ok(StreamedResponse { response, last })
        });
        match item {
            Ok(streamed) => {
                if streamed.last
                    && let Some(mut outcome) = outcome.take()
                {
                    outcome.ensemble_succeeded(batch_size);
                }
                Ok(streamed)
            }
            Err(e) => Err(match outcome.take() {
                Some(mut outcome) => outcome.refused(e),
                None => e,
            }),
        }
    });
    Ok(stream.boxed())
}

/// Turns the backend's events into stream items, each as it comes: a response is `last` only
/// when the model sent it with the final flag; the flag alone is an empty last item (which
/// Triton's gRPC stream shows only to a client that asked for empty final responses).
fn responses(
    loaded: Arc<LoadedVersion>,
    id: String,
    classify: Classify,
    events: mpsc::UnboundedReceiver<StreamEvent>,
) -> ResponseStream {
    let stream = futures::stream::unfold((events, false), move |(mut events, done)| {
        let loaded = loaded.clone();
        let id = id.clone();
        let classify = classify.clone();
        async move {
            if done {
                return None;
            }
            let answer = |r: Result<ModelResponse, BackendError>| {
                r.map_err(|e| backend_error(&loaded.name, &id, e))
                    .and_then(|answer| {
                        let batching = loaded.config.batching();
                        let tensors = classification::apply(
                            answer.tensors,
                            &classify,
                            &loaded.labels,
                            batching,
                        )?;
                        Ok(ModelResponse {
                            tensors,
                            parameters: answer.parameters,
                        })
                    })
                    .map(|answer| loaded.response(id.clone(), answer))
            };
            let (next, last) = match events.recv().await? {
                StreamEvent::Response(r) => (item(answer(r), false), false),
                StreamEvent::LastResponse(r) => (item(answer(r), true), true),
                StreamEvent::Final => (
                    Ok(StreamedResponse {
                        response: None,
                        last: true,
                    }),
                    true,
                ),
                // The failure ends the stream.
                StreamEvent::Failed(e) => (Err(e), true),
            };
            // Every sender gone without a final flag (the model's process died) ends the
            // stream at `recv` above.
            Some((next, (events, last)))
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

#[cfg(test)]
mod tests {
    use std::path::Path;

    use nereid_proto::pb::inference::ModelConfig;

    use super::*;
    use crate::backend::Health;
    use crate::config::ValidModelConfig;
    use crate::repository::Fingerprint;
    use crate::request::Runner;
    use crate::scheduler::Scheduler;
    use crate::scheduler::policy::BatchPolicy;
    use crate::stats::VersionStats;

    /// A decoupled version with no instances: the test feeds its events itself.
    fn version() -> Arc<LoadedVersion> {
        let config = Arc::new(ValidModelConfig::unchecked(ModelConfig::default()));
        let stats = Arc::new(VersionStats::default());
        let scheduler = Scheduler::start(
            "m",
            BatchPolicy::from_config(&config),
            Vec::new(),
            Vec::new(),
            stats.clone(),
            4,
        )
        .unwrap();
        Arc::new(LoadedVersion {
            name: "m".into(),
            version: 1,
            config,
            runner: Runner::Decoupled(scheduler),
            stats,
            fingerprint: Fingerprint::of(Path::new("/nonexistent")),
            health: Arc::new(Health::default()),
            labels: Default::default(),
            cache: None,
            generation: 0,
        })
    }

    /// (has a response, last) per item, or "error", for `events` sent up front.
    async fn items(events: Vec<StreamEvent>) -> Vec<String> {
        let (sink, rx) = mpsc::unbounded_channel();
        for event in events {
            sink.send(event).unwrap();
        }
        let stream = responses(version(), "r".into(), Classify::default(), rx);
        stream
            .map(|item| match item {
                Ok(r) => format!("{} {}", r.response.is_some(), r.last),
                Err(_) => "error".to_string(),
            })
            .collect()
            .await
    }

    fn ok() -> Result<ModelResponse, BackendError> {
        Ok(ModelResponse::default())
    }

    #[tokio::test]
    async fn each_response_goes_out_as_the_model_sent_it() {
        use StreamEvent::{Final, LastResponse, Response};
        // The final flag alone: every response as it came, then an empty last item.
        assert_eq!(
            items(vec![Response(ok()), Response(ok()), Final]).await,
            ["true false", "true false", "false true"]
        );
        // The flag with the last response: that response is the last item.
        assert_eq!(
            items(vec![Response(ok()), LastResponse(ok())]).await,
            ["true false", "true true"]
        );
        // Nothing follows the last item, nor a failure.
        assert_eq!(
            items(vec![LastResponse(ok()), Response(ok())]).await,
            ["true true"]
        );
        let failed = || StreamEvent::Failed(ServiceError::internal("queue"));
        assert_eq!(
            items(vec![Response(ok()), failed(), Response(ok())]).await,
            ["true false", "error"]
        );
        // A dead stub: its error is the end.
        let dead = Err(BackendError::Execution("not healthy".into()));
        assert_eq!(items(vec![LastResponse(dead)]).await, ["error"]);
    }
}
