//! Running one request through a decoupled ensemble (a plan with a decoupled step), as a
//! stream of responses.
//!
//! ```text
//! Flow::start_ready ─► one InferRequest per (step, iteration), as in `execute`, through
//!   `step` (a response stream: a decoupled model's responses, any other model's one answer),
//!   after a place among the step's in-flight requests (`max_inflight_requests`)
//! every response of every running step (all polled together) ─► its outputs ─► Flow::record
//!   ─► each complete ensemble response goes out at once ─► the one that leaves nothing
//!   running (no step started, every step's own last flag seen) carries the final flag
//! nothing running and nothing to send ─► a flag-only final response
//! a step fails ─► no step starts any more; those running finish, their complete responses
//!   still go out ─► then the (first) error ends the stream, without a final flag
//! ```
//!
//! This is Triton 2.51's rule. Whether the last data response or a flag-only one carries the
//! final flag depends on when the decoupled step's own final flag comes: with its last response
//! (a model that sends them together), the last data response; alone after it (the usual Python
//! `send(flags=COMPLETE_FINAL)`), the last data response if the flag came while that response
//! was still running downstream, else a flag-only response after it.
//!
//! Nothing is spawned: the stream is the request. A client that goes away drops it, and with
//! it every step still running.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::stream::{self, BoxStream, SelectAll};
use futures::{FutureExt, StreamExt};
use nereid_proto::{
    InferRequest, InferResponse, ResponseStream, ServiceError, ServiceResult, StreamedResponse,
    Tensor,
};

use super::execute::{EnsembleRequest, step_error, step_outputs, step_request};
use super::flow::{Flow, Invocation};
use super::plan::EnsemblePlan;

/// How a streaming ensemble's step reaches its composing model: owned, because the response
/// stream outlives the call that started it.
pub type StepStream =
    Arc<dyn Fn(InferRequest) -> BoxFuture<'static, ServiceResult<ResponseStream>> + Send + Sync>;

/// One item of an ensemble's response stream.
#[derive(Clone, Debug, PartialEq)]
pub struct EnsembleStreamed {
    /// The requested outputs, in the order asked; `None` for a flag-only last item.
    pub outputs: Option<Vec<Tensor>>,
    /// No more items follow.
    pub last: bool,
}

/// What one running step invocation yields.
struct StepEvent {
    /// The invocation (unique within the request).
    invocation: usize,
    step: usize,
    iteration: usize,
    /// One of its responses; `None` for a flag-only one (or the end of its stream).
    response: Option<ServiceResult<InferResponse>>,
    /// The step said it sends nothing more (its final flag, or its stream ended).
    last: bool,
}

/// Runs `request` through the decoupled `plan`, each step through `step`.
pub fn execute_stream(
    plan: Arc<EnsemblePlan>,
    request: EnsembleRequest,
    step: StepStream,
) -> BoxStream<'static, ServiceResult<EnsembleStreamed>> {
    let EnsembleRequest {
        id,
        options,
        parameters,
        inputs,
        outputs,
    } = request;
    let flow = Flow::new(&plan, inputs, outputs);
    let run = Run {
        base: InferRequest {
            id,
            options,
            parameters,
            ..Default::default()
        },
        plan,
        flow,
        step,
        running: SelectAll::new(),
        live: HashSet::new(),
        invocations: 0,
        out: VecDeque::new(),
        failed: None,
        done: false,
    };
    stream::unfold(run, |mut run| async move {
        let item = run.next().await?;
        Some((item, run))
    })
    .boxed()
}

/// The driver's state: the flow, the running invocations, what is ready to go out.
struct Run {
    plan: Arc<EnsemblePlan>,
    /// Id, options and parameters every step request carries.
    base: InferRequest,
    flow: Flow,
    step: StepStream,
    running: SelectAll<BoxStream<'static, StepEvent>>,
    /// Invocations started whose last flag has not come yet.
    live: HashSet<usize>,
    /// Invocations started so far (the next one's number).
    invocations: usize,
    out: VecDeque<ServiceResult<EnsembleStreamed>>,
    /// The first step failure: the request's answer once the running steps are done.
    failed: Option<ServiceError>,
    done: bool,
}

