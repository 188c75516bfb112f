//! Ragged batching's pure arithmetic: the `batch_input` tensors of a formed batch, computed from
//! the shapes of the requests' source inputs, and each request's share of a `batch_output`.
//!
//! ```text
//! requests' source shapes [1,3] [1,4] [1,5] ──batch_input_tensor──► ELEMENT_COUNT           [3]: 3 4 5
//!                                                                    ACCUMULATED_ELEMENT_COUNT [3]: 3 7 12
//!                                                                    ..._WITH_ZERO          [4]: 0 3 7 12
//!                                                                    MAX_ELEMENT_COUNT_AS_SHAPE [5] (zeros)
//!                                                                    ITEM_SHAPE           [3,1]: 3 4 5
//!                                                                    ITEM_SHAPE_FLATTEN     [3]: 3 4 5
//! batch_output template [-1,-1] ──scatter_shapes──► per request [1,3] [1,4] [1,5]: consecutive
//!                                                   parts of the batch output
//! ```
//!
//! Element counts are per request (its whole source tensor, batch dimension included); item
//! shapes are per batch item (a request of batch size 2 contributes two rows). This is Triton's
//! backend library's `BackendInputCollector` behaviour, which its ONNX Runtime, PyTorch and
//! TensorRT backends share.

use bytes::Bytes;
use nereid_proto::{DataType, Tensor, element_count};

use crate::config::{BatchInputKind, BatchInputSpec, RaggedBatching};

/// Every batch input of a batch of `requests` (each its inputs), one tensor per target name.
pub fn batch_inputs(
    ragged: &RaggedBatching,
    requests: &[&[Tensor]],
) -> Result<Vec<Tensor>, String> {
    let mut tensors = Vec::new();
    for spec in &ragged.inputs {
        let sources = source_shapes(requests, &spec.source)?;
        for target in &spec.targets {
            let tensor = batch_input_tensor(spec, target, &sources)
                .map_err(|e| format!("batch input '{target}': {e}"))?;
            tensors.push(tensor);
        }
    }
    Ok(tensors)
}

/// Per output of `names`, the shapes its batch output scatters it into (one per request), or
/// `None` for an output split by batch size.
pub fn scatter_plan(
    ragged: &RaggedBatching,
    names: &[String],
    requests: &[&[Tensor]],
) -> Result<Vec<Option<Vec<Vec<i64>>>>, String> {
    names
        .iter()
        .map(|name| {
            let Some(scatter) = ragged.scatter_of(name) else {
                return Ok(None);
            };
            let sources = source_shapes(requests, &scatter.source)?;
            scatter_shapes(&scatter.shape, &sources)
                .map(Some)
                .map_err(|e| format!("batch output '{name}': {e}"))
        })
        .collect()
}

/// The shapes of input `name` in each request, in batch order.
fn source_shapes<'a>(requests: &[&'a [Tensor]], name: &str) -> Result<Vec<&'a [i64]>, String> {
    requests
        .iter()
        .map(|inputs| {
            inputs
                .iter()
                .find(|t| t.name() == name)
                .map(Tensor::shape)
                .ok_or_else(|| {
                    format!("a request of the batch has no input '{name}', the source of a batch input or output")
                })
        })
        .collect()
}

/// The tensor batch input `spec` gives target `target` for a batch whose requests brought
/// source inputs of shapes `sources`, in batch order.
pub fn batch_input_tensor(
    spec: &BatchInputSpec,
    target: &str,
    sources: &[&[i64]],
) -> Result<Tensor, String> {
    let counts = sources
        .iter()
        .map(|s| {
            element_count(s).ok_or_else(|| format!("source input shape {s:?} has no element count"))
        })
        .collect::<Result<Vec<usize>, String>>()?;
    let running = || {
        counts.iter().scan(0usize, |total, n| {
            *total += n;
            Some(*total)
        })
    };
    let (shape, values): (Vec<usize>, Vec<usize>) = match spec.kind {
        BatchInputKind::ElementCount => (vec![counts.len()], counts.clone()),
        BatchInputKind::AccumulatedElementCount => (vec![counts.len()], running().collect()),
        BatchInputKind::AccumulatedElementCountWithZero => (
            vec![counts.len() + 1],
            std::iter::once(0).chain(running()).collect(),
        ),
        BatchInputKind::MaxElementCountAsShape => {
            let max = counts.iter().copied().max().unwrap_or(0);
            (vec![max], vec![0; max])
        }
        BatchInputKind::ItemShape | BatchInputKind::ItemShapeFlatten => {
            let mut items = 0usize;
            let mut rank = 0usize;
            let mut values = Vec::new();
            for shape in sources {
                let Some((&batch, dims)) = shape.split_first() else {
                    return Err(format!(
                        "{:?} needs a batch dimension in its source input '{}'",
                        spec.kind, spec.source
                    ));
                };
                let batch = usize::try_from(batch).unwrap_or(0);
                rank = dims.len();
                items += batch;
                for _ in 0..batch {
                    values.extend(dims.iter().map(|&d| usize::try_from(d).unwrap_or(0)));
                }
            }
            let shape = if spec.kind == BatchInputKind::ItemShape {
                vec![items, rank]
            } else {
                vec![items * rank]
            };
            (shape, values)
        }
    };
    let data = encode(spec.datatype, &values)?;
    let shape = shape.into_iter().map(|d| d as i64).collect();
    Tensor::new(target, spec.datatype, shape, data).map_err(|e| e.message().to_string())
}

