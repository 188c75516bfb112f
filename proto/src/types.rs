//! The internal inference request, response and tensor types.
//!
//! Every frontend converts its wire form into these once, at the edge; the data plane and router
//! never see JSON or prost types. Tensor data is always raw little-endian row-major bytes in a
//! [`Bytes`] (shared, never copied on the way through); `BYTES` tensors keep Triton's layout of a
//! 4-byte little-endian length before each element. A [`Tensor`] can only be built through
//! [`Tensor::new`], which checks that the bytes agree with shape and datatype, so later stages can
//! trust them.

use std::collections::BTreeMap;
use std::time::Instant;

use bytes::Bytes;

use crate::datatype::DataType;
use crate::error::{ServiceError, ServiceResult};
use crate::trace_context::TraceContext;

/// A request or response parameter value (KServe v2 `InferParameter`).
#[derive(Clone, Debug, PartialEq)]
pub enum ParamValue {
    /// `bool_param`.
    Bool(bool),
    /// `int64_param`.
    Int(i64),
    /// `uint64_param`.
    Uint(u64),
    /// `double_param`.
    Double(f64),
    /// `string_param`.
    String(String),
}

/// Named parameters, ordered so responses print deterministically.
pub type Parameters = BTreeMap<String, ParamValue>;

/// The reserved parameter keys of a sequence request: what the sequence batcher, and the
/// router's replica choice (sequence affinity), read.
pub const SEQUENCE_PARAMETER_KEYS: [&str; 3] = ["sequence_id", "sequence_start", "sequence_end"];

/// Request parameter keys with meaning to the server; they are never passed to the model as
/// custom parameters. The first three are [`SEQUENCE_PARAMETER_KEYS`].
pub const RESERVED_PARAMETER_KEYS: [&str; 7] = [
    "sequence_id",
    "sequence_start",
    "sequence_end",
    "priority",
    "timeout",
    "headers",
    "binary_data_output",
];

/// A correlation id for the sequence batcher: an integer or a string (0 / "" mean none).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum CorrelationId {
    /// An integer id.
    Uint(u64),
    /// A string id.
    String(String),
}

/// The scheduling options a request carries in its reserved parameters.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RequestOptions {
    /// Priority level; 0 means the model's default level.
    pub priority: u64,
    /// Queue timeout in microseconds; 0 means the model's default.
    pub timeout_us: u64,
    /// The sequence the request belongs to (`sequence_id`); `None` for none.
    pub sequence_id: Option<CorrelationId>,
    /// The request starts its sequence (`sequence_start`).
    pub sequence_start: bool,
    /// The request ends its sequence (`sequence_end`).
    pub sequence_end: bool,
}

impl RequestOptions {
    /// Splits request parameters into the reserved options and the custom parameters that are
    /// passed to the model. `binary_data_output` is a transport concern and is dropped here.
    /// Keys starting with `triton_` and reserved keys of the wrong type are refused.
    pub fn split(params: Parameters) -> ServiceResult<(RequestOptions, Parameters)> {
        let mut options = RequestOptions::default();
        let mut custom = Parameters::new();
        for (key, value) in params {
            match key.as_str() {
                "priority" => options.priority = non_negative(&key, &value)?,
                "timeout" => options.timeout_us = non_negative(&key, &value)?,
                "sequence_id" => {
                    options.sequence_id = match value {
                        ParamValue::Int(v) if v >= 0 => Some(CorrelationId::Uint(v as u64)),
                        ParamValue::Uint(v) => Some(CorrelationId::Uint(v)),
                        ParamValue::String(s) => Some(CorrelationId::String(s)),
                        _ => {
                            return Err(ServiceError::invalid(
                                "parameter 'sequence_id' must be a non-negative integer or a string",
                            ));
                        }
                    };
                    if matches!(&options.sequence_id, Some(CorrelationId::Uint(0)))
                        || matches!(&options.sequence_id, Some(CorrelationId::String(s)) if s.is_empty())
                    {
                        options.sequence_id = None;
                    }
                }
                "sequence_start" => options.sequence_start = boolean(&key, &value)?,
                "sequence_end" => options.sequence_end = boolean(&key, &value)?,
                "binary_data_output" => {
                    boolean(&key, &value)?;
                }
                "headers" => {
                    return Err(ServiceError::invalid(
                        "parameter 'headers' is reserved and cannot be set in a request",
                    ));
                }
                k if k.starts_with("triton_") => {
                    return Err(ServiceError::invalid(format!(
                        "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified, got '{k}'"
                    )));
                }
                _ => {
                    custom.insert(key, value);
                }
            }
        }
        Ok((options, custom))
    }
}

