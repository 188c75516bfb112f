//! Tensor elements between three forms: JSON values (input files, the HTTP JSON body), seeded
//! random values, and the raw little-endian bytes every protocol ends up sending.
//!
//! `BYTES` elements use Triton's layout: a 4-byte little-endian length, then the bytes.

use nereid_proto::{DataType, bytes_elements, push_bytes_element};
use serde_json::Value;

use crate::rng::SplitMix64;

/// Random integers are drawn from `[0, RANDOM_INT_BOUND)`: valid for every integer type and
/// harmless for index-like inputs (embeddings, gathers), unlike the full range.
const RANDOM_INT_BOUND: u64 = 100;

/// Appends `count` seeded random elements of `datatype` to `out`. Floats are uniform in
/// `[0, 1)`; `BYTES` elements are lowercase ASCII strings of `string_length` characters.
pub fn push_random(
    out: &mut Vec<u8>,
    datatype: DataType,
    count: usize,
    rng: &mut SplitMix64,
    string_length: usize,
) {
    for _ in 0..count {
        let i = rng.below(RANDOM_INT_BOUND);
        match datatype {
            DataType::Bool => out.push(u8::from(rng.below(2) == 1)),
            DataType::Uint8 | DataType::Int8 => out.push(i as u8),
            DataType::Uint16 | DataType::Int16 => out.extend_from_slice(&(i as u16).to_le_bytes()),
            DataType::Uint32 | DataType::Int32 => out.extend_from_slice(&(i as u32).to_le_bytes()),
            DataType::Uint64 | DataType::Int64 => out.extend_from_slice(&i.to_le_bytes()),
            DataType::Fp16 => {
                out.extend_from_slice(&half::f16::from_f64(rng.next_f64()).to_le_bytes());
            }
            DataType::Bf16 => {
                out.extend_from_slice(&half::bf16::from_f64(rng.next_f64()).to_le_bytes());
            }
            DataType::Fp32 => out.extend_from_slice(&(rng.next_f64() as f32).to_le_bytes()),
            DataType::Fp64 => out.extend_from_slice(&rng.next_f64().to_le_bytes()),
            DataType::Bytes => {
                let s: Vec<u8> = (0..string_length)
                    .map(|_| b'a' + rng.below(26) as u8)
                    .collect();
                push_bytes_element(out, &s);
            }
        }
    }
}

/// Appends `count` zero elements (`BYTES`: empty strings).
pub fn push_zeros(out: &mut Vec<u8>, datatype: DataType, count: usize) {
    match datatype.element_size() {
        Some(size) => out.resize(out.len() + size * count, 0),
        None => (0..count).for_each(|_| push_bytes_element(out, b"")),
    }
}

/// Encodes flat JSON values as elements of `datatype`; the error names the offending value.
pub fn json_to_bytes(datatype: DataType, values: &[Value]) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(values.len() * datatype.element_size().unwrap_or(8));
    for v in values {
        let bad = || format!("value {v} is not a valid {datatype} element");
        macro_rules! int {
            ($t:ty) => {{
                let n = v
                    .as_i64()
                    .and_then(|n| <$t>::try_from(n).ok())
                    .or_else(|| v.as_u64().and_then(|n| <$t>::try_from(n).ok()))
                    .ok_or_else(bad)?;
                out.extend_from_slice(&n.to_le_bytes());
            }};
        }
        match datatype {
            DataType::Bool => {
                let b = v
                    .as_bool()
                    .or_else(|| v.as_u64().filter(|n| *n <= 1).map(|n| n == 1));
                out.push(u8::from(b.ok_or_else(bad)?));
            }
            DataType::Uint8 => int!(u8),
            DataType::Uint16 => int!(u16),
            DataType::Uint32 => int!(u32),
            DataType::Uint64 => int!(u64),
            DataType::Int8 => int!(i8),
            DataType::Int16 => int!(i16),
            DataType::Int32 => int!(i32),
            DataType::Int64 => int!(i64),
            DataType::Fp16 => {
                out.extend_from_slice(
                    &half::f16::from_f64(v.as_f64().ok_or_else(bad)?).to_le_bytes(),
                );
            }
            DataType::Bf16 => {
                out.extend_from_slice(
                    &half::bf16::from_f64(v.as_f64().ok_or_else(bad)?).to_le_bytes(),
                );
            }
            DataType::Fp32 => {
                out.extend_from_slice(&(v.as_f64().ok_or_else(bad)? as f32).to_le_bytes())
            }
            DataType::Fp64 => out.extend_from_slice(&v.as_f64().ok_or_else(bad)?.to_le_bytes()),
            DataType::Bytes => push_bytes_element(&mut out, v.as_str().ok_or_else(bad)?.as_bytes()),
        }
    }
    Ok(out)
}

