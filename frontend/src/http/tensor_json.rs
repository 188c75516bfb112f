//! Tensor `data` in JSON ↔ raw little-endian tensor bytes.
//!
//! Decoding takes a request input's `data` (flat or nested arrays, row-major; only the element
//! count must match the shape, as in Triton), checks every element against the datatype (type
//! and integer range, naming the input) and writes the bytes once into a buffer of the exact
//! size, counted in a first pass so a lying shape cannot make us allocate. `BYTES` elements are
//! JSON strings stored in Triton's layout (4-byte LE length, then the bytes). FP16 and BF16 are
//! refused in JSON requests, as in Triton.
//!
//! Encoding ([`JsonData`]) streams an output's elements straight into the response serializer as
//! a flat array. Choices where Triton has no usable answer, documented here once:
//! - FP16/BF16 outputs asked for as JSON are written as numbers (Triton refuses with "sending
//!   FP16 data via JSON is not supported"); the values are exact, a client casts them back.
//! - NaN and ±Inf are written as `null`: JSON has no literal for them, and `null` keeps the
//!   document parseable (numpy turns it back into NaN for float arrays).
//! - `BYTES` elements that are not UTF-8 cannot be JSON strings; the response encoder sends such
//!   an output as binary instead (see [`bytes_are_utf8`]), so no data is altered.

use bytes::Bytes;
use serde::ser::{Error as _, SerializeSeq};
use serde::{Serialize, Serializer};
use serde_json::Value;

use super::json_body::{MAX_DATA_DEPTH, depth_error};
use nereid_proto::{DataType, ServiceError, ServiceResult, bytes_elements, push_bytes_element};

/// Converts an input's JSON `data` to tensor bytes. `element_count` is the shape's product;
/// `max_bytes` bounds the decoded size (`--http-max-input-size`).
pub fn decode_data(
    input: &str,
    datatype: DataType,
    element_count: usize,
    data: &Value,
    max_bytes: usize,
) -> ServiceResult<Bytes> {
    if matches!(datatype, DataType::Fp16 | DataType::Bf16) {
        return Err(half_refused(input, datatype));
    }
    if !data.is_array() {
        return Err(ServiceError::invalid(format!(
            "input '{input}': 'data' must be an array, got {}",
            describe(data)
        )));
    }
    let mut found = 0usize;
    let mut string_bytes = 0usize;
    count_leaves(data, 0, &mut found, &mut string_bytes)?;
    if found != element_count {
        // Triton's words and code (500) for a data/shape mismatch; the request's own numbers
        // would help more, but clients match on Triton's text.
        return Err(ServiceError::internal(
            "Unable to parse 'data': Shape does not match true shape of 'data' field",
        ));
    }
    let byte_size = match datatype.element_size() {
        Some(size) => found.saturating_mul(size),
        None => string_bytes.saturating_add(found.saturating_mul(4)),
    };
    if byte_size > max_bytes {
        return Err(ServiceError::invalid(format!(
            "JSON input '{input}' has a byte_size ({byte_size} bytes) that exceeds the maximum allowed value of {max_bytes} bytes. Use --http-max-input-size to increase the limit."
        )));
    }
    let ctx = Element { input, datatype };
    let mut out = Vec::with_capacity(byte_size);
    let mut put = |v: &Value| -> ServiceResult<()> {
        match datatype {
            DataType::Bool => out.push(u8::from(ctx.boolean(v)?)),
            DataType::Uint8 => out.push(ctx.unsigned(v, u8::MAX.into())? as u8),
            DataType::Uint16 => {
                out.extend((ctx.unsigned(v, u16::MAX.into())? as u16).to_le_bytes())
            }
            DataType::Uint32 => {
                out.extend((ctx.unsigned(v, u32::MAX.into())? as u32).to_le_bytes())
            }
            DataType::Uint64 => out.extend(ctx.unsigned(v, u64::MAX)?.to_le_bytes()),
            DataType::Int8 => {
                out.extend((ctx.signed(v, i8::MIN.into(), i8::MAX.into())? as i8).to_le_bytes())
            }
            DataType::Int16 => {
                out.extend((ctx.signed(v, i16::MIN.into(), i16::MAX.into())? as i16).to_le_bytes())
            }
            DataType::Int32 => {
                out.extend((ctx.signed(v, i32::MIN.into(), i32::MAX.into())? as i32).to_le_bytes())
            }
            DataType::Int64 => out.extend(ctx.signed(v, i64::MIN, i64::MAX)?.to_le_bytes()),
            // Narrowing to f32 rounds, and overflows to ±inf, exactly like Triton's cast.
            DataType::Fp32 => out.extend((ctx.float(v)? as f32).to_le_bytes()),
            DataType::Fp64 => out.extend(ctx.float(v)?.to_le_bytes()),
            DataType::Bytes => push_bytes_element(&mut out, ctx.string(v)?.as_bytes()),
            DataType::Fp16 | DataType::Bf16 => return Err(half_refused(input, datatype)),
        }
        Ok(())
    };
    for_each_leaf(data, &mut put)?;
    Ok(Bytes::from(out))
}

/// Triton's refusal of half-precision JSON data.
fn half_refused(input: &str, datatype: DataType) -> ServiceError {
    ServiceError::invalid(format!(
        "receiving {datatype} data via JSON is not supported. Please use the binary data format for input {input}"
    ))
}

/// Counts the non-array elements of `value` (and the string bytes among them), refusing nesting
/// at or past Triton's depth limit.
fn count_leaves(
    value: &Value,
    depth: usize,
    count: &mut usize,
    string_bytes: &mut usize,
) -> ServiceResult<()> {
    if depth >= MAX_DATA_DEPTH {
        return Err(depth_error());
    }
    match value {
        Value::Array(items) => {
            for item in items {
                count_leaves(item, depth + 1, count, string_bytes)?;
            }
        }
        Value::String(s) => {
            *count += 1;
            *string_bytes = string_bytes.saturating_add(s.len());
        }
        _ => *count += 1,
    }
    Ok(())
}

