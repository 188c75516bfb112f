//! Reading what routing needs from an HTTP `POST .../infer` body without decoding its tensors:
//! the groundwork of the HTTP pass-through (issue 21, "a cheap hop"), the HTTP counterpart of
//! `wire_scan`.
//!
//! ```text
//! body, Inference-Header-Content-Length   ─► scan_http_request
//!   header length N > 0    the first N bytes are the JSON header; the binary section is not read
//!   header length 0        one input's raw bytes: None (nothing to scan; the typed path serves it)
//!   no header length       the whole body is the JSON header
//! JSON header (serde, streaming)
//!   id                                 kept (must be a string)
//!   parameters                         sequence_id / _start / _end → RequestOptions; others unread
//!   inputs[i].name, .shape             kept (RequestLimits); .parameters: shared_memory_* noted
//!   inputs[i].data                     skipped with IgnoredAny: no tensor is materialised
//!   outputs[i].name, .parameters       counted; shared_memory_* noted
//!   any other key                      skipped
//! ```
//!
//! The fields read follow the typed decoder's rules (`nereid_frontend`'s `infer_request.rs`): a
//! key set to `null` is present, not absent; tensors are objects; the first shared-memory tensor
//! named is an input before any output. A malformed header is an [`HttpScanError`] naming the
//! field and what is wrong; it becomes the 400 `{"error": ...}` the typed HTTP path gives
//! (`ServiceError::invalid`).
//!
//! Two differences from the typed decoder are intended, and the fuzz target `router_http_scan`
//! allows exactly these (docs/fuzzing.md):
//! - a key the scan reads given twice in one object is refused ("duplicate field"), where the
//!   typed decoder keeps the last: streaming, the scan cannot know that a later value replaces
//!   the one it read, and routing on a value the worker ignores would be wrong;
//! - what is skipped (tensor data, unknown keys) is checked for JSON syntax only, not decoded:
//!   invalid UTF-8 or a lone surrogate escape in a string, a number past f64's range, nesting
//!   past serde_json's 128 levels are left to the worker, which refuses them with its own message.

use serde::de::{Deserializer, Visitor};
use serde::{Deserialize, forward_to_deserialize_any};
use serde_json::{Map, Value};

use nereid_proto::{ParamValue, Parameters, RequestOptions, SEQUENCE_PARAMETER_KEYS, ServiceError};

use crate::wire_scan::ScannedInput;

/// Why an HTTP inference body could not be scanned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HttpScanError {
    /// The `Inference-Header-Content-Length` header says the JSON header is longer than the
    /// whole body.
    #[error("Inference-Header-Content-Length {len} is longer than the request body ({body} bytes)")]
    HeaderPastEnd {
        /// The header length the client declared, in bytes.
        len: usize,
        /// The body's actual length, in bytes.
        body: usize,
    },
    /// The body (or its JSON header part) is empty or only whitespace.
    #[error("the request body is empty; expected an inference request JSON object")]
    Empty,
    /// The JSON header's first non-whitespace byte is not `{`: an array, a scalar or other text.
    #[error("the request JSON must be an object")]
    NotObject,
    /// The JSON header is not valid JSON; the text is serde_json's message, prefixed with the
    /// path of the field it was reading when one is known.
    #[error("failed to parse the request JSON buffer: {0}")]
    Json(String),
    /// A field the scan reads has the wrong JSON type.
    #[error("'{field}' must be {expected}, got {got}")]
    Type {
        /// The field's path in the request (`id`, `inputs[0].name`, ...).
        field: String,
        /// The JSON type the field must have (`"a string"`, `"an array"`, ...).
        expected: &'static str,
        /// The JSON type the client sent.
        got: &'static str,
    },
    /// An input's `shape` holds something other than a non-negative integer.
    #[error("input '{input}': shape dimension {index} must be a non-negative integer")]
    BadDimension {
        /// The input's name.
        input: String,
        /// The zero-based position of the bad dimension in `shape`.
        index: usize,
    },
    /// A parameter whose value is not a string, integer, number or boolean.
    #[error("{owner}parameter '{key}' must be a string, integer, number or boolean, got {got}")]
    BadParameter {
        /// A message prefix naming what the parameter belongs to; empty for the request's own
        /// `parameters`.
        owner: String,
        /// The parameter's key.
        key: String,
        /// The JSON type the client sent (an array, an object or `null`).
        got: &'static str,
    },
    /// A sequence parameter of the wrong type (the message names it).
    #[error("{0}")]
    Options(String),
}