impl Run {
    async fn next(&mut self) -> Option<ServiceResult<EnsembleStreamed>> {
        loop {
            if let Some(item) = self.out.pop_front() {
                return Some(item);
            }
            if self.done {
                return None;
            }
            self.launch();
            if self.live.is_empty() {
                self.finish();
                continue;
            }
            let Some(event) = self.running.next().await else {
                // Every stream ended (each also sends a last event first): nothing is running.
                self.live.clear();
                continue;
            };
            let mut complete = Vec::new();
            match event.response {
                Some(Ok(response)) => match step_outputs(&self.plan, event.step, response) {
                    Ok(outputs) => {
                        complete =
                            self.flow
                                .record(&self.plan, event.step, event.iteration, outputs);
                    }
                    Err(e) => self.fail(e),
                },
                Some(Err(e)) => {
                    let e = step_error(&self.plan, event.step, e);
                    self.fail(e);
                }
                None => {}
            }
            if event.last {
                self.live.remove(&event.invocation);
            }
            self.launch();
            let count = complete.len();
            for (n, outputs) in complete.into_iter().enumerate() {
                // The response that leaves nothing running carries the final flag.
                let last = n + 1 == count && self.live.is_empty() && self.failed.is_none();
                self.out.push_back(Ok(EnsembleStreamed {
                    outputs: Some(outputs),
                    last,
                }));
                if last {
                    self.end();
                }
            }
        }
    }

    /// Starts every ready invocation, unless a step failed.
    fn launch(&mut self) {
        if self.failed.is_some() || self.done {
            return;
        }
        for invocation in self.flow.start_ready(&self.plan) {
            let number = self.invocations;
            self.invocations += 1;
            self.live.insert(number);
            let call = self.invoke(number, invocation);
            self.running.push(call);
        }
    }

    /// Nothing is running: the stream ends with the first failure, or a flag-only final item.
    fn finish(&mut self) {
        self.out.push_back(match self.failed.take() {
            Some(e) => Err(e),
            None => Ok(EnsembleStreamed {
                outputs: None,
                last: true,
            }),
        });
        self.end();
    }

    fn end(&mut self) {
        self.done = true;
        self.running = SelectAll::new();
    }

    /// Remembers the first failure: no step starts any more, and the stream ends with it once
    /// the running steps are done.
    fn fail(&mut self, error: ServiceError) {
        self.failed.get_or_insert(error);
    }

    /// The responses of one step invocation (number `number`), after a place among the step's
    /// in-flight requests (held until its stream ends), then a last event.
    fn invoke(&self, number: usize, invocation: Invocation) -> BoxStream<'static, StepEvent> {
        let Invocation {
            step: index,
            iteration,
            inputs,
        } = invocation;
        let node = &self.plan.steps[index];
        let request = step_request(node, &self.base, inputs);
        let call = (self.step)(request);
        let limits = self.plan.limits.clone();
        let event = move |response, last| StepEvent {
            invocation: number,
            step: index,
            iteration,
            response,
            last,
        };
        let responses = async move {
            let place = limits.acquire(index).await;
            (place, call.await)
        }
        .into_stream()
        .flat_map(move |(place, result)| match result {
            Ok(responses) => responses
                .map(move |item| {
                    // The place is given back when this step's stream is dropped.
                    let _place = &place;
                    match item {
                        Ok(StreamedResponse { response, last }) => event(response.map(Ok), last),
                        Err(e) => event(Some(Err(e)), false),
                    }
                })
                .boxed(),
            Err(e) => stream::once(std::future::ready(event(Some(Err(e)), true))).boxed(),
        });
        responses
            .chain(stream::once(std::future::ready(event(None, true))))
            .boxed()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::ensemble::limit::StepLimits;
    use crate::ensemble::origin::{Origin, Origins};
    use crate::ensemble::plan::PlanStep;

    use nereid_test_support::{int32_1d as ints, ints as values};

    fn step(model: &str, input: (&str, &str), output: (&str, &str)) -> PlanStep {
        PlanStep::wired(model, &[input], &[output], &[])
    }

