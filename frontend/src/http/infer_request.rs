//! An infer request's HTTP body → [`InferRequest`], plus how each output should come back.
//!
//! ```text
//! body = JSON header [+ binary section]           Inference-Header-Content-Length = JSON length
//!        input / output counts, declared shapes ─► RequestLimits (before any data is decoded)
//!        inputs[i].data                  ─► tensor_json::decode_data (copied once, typed)
//!        inputs[i].parameters.binary_data_size = N ─► next N bytes of the binary section
//!                                                   (a zero-copy slice of the body)
//!        inputs[i].parameters.shared_memory_region ─► ShmPlan (read by crate::shm later)
//!        outputs[i].parameters.shared_memory_region ─► ShmPlan (written by crate::shm later)
//! body = one input's raw bytes                     Inference-Header-Content-Length: 0
//!        see raw_request
//! ```
//!
//! Messages follow Triton's wording where clients or tests know it (binary size mismatches,
//! the "only one of" rule, duplicate outputs). Where Triton answers 500 for a client mistake (a
//! negative shape dimension, a data/shape count mismatch) this answers 400 naming the input. An
//! empty body without the header is refused as such, where Triton would treat it as a raw
//! request of zero bytes.

use std::collections::{HashMap, HashSet};

use axum::http::HeaderMap;
use bytes::Bytes;
use serde_json::{Map, Value};

use super::json_body::{MAX_REQUEST_DEPTH, parse_request_json};
use super::tensor_json::{decode_data, describe};
use nereid_proto::codec::RequestLimits;
use nereid_proto::{
    DataType, Frontend, InferRequest, ParamValue, Parameters, RequestContext, RequestOptions,
    RequestedOutput, ServiceError, ServiceResult, ShmInput, ShmOutput, ShmPlan, ShmRef,
    TRACEPARENT, TRACESTATE, Tensor, TraceContext, element_count, format_shape,
};

/// Length of the JSON header when binary tensor data follows it.
pub const INFER_HEADER_CONTENT_LENGTH: &str = "inference-header-content-length";

/// Which outputs go back as binary data: per-output `binary_data`, else the request-level
/// `binary_data_output` (the extension's documented override rule).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OutputFormat {
    pub default_binary: bool,
    pub per_output: HashMap<String, bool>,
}

impl OutputFormat {
    pub fn is_binary(&self, output: &str) -> bool {
        self.per_output
            .get(output)
            .copied()
            .unwrap_or(self.default_binary)
    }
}

/// A decoded request, its output format, and its tensors in client shared memory (inputs
/// missing from `request` until they are read).
#[derive(Debug)]
pub struct DecodedRequest {
    pub request: InferRequest,
    pub format: OutputFormat,
    pub shm: ShmPlan,
}

/// The context an HTTP request's headers give it: the W3C `traceparent` / `tracestate`
/// (ignored when invalid). HTTP has no deadline header, so there is no deadline.
pub fn request_context(headers: &HeaderMap) -> RequestContext {
    let text = |name: &'static str| {
        headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect::<Vec<_>>()
    };
    RequestContext {
        trace: TraceContext::from_values(text(TRACEPARENT), text(TRACESTATE)),
        frontend: Some(Frontend::Http),
        ..Default::default()
    }
}

/// The `Inference-Header-Content-Length` value: `None` when absent (the whole body is JSON).
/// Like Triton it must parse as an int32 within `[0, body_len]`.
pub fn header_length(headers: &HeaderMap, body_len: usize) -> ServiceResult<Option<usize>> {
    let Some(value) = headers.get(INFER_HEADER_CONTENT_LENGTH) else {
        return Ok(None);
    };
    let text = value.to_str().unwrap_or("<non-ASCII value>");
    let name = "Inference-Header-Content-Length";
    let parsed: i64 = text.trim().parse().map_err(|e: std::num::ParseIntError| {
        use std::num::IntErrorKind::{NegOverflow, PosOverflow};
        match e.kind() {
            PosOverflow | NegOverflow => out_of_int32(name, text),
            _ => ServiceError::invalid(format!("Unable to parse {name}, got: {text}")),
        }
    })?;
    if i32::try_from(parsed).is_err() {
        return Err(out_of_int32(name, text));
    }
    match usize::try_from(parsed) {
        Ok(len) if len <= body_len => Ok(Some(len)),
        _ => Err(ServiceError::invalid(format!(
            "inference header size should be in range (0, {body_len}), got: {text}"
        ))),
    }
}

