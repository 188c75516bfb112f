//! The sequence batcher with a mock accumulator instance: per row, `OUTPUT = INPUT +
//! (START ? 0 : STATE_IN)`, `STATE_OUT = OUTPUT`, and it echoes the START / END / CORRID controls.
//! Every execution logs its rows' (correlation id, READY), so tests see how batches were formed
//! and padded, and waits at a [`Gate`] under its first ready row's INPUT, so a test holds a
//! request running (an open gate: no waits).
//! These are end-to-end: state, controls and messages through the engine's threads. The batching
//! decisions themselves (slots, backlog, oldest batches, idle release) are tested without threads
//! or sleeps beside the code, in `sequence/slots/tests.rs`.

use std::pin::pin;
use std::sync::Arc;

use bytes::Bytes;
use futures::poll;
use nereid_proto::{CorrelationId, DataType, ServiceError, Tensor};
use nereid_test_support::Gate;
use parking_lot::Mutex;

use super::valid_config;
use crate::backend::{BackendError, BackendInstance, BatchInputs};
use crate::request_check::{SequenceFlags, ValidRequest};
use crate::scheduler::policy::BatchPolicy;
use crate::scheduler::{JobResult, Scheduler};
use crate::stats::VersionStats;

type Log = Arc<Mutex<Vec<Vec<(u64, i64)>>>>;

struct Accumulator {
    gate: Gate<i64>,
    log: Log,
}

fn ints(t: &Tensor) -> Vec<i64> {
    match t.datatype() {
        DataType::Int32 => t
            .data()
            .chunks_exact(4)
            .map(|c| i64::from(i32::from_le_bytes(c.try_into().unwrap())))
            .collect(),
        DataType::Uint64 => t
            .data()
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()) as i64)
            .collect(),
        other => panic!("unexpected {other}"),
    }
}

fn int32s(name: &str, v: &[i64]) -> Tensor {
    let data: Vec<u8> = v.iter().flat_map(|&x| (x as i32).to_le_bytes()).collect();
    Tensor::new(
        name,
        DataType::Int32,
        vec![v.len() as i64, 1],
        Bytes::from(data),
    )
    .unwrap()
}

impl BackendInstance for Accumulator {
    fn execute(
        &mut self,
        inputs: &BatchInputs<'_>,
        outputs: &[String],
    ) -> Result<Vec<Tensor>, BackendError> {
        let inputs = inputs.joined()?;
        let get = |name: &str| {
            inputs
                .iter()
                .find(|t| t.name() == name)
                .map(ints)
                .ok_or_else(|| BackendError::InvalidInput(format!("no {name}")))
        };
        let (input, start, end, corrid, state) = (
            get("INPUT")?,
            get("START")?,
            get("END")?,
            get("CORRID")?,
            get("STATE_IN")?,
        );
        let ready = get("READY")?;
        if let Some(k) = ready.iter().position(|&r| r == 1) {
            self.gate.pass(input[k]);
        }
        self.log
            .lock()
            .push(corrid.iter().map(|&c| c as u64).zip(ready).collect());
        let sum: Vec<i64> = (0..input.len())
            .map(|i| input[i] + if start[i] == 1 { 0 } else { state[i] })
            .collect();
        outputs
            .iter()
            .map(|name| match name.as_str() {
                "OUTPUT" | "STATE_OUT" => Ok(int32s(name, &sum)),
                "START_OUT" => Ok(int32s(name, &start)),
                "END_OUT" => Ok(int32s(name, &end)),
                other => Err(BackendError::InvalidInput(format!(
                    "unexpected output {other}"
                ))),
            })
            .collect()
    }
}

const CONTROLS: &str = r#"
    max_sequence_idle_microseconds: 200000
    control_input [
      {name: "START" control [{kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1]}]},
      {name: "END" control [{kind: CONTROL_SEQUENCE_END int32_false_true: [0, 1]}]},
      {name: "READY" control [{kind: CONTROL_SEQUENCE_READY int32_false_true: [0, 1]}]},
      {name: "CORRID" control [{kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64}]}
    ]
    state [{input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_INT32 dims: [1]}]"#;