    /// IN -> repeat (decoupled: one response per element) -> R -> double -> OUT.
    fn plan() -> Arc<EnsemblePlan> {
        Arc::new(EnsemblePlan {
            name: "e".into(),
            steps: vec![
                step("repeat", ("IN", "IN"), ("OUT", "R")),
                step("double", ("x", "R"), ("y", "OUT")),
            ],
            order: vec![0, 1],
            limits: StepLimits::unlimited(),
            origins: Origins {
                steps: vec![Origin::Request, Origin::Step(0)],
                decoupled_steps: vec![true, false],
            },
        })
    }

    fn response(model: &str, tensor: Tensor) -> ServiceResult<StreamedResponse> {
        Ok(StreamedResponse {
            response: Some(InferResponse {
                model_name: model.into(),
                outputs: vec![tensor],
                ..Default::default()
            }),
            last: false,
        })
    }

    fn marked_last(mut item: ServiceResult<StreamedResponse>) -> ServiceResult<StreamedResponse> {
        if let Ok(r) = &mut item {
            r.last = true;
        }
        item
    }

    /// repeat and double as stream functions, each sending its final flag with its last
    /// response; `fail_on`: double fails for this value.
    fn models(fail_on: Option<i32>, log: Arc<Mutex<Vec<String>>>) -> StepStream {
        Arc::new(move |r: InferRequest| {
            log.lock().unwrap().push(r.model_name.clone());
            let input = values(&r.inputs[0]);
            let model = r.model_name.clone();
            async move {
                let items: Vec<ServiceResult<StreamedResponse>> = match model.as_str() {
                    "repeat" => {
                        let mut items: Vec<_> = input
                            .iter()
                            .map(|v| response("repeat", ints("OUT", &[*v])))
                            .collect();
                        match items.pop() {
                            Some(item) => items.push(marked_last(item)),
                            None => items.push(Ok(StreamedResponse {
                                response: None,
                                last: true,
                            })),
                        }
                        items
                    }
                    _ if fail_on == Some(input[0]) => {
                        vec![Err(ServiceError::invalid("bad value"))]
                    }
                    _ => vec![marked_last(response(
                        "double",
                        ints("y", &input.iter().map(|v| v * 2).collect::<Vec<_>>()),
                    ))],
                };
                Ok(stream::iter(items).boxed())
            }
            .boxed()
        })
    }

    fn request(values: &[i32]) -> EnsembleRequest {
        EnsembleRequest {
            id: "r1".into(),
            inputs: vec![ints("IN", values)],
            outputs: vec!["OUT".into()],
            ..Default::default()
        }
    }

    async fn collect(values: &[i32], fail_on: Option<i32>) -> Vec<ServiceResult<EnsembleStreamed>> {
        let log = Arc::new(Mutex::new(Vec::new()));
        execute_stream(plan(), request(values), models(fail_on, log))
            .collect()
            .await
    }

    fn answers(items: &[ServiceResult<EnsembleStreamed>]) -> Vec<(Option<Vec<i32>>, bool)> {
        items
            .iter()
            .map(|i| {
                let i = i.as_ref().unwrap();
                (i.outputs.as_ref().map(|o| values(&o[0])), i.last)
            })
            .collect()
    }

    #[tokio::test]
    async fn every_decoupled_response_runs_the_next_step_and_the_last_is_final() {
        let items = answers(&collect(&[1, 2, 3], None).await);
        // The doubles run concurrently: any order, the last one out carries the final flag.
        let mut values: Vec<i32> = items.iter().map(|(o, _)| o.as_ref().unwrap()[0]).collect();
        values.sort_unstable();
        assert_eq!(values, [2, 4, 6]);
        let flags: Vec<bool> = items.iter().map(|(_, last)| *last).collect();
        assert_eq!(flags, [false, false, true]);
    }

