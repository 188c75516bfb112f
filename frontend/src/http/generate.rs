//! `POST /v2/models/{m}[/versions/{v}]/generate` and `/generate_stream`: Triton's text-oriented
//! endpoints, one flat JSON object in and one per response out, over one streamed inference.
//!
//! ```text
//! {"id": "r1", "text_input": "Hi", "parameters": {"max_tokens": 8, "temperature": 0.5}}
//!   ├─ InferenceService::model_metadata      input names, datatypes and shapes
//!   ├─ decode_generate   every key but `id`, at the top level and inside `parameters`:
//!   │      names a model input ─► Tensor: a scalar or 1-D array, shape fitted to the metadata
//!   │      otherwise           ─► request parameter ─► RequestOptions::split
//!   ├─ InferenceService::infer_stream
//!   └─ response_json     {"model_name", "model_version", "id"?, <parameter>: v, <output>: v}
//!        /generate          exactly one response; application/json
//!        /generate_stream   text/event-stream; charset=utf-8; `data: <json>\n\n` per response,
//!                           sent as it arrives
//!        both               `endpoint-load-metrics` when asked for (crate::orca)
//! ```
//!
//! Rules, as Triton's `HandleGenerate`:
//! - Shape: the input's metadata shape with each fixed dimension kept and the values' count
//!   spread over the variable ones (innermost gets the rest, others 1): `[-1, -1]` with 3 values
//!   is `[1, 3]`, `[-1, 2]` with 4 is `[2, 2]`; a count that does not fit is a 400.
//! - Response keys: `id` (only when non-empty), `model_name`, `model_version`, then each response
//!   parameter and each output under its own name (the first of a name wins), in name order. An
//!   output of one element is a JSON scalar, any other a flat array.
//! - The request body must not be compressed; the response is never compressed.
//! - `/generate_stream` fixes its status with the first event: an error before any response is
//!   an ordinary error response, one after it is a last event `data: {"error":"..."}`. An empty
//!   final item (a decoupled model ending without a response) sends nothing.
//!
//! Where this differs from Triton: `id` is only the request id (Triton also passes it on as a
//! parameter named `id`); reserved parameter keys (`sequence_id`, `priority`, ...) act as on
//! `/infer` and `triton_*` keys are refused; a key given both at the top level and inside
//! `parameters` is a 400; a BYTES output that is not UTF-8 is refused by name rather than
//! written as invalid JSON; the ORCA header reports queue figures, not Triton's TensorRT-LLM
//! KV-cache ones; `/generate` without exactly one response answers 500 (Triton's
//! error class) where Triton writes the error after a 200 status line.

use std::collections::BTreeMap;
use std::convert::Infallible;

use axum::body::Body;
use axum::extract::Request;
use axum::http::header::{CONTENT_ENCODING, CONTENT_TYPE};
use axum::http::{HeaderMap, HeaderValue};
use axum::response::Response;
use bytes::Bytes;
use futures::{StreamExt, stream};
use serde_json::{Map, Value};

use super::HttpState;
use super::body::read_body;
use super::error::HttpError;
use super::infer_request::{bad_parameter, param_value, request_context};
use super::json_body::{MAX_REQUEST_DEPTH, parse_json};
use super::tensor_json::{JsonData, bytes_are_utf8, decode_data, describe};
use crate::orca;
use nereid_proto::{
    DataType, InferRequest, InferResponse, ParamValue, Parameters, RequestOptions, ResponseStream,
    ServiceError, ServiceResult, StreamedResponse, Tensor, TensorMetadata, element_count,
    format_shape, parse_version,
};

/// The key whose object holds more keys, mapped like top-level ones.
const NESTED_KEY: &str = "parameters";

/// Triton's message when `/generate` gets other than one response.
pub const NOT_ONE_RESPONSE: &str = "generate expects model to produce exactly 1 response, use generate stream for model that generates various number of responses";

