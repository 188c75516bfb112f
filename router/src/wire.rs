//! Client-side conversions: the internal request ─► `ModelInferRequest`, `ModelInferResponse`
//! ─► the internal response, and a worker's `tonic::Status` ─► [`ServiceError`]. The mirror
//! image of the server side in `nereid_proto::grpc`.
//!
//! ```text
//! InferRequest.context  ──► WorkerRequest.context (sent as metadata by `forward`)
//! InferRequest.options  ──► reserved parameters (sequence_id, sequence_start/end, priority, timeout)
//! InferRequest.inputs[i] ─► inputs[i] (name, datatype, shape) + raw_input_contents[i]
//!                           (the same `Bytes`, shared, not copied)
//! ModelInferResponse.outputs[i] + raw_output_contents[i] ─► Tensor::new (checked)
//! ```

use std::collections::HashMap;

use nereid_proto::DataType;
use nereid_proto::ServiceError;
use nereid_proto::pb::inference::infer_parameter::ParameterChoice;
use nereid_proto::pb::inference::model_infer_request::{
    InferInputTensor, InferRequestedOutputTensor,
};
use nereid_proto::pb::inference::{InferParameter, ModelInferRequest, ModelInferResponse};
use nereid_proto::types::{
    CorrelationId, InferRequest, InferResponse, ParamValue, Parameters, RequestContext,
    RequestOptions, Tensor,
};
use tonic::Code;

use crate::error::{RouterError, RouterResult};

/// The wire form of `version` ("" = latest).
pub fn version_text(version: Option<i64>) -> String {
    version.map(|v| v.to_string()).unwrap_or_default()
}

/// An infer request in the form a worker gets it: the message, and the context that travels
/// beside it as metadata (`traceparent`, `tracestate`, `grpc-timeout`; see `forward`).
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerRequest {
    pub message: ModelInferRequest,
    pub context: RequestContext,
}

/// Encodes a request for a worker. Custom `uint64` parameters (only HTTP JSON can carry them)
/// become `int64` when they fit: the gRPC API accepts no `uint64` custom parameters.
pub fn encode_request(request: &InferRequest) -> RouterResult<WorkerRequest> {
    Ok(WorkerRequest {
        message: encode_message(request)?,
        context: request.context.clone(),
    })
}

