//! Tensor element types: the wire strings (`"FP32"`), the config enum (`TYPE_FP32`) and sizes.

use std::fmt;

use crate::pb::inference::DataType as ConfigDataType;

/// A tensor element type as the KServe v2 protocol names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DataType {
    /// `BOOL`: one byte per element.
    Bool,
    /// `UINT8`.
    Uint8,
    /// `UINT16`, little-endian.
    Uint16,
    /// `UINT32`, little-endian.
    Uint32,
    /// `UINT64`, little-endian.
    Uint64,
    /// `INT8`.
    Int8,
    /// `INT16`, little-endian.
    Int16,
    /// `INT32`, little-endian.
    Int32,
    /// `INT64`, little-endian.
    Int64,
    /// `FP16`: IEEE half precision, little-endian.
    Fp16,
    /// `FP32`, little-endian.
    Fp32,
    /// `FP64`, little-endian.
    Fp64,
    /// Variable-length byte strings; each element is a 4-byte little-endian length then bytes.
    Bytes,
    /// `BF16`: bfloat16, little-endian.
    Bf16,
}

impl DataType {
    /// Every element type, in the config enum's order.
    pub const ALL: [DataType; 14] = [
        DataType::Bool,
        DataType::Uint8,
        DataType::Uint16,
        DataType::Uint32,
        DataType::Uint64,
        DataType::Int8,
        DataType::Int16,
        DataType::Int32,
        DataType::Int64,
        DataType::Fp16,
        DataType::Fp32,
        DataType::Fp64,
        DataType::Bytes,
        DataType::Bf16,
    ];

    /// Parses a wire datatype string (`"FP32"`, `"BYTES"`...). Case-sensitive, like Triton.
    pub fn from_wire(s: &str) -> Option<DataType> {
        Self::ALL.into_iter().find(|d| d.as_wire() == s)
    }

    /// The wire name (`"FP32"`), as the KServe v2 protocol and Triton's messages spell it.
    pub fn as_wire(self) -> &'static str {
        match self {
            DataType::Bool => "BOOL",
            DataType::Uint8 => "UINT8",
            DataType::Uint16 => "UINT16",
            DataType::Uint32 => "UINT32",
            DataType::Uint64 => "UINT64",
            DataType::Int8 => "INT8",
            DataType::Int16 => "INT16",
            DataType::Int32 => "INT32",
            DataType::Int64 => "INT64",
            DataType::Fp16 => "FP16",
            DataType::Fp32 => "FP32",
            DataType::Fp64 => "FP64",
            DataType::Bytes => "BYTES",
            DataType::Bf16 => "BF16",
        }
    }

    /// Size of one element in bytes; `None` for the variable-length `BYTES`.
    pub fn element_size(self) -> Option<usize> {
        match self {
            DataType::Bool | DataType::Uint8 | DataType::Int8 => Some(1),
            DataType::Uint16 | DataType::Int16 | DataType::Fp16 | DataType::Bf16 => Some(2),
            DataType::Uint32 | DataType::Int32 | DataType::Fp32 => Some(4),
            DataType::Uint64 | DataType::Int64 | DataType::Fp64 => Some(8),
            DataType::Bytes => None,
        }
    }

    /// The config enum value (`TYPE_FP32`) for this wire type.
    pub fn to_config(self) -> ConfigDataType {
        match self {
            DataType::Bool => ConfigDataType::TypeBool,
            DataType::Uint8 => ConfigDataType::TypeUint8,
            DataType::Uint16 => ConfigDataType::TypeUint16,
            DataType::Uint32 => ConfigDataType::TypeUint32,
            DataType::Uint64 => ConfigDataType::TypeUint64,
            DataType::Int8 => ConfigDataType::TypeInt8,
            DataType::Int16 => ConfigDataType::TypeInt16,
            DataType::Int32 => ConfigDataType::TypeInt32,
            DataType::Int64 => ConfigDataType::TypeInt64,
            DataType::Fp16 => ConfigDataType::TypeFp16,
            DataType::Fp32 => ConfigDataType::TypeFp32,
            DataType::Fp64 => ConfigDataType::TypeFp64,
            DataType::Bytes => ConfigDataType::TypeString,
            DataType::Bf16 => ConfigDataType::TypeBf16,
        }
    }

    /// The wire type for a config enum value; `None` for `TYPE_INVALID`.
    pub fn from_config(t: ConfigDataType) -> Option<DataType> {
        Some(match t {
            ConfigDataType::TypeInvalid => return None,
            ConfigDataType::TypeBool => DataType::Bool,
            ConfigDataType::TypeUint8 => DataType::Uint8,
            ConfigDataType::TypeUint16 => DataType::Uint16,
            ConfigDataType::TypeUint32 => DataType::Uint32,
            ConfigDataType::TypeUint64 => DataType::Uint64,
            ConfigDataType::TypeInt8 => DataType::Int8,
            ConfigDataType::TypeInt16 => DataType::Int16,
            ConfigDataType::TypeInt32 => DataType::Int32,
            ConfigDataType::TypeInt64 => DataType::Int64,
            ConfigDataType::TypeFp16 => DataType::Fp16,
            ConfigDataType::TypeFp32 => DataType::Fp32,
            ConfigDataType::TypeFp64 => DataType::Fp64,
            ConfigDataType::TypeString => DataType::Bytes,
            ConfigDataType::TypeBf16 => DataType::Bf16,
        })
    }

    /// The wire type for a raw config enum number (as prost stores it).
    pub fn from_config_i32(v: i32) -> Option<DataType> {
        ConfigDataType::try_from(v).ok().and_then(Self::from_config)
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_wire())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_and_config_round_trip() {
        for d in DataType::ALL {
            assert_eq!(DataType::from_wire(d.as_wire()), Some(d));
            assert_eq!(DataType::from_config(d.to_config()), Some(d));
        }
        assert_eq!(DataType::from_wire("fp32"), None);
        assert_eq!(DataType::from_config(ConfigDataType::TypeInvalid), None);
    }
}
