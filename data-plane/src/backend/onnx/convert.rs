//! Batch inputs ↔ ONNX Runtime values, in bulk.
//!
//! ```text
//!  BatchInput parts (LE bytes, any alignment) ──one memcpy per part──► Vec<T> ──► ort Tensor<T> (no copy)
//!  ort output &[T] ──one memcpy──► Bytes ──► Tensor::new
//!  BOOL: per element (any non-zero byte is true)     BYTES ◄──► ONNX strings: per element
//! ```
//! The buffer handed to ONNX Runtime is a `Vec<T>` of the batch's element count; each request's
//! bytes are copied into its byte view (`bytemuck`), so the only copy of the batch is the one into
//! the model's input, and unaligned request bytes are fine. The wire's little-endian element
//! bytes are the host's (checked at compile time below). ONNX strings are UTF-8 text without NUL
//! bytes (ONNX Runtime stores them as C strings), so `BYTES` elements must be too.

use bytemuck::{NoUninit, Pod};
use bytes::Bytes;
use nereid_proto::{DataType, bytes_elements, push_bytes_element};
use ort::value::{DynValue, PrimitiveTensorElementType, Tensor as OrtTensor, ValueType};

use super::types::datatype_of;
use crate::backend::{BackendError, BatchInput};

#[cfg(target_endian = "big")]
compile_error!(
    "the ONNX Runtime backend copies little-endian wire bytes into native tensors as they are and needs a little-endian target"
);

/// A fixed-size element ONNX Runtime holds in native (here: little-endian) byte order.
trait Element: PrimitiveTensorElementType + Pod + std::fmt::Debug {}
impl<T: PrimitiveTensorElementType + Pod + std::fmt::Debug> Element for T {}

/// The batch copied into a new tensor of `shape` (the shape the model sees).
fn primitive<T: Element>(input: &BatchInput<'_>, shape: Vec<i64>) -> Result<DynValue, String> {
    let elements =
        nereid_proto::element_count(&shape).ok_or_else(|| format!("shape {shape:?} is invalid"))?;
    let mut values: Vec<T> = bytemuck::zeroed_vec(elements);
    input
        .copy_into(bytemuck::cast_slice_mut(&mut values))
        .map_err(|e| e.to_string())?;
    tensor(shape, values)
}

/// `BOOL` element by element: the wire allows any byte, a Rust `bool` only 0 or 1.
fn booleans(input: &BatchInput<'_>, shape: Vec<i64>) -> Result<DynValue, String> {
    let values: Vec<bool> = input
        .parts()
        .iter()
        .flat_map(|part| part.data().iter().map(|&b| b != 0))
        .collect();
    tensor(shape, values)
}

fn tensor<T: PrimitiveTensorElementType + std::fmt::Debug + Clone + 'static>(
    shape: Vec<i64>,
    values: Vec<T>,
) -> Result<DynValue, String> {
    OrtTensor::from_array((shape, values))
        .map(OrtTensor::into_dyn)
        .map_err(|e| e.to_string())
}

/// Converts one batch input. `shape` is what the model sees (the batch shape after any
/// reshape).
pub(crate) fn to_value(input: &BatchInput<'_>, shape: Vec<i64>) -> Result<DynValue, BackendError> {
    let value = match input.datatype() {
        DataType::Bool => booleans(input, shape),
        DataType::Uint8 => primitive::<u8>(input, shape),
        DataType::Uint16 => primitive::<u16>(input, shape),
        DataType::Uint32 => primitive::<u32>(input, shape),
        DataType::Uint64 => primitive::<u64>(input, shape),
        DataType::Int8 => primitive::<i8>(input, shape),
        DataType::Int16 => primitive::<i16>(input, shape),
        DataType::Int32 => primitive::<i32>(input, shape),
        DataType::Int64 => primitive::<i64>(input, shape),
        DataType::Fp16 => primitive::<half::f16>(input, shape),
        DataType::Bf16 => primitive::<half::bf16>(input, shape),
        DataType::Fp32 => primitive::<f32>(input, shape),
        DataType::Fp64 => primitive::<f64>(input, shape),
        DataType::Bytes => {
            let strings = strings(input)?;
            OrtTensor::from_string_array((shape, strings.as_slice()))
                .map(OrtTensor::into_dyn)
                .map_err(|e| e.to_string())
        }
    };
    value.map_err(|e| {
        BackendError::InvalidInput(format!(
            "input '{}': cannot pass it to ONNX Runtime: {e}",
            input.name()
        ))
    })
}

/// Owned copies: `ort` wants `'static` string elements. Element indexes count across the
/// batch.
fn strings(input: &BatchInput<'_>) -> Result<Vec<String>, BackendError> {
    input
        .parts()
        .iter()
        .flat_map(|part| bytes_elements(part.data()))
        .enumerate()
        .map(|(i, element)| {
            let text = std::str::from_utf8(element).map_err(|_| {
                BackendError::InvalidInput(format!(
                    "input '{}': element {i} is not valid UTF-8; ONNX string tensors hold UTF-8 text",
                    input.name()
                ))
            })?;
            if text.contains('\0') {
                return Err(BackendError::InvalidInput(format!(
                    "input '{}': element {i} contains a NUL byte, which ONNX Runtime string tensors cannot hold",
                    input.name()
                )));
            }
            Ok(text.to_string())
        })
        .collect()
}