fn out_of_int32(name: &str, text: &str) -> ServiceError {
    ServiceError::invalid(format!(
        "Unable to parse {name}, value is out of range [ {}, {} ], got: {text}",
        i32::MIN,
        i32::MAX
    ))
}

/// [`decode_json_within`] the default [`RequestLimits`].
pub fn decode_json(
    model: &str,
    version: Option<i64>,
    body: Bytes,
    header_len: Option<usize>,
    max_input_size: usize,
) -> ServiceResult<DecodedRequest> {
    let limits = RequestLimits::default();
    decode_json_within(model, version, body, header_len, max_input_size, &limits)
}

/// Decodes a JSON (optionally binary-extended) request. `header_len` is the JSON header's length
/// (`None`: the whole body); `max_input_size` bounds each JSON-decoded input. The request must
/// stay within `limits`, checked on the input and output counts and on each input's declared
/// shape before its data is decoded (the checks the gRPC codec makes).
pub fn decode_json_within(
    model: &str,
    version: Option<i64>,
    body: Bytes,
    header_len: Option<usize>,
    max_input_size: usize,
    limits: &RequestLimits,
) -> ServiceResult<DecodedRequest> {
    let (header, binary) = match header_len {
        Some(len) => (body.slice(..len), body.slice(len..)),
        None => (body, Bytes::new()),
    };
    if header.is_empty() {
        return Err(ServiceError::invalid(
            "the request body is empty; expected an inference request JSON object",
        ));
    }
    let Value::Object(doc) = parse_request_json(&header, MAX_REQUEST_DEPTH)? else {
        return Err(ServiceError::invalid("the request JSON must be an object"));
    };
    let id = match doc.get("id") {
        None => String::new(),
        Some(Value::String(id)) => id.clone(),
        Some(other) => {
            return Err(ServiceError::invalid(format!(
                "'id' must be a string, got {}",
                describe(other)
            )));
        }
    };
    let mut parameters = parameters(doc.get("parameters"), "")?;
    let default_binary = match parameters.get("binary_data_output") {
        None => false,
        Some(ParamValue::Bool(b)) => *b,
        Some(_) => {
            return Err(ServiceError::invalid(
                "parameter 'binary_data_output' must be a boolean",
            ));
        }
    };
    parameters.remove("binary_data_output");
    let (options, parameters) = RequestOptions::split(parameters)?;

    let mut section = BinarySection {
        data: binary,
        has_header: header_len.is_some(),
        model,
    };
    let inputs = match doc.get("inputs") {
        Some(Value::Array(inputs)) => inputs,
        Some(other) => {
            return Err(ServiceError::invalid(format!(
                "'inputs' must be an array, got {}",
                describe(other)
            )));
        }
        None => return Err(ServiceError::invalid("the request JSON has no 'inputs'")),
    };
    let output_count = match doc.get("outputs") {
        Some(Value::Array(outputs)) => outputs.len(),
        _ => 0,
    };
    limits.check_counts(inputs.len(), output_count)?;
    let mut seen = HashSet::new();
    let mut tensors = Vec::with_capacity(inputs.len());
    let mut shm = ShmPlan::default();
    for (index, input) in inputs.iter().enumerate() {
        let input = decode_input(index, input, &mut section, max_input_size, limits)?;
        let name = match &input {
            Input::Tensor(t) => t.name(),
            Input::Shm(i) => &i.name,
        };
        if !seen.insert(name.to_string()) {
            return Err(ServiceError::invalid(format!(
                "input '{name}' already exists in request"
            )));
        }
        match input {
            Input::Tensor(t) => tensors.push(t),
            Input::Shm(i) => shm.inputs.push(i),
        }
    }
    if !section.data.is_empty() {
        return Err(ServiceError::invalid(format!(
            "unexpected additional input data for model '{model}'"
        )));
    }
    let mut format = OutputFormat {
        default_binary,
        per_output: HashMap::new(),
    };
    let outputs = decode_outputs(doc.get("outputs"), &mut format, &mut shm.outputs)?;
    let request = InferRequest {
        model_name: model.to_string(),
        model_version: version,
        id,
        options,
        parameters,
        inputs: tensors,
        outputs,
        context: RequestContext::default(),
    };
    Ok(DecodedRequest {
        request,
        format,
        shm,
    })
}