fn scheduler(
    max_batch: usize,
    strategy: &str,
    instances: usize,
    gate: Gate<i64>,
) -> (Arc<Scheduler>, Log) {
    let config = valid_config(&format!(
        r#"name: "m" backend: "identity" max_batch_size: {max_batch}
           input [{{name: "INPUT" data_type: TYPE_INT32 dims: [1]}}]
           output [{{name: "OUTPUT" data_type: TYPE_INT32 dims: [1]}},
                   {{name: "START_OUT" data_type: TYPE_INT32 dims: [1]}},
                   {{name: "END_OUT" data_type: TYPE_INT32 dims: [1]}}]
           sequence_batching {{ {strategy} {CONTROLS} }}"#
    ));
    let log = Log::default();
    let instances = (0..instances)
        .map(|i| {
            let instance = Accumulator {
                gate: gate.clone(),
                log: log.clone(),
            };
            (
                format!("m_{i}"),
                Box::new(instance) as Box<dyn BackendInstance>,
            )
        })
        .collect();
    let s = Scheduler::start(
        "m",
        BatchPolicy::from_config(&config),
        instances,
        Vec::new(),
        Arc::new(VersionStats::default()),
        64,
    )
    .unwrap();
    (Arc::new(s), log)
}

fn request(id: u64, value: i64, start: bool, end: bool) -> ValidRequest {
    ValidRequest {
        inputs: vec![int32s("INPUT", &[value])],
        outputs: vec!["OUTPUT".into(), "START_OUT".into(), "END_OUT".into()],
        batch_size: 1,
        sequence: Some(SequenceFlags {
            id: CorrelationId::Uint(id),
            start,
            end,
        }),
        ..Default::default()
    }
}

/// (OUTPUT, START seen by the model, END seen by the model)
fn values(r: Result<JobResult, ServiceError>) -> (i64, i64, i64) {
    let outputs = r.unwrap().outputs.unwrap().tensors;
    assert_eq!(
        outputs.len(),
        3,
        "the state output must not be returned unless requested"
    );
    (
        ints(&outputs[0])[0],
        ints(&outputs[1])[0],
        ints(&outputs[2])[0],
    )
}

#[tokio::test]
async fn interleaved_sequences_keep_their_own_state_and_controls() {
    let (s, _) = scheduler(4, "", 1, Gate::opened());
    assert_eq!(
        values(s.submit(request(1, 10, true, false)).await),
        (10, 1, 0)
    );
    assert_eq!(
        values(s.submit(request(2, 100, true, false)).await),
        (100, 1, 0)
    );
    assert_eq!(
        values(s.submit(request(1, 5, false, false)).await),
        (15, 0, 0)
    );
    assert_eq!(
        values(s.submit(request(2, 1, false, true)).await),
        (101, 0, 1)
    );
    assert_eq!(
        values(s.submit(request(1, 1, false, true)).await),
        (16, 0, 1)
    );
}

#[tokio::test]
async fn requests_of_a_sequence_run_in_order_one_at_a_time() {
    for strategy in ["direct { }", "oldest { max_candidate_sequences: 4 }"] {
        let gate = Gate::new();
        let (s, log) = scheduler(4, strategy, 2, gate.clone());
        let mut a = pin!(s.submit(request(7, 1, true, false)));
        let mut b = pin!(s.submit(request(7, 2, false, false)));
        let mut c = pin!(s.submit(request(7, 3, false, true)));
        assert!(poll!(&mut a).is_pending() && poll!(&mut b).is_pending());
        assert!(poll!(&mut c).is_pending());
        // Each request runs alone, and the next one of the sequence stays queued while it
        // runs, although the second instance is idle.
        for (value, queued) in [(1, 2), (2, 1), (3, 0)] {
            assert_eq!(gate.arrival().await, value, "{strategy}");
            assert_eq!(s.queue_depth(), queued, "{strategy}: while {value} runs");
            gate.release(value);
        }
        assert_eq!(
            (values(a.await).0, values(b.await).0, values(c.await).0),
            (1, 3, 6),
            "{strategy}"
        );
        assert!(
            log.lock().iter().all(|batch| batch.len() == 1),
            "{strategy}: one request per sequence per batch"
        );
    }
}

