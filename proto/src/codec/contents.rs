//! Typed `InferTensorContents` → raw little-endian tensor bytes.
//!
//! A gRPC client may send an input's values in the repeated field that matches its datatype
//! instead of in `raw_input_contents`. Each datatype has exactly one such field; the narrow
//! integer types share the 32-bit fields, and FP16/BF16 have none (they travel raw only):
//!
//! ```text
//! BOOL → bool_contents        INT8/16/32 → int_contents     UINT8/16/32 → uint_contents
//! INT64 → int64_contents      UINT64 → uint64_contents      FP32 → fp32_contents
//! FP64 → fp64_contents        BYTES → bytes_contents (each element 4-byte LE length + bytes)
//! ```
//!
//! Values are checked against the datatype's range (Triton silently truncates; we refuse), and
//! their count against the shape, before they are packed into the layout [`Tensor`] expects.
//!
//! [`Tensor`]: crate::types::Tensor

use std::fmt::Display;

use bytes::Bytes;

use crate::datatype::DataType;
use crate::error::{ServiceError, ServiceResult};
use crate::pb::inference::InferTensorContents;
use crate::types::{format_shape, push_bytes_element};

/// Which input of which model the contents belong to, for error messages.
#[derive(Clone, Copy)]
pub(crate) struct InputRef<'a> {
    pub model: &'a str,
    pub input: &'a str,
}

impl InputRef<'_> {
    fn invalid(&self, what: impl Display) -> ServiceError {
        ServiceError::invalid(format!(
            "input '{}' for model '{}': {what}",
            self.input, self.model
        ))
    }
}

/// Every typed field, in `InferTensorContents` order, with the datatype Triton names it by in
/// its mismatch message.
const FIELDS: [(&str, DataType); 8] = [
    ("bool_contents", DataType::Bool),
    ("int_contents", DataType::Int32),
    ("int64_contents", DataType::Int64),
    ("uint_contents", DataType::Uint32),
    ("uint64_contents", DataType::Uint64),
    ("fp32_contents", DataType::Fp32),
    ("fp64_contents", DataType::Fp64),
    ("bytes_contents", DataType::Bytes),
];

/// The typed field that carries `datatype`; `None` for FP16/BF16.
fn field_for(datatype: DataType) -> Option<&'static str> {
    match datatype {
        DataType::Bool => Some("bool_contents"),
        DataType::Int8 | DataType::Int16 | DataType::Int32 => Some("int_contents"),
        DataType::Int64 => Some("int64_contents"),
        DataType::Uint8 | DataType::Uint16 | DataType::Uint32 => Some("uint_contents"),
        DataType::Uint64 => Some("uint64_contents"),
        DataType::Fp32 => Some("fp32_contents"),
        DataType::Fp64 => Some("fp64_contents"),
        DataType::Bytes => Some("bytes_contents"),
        DataType::Fp16 | DataType::Bf16 => None,
    }
}

