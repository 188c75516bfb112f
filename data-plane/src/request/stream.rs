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
//! Traced, it is traced like a unary ensemble: its own trace records `receive` (up to the
//! checks), each response handed on and the end, and every step request it sends carries its
//! context, so each execution of a step (once per iteration) is a child trace of it.
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
    StreamedResponse, Tensor, TraceContext,
};
use tokio::sync::mpsc;

use nereid_telemetry::{AttrValue, RequestTrace};
use parking_lot::Mutex;

use super::outcome::{Outcome, backend_error, record_phases};
use super::{LoadedVersion, Runner, StreamContext};
use crate::backend::{BackendError, ModelResponse, StreamEvent, TRACE_PARAMETER};
use crate::classification::{self, Classify};
use crate::ensemble::{self, EnsemblePlan, EnsembleRequest, EnsembleStreamed, StepStream};
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
    let mut trace = trace;
    let mut outcome = Outcome::start(loaded.clone(), started);
    let mut valid = request_check::check(&loaded.config, request)
        .map_err(|e| failed(&mut trace, outcome.refused_unchecked(e)))?;
    let id = valid.id.clone();
    let classify = std::mem::take(&mut valid.classify);
    let trace = trace.map(|t| {
        let traceparent = t.context().traceparent().to_string();
        valid
            .parameters
            .insert(TRACE_PARAMETER.into(), ParamValue::String(traceparent));
        checked(t, &loaded, &id, &valid.inputs)
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

/// A streamed request's trace once its checks passed: its input tensors (level TENSORS), its
/// version and id, shared between the response stream and whatever else records into it.
fn checked(
    mut trace: RequestTrace,
    loaded: &LoadedVersion,
    id: &str,
    inputs: &[Tensor],
) -> Arc<Mutex<RequestTrace>> {
    if trace.wants_tensors() {
        for tensor in inputs {
            trace.tensor(true, tensor);
        }
    }
    trace.attribute("model.version", AttrValue::Text(loaded.version.to_string()));
    if !id.is_empty() {
        trace.attribute("request.id", AttrValue::Text(id.to_string()));
    }
    Arc::new(Mutex::new(trace))
}

/// Marks the request's trace (if sampled) failed with `error`, and hands `error` back.
fn failed(trace: &mut Option<RequestTrace>, error: ServiceError) -> ServiceError {
    if let Some(trace) = trace {
        trace.fail(error.to_string());
    }
    error
}

/// `step` with every request it sends marked as a call of the traced request whose context is
/// `parent`: each step request's own trace (if the tracer takes it) is a child trace of it.
fn steps_under(step: StepStream, parent: TraceContext) -> StepStream {
    Arc::new(move |mut request: InferRequest| {
        request.context.trace = Some(parent.clone());
        step(request)
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
    let mut trace = ctx.trace;
    let mut outcome = Outcome::start(loaded.clone(), started);
    if let Some(reason) = (ctx.unavailable)(&loaded) {
        let e = ServiceError::unavailable(format!(
            "ensemble '{}' is not available: {reason}",
            loaded.name
        ));
        return Err(failed(&mut trace, outcome.failed(FailureReason::Other, e)));
    }
    let mut valid = request_check::check(&loaded.config, request)
        .map_err(|e| failed(&mut trace, outcome.refused_unchecked(e)))?;
    let id = valid.id.clone();
    let classify = std::mem::take(&mut valid.classify);
    let batch_size = valid.batch_size;
    // Checked: the `receive` phase ends (Triton's QUEUE_START); each step is a child trace.
    let trace = trace.map(|mut t| {
        t.phase("receive", t.start_instant(), Instant::now());
        checked(t, &loaded, &id, &valid.inputs)
    });
    let step = match &trace {
        Some(t) => steps_under(ctx.step, t.lock().context()),
        None => ctx.step,
    };
    let request = EnsembleRequest {
        id: valid.id,
        options: valid.options,
        parameters: valid.parameters,
        inputs: valid.inputs,
        outputs: valid.outputs,
    };
    let items = ensemble::execute_stream(plan, request, step);
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
    Ok(match trace {
        Some(trace) => traced(stream.boxed(), trace),
        None => stream.boxed(),
    })
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

    use nereid_telemetry::{SpanKind, Tracer};

    use super::*;
    use crate::config::ValidModelConfig;
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
        LoadedVersion::for_test("m", config, Runner::Decoupled(scheduler), stats)
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

    /// IN -> repeat (decoupled: one response per element, then its final flag alone) -> R ->
    /// double -> OUT.
    fn decoupled_ensemble() -> (Arc<LoadedVersion>, Arc<EnsemblePlan>) {
        use crate::ensemble::limit::StepLimits;
        use crate::ensemble::origin::{Origin, Origins};
        use crate::ensemble::plan::PlanStep;
        let text = r#"
            name: "e"
            platform: "ensemble"
            max_batch_size: 0
            input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
            output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
            ensemble_scheduling { step [
              { model_name: "repeat" model_version: -1
                input_map { key: "IN" value: "IN" } output_map { key: "OUT" value: "R" } },
              { model_name: "double" model_version: -1
                input_map { key: "x" value: "R" } output_map { key: "y" value: "OUT" } } ] }
        "#;
        let wire = crate::config::parse_config_text(Path::new("e/config.pbtxt"), text).unwrap();
        let plan = Arc::new(EnsemblePlan {
            name: "e".into(),
            steps: vec![
                PlanStep::wired("repeat", &[("IN", "IN")], &[("OUT", "R")], &[]),
                PlanStep::wired("double", &[("x", "R")], &[("y", "OUT")], &[0]),
            ],
            order: vec![0, 1],
            limits: StepLimits::unlimited(),
            origins: Origins {
                steps: vec![Origin::Request, Origin::Step(0)],
                decoupled_steps: vec![true, false],
            },
        });
        let loaded = LoadedVersion::for_test(
            "e",
            Arc::new(ValidModelConfig::unchecked(wire)),
            Runner::Ensemble(plan.clone()),
            Arc::new(VersionStats::default()),
        );
        (loaded, plan)
    }

    /// The composing models as stream functions, each step request traced by `tracer` from
    /// its own context, as the data plane's stream path traces it (the trace ends with the
    /// step's stream).
    fn traced_models(tracer: Tracer) -> StepStream {
        use nereid_test_support::{int32_1d, ints};
        Arc::new(move |r: InferRequest| {
            let trace = tracer.start("InferRequest", SpanKind::Server, &r.model_name, &r.context);
            let input = ints(&r.inputs[0]);
            let answer = |model: &str, tensor, last| {
                Ok(StreamedResponse {
                    response: Some(InferResponse {
                        model_name: model.into(),
                        outputs: vec![tensor],
                        ..Default::default()
                    }),
                    last,
                })
            };
            let mut items: Vec<ServiceResult<StreamedResponse>> = Vec::new();
            if r.model_name == "repeat" {
                for v in &input {
                    items.push(answer("repeat", int32_1d("OUT", &[*v]), false));
                }
                items.push(Ok(StreamedResponse {
                    response: None,
                    last: true,
                }));
            } else {
                let doubled: Vec<i32> = input.iter().map(|v| v * 2).collect();
                items.push(answer("double", int32_1d("y", &doubled), true));
            }
            let responses = futures::stream::iter(items).map(move |item| {
                let _open = &trace;
                item
            });
            futures::FutureExt::boxed(futures::future::ready(Ok(responses.boxed())))
        })
    }

    #[tokio::test]
    async fn a_traced_decoupled_ensemble_has_each_step_execution_as_a_child_trace() {
        use nereid_proto::{Frontend, RequestContext, RequestedOutput};
        use nereid_telemetry::{MetricsExportFlags, Telemetry, TelemetryConfig};
        use nereid_test_support::int32_1d;

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("trace.json");
        let items = [
            format!("triton,file={}", file.display()),
            "level=TIMESTAMPS".to_string(),
            "rate=1".to_string(),
        ];
        let config =
            TelemetryConfig::parse(&items, &MetricsExportFlags::default(), "nereid", |_| None)
                .unwrap();
        let telemetry =
            Telemetry::start(&config, nereid_telemetry::logging::control(), None).unwrap();
        let tracer = telemetry.tracer.clone();

        let (loaded, plan) = decoupled_ensemble();
        let request = InferRequest {
            model_name: "e".into(),
            id: "r1".into(),
            inputs: vec![int32_1d("IN", &[1, 2, 3])],
            outputs: vec![RequestedOutput {
                name: "OUT".into(),
                parameters: Default::default(),
            }],
            context: RequestContext {
                received: Some(Instant::now()),
                frontend: Some(Frontend::Grpc),
                ..Default::default()
            },
            ..Default::default()
        };
        let trace = tracer.start("InferRequest", SpanKind::Server, "e", &request.context);
        assert!(trace.is_some(), "rate 1 traces every request");
        let ctx = StreamContext {
            unavailable: &|_| None,
            step: traced_models(tracer.clone()),
            trace,
        };
        let stream = run_ensemble(loaded, plan, request, Instant::now(), ctx).unwrap();
        let answers: Vec<_> = stream.collect().await;
        let data = answers
            .iter()
            .filter(|a| a.as_ref().unwrap().response.is_some())
            .count();
        assert_eq!(data, 3, "{answers:?}");
        drop(tracer);
        telemetry.shutdown(std::time::Duration::from_secs(10)).await;

        // Per trace id: its header and its timestamp names in file order.
        let objects: Vec<serde_json::Value> =
            serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        let mut headers = std::collections::BTreeMap::new();
        let mut stamps: std::collections::BTreeMap<u64, Vec<String>> = Default::default();
        for o in &objects {
            let id = o["id"].as_u64().unwrap();
            if o.get("model_name").is_some() {
                headers.insert(id, o.clone());
            } else if let Some(t) = o.get("timestamps") {
                let name = t[0]["name"].as_str().unwrap().to_string();
                stamps.entry(id).or_default().push(name);
            }
        }
        let roots: Vec<u64> = headers
            .iter()
            .filter(|(_, h)| h.get("parent_id").is_none())
            .map(|(id, _)| *id)
            .collect();
        let [root] = roots[..] else {
            panic!("one root trace: {objects:?}");
        };
        assert_eq!(headers[&root]["model_name"], "e");
        assert_eq!(headers[&root]["model_version"], 1);
        assert_eq!(headers[&root]["request_id"], "r1");
        let mut expected: Vec<&str> = vec![
            "REQUEST_START",
            "QUEUE_START",
            "REQUEST_END",
            "GRPC_WAITREAD_START",
            "GRPC_WAITREAD_END",
        ];
        for _ in 0..3 {
            expected.extend([
                "INFER_RESPONSE_COMPLETE",
                "GRPC_SEND_START",
                "GRPC_SEND_END",
            ]);
        }
        assert_eq!(
            stamps[&root], expected,
            "no compute stamps: the steps computed"
        );
        // repeat ran once, double once per response of repeat: each a child of the ensemble.
        let mut children: Vec<&str> = headers
            .values()
            .filter(|h| h["parent_id"] == root)
            .map(|h| h["model_name"].as_str().unwrap())
            .collect();
        children.sort_unstable();
        assert_eq!(children, ["double", "double", "double", "repeat"]);
        assert_eq!(headers.len(), 5, "{objects:?}");
    }
}
