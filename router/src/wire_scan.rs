//! Reading what routing needs from a `ModelInferRequest` in its protobuf wire form, without
//! decoding it: the pass-through path (`passthrough`) forwards the client's bytes unchanged.
//!
//! ```text
//! ModelInferRequest bytes ─► scan_request ─► ScannedRequest
//!   1 model_name, 2 model_version            kept (text)
//!   4 parameters                             sequence_id / _start / _end decoded, others skipped
//!   5 inputs                                 name, shape (limits), shared-memory keys; contents skipped
//!   6 outputs                                name, shared-memory keys
//!   7 raw_input_contents, unknown fields     skipped by wire type, never read
//! ```
//!
//! A malformed message (truncated varint, a length past the end, a known field with the wrong
//! wire type, no model name) is a [`ScanError`] naming the field and what is wrong; it becomes
//! INVALID_ARGUMENT. Fields the router does not know are skipped here and forwarded as they are.
//! The wire rules are prost's, so the scan refuses exactly what prost refuses in the fields it
//! reads: varints of at most 64 bits, field numbers up to 2^29 - 1, and prost's recursion limit
//! of 100 levels of nested messages and groups (which also bounds the skipper's own recursion).
//! The fuzz target `router_wire_scan` checks this against prost's decode (docs/fuzzing.md).
//! One difference is intended: prost reads a map field (`parameters`) as length-delimited
//! whatever wire type its key says; the scan refuses such a key, as protobuf specifies.
//!
//! [`version_suffix`] names the replica's version for the worker by appending one `model_version`
//! field: protobuf keeps the last value of a repeated scalar field, so the worker reads the
//! router's choice while every other byte stays the client's.

use std::collections::BTreeMap;

use bytes::{BufMut, Bytes, BytesMut};
use nereid_proto::pb::inference::InferParameter;
use nereid_proto::pb::inference::infer_parameter::ParameterChoice;
use nereid_proto::{ParamValue, Parameters, RequestOptions, SEQUENCE_PARAMETER_KEYS, ServiceError};
use prost::Message;

/// Why a message could not be scanned. `at` names the message being read
/// (`ModelInferRequest`, `inputs[2]`, ...).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScanError {
    #[error("{at}: truncated varint at byte {offset}")]
    TruncatedVarint { at: String, offset: usize },
    #[error("{at}: varint at byte {offset} does not fit in 64 bits")]
    VarintOverflow { at: String, offset: usize },
    #[error("{at}: field {field} declares {len} bytes but only {left} remain")]
    LengthPastEnd {
        at: String,
        field: u32,
        len: u64,
        left: usize,
    },
    #[error("{at}: field {field} has wire type {wire_type}, {expected}")]
    WireType {
        at: String,
        field: u32,
        wire_type: u8,
        expected: &'static str,
    },
    #[error("{at}: the field number at byte {offset} is not in 1..=536870911")]
    FieldNumber { at: String, offset: usize },
    #[error("{at}: field {field} nests messages and groups deeper than 100 levels")]
    TooDeep { at: String, field: u32 },
    #[error("{at}: group of field {field} is not closed")]
    OpenGroup { at: String, field: u32 },
    #[error("{at}: end of group {field} without its start")]
    StrayGroupEnd { at: String, field: u32 },
    #[error("{at}: field {field} ({name}) is not valid UTF-8")]
    NotUtf8 {
        at: String,
        field: u32,
        name: &'static str,
    },
    #[error("ModelInferRequest: model_name (field 1) is missing or empty")]
    NoModelName,
    #[error("ModelInferRequest: parameter '{key}' does not decode: {message}")]
    BadParameter { key: String, message: String },
    /// A sequence parameter of the wrong type (the message names it).
    #[error("ModelInferRequest: {0}")]
    Options(String),
}

impl From<ScanError> for ServiceError {
    fn from(e: ScanError) -> ServiceError {
        ServiceError::invalid(format!("malformed ModelInferRequest: {e}"))
    }
}

type ScanResult<T> = Result<T, ScanError>;

const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;
const START_GROUP: u8 = 3;
const END_GROUP: u8 = 4;
const FIXED32: u8 = 5;

/// How deep messages and groups may nest: prost's `RECURSION_LIMIT`, counted as prost does
/// (a reader's `depth` is the budget left for the fields it reads).
const RECURSION_LIMIT: u32 = 100;