fn non_negative(key: &str, value: &ParamValue) -> ServiceResult<u64> {
    match *value {
        ParamValue::Int(v) if v >= 0 => Ok(v as u64),
        ParamValue::Uint(v) => Ok(v),
        _ => Err(ServiceError::invalid(format!(
            "parameter '{key}' must be a non-negative integer"
        ))),
    }
}

fn boolean(key: &str, value: &ParamValue) -> ServiceResult<bool> {
    match *value {
        ParamValue::Bool(b) => Ok(b),
        _ => Err(ServiceError::invalid(format!(
            "parameter '{key}' must be a boolean"
        ))),
    }
}

/// A named tensor whose bytes are known to agree with its datatype and shape.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    name: String,
    datatype: DataType,
    shape: Vec<i64>,
    data: Bytes,
}

impl Tensor {
    /// Checks and builds a tensor. `shape` must be non-negative; for fixed-size types the byte
    /// length must equal the element count times the element size; for `BYTES` the data must be
    /// exactly as many length-prefixed elements as the shape holds.
    pub fn new(
        name: impl Into<String>,
        datatype: DataType,
        shape: Vec<i64>,
        data: Bytes,
    ) -> ServiceResult<Tensor> {
        let name = name.into();
        let count = element_count(&shape).ok_or_else(|| {
            ServiceError::invalid(format!(
                "tensor '{name}': shape {} is invalid (dimensions must be non-negative and the element count must fit in memory)",
                format_shape(&shape)
            ))
        })?;
        match datatype.element_size() {
            Some(size) => {
                let expected = count.checked_mul(size).ok_or_else(|| {
                    ServiceError::invalid(format!("tensor '{name}': shape is too large"))
                })?;
                if expected != data.len() {
                    return Err(ServiceError::invalid(format!(
                        "tensor '{name}': {datatype} shape {} needs {expected} bytes, got {}",
                        format_shape(&shape),
                        data.len()
                    )));
                }
            }
            None => {
                let found = count_bytes_elements(&data).ok_or_else(|| {
                    ServiceError::invalid(format!(
                        "tensor '{name}': BYTES data is malformed: an element's 4-byte length prefix runs past the end of the data"
                    ))
                })?;
                if found != count {
                    return Err(ServiceError::invalid(format!(
                        "tensor '{name}': BYTES shape {} holds {count} elements, but the data has {found}",
                        format_shape(&shape)
                    )));
                }
            }
        }
        Ok(Tensor {
            name,
            datatype,
            shape,
            data,
        })
    }

    /// The tensor's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its element type.
    pub fn datatype(&self) -> DataType {
        self.datatype
    }

    /// Its dims.
    pub fn shape(&self) -> &[i64] {
        &self.shape
    }

    /// Its bytes, in row-major order (`BYTES` elements length-prefixed).
    pub fn data(&self) -> &Bytes {
        &self.data
    }

    /// Number of elements (the product of the shape).
    pub fn element_count(&self) -> usize {
        element_count(&self.shape).unwrap_or(0)
    }

    /// Moves out the name, element type, dims and bytes.
    pub fn into_parts(self) -> (String, DataType, Vec<i64>, Bytes) {
        (self.name, self.datatype, self.shape, self.data)
    }

    /// The same tensor under another name (ensembles and identity models rename outputs).
    pub fn renamed(mut self, name: impl Into<String>) -> Tensor {
        self.name = name.into();
        self
    }
}

/// Product of a shape; `None` if a dimension is negative or the product overflows.
pub fn element_count(shape: &[i64]) -> Option<usize> {
    shape.iter().try_fold(1usize, |acc, &d| {
        let d = usize::try_from(d).ok()?;
        acc.checked_mul(d)
    })
}