/// Packs an input's typed contents into raw bytes for a tensor of `datatype` and `shape`
/// (already checked non-negative, with `element_count` elements).
pub(crate) fn contents_to_bytes(
    at: InputRef<'_>,
    datatype: DataType,
    shape: &[i64],
    element_count: usize,
    contents: InferTensorContents,
) -> ServiceResult<Bytes> {
    let c = &contents;
    let lengths = [
        c.bool_contents.len(),
        c.int_contents.len(),
        c.int64_contents.len(),
        c.uint_contents.len(),
        c.uint64_contents.len(),
        c.fp32_contents.len(),
        c.fp64_contents.len(),
        c.bytes_contents.len(),
    ];
    let Some(expected) = field_for(datatype) else {
        return Err(at.invalid(format!(
            "{datatype} data cannot be sent in typed contents; send it in raw_input_contents"
        )));
    };
    let mut found = 0;
    for ((field, field_type), len) in FIELDS.into_iter().zip(lengths) {
        if field == expected {
            found = len;
        } else if len != 0 {
            return Err(ServiceError::invalid(format!(
                "unexpected explicit tensor data for input tensor '{}' for model '{}' of type '{field_type}', expected datatype '{datatype}' (send {datatype} data in {expected})",
                at.input, at.model
            )));
        }
    }
    if found != element_count {
        return Err(at.invalid(format!(
            "shape {} needs {element_count} elements, but {expected} holds {found}",
            format_shape(shape)
        )));
    }

    let out_of_range = |(index, value): (usize, String)| {
        at.invalid(format!(
            "{expected}[{index}] = {value} is out of range for {datatype}"
        ))
    };
    let data = match datatype {
        DataType::Bool => pack(&c.bool_contents, |v| Some([u8::from(v)])).map_err(out_of_range)?,
        DataType::Int8 => pack(&c.int_contents, |v| {
            i8::try_from(v).ok().map(i8::to_le_bytes)
        })
        .map_err(out_of_range)?,
        DataType::Int16 => pack(&c.int_contents, |v| {
            i16::try_from(v).ok().map(i16::to_le_bytes)
        })
        .map_err(out_of_range)?,
        DataType::Int32 => {
            pack(&c.int_contents, |v| Some(v.to_le_bytes())).map_err(out_of_range)?
        }
        DataType::Int64 => {
            pack(&c.int64_contents, |v| Some(v.to_le_bytes())).map_err(out_of_range)?
        }
        DataType::Uint8 => pack(&c.uint_contents, |v| {
            u8::try_from(v).ok().map(u8::to_le_bytes)
        })
        .map_err(out_of_range)?,
        DataType::Uint16 => pack(&c.uint_contents, |v| {
            u16::try_from(v).ok().map(u16::to_le_bytes)
        })
        .map_err(out_of_range)?,
        DataType::Uint32 => {
            pack(&c.uint_contents, |v| Some(v.to_le_bytes())).map_err(out_of_range)?
        }
        DataType::Uint64 => {
            pack(&c.uint64_contents, |v| Some(v.to_le_bytes())).map_err(out_of_range)?
        }
        DataType::Fp32 => {
            pack(&c.fp32_contents, |v| Some(v.to_le_bytes())).map_err(out_of_range)?
        }
        DataType::Fp64 => {
            pack(&c.fp64_contents, |v| Some(v.to_le_bytes())).map_err(out_of_range)?
        }
        DataType::Bytes => {
            let total = c.bytes_contents.iter().map(|e| 4 + e.len()).sum();
            let mut out = Vec::with_capacity(total);
            for element in &c.bytes_contents {
                if u32::try_from(element.len()).is_err() {
                    return Err(at.invalid("a bytes_contents element is 4 GiB or longer"));
                }
                push_bytes_element(&mut out, element);
            }
            out
        }
        // Refused above: these datatypes have no typed field.
        DataType::Fp16 | DataType::Bf16 => Vec::new(),
    };
    Ok(Bytes::from(data))
}

