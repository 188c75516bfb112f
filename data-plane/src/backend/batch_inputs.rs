//! The inputs of one execution: for each model input, the tensors the batched requests brought,
//! described as one batch but not yet joined.
//!
//! ```text
//!  requests [ [x₀ y₀] [x₁ y₁] [x₂ y₂] ] ──BatchInputs::new (checks, no copy)──► x: parts x₀ x₁ x₂, shape [Σ rows, …]
//!                                                                               y: parts y₀ y₁ y₂, shape [Σ rows, …]
//!  backend that owns a buffer (ONNX Runtime):  BatchInput::copy_into(buffer)  one memcpy per part
//!  backend that takes Tensors (identity, PyTorch): BatchInputs::joined()        no copy for one request,
//!                                                                               one copy otherwise
//! ```
//!
//! So a batch's bytes are copied once, straight into the backend's input buffer, instead of
//! being joined into a new tensor first and copied into the backend after.
//!
//! Ragged batching ([`BatchInputs::ragged`]): an `allow_ragged_batch` input may differ in shape
//! between the requests; its parts are concatenated and the batch shape is one dimension, the
//! total element count (even for a batch of one), as Triton's backends hand it to a model. The
//! `batch_input` tensors the scheduler generated for the batch follow the requests' inputs.

use std::borrow::Cow;

use bytes::BytesMut;
use nereid_proto::{DataType, Tensor, element_count};

use super::BackendError;

/// The inputs of one execution, one [`BatchInput`] per model input, in the requests' order.
#[derive(Debug)]
pub struct BatchInputs<'a> {
    inputs: Vec<BatchInput<'a>>,
}

/// One model input of a batch: the batch shape and the part each request brought.
#[derive(Debug)]
pub struct BatchInput<'a> {
    name: &'a str,
    datatype: DataType,
    /// The first part's shape with its first dimension (the batch) summed over the parts.
    shape: Cow<'a, [i64]>,
    /// One tensor per request, in batch order.
    parts: Vec<&'a Tensor>,
    /// The parts' bytes, together.
    byte_len: usize,
}

impl<'a> BatchInputs<'a> {
    /// The inputs of one request: a batch of one, passed through as they are.
    pub fn single(inputs: &'a [Tensor]) -> BatchInputs<'a> {
        BatchInputs {
            inputs: inputs.iter().map(BatchInput::single).collect(),
        }
    }

    /// Several requests' inputs as one batch. The requests must agree (guaranteed by the
    /// queue's shape key): the same input names and datatypes in the same order, and the same
    /// dimensions after the first (the batch dimension, which is summed).
    pub fn new(requests: &[&'a [Tensor]]) -> Result<BatchInputs<'a>, BackendError> {
        let Some((first, rest)) = requests.split_first() else {
            return Ok(BatchInputs { inputs: Vec::new() });
        };
        if rest.is_empty() {
            return Ok(BatchInputs::single(first));
        }
        let inputs = first
            .iter()
            .enumerate()
            .map(|(i, proto)| BatchInput::joining(proto, i, requests))
            .collect::<Result<_, _>>()?;
        Ok(BatchInputs { inputs })
    }

    /// A batch of a model with ragged batching: the inputs named in `ragged` are flattened
    /// and may differ in shape between requests (the others join as in [`BatchInputs::new`]);
    /// `generated` (the batch inputs) follow as they are.
    pub fn ragged(
        requests: &[&'a [Tensor]],
        ragged: &[String],
        generated: &'a [Tensor],
    ) -> Result<BatchInputs<'a>, BackendError> {
        let mut inputs = Vec::new();
        if let Some(first) = requests.first() {
            for (i, proto) in first.iter().enumerate() {
                let input = if ragged.iter().any(|r| r == proto.name()) {
                    BatchInput::flattening(proto, i, requests)?
                } else if requests.len() == 1 {
                    BatchInput::single(proto)
                } else {
                    BatchInput::joining(proto, i, requests)?
                };
                inputs.push(input);
            }
        }
        inputs.extend(generated.iter().map(BatchInput::single));
        Ok(BatchInputs { inputs })
    }

    /// The model inputs, in the requests' order.
    pub fn iter(&self) -> impl Iterator<Item = &BatchInput<'a>> {
        self.inputs.iter()
    }

    /// The input named `name`.
    pub fn get(&self, name: &str) -> Option<&BatchInput<'a>> {
        self.inputs.iter().find(|i| i.name == name)
    }

    /// The number of model inputs in the batch (one per input name, not per request).
    pub fn len(&self) -> usize {
        self.inputs.len()
    }

    /// Whether the batch has no model inputs at all.
    pub fn is_empty(&self) -> bool {
        self.inputs.is_empty()
    }

    /// Every input as one tensor (see [`BatchInput::joined`]).
    pub fn joined(&self) -> Result<Vec<Tensor>, BackendError> {
        self.inputs.iter().map(BatchInput::joined).collect()
    }
}

impl<'a> BatchInput<'a> {
    fn single(tensor: &'a Tensor) -> BatchInput<'a> {
        BatchInput {
            name: tensor.name(),
            datatype: tensor.datatype(),
            shape: Cow::Borrowed(tensor.shape()),
            parts: vec![tensor],
            byte_len: tensor.data().len(),
        }
    }

    /// Input `index` of every request, checked against `proto` (the first request's).
    fn joining(
        proto: &'a Tensor,
        index: usize,
        requests: &[&'a [Tensor]],
    ) -> Result<BatchInput<'a>, BackendError> {
        let disagree = || {
            BackendError::Execution(format!(
                "batched requests disagree on input '{}'",
                proto.name()
            ))
        };
        let Some((_, dims)) = proto.shape().split_first() else {
            return Err(BackendError::Execution(format!(
                "input '{}' has no batch dimension, so requests cannot be batched",
                proto.name()
            )));
        };
        let mut parts = Vec::with_capacity(requests.len());
        let mut rows = 0i64;
        let mut byte_len = 0usize;
        for request in requests {
            let part = request
                .get(index)
                .filter(|t| {
                    t.name() == proto.name()
                        && t.datatype() == proto.datatype()
                        && t.shape().get(1..) == Some(dims)
                })
                .ok_or_else(disagree)?;
            rows += part.shape()[0];
            byte_len += part.data().len();
            parts.push(part);
        }
        let mut shape = proto.shape().to_vec();
        shape[0] = rows;
        Ok(BatchInput {
            name: proto.name(),
            datatype: proto.datatype(),
            shape: Cow::Owned(shape),
            parts,
            byte_len,
        })
    }

    /// Ragged input `index` of every request: any shapes, concatenated into one dimension.
    fn flattening(
        proto: &'a Tensor,
        index: usize,
        requests: &[&'a [Tensor]],
    ) -> Result<BatchInput<'a>, BackendError> {
        let mut parts = Vec::with_capacity(requests.len());
        let mut elements = 0usize;
        let mut byte_len = 0usize;
        for request in requests {
            let part = request
                .get(index)
                .filter(|t| t.name() == proto.name() && t.datatype() == proto.datatype())
                .ok_or_else(|| {
                    BackendError::Execution(format!(
                        "batched requests disagree on ragged input '{}'",
                        proto.name()
                    ))
                })?;
            elements += part.element_count();
            byte_len += part.data().len();
            parts.push(part);
        }
        Ok(BatchInput {
            name: proto.name(),
            datatype: proto.datatype(),
            shape: Cow::Owned(vec![elements as i64]),
            parts,
            byte_len,
        })
    }

    /// The input's name, as the model config declares it.
    pub fn name(&self) -> &'a str {
        self.name
    }