/// Counts the length-prefixed elements of `BYTES` data; `None` if a prefix overruns the data.
pub fn count_bytes_elements(data: &[u8]) -> Option<usize> {
    let mut pos = 0usize;
    let mut n = 0usize;
    while pos < data.len() {
        let len_bytes: [u8; 4] = data.get(pos..pos + 4)?.try_into().ok()?;
        let len = u32::from_le_bytes(len_bytes) as usize;
        pos = pos.checked_add(4)?.checked_add(len)?;
        if pos > data.len() {
            return None;
        }
        n += 1;
    }
    Some(n)
}

/// Iterates the elements of well-formed `BYTES` data (as checked by [`Tensor::new`]).
pub fn bytes_elements(data: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut pos = 0usize;
    std::iter::from_fn(move || {
        let len_bytes: [u8; 4] = data.get(pos..pos + 4)?.try_into().ok()?;
        let len = u32::from_le_bytes(len_bytes) as usize;
        let start = pos + 4;
        let elem = data.get(start..start + len)?;
        pos = start + len;
        Some(elem)
    })
}

/// Appends one `BYTES` element in Triton's layout.
pub fn push_bytes_element(out: &mut Vec<u8>, element: &[u8]) {
    out.extend_from_slice(&(element.len() as u32).to_le_bytes());
    out.extend_from_slice(element);
}

/// Formats a shape the way Triton's messages do: `[1,3,224,224]`.
pub fn format_shape(shape: &[i64]) -> String {
    let dims: Vec<String> = shape.iter().map(i64::to_string).collect();
    format!("[{}]", dims.join(","))
}

/// An output the client asked for, with its per-output parameters (e.g. `classification`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RequestedOutput {
    /// The output's name.
    pub name: String,
    /// Its parameters (e.g. `classification`, `binary_data`).
    pub parameters: Parameters,
}

/// What a request carries besides its content: the client's trace context and deadline. The
/// frontends fill it from headers or metadata; the router passes it on to the worker.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RequestContext {
    /// The client's W3C trace context, if it sent a valid one.
    pub trace: Option<TraceContext>,
    /// When the client stops waiting (gRPC `grpc-timeout`); `None` without a timeout.
    pub deadline: Option<Instant>,
    /// When the frontend began receiving the request (the start of a trace's `receive` span).
    pub received: Option<Instant>,
    /// Where a traced request's open span waits for the frontend to encode the response.
    pub response_hook: ResponseHook,
    /// The frontend that received the request (`None`: an internal call, such as an ensemble
    /// step or a BLS call); Triton's trace files name a request's timestamps after it.
    pub frontend: Option<Frontend>,
}

/// A client-facing frontend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Frontend {
    /// HTTP/REST (KServe v2 JSON and binary tensors).
    Http,
    /// gRPC (`GRPCInferenceService`).
    Grpc,
}

/// A traced request's root span, left open by the service until the frontend has encoded the
/// response, so the trace covers `send` too. Implementations also close it when dropped (an
/// error path, a cancelled request, a caller without a frontend).
pub trait OpenSpan: Send {
    /// Closes the span: the response was encoded at `sent`.
    fn finish(self: Box<Self>, sent: Instant);
}

/// The slot a frontend creates per request ([`ResponseHook::new`]) and closes after encoding
/// ([`ResponseHook::finish`]); the service fills it ([`ResponseHook::attach`]) only for requests
/// it traces. A default hook has no slot: the service closes its span itself.
#[derive(Clone, Default)]
pub struct ResponseHook(Option<std::sync::Arc<SpanSlot>>);

/// Where the service leaves the open span (empty until it does, and after the frontend took it).
type SpanSlot = std::sync::Mutex<Option<Box<dyn OpenSpan>>>;

impl ResponseHook {
    /// A hook with a slot, for a frontend that will call [`ResponseHook::finish`].
    pub fn new() -> ResponseHook {
        ResponseHook(Some(Default::default()))
    }

    /// Leaves `span` for the frontend to close; hands it back when there is no slot.
    pub fn attach(&self, span: Box<dyn OpenSpan>) -> Result<(), Box<dyn OpenSpan>> {
        match &self.0 {
            Some(slot) => {
                if let Ok(mut slot) = slot.lock() {
                    *slot = Some(span);
                }
                Ok(())
            }
            None => Err(span),
        }
    }