/// An input as decoded: a tensor, or a reference to one in shared memory.
enum Input {
    Tensor(Tensor),
    Shm(ShmInput),
}

/// The bytes after the JSON header, handed out to binary inputs in order.
struct BinarySection<'a> {
    data: Bytes,
    has_header: bool,
    model: &'a str,
}

impl BinarySection<'_> {
    fn take(&mut self, input: &str, size: u64) -> ServiceResult<Bytes> {
        if size == 0 {
            return Ok(Bytes::new());
        }
        if !self.has_header {
            return Err(ServiceError::invalid(
                "must specify valid 'Infer-Header-Content-Length' in request header and 'binary_data_size' when passing inputs in binary data format",
            ));
        }
        let available = self.data.len() as u64;
        if size > available {
            return Err(ServiceError::invalid(format!(
                "unexpected size for input '{input}', expecting {} additional bytes for model '{}'",
                size - available,
                self.model
            )));
        }
        Ok(self.data.split_to(size as usize))
    }
}

fn decode_input(
    index: usize,
    input: &Value,
    section: &mut BinarySection<'_>,
    max_input_size: usize,
    limits: &RequestLimits,
) -> ServiceResult<Input> {
    let Value::Object(input) = input else {
        return Err(ServiceError::invalid(format!(
            "inputs[{index}] must be an object, got {}",
            describe(input)
        )));
    };
    let name = match input.get("name") {
        Some(Value::String(name)) => name.as_str(),
        _ => {
            return Err(ServiceError::invalid(format!(
                "inputs[{index}] must have a string 'name'"
            )));
        }
    };
    let datatype = match input.get("datatype") {
        Some(Value::String(dt)) => DataType::from_wire(dt).ok_or_else(|| {
            ServiceError::invalid(format!("input '{name}': unknown datatype '{dt}'"))
        })?,
        _ => {
            return Err(ServiceError::invalid(format!(
                "input '{name}' must have a string 'datatype'"
            )));
        }
    };
    let shape = shape(name, input.get("shape"))?;
    limits.check_shape(section.model, name, &shape)?;
    let count = element_count(&shape).ok_or_else(|| {
        ServiceError::invalid(format!(
            "input '{name}': shape {} causes the total element count to overflow",
            format_shape(&shape)
        ))
    })?;
    let params = match input.get("parameters") {
        None => None,
        Some(Value::Object(params)) => Some(params),
        Some(other) => {
            return Err(ServiceError::invalid(format!(
                "input '{name}': 'parameters' must be an object, got {}",
                describe(other)
            )));
        }
    };
    let param = |key: &str| params.and_then(|p| p.get(key));
    let data = input.get("data");
    let binary_size = param("binary_data_size");
    let shm = param("shared_memory_region");
    let sources = [
        (data, "data"),
        (binary_size, "binary_data_size"),
        (shm, "shared_memory_region"),
    ];
    let set: Vec<&str> = sources
        .iter()
        .filter(|(v, _)| v.is_some())
        .map(|(_, k)| *k)
        .collect();
    if set.len() != 1 {
        let found = if set.is_empty() {
            " no field is set".to_string()
        } else {
            set.iter()
                .fold(" set".to_string(), |acc, k| format!("{acc} '{k}'"))
        };
        return Err(ServiceError::invalid(format!(
            "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', 'shared_memory_region' in 'parameters'. But{found}"
        )));
    }
    let bytes = match (data, binary_size) {
        (Some(data), _) => decode_data(name, datatype, count, data, max_input_size)?,
        (None, Some(size)) => {
            let size = size.as_u64().ok_or_else(|| {
                ServiceError::invalid(format!(
                    "input '{name}': 'binary_data_size' must be a non-negative integer, got {}",
                    describe(size)
                ))
            })?;
            section.take(name, size)?
        }
        (None, None) => {
            let owner = format!("input '{name}'");
            let mut typed = parameters(input.get("parameters"), &format!("{owner}: "))?;
            let at = ShmRef::take(&mut typed, &owner)?
                .ok_or_else(|| ServiceError::invalid(format!("{owner}: no data source is set")))?;
            return Ok(Input::Shm(ShmInput {
                position: index,
                name: name.to_string(),
                datatype,
                shape,
                at,
            }));
        }
    };
    Tensor::new(name, datatype, shape, bytes).map(Input::Tensor)
}

