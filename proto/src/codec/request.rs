//! `ModelInferRequest` ⇄ [`InferRequest`]: decoding what a gRPC client sent (the frontend),
//! encoding what a router forwards to a worker (the client side).
//!
//! ```text
//! decode_request (server side)
//!   input / output counts, each input's declared shape ──► RequestLimits (before any data)
//!   parameters ──► ParamValue (uint64 refused for custom keys) ──► RequestOptions::split
//!   inputs[i] + raw_input_contents[i] ─┐  (zero-copy Bytes, paired by position)
//!   inputs[i].contents (typed) ────────┴─► contents::contents_to_bytes ──► Tensor::new
//!   outputs ──► RequestedOutput (names unique, parameters passed through)
//!
//! encode_request (client side)
//!   options ──► reserved parameters (priority, timeout, sequence_id, sequence_start/end)
//!   parameters ──► custom parameters (uint64 as int64 when it fits)
//!   inputs[i] ──► inputs[i] (name, datatype, shape) + raw_input_contents[i] (shared Bytes)
//! ```
//!
//! An input carries its data raw, typed, or in client shared memory (`shared_memory_region`
//! parameters), exactly one of them; once any raw contents are present every input not in shared
//! memory has exactly one entry, in order (Triton's pairing). Shared-memory inputs and outputs
//! are not read here: they come back as a [`ShmPlan`] beside the request, for the frontend to
//! resolve. Encoding always sends raw contents. The request's context
//! (trace context, deadline) travels as call metadata, which is the transport's business: the
//! frontend reads it, the router's forwarder writes it.

use std::collections::{HashMap, HashSet};

use super::contents::{InputRef, contents_to_bytes};
use super::limits::RequestLimits;
use super::parameters::{param_from_wire, param_to_wire};
use crate::datatype::DataType;
use crate::error::{ServiceError, ServiceResult};
use crate::pb::inference::InferParameter;
use crate::pb::inference::ModelInferRequest;
use crate::pb::inference::model_infer_request::{InferInputTensor, InferRequestedOutputTensor};
use crate::shm_ref::{SHM_REGION, ShmInput, ShmOutput, ShmPlan, ShmRef};
use crate::types::{
    self, CorrelationId, InferRequest, ParamValue, Parameters, RESERVED_PARAMETER_KEYS,
    RequestContext, RequestOptions, RequestedOutput, Tensor, format_shape,
};

/// A `triton_` request key Triton accepts: a streamed request asks with it for an empty response
/// that marks its end. It is taken out of the parameters (type-checked) before they are split;
/// a unary request ignores it.
const EMPTY_FINAL_RESPONSE_KEY: &str = "triton_enable_empty_final_response";

/// Validates and converts a gRPC infer request into the internal request, within the default
/// [`RequestLimits`]. A request with tensors in client shared memory is refused: only a frontend
/// with a registry of regions can serve it, through [`decode_stream_request`] and its
/// [`ShmPlan`].
pub fn decode_request(request: ModelInferRequest) -> ServiceResult<InferRequest> {
    let decoded = decode_stream_request(request, &RequestLimits::default())?;
    if let Some(input) = decoded.shm.inputs.first() {
        return Err(no_shared_memory("input", &input.name));
    }
    if let Some(output) = decoded.shm.outputs.first() {
        return Err(no_shared_memory("output", &output.name));
    }
    Ok(decoded.request)
}

fn no_shared_memory(kind: &str, name: &str) -> ServiceError {
    ServiceError::unsupported(format!(
        "{kind} '{name}': client shared memory is not available here"
    ))
}

/// A decoded request with what travels beside it: the stream-only flag it carried and its
/// shared-memory tensors, still to be read or written.
#[derive(Debug)]
pub struct StreamRequest {
    /// The request; inputs in shared memory are missing until the frontend resolves `shm`.
    pub request: InferRequest,
    /// `triton_enable_empty_final_response`: send an empty response marked final when the model
    /// ends the request without one.
    pub empty_final_response: bool,
    /// Inputs to read from and outputs to write to client shared memory.
    pub shm: ShmPlan,
}