    /// Closes the span the service left, if any, with the response encoded at `sent`.
    pub fn finish(&self, sent: Instant) {
        let span = self
            .0
            .as_ref()
            .and_then(|slot| slot.lock().ok().and_then(|mut s| s.take()));
        if let Some(span) = span {
            span.finish(sent);
        }
    }
}

impl std::fmt::Debug for ResponseHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "ResponseHook(slot)"
        } else {
            "ResponseHook(none)"
        })
    }
}

/// Hooks carry no request content: any two compare equal.
impl PartialEq for ResponseHook {
    fn eq(&self, _: &ResponseHook) -> bool {
        true
    }
}

impl RequestContext {
    /// Whether the deadline has passed at `now`.
    pub fn expired(&self, now: Instant) -> bool {
        self.deadline.is_some_and(|d| d <= now)
    }
}

/// One inference request, as every frontend produces it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct InferRequest {
    /// The model to run.
    pub model_name: String,
    /// `None` asks for the version the model's policy serves as latest.
    pub model_version: Option<i64>,
    /// Client-chosen id, echoed in the response; may be empty.
    pub id: String,
    /// The reserved parameters: priority, queue timeout, sequence controls.
    pub options: RequestOptions,
    /// Custom parameters, passed to the model.
    pub parameters: Parameters,
    /// The input tensors, in the order the client sent them.
    pub inputs: Vec<Tensor>,
    /// Outputs to return, in order; empty means every output of the model.
    pub outputs: Vec<RequestedOutput>,
    /// Trace context, deadline and the receiving frontend.
    pub context: RequestContext,
}

/// The answer to an [`InferRequest`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct InferResponse {
    /// The model that answered.
    pub model_name: String,
    /// The version that ran, as a string (Triton answers `"1"`).
    pub model_version: String,
    /// The request's `id`, echoed.
    pub id: String,
    /// Response parameters, as the model or the server set them.
    pub parameters: Parameters,
    /// The output tensors.
    pub outputs: Vec<Tensor>,
}

/// Parses a version as it arrives on the wire ("" = latest), as Triton reads it: C's `stol`
/// (leading blanks, an optional sign, the digits; anything after them is ignored), refusing
/// text without digits, a value out of range and a negative version with Triton's words.
pub fn parse_version(version: &str) -> ServiceResult<Option<i64>> {
    if version.is_empty() {
        return Ok(None);
    }
    let Some(parsed) = stol(version) else {
        return Err(ServiceError::invalid(format!(
            "failed to get model version from specified version string '{version}' (details: stol), version should be an integral value > 0"
        )));
    };
    if parsed < 0 {
        return Err(ServiceError::invalid(format!(
            "invalid model version specified '{version}' , version should be an integral value > 0"
        )));
    }
    Ok(Some(parsed))
}

