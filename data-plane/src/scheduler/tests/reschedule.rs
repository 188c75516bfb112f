//! Request rescheduling (Triton's `TRITONSERVER_REQUEST_RELEASE_RESCHEDULE`) through the engine's
//! threads, with a mock request-level instance that acts like an iterative Python model: it
//! hands each request back until the request has run INPUT times, then answers it with the
//! number of runs (a streamed request also gets one stream response per run). Every run waits
//! at a [`Gate`] under its run number and is logged, so tests see which key, correlation id,
//! flags and generated inputs each run got. The slot decisions under it are tested in
//! `sequence/slots/tests.rs`.

use std::collections::HashMap;
use std::pin::pin;
use std::sync::Arc;

use futures::poll;
use nereid_proto::{CorrelationId, ServiceError, Tensor};
use nereid_test_support::Gate;
use parking_lot::Mutex;

use super::valid_config;
use crate::backend::{
    BackendError, BackendInstance, BatchInputs, ModelResponse, Phases, RESCHEDULE_UNSUPPORTED,
    RequestOutcome, RequestView, StreamEvent,
};
use crate::request_check::{SequenceFlags, ValidRequest};
use crate::scheduler::policy::BatchPolicy;
use crate::scheduler::{JobResult, Scheduler};
use crate::stats::VersionStats;

/// What one run saw of its request.
#[derive(Clone, Debug, PartialEq)]
struct Run {
    key: u64,
    correlation_id: Option<CorrelationId>,
    flags: u32,
    /// The START control's value, when the model has one.
    start: Option<i32>,
    /// Names of the inputs, in order.
    inputs: Vec<String>,
}

type Log = Arc<Mutex<Vec<Run>>>;

/// Reschedules each request until it has run INPUT times.
struct Iterating {
    gate: Gate<usize>,
    log: Log,
    runs: HashMap<u64, i32>,
}

fn int32(name: &str, v: i32) -> Tensor {
    nereid_test_support::int32_1d(name, &[v])
}

fn value(t: &Tensor) -> i32 {
    nereid_test_support::ints(t)[0]
}

impl BackendInstance for Iterating {
    fn execute(&mut self, _: &BatchInputs<'_>, _: &[String]) -> Result<Vec<Tensor>, BackendError> {
        unreachable!("request-level")
    }

    fn request_level(&self) -> bool {
        true
    }

    fn execute_requests(
        &mut self,
        requests: &[RequestView<'_>],
        _phases: &mut Phases,
    ) -> Result<Vec<RequestOutcome>, BackendError> {
        let mut outcomes = Vec::new();
        for r in requests {
            let get = |name: &str| r.inputs.iter().find(|t| t.name() == name).map(value);
            self.log.lock().push(Run {
                key: r.key,
                correlation_id: r.correlation_id.cloned(),
                flags: r.flags,
                start: get("START"),
                inputs: r.inputs.iter().map(|t| t.name().to_string()).collect(),
            });
            let runs = self.runs.entry(r.key).or_default();
            *runs += 1;
            let runs = *runs;
            let run = self.log.lock().len();
            self.gate.pass(run);
            let out = ModelResponse::from(vec![int32("OUTPUT", runs)]);
            if let Some(stream) = r.stream {
                let _ = stream.send(StreamEvent::Response(Ok(out.clone())));
            }
            outcomes.push(if runs < get("INPUT").unwrap() {
                RequestOutcome::Rescheduled
            } else {
                self.runs.remove(&r.key);
                RequestOutcome::Answered(Ok(out))
            });
        }
        Ok(outcomes)
    }
}

/// Model "m" (INT32 INPUT, OUTPUT, `max_batch_size` 0, one instance) with `batching`.
fn scheduler(batching: &str, gate: Gate<usize>) -> (Scheduler, Log) {
    let config = valid_config(&format!(
        r#"name: "m" backend: "python"
           input [{{name: "INPUT" data_type: TYPE_INT32 dims: [1]}}]
           output [{{name: "OUTPUT" data_type: TYPE_INT32 dims: [1]}}]
           {batching}"#
    ));
    let log = Log::default();
    let instance = Iterating {
        gate,
        log: log.clone(),
        runs: HashMap::new(),
    };
    let s = Scheduler::start(
        "m",
        BatchPolicy::from_config(&config),
        vec![("m_0".into(), Box::new(instance) as Box<dyn BackendInstance>)],
        Vec::new(),
        Arc::new(VersionStats::default()),
        64,
    )
    .unwrap();
    (s, log)
}

const ITERATIVE: &str = r#"sequence_batching {
    iterative_sequence: true
    control_input [{name: "START" control [{kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1]}]}]
}"#;

/// A request that wants `runs` runs, without a correlation id.
fn request(runs: i32) -> ValidRequest {
    ValidRequest {
        inputs: vec![int32("INPUT", runs)],
        outputs: vec!["OUTPUT".into()],
        batch_size: 1,
        ..Default::default()
    }
}

fn output(r: Result<JobResult, ServiceError>) -> i32 {
    value(&r.unwrap().outputs.unwrap().tensors[0])
}