#[tokio::test]
async fn a_sequence_must_start_and_ends_with_end() {
    let (s, _) = scheduler(4, "", 1, Gate::opened());
    let e = s.submit(request(3, 1, false, false)).await.unwrap_err();
    assert_eq!(
        e.message(),
        "inference request for sequence 3 to model 'm' must specify the START flag on the first request of the sequence"
    );
    values(s.submit(request(3, 1, true, true)).await);
    let e = s.submit(request(3, 1, false, false)).await.unwrap_err();
    assert!(matches!(e, ServiceError::InvalidArgument(_)), "{e:?}");
    let mut no_id = request(3, 1, true, false);
    no_id.sequence = None;
    let e = s.submit(no_id).await.unwrap_err();
    assert_eq!(
        e.message(),
        "inference request to model 'm' must specify a non-zero or non-empty correlation ID"
    );
}

#[tokio::test]
async fn a_new_start_restarts_a_live_sequence() {
    let (s, _) = scheduler(4, "", 1, Gate::opened());
    values(s.submit(request(4, 10, true, false)).await);
    assert_eq!(values(s.submit(request(4, 1, true, false)).await).0, 1);
    assert_eq!(values(s.submit(request(4, 1, false, false)).await).0, 2);
}

#[tokio::test]
async fn a_string_id_is_refused_by_an_integer_corrid_control() {
    let (s, _) = scheduler(1, "", 1, Gate::opened());
    let mut r = request(0, 1, true, false);
    r.sequence = Some(SequenceFlags {
        id: CorrelationId::String("abc".into()),
        start: true,
        end: false,
    });
    let e = s.submit(r).await.unwrap_err();
    assert!(matches!(e, ServiceError::InvalidArgument(_)), "{e:?}");
}

#[tokio::test]
async fn refusing_the_queue_answers_waiting_requests_and_lets_the_running_one_finish() {
    for strategy in ["direct { }", "oldest { max_candidate_sequences: 4 }"] {
        let gate = Gate::new();
        let (s, _) = scheduler(4, strategy, 1, gate.clone());
        let mut a = pin!(s.submit(request(7, 1, true, false)));
        let mut b = pin!(s.submit(request(7, 2, false, false)));
        let mut c = pin!(s.submit(request(7, 3, false, true)));
        assert!(poll!(&mut a).is_pending() && poll!(&mut b).is_pending());
        assert!(poll!(&mut c).is_pending());
        assert_eq!(
            gate.arrival().await,
            1,
            "{strategy}: the first request runs"
        );
        assert_eq!(s.queue_depth(), 2, "{strategy}");
        let refused = s.refuse_queued("model 'm' version 1 is unloading");
        assert_eq!(refused, 2, "{strategy}");
        gate.release(1);
        assert_eq!(
            values(a.await).0,
            1,
            "{strategy}: the running request finishes"
        );
        assert_eq!(
            gate.history(),
            [1],
            "{strategy}: the refused requests never ran"
        );
        for r in [b.await, c.await] {
            assert!(
                matches!(&r, Err(ServiceError::Unavailable(m)) if m == "model 'm' version 1 is unloading"),
                "{strategy}: {r:?}"
            );
        }
    }
}

#[tokio::test]
async fn direct_pads_the_slots_before_the_highest_with_not_ready_requests() {
    let (s, log) = scheduler(4, "", 1, Gate::opened());
    // Sequences 1, 2 and 3 take slots 0, 1 and 2; 1 ends, freeing slot 0.
    values(s.submit(request(1, 10, true, false)).await);
    values(s.submit(request(2, 20, true, false)).await);
    values(s.submit(request(3, 30, true, false)).await);
    values(s.submit(request(1, 1, false, true)).await);
    // Sequence 3 alone has work: it runs in slot 2 behind two dummies (READY false, CORRID 0),
    // and its answer and state are its own.
    assert_eq!(values(s.submit(request(3, 5, false, false)).await).0, 35);
    assert_eq!(
        log.lock().last().unwrap(),
        &vec![(0, 0), (0, 0), (3, 1)],
        "slot positions kept with dummies"
    );
    // Slot 0 never needs padding; slot 1 gets one dummy before it.
    assert_eq!(values(s.submit(request(2, 2, false, false)).await).0, 22);
    assert_eq!(log.lock().last().unwrap(), &vec![(0, 0), (2, 1)]);
    assert_eq!(values(s.submit(request(3, 5, false, true)).await).0, 40);
}