/// The leading integer of `text` as C's `strtol` reads it (base 10): `None` without digits or
/// out of `i64` range.
fn stol(text: &str) -> Option<i64> {
    let rest = text.trim_start_matches([' ', '\t', '\n', '\r', '\x0b', '\x0c']);
    let (negative, rest) = match rest.as_bytes().first() {
        Some(b'-') => (true, &rest[1..]),
        Some(b'+') => (false, &rest[1..]),
        _ => (false, rest),
    };
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return None;
    }
    let magnitude: i128 = rest[..digits].parse().ok()?;
    let value = if negative { -magnitude } else { magnitude };
    i64::try_from(value).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes_tensor(elems: &[&[u8]]) -> Bytes {
        let mut v = Vec::new();
        for e in elems {
            push_bytes_element(&mut v, e);
        }
        Bytes::from(v)
    }

    #[test]
    fn versions_read_as_triton_reads_them() {
        assert_eq!(parse_version("").unwrap(), None);
        for (text, want) in [
            ("3", 3),
            ("0", 0),
            (" 2", 2),
            ("+4", 4),
            ("1x", 1),
            ("7 ", 7),
        ] {
            assert_eq!(parse_version(text).unwrap(), Some(want), "{text:?}");
        }
        for text in ["abc", "x1", "-", " ", "99999999999999999999"] {
            let err = parse_version(text).unwrap_err().to_string();
            assert!(
                err.contains(&format!(
                    "failed to get model version from specified version string '{text}' (details: stol), version should be an integral value > 0"
                )),
                "{err}"
            );
        }
        let err = parse_version("-1").unwrap_err().to_string();
        assert!(
            err.contains(
                "invalid model version specified '-1' , version should be an integral value > 0"
            ),
            "{err}"
        );
    }

    #[test]
    fn fixed_size_tensor_checks_byte_length() {
        assert!(Tensor::new("x", DataType::Fp32, vec![2, 2], Bytes::from(vec![0u8; 16])).is_ok());
        let err =
            Tensor::new("x", DataType::Fp32, vec![2, 2], Bytes::from(vec![0u8; 15])).unwrap_err();
        assert_eq!(
            err.message(),
            "tensor 'x': FP32 shape [2,2] needs 16 bytes, got 15"
        );
        assert!(Tensor::new("x", DataType::Int8, vec![0, 5], Bytes::new()).is_ok());
    }

    #[test]
    fn negative_and_overflowing_shapes_are_refused() {
        assert!(Tensor::new("x", DataType::Fp32, vec![-1], Bytes::new()).is_err());
        let huge = vec![i64::MAX, i64::MAX];
        assert!(Tensor::new("x", DataType::Uint8, huge, Bytes::new()).is_err());
        assert!(Tensor::new("x", DataType::Fp64, vec![1 << 62], Bytes::new()).is_err());
    }

    #[test]
    fn bytes_tensor_counts_elements() {
        let data = bytes_tensor(&[b"ab", b"", b"xyz"]);
        let t = Tensor::new("s", DataType::Bytes, vec![3], data.clone()).unwrap();
        let elems: Vec<&[u8]> = bytes_elements(t.data()).collect();
        assert_eq!(elems, vec![&b"ab"[..], b"", b"xyz"]);
        let err = Tensor::new("s", DataType::Bytes, vec![2], data).unwrap_err();
        assert!(
            err.message()
                .contains("holds 2 elements, but the data has 3")
        );
        let truncated = Bytes::from_static(&[5, 0, 0, 0, b'a']);
        assert!(Tensor::new("s", DataType::Bytes, vec![1], truncated).is_err());
        assert!(Tensor::new("s", DataType::Bytes, vec![1], Bytes::from_static(&[1, 0])).is_err());
    }

    #[test]
    fn options_split_reserved_from_custom() {
        let mut p = Parameters::new();
        p.insert("priority".into(), ParamValue::Int(2));
        p.insert("timeout".into(), ParamValue::Uint(100));
        p.insert("sequence_id".into(), ParamValue::String("abc".into()));
        p.insert("sequence_start".into(), ParamValue::Bool(true));
        p.insert("my_key".into(), ParamValue::Double(1.5));
        let (o, custom) = RequestOptions::split(p).unwrap();
        assert_eq!(o.priority, 2);
        assert_eq!(o.timeout_us, 100);
        assert_eq!(o.sequence_id, Some(CorrelationId::String("abc".into())));
        assert!(o.sequence_start && !o.sequence_end);
        assert_eq!(custom.len(), 1);
    }

    #[test]
    fn options_refuse_triton_keys_and_bad_types() {
        let mut p = Parameters::new();
        p.insert("triton_x".into(), ParamValue::Bool(true));
        assert!(
            RequestOptions::split(p)
                .unwrap_err()
                .message()
                .contains("reserved")
        );
        let mut p = Parameters::new();
        p.insert("priority".into(), ParamValue::Int(-1));
        assert!(RequestOptions::split(p).is_err());
        let mut p = Parameters::new();
        p.insert("sequence_end".into(), ParamValue::Int(1));
        assert!(RequestOptions::split(p).is_err());
    }

    #[test]
    fn version_parsing() {
        assert_eq!(parse_version("").unwrap(), None);
        assert_eq!(parse_version("3").unwrap(), Some(3));
        assert!(parse_version("x").is_err());
        assert!(parse_version("-1").is_err());
    }
}