const EVENT_STREAM: &str = "text/event-stream; charset=utf-8";

/// Serves `/generate` (`streaming` false) and `/generate_stream` (true).
pub async fn generate(
    state: &HttpState,
    model: &str,
    version: &str,
    request: Request,
    streaming: bool,
) -> Result<Response, HttpError> {
    let received = std::time::Instant::now();
    let version = parse_version(version)?;
    let metadata = state.service.model_metadata(model, version).await?;
    let (parts, body) = request.into_parts();
    require_identity(&parts.headers)?;
    let limit = state.config.max_input_size;
    let body = read_body(&parts.headers, body, limit).await?;
    let mut request = decode_generate(model, version, &body, &metadata.inputs, limit)?;
    request.context = request_context(&parts.headers);
    request.context.received = Some(received);
    let responses = state.service.infer_stream(request).await?;
    let mut response = if streaming {
        event_stream(responses).await?
    } else {
        single_response(responses).await?
    };
    orca::annotate(state.service.as_ref(), &parts.headers, model, &mut response).await;
    Ok(response)
}

/// Refuses a compressed request body, as Triton does on these endpoints.
fn require_identity(headers: &HeaderMap) -> ServiceResult<()> {
    let Some(value) = headers.get(CONTENT_ENCODING) else {
        return Ok(());
    };
    let text = value.to_str().unwrap_or("<non-ASCII>").trim();
    if text.is_empty() || text.eq_ignore_ascii_case("identity") {
        return Ok(());
    }
    Err(ServiceError::invalid(format!(
        "Unsupported content-encoding '{text}', only 'identity' is supported by the generate endpoints"
    )))
}

/// Converts a generate body into the request for `model`, whose inputs `inputs` describes;
/// `max_input_size` bounds the inputs' decoded bytes together. An empty body is an empty object.
pub fn decode_generate(
    model: &str,
    version: Option<i64>,
    body: &[u8],
    inputs: &[TensorMetadata],
    max_input_size: usize,
) -> ServiceResult<InferRequest> {
    let doc = if body.is_empty() {
        Map::new()
    } else {
        match parse_json(body, MAX_REQUEST_DEPTH, "generate request")? {
            Value::Object(doc) => doc,
            other => {
                return Err(ServiceError::invalid(format!(
                    "the generate request must be a JSON object, got {}",
                    describe(&other)
                )));
            }
        }
    };
    let mut id = None;
    let mut nested = Map::new();
    let mut top = Vec::with_capacity(doc.len());
    for (key, value) in doc {
        match (key.as_str(), value) {
            ("id", Value::String(s)) => id = Some(s),
            ("id", other) => {
                return Err(ServiceError::invalid(format!(
                    "'id' must be a string, got {}",
                    describe(&other)
                )));
            }
            (NESTED_KEY, value) => {
                if inputs.iter().any(|i| i.name == NESTED_KEY) {
                    return Err(ServiceError::invalid(format!(
                        "Keyword '{NESTED_KEY}' for nested schema also given as input tensor name"
                    )));
                }
                let Value::Object(map) = value else {
                    return Err(ServiceError::invalid(format!(
                        "Expected JSON object for keyword: '{NESTED_KEY}', got {}",
                        describe(&value)
                    )));
                };
                nested = map;
            }
            (_, value) => top.push((key, value)),
        }
    }
    if let Some(key) = nested
        .keys()
        .find(|k| (*k == "id" && id.is_some()) || top.iter().any(|(t, _)| t == *k))
    {
        return Err(ServiceError::invalid(format!(
            "key '{key}' is given both at the top level and inside '{NESTED_KEY}'; give it once"
        )));
    }

    let mut request = request_from_keys(
        model,
        version,
        top.into_iter().chain(nested),
        inputs,
        max_input_size,
    )?;
    request.id = id.unwrap_or_default();
    Ok(request)
}