impl From<HttpScanError> for ServiceError {
    fn from(e: HttpScanError) -> ServiceError {
        ServiceError::invalid(e.to_string())
    }
}

type ScanResult<T> = Result<T, HttpScanError>;

/// Why `header` is not a valid inference request header, naming the path to the wrong value.
fn json_error(header: &[u8]) -> HttpScanError {
    let mut json = serde_json::Deserializer::from_slice(header);
    match serde_path_to_error::deserialize::<_, Header>(&mut json) {
        Ok(_) => HttpScanError::Json("the request JSON could not be read".into()),
        Err(e) => {
            let path = e.path().to_string();
            let inner = e.into_inner();
            match (inner.is_data(), path.as_str()) {
                // At the top level (an object, checked above) a data error is a repeated key.
                (true, ".") | (false, _) => HttpScanError::Json(inner.to_string()),
                (true, _) => HttpScanError::Json(format!("'{path}': {inner}")),
            }
        }
    }
}

/// What the router reads of an HTTP inference request (model and version come from the path).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HttpScanned {
    /// The request id ("" when absent).
    pub id: String,
    /// The sequence options (the other reserved parameters are the worker's to read).
    pub options: RequestOptions,
    /// Each input's name and shape, in request order (checked against the request limits).
    pub inputs: Vec<ScannedInput>,
    /// How many outputs the request asks for; 0 when it names none (all outputs).
    pub outputs: usize,
    /// The first tensor that names a shared-memory region (`input 'x'`, `output 'y'`).
    pub shared_memory: Option<String>,
}

/// The JSON header as scanned: small fields kept as values (to name them in errors); tensor
/// data and other keys skipped (serde's `IgnoredAny`). `None`: the key is absent.
#[derive(Deserialize)]
#[serde(expecting = "an inference request JSON object")]
struct Header {
    #[serde(default, deserialize_with = "present")]
    id: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    parameters: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    inputs: Option<Vec<Object<InputHeader>>>,
    #[serde(default, deserialize_with = "present")]
    outputs: Option<Vec<Object<OutputHeader>>>,
}

#[derive(Deserialize)]
#[serde(expecting = "an input tensor object")]
struct InputHeader {
    #[serde(default, deserialize_with = "present")]
    name: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    shape: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    parameters: Option<Value>,
}

#[derive(Deserialize)]
#[serde(expecting = "an output tensor object")]
struct OutputHeader {
    #[serde(default, deserialize_with = "present")]
    name: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    parameters: Option<Value>,
}

/// A present key's value, `null` included (`Option`'s own `Deserialize` reads `null` as `None`,
/// which would take `"id": null` for no id).
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// A derived struct read from a JSON object only: serde's derive also takes an array, the
/// fields by position.
struct Object<T>(T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        T::deserialize(MapOnly(d)).map(Object)
    }
}

/// A deserializer that asks its inner one for a map whatever the type asks for.
struct MapOnly<D>(D);

impl<'de, D: Deserializer<'de>> Deserializer<'de> for MapOnly<D> {
    type Error = D::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.0.deserialize_map(visitor)
    }

    forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map struct enum identifier
        ignored_any
    }
}

