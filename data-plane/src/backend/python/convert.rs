//! Translations between the server's types and the protocol's: requests to request objects,
//! tensor references to checked [`Tensor`]s, parameters, correlation ids and errors.
//! Pure functions; the I/O around them lives in [`super::link`].

use bytes::Bytes;
use nereid_proto::{
    CorrelationId, DataType, InferRequest, InferResponse, ParamValue, Parameters, RequestContext,
    RequestOptions, RequestedOutput, ServiceError, Tensor, TraceContext,
};
use serde_json::{Map, Number, Value};

use super::shm::Packer;
use crate::backend::{BackendError, RequestView, TRACE_PARAMETER};
use nereid_stub_protocol::message::{
    CorrelationValue, ErrorCode, ErrorObject, RequestObject, TensorRef,
};

/// What every request object of a model carries about the model itself.
#[derive(Clone, Debug)]
pub struct ModelInfo {
    pub name: String,
    pub version: i64,
    pub decoupled: bool,
}

/// A request as the stub receives it; its tensors are placed in `packer`.
pub fn request_object<'a>(
    view: &RequestView<'a>,
    model: &ModelInfo,
    packer: &mut Packer<'a>,
) -> RequestObject {
    let mut parameters = parameters_to_json(view.parameters);
    let trace = match parameters.remove(TRACE_PARAMETER) {
        Some(Value::String(traceparent)) => Some(traceparent),
        _ => None,
    };
    RequestObject {
        request_id: view.id.to_string(),
        correlation_id: correlation_value(view.correlation_id),
        flags: view.flags,
        parameters,
        inputs: view.inputs.iter().map(|t| tensor_ref(t, packer)).collect(),
        requested_output_names: view.outputs.to_vec(),
        key: Some(view.key),
        model_name: model.name.clone(),
        model_version: model.version,
        timeout_us: 0,
        trace,
    }
}

/// Places `tensor`'s bytes in `packer` and describes where.
pub fn tensor_ref<'a>(tensor: &'a Tensor, packer: &mut Packer<'a>) -> TensorRef {
    TensorRef {
        name: tensor.name().to_string(),
        datatype: tensor.datatype().as_wire().to_string(),
        shape: tensor.shape().to_vec(),
        offset: packer.add(tensor.data()),
        nbytes: tensor.data().len() as u64,
    }
}

/// Builds checked tensors from references and the bytes read for them (same order).
pub fn tensors_from_refs(refs: &[TensorRef], data: Vec<Bytes>) -> Result<Vec<Tensor>, String> {
    refs.iter()
        .zip(data)
        .map(|(r, bytes)| {
            let datatype = DataType::from_wire(&r.datatype).ok_or_else(|| {
                format!("tensor '{}' has unknown datatype '{}'", r.name, r.datatype)
            })?;
            Tensor::new(r.name.as_str(), datatype, r.shape.clone(), bytes)
                .map_err(ServiceError::into_message)
        })
        .collect()
}

/// The tensors named in `requested`, in that order. Every output of the model is what
/// `requested` holds when the client named none, so a missing one is the model's fault.
pub fn select_outputs(
    mut produced: Vec<Tensor>,
    requested: &[String],
    model: &str,
) -> Result<Vec<Tensor>, BackendError> {
    if requested.is_empty() {
        return Ok(produced);
    }
    requested
        .iter()
        .map(|name| {
            let at = produced
                .iter()
                .position(|t| t.name() == name)
                .ok_or_else(|| {
                    BackendError::Execution(format!(
                        "model '{model}' did not produce the requested output '{name}'"
                    ))
                })?;
            Ok(produced.swap_remove(at))
        })
        .collect()
}

pub fn correlation_value(id: Option<&CorrelationId>) -> CorrelationValue {
    match id {
        Some(CorrelationId::Uint(v)) => CorrelationValue::Int(*v),
        Some(CorrelationId::String(s)) => CorrelationValue::Str(s.clone()),
        None => CorrelationValue::Int(0),
    }
}

/// Request parameters as JSON (what `request.parameters()` returns).
pub fn parameters_to_json(parameters: &Parameters) -> Map<String, Value> {
    parameters
        .iter()
        .map(|(k, v)| {
            let value = match v {
                ParamValue::Bool(b) => Value::Bool(*b),
                ParamValue::Int(i) => Value::from(*i),
                ParamValue::Uint(u) => Value::from(*u),
                ParamValue::Double(d) => Number::from_f64(*d).map_or(Value::Null, Value::Number),
                ParamValue::String(s) => Value::String(s.clone()),
            };
            (k.clone(), value)
        })
        .collect()
}