/// The request for `model` from flat keys, as the generate endpoints map them: a key naming
/// one of `inputs` becomes that input (a scalar or flat array, shaped by the metadata), any
/// other a request parameter. The OpenAI routes build their requests through this too.
pub fn request_from_keys(
    model: &str,
    version: Option<i64>,
    keys: impl IntoIterator<Item = (String, Value)>,
    inputs: &[TensorMetadata],
    max_input_size: usize,
) -> ServiceResult<InferRequest> {
    let mut mapper = Mapper {
        inputs,
        max_input_size,
        consumed: 0,
        tensors: Vec::new(),
        parameters: Parameters::new(),
    };
    for (key, value) in keys {
        mapper.map(key, value)?;
    }
    let (options, parameters) = RequestOptions::split(mapper.parameters)?;
    Ok(InferRequest {
        model_name: model.to_string(),
        model_version: version,
        options,
        parameters,
        inputs: mapper.tensors,
        outputs: Vec::new(),
        ..InferRequest::default()
    })
}

/// Sorts each key into an input tensor or a request parameter.
struct Mapper<'a> {
    inputs: &'a [TensorMetadata],
    max_input_size: usize,
    /// Decoded input bytes so far.
    consumed: usize,
    tensors: Vec<Tensor>,
    parameters: Parameters,
}

impl Mapper<'_> {
    fn map(&mut self, key: String, value: Value) -> ServiceResult<()> {
        let Some(input) = self.inputs.iter().find(|i| i.name == key) else {
            let param = param_value(&value).ok_or_else(|| bad_parameter("", &key, &value))?;
            self.parameters.insert(key, param);
            return Ok(());
        };
        let tensor = input_tensor(input, value, self.max_input_size)?;
        let size = tensor.data().len();
        match self.consumed.checked_add(size) {
            Some(total) if total <= self.max_input_size => self.consumed = total,
            _ => {
                return Err(ServiceError::invalid(format!(
                    "request size of {} bytes with input '{key}' of size {size} bytes exceeds the maximum allowed input size of {}. Use --http-max-input-size to increase the limit.",
                    self.consumed, self.max_input_size
                )));
            }
        }
        self.tensors.push(tensor);
        Ok(())
    }
}

/// One input from a JSON scalar or flat array, typed and shaped by the model's metadata.
fn input_tensor(input: &TensorMetadata, value: Value, max_bytes: usize) -> ServiceResult<Tensor> {
    let name = input.name.as_str();
    let datatype = DataType::from_wire(&input.datatype).ok_or_else(|| {
        ServiceError::internal(format!(
            "input '{name}': the model metadata has an unknown datatype '{}'",
            input.datatype
        ))
    })?;
    let expected = match datatype {
        DataType::Bytes => "a string",
        DataType::Bool => "true or false",
        _ => "a number",
    };
    let values = match value {
        Value::Array(items) => {
            if let Some(item) = items.iter().find(|v| v.is_array() || v.is_object()) {
                return Err(ServiceError::invalid(format!(
                    "input '{name}': expected {expected} or a flat array of them, got an array holding {}",
                    describe(item)
                )));
            }
            Value::Array(items)
        }
        Value::Object(_) | Value::Null => {
            return Err(ServiceError::invalid(format!(
                "input '{name}': expected {expected} or a flat array of them, got {}",
                describe(&value)
            )));
        }
        scalar => Value::Array(vec![scalar]),
    };
    let count = values.as_array().map_or(0, Vec::len);
    let shape = fit_shape(&input.shape, count).ok_or_else(|| {
        ServiceError::invalid(format!(
            "input '{name}': cannot shape {count} element(s) to the model's input shape {}",
            format_shape(&input.shape)
        ))
    })?;
    let data = decode_data(name, datatype, count, &values, max_bytes)?;
    Tensor::new(name, datatype, shape, data)
}

