//! Triton datatypes ↔ the element types of the PyTorch backend's C ABI (nereid-torch-abi).
//! Pure; what libtorch makes of each is the library's business (torch-backend/src/convert.rs).

use nereid_proto::DataType;
use nereid_torch_abi::ElementType;

/// The ABI element type of a Triton datatype; `None` for those libtorch lacks
/// (`UINT16`/`UINT32`/`UINT64`, which tch cannot name). `BYTES` travels as a `List[str]`.
pub(crate) fn element_type(datatype: DataType) -> Option<ElementType> {
    Some(match datatype {
        DataType::Bool => ElementType::Bool,
        DataType::Uint8 => ElementType::Uint8,
        DataType::Int8 => ElementType::Int8,
        DataType::Int16 => ElementType::Int16,
        DataType::Int32 => ElementType::Int32,
        DataType::Int64 => ElementType::Int64,
        DataType::Fp16 => ElementType::Fp16,
        DataType::Fp32 => ElementType::Fp32,
        DataType::Fp64 => ElementType::Fp64,
        DataType::Bf16 => ElementType::Bf16,
        DataType::Bytes => ElementType::Bytes,
        DataType::Uint16 | DataType::Uint32 | DataType::Uint64 => return None,
    })
}

/// The Triton datatype of an ABI element type.
pub(crate) fn datatype(element: ElementType) -> DataType {
    match element {
        ElementType::Bool => DataType::Bool,
        ElementType::Uint8 => DataType::Uint8,
        ElementType::Int8 => DataType::Int8,
        ElementType::Int16 => DataType::Int16,
        ElementType::Int32 => DataType::Int32,
        ElementType::Int64 => DataType::Int64,
        ElementType::Fp16 => DataType::Fp16,
        ElementType::Fp32 => DataType::Fp32,
        ElementType::Fp64 => DataType::Fp64,
        ElementType::Bf16 => DataType::Bf16,
        ElementType::Bytes => DataType::Bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shared_datatype_round_trips_with_the_same_name_and_size() {
        for d in DataType::ALL {
            match element_type(d) {
                Some(e) => {
                    assert_eq!(datatype(e), d);
                    assert_eq!(e.name(), d.to_string());
                }
                None => assert!(matches!(
                    d,
                    DataType::Uint16 | DataType::Uint32 | DataType::Uint64
                )),
            }
        }
    }
}