    /// The input's element type, the same in every request of the batch.
    pub fn datatype(&self) -> DataType {
        self.datatype
    }

    /// The batch shape: the requests' batch dimensions summed.
    pub fn shape(&self) -> &[i64] {
        &self.shape
    }

    /// Elements in the batch shape.
    pub fn element_count(&self) -> usize {
        element_count(&self.shape).unwrap_or(0)
    }

    /// Each request's tensor, in batch order.
    pub fn parts(&self) -> &[&'a Tensor] {
        &self.parts
    }

    /// The bytes of all parts together: what [`Self::copy_into`] writes.
    pub fn byte_len(&self) -> usize {
        self.byte_len
    }

    /// Copies the parts, one after the other, into `buffer` (one `memcpy` each). `buffer` must
    /// be exactly [`Self::byte_len`] bytes long.
    pub fn copy_into(&self, buffer: &mut [u8]) -> Result<(), BackendError> {
        if buffer.len() != self.byte_len {
            return Err(BackendError::InvalidInput(format!(
                "input '{}': {} bytes of data do not fill the {} bytes of {} shape {:?}",
                self.name,
                self.byte_len,
                buffer.len(),
                self.datatype,
                self.shape()
            )));
        }
        let mut at = 0;
        for part in &self.parts {
            let data = part.data();
            buffer[at..at + data.len()].copy_from_slice(data);
            at += data.len();
        }
        Ok(())
    }