/// An input's `shape`: non-negative integers. Triton answers a negative dimension with a 500
/// ("Unable to parse 'shape'"); it is the client's mistake, so this is a 400 naming the input.
fn shape(name: &str, value: Option<&Value>) -> ServiceResult<Vec<i64>> {
    let bad = |got: String| {
        ServiceError::invalid(format!(
            "input '{name}': 'shape' must be an array of non-negative integers, got {got}"
        ))
    };
    let Some(Value::Array(dims)) = value else {
        return Err(bad(value.map_or("nothing".into(), describe)));
    };
    dims.iter()
        .map(|d| {
            d.as_i64()
                .filter(|d| *d >= 0)
                .ok_or_else(|| bad(Value::Array(dims.clone()).to_string()))
        })
        .collect()
}

fn decode_outputs(
    value: Option<&Value>,
    format: &mut OutputFormat,
    shm: &mut Vec<ShmOutput>,
) -> ServiceResult<Vec<RequestedOutput>> {
    let outputs = match value {
        None => return Ok(Vec::new()),
        Some(Value::Array(outputs)) => outputs,
        Some(other) => {
            return Err(ServiceError::invalid(format!(
                "'outputs' must be an array, got {}",
                describe(other)
            )));
        }
    };
    let mut requested = Vec::with_capacity(outputs.len());
    let mut seen = HashSet::new();
    for (index, output) in outputs.iter().enumerate() {
        let name = match output.get("name") {
            Some(Value::String(name)) => name.clone(),
            _ => {
                return Err(ServiceError::invalid(format!(
                    "outputs[{index}] must be an object with a string 'name'"
                )));
            }
        };
        if !seen.insert(name.clone()) {
            return Err(ServiceError::invalid(format!(
                "output '{name}' already exists in request"
            )));
        }
        let mut parameters = parameters(output.get("parameters"), &format!("output '{name}': "))?;
        if let Some(at) = ShmRef::take(&mut parameters, &format!("output '{name}'"))? {
            shm.push(ShmOutput {
                name: name.clone(),
                at,
            });
        }
        match parameters.remove("binary_data") {
            None => {}
            Some(ParamValue::Bool(binary)) => {
                format.per_output.insert(name.clone(), binary);
            }
            Some(_) => {
                return Err(ServiceError::invalid(format!(
                    "output '{name}': parameter 'binary_data' must be a boolean"
                )));
            }
        }
        requested.push(RequestedOutput { name, parameters });
    }
    Ok(requested)
}

/// A `parameters` object → typed values; `owner` prefixes messages (e.g. "output 'y': ").
fn parameters(value: Option<&Value>, owner: &str) -> ServiceResult<Parameters> {
    let map: &Map<String, Value> = match value {
        None => return Ok(Parameters::new()),
        Some(Value::Object(map)) => map,
        Some(other) => {
            return Err(ServiceError::invalid(format!(
                "{owner}'parameters' must be an object, got {}",
                describe(other)
            )));
        }
    };
    map.iter()
        .map(|(key, v)| {
            let value = param_value(v).ok_or_else(|| bad_parameter(owner, key, v))?;
            Ok((key.clone(), value))
        })
        .collect()
}

/// A JSON parameter value: string, bool, or number (int64, else uint64, else double); `None`
/// for null, arrays and objects.
pub fn param_value(value: &Value) -> Option<ParamValue> {
    match value {
        Value::Bool(b) => Some(ParamValue::Bool(*b)),
        Value::String(s) => Some(ParamValue::String(s.clone())),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => Some(ParamValue::Int(i)),
            (None, Some(u), _) => Some(ParamValue::Uint(u)),
            (None, None, f) => f.map(ParamValue::Double),
        },
        Value::Null | Value::Array(_) | Value::Object(_) => None,
    }
}

/// The error for a parameter value [`param_value`] refuses; `owner` prefixes the message.
pub fn bad_parameter(owner: &str, key: &str, value: &Value) -> ServiceError {
    ServiceError::invalid(format!(
        "{owner}parameter '{key}' must be a string, integer, number or boolean, got {}",
        describe(value)
    ))
}