/// Fits `count` values to a metadata shape: fixed dimensions stay, the innermost variable one
/// takes what the fixed ones leave, other variable ones are 1. `None` if the count does not fit.
pub fn fit_shape(model_shape: &[i64], count: usize) -> Option<Vec<i64>> {
    let mut rest = i64::try_from(count).ok()?;
    for &d in model_shape.iter().rev().filter(|d| **d > 0) {
        if rest % d != 0 {
            return None;
        }
        rest /= d;
    }
    let mut shape = model_shape.to_vec();
    for d in shape.iter_mut().rev().filter(|d| **d < 0) {
        *d = rest;
        rest = 1;
    }
    (element_count(&shape)? == count).then_some(shape)
}

/// A response as the generate endpoints write it.
pub fn response_json(response: InferResponse) -> ServiceResult<Value> {
    let InferResponse {
        model_name,
        model_version,
        id,
        parameters,
        outputs,
    } = response;
    let mut fields = BTreeMap::new();
    if !id.is_empty() {
        fields.insert("id".to_string(), Value::String(id));
    }
    fields.insert("model_name".to_string(), Value::String(model_name));
    fields.insert("model_version".to_string(), Value::String(model_version));
    for (key, value) in parameters {
        fields.entry(key).or_insert_with(|| param_json(value));
    }
    for output in outputs {
        if !fields.contains_key(output.name()) {
            let value = output_json(&output)?;
            fields.insert(output.name().to_string(), value);
        }
    }
    Ok(Value::Object(fields.into_iter().collect()))
}

fn param_json(value: ParamValue) -> Value {
    match value {
        ParamValue::Bool(b) => Value::Bool(b),
        ParamValue::Int(i) => Value::from(i),
        ParamValue::Uint(u) => Value::from(u),
        // NaN and infinities have no JSON form; `from` writes them as null.
        ParamValue::Double(f) => Value::from(f),
        ParamValue::String(s) => Value::String(s),
    }
}

/// An output's elements: a scalar for one element, else a flat array.
fn output_json(output: &Tensor) -> ServiceResult<Value> {
    let name = output.name();
    let datatype = output.datatype();
    if datatype == DataType::Bytes && !bytes_are_utf8(output.data()) {
        return Err(ServiceError::unsupported(format!(
            "output '{name}' holds BYTES that are not valid UTF-8, which the generate endpoints cannot return as JSON strings; use the infer endpoint with binary data for it"
        )));
    }
    let data = JsonData {
        datatype,
        data: output.data(),
    };
    let value = serde_json::to_value(data).map_err(|e| {
        ServiceError::internal(format!("output '{name}': failed to write it as JSON: {e}"))
    })?;
    match value {
        Value::Array(mut items) if items.len() == 1 => Ok(items.swap_remove(0)),
        other => Ok(other),
    }
}

/// `/generate`: the one response, or [`NOT_ONE_RESPONSE`]. A second response ends the request
/// at once (dropping the stream cancels it).
async fn single_response(mut responses: ResponseStream) -> Result<Response, HttpError> {
    let mut only = None;
    while let Some(item) = responses.next().await {
        let StreamedResponse { response, last } = item?;
        if let Some(response) = response
            && only.replace(response).is_some()
        {
            return Err(ServiceError::internal(NOT_ONE_RESPONSE).into());
        }
        if last {
            break;
        }
    }
    let response = only.ok_or_else(|| ServiceError::internal(NOT_ONE_RESPONSE))?;
    let body = serde_json::to_vec(&response_json(response)?).map_err(|e| {
        ServiceError::internal(format!("failed to serialize the generate response: {e}"))
    })?;
    let mut http = Response::new(Body::from(body));
    http.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Ok(http)
}

/// One server-sent event: `data: <json>\n\n` (the OpenAI routes' events too).
pub fn event(json: &Value) -> Bytes {
    let mut chunk = b"data: ".to_vec();
    // Writing a `Value` to a Vec cannot fail: its keys are strings and there is no I/O.
    serde_json::to_writer(&mut chunk, json).unwrap_or_default();
    chunk.extend_from_slice(b"\n\n");
    Bytes::from(chunk)
}

