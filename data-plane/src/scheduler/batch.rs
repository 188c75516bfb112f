//! Splitting the outputs of a batch back per request. (The inputs are not joined here: a
//! backend gets them as [`crate::backend::BatchInputs`] and copies them straight into its own
//! buffers.)
//!
//! A batch of one request passes its tensors through untouched. Splitting never copies: each
//! request's output is a `Bytes` slice of the batch output.
//!
//! A `batch_output` of a ragged model is not split by batch size but scattered
//! ([`scatter_output`]): each request takes the next part of the output, of the shape
//! `ragged::scatter_shapes` worked out from its source input.

use bytes::Bytes;
use nereid_proto::{Tensor, bytes_elements, element_count};

use crate::backend::BackendError;

/// Splits a batch output into one tensor per request (`batch_sizes` in batch order).
pub fn split_output(output: &Tensor, batch_sizes: &[usize]) -> Result<Vec<Tensor>, BackendError> {
    if batch_sizes.len() == 1 {
        return Ok(vec![output.clone()]);
    }
    let total: usize = batch_sizes.iter().sum();
    let shape = output.shape();
    if shape.first().copied() != Some(total as i64) {
        return Err(BackendError::Execution(format!(
            "output '{}' has shape {:?}, but a batch of {total} was executed: its first dimension must be the batch",
            output.name(),
            shape
        )));
    }
    let row_elements = element_count(&shape[1..]).unwrap_or(0);
    let data = output.data();
    let offsets: Vec<usize> = match output.datatype().element_size() {
        Some(size) => (0..=total).map(|row| row * row_elements * size).collect(),
        None => bytes_row_offsets(data, row_elements, total),
    };
    let mut parts = Vec::with_capacity(batch_sizes.len());
    let mut row = 0usize;
    for &n in batch_sizes {
        let range = offsets[row]..offsets[row + n];
        let mut part_shape = shape.to_vec();
        part_shape[0] = n as i64;
        let part = Tensor::new(
            output.name(),
            output.datatype(),
            part_shape,
            data.slice(range),
        )
        .map_err(|e| BackendError::Execution(e.to_string()))?;
        parts.push(part);
        row += n;
    }
    Ok(parts)
}

/// Scatters a batch output into consecutive parts of the given shapes, one per request (in
/// batch order). Elements left over at the end are dropped, as Triton does.
pub fn scatter_output(output: &Tensor, shapes: &[Vec<i64>]) -> Result<Vec<Tensor>, BackendError> {
    let counts = shapes
        .iter()
        .map(|s| element_count(s).unwrap_or(0))
        .collect::<Vec<usize>>();
    let needed: usize = counts.iter().sum();
    let have = output.element_count();
    if needed > have {
        return Err(BackendError::Execution(format!(
            "output '{}' has {have} elements (shape {:?}), but its batch_output scatter needs {needed} for the batch's requests",
            output.name(),
            output.shape()
        )));
    }
    let data = output.data();
    // Byte offset of every element start (and the end), for BYTES; fixed sizes multiply.
    let element_offsets = output
        .datatype()
        .element_size()
        .is_none()
        .then(|| bytes_row_offsets(data, 1, have));
    let offset = |element: usize| match (&element_offsets, output.datatype().element_size()) {
        (Some(offsets), _) => offsets[element],
        (None, size) => element * size.unwrap_or(0),
    };
    let mut parts = Vec::with_capacity(shapes.len());
    let mut at = 0usize;
    for (shape, n) in shapes.iter().zip(counts) {
        let part = Tensor::new(
            output.name(),
            output.datatype(),
            shape.clone(),
            data.slice(offset(at)..offset(at + n)),
        )
        .map_err(|e| BackendError::Execution(e.to_string()))?;
        parts.push(part);
        at += n;
    }
    Ok(parts)
}

