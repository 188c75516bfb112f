//! The scheduler with a gated mock backend instance (it announces the first value of its batch
//! at a [`Gate`] and waits there until the test releases that value, then returns its input):
//! batching across instances, preserve_ordering, queue bounds. The gate, not sleeps, decides
//! what runs when, so each test orders its events exactly.

use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::poll;
use nereid_proto::{DataType, ServiceError, Tensor};
use nereid_test_support::Gate;

use super::valid_config;
use crate::backend::{BackendError, BackendInstance, BatchInputs};
use crate::config::ValidModelConfig;
use crate::request_check::ValidRequest;
use crate::scheduler::Scheduler;
use crate::scheduler::policy::BatchPolicy;
use crate::stats::VersionStats;

/// Waits at its gate under the first value of each batch it executes.
struct Gated(Gate<u32>);

impl BackendInstance for Gated {
    fn execute(
        &mut self,
        inputs: &BatchInputs<'_>,
        outputs: &[String],
    ) -> Result<Vec<Tensor>, BackendError> {
        let inputs = inputs.joined()?;
        let first = inputs[0]
            .data()
            .get(..4)
            .map_or(0, |b| u32::from_le_bytes(b.try_into().unwrap()));
        self.0.pass(first);
        Ok(vec![inputs[0].clone().renamed(outputs[0].clone())])
    }
}

/// A valid config of model "m" (input "x", output "y", both UINT32 [1]) with `batching`.
fn config(batching: &str) -> ValidModelConfig {
    valid_config(&format!(
        r#"name: "m" backend: "identity"
           input [{{name: "x" data_type: TYPE_UINT32 dims: [1]}}]
           output [{{name: "y" data_type: TYPE_UINT32 dims: [1]}}]
           {batching}"#
    ))
}

fn scheduler(batching: &str, instances: usize) -> (Scheduler, Arc<VersionStats>, Gate<u32>) {
    let config = config(batching);
    let stats = Arc::new(VersionStats::default());
    let gate = Gate::new();
    let instances = (0..instances)
        .map(|i| {
            (
                format!("m_{i}"),
                Box::new(Gated(gate.clone())) as Box<dyn BackendInstance>,
            )
        })
        .collect();
    let s = Scheduler::start(
        "m",
        BatchPolicy::from_config(&config),
        instances,
        Vec::new(),
        stats.clone(),
        64,
    )
    .unwrap();
    (s, stats, gate)
}

/// A request whose execution waits at the gate under `key`.
fn request(key: u32) -> ValidRequest {
    let t = Tensor::new(
        "x",
        DataType::Uint32,
        vec![1, 1],
        Bytes::copy_from_slice(&key.to_le_bytes()),
    )
    .unwrap();
    ValidRequest {
        inputs: vec![t],
        outputs: vec!["y".into()],
        batch_size: 1,
        sequence: None,
        ..Default::default()
    }
}

/// Generous: only a broken scheduler ever waits this long.
const STUCK: Duration = Duration::from_secs(30);

#[tokio::test]
async fn preserve_ordering_holds_back_faster_answers() {
    let (s, _, gate) = scheduler(
        "max_batch_size: 1 dynamic_batching { preserve_ordering: true }",
        2,
    );
    let mut slow = pin!(s.submit(request(1)));
    assert!(poll!(&mut slow).is_pending());
    assert_eq!(gate.arrival().await, 1, "the first request runs");
    let mut fast = pin!(s.submit(request(2)));
    assert!(poll!(&mut fast).is_pending());
    assert_eq!(
        gate.arrival().await,
        2,
        "the second runs on the other instance"
    );
    gate.release(2);
    // The instance that ran the second request takes the next one only after it has handed
    // the second one's answer over, so once the third runs, that answer was given or held.
    let mut third = pin!(s.submit(request(3)));
    assert!(poll!(&mut third).is_pending());
    assert_eq!(gate.arrival().await, 3);
    assert!(
        poll!(&mut fast).is_pending(),
        "the second request was answered before the first"
    );
    gate.release(1);
    slow.await.unwrap();
    fast.await.unwrap();
    gate.release(3);
    third.await.unwrap();
}

#[tokio::test]
async fn without_preserve_ordering_the_fast_answer_comes_first() {
    let (s, _, gate) = scheduler("max_batch_size: 1 dynamic_batching { }", 2);
    let mut slow = pin!(s.submit(request(1)));
    assert!(poll!(&mut slow).is_pending());
    assert_eq!(gate.arrival().await, 1);
    gate.release(2);
    // The first request is still held at the gate while the second is answered.
    tokio::time::timeout(STUCK, s.submit(request(2)))
        .await
        .expect("the second answer waited for the first")
        .unwrap();
    assert!(poll!(&mut slow).is_pending());
    gate.release(1);
    slow.await.unwrap();
}

#[tokio::test]
async fn requests_queued_behind_a_busy_instance_form_one_batch() {
    let (s, stats, gate) = scheduler("max_batch_size: 8 dynamic_batching { }", 1);
    let mut busy = pin!(s.submit(request(1)));
    assert!(poll!(&mut busy).is_pending());
    assert_eq!(gate.arrival().await, 1);
    // Queued while the only instance is busy.
    let mut waiting: Vec<_> = (0..4).map(|_| Box::pin(s.submit(request(0)))).collect();
    for w in &mut waiting {
        assert!(poll!(w).is_pending());
    }
    gate.release(0);
    gate.release(1);
    busy.await.unwrap();
    for w in waiting {
        w.await.unwrap();
    }
    assert_eq!(gate.history(), [1, 0], "two executions");
    let snapshot = stats.snapshot("m", 1);
    assert_eq!(snapshot.inference_count, 5);
    assert_eq!(
        snapshot.execution_count, 2,
        "the four waiting requests ran as one batch"
    );
}

#[tokio::test]
async fn a_full_queue_is_an_overload_error() {
    let (s, _, gate) = scheduler(
        "max_batch_size: 1 dynamic_batching { default_queue_policy { max_queue_size: 1 } }",
        1,
    );
    let mut running = pin!(s.submit(request(1)));
    assert!(poll!(&mut running).is_pending());
    assert_eq!(gate.arrival().await, 1);
    let mut queued = pin!(s.submit(request(2)));
    assert!(poll!(&mut queued).is_pending());
    let err = s.submit(request(3)).await.unwrap_err();
    assert!(
        matches!(err, ServiceError::Overloaded(ref m) if m.starts_with("Exceeds maximum queue size")),
        "{err:?}"
    );
    gate.release(1);
    gate.release(2);
    running.await.unwrap();
    queued.await.unwrap();
    assert_eq!(gate.history(), [1, 2], "the refused request never ran");
}