    /// The batch as one tensor: the request's own bytes (no copy) for a batch of one, else the
    /// parts joined into new bytes (one copy).
    pub fn joined(&self) -> Result<Tensor, BackendError> {
        if let [only] = self.parts.as_slice() {
            if only.shape() == &*self.shape {
                return Ok((*only).clone());
            }
            return Tensor::new(
                self.name,
                self.datatype,
                self.shape.to_vec(),
                only.data().clone(),
            )
            .map_err(|e| BackendError::Execution(e.to_string()));
        }
        let mut data = BytesMut::with_capacity(self.byte_len);
        for part in &self.parts {
            data.extend_from_slice(part.data());
        }
        Tensor::new(self.name, self.datatype, self.shape.to_vec(), data.freeze())
            .map_err(|e| BackendError::Execution(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn i32s(name: &str, shape: Vec<i64>, v: &[i32]) -> Tensor {
        let data: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        Tensor::new(name, DataType::Int32, shape, Bytes::from(data)).unwrap()
    }

    fn values(data: &[u8]) -> Vec<i32> {
        data.chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn requests_join_along_the_batch_dimension() {
        let a = vec![i32s("x", vec![1, 2], &[1, 2]), i32s("y", vec![1], &[9])];
        let b = vec![
            i32s("x", vec![2, 2], &[3, 4, 5, 6]),
            i32s("y", vec![2], &[8, 7]),
        ];
        let batch = BatchInputs::new(&[&a, &b]).unwrap();
        assert_eq!(batch.len(), 2);
        let x = batch.get("x").unwrap();
        assert_eq!(
            (x.shape(), x.byte_len(), x.parts().len()),
            (&[3i64, 2][..], 24, 2)
        );

        let mut buffer = vec![0u8; x.byte_len()];
        x.copy_into(&mut buffer).unwrap();
        assert_eq!(values(&buffer), [1, 2, 3, 4, 5, 6]);
        let joined = batch.joined().unwrap();
        assert_eq!(joined[0].shape(), &[3, 2]);
        assert_eq!(values(joined[0].data()), [1, 2, 3, 4, 5, 6]);
        assert_eq!(
            (joined[1].shape(), values(joined[1].data())),
            (&[3i64][..], vec![9, 8, 7])
        );
    }

    #[test]
    fn a_single_request_passes_through_without_a_copy() {
        let a = vec![i32s("x", vec![1, 2], &[1, 2])];
        for batch in [BatchInputs::new(&[&a]).unwrap(), BatchInputs::single(&a)] {
            let joined = batch.joined().unwrap();
            assert_eq!(joined[0].data().as_ptr(), a[0].data().as_ptr());
            assert_eq!(batch.get("x").unwrap().shape(), &[1, 2]);
        }
        assert!(BatchInputs::new(&[]).unwrap().is_empty());
    }

    #[test]
    fn requests_that_disagree_are_refused() {
        let a = vec![i32s("x", vec![1, 2], &[1, 2])];
        for other in [
            i32s("z", vec![1, 2], &[3, 4]),
            i32s("x", vec![1, 1], &[3]),
            Tensor::new("x", DataType::Fp32, vec![1, 2], Bytes::from(vec![0u8; 8])).unwrap(),
        ] {
            let b = vec![other];
            let e = BatchInputs::new(&[&a, &b]).unwrap_err();
            assert_eq!(e.to_string(), "batched requests disagree on input 'x'");
        }
        let missing: Vec<Tensor> = Vec::new();
        assert!(BatchInputs::new(&[&a, &missing]).is_err());
    }

    #[test]
    fn ragged_inputs_concatenate_flat_and_generated_inputs_follow() {
        let a = vec![
            i32s("r", vec![1, 3], &[1, 2, 3]),
            i32s("x", vec![1, 1], &[7]),
        ];
        let b = vec![i32s("r", vec![1, 2], &[4, 5]), i32s("x", vec![1, 1], &[8])];
        let generated = vec![i32s("INDEX", vec![2], &[3, 5])];
        let ragged = vec!["r".to_string()];
        let batch = BatchInputs::ragged(&[&a, &b], &ragged, &generated).unwrap();
        let names: Vec<&str> = batch.iter().map(BatchInput::name).collect();
        assert_eq!(names, ["r", "x", "INDEX"]);
        let joined = batch.joined().unwrap();
        assert_eq!(
            (joined[0].shape(), values(joined[0].data())),
            (&[5i64][..], vec![1, 2, 3, 4, 5])
        );
        assert_eq!(joined[1].shape(), &[2, 1]);
        assert_eq!(values(joined[2].data()), [3, 5]);

        // A batch of one is flattened too, without copying its bytes.
        let one = BatchInputs::ragged(&[&a], &ragged, &[]).unwrap();
        let r = &one.joined().unwrap()[0];
        assert_eq!(r.shape(), &[3]);
        assert_eq!(r.data().as_ptr(), a[0].data().as_ptr());
        assert_eq!(one.get("x").unwrap().shape(), &[1, 1]);

        // Non-ragged inputs must still agree.
        let c = vec![i32s("r", vec![1, 1], &[6]), i32s("x", vec![1, 2], &[8, 9])];
        assert!(BatchInputs::ragged(&[&a, &c], &ragged, &[]).is_err());
    }

    #[test]
    fn a_buffer_of_the_wrong_size_is_refused() {
        let a = vec![i32s("x", vec![1, 2], &[1, 2])];
        let batch = BatchInputs::single(&a);
        let mut small = [0u8; 4];
        assert!(matches!(
            batch.get("x").unwrap().copy_into(&mut small),
            Err(BackendError::InvalidInput(_))
        ));
    }
}
