//! `ModelInferRequest` → [`InferRequest`] and [`InferResponse`] → `ModelInferResponse`.
//!
//! ```text
//! ModelInferRequest
//!   parameters ──► ParamValue (uint64 refused for custom keys) ──► RequestOptions::split
//!   inputs[i] + raw_input_contents[i] ─┐  (zero-copy Bytes, paired by position)
//!   inputs[i].contents (typed) ────────┴─► contents::contents_to_bytes ──► Tensor::new
//!   outputs ──► RequestedOutput (names unique, parameters passed through)
//!
//! InferResponse.outputs[i] ──► outputs[i] (name, datatype, shape) + raw_output_contents[i]
//! ```
//!
//! The request's metadata gives its [`RequestContext`]: `traceparent` / `tracestate` (W3C trace
//! context, ignored when invalid) and `grpc-timeout` (the deadline, counted from arrival).
//!
//! An input carries its data either raw or typed, never both; once any raw contents are present
//! every input must have exactly one. Responses always use `raw_output_contents`, as Triton's do,
//! so output bytes go out without a copy.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use tonic::metadata::MetadataMap;

use crate::datatype::DataType;
use crate::error::{ServiceError, ServiceResult};
use crate::grpc::contents::{InputRef, contents_to_bytes};
use crate::pb::inference::infer_parameter::ParameterChoice;
use crate::pb::inference::model_infer_request::{InferInputTensor, InferRequestedOutputTensor};
use crate::pb::inference::model_infer_response::InferOutputTensor;
use crate::pb::inference::{InferParameter, ModelInferRequest, ModelInferResponse};
use crate::trace_context::{
    GRPC_TIMEOUT, TRACEPARENT, TRACESTATE, TraceContext, parse_grpc_timeout,
};
use crate::types::{
    self, InferRequest, InferResponse, ParamValue, Parameters, RESERVED_PARAMETER_KEYS,
    RequestContext, RequestOptions, RequestedOutput, Tensor, format_shape,
};

/// A `triton_` request key Triton accepts: a streamed request asks with it for an empty response
/// that marks its end. It is taken out of the parameters (type-checked) before they are split;
/// a unary request ignores it.
const EMPTY_FINAL_RESPONSE_KEY: &str = "triton_enable_empty_final_response";

/// Tensor parameters that point at client shared memory, which this server does not serve.
const SHARED_MEMORY_KEYS: [&str; 3] = [
    "shared_memory_region",
    "shared_memory_offset",
    "shared_memory_byte_size",
];

/// Validates and converts a unary `ModelInfer` call, its metadata included.
pub(crate) fn decode_call(call: tonic::Request<ModelInferRequest>) -> ServiceResult<InferRequest> {
    let context = request_context(call.metadata(), Instant::now());
    let mut request = decode_request(call.into_inner())?;
    request.context = context;
    Ok(request)
}

/// The trace context and deadline a call's metadata carries; `now` is when the call arrived.
/// A malformed `grpc-timeout` is ignored, as tonic's server does.
pub(crate) fn request_context(metadata: &MetadataMap, now: Instant) -> RequestContext {
    let text = |key: &'static str| {
        metadata
            .get_all(key)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect::<Vec<_>>()
    };
    let deadline = metadata
        .get(GRPC_TIMEOUT)
        .and_then(|v| v.to_str().ok())
        .and_then(parse_grpc_timeout)
        .and_then(|timeout| now.checked_add(timeout));
    RequestContext {
        trace: TraceContext::from_values(text(TRACEPARENT), text(TRACESTATE)),
        deadline,
        received: Some(now),
        ..Default::default()
    }
}

/// Validates and converts a gRPC infer request into the internal request.
pub(crate) fn decode_request(request: ModelInferRequest) -> ServiceResult<InferRequest> {
    decode_stream_request(request).map(|decoded| decoded.request)
}

/// A request read from a `ModelStreamInfer` stream, with the stream-only flag it carried.
#[derive(Debug)]
pub(crate) struct StreamRequest {
    pub request: InferRequest,
    /// `triton_enable_empty_final_response`: send an empty response marked final when the model
    /// ends the request without one.
    pub empty_final_response: bool,
}