    #[tokio::test]
    async fn a_final_flag_after_the_last_response_goes_out_alone() {
        // repeat sends 1, then its final flag alone, released only once double answered: when
        // [2] is complete repeat is still running, so the stream ends with a flag-only item.
        let answered = Arc::new(tokio::sync::Notify::new());
        let step: StepStream = Arc::new(move |r: InferRequest| {
            let answered = answered.clone();
            async move {
                if r.model_name == "repeat" {
                    let flag = async move {
                        answered.notified().await;
                        Ok(StreamedResponse {
                            response: None,
                            last: true,
                        })
                    };
                    let first = response("repeat", ints("OUT", &[1]));
                    Ok(stream::once(std::future::ready(first))
                        .chain(flag.into_stream())
                        .boxed())
                } else {
                    let doubled = marked_last(response("double", ints("y", &[2])));
                    Ok(stream::once(async move {
                        answered.notify_one();
                        doubled
                    })
                    .boxed())
                }
            }
            .boxed()
        });
        let items: Vec<_> = execute_stream(plan(), request(&[1]), step).collect().await;
        assert_eq!(answers(&items), vec![(Some(vec![2]), false), (None, true)]);
    }

    #[tokio::test]
    async fn no_response_is_a_flag_only_final_item() {
        let items = collect(&[], None).await;
        assert_eq!(answers(&items), vec![(None, true)]);
    }

    #[tokio::test]
    async fn a_failing_step_ends_the_stream_with_its_error_and_no_final_flag() {
        // double fails on 2; 1 and 3 may or may not have run by then (steps run concurrently),
        // but whatever was complete goes out before the error, and nothing after it.
        let items = collect(&[1, 2, 3], Some(2)).await;
        let (last, before) = items.split_last().unwrap();
        assert_eq!(
            last,
            &Err(ServiceError::InvalidArgument(
                "ensemble 'e' step 1 (model 'double'): bad value".into()
            ))
        );
        for (outputs, last) in answers(before) {
            assert!(!last, "no final flag on a failed request");
            assert!(matches!(outputs.as_deref(), Some([2] | [6])), "{outputs:?}");
        }
    }

    #[tokio::test]
    async fn after_a_failure_no_step_starts() {
        // repeat fails after its first response: double runs on 1 (already started or not, it
        // never starts once the failure is known), the error ends the stream.
        let log = Arc::new(Mutex::new(Vec::new()));
        let calls = log.clone();
        let step: StepStream = Arc::new(move |r: InferRequest| {
            calls.lock().unwrap().push(r.model_name.clone());
            let model = r.model_name.clone();
            let input = values(&r.inputs[0]);
            async move {
                let items = if model == "repeat" {
                    vec![
                        response("repeat", ints("OUT", &[1])),
                        Err(ServiceError::invalid("refused")),
                        response("repeat", ints("OUT", &[3])),
                    ]
                } else {
                    vec![response("double", ints("y", &[input[0] * 2]))]
                };
                Ok(stream::iter(items).boxed())
            }
            .boxed()
        });
        let items: Vec<_> = execute_stream(plan(), request(&[1, 2, 3]), step)
            .collect()
            .await;
        assert!(matches!(
            items.last(),
            Some(Err(ServiceError::InvalidArgument(_)))
        ));
        let doubled = log
            .lock()
            .unwrap()
            .iter()
            .filter(|m| *m == "double")
            .count();
        assert!(doubled <= 1, "double ran {doubled} times after the failure");
    }

    #[tokio::test]
    async fn dropping_the_stream_drops_the_running_steps() {
        // repeat never answers; the stream is dropped after its first poll.
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let tx = Arc::new(Mutex::new(Some(tx)));
        let step: StepStream = Arc::new(move |_r| {
            let tx = tx.clone();
            async move {
                let guard = DropSignal(tx.lock().unwrap().take());
                Ok(stream::pending::<ServiceResult<StreamedResponse>>()
                    .map(move |i| {
                        let _ = &guard;
                        i
                    })
                    .boxed())
            }
            .boxed()
        });
        let mut s = execute_stream(plan(), request(&[1]), step);
        assert!(
            futures::poll!(s.next()).is_pending(),
            "nothing to answer yet"
        );
        drop(s);
        tokio::time::timeout(std::time::Duration::from_secs(10), rx)
            .await
            .expect("the running step was not dropped")
            .unwrap();
    }

    struct DropSignal(Option<tokio::sync::oneshot::Sender<()>>);

    impl Drop for DropSignal {
        fn drop(&mut self) {
            if let Some(tx) = self.0.take() {
                let _ = tx.send(());
            }
        }
    }
}