#[tokio::test]
async fn a_rescheduled_request_runs_again_in_its_sequence_until_the_model_releases_it() {
    let (s, log) = scheduler(ITERATIVE, Gate::opened());
    assert_eq!(
        output(s.submit(request(3)).await),
        3,
        "answered by its last run"
    );
    let runs = log.lock().clone();
    assert_eq!(runs.len(), 3);
    let id = runs[0]
        .correlation_id
        .clone()
        .expect("an id given by the server");
    for (n, run) in runs.iter().enumerate() {
        assert_eq!(run.key, runs[0].key, "run {n}: the same request");
        assert_eq!(
            run.correlation_id.as_ref(),
            Some(&id),
            "run {n}: its sequence"
        );
        // START on the first run only (Triton: a rescheduled request is neither START nor END).
        let first = n == 0;
        assert_eq!(run.flags, u32::from(first), "run {n}");
        assert_eq!(run.start, Some(i32::from(first)), "run {n}");
        assert_eq!(
            run.inputs,
            ["INPUT", "START"],
            "run {n}: controls made anew, once"
        );
    }
    // Released: the next request is a sequence of its own, started anew.
    assert_eq!(output(s.submit(request(1)).await), 1);
    let last = log.lock().last().cloned().unwrap();
    assert_ne!(last.correlation_id.as_ref(), Some(&id));
    assert_eq!((last.flags, last.start), (1, Some(1)));
}

#[tokio::test]
async fn a_request_with_its_own_id_keeps_it_and_ends_its_sequence_when_released() {
    let (s, log) = scheduler(ITERATIVE, Gate::opened());
    let mut r = request(2);
    r.sequence = Some(SequenceFlags {
        id: CorrelationId::Uint(77),
        start: true,
        end: false,
    });
    assert_eq!(output(s.submit(r).await), 2);
    let ids: Vec<_> = log
        .lock()
        .iter()
        .map(|r| r.correlation_id.clone())
        .collect();
    assert_eq!(
        ids,
        [Some(CorrelationId::Uint(77)), Some(CorrelationId::Uint(77))]
    );
    let mut next = request(1);
    next.sequence = Some(SequenceFlags {
        id: CorrelationId::Uint(77),
        start: false,
        end: false,
    });
    let e = s.submit(next).await.unwrap_err();
    assert!(e.message().contains("must specify the START flag"), "{e:?}");
}

#[tokio::test]
async fn a_slot_waits_for_the_rescheduled_request_and_is_freed_after_it() {
    // One slot: the second sequence waits until the first request is released.
    let gate = Gate::new();
    let (s, log) = scheduler(ITERATIVE, gate.clone());
    let mut a = pin!(s.submit(request(2)));
    let mut b = pin!(s.submit(request(1)));
    assert!(poll!(&mut a).is_pending() && poll!(&mut b).is_pending());
    assert_eq!(gate.arrival().await, 1);
    gate.release(1);
    assert_eq!(
        gate.arrival().await,
        2,
        "the rescheduled request runs before the waiting one"
    );
    let keys: Vec<u64> = log.lock().iter().map(|r| r.key).collect();
    assert_eq!(keys[1], keys[0]);
    gate.release(2);
    assert_eq!(gate.arrival().await, 3);
    gate.release(3);
    assert_eq!((output(a.await), output(b.await)), (2, 1));
}

#[tokio::test]
async fn a_streamed_request_whose_client_left_is_not_run_again() {
    let gate = Gate::new();
    let (s, log) = scheduler(ITERATIVE, gate.clone());
    let (sink, mut events) = tokio::sync::mpsc::unbounded_channel();
    let mut endless = request(i32::MAX);
    endless.stream = Some(sink);
    let mut a = pin!(s.submit(endless));
    assert!(poll!(&mut a).is_pending());
    assert_eq!(gate.arrival().await, 1);
    gate.release(1);
    assert_eq!(gate.arrival().await, 2);
    assert!(matches!(
        events.recv().await,
        Some(StreamEvent::Response(Ok(_)))
    ));
    // The client goes away during the second run: the loop stops there.
    drop(events);
    gate.release(2);
    let r = a.await;
    assert!(matches!(r, Err(ServiceError::Cancelled(_))), "{r:?}");
    // Its slot is free: the next request runs (and no third run of the first happened).
    gate.open();
    assert_eq!(output(s.submit(request(1)).await), 1);
    let keys: Vec<u64> = log.lock().iter().map(|r| r.key).collect();
    assert_eq!(keys.len(), 3);
    assert_ne!(keys[2], keys[0]);
}

#[tokio::test]
async fn rescheduling_where_nothing_runs_a_request_again_answers_tritons_error() {
    for batching in [
        "",
        "dynamic_batching {}",
        "sequence_batching { direct {} }",
        "sequence_batching { oldest {} }",
    ] {
        let (s, log) = scheduler(batching, Gate::opened());
        let mut r = request(2);
        if batching.starts_with("sequence") {
            r.sequence = Some(SequenceFlags {
                id: CorrelationId::Uint(1),
                start: true,
                end: false,
            });
        }
        let outputs = s.submit(r).await.unwrap().outputs;
        assert_eq!(
            outputs,
            Err(BackendError::InvalidInput(RESCHEDULE_UNSUPPORTED.into())),
            "{batching}"
        );
        assert_eq!(log.lock().len(), 1, "{batching}: ran once");
    }
}