/// Scans an HTTP inference body (see the module docs); `header_len` is the
/// `Inference-Header-Content-Length` value. `Ok(None)`: a raw binary request (header length 0),
/// which has no JSON header to scan.
pub fn scan_http_request(
    body: &[u8],
    header_len: Option<usize>,
) -> ScanResult<Option<HttpScanned>> {
    let header = match header_len {
        Some(0) => return Ok(None),
        Some(len) if len > body.len() => {
            return Err(HttpScanError::HeaderPastEnd {
                len,
                body: body.len(),
            });
        }
        Some(len) => &body[..len],
        None => body,
    };
    match header.iter().find(|b| !b.is_ascii_whitespace()) {
        None => return Err(HttpScanError::Empty),
        // A derived struct would also accept an array (fields by position).
        Some(b) if *b != b'{' => return Err(HttpScanError::NotObject),
        Some(_) => {}
    }
    let mut json = serde_json::Deserializer::from_slice(header);
    // Without tracking the path (which costs a string per key): a valid header, the usual
    // case, is read once; an invalid one again with the path, to name where it is wrong.
    let doc = match Header::deserialize(&mut json) {
        Ok(doc) => doc,
        Err(_) => return Err(json_error(header)),
    };
    json.end().map_err(|e| HttpScanError::Json(e.to_string()))?;
    let mut scanned = HttpScanned {
        id: match doc.id {
            None => String::new(),
            Some(Value::String(id)) => id,
            Some(other) => return Err(wrong("id", "a string", &other)),
        },
        ..Default::default()
    };
    let request_params = object(doc.parameters.as_ref(), "parameters")?;
    let mut routing = Parameters::new();
    for key in SEQUENCE_PARAMETER_KEYS {
        if let Some(v) = request_params.and_then(|m| m.get(key)) {
            routing.insert(key.to_string(), param_value(v, "", key)?);
        }
    }
    scanned.options = RequestOptions::split(routing)
        .map(|(options, _)| options)
        .map_err(|e| HttpScanError::Options(e.message().to_string()))?;
    for (i, Object(input)) in doc.inputs.unwrap_or_default().into_iter().enumerate() {
        let name = tensor_name(input.name, "inputs", i)?;
        let shape = shape(input.shape.as_ref(), &name)?;
        let owner = format!("input '{name}'");
        if names_shared_memory(input.parameters.as_ref(), &owner)? {
            scanned.shared_memory.get_or_insert(owner);
        }
        scanned.inputs.push(ScannedInput { name, shape });
    }
    for (i, Object(output)) in doc.outputs.unwrap_or_default().into_iter().enumerate() {
        let name = tensor_name(output.name, "outputs", i)?;
        let owner = format!("output '{name}'");
        if names_shared_memory(output.parameters.as_ref(), &owner)? {
            scanned.shared_memory.get_or_insert(owner);
        }
        scanned.outputs += 1;
    }
    Ok(Some(scanned))
}

/// A JSON value's kind, for messages.
fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn wrong(field: &str, expected: &'static str, got: &Value) -> HttpScanError {
    HttpScanError::Type {
        field: field.to_string(),
        expected,
        got: kind(got),
    }
}

/// An optional JSON object field.
fn object<'a>(value: Option<&'a Value>, field: &str) -> ScanResult<Option<&'a Map<String, Value>>> {
    match value {
        None => Ok(None),
        Some(Value::Object(map)) => Ok(Some(map)),
        Some(other) => Err(wrong(field, "an object", other)),
    }
}

fn tensor_name(value: Option<Value>, list: &str, index: usize) -> ScanResult<String> {
    match value {
        Some(Value::String(name)) => Ok(name),
        Some(other) => Err(wrong(&format!("{list}[{index}].name"), "a string", &other)),
        None => Err(HttpScanError::Type {
            field: format!("{list}[{index}].name"),
            expected: "a string",
            got: "nothing",
        }),
    }
}

/// An input's declared shape: an array of non-negative integers.
fn shape(value: Option<&Value>, input: &str) -> ScanResult<Vec<i64>> {
    let field = || format!("input '{input}': shape");
    let dims = match value {
        Some(Value::Array(dims)) => dims,
        Some(other) => return Err(wrong(&field(), "an array of integers", other)),
        None => {
            return Err(HttpScanError::Type {
                field: field(),
                expected: "an array of integers",
                got: "nothing",
            });
        }
    };
    dims.iter()
        .enumerate()
        .map(|(index, d)| {
            d.as_i64()
                .filter(|d| *d >= 0)
                .ok_or_else(|| HttpScanError::BadDimension {
                    input: input.to_string(),
                    index,
                })
        })
        .collect()
}

/// A parameter value read as the typed path reads it (`nereid_frontend::param_value`).
fn param_value(value: &Value, owner: &str, key: &str) -> ScanResult<ParamValue> {
    nereid_frontend::param_value(value).ok_or_else(|| HttpScanError::BadParameter {
        owner: owner.to_string(),
        key: key.to_string(),
        got: kind(value),
    })
}

/// Whether a tensor's `parameters` name a `shared_memory_*` key.
fn names_shared_memory(parameters: Option<&Value>, owner: &str) -> ScanResult<bool> {
    let field = format!("{owner}: parameters");
    Ok(object(parameters, &field)?
        .is_some_and(|map| map.keys().any(|k| k.starts_with("shared_memory"))))
}

#[cfg(test)]
#[path = "http_scan_tests.rs"]
mod tests;