fn encode_message(request: &InferRequest) -> RouterResult<ModelInferRequest> {
    let mut parameters = HashMap::with_capacity(request.parameters.len() + 3);
    for (key, value) in &request.parameters {
        let value = match value {
            ParamValue::Uint(u) => ParamValue::Int(i64::try_from(*u).map_err(|_| {
                RouterError::InvalidRequest(format!(
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

fn param_from_wire(param: InferParameter) -> Option<ParamValue> {
    Some(match param.parameter_choice? {
        ParameterChoice::BoolParam(v) => ParamValue::Bool(v),
        ParameterChoice::Int64Param(v) => ParamValue::Int(v),
        ParameterChoice::Uint64Param(v) => ParamValue::Uint(v),
        ParameterChoice::DoubleParam(v) => ParamValue::Double(v),
        ParameterChoice::StringParam(v) => ParamValue::String(v),
    })
}

/// Decodes a worker's answer; tensor bytes stay the `Bytes` prost decoded.
pub fn decode_response(addr: &str, response: ModelInferResponse) -> RouterResult<InferResponse> {
    let bad = |message: String| RouterError::BadResponse {
        addr: addr.to_string(),
        message,
    };
    let ModelInferResponse {
        model_name,
        model_version,
        id,
        parameters,
        outputs,
        raw_output_contents,
    } = response;
    if outputs.len() != raw_output_contents.len() {
        return Err(bad(format!(
            "{} outputs but {} raw_output_contents entries",
            outputs.len(),
            raw_output_contents.len()
        )));
    }
    let mut tensors = Vec::with_capacity(outputs.len());
    for (output, data) in outputs.into_iter().zip(raw_output_contents) {
        let datatype = DataType::from_wire(&output.datatype).ok_or_else(|| {
            bad(format!(
                "output '{}' has unknown datatype '{}'",
                output.name, output.datatype
            ))
        })?;
        let tensor = Tensor::new(output.name, datatype, output.shape, data)
            .map_err(|e| bad(e.into_message()))?;
        tensors.push(tensor);
    }
    let mut params = Parameters::new();
    for (key, value) in parameters {
        let value =
            param_from_wire(value).ok_or_else(|| bad(format!("parameter '{key}' has no value")))?;
        params.insert(key, value);
    }
    Ok(InferResponse {
        model_name,
        model_version,
        id,
        parameters: params,
        outputs: tensors,
    })
}

/// Classifies a failed call to a worker: its own answers keep the worker's class and message;
/// a call that never reached a worker (or lost it) is [`RouterError::Unreachable`].
pub fn classify_status(addr: &str, status: tonic::Status) -> RouterError {
    let worker = |error: ServiceError| RouterError::Worker {
        addr: addr.to_string(),
        error,
    };
    let message = status.message().to_string();
    // A status tonic made itself (no connection, connection lost) carries the transport error
    // as its source; a worker's answer never does.
    if std::error::Error::source(&status).is_some() {
        return RouterError::Unreachable {
            addr: addr.to_string(),
            message,
        };
    }
    worker(service_error(status.code(), message))
}

/// The frontends' error class for a gRPC status code (a worker's or the control plane's).
pub fn service_error(code: Code, message: String) -> ServiceError {
    match code {
        Code::InvalidArgument | Code::OutOfRange | Code::FailedPrecondition => {
            ServiceError::InvalidArgument(message)
        }
        Code::NotFound => ServiceError::NotFound(message),
        Code::Unavailable => ServiceError::Unavailable(message),
        Code::ResourceExhausted => ServiceError::Overloaded(message),
        Code::Unimplemented => ServiceError::Unsupported(message),
        Code::AlreadyExists => ServiceError::AlreadyExists(message),
        Code::Cancelled => ServiceError::Cancelled(message),
        Code::DeadlineExceeded => ServiceError::DeadlineExceeded(message),
        Code::Aborted => ServiceError::Unavailable(message),
        Code::Ok
        | Code::Unknown
        | Code::Internal
        | Code::DataLoss
        | Code::PermissionDenied
        | Code::Unauthenticated => ServiceError::Internal(message),
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use nereid_proto::types::RequestedOutput;

    use super::*;

    fn request() -> InferRequest {
        let data = Bytes::from(vec![1u8, 0, 0, 0, 2, 0, 0, 0]);
        let mut parameters = Parameters::new();
        parameters.insert("custom".into(), ParamValue::Uint(7));
        InferRequest {
            model_name: "m".into(),
            model_version: Some(3),
            id: "r1".into(),
            options: RequestOptions {
                priority: 1,
                timeout_us: 0,
                sequence_id: Some(CorrelationId::String("s".into())),
                sequence_start: true,
                sequence_end: false,
            },
            parameters,
            inputs: vec![Tensor::new("x", DataType::Int32, vec![2], data).unwrap()],
            outputs: vec![RequestedOutput {
                name: "y".into(),
                parameters: Parameters::new(),
            }],
            ..Default::default()
        }
    }

    #[test]
    fn requests_encode_options_and_share_tensor_bytes() {
        let r = request();
        let wire = encode_request(&r).unwrap().message;
        assert_eq!(wire.model_version, "3");
        assert_eq!(wire.inputs[0].datatype, "INT32");
        assert_eq!(
            wire.raw_input_contents[0].as_ptr(),
            r.inputs[0].data().as_ptr()
        );
        let p = |k: &str| wire.parameters[k].parameter_choice.clone().unwrap();
        assert_eq!(p("custom"), ParameterChoice::Int64Param(7));
        assert_eq!(p("priority"), ParameterChoice::Uint64Param(1));
        assert_eq!(p("sequence_id"), ParameterChoice::StringParam("s".into()));
        assert_eq!(p("sequence_start"), ParameterChoice::BoolParam(true));
        assert!(!wire.parameters.contains_key("timeout"));
        assert_eq!(wire.outputs[0].name, "y");
    }

    #[test]
    fn the_context_travels_beside_the_message() {
        let mut r = request();
        r.context.deadline = Some(std::time::Instant::now());
        assert_eq!(encode_request(&r).unwrap().context, r.context);
    }

    #[test]
    fn oversized_custom_uint_is_refused() {
        let mut r = request();
        r.parameters
            .insert("big".into(), ParamValue::Uint(u64::MAX));
        let err = encode_request(&r).unwrap_err();
        assert!(matches!(err, RouterError::InvalidRequest(_)));
    }

    #[test]
    fn responses_decode_and_are_checked() {
        let good = ModelInferResponse {
            model_name: "m".into(),
            model_version: "3".into(),
            id: "r1".into(),
            parameters: [(
                "p".to_string(),
                param_to_wire(ParamValue::String("v".into())),
            )]
            .into(),
            outputs: vec![
                nereid_proto::pb::inference::model_infer_response::InferOutputTensor {
                    name: "y".into(),
                    datatype: "FP32".into(),
                    shape: vec![1],
                    ..Default::default()
                },
            ],
            raw_output_contents: vec![Bytes::from_static(&[0, 0, 128, 63])],
        };
        let r = decode_response("w", good.clone()).unwrap();
        assert_eq!(r.outputs[0].datatype(), DataType::Fp32);
        assert_eq!(r.parameters["p"], ParamValue::String("v".into()));
        let mut short = good;
        short.raw_output_contents[0] = Bytes::from_static(&[0]);
        assert!(matches!(
            decode_response("w", short),
            Err(RouterError::BadResponse { .. })
        ));
    }

    #[test]
    fn worker_statuses_keep_their_class() {
        let e = classify_status("w", tonic::Status::invalid_argument("bad input"));
        assert_eq!(
            e,
            RouterError::Worker {
                addr: "w".into(),
                error: ServiceError::InvalidArgument("bad input".into())
            }
        );
        assert!(classify_status("w", tonic::Status::unavailable("queue full")).retryable());
        assert!(!classify_status("w", tonic::Status::internal("boom")).retryable());
        let late = classify_status("w", tonic::Status::deadline_exceeded("too late"));
        assert!(!late.retryable());
        assert_eq!(
            ServiceError::from(late),
            ServiceError::DeadlineExceeded("too late".into())
        );
    }
}