/// Parameters from JSON: booleans, numbers and strings only.
pub fn parameters_from_json(json: Map<String, Value>) -> Result<Parameters, String> {
    json.into_iter()
        .map(|(k, v)| {
            let value = match v {
                Value::Bool(b) => ParamValue::Bool(b),
                Value::String(s) => ParamValue::String(s),
                Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
                    (Some(i), _, _) => ParamValue::Int(i),
                    (None, Some(u), _) => ParamValue::Uint(u),
                    (None, None, Some(d)) => ParamValue::Double(d),
                    _ => return Err(format!("parameter '{k}' is not a representable number")),
                },
                other => {
                    return Err(format!(
                        "parameter '{k}' must be a bool, a number or a string, got {other}"
                    ));
                }
            };
            Ok((k, value))
        })
        .collect()
}

/// A BLS request from the stub as the server's request type, with its input tensors.
pub fn bls_request(request: RequestObject, inputs: Vec<Tensor>) -> Result<InferRequest, String> {
    let model_version = match request.model_version {
        -1 => None,
        v if v >= 0 => Some(v),
        v => {
            return Err(format!(
                "model_version must be -1 (latest) or a version, got {v}"
            ));
        }
    };
    let parameters = parameters_from_json(request.parameters)?;
    let (mut options, parameters) =
        RequestOptions::split(parameters).map_err(ServiceError::into_message)?;
    if request.timeout_us > 0 {
        options.timeout_us = request.timeout_us;
    }
    match request.correlation_id {
        CorrelationValue::Int(0) => {}
        CorrelationValue::Str(s) if s.is_empty() => {}
        CorrelationValue::Int(v) => options.sequence_id = Some(CorrelationId::Uint(v)),
        CorrelationValue::Str(s) => options.sequence_id = Some(CorrelationId::String(s)),
    }
    options.sequence_start |= request.flags & 1 != 0;
    options.sequence_end |= request.flags & 2 != 0;
    // A call made with `trace=request.trace()` is a child of the calling request's trace.
    let context = RequestContext {
        trace: request
            .trace
            .as_deref()
            .and_then(|t| TraceContext::parse(t, None)),
        ..Default::default()
    };
    Ok(InferRequest {
        model_name: request.model_name,
        model_version,
        id: request.request_id,
        options,
        parameters,
        inputs,
        outputs: request
            .requested_output_names
            .into_iter()
            .map(|name| RequestedOutput {
                name,
                parameters: Parameters::new(),
            })
            .collect(),
        context,
    })
}

/// The response parameters a Python model set (`InferenceResponse(..., parameters=...)`), as
/// the server's; a value they cannot hold is the model's error.
pub fn response_parameters_from_json(
    json: Map<String, Value>,
    model: &str,
) -> Result<Parameters, BackendError> {
    parameters_from_json(json).map_err(|e| {
        BackendError::Execution(format!(
            "model '{model}' returned invalid response parameters: {e}"
        ))
    })
}

/// The response's parameters as JSON, for a BLS response.
pub fn response_parameters(response: &InferResponse) -> Map<String, Value> {
    parameters_to_json(&response.parameters)
}

/// A stub error object as the backend's error, classified by its code.
pub fn backend_error(error: ErrorObject) -> BackendError {
    match error.code {
        ErrorCode::InvalidArg => BackendError::InvalidInput(error.message),
        ErrorCode::Unsupported => BackendError::Unsupported(error.message),
        ErrorCode::Unknown
        | ErrorCode::Internal
        | ErrorCode::NotFound
        | ErrorCode::Unavailable
        | ErrorCode::AlreadyExists
        | ErrorCode::Cancelled => BackendError::Execution(error.message),
    }
}

/// A failed BLS call as the error object `InferenceRequest.exec()` raises with.
pub fn service_error_object(error: ServiceError) -> ErrorObject {
    let code = match &error {
        ServiceError::InvalidArgument(_) => ErrorCode::InvalidArg,
        ServiceError::NotFound(_) => ErrorCode::NotFound,
        ServiceError::Unavailable(_)
        | ServiceError::Overloaded(_)
        | ServiceError::DeadlineExceeded(_) => ErrorCode::Unavailable,
        ServiceError::Unsupported(_) => ErrorCode::Unsupported,
        ServiceError::AlreadyExists(_) => ErrorCode::AlreadyExists,
        ServiceError::Cancelled(_) => ErrorCode::Cancelled,
        // pb_utils has no authentication codes; a BLS call never carries a credential.
        ServiceError::Unauthenticated(_)
        | ServiceError::PermissionDenied(_)
        | ServiceError::Internal(_) => ErrorCode::Internal,
    };
    ErrorObject::new(code, error.into_message())
}

#[cfg(test)]
mod tests {
    use super::*;
    use nereid_proto::push_bytes_element;
    use nereid_proto::testing::fp32_tensor as fp32;
    use serde_json::json;

