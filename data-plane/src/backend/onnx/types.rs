//! ONNX element types ↔ Triton datatypes, in one place.
//!
//! Triton serves every ONNX tensor element type that has a Triton datatype; ONNX `string` is
//! Triton's `BYTES` (`TYPE_STRING` in a config). Everything else (complex, float8, 4-bit, ...)
//! and every non-tensor value (sequence, map, optional) cannot be served.

use nereid_proto::DataType;
use ort::value::{TensorElementType, ValueType};

/// The Triton datatype of an ONNX element type; `None` when Triton has no equivalent.
pub(crate) fn datatype_of(ty: TensorElementType) -> Option<DataType> {
    Some(match ty {
        TensorElementType::Bool => DataType::Bool,
        TensorElementType::Uint8 => DataType::Uint8,
        TensorElementType::Uint16 => DataType::Uint16,
        TensorElementType::Uint32 => DataType::Uint32,
        TensorElementType::Uint64 => DataType::Uint64,
        TensorElementType::Int8 => DataType::Int8,
        TensorElementType::Int16 => DataType::Int16,
        TensorElementType::Int32 => DataType::Int32,
        TensorElementType::Int64 => DataType::Int64,
        TensorElementType::Float16 => DataType::Fp16,
        TensorElementType::Bfloat16 => DataType::Bf16,
        TensorElementType::Float32 => DataType::Fp32,
        TensorElementType::Float64 => DataType::Fp64,
        TensorElementType::String => DataType::Bytes,
        _ => return None,
    })
}

/// The ONNX element type that carries a Triton datatype.
#[cfg(test)]
pub(crate) fn onnx_type_of(dt: DataType) -> TensorElementType {
    match dt {
        DataType::Bool => TensorElementType::Bool,
        DataType::Uint8 => TensorElementType::Uint8,
        DataType::Uint16 => TensorElementType::Uint16,
        DataType::Uint32 => TensorElementType::Uint32,
        DataType::Uint64 => TensorElementType::Uint64,
        DataType::Int8 => TensorElementType::Int8,
        DataType::Int16 => TensorElementType::Int16,
        DataType::Int32 => TensorElementType::Int32,
        DataType::Int64 => TensorElementType::Int64,
        DataType::Fp16 => TensorElementType::Float16,
        DataType::Bf16 => TensorElementType::Bfloat16,
        DataType::Fp32 => TensorElementType::Float32,
        DataType::Fp64 => TensorElementType::Float64,
        DataType::Bytes => TensorElementType::String,
    }
}

/// The config spelling of a datatype, as Triton's messages use it (`TYPE_FP32`, `TYPE_STRING`).
pub(crate) fn config_name(dt: DataType) -> String {
    format!(
        "TYPE_{}",
        if dt == DataType::Bytes {
            "STRING"
        } else {
            dt.as_wire()
        }
    )
}

/// The datatype of a model input/output as ONNX Runtime reports it: `Ok` with the Triton datatype,
/// or `Err` with a description of the ONNX type that Triton cannot serve.
pub(crate) fn datatype_of_value(vt: &ValueType) -> Result<DataType, String> {
    match vt {
        ValueType::Tensor { ty, .. } => {
            datatype_of(*ty).ok_or_else(|| format!("ONNX tensor element type '{ty}'"))
        }
        ValueType::Sequence(_) => Err("an ONNX sequence".to_string()),
        ValueType::Map { .. } => Err("an ONNX map".to_string()),
        ValueType::Optional(_) => Err("an ONNX optional value".to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_datatype_round_trips_through_onnx() {
        for dt in DataType::ALL {
            assert_eq!(datatype_of(onnx_type_of(dt)), Some(dt), "{dt}");
        }
        assert_eq!(datatype_of(TensorElementType::Complex64), None);
        assert_eq!(config_name(DataType::Bytes), "TYPE_STRING");
        assert_eq!(config_name(DataType::Bf16), "TYPE_BF16");
    }
}