/// [`decode_request`] within `limits`, keeping `triton_enable_empty_final_response` and the
/// shared-memory tensors. The limits are checked first, on the declared counts and shapes, so an
/// oversized request is refused before its typed contents are converted.
pub fn decode_stream_request(
    request: ModelInferRequest,
    limits: &RequestLimits,
) -> ServiceResult<StreamRequest> {
    limits.check_counts(request.inputs.len(), request.outputs.len())?;
    for input in &request.inputs {
        limits.check_shape(&request.model_name, &input.name, &input.shape)?;
    }
    let ModelInferRequest {
        model_name,
        model_version,
        id,
        parameters,
        inputs,
        outputs,
        raw_input_contents,
    } = request;
    let model_version = types::parse_version(&model_version)?;
    let (parameters, empty_final_response) = request_parameters(parameters)?;
    let (options, parameters) = RequestOptions::split(parameters)?;

    let mut shm = ShmPlan::default();
    let mut located = Vec::with_capacity(inputs.len());
    for input in inputs {
        let at = match input.parameters.contains_key(SHM_REGION) {
            false => None,
            true => {
                let mut parameters = Parameters::new();
                for (key, value) in &input.parameters {
                    parameters.insert(key.clone(), param_from_wire(key, value.clone())?);
                }
                ShmRef::take(&mut parameters, &format!("input '{}'", input.name))?
            }
        };
        located.push((input, at));
    }
    let wire_inputs = located.iter().filter(|(_, at)| at.is_none()).count();
    if !raw_input_contents.is_empty() {
        if let Some((typed, _)) = located
            .iter()
            .find(|(i, at)| at.is_none() && i.contents.is_some())
        {
            return Err(ServiceError::invalid(format!(
                "contents field must not be specified when using raw_input_contents for '{}' for model '{model_name}'",
                typed.name
            )));
        }
        if raw_input_contents.len() != wire_inputs {
            return Err(ServiceError::invalid(format!(
                "model '{model_name}': the request has {wire_inputs} inputs not in shared memory but {} raw_input_contents entries; send one entry per such input, in input order",
                raw_input_contents.len()
            )));
        }
    }

    let mut raw = raw_input_contents.into_iter();
    let mut seen = HashSet::new();
    let mut tensors = Vec::with_capacity(located.len());
    for (position, (input, at)) in located.into_iter().enumerate() {
        if !seen.insert(input.name.clone()) {
            return Err(ServiceError::invalid(format!(
                "input '{}' already exists in request",
                input.name
            )));
        }
        match at {
            Some(at) => shm
                .inputs
                .push(shm_input(&model_name, position, input, at)?),
            None => {
                let data = raw.next();
                tensors.push(decode_input(&model_name, input, data)?);
            }
        }
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
        let mut output = decode_output(output)?;
        let owner = format!("output '{}'", output.name);
        if let Some(at) = ShmRef::take(&mut output.parameters, &owner)? {
            shm.outputs.push(ShmOutput {
                name: output.name.clone(),
                at,
            });
        }
        requested.push(output);
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
        shm,
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
        contents,
        ..
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

fn decode_output(output: InferRequestedOutputTensor) -> ServiceResult<RequestedOutput> {
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

/// An input whose bytes are in shared memory: checked like any input, its data left to the
/// frontend. Triton refuses typed contents beside a region.
fn shm_input(
    model: &str,
    position: usize,
    input: InferInputTensor,
    at: ShmRef,
) -> ServiceResult<ShmInput> {
    let InferInputTensor {
        name,
        datatype,
        shape,
        contents,
        ..
    } = input;
    if contents.is_some() {
        return Err(ServiceError::invalid(format!(
            "unexpected 'content' provided when using shared memory for input tensor '{name}' for model '{model}'"
        )));
    }
    let Some(datatype) = DataType::from_wire(&datatype) else {
        return Err(ServiceError::invalid(format!(
            "input '{name}' for model '{model}': unknown datatype '{datatype}'"
        )));
    };
    if types::element_count(&shape).is_none() {
        return Err(ServiceError::invalid(format!(
            "input '{name}' for model '{model}': shape {} is invalid; dimensions must be non-negative",
            format_shape(&shape)
        )));
    }
    Ok(ShmInput {
        position,
        name,
        datatype,
        shape,
        at,
    })
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

/// The wire form of `version` ("" = latest).
pub fn version_text(version: Option<i64>) -> String {
    version.map(|v| v.to_string()).unwrap_or_default()
}

/// Encodes a request for a server (a worker, for the router); tensor bytes are shared, not
/// copied. Custom `uint64` parameters (only HTTP JSON can carry them) become `int64` when they
/// fit: the gRPC API accepts no `uint64` custom parameters, so a larger one is refused.
pub fn encode_request(request: &InferRequest) -> ServiceResult<ModelInferRequest> {
    let mut parameters = HashMap::with_capacity(request.parameters.len() + 3);
    for (key, value) in &request.parameters {
        let value = match value {
            ParamValue::Uint(u) => ParamValue::Int(i64::try_from(*u).map_err(|_| {
                ServiceError::invalid(format!(
                    "parameter '{key}': {u} is too large; custom parameters hold signed 64-bit integers"
                ))
            })?),
            other => other.clone(),
        };
        parameters.insert(key.clone(), param_to_wire(value));
    }
    encode_options(&request.options, &mut parameters);
    let mut inputs = Vec::with_capacity(request.inputs.len());
    let mut raw = Vec::with_capacity(request.inputs.len());
    for t in &request.inputs {
        inputs.push(InferInputTensor {
            name: t.name().to_string(),
            datatype: t.datatype().as_wire().to_string(),
            shape: t.shape().to_vec(),
            parameters: HashMap::new(),
            contents: None,
        });
        raw.push(t.data().clone());
    }
    let outputs = request
        .outputs
        .iter()
        .map(|o| InferRequestedOutputTensor {
            name: o.name.clone(),
            parameters: o
                .parameters
                .iter()
                .map(|(k, v)| (k.clone(), param_to_wire(v.clone())))
                .collect(),
        })
        .collect();
    Ok(ModelInferRequest {
        model_name: request.model_name.clone(),
        model_version: version_text(request.model_version),
        id: request.id.clone(),
        parameters,
        inputs,
        outputs,
        raw_input_contents: raw,
    })
}

/// The reserved parameters that carry `o`; defaults are left out, as a client would.
fn encode_options(o: &RequestOptions, out: &mut HashMap<String, InferParameter>) {
    let mut put = |key: &str, value: ParamValue| {
        out.insert(key.to_string(), param_to_wire(value));
    };
    if o.priority != 0 {
        put("priority", ParamValue::Uint(o.priority));
    }
    if o.timeout_us != 0 {
        put("timeout", ParamValue::Uint(o.timeout_us));
    }
    if let Some(id) = &o.sequence_id {
        put(
            "sequence_id",
            match id {
                CorrelationId::Uint(v) => ParamValue::Uint(*v),
                CorrelationId::String(s) => ParamValue::String(s.clone()),
            },
        );
        put("sequence_start", ParamValue::Bool(o.sequence_start));
        put("sequence_end", ParamValue::Bool(o.sequence_end));
    }
}

#[cfg(test)]
#[path = "request_tests.rs"]
mod tests;