    #[test]
    fn request_objects_place_tensors_and_carry_the_request() {
        let inputs = vec![fp32("A", &[1.0, 2.0]), fp32("B", &[3.0])];
        let outputs = vec!["OUT".to_string()];
        let mut parameters = Parameters::new();
        parameters.insert("p".into(), ParamValue::Int(3));
        let seq = CorrelationId::String("s1".into());
        let view = RequestView {
            key: 42,
            id: "req",
            inputs: &inputs,
            outputs: &outputs,
            parameters: &parameters,
            correlation_id: Some(&seq),
            flags: 1,
            stream: None,
        };
        let model = ModelInfo {
            name: "m".into(),
            version: 2,
            decoupled: false,
        };
        let mut packer = Packer::default();
        let object = request_object(&view, &model, &mut packer);
        assert_eq!(
            serde_json::to_value(&object).unwrap(),
            json!({"request_id": "req", "correlation_id": "s1", "flags": 1, "parameters": {"p": 3},
                   "inputs": [{"name": "A", "datatype": "FP32", "shape": [2], "offset": 0, "nbytes": 8},
                              {"name": "B", "datatype": "FP32", "shape": [1], "offset": 64, "nbytes": 4}],
                   "requested_output_names": ["OUT"], "key": 42, "model_name": "m",
                   "model_version": 2, "timeout_us": 0})
        );
        assert_eq!(packer.len(), 68);
    }

    #[test]
    fn tensors_are_checked_and_bytes_kept_as_is() {
        let mut data = Vec::new();
        push_bytes_element(&mut data, b"hi");
        let refs = vec![TensorRef {
            name: "S".into(),
            datatype: "BYTES".into(),
            shape: vec![1],
            offset: 0,
            nbytes: data.len() as u64,
        }];
        let t = tensors_from_refs(&refs, vec![Bytes::from(data.clone())]).unwrap();
        assert_eq!(t[0].data().as_ref(), data.as_slice());
        let bad = TensorRef {
            datatype: "FP32".into(),
            shape: vec![2],
            ..refs[0].clone()
        };
        let err = tensors_from_refs(&[bad], vec![Bytes::from(vec![0u8; 4])]).unwrap_err();
        assert!(err.contains("needs 8 bytes, got 4"), "{err}");
        let odd = TensorRef {
            datatype: "FP8".into(),
            ..refs[0].clone()
        };
        assert!(
            tensors_from_refs(&[odd], vec![Bytes::new()])
                .unwrap_err()
                .contains("'FP8'")
        );
    }

    #[test]
    fn outputs_are_selected_in_request_order() {
        let produced = vec![fp32("X", &[1.0]), fp32("Y", &[2.0]), fp32("Z", &[3.0])];
        let got = select_outputs(produced.clone(), &["Z".into(), "X".into()], "m").unwrap();
        let names: Vec<&str> = got.iter().map(Tensor::name).collect();
        assert_eq!(names, vec!["Z", "X"]);
        let err = select_outputs(produced, &["W".into()], "m").unwrap_err();
        assert_eq!(
            err,
            BackendError::Execution("model 'm' did not produce the requested output 'W'".into())
        );
    }

    #[test]
    fn bls_requests_become_infer_requests() {
        let object: RequestObject = serde_json::from_value(json!({
            "model_name": "add", "model_version": 3, "request_id": "r", "correlation_id": 9,
            "flags": 3, "timeout_us": 500, "parameters": {"k": "v", "n": 1.5},
            "requested_output_names": ["OUT"]
        }))
        .unwrap();
        let request = bls_request(object, vec![]).unwrap();
        assert_eq!(request.model_version, Some(3));
        assert_eq!(request.options.sequence_id, Some(CorrelationId::Uint(9)));
        assert!(request.options.sequence_start && request.options.sequence_end);
        assert_eq!(request.options.timeout_us, 500);
        assert_eq!(request.parameters.get("n"), Some(&ParamValue::Double(1.5)));
        assert_eq!(request.outputs[0].name, "OUT");

        let latest: RequestObject = serde_json::from_value(json!({"model_name": "add"})).unwrap();
        let request = bls_request(latest, vec![]).unwrap();
        assert_eq!(
            (request.model_version, request.options.sequence_id),
            (None, None)
        );

        let bad: RequestObject =
            serde_json::from_value(json!({"model_name": "a", "parameters": {"x": [1]}})).unwrap();
        assert!(
            bls_request(bad, vec![])
                .unwrap_err()
                .contains("parameter 'x'")
        );
    }

    #[test]
    fn errors_keep_their_class_both_ways() {
        assert_eq!(
            backend_error(ErrorObject::new(ErrorCode::InvalidArg, "bad")),
            BackendError::InvalidInput("bad".into())
        );
        assert_eq!(
            backend_error(ErrorObject::new(ErrorCode::Unknown, "x")),
            BackendError::Execution("x".into())
        );
        let object = service_error_object(ServiceError::not_found("no model 'x'"));
        assert_eq!(
            (object.code, object.message.as_str()),
            (ErrorCode::NotFound, "no model 'x'")
        );
        assert_eq!(
            service_error_object(ServiceError::Overloaded("full".into())).code,
            ErrorCode::Unavailable
        );
    }
}
