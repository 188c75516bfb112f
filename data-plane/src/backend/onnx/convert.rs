//! [`Tensor`] ↔ ONNX Runtime values.
//!
//! ```text
//!  Tensor (raw LE bytes, maybe unaligned) ──copy──► Vec<T> ──► ort Tensor<T>   (BYTES ──► ONNX string)
//!  ort output ──► &[T] ──to_le_bytes──► Bytes ──► Tensor::new                  (ONNX string ──► BYTES)
//! ```
//! Input bytes are copied element by element with `from_le_bytes`, so any alignment works and no
//! unsafe code is needed. ONNX strings are UTF-8 text without NUL bytes (ONNX Runtime stores
//! them as C strings), so `BYTES` elements must be too.

use std::fmt::Debug;

use bytes::Bytes;
use nereid_proto::DataType;
use nereid_proto::types::{Tensor, bytes_elements, push_bytes_element};
use ort::value::{DynValue, PrimitiveTensorElementType, Tensor as OrtTensor, ValueType};

use super::types::datatype_of;
use crate::backend::BackendError;

/// A fixed-size element with a little-endian byte form.
trait LeElement: PrimitiveTensorElementType + Debug + Clone + Sized + 'static {
    const SIZE: usize;
    /// `bytes` has exactly `SIZE` bytes.
    fn read(bytes: &[u8]) -> Self;
    fn write(&self, out: &mut Vec<u8>);
}

fn array<const N: usize>(bytes: &[u8]) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(bytes);
    a
}

macro_rules! le_element {
    ($($t:ty),*) => {$(
        impl LeElement for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            fn read(bytes: &[u8]) -> Self {
                <$t>::from_le_bytes(array(bytes))
            }
            fn write(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
        }
    )*};
}
le_element!(u8, u16, u32, u64, i8, i16, i32, i64, f32, f64);

impl LeElement for bool {
    const SIZE: usize = 1;
    fn read(bytes: &[u8]) -> Self {
        bytes[0] != 0
    }
    fn write(&self, out: &mut Vec<u8>) {
        out.push(u8::from(*self));
    }
}

impl LeElement for half::f16 {
    const SIZE: usize = 2;
    fn read(bytes: &[u8]) -> Self {
        half::f16::from_bits(u16::from_le_bytes(array(bytes)))
    }
    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_bits().to_le_bytes());
    }
}

impl LeElement for half::bf16 {
    const SIZE: usize = 2;
    fn read(bytes: &[u8]) -> Self {
        half::bf16::from_bits(u16::from_le_bytes(array(bytes)))
    }
    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_bits().to_le_bytes());
    }
}

fn primitive<T: LeElement>(shape: Vec<i64>, data: &[u8]) -> ort::Result<DynValue> {
    let values: Vec<T> = data.chunks_exact(T::SIZE).map(T::read).collect();
    Ok(OrtTensor::from_array((shape, values))?.into_dyn())
}

/// Converts one input. `shape` is what the model sees (the tensor's shape after any reshape).
pub(crate) fn to_value(tensor: &Tensor, shape: Vec<i64>) -> Result<DynValue, BackendError> {
    let data = tensor.data().as_ref();
    let value = match tensor.datatype() {
        DataType::Bool => primitive::<bool>(shape, data),
        DataType::Uint8 => primitive::<u8>(shape, data),
        DataType::Uint16 => primitive::<u16>(shape, data),
        DataType::Uint32 => primitive::<u32>(shape, data),
        DataType::Uint64 => primitive::<u64>(shape, data),
        DataType::Int8 => primitive::<i8>(shape, data),
        DataType::Int16 => primitive::<i16>(shape, data),
        DataType::Int32 => primitive::<i32>(shape, data),
        DataType::Int64 => primitive::<i64>(shape, data),
        DataType::Fp16 => primitive::<half::f16>(shape, data),
        DataType::Bf16 => primitive::<half::bf16>(shape, data),
        DataType::Fp32 => primitive::<f32>(shape, data),
        DataType::Fp64 => primitive::<f64>(shape, data),
        DataType::Bytes => {
            let strings = strings(tensor)?;
            OrtTensor::from_string_array((shape, strings.as_slice())).map(OrtTensor::into_dyn)
        }
    };
    value.map_err(|e| {
        BackendError::InvalidInput(format!(
            "input '{}': cannot pass it to ONNX Runtime: {e}",
            tensor.name()
        ))
    })
}

/// Owned copies: `ort` wants `'static` string elements.
fn strings(tensor: &Tensor) -> Result<Vec<String>, BackendError> {
    bytes_elements(tensor.data())
        .enumerate()
        .map(|(i, element)| {
            let text = std::str::from_utf8(element).map_err(|_| {
                BackendError::InvalidInput(format!(
                    "input '{}': element {i} is not valid UTF-8; ONNX string tensors hold UTF-8 text",
                    tensor.name()
                ))
            })?;
            if text.contains('\0') {
                return Err(BackendError::InvalidInput(format!(
                    "input '{}': element {i} contains a NUL byte, which ONNX Runtime string tensors cannot hold",
                    tensor.name()
                )));
            }
            Ok(text.to_string())
        })
        .collect()
}

fn primitive_bytes<T: LeElement>(value: &DynValue) -> ort::Result<(Vec<i64>, Vec<u8>)> {
    let (shape, values) = value.try_extract_tensor::<T>()?;
    let mut out = Vec::with_capacity(values.len() * T::SIZE);
    for v in values {
        v.write(&mut out);
    }
    Ok((shape.to_vec(), out))
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
            (shape.to_vec(), out)
        }),
    };
    let (shape, data) =
        parts.map_err(|e| fail(format!("cannot read it from ONNX Runtime: {e}")))?;
    Ok((datatype, shape, Bytes::from(data)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elements_round_trip_through_le_bytes() {
        let mut out = Vec::new();
        half::bf16::from_f32(1.5).write(&mut out);
        assert_eq!(half::bf16::read(&out), half::bf16::from_f32(1.5));
        out.clear();
        (-3i16).write(&mut out);
        assert_eq!(out, vec![0xfd, 0xff]);
        assert!(bool::read(&[7]));
    }
}