/// One input as the request declares it (for the request limits).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScannedInput {
    pub name: String,
    pub shape: Vec<i64>,
}

/// What the router reads of a `ModelInferRequest`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ScannedRequest {
    pub model_name: String,
    /// As sent ("" = let the router choose).
    pub model_version: String,
    /// The sequence options (the other reserved parameters are the worker's to read).
    pub options: RequestOptions,
    pub inputs: Vec<ScannedInput>,
    pub outputs: usize,
    /// The first tensor that names a shared-memory region (`input 'x'`, else `output 'y'`).
    pub shared_memory: Option<String>,
}

/// A cursor over one message's bytes.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    at: &'a dyn Fn() -> String,
    /// Nesting levels left for this message's fields (prost's `DecodeContext`).
    depth: u32,
}

impl<'a> Reader<'a> {
    /// A reader of a top-level message.
    fn new(buf: &'a [u8], at: &'a dyn Fn() -> String) -> Reader<'a> {
        Reader {
            buf,
            pos: 0,
            at,
            depth: RECURSION_LIMIT,
        }
    }

    /// A reader of a message nested in one of this reader's fields.
    fn nested<'b>(&self, buf: &'b [u8], at: &'b dyn Fn() -> String) -> Reader<'b> {
        Reader {
            buf,
            pos: 0,
            at,
            depth: self.depth.saturating_sub(1),
        }
    }

    fn done(&self) -> bool {
        self.pos >= self.buf.len()
    }

    fn varint(&mut self) -> ScanResult<u64> {
        let start = self.pos;
        let mut value = 0u64;
        for i in 0..10 {
            let Some(&b) = self.buf.get(self.pos) else {
                return Err(ScanError::TruncatedVarint {
                    at: (self.at)(),
                    offset: start,
                });
            };
            self.pos += 1;
            value |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                // The tenth byte holds bit 63 only.
                if i == 9 && b > 1 {
                    break;
                }
                return Ok(value);
            }
        }
        Err(ScanError::VarintOverflow {
            at: (self.at)(),
            offset: start,
        })
    }

    /// The next field's number and wire type.
    fn key(&mut self) -> ScanResult<(u32, u8)> {
        let offset = self.pos;
        let key = self.varint()?;
        match u32::try_from(key >> 3) {
            Ok(field) if field != 0 && key <= u64::from(u32::MAX) => Ok((field, (key & 7) as u8)),
            _ => Err(ScanError::FieldNumber {
                at: (self.at)(),
                offset,
            }),
        }
    }

    fn take(&mut self, field: u32, len: u64) -> ScanResult<&'a [u8]> {
        let left = self.buf.len() - self.pos;
        match usize::try_from(len) {
            Ok(n) if n <= left => {
                let bytes = &self.buf[self.pos..self.pos + n];
                self.pos += n;
                Ok(bytes)
            }
            _ => Err(ScanError::LengthPastEnd {
                at: (self.at)(),
                field,
                len,
                left,
            }),
        }
    }

    /// A length-delimited field's bytes.
    fn delimited(&mut self, field: u32) -> ScanResult<&'a [u8]> {
        let len = self.varint()?;
        self.take(field, len)
    }

    /// Skips a field's value by its wire type (a group up to its end).
    fn skip(&mut self, field: u32, wire_type: u8) -> ScanResult<()> {
        self.skip_within(field, wire_type, self.depth)
    }

    /// [`Self::skip`] with `depth` levels left: prost refuses any field at depth 0, and each
    /// group costs a level.
    fn skip_within(&mut self, field: u32, wire_type: u8, depth: u32) -> ScanResult<()> {
        if depth == 0 {
            return Err(ScanError::TooDeep {
                at: (self.at)(),
                field,
            });
        }
        match wire_type {
            VARINT => self.varint().map(drop),
            FIXED64 => self.take(field, 8).map(drop),
            LEN => self.delimited(field).map(drop),
            FIXED32 => self.take(field, 4).map(drop),
            START_GROUP => loop {
                if self.done() {
                    return Err(ScanError::OpenGroup {
                        at: (self.at)(),
                        field,
                    });
                }
                let (inner, wt) = self.key()?;
                if wt == END_GROUP {
                    if inner == field {
                        return Ok(());
                    }
                    return Err(ScanError::StrayGroupEnd {
                        at: (self.at)(),
                        field: inner,
                    });
                }
                self.skip_within(inner, wt, depth - 1)?;
            },
            END_GROUP => Err(ScanError::StrayGroupEnd {
                at: (self.at)(),
                field,
            }),
            other => Err(ScanError::WireType {
                at: (self.at)(),
                field,
                wire_type: other,
                expected: "which protobuf does not define",
            }),
        }
    }

    /// A field the schema declares length-delimited.
    fn expect_delimited(&mut self, field: u32, wire_type: u8) -> ScanResult<&'a [u8]> {
        if wire_type != LEN {
            return Err(ScanError::WireType {
                at: (self.at)(),
                field,
                wire_type,
                expected: "expected length-delimited (2)",
            });
        }
        self.delimited(field)
    }

    fn text(&mut self, field: u32, wire_type: u8, name: &'static str) -> ScanResult<String> {
        let bytes = self.expect_delimited(field, wire_type)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_string()),
            Err(_) => Err(ScanError::NotUtf8 {
                at: (self.at)(),
                field,
                name,
            }),
        }
    }
}

