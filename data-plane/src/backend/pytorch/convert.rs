//! [`Tensor`] ↔ libtorch tensors, and the datatypes the two share.
//!
//! ```text
//!  Tensor (LE bytes) ──length check──► tch::Tensor::f_from_data_size (copies) ──► .to(device)
//!  tch::Tensor ──f_copy_data_u8 (to CPU, contiguous, copies)──► Bytes ──► Tensor::new
//!  BYTES ◄──► List[str]   (Triton's convention: a flat list of UTF-8 strings, no NUL bytes)
//! ```
//! libtorch keeps elements in native byte order, which is the wire's little-endian on every
//! target this builds for (checked at compile time below).

use bytes::Bytes;
use nereid_proto::{DataType, Tensor, bytes_elements, push_bytes_element};
use tch::{Device, Kind};

use crate::backend::BackendError;

#[cfg(target_endian = "big")]
compile_error!("the PyTorch backend copies tensors byte for byte and needs a little-endian target");

/// The libtorch element type of a Triton datatype; `None` for those libtorch lacks
/// (`UINT16`/`UINT32`/`UINT64`, which tch cannot name, and `BYTES`, which travels as a
/// `List[str]` instead: [`to_strings`], [`from_strings`]).
pub(crate) fn kind_of(datatype: DataType) -> Option<Kind> {
    Some(match datatype {
        DataType::Bool => Kind::Bool,
        DataType::Uint8 => Kind::Uint8,
        DataType::Int8 => Kind::Int8,
        DataType::Int16 => Kind::Int16,
        DataType::Int32 => Kind::Int,
        DataType::Int64 => Kind::Int64,
        DataType::Fp16 => Kind::Half,
        DataType::Fp32 => Kind::Float,
        DataType::Fp64 => Kind::Double,
        DataType::Bf16 => Kind::BFloat16,
        DataType::Uint16 | DataType::Uint32 | DataType::Uint64 | DataType::Bytes => return None,
    })
}

/// The Triton datatype of a libtorch element type, if there is one.
pub(crate) fn datatype_of(kind: Kind) -> Option<DataType> {
    DataType::ALL
        .into_iter()
        .find(|&d| kind_of(d) == Some(kind))
}

/// Copies `tensor` into a libtorch tensor on `device`, shaped `shape`.
pub(crate) fn to_torch(
    tensor: &Tensor,
    shape: &[i64],
    device: Device,
) -> Result<tch::Tensor, BackendError> {
    let name = tensor.name();
    let kind = kind_of(tensor.datatype()).ok_or_else(|| {
        BackendError::Unsupported(format!(
            "input '{name}': datatype {} has no libtorch equivalent",
            tensor.datatype()
        ))
    })?;
    let elements: usize = shape
        .iter()
        .map(|&d| usize::try_from(d).ok())
        .product::<Option<usize>>()
        .ok_or_else(|| BackendError::InvalidInput(format!("input '{name}': negative dimension")))?;
    let data = tensor.data();
    // f_from_data_size reads elements × size bytes without checking; never let it over-read.
    if data.len() != elements * kind.elt_size_in_bytes() {
        return Err(BackendError::InvalidInput(format!(
            "input '{name}': {} bytes of data do not match shape {shape:?} of {}",
            data.len(),
            tensor.datatype()
        )));
    }
    let cpu = tch::Tensor::f_from_data_size(data, shape, kind)
        .map_err(|e| BackendError::InvalidInput(format!("input '{name}': {e}")))?;
    if device == Device::Cpu {
        return Ok(cpu);
    }
    cpu.f_to_device(device)
        .map_err(|e| BackendError::Execution(format!("input '{name}': copy to {device:?}: {e}")))
}

/// A `BYTES` input as the `List[str]` libtorch takes: its elements in row-major order, each
/// UTF-8 text without NUL bytes (libtorch copies them as C strings).
pub(crate) fn to_strings(tensor: &Tensor) -> Result<Vec<String>, BackendError> {
    bytes_elements(tensor.data())
        .enumerate()
        .map(|(i, element)| match std::str::from_utf8(element) {
            Ok(text) if !text.contains('\0') => Ok(text.to_string()),
            _ => Err(BackendError::InvalidInput(format!(
                "input '{}': element {i} is not UTF-8 text without NUL bytes, which a TorchScript List[str] needs",
                tensor.name()
            ))),
        })
        .collect()
}