/// Decodes raw elements back to JSON values for the HTTP JSON body. FP16 and BF16 have no JSON
/// form in KServe v2 (Triton refuses them), and `BYTES` elements must be UTF-8.
pub fn bytes_to_json(datatype: DataType, data: &[u8]) -> Result<Vec<Value>, String> {
    macro_rules! fixed {
        ($t:ty, $n:expr) => {
            data.chunks_exact($n)
                .map(|c| {
                    let mut a = [0u8; $n];
                    a.copy_from_slice(c);
                    Value::from(<$t>::from_le_bytes(a))
                })
                .collect()
        };
    }
    Ok(match datatype {
        DataType::Bool => data.iter().map(|b| Value::Bool(*b != 0)).collect(),
        DataType::Uint8 => data.iter().map(|b| Value::from(*b)).collect(),
        DataType::Int8 => data.iter().map(|b| Value::from(*b as i8)).collect(),
        DataType::Uint16 => fixed!(u16, 2),
        DataType::Int16 => fixed!(i16, 2),
        DataType::Uint32 => fixed!(u32, 4),
        DataType::Int32 => fixed!(i32, 4),
        DataType::Uint64 => fixed!(u64, 8),
        DataType::Int64 => fixed!(i64, 8),
        DataType::Fp32 => fixed!(f32, 4),
        DataType::Fp64 => fixed!(f64, 8),
        DataType::Fp16 | DataType::Bf16 => {
            return Err(format!(
                "{datatype} tensors cannot be sent as JSON; drop --http-json to use the binary tensor extension"
            ));
        }
        DataType::Bytes => bytes_elements(data)
            .map(|e| {
                std::str::from_utf8(e)
                    .map(|s| Value::String(s.to_string()))
                    .map_err(|_| {
                        "BYTES element is not UTF-8 and cannot be sent as JSON; drop --http-json"
                            .to_string()
                    })
            })
            .collect::<Result<Vec<Value>, String>>()?,
    })
}

/// Flattens nested JSON arrays (row-major) into one list of scalars.
pub fn flatten(value: &Value, out: &mut Vec<Value>) {
    match value {
        Value::Array(items) => items.iter().for_each(|i| flatten(i, out)),
        other => out.push(other.clone()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn json_round_trips_through_bytes() {
        let cases = [
            (DataType::Int32, json!([1, -2, 3])),
            (DataType::Uint8, json!([0, 255])),
            (DataType::Fp32, json!([0.5, -1.25])),
            (DataType::Fp64, json!([1e-3])),
            (DataType::Bool, json!([true, false])),
            (DataType::Int64, json!([-9007199254740993i64])),
            (DataType::Bytes, json!(["ab", "", "ünï"])),
        ];
        for (dt, values) in cases {
            let list = values.as_array().unwrap().clone();
            let raw = json_to_bytes(dt, &list).unwrap();
            assert_eq!(bytes_to_json(dt, &raw).unwrap(), list, "{dt}");
        }
    }

    #[test]
    fn json_errors_name_the_value() {
        assert!(
            json_to_bytes(DataType::Int8, &[json!(300)])
                .unwrap_err()
                .contains("300")
        );
        assert!(json_to_bytes(DataType::Uint32, &[json!(-1)]).is_err());
        assert!(json_to_bytes(DataType::Fp32, &[json!("x")]).is_err());
        assert!(json_to_bytes(DataType::Bytes, &[json!(1)]).is_err());
        assert!(
            bytes_to_json(DataType::Fp16, &[0, 0])
                .unwrap_err()
                .contains("--http-json")
        );
    }

    #[test]
    fn random_and_zero_sizes() {
        let mut rng = SplitMix64::new(1);
        let mut out = Vec::new();
        push_random(&mut out, DataType::Fp16, 3, &mut rng, 0);
        assert_eq!(out.len(), 6);
        let mut s = Vec::new();
        push_random(&mut s, DataType::Bytes, 2, &mut rng, 5);
        assert_eq!(s.len(), 2 * (4 + 5));
        let mut z = Vec::new();
        push_zeros(&mut z, DataType::Int64, 2);
        push_zeros(&mut z, DataType::Bytes, 1);
        assert_eq!(z, vec![0u8; 20]);
    }

    #[test]
    fn flattens_nested_arrays() {
        let mut out = Vec::new();
        flatten(&json!([[1, 2], [3]]), &mut out);
        assert_eq!(out, vec![json!(1), json!(2), json!(3)]);
    }
}