/// Scans a `ModelInferRequest` (see the module docs).
pub fn scan_request(message: &[u8]) -> ScanResult<ScannedRequest> {
    let at = || "ModelInferRequest".to_string();
    let mut r = Reader::new(message, &at);
    let mut scanned = ScannedRequest::default();
    let mut routing = BTreeMap::new();
    // The first tensor naming shared memory: inputs before outputs, as the typed decoder names them.
    let (mut shm_input, mut shm_output) = (None, None);
    while !r.done() {
        let (field, wt) = r.key()?;
        match field {
            1 => scanned.model_name = r.text(field, wt, "model_name")?,
            2 => scanned.model_version = r.text(field, wt, "model_version")?,
            4 => {
                let entry = r.expect_delimited(field, wt)?;
                if let Some((key, value)) = routing_parameter(&r, entry)? {
                    routing.insert(key, value);
                }
            }
            5 => {
                let entry = r.expect_delimited(field, wt)?;
                let (input, shm) = scan_tensor(&r, entry, scanned.inputs.len(), true)?;
                if shm && shm_input.is_none() {
                    shm_input = Some(format!("input '{}'", input.name));
                }
                scanned.inputs.push(input);
            }
            6 => {
                let entry = r.expect_delimited(field, wt)?;
                let (output, shm) = scan_tensor(&r, entry, scanned.outputs, false)?;
                if shm && shm_output.is_none() {
                    shm_output = Some(format!("output '{}'", output.name));
                }
                scanned.outputs += 1;
            }
            // 3 id, 7 raw_input_contents and fields this router does not know.
            _ => r.skip(field, wt)?,
        }
    }
    if scanned.model_name.is_empty() {
        return Err(ScanError::NoModelName);
    }
    scanned.shared_memory = shm_input.or(shm_output);
    // A key's last entry is its value (a protobuf map), so an empty one is refused only now.
    let routing = routing
        .into_iter()
        .map(|(key, choice)| match param_value(choice) {
            Some(value) => Ok((key, value)),
            None => Err(ScanError::BadParameter {
                key,
                message: "no value set".into(),
            }),
        })
        .collect::<ScanResult<Parameters>>()?;
    scanned.options = RequestOptions::split(routing)
        .map(|(options, _)| options)
        .map_err(|e| ScanError::Options(e.message().to_string()))?;
    Ok(scanned)
}

/// One `parameters` map entry (in `request`): its key and decoded value (`None`: no value set)
/// when the key is one replica choice reads.
fn routing_parameter(
    request: &Reader<'_>,
    entry: &[u8],
) -> ScanResult<Option<(String, Option<ParameterChoice>)>> {
    let at = || "ModelInferRequest.parameters entry".to_string();
    let mut r = request.nested(entry, &at);
    let mut key = String::new();
    while !r.done() {
        let (field, wt) = r.key()?;
        match field {
            1 => key = r.text(field, wt, "key")?,
            2 => {
                r.expect_delimited(field, wt)?;
            }
            _ => r.skip(field, wt)?,
        }
    }
    if !SEQUENCE_PARAMETER_KEYS.contains(&key.as_str()) {
        return Ok(None);
    }
    // The value is a message: each occurrence is merged into it, as prost merges them (a later
    // one does not replace an earlier one). A second pass, for the three routing keys only.
    let mut param = InferParameter::default();
    let mut r = request.nested(entry, &at);
    while !r.done() {
        let (field, wt) = r.key()?;
        match field {
            2 => param.merge(r.expect_delimited(field, wt)?).map_err(|e| {
                ScanError::BadParameter {
                    key: key.clone(),
                    message: e.to_string(),
                }
            })?,
            _ => r.skip(field, wt)?,
        }
    }
    Ok(Some((key, param.parameter_choice)))
}