/// A returned `List[str]` as a `BYTES` output shaped `shape`.
pub(crate) fn from_strings(
    name: &str,
    strings: &[String],
    shape: Vec<i64>,
) -> Result<Tensor, BackendError> {
    let mut data = Vec::with_capacity(strings.iter().map(|s| s.len() + 4).sum());
    for s in strings {
        push_bytes_element(&mut data, s.as_bytes());
    }
    Tensor::new(name, DataType::Bytes, shape, Bytes::from(data))
        .map_err(|e| BackendError::Execution(format!("output '{name}': {}", e.message())))
}

/// Copies a libtorch tensor (any device, any layout) into an output named `name`.
pub(crate) fn from_torch(name: &str, value: &tch::Tensor) -> Result<Tensor, BackendError> {
    let kind = value
        .f_kind()
        .map_err(|e| BackendError::Execution(format!("output '{name}': {e}")))?;
    let datatype = datatype_of(kind).ok_or_else(|| {
        BackendError::Execution(format!(
            "output '{name}': the model returned a {kind:?} tensor, which has no Triton datatype"
        ))
    })?;
    let shape = value.size();
    let numel = value.numel();
    let mut bytes = vec![0u8; numel * kind.elt_size_in_bytes()];
    value
        .f_copy_data_u8(&mut bytes, numel)
        .map_err(|e| BackendError::Execution(format!("output '{name}': {e}")))?;
    Tensor::new(name, datatype, shape, Bytes::from(bytes))
        .map_err(|e| BackendError::Execution(format!("output '{name}': {}", e.message())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shared_datatype_round_trips() {
        for datatype in DataType::ALL {
            match kind_of(datatype) {
                Some(kind) => {
                    assert_eq!(datatype_of(kind), Some(datatype));
                    let size = datatype.element_size().unwrap();
                    assert_eq!(kind.elt_size_in_bytes(), size, "{datatype}");
                    let data: Vec<u8> = (0..(size * 6) as u8).map(|b| b % 2).collect();
                    let tensor =
                        Tensor::new("x", datatype, vec![2, 3], Bytes::from(data.clone())).unwrap();
                    let torch = to_torch(&tensor, &[2, 3], Device::Cpu).unwrap();
                    assert_eq!(torch.size(), [2, 3]);
                    let back = from_torch("y", &torch).unwrap();
                    assert_eq!((back.datatype(), back.shape()), (datatype, &[2i64, 3][..]));
                    assert_eq!(back.data().as_ref(), data.as_slice(), "{datatype}");
                }
                None => assert!(matches!(
                    datatype,
                    DataType::Uint16 | DataType::Uint32 | DataType::Uint64 | DataType::Bytes
                )),
            }
        }
    }

    #[test]
    fn data_that_does_not_fill_the_shape_is_refused() {
        let tensor = Tensor::new("x", DataType::Fp32, vec![2], Bytes::from(vec![0u8; 8])).unwrap();
        let e = to_torch(&tensor, &[3], Device::Cpu).unwrap_err();
        assert_eq!(
            e.to_string(),
            "input 'x': 8 bytes of data do not match shape [3] of FP32"
        );
    }

    #[test]
    fn bytes_travel_as_strings() {
        let mut data = Vec::new();
        for s in ["a", "ünï", ""] {
            push_bytes_element(&mut data, s.as_bytes());
        }
        let tensor = Tensor::new("w", DataType::Bytes, vec![3], Bytes::from(data)).unwrap();
        let strings = to_strings(&tensor).unwrap();
        assert_eq!(strings, ["a", "ünï", ""]);
        let back = from_strings("w", &strings, vec![3]).unwrap();
        assert_eq!(back.data(), tensor.data());

        let mut bad = Vec::new();
        push_bytes_element(&mut bad, b"ok");
        push_bytes_element(&mut bad, b"nul\0inside");
        let tensor = Tensor::new("w", DataType::Bytes, vec![2], Bytes::from(bad)).unwrap();
        assert_eq!(
            to_strings(&tensor).unwrap_err().to_string(),
            "input 'w': element 1 is not UTF-8 text without NUL bytes, which a TorchScript List[str] needs"
        );
    }

    #[test]
    fn non_contiguous_outputs_are_copied_in_row_major_order() {
        let t = tch::Tensor::from_slice(&[1f32, 2., 3., 4., 5., 6.])
            .reshape([2, 3])
            .transpose(0, 1);
        let out = from_torch("t", &t).unwrap();
        assert_eq!(out.shape(), [3, 2]);
        let values: Vec<f32> = out
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(values, [1., 4., 2., 5., 3., 6.]);
    }
}