/// Byte offsets of row starts (plus the end) in `BYTES` data with `row_elements` per row.
fn bytes_row_offsets(data: &Bytes, row_elements: usize, rows: usize) -> Vec<usize> {
    let mut offsets = Vec::with_capacity(rows + 1);
    offsets.push(0);
    let mut pos = 0usize;
    for (index, element) in bytes_elements(data).enumerate() {
        pos += 4 + element.len();
        if row_elements > 0 && (index + 1) % row_elements == 0 {
            offsets.push(pos);
        }
    }
    while offsets.len() < rows + 1 {
        offsets.push(pos);
    }
    offsets
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::BatchInputs;
    use nereid_proto::{DataType, push_bytes_element};

    fn i32s(name: &str, shape: Vec<i64>, v: &[i32]) -> Tensor {
        Tensor::new(
            name,
            DataType::Int32,
            shape,
            Bytes::from(v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<_>>()),
        )
        .unwrap()
    }

    fn values(t: &Tensor) -> Vec<i32> {
        t.data()
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn join_then_split_round_trips() {
        let a = vec![i32s("x", vec![1, 2], &[1, 2])];
        let b = vec![i32s("x", vec![2, 2], &[3, 4, 5, 6])];
        let batch = BatchInputs::new(&[&a, &b]).unwrap().joined().unwrap();
        assert_eq!(batch[0].shape(), &[3, 2]);
        assert_eq!(values(&batch[0]), vec![1, 2, 3, 4, 5, 6]);
        let parts = split_output(&batch[0], &[1, 2]).unwrap();
        assert_eq!(values(&parts[0]), vec![1, 2]);
        assert_eq!(parts[1].shape(), &[2, 2]);
        assert_eq!(values(&parts[1]), vec![3, 4, 5, 6]);
    }

    #[test]
    fn a_single_request_passes_through() {
        let a = vec![i32s("x", vec![1, 2], &[1, 2])];
        let batch = BatchInputs::new(&[&a]).unwrap().joined().unwrap();
        assert_eq!(batch[0].data().as_ptr(), a[0].data().as_ptr());
        let parts = split_output(&batch[0], &[1]).unwrap();
        assert_eq!(parts[0].data().as_ptr(), a[0].data().as_ptr());
    }

    #[test]
    fn bytes_outputs_split_by_elements() {
        let mut v = Vec::new();
        for s in [&b"a"[..], b"bb", b"", b"dddd"] {
            push_bytes_element(&mut v, s);
        }
        let t = Tensor::new("s", DataType::Bytes, vec![2, 2], Bytes::from(v)).unwrap();
        let parts = split_output(&t, &[1, 1]).unwrap();
        let first: Vec<&[u8]> = bytes_elements(parts[0].data()).collect();
        let second: Vec<&[u8]> = bytes_elements(parts[1].data()).collect();
        assert_eq!(first, vec![&b"a"[..], b"bb"]);
        assert_eq!(second, vec![&b""[..], b"dddd"]);
    }

    #[test]
    fn scatter_cuts_consecutive_parts_of_the_given_shapes() {
        let t = i32s("y", vec![7], &[1, 2, 3, 4, 5, 6, 7]);
        let parts = scatter_output(&t, &[vec![1, 3], vec![1, 2], vec![1, 1]]).unwrap();
        assert_eq!(parts[0].shape(), &[1, 3]);
        assert_eq!(values(&parts[0]), [1, 2, 3]);
        assert_eq!(values(&parts[1]), [4, 5]);
        assert_eq!(values(&parts[2]), [6], "the rest is dropped");
        assert!(scatter_output(&t, &[vec![1, 8]]).is_err());

        let mut v = Vec::new();
        for s in [&b"a"[..], b"bb", b"ccc"] {
            push_bytes_element(&mut v, s);
        }
        let t = Tensor::new("s", DataType::Bytes, vec![3], Bytes::from(v)).unwrap();
        let parts = scatter_output(&t, &[vec![1, 1], vec![1, 2]]).unwrap();
        let second: Vec<&[u8]> = bytes_elements(parts[1].data()).collect();
        assert_eq!(second, vec![&b"bb"[..], b"ccc"]);
    }

    #[test]
    fn outputs_without_a_batch_dimension_are_refused() {
        let t = i32s("y", vec![2], &[1, 2]);
        assert!(split_output(&t, &[1, 2]).is_err());
    }
}