fn param_value(choice: Option<ParameterChoice>) -> Option<ParamValue> {
    Some(match choice? {
        ParameterChoice::BoolParam(v) => ParamValue::Bool(v),
        ParameterChoice::Int64Param(v) => ParamValue::Int(v),
        ParameterChoice::StringParam(v) => ParamValue::String(v),
        ParameterChoice::DoubleParam(v) => ParamValue::Double(v),
        ParameterChoice::Uint64Param(v) => ParamValue::Uint(v),
    })
}

/// One `inputs` (`input` true) or `outputs` entry of `request`: its name, its shape (inputs:
/// field 3) and whether its parameters (inputs: field 4, outputs: field 2) name shared memory.
/// An input's `contents` are skipped.
fn scan_tensor(
    request: &Reader<'_>,
    entry: &[u8],
    index: usize,
    input: bool,
) -> ScanResult<(ScannedInput, bool)> {
    let kind = if input { "inputs" } else { "outputs" };
    let at = move || format!("ModelInferRequest.{kind}[{index}]");
    let params_field = if input { 4 } else { 2 };
    let mut r = request.nested(entry, &at);
    let mut tensor = ScannedInput::default();
    let mut shm = false;
    while !r.done() {
        let (field, wt) = r.key()?;
        match field {
            1 => tensor.name = r.text(field, wt, "name")?,
            3 if input && wt == VARINT => tensor.shape.push(r.varint()? as i64),
            3 if input => {
                let packed = r.expect_delimited(field, wt)?;
                let mut dims = r.nested(packed, &at);
                while !dims.done() {
                    tensor.shape.push(dims.varint()? as i64);
                }
            }
            f if f == params_field => {
                let entry = r.expect_delimited(field, wt)?;
                shm |= names_shared_memory(r.nested(entry, &at))?;
            }
            _ => r.skip(field, wt)?,
        }
    }
    Ok((tensor, shm))
}

/// Whether a tensor's parameter entry (read by `r`) has a `shared_memory_*` key.
fn names_shared_memory(mut r: Reader<'_>) -> ScanResult<bool> {
    let mut shm = false;
    while !r.done() {
        let (field, wt) = r.key()?;
        match field {
            1 => shm = r.text(field, wt, "key")?.starts_with("shared_memory"),
            _ => r.skip(field, wt)?,
        }
    }
    Ok(shm)
}

/// The text of top-level field `field` (its last occurrence, as protobuf reads a scalar) of a
/// message in wire form; `None` when absent. A message that stops scanning gives what was read
/// before. The stream pass-through names a request with it (`model_name`, `model_version`,
/// `id`) and reads a worker response's `error_message` (field 1 of `ModelStreamInferResponse`).
pub fn text_field(message: &[u8], field: u32) -> Option<String> {
    let at = || "message".to_string();
    let mut r = Reader::new(message, &at);
    let mut text = None;
    while !r.done() {
        let Ok((f, wt)) = r.key() else { break };
        let read = if f == field {
            r.text(f, wt, "text").map(|t| text = Some(t))
        } else {
            r.skip(f, wt)
        };
        if read.is_err() {
            break;
        }
    }
    text
}

/// What follows the client's bytes so that the worker serves `version`: nothing when the
/// client named it already, else one `model_version` field (see the module docs).
pub fn version_suffix(sent: &str, version: &str) -> Bytes {
    if sent == version {
        return Bytes::new();
    }
    let mut out = BytesMut::with_capacity(version.len() + 11);
    out.put_u8((2 << 3) | LEN);
    let mut len = version.len() as u64;
    while len >= 0x80 {
        out.put_u8((len as u8) | 0x80);
        len >>= 7;
    }
    out.put_u8(len as u8);
    out.put_slice(version.as_bytes());
    out.freeze()
}

#[cfg(test)]
#[path = "wire_scan_tests.rs"]
mod tests;