/// Visits the non-array elements in row-major order; depth was bounded by [`count_leaves`].
fn for_each_leaf(
    value: &Value,
    f: &mut impl FnMut(&Value) -> ServiceResult<()>,
) -> ServiceResult<()> {
    match value {
        Value::Array(items) => items.iter().try_for_each(|item| for_each_leaf(item, f)),
        leaf => f(leaf),
    }
}

/// A short description of a JSON value for error messages.
pub fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) if s.chars().count() > 32 => {
            format!("string \"{}...\"", s.chars().take(32).collect::<String>())
        }
        Value::String(s) => format!("string {s:?}"),
        Value::Array(_) => "an array".into(),
        Value::Object(_) => "an object".into(),
    }
}

/// Which input and datatype an element belongs to, for its conversion errors.
struct Element<'a> {
    input: &'a str,
    datatype: DataType,
}

impl Element<'_> {
    fn wrong_type(&self, expected: &str, v: &Value) -> ServiceError {
        ServiceError::invalid(format!(
            "input '{}': expected {expected} for {} data, got {}",
            self.input,
            self.datatype,
            describe(v)
        ))
    }

    fn out_of_range(&self, v: &Value) -> ServiceError {
        ServiceError::invalid(format!(
            "input '{}': value {} is out of range for {}",
            self.input,
            describe(v),
            self.datatype
        ))
    }

    fn boolean(&self, v: &Value) -> ServiceResult<bool> {
        v.as_bool()
            .ok_or_else(|| self.wrong_type("true or false", v))
    }

    fn unsigned(&self, v: &Value, max: u64) -> ServiceResult<u64> {
        match v {
            Value::Number(n) => match (n.as_u64(), n.as_i64()) {
                (Some(u), _) if u <= max => Ok(u),
                (Some(_), _) | (None, Some(_)) => Err(self.out_of_range(v)),
                (None, None) => Err(self.wrong_type("an integer", v)),
            },
            _ => Err(self.wrong_type("an integer", v)),
        }
    }

    fn signed(&self, v: &Value, min: i64, max: i64) -> ServiceResult<i64> {
        match v {
            Value::Number(n) => match (n.as_i64(), n.is_u64()) {
                (Some(i), _) if (min..=max).contains(&i) => Ok(i),
                (Some(_), _) | (None, true) => Err(self.out_of_range(v)),
                (None, false) => Err(self.wrong_type("an integer", v)),
            },
            _ => Err(self.wrong_type("an integer", v)),
        }
    }

    fn float(&self, v: &Value) -> ServiceResult<f64> {
        v.as_f64().ok_or_else(|| self.wrong_type("a number", v))
    }

    fn string<'v>(&self, v: &'v Value) -> ServiceResult<&'v str> {
        v.as_str().ok_or_else(|| self.wrong_type("a string", v))
    }
}

/// Whether every element of well-formed `BYTES` data is UTF-8, i.e. can be a JSON string.
pub fn bytes_are_utf8(data: &[u8]) -> bool {
    bytes_elements(data).all(|e| std::str::from_utf8(e).is_ok())
}

/// An output tensor's bytes, serialized as a flat JSON array of its elements.
pub struct JsonData<'a> {
    pub datatype: DataType,
    /// Bytes already checked against the datatype (from a `types::Tensor`).
    pub data: &'a [u8],
}

impl Serialize for JsonData<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        fn each<S: SerializeSeq, const N: usize, T: Serialize>(
            seq: &mut S,
            data: &[u8],
            convert: impl Fn([u8; N]) -> T,
        ) -> Result<(), S::Error> {
            for chunk in data.chunks_exact(N) {
                let mut raw = [0u8; N];
                raw.copy_from_slice(chunk);
                seq.serialize_element(&convert(raw))?;
            }
            Ok(())
        }
        let mut seq = serializer.serialize_seq(None)?;
        let data = self.data;
        match self.datatype {
            DataType::Bool => each(&mut seq, data, |[b]: [u8; 1]| b != 0)?,
            DataType::Uint8 => each(&mut seq, data, |[b]: [u8; 1]| b)?,
            DataType::Uint16 => each(&mut seq, data, u16::from_le_bytes)?,
            DataType::Uint32 => each(&mut seq, data, u32::from_le_bytes)?,
            DataType::Uint64 => each(&mut seq, data, u64::from_le_bytes)?,
            DataType::Int8 => each(&mut seq, data, i8::from_le_bytes)?,
            DataType::Int16 => each(&mut seq, data, i16::from_le_bytes)?,
            DataType::Int32 => each(&mut seq, data, i32::from_le_bytes)?,
            DataType::Int64 => each(&mut seq, data, i64::from_le_bytes)?,
            DataType::Fp16 => each(&mut seq, data, |b| half::f16::from_le_bytes(b).to_f32())?,
            DataType::Bf16 => each(&mut seq, data, |b| half::bf16::from_le_bytes(b).to_f32())?,
            DataType::Fp32 => each(&mut seq, data, f32::from_le_bytes)?,
            DataType::Fp64 => each(&mut seq, data, f64::from_le_bytes)?,
            DataType::Bytes => {
                for element in bytes_elements(data) {
                    let text = std::str::from_utf8(element)
                        .map_err(|_| S::Error::custom("BYTES element is not valid UTF-8"))?;
                    seq.serialize_element(text)?;
                }
            }
        }
        seq.end()
    }
}

#[cfg(test)]
#[path = "tensor_json_tests.rs"]
mod tests;