/// [`decode_request`], keeping `triton_enable_empty_final_response`.
pub(crate) fn decode_stream_request(request: ModelInferRequest) -> ServiceResult<StreamRequest> {
    let ModelInferRequest {
        model_name,
        model_version,
        id,
        parameters,
        inputs,
        outputs,
        raw_input_contents,
    } = request;
    let model_version = types::parse_version(&model_name, &model_version)?;
    let (parameters, empty_final_response) = request_parameters(parameters)?;
    let (options, parameters) = RequestOptions::split(parameters)?;

    if !raw_input_contents.is_empty() {
        if let Some(typed) = inputs.iter().find(|i| i.contents.is_some()) {
            return Err(ServiceError::invalid(format!(
                "contents field must not be specified when using raw_input_contents for '{}' for model '{model_name}'",
                typed.name
            )));
        }
        if raw_input_contents.len() != inputs.len() {
            return Err(ServiceError::invalid(format!(
                "model '{model_name}': the request has {} inputs but {} raw_input_contents entries; send one entry per input, in input order",
                inputs.len(),
                raw_input_contents.len()
            )));
        }
    }

    let mut raw = raw_input_contents.into_iter();
    let mut seen = HashSet::new();
    let mut tensors = Vec::with_capacity(inputs.len());
    for input in inputs {
        if !seen.insert(input.name.clone()) {
            return Err(ServiceError::invalid(format!(
                "input '{}' already exists in request",
                input.name
            )));
        }
        let data = raw.next();
        tensors.push(decode_input(&model_name, input, data)?);
    }

    let mut seen = HashSet::new();
    let mut requested = Vec::with_capacity(outputs.len());
    for output in outputs {
        if !seen.insert(output.name.clone()) {
            return Err(ServiceError::invalid(format!(
                "output '{}' already exists in request",
                output.name
            )));
        }
        requested.push(decode_output(&model_name, output)?);
    }

    let request = InferRequest {
        model_name,
        model_version,
        id,
        options,
        parameters,
        inputs: tensors,
        outputs: requested,
        context: RequestContext::default(),
    };
    Ok(StreamRequest {
        request,
        empty_final_response,
    })
}

/// Converts one input; `raw` is its entry of `raw_input_contents`, if the request has them.
fn decode_input(
    model: &str,
    input: InferInputTensor,
    raw: Option<bytes::Bytes>,
) -> ServiceResult<Tensor> {
    let InferInputTensor {
        name,
        datatype,
        shape,
        parameters,
        contents,
    } = input;
    let at = InputRef {
        model,
        input: &name,
    };
    let Some(dtype) = DataType::from_wire(&datatype) else {
        return Err(ServiceError::invalid(format!(
            "input '{name}' for model '{model}': unknown datatype '{datatype}'"
        )));
    };
    let Some(element_count) = types::element_count(&shape) else {
        return Err(ServiceError::invalid(format!(
            "input '{name}' for model '{model}': shape {} is invalid; dimensions must be non-negative",
            format_shape(&shape)
        )));
    };
    refuse_shared_memory(&parameters, "input", &name, model)?;
    let data = match (raw, contents) {
        (Some(raw), _) => raw,
        (None, Some(contents)) => contents_to_bytes(at, dtype, &shape, element_count, contents)?,
        (None, None) => {
            return Err(ServiceError::invalid(format!(
                "unable to find data for input tensor '{name}' for model '{model}' in request."
            )));
        }
    };
    Tensor::new(name, dtype, shape, data)
}

fn decode_output(
    model: &str,
    output: InferRequestedOutputTensor,
) -> ServiceResult<RequestedOutput> {
    refuse_shared_memory(&output.parameters, "output", &output.name, model)?;
    let mut parameters = Parameters::new();
    for (key, value) in output.parameters {
        let value = param_from_wire(&key, value)?;
        parameters.insert(key, value);
    }
    Ok(RequestedOutput {
        name: output.name,
        parameters,
    })
}

