//! The scheduler with a mock backend instance (sleeps for the number of milliseconds its input
//! holds, returns its input): batching across instances, preserve_ordering, queue bounds.
//! The short sleeps only order submissions; assertions leave wide margins.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use nereid_proto::{DataType, ServiceError, Tensor};

use crate::backend::{BackendError, BackendInstance, BatchInputs};
use crate::config::text::parse_model_config;
use crate::config::{ValidModelConfig, fill_defaults};
use crate::request_check::ValidRequest;
use crate::scheduler::Scheduler;
use crate::scheduler::policy::BatchPolicy;
use crate::stats::VersionStats;

struct Sleepy;

impl BackendInstance for Sleepy {
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
        std::thread::sleep(Duration::from_millis(u64::from(first)));
        Ok(vec![inputs[0].clone().renamed(outputs[0].clone())])
    }
}

/// A valid config of model "m" (input "x", output "y", both UINT32 [1]) with `batching`.
fn config(batching: &str) -> ValidModelConfig {
    let mut wire = parse_model_config(&format!(
        r#"name: "m" backend: "identity"
           input [{{name: "x" data_type: TYPE_UINT32 dims: [1]}}]
           output [{{name: "y" data_type: TYPE_UINT32 dims: [1]}}]
           {batching}"#
    ))
    .unwrap();
    fill_defaults(&mut wire);
    ValidModelConfig::try_from(wire).unwrap()
}

fn scheduler(batching: &str, instances: usize) -> (Scheduler, Arc<VersionStats>) {
    let config = config(batching);
    let stats = Arc::new(VersionStats::default());
    let instances = (0..instances)
        .map(|i| {
            (
                format!("m_{i}"),
                Box::new(Sleepy) as Box<dyn BackendInstance>,
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
    (s, stats)
}

fn request(delay_ms: u32) -> ValidRequest {
    let t = Tensor::new(
        "x",
        DataType::Uint32,
        vec![1, 1],
        Bytes::copy_from_slice(&delay_ms.to_le_bytes()),
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

#[tokio::test]
async fn preserve_ordering_holds_back_faster_answers() {
    let (s, _) = scheduler(
        "max_batch_size: 1 dynamic_batching { preserve_ordering: true }",
        2,
    );
    let s = Arc::new(s);
    let start = Instant::now();
    let slow = tokio::spawn({
        let s = s.clone();
        async move { s.submit(request(300)).await.map(|_| start.elapsed()) }
    });
    // Make sure the slow one is queued first.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let fast = s.submit(request(1)).await.map(|_| start.elapsed()).unwrap();
    assert!(slow.await.unwrap().is_ok());
    // The fast request ran on the second instance at once, but its answer waited for the
    // slow one (300 ms) that arrived before it.
    assert!(
        fast >= Duration::from_millis(290),
        "answered out of order after {fast:?}"
    );
}

#[tokio::test]
async fn without_preserve_ordering_the_fast_answer_comes_first() {
    let (s, _) = scheduler("max_batch_size: 1 dynamic_batching { }", 2);
    let s = Arc::new(s);
    let start = Instant::now();
    let slow = tokio::spawn({
        let s = s.clone();
        async move { s.submit(request(300)).await.map(|_| start.elapsed()) }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    let fast = s.submit(request(1)).await.map(|_| start.elapsed()).unwrap();
    assert!(
        fast < Duration::from_millis(250),
        "the fast answer waited: {fast:?}"
    );
    assert!(slow.await.unwrap().is_ok());
}

#[tokio::test]
async fn requests_queued_behind_a_busy_instance_form_one_batch() {
    let (s, stats) = scheduler("max_batch_size: 8 dynamic_batching { }", 1);
    let s = Arc::new(s);
    let busy = tokio::spawn({
        let s = s.clone();
        async move { s.submit(request(200)).await.is_ok() }
    });
    tokio::time::sleep(Duration::from_millis(30)).await;
    let waiting: Vec<_> = (0..4)
        .map(|_| {
            let s = s.clone();
            tokio::spawn(async move { s.submit(request(0)).await.is_ok() })
        })
        .collect();
    assert!(busy.await.unwrap());
    for w in waiting {
        assert!(w.await.unwrap());
    }
    let snapshot = stats.snapshot("m", 1);
    assert_eq!(snapshot.inference_count, 5);
    assert_eq!(
        snapshot.execution_count, 2,
        "the four waiting requests ran as one batch"
    );
}

#[tokio::test]
async fn a_full_queue_is_an_overload_error() {
    let (s, _) = scheduler(
        "max_batch_size: 1 dynamic_batching { default_queue_policy { max_queue_size: 1 } }",
        1,
    );
    let s = Arc::new(s);
    let running = tokio::spawn({
        let s = s.clone();
        async move { s.submit(request(200)).await.is_ok() }
    });
    tokio::time::sleep(Duration::from_millis(30)).await;
    let queued = tokio::spawn({
        let s = s.clone();
        async move { s.submit(request(0)).await.is_ok() }
    });
    tokio::time::sleep(Duration::from_millis(30)).await;
    let err = s.submit(request(0)).await.unwrap_err();
    assert!(
        matches!(err, ServiceError::Overloaded(ref m) if m.starts_with("Exceeds maximum queue size")),
        "{err:?}"
    );
    assert!(running.await.unwrap() && queued.await.unwrap());
}