/// Packs values into little-endian bytes; stops at the first value `convert` rejects and
/// returns its index and the value as text.
fn pack<S: Copy + Display, const N: usize>(
    values: &[S],
    convert: impl Fn(S) -> Option<[u8; N]>,
) -> Result<Vec<u8>, (usize, String)> {
    let mut out = Vec::with_capacity(values.len() * N);
    for (index, &value) in values.iter().enumerate() {
        let bytes = convert(value).ok_or_else(|| (index, value.to_string()))?;
        out.extend_from_slice(&bytes);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::element_count;

    fn typed(datatype: &str, shape: &[i64], contents: InferTensorContents) -> ServiceResult<Bytes> {
        let at = InputRef {
            model: "m",
            input: "x",
        };
        let dtype = DataType::from_wire(datatype).unwrap();
        let count = element_count(shape).unwrap();
        contents_to_bytes(at, dtype, shape, count, contents)
    }

    fn le<const N: usize>(values: impl IntoIterator<Item = [u8; N]>) -> Bytes {
        Bytes::from(values.into_iter().flatten().collect::<Vec<u8>>())
    }

    fn ints(v: Vec<i32>) -> InferTensorContents {
        InferTensorContents {
            int_contents: v,
            ..Default::default()
        }
    }

    fn uints(v: Vec<u32>) -> InferTensorContents {
        InferTensorContents {
            uint_contents: v,
            ..Default::default()
        }
    }

    #[test]
    fn every_typed_datatype_packs_little_endian() {
        let c = InferTensorContents::default;
        let cases = [
            (
                "BOOL",
                InferTensorContents {
                    bool_contents: vec![true, false],
                    ..c()
                },
                le([[1], [0]]),
            ),
            (
                "INT8",
                ints(vec![-1, 2]),
                le([(-1i8).to_le_bytes(), 2i8.to_le_bytes()]),
            ),
            (
                "INT16",
                ints(vec![-1, 2]),
                le([(-1i16).to_le_bytes(), 2i16.to_le_bytes()]),
            ),
            (
                "INT32",
                ints(vec![-1, 2]),
                le([(-1i32).to_le_bytes(), 2i32.to_le_bytes()]),
            ),
            ("UINT8", uints(vec![1, 255]), le([[1], [255]])),
            (
                "UINT16",
                uints(vec![1, 255]),
                le([1u16.to_le_bytes(), 255u16.to_le_bytes()]),
            ),
            (
                "UINT32",
                uints(vec![1, 255]),
                le([1u32.to_le_bytes(), 255u32.to_le_bytes()]),
            ),
        ];
        for (datatype, contents, expected) in cases {
            let got = typed(datatype, &[2], contents).unwrap_or_else(|e| panic!("{datatype}: {e}"));
            assert_eq!(got, expected, "{datatype}");
        }

        let wide = [
            (
                "INT64",
                InferTensorContents {
                    int64_contents: vec![i64::MIN, 7],
                    ..c()
                },
            ),
            (
                "UINT64",
                InferTensorContents {
                    uint64_contents: vec![u64::MAX, 3],
                    ..c()
                },
            ),
            (
                "FP64",
                InferTensorContents {
                    fp64_contents: vec![0.25, 1e300],
                    ..c()
                },
            ),
        ];
        let expected = [
            le([i64::MIN.to_le_bytes(), 7i64.to_le_bytes()]),
            le([u64::MAX.to_le_bytes(), 3u64.to_le_bytes()]),
            le([0.25f64.to_le_bytes(), 1e300f64.to_le_bytes()]),
        ];
        for ((datatype, contents), expected) in wide.into_iter().zip(expected) {
            assert_eq!(
                typed(datatype, &[2], contents).unwrap(),
                expected,
                "{datatype}"
            );
        }
        let fp32 = InferTensorContents {
            fp32_contents: vec![1.5, -2.0],
            ..c()
        };
        let expected = le([1.5f32.to_le_bytes(), (-2.0f32).to_le_bytes()]);
        assert_eq!(typed("FP32", &[1, 2], fp32).unwrap(), expected);

        let elements = [&b"ab"[..], b"", b"xyz"];
        let strings = InferTensorContents {
            bytes_contents: elements.iter().map(|e| Bytes::copy_from_slice(e)).collect(),
            ..c()
        };
        let mut expected = Vec::new();
        for e in elements {
            push_bytes_element(&mut expected, e);
        }
        assert_eq!(
            typed("BYTES", &[1, 3], strings).unwrap(),
            Bytes::from(expected)
        );
    }

    #[test]
    fn half_precision_has_no_typed_field() {
        for datatype in ["FP16", "BF16"] {
            let contents = InferTensorContents {
                fp32_contents: vec![1.0],
                ..Default::default()
            };
            let err = typed(datatype, &[1], contents).unwrap_err();
            assert!(matches!(err, ServiceError::InvalidArgument(_)));
            assert_eq!(
                err.message(),
                format!(
                    "input 'x' for model 'm': {datatype} data cannot be sent in typed contents; send it in raw_input_contents"
                )
            );
        }
    }

    #[test]
    fn contents_field_must_match_the_datatype() {
        let contents = InferTensorContents {
            fp32_contents: vec![1.0],
            ..Default::default()
        };
        let err = typed("INT32", &[1], contents).unwrap_err();
        assert_eq!(
            err.message(),
            "unexpected explicit tensor data for input tensor 'x' for model 'm' of type 'FP32', expected datatype 'INT32' (send INT32 data in int_contents)"
        );
        // A second field is refused even next to the right one.
        let contents = InferTensorContents {
            int_contents: vec![1],
            int64_contents: vec![1],
            ..Default::default()
        };
        let err = typed("INT32", &[1], contents).unwrap_err();
        assert!(
            err.message().contains("of type 'INT64'"),
            "{}",
            err.message()
        );
        // int_contents does not fill a UINT8 input.
        assert!(typed("UINT8", &[1], ints(vec![1])).is_err());
    }

    #[test]
    fn narrow_integers_are_range_checked() {
        let err = typed("INT8", &[2], ints(vec![1, 300])).unwrap_err();
        assert!(matches!(err, ServiceError::InvalidArgument(_)));
        assert_eq!(
            err.message(),
            "input 'x' for model 'm': int_contents[1] = 300 is out of range for INT8"
        );
        assert!(typed("INT8", &[2], ints(vec![-128, 127])).is_ok());
        assert!(typed("INT8", &[1], ints(vec![-129])).is_err());
        assert!(
            typed("INT16", &[1], ints(vec![-40000]))
                .unwrap_err()
                .message()
                .contains("INT16")
        );
        assert!(
            typed("UINT8", &[1], uints(vec![256]))
                .unwrap_err()
                .message()
                .contains("UINT8")
        );
        let err = typed("UINT16", &[1], uints(vec![70000])).unwrap_err();
        assert!(
            err.message().contains("uint_contents[0] = 70000"),
            "{}",
            err.message()
        );
        assert!(typed("UINT16", &[1], uints(vec![65535])).is_ok());
    }

    #[test]
    fn element_count_must_match_the_shape() {
        let err = typed("INT32", &[2, 2], ints(vec![1, 2, 3])).unwrap_err();
        assert_eq!(
            err.message(),
            "input 'x' for model 'm': shape [2,2] needs 4 elements, but int_contents holds 3"
        );
        // Empty contents fit an empty tensor.
        assert_eq!(
            typed("FP32", &[0, 4], InferTensorContents::default()).unwrap(),
            Bytes::new()
        );
    }
}
