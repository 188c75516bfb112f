//! Ragged batching through the engine with a mock instance that sums each request's part of a
//! ragged input from the generated INDEX (`BATCH_ACCUMULATED_ELEMENT_COUNT`) and doubles the
//! input as a scattered batch output. Requests of different lengths, queued behind a busy
//! instance held at a [`Gate`], must form one execution and each get their own answers.

use std::pin::pin;
use std::sync::Arc;

use bytes::Bytes;
use futures::poll;
use nereid_proto::{DataType, Tensor};
use nereid_test_support::Gate;

use super::valid_config;
use crate::backend::{BackendError, BackendInstance, BatchInputs};
use crate::request_check::ValidRequest;
use crate::scheduler::policy::BatchPolicy;
use crate::scheduler::{JobResult, Scheduler};
use crate::stats::VersionStats;

const CONFIG: &str = r#"name: "m" backend: "identity" max_batch_size: 8
    input [{name: "x" data_type: TYPE_INT32 dims: [-1] allow_ragged_batch: true}]
    output [{name: "sum" data_type: TYPE_INT32 dims: [1]},
            {name: "doubled" data_type: TYPE_INT32 dims: [-1]}]
    batch_input [{kind: BATCH_ACCUMULATED_ELEMENT_COUNT target_name: "INDEX"
                  data_type: TYPE_INT32 source_input: "x"}]
    batch_output [{kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: "doubled" source_input: "x"}]
    dynamic_batching { }"#;

fn ints(t: &Tensor) -> Vec<i32> {
    t.data()
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn int32s(name: &str, shape: Vec<i64>, v: &[i32]) -> Tensor {
    let data: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    Tensor::new(name, DataType::Int32, shape, Bytes::from(data)).unwrap()
}

/// Waits at its gate under the first value of `x`, then answers `sum` [requests, 1] and
/// `doubled` [elements], logging the shapes it was given.
struct RaggedSum {
    gate: Gate<i32>,
}

impl BackendInstance for RaggedSum {
    fn execute(
        &mut self,
        inputs: &BatchInputs<'_>,
        outputs: &[String],
    ) -> Result<Vec<Tensor>, BackendError> {
        let inputs = inputs.joined()?;
        let [x, index] = inputs.as_slice() else {
            panic!("expected x and INDEX, got {inputs:?}");
        };
        assert_eq!((x.name(), index.name()), ("x", "INDEX"));
        assert_eq!(x.shape().len(), 1, "a ragged input reaches the model flat");
        let (x, ends) = (ints(x), ints(index));
        self.gate.pass(x[0]);
        let mut start = 0usize;
        let sums: Vec<i32> = ends
            .iter()
            .map(|&end| {
                let s = x[start..end as usize].iter().sum();
                start = end as usize;
                s
            })
            .collect();
        let doubled: Vec<i32> = x.iter().map(|v| v * 2).collect();
        assert_eq!(outputs, ["sum", "doubled"]);
        Ok(vec![
            int32s("sum", vec![sums.len() as i64, 1], &sums),
            int32s("doubled", vec![doubled.len() as i64], &doubled),
        ])
    }
}

fn request(values: &[i32]) -> ValidRequest {
    ValidRequest {
        inputs: vec![int32s("x", vec![1, values.len() as i64], values)],
        outputs: vec!["sum".into(), "doubled".into()],
        batch_size: 1,
        ..Default::default()
    }
}

/// `(sum, shape of doubled, doubled)` of an answer.
fn answer(result: JobResult) -> (Vec<i32>, Vec<i64>, Vec<i32>) {
    let tensors = result.outputs.unwrap().tensors;
    let [sum, doubled] = tensors.as_slice() else {
        panic!("two outputs expected, got {tensors:?}");
    };
    (ints(sum), doubled.shape().to_vec(), ints(doubled))
}

#[tokio::test]
async fn requests_of_different_lengths_form_one_batch_and_get_their_own_parts() {
    let config = valid_config(CONFIG);
    let stats = Arc::new(VersionStats::default());
    let gate = Gate::new();
    let instance = Box::new(RaggedSum { gate: gate.clone() }) as Box<dyn BackendInstance>;
    let s = Scheduler::start(
        "m",
        BatchPolicy::from_config(&config),
        vec![("m_0".into(), instance)],
        Vec::new(),
        stats.clone(),
        64,
    )
    .unwrap();

    let mut busy = pin!(s.submit(request(&[100])));
    assert!(poll!(&mut busy).is_pending());
    assert_eq!(gate.arrival().await, 100);
    // Queued while the only instance is busy: lengths 2, 3 and 1.
    let parts: [&[i32]; 3] = [&[1, 2], &[3, 4, 5], &[6]];
    let mut waiting: Vec<_> = parts
        .iter()
        .map(|p| Box::pin(s.submit(request(p))))
        .collect();
    for w in &mut waiting {
        assert!(poll!(w).is_pending());
    }
    gate.release(1);
    gate.release(100);
    assert_eq!(
        answer(busy.await.unwrap()),
        (vec![100], vec![1, 1], vec![200])
    );
    let mut answers = Vec::new();
    for w in waiting {
        answers.push(answer(w.await.unwrap()));
    }
    assert_eq!(
        answers,
        [
            (vec![3], vec![1, 2], vec![2, 4]),
            (vec![12], vec![1, 3], vec![6, 8, 10]),
            (vec![6], vec![1, 1], vec![12]),
        ]
    );
    assert_eq!(
        gate.history(),
        [100, 1],
        "the three waiting requests ran as one batch"
    );
    assert_eq!(stats.snapshot("m", 1).execution_count, 2);
}