/// ONNX Runtime's output buffer copied into `Bytes` in one go (`bool` included: ONNX Runtime
/// writes 0 or 1, which is the wire's `BOOL`).
fn primitive_bytes<T: PrimitiveTensorElementType + NoUninit + std::fmt::Debug>(
    value: &DynValue,
) -> ort::Result<(Vec<i64>, Bytes)> {
    let (shape, values) = value.try_extract_tensor::<T>()?;
    Ok((
        shape.to_vec(),
        Bytes::copy_from_slice(bytemuck::cast_slice(values)),
    ))
}

/// Converts one output; the shape is the model's (before any config reshape).
pub(crate) fn from_value(
    name: &str,
    value: &DynValue,
) -> Result<(DataType, Vec<i64>, Bytes), BackendError> {
    let fail = |what: String| BackendError::Execution(format!("output '{name}': {what}"));
    let ty = match value.dtype() {
        ValueType::Tensor { ty, .. } => *ty,
        other => {
            return Err(fail(format!(
                "the model produced {other:?}, which is not a tensor"
            )));
        }
    };
    let datatype = datatype_of(ty)
        .ok_or_else(|| fail(format!("ONNX element type '{ty}' has no Triton datatype")))?;
    let parts = match datatype {
        DataType::Bool => primitive_bytes::<bool>(value),
        DataType::Uint8 => primitive_bytes::<u8>(value),
        DataType::Uint16 => primitive_bytes::<u16>(value),
        DataType::Uint32 => primitive_bytes::<u32>(value),
        DataType::Uint64 => primitive_bytes::<u64>(value),
        DataType::Int8 => primitive_bytes::<i8>(value),
        DataType::Int16 => primitive_bytes::<i16>(value),
        DataType::Int32 => primitive_bytes::<i32>(value),
        DataType::Int64 => primitive_bytes::<i64>(value),
        DataType::Fp16 => primitive_bytes::<half::f16>(value),
        DataType::Bf16 => primitive_bytes::<half::bf16>(value),
        DataType::Fp32 => primitive_bytes::<f32>(value),
        DataType::Fp64 => primitive_bytes::<f64>(value),
        DataType::Bytes => value.try_extract_strings().map(|(shape, strings)| {
            let mut out = Vec::with_capacity(strings.iter().map(|s| s.len() + 4).sum());
            for s in &strings {
                push_bytes_element(&mut out, s.as_bytes());
            }
            (shape.to_vec(), Bytes::from(out))
        }),
    };
    let (shape, data) =
        parts.map_err(|e| fail(format!("cannot read it from ONNX Runtime: {e}")))?;
    Ok((datatype, shape, data))
}

#[cfg(test)]
mod tests {
    use nereid_proto::Tensor;

    use super::*;
    use crate::backend::BatchInputs;

    /// `ort` needs the library loaded before it creates a tensor.
    fn load_ort() {
        super::super::runtime::environment(Some(&super::super::tests::library())).unwrap();
    }

    /// The wire bytes of `values`, each element little-endian.
    fn wire(values: &[f32]) -> Bytes {
        Bytes::from(
            values
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<_>>(),
        )
    }

    #[test]
    fn parts_land_in_one_buffer_and_come_back_in_one_copy() {
        load_ort();
        let a = [Tensor::new("x", DataType::Fp32, vec![1, 2], wire(&[1.5, -2.0])).unwrap()];
        // Misaligned on purpose: request bytes may start anywhere.
        let shifted = Bytes::from([&[0u8][..], &wire(&[3.25, 4.0])].concat()).slice(1..);
        let b = [Tensor::new("x", DataType::Fp32, vec![1, 2], shifted).unwrap()];
        let batch = BatchInputs::new(&[&a, &b]).unwrap();
        let input = batch.get("x").unwrap();
        let value = to_value(input, input.shape().to_vec()).unwrap();
        let (datatype, shape, data) = from_value("y", &value).unwrap();
        assert_eq!((datatype, shape), (DataType::Fp32, vec![2, 2]));
        assert_eq!(data, wire(&[1.5, -2.0, 3.25, 4.0]));
    }

    #[test]
    fn any_non_zero_byte_is_true_and_true_comes_back_as_one() {
        load_ort();
        let t =
            [Tensor::new("b", DataType::Bool, vec![3], Bytes::from_static(&[0, 7, 1])).unwrap()];
        let batch = BatchInputs::single(&t);
        let value = to_value(batch.get("b").unwrap(), vec![3]).unwrap();
        let (_, _, data) = from_value("b", &value).unwrap();
        assert_eq!(data.as_ref(), [0, 1, 1]);
    }

    #[test]
    fn a_shape_the_bytes_do_not_fill_is_refused() {
        load_ort();
        let t = [Tensor::new("x", DataType::Fp32, vec![2], wire(&[1.0, 2.0])).unwrap()];
        let batch = BatchInputs::single(&t);
        let e = to_value(batch.get("x").unwrap(), vec![3]).unwrap_err();
        assert!(
            matches!(e, BackendError::InvalidInput(m) if m.starts_with("input 'x': cannot pass it to ONNX Runtime"))
        );
    }
}