fn refuse_shared_memory(
    parameters: &HashMap<String, InferParameter>,
    kind: &str,
    name: &str,
    model: &str,
) -> ServiceResult<()> {
    match SHARED_MEMORY_KEYS
        .iter()
        .find(|k| parameters.contains_key(**k))
    {
        Some(key) => Err(ServiceError::unsupported(format!(
            "{kind} '{name}' for model '{model}': parameter '{key}' asks for client shared memory, which this server does not support yet"
        ))),
        None => Ok(()),
    }
}

/// Converts request-level parameters, applying Triton's gRPC type rules: custom keys take
/// bool, int64, double or string values (not uint64). Returns the parameters without
/// `triton_enable_empty_final_response`, and that flag's value.
fn request_parameters(wire: HashMap<String, InferParameter>) -> ServiceResult<(Parameters, bool)> {
    let mut parameters = Parameters::new();
    let mut empty_final_response = false;
    for (key, value) in wire {
        let value = param_from_wire(&key, value)?;
        if key == EMPTY_FINAL_RESPONSE_KEY {
            let ParamValue::Bool(enabled) = value else {
                return Err(ServiceError::invalid(format!(
                    "invalid value type for '{key}' parameter, expected bool_param."
                )));
            };
            empty_final_response = enabled;
            continue;
        }
        let custom =
            !RESERVED_PARAMETER_KEYS.contains(&key.as_str()) && !key.starts_with("triton_");
        if custom && matches!(value, ParamValue::Uint(_)) {
            return Err(ServiceError::invalid(format!(
                "invalid value type for '{key}' parameter, expected int64_param, bool_param, double_param or string_param."
            )));
        }
        parameters.insert(key, value);
    }
    Ok((parameters, empty_final_response))
}

fn param_from_wire(key: &str, param: InferParameter) -> ServiceResult<ParamValue> {
    match param.parameter_choice {
        Some(ParameterChoice::BoolParam(v)) => Ok(ParamValue::Bool(v)),
        Some(ParameterChoice::Int64Param(v)) => Ok(ParamValue::Int(v)),
        Some(ParameterChoice::StringParam(v)) => Ok(ParamValue::String(v)),
        Some(ParameterChoice::DoubleParam(v)) => Ok(ParamValue::Double(v)),
        Some(ParameterChoice::Uint64Param(v)) => Ok(ParamValue::Uint(v)),
        None => Err(ServiceError::invalid(format!(
            "parameter '{key}' has no value set"
        ))),
    }
}

fn param_to_wire(value: ParamValue) -> InferParameter {
    let choice = match value {
        ParamValue::Bool(v) => ParameterChoice::BoolParam(v),
        ParamValue::Int(v) => ParameterChoice::Int64Param(v),
        ParamValue::Uint(v) => ParameterChoice::Uint64Param(v),
        ParamValue::Double(v) => ParameterChoice::DoubleParam(v),
        ParamValue::String(v) => ParameterChoice::StringParam(v),
    };
    InferParameter {
        parameter_choice: Some(choice),
    }
}

/// Converts the internal response; tensor bytes move into `raw_output_contents` uncopied.
pub(crate) fn encode_response(response: InferResponse) -> ModelInferResponse {
    let InferResponse {
        model_name,
        model_version,
        id,
        parameters,
        outputs,
    } = response;
    let mut tensors = Vec::with_capacity(outputs.len());
    let mut raw = Vec::with_capacity(outputs.len());
    for output in outputs {
        let (name, datatype, shape, data) = output.into_parts();
        tensors.push(InferOutputTensor {
            name,
            datatype: datatype.as_wire().to_string(),
            shape,
            parameters: HashMap::new(),
            contents: None,
        });
        raw.push(data);
    }
    ModelInferResponse {
        model_name,
        model_version,
        id,
        parameters: parameters
            .into_iter()
            .map(|(k, v)| (k, param_to_wire(v)))
            .collect(),
        outputs: tensors,
        raw_output_contents: raw,
    }
}

#[cfg(test)]
#[path = "infer_tests.rs"]
mod tests;