/// Little-endian values of a batch input's datatype (`INT32` or `FP32`, as validation allows).
fn encode(datatype: DataType, values: &[usize]) -> Result<Bytes, String> {
    let mut data = Vec::with_capacity(values.len() * 4);
    for &v in values {
        match datatype {
            DataType::Int32 => {
                let v = i32::try_from(v)
                    .map_err(|_| format!("batch input value {v} does not fit in INT32"))?;
                data.extend_from_slice(&v.to_le_bytes());
            }
            DataType::Fp32 => data.extend_from_slice(&(v as f32).to_le_bytes()),
            other => return Err(format!("batch input datatype {other} is not INT32 or FP32")),
        }
    }
    Ok(Bytes::from(data))
}

/// Each request's shape of a scattered output: `template` (the output's configured shape, with
/// the batch dimension) with every `-1` replaced by the same dimension of the request's source
/// input shape.
pub fn scatter_shapes(template: &[i64], sources: &[&[i64]]) -> Result<Vec<Vec<i64>>, String> {
    sources
        .iter()
        .map(|source| {
            template
                .iter()
                .enumerate()
                .map(|(i, &d)| match (d, source.get(i)) {
                    (-1, Some(&s)) => Ok(s),
                    (-1, None) => Err(format!(
                        "dimension {i} of the output shape {template:?} is variable, but the source input shape {source:?} has no dimension {i}"
                    )),
                    (d, _) => Ok(d),
                })
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use nereid_test_support::fp32_zeros;

    use super::*;

    fn spec(kind: BatchInputKind, datatype: DataType) -> BatchInputSpec {
        BatchInputSpec {
            kind,
            targets: vec!["T".into()],
            datatype,
            source: "INPUT".into(),
        }
    }

    fn ints(t: &Tensor) -> Vec<i32> {
        t.data()
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    fn floats(t: &Tensor) -> Vec<f32> {
        t.data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    /// Triton's example (docs/user_guide/ragged_batching.md): requests [1,3], [1,4], [1,5].
    const DOC: [&[i64]; 3] = [&[1, 3], &[1, 4], &[1, 5]];

    fn int_tensor(kind: BatchInputKind, sources: &[&[i64]]) -> (Vec<i64>, Vec<i32>) {
        let t = batch_input_tensor(&spec(kind, DataType::Int32), "T", sources).unwrap();
        assert_eq!((t.name(), t.datatype()), ("T", DataType::Int32));
        (t.shape().to_vec(), ints(&t))
    }

    #[test]
    fn element_count_is_per_request() {
        assert_eq!(
            int_tensor(BatchInputKind::ElementCount, &DOC),
            (vec![3], vec![3, 4, 5])
        );
        // A request of batch size 2 and shape [2,3] counts 6 elements, as one request.
        assert_eq!(
            int_tensor(BatchInputKind::ElementCount, &[&[2, 3], &[1, 1]]),
            (vec![2], vec![6, 1])
        );
    }

    #[test]
    fn accumulated_element_count_is_where_each_request_ends() {
        // The doc's INDEX: "[3, 7, 12] which gives the offset into the input tensor where each
        // batch element ends", here in its FP32 form as the doc configures it.
        let t = batch_input_tensor(
            &spec(BatchInputKind::AccumulatedElementCount, DataType::Fp32),
            "INDEX",
            &DOC,
        )
        .unwrap();
        assert_eq!((t.shape(), floats(&t)), (&[3i64][..], vec![3.0, 7.0, 12.0]));
        assert_eq!(
            int_tensor(BatchInputKind::AccumulatedElementCount, &DOC),
            (vec![3], vec![3, 7, 12])
        );
    }

    #[test]
    fn accumulated_with_zero_is_where_each_request_starts_and_the_end() {
        assert_eq!(
            int_tensor(BatchInputKind::AccumulatedElementCountWithZero, &DOC),
            (vec![4], vec![0, 3, 7, 12])
        );
        assert_eq!(
            int_tensor(BatchInputKind::AccumulatedElementCountWithZero, &[&[1, 2]]),
            (vec![2], vec![0, 2])
        );
    }

    #[test]
    fn max_element_count_is_the_shape() {
        let (shape, values) = int_tensor(BatchInputKind::MaxElementCountAsShape, &DOC);
        assert_eq!(shape, [5]);
        assert_eq!(values.len(), 5);
        let (shape, _) = int_tensor(BatchInputKind::MaxElementCountAsShape, &[&[2, 3], &[1, 4]]);
        assert_eq!(shape, [6]);
    }

    #[test]
    fn item_shape_has_one_row_per_batch_item() {
        assert_eq!(
            int_tensor(BatchInputKind::ItemShape, &DOC),
            (vec![3, 1], vec![3, 4, 5])
        );
        // Rank 3 sources: each item's [h, w]; a request of batch size 2 gives two rows.
        let sources: [&[i64]; 2] = [&[2, 2, 3], &[1, 4, 1]];
        assert_eq!(
            int_tensor(BatchInputKind::ItemShape, &sources),
            (vec![3, 2], vec![2, 3, 2, 3, 4, 1])
        );
        let t = batch_input_tensor(
            &spec(BatchInputKind::ItemShape, DataType::Fp32),
            "T",
            &sources,
        )
        .unwrap();
        assert_eq!(floats(&t), [2.0, 3.0, 2.0, 3.0, 4.0, 1.0]);
    }

    #[test]
    fn item_shape_flatten_is_the_same_values_in_one_dimension() {
        assert_eq!(
            int_tensor(BatchInputKind::ItemShapeFlatten, &DOC),
            (vec![3], vec![3, 4, 5])
        );
        assert_eq!(
            int_tensor(BatchInputKind::ItemShapeFlatten, &[&[2, 2, 3], &[1, 4, 1]]),
            (vec![6], vec![2, 3, 2, 3, 4, 1])
        );
    }

    #[test]
    fn item_shapes_need_a_batch_dimension() {
        let e = batch_input_tensor(
            &spec(BatchInputKind::ItemShape, DataType::Int32),
            "T",
            &[&[]],
        )
        .unwrap_err();
        assert!(e.contains("batch dimension"), "{e}");
    }

    #[test]
    fn values_beyond_int32_are_refused() {
        let big: &[i64] = &[1, 1 << 32];
        let e = batch_input_tensor(
            &spec(BatchInputKind::ElementCount, DataType::Int32),
            "T",
            &[big],
        )
        .unwrap_err();
        assert!(e.contains("INT32"), "{e}");
    }

    #[test]
    fn a_batch_gets_every_target_and_a_scatter_plan() {
        let ragged = RaggedBatching {
            ragged_inputs: vec!["INPUT".into()],
            inputs: vec![BatchInputSpec {
                targets: vec!["A".into(), "B".into()],
                ..spec(BatchInputKind::AccumulatedElementCount, DataType::Int32)
            }],
            scatter: vec![crate::config::ScatterOutput {
                output: "OUT".into(),
                source: "INPUT".into(),
                shape: vec![-1, -1],
            }],
        };
        let a = [fp32_zeros("INPUT", vec![1, 2])];
        let b = [fp32_zeros("INPUT", vec![1, 3])];
        let generated = batch_inputs(&ragged, &[&a, &b]).unwrap();
        let names: Vec<&str> = generated.iter().map(Tensor::name).collect();
        assert_eq!(names, ["A", "B"]);
        assert_eq!(ints(&generated[1]), [2, 5]);
        let plan = scatter_plan(&ragged, &["SUM".into(), "OUT".into()], &[&a, &b]).unwrap();
        assert_eq!(plan, vec![None, Some(vec![vec![1, 2], vec![1, 3]])]);
        let other = [fp32_zeros("OTHER", vec![1, 1])];
        assert!(
            batch_inputs(&ragged, &[&a, &other])
                .unwrap_err()
                .contains("'INPUT'")
        );
    }

    #[test]
    fn scatter_takes_variable_dimensions_from_the_source() {
        assert_eq!(
            scatter_shapes(&[-1, -1], &DOC).unwrap(),
            vec![vec![1, 3], vec![1, 4], vec![1, 5]]
        );
        // Fixed dimensions stay; a reshape's trailing 1 is kept.
        assert_eq!(
            scatter_shapes(&[-1, -1, 2], &[&[2, 3]]).unwrap(),
            vec![vec![2, 3, 2]]
        );
        assert!(scatter_shapes(&[-1, -1, -1], &[&[1, 3]]).is_err());
    }
}