#[tokio::test]
async fn oldest_never_pads() {
    let (s, log) = scheduler(
        4,
        "oldest { max_candidate_sequences: 4 }",
        1,
        Gate::opened(),
    );
    values(s.submit(request(1, 10, true, false)).await);
    values(s.submit(request(2, 20, true, false)).await);
    assert_eq!(values(s.submit(request(2, 1, false, true)).await).0, 21);
    assert_eq!(log.lock().last().unwrap(), &vec![(2, 1)]);
}

#[tokio::test]
async fn direct_waits_for_slot_utilization_and_batches_the_sequences() {
    // Both slots must have work; the delay (60 s) is far beyond the test.
    let strategy =
        "direct { max_queue_delay_microseconds: 60000000 minimum_slot_utilization: 1.0 }";
    let gate = Gate::new();
    let (s, log) = scheduler(2, strategy, 1, gate.clone());
    let mut a = pin!(s.submit(request(1, 10, true, false)));
    assert!(poll!(&mut a).is_pending());
    assert_eq!(
        s.queue_depth(),
        1,
        "the first sequence waits for a second one"
    );
    let mut b = pin!(s.submit(request(2, 20, true, false)));
    assert!(poll!(&mut b).is_pending());
    assert_eq!(gate.arrival().await, 10);
    gate.release(10);
    assert_eq!((values(a.await).0, values(b.await).0), (10, 20));
    assert_eq!(
        log.lock().clone(),
        vec![vec![(1, 1), (2, 1)]],
        "one batch of both"
    );
}

#[tokio::test]
async fn direct_runs_a_lone_sequence_once_the_queue_delay_is_spent() {
    // Utilization is never reached with one sequence: the timer runs it after 20 ms.
    let strategy = "direct { max_queue_delay_microseconds: 20000 minimum_slot_utilization: 1.0 }";
    let (s, log) = scheduler(2, strategy, 1, Gate::opened());
    assert_eq!(values(s.submit(request(1, 10, true, false)).await).0, 10);
    assert_eq!(values(s.submit(request(1, 5, false, true)).await).0, 15);
    assert_eq!(log.lock().clone(), vec![vec![(1, 1)], vec![(1, 1)]]);
}

#[tokio::test]
async fn oldest_preserve_ordering_answers_in_acceptance_order_across_sequences() {
    let strategy = "oldest { max_candidate_sequences: 4 preserve_ordering: true }";
    let gate = Gate::new();
    let (s, _) = scheduler(4, strategy, 2, gate.clone());
    let mut a = pin!(s.submit(request(1, 1, true, false)));
    assert!(poll!(&mut a).is_pending());
    assert_eq!(gate.arrival().await, 1, "sequence 1 runs on one instance");
    let mut b = pin!(s.submit(request(2, 2, true, false)));
    assert!(poll!(&mut b).is_pending());
    assert_eq!(gate.arrival().await, 2, "sequence 2 on the other");
    gate.release(2);
    // Sequence 2's next request runs only once its first has finished and been answered
    // (held back): when it arrives at the gate, the first one is done.
    let mut c = pin!(s.submit(request(2, 3, false, false)));
    assert!(poll!(&mut c).is_pending());
    assert_eq!(gate.arrival().await, 3);
    assert!(
        poll!(&mut b).is_pending(),
        "sequence 2's answer waits for sequence 1's earlier request"
    );
    gate.release(3);
    gate.release(1);
    assert_eq!(values(a.await).0, 1);
    assert_eq!((values(b.await).0, values(c.await).0), (2, 5));
}

#[tokio::test]
async fn iterative_sequence_makes_each_request_a_sequence_of_its_own() {
    let (s, log) = scheduler(4, "iterative_sequence: true", 1, Gate::opened());
    // Without a correlation id: a fresh sequence each, started (START 1, no state carried).
    for value in [3, 4] {
        let mut r = request(0, value, false, false);
        r.sequence = None;
        assert_eq!(values(s.submit(r).await), (value, 1, 0));
    }
    let ids: Vec<u64> = log.lock().iter().map(|b| b.last().unwrap().0).collect();
    assert!(
        ids[0] != 0 && ids[0] != ids[1],
        "ids given by the server: {ids:?}"
    );
    // With one: the sequence ends with its request, so the next must START again.
    values(s.submit(request(9, 1, true, false)).await);
    let e = s.submit(request(9, 1, false, false)).await.unwrap_err();
    assert!(e.message().contains("must specify the START flag"), "{e:?}");
}