fn error_event(err: ServiceError) -> Bytes {
    event(&serde_json::json!({ "error": err.message() }))
}

/// What a response stream item becomes on the event stream.
enum Next {
    Event {
        chunk: Bytes,
        last: bool,
    },
    /// Nothing to send for this item; read on.
    Skip,
    End,
}

fn next_event(item: Option<ServiceResult<StreamedResponse>>) -> Next {
    match item {
        None
        | Some(Ok(StreamedResponse {
            response: None,
            last: true,
        })) => Next::End,
        Some(Ok(StreamedResponse {
            response: None,
            last: false,
        })) => Next::Skip,
        Some(Ok(StreamedResponse {
            response: Some(response),
            last,
        })) => match response_json(response) {
            Ok(json) => Next::Event {
                chunk: event(&json),
                last,
            },
            Err(err) => Next::Event {
                chunk: error_event(err),
                last: true,
            },
        },
        Some(Err(err)) => Next::Event {
            chunk: error_event(err),
            last: true,
        },
    }
}

/// `/generate_stream`. The status line goes out with the first event, so the first response is
/// awaited here: an error before it is an ordinary error response. The body owns the rest of
/// the stream; a client that disconnects drops it and so cancels the request.
async fn event_stream(mut responses: ResponseStream) -> Result<Response, HttpError> {
    let (first, last) = loop {
        match responses.next().await {
            None => break (None, true),
            Some(Err(err)) => return Err(err.into()),
            Some(Ok(StreamedResponse {
                response: Some(response),
                last,
            })) => break (Some(event(&response_json(response)?)), last),
            Some(Ok(StreamedResponse {
                response: None,
                last,
            })) => {
                if last {
                    break (None, true);
                }
            }
        }
    };
    let rest = (!last).then_some(responses);
    let rest = stream::unfold(rest, |responses| async move {
        let mut responses = responses?;
        loop {
            match next_event(responses.next().await) {
                Next::Skip => continue,
                Next::End => return None,
                Next::Event { chunk, last } => {
                    return Some((chunk, (!last).then_some(responses)));
                }
            }
        }
    });
    let chunks = stream::iter(first).chain(rest).map(Ok::<_, Infallible>);
    let mut http = Response::new(Body::from_stream(chunks));
    http.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(EVENT_STREAM));
    Ok(http)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_fit_like_triton() {
        let fit = |shape: &[i64], count| fit_shape(shape, count);
        assert_eq!(fit(&[-1, -1], 3), Some(vec![1, 3]));
        assert_eq!(fit(&[-1], 3), Some(vec![3]));
        assert_eq!(fit(&[1], 1), Some(vec![1]));
        assert_eq!(fit(&[-1, 1], 1), Some(vec![1, 1]));
        assert_eq!(fit(&[-1, 2], 4), Some(vec![2, 2]));
        assert_eq!(fit(&[-1, -1, 2], 6), Some(vec![1, 3, 2]));
        assert_eq!(fit(&[4], 4), Some(vec![4]));
        assert_eq!(fit(&[], 1), Some(vec![]));
        assert_eq!(fit(&[-1, -1], 0), Some(vec![1, 0]));
        assert_eq!(fit(&[-1, 2], 3), None);
        assert_eq!(fit(&[4], 3), None);
        assert_eq!(fit(&[1], 2), None);
        assert_eq!(fit(&[], 2), None);
        assert_eq!(fit(&[4], 0), None);
    }

    #[test]
    fn events_frame_json_and_errors() {
        assert_eq!(
            &event(&serde_json::json!({"a": 1}))[..],
            b"data: {\"a\":1}\n\n"
        );
        assert_eq!(
            &error_event(ServiceError::internal("boom"))[..],
            b"data: {\"error\":\"boom\"}\n\n"
        );
    }
}
