//! [`InferResponse`] ⇄ `ModelInferResponse`: encoding a service's answer (the gRPC frontend),
//! decoding a worker's answer (the router's forwarder).
//!
//! ```text
//! encode_response: InferResponse.outputs[i] ──► outputs[i] (name, datatype, shape)
//!                                               + raw_output_contents[i] (the same Bytes)
//! decode_response: outputs[i] + raw_output_contents[i] ──► Tensor::new (datatype and size checked)
//! ```
//!
//! Responses always use `raw_output_contents`, as Triton's do, so output bytes go out without a
//! copy and come back as the `Bytes` prost decoded.

use std::collections::HashMap;

use super::parameters::{param_from_wire, param_to_wire};
use crate::datatype::DataType;
use crate::error::{ServiceError, ServiceResult};
use crate::pb::inference::ModelInferResponse;
use crate::pb::inference::model_infer_response::InferOutputTensor;
use crate::types::{InferResponse, Parameters, Tensor};

/// Converts the internal response; tensor bytes move into `raw_output_contents` uncopied.
pub fn encode_response(response: InferResponse) -> ModelInferResponse {
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

/// Decodes a server's answer. An answer that does not hold together (outputs and raw contents
/// that do not pair up, an unknown datatype, a size that does not fit the shape, a parameter
/// without a value) is a [`ServiceError::Internal`] naming what is wrong.
pub fn decode_response(response: ModelInferResponse) -> ServiceResult<InferResponse> {
    let ModelInferResponse {
        model_name,
        model_version,
        id,
        parameters,
        outputs,
        raw_output_contents,
    } = response;
    if outputs.len() != raw_output_contents.len() {
        return Err(ServiceError::internal(format!(
            "{} outputs but {} raw_output_contents entries",
            outputs.len(),
            raw_output_contents.len()
        )));
    }
    let mut tensors = Vec::with_capacity(outputs.len());
    for (output, data) in outputs.into_iter().zip(raw_output_contents) {
        let datatype = DataType::from_wire(&output.datatype).ok_or_else(|| {
            ServiceError::internal(format!(
                "output '{}' has unknown datatype '{}'",
                output.name, output.datatype
            ))
        })?;
        let tensor = Tensor::new(output.name, datatype, output.shape, data)
            .map_err(|e| ServiceError::internal(e.into_message()))?;
        tensors.push(tensor);
    }
    let mut params = Parameters::new();
    for (key, value) in parameters {
        let value =
            param_from_wire(&key, value).map_err(|e| ServiceError::internal(e.into_message()))?;
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

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::pb::inference::InferParameter;
    use crate::pb::inference::infer_parameter::ParameterChoice;
    use crate::types::{ParamValue, push_bytes_element};

    fn param(choice: ParameterChoice) -> InferParameter {
        InferParameter {
            parameter_choice: Some(choice),
        }
    }

    #[test]
    fn responses_carry_raw_outputs_in_order_without_copying() {
        let a = Bytes::from(vec![0u8; 8]);
        let mut s = Vec::new();
        push_bytes_element(&mut s, b"hi");
        let s = Bytes::from(s);
        let mut parameters = Parameters::new();
        parameters.insert("sequence_id".into(), ParamValue::Uint(5));
        parameters.insert("note".into(), ParamValue::String("ok".into()));
        let response = InferResponse {
            model_name: "m".into(),
            model_version: "1".into(),
            id: "abc".into(),
            parameters,
            outputs: vec![
                Tensor::new("out", DataType::Fp32, vec![1, 2], a.clone()).unwrap(),
                Tensor::new("text", DataType::Bytes, vec![1], s.clone()).unwrap(),
            ],
        };
        let wire = encode_response(response);
        assert_eq!(
            (
                wire.model_name.as_str(),
                wire.model_version.as_str(),
                wire.id.as_str()
            ),
            ("m", "1", "abc")
        );
        assert_eq!(wire.outputs.len(), 2);
        assert_eq!(
            (
                wire.outputs[0].name.as_str(),
                wire.outputs[0].datatype.as_str()
            ),
            ("out", "FP32")
        );
        assert_eq!(wire.outputs[0].shape, vec![1, 2]);
        assert_eq!(
            (
                wire.outputs[1].name.as_str(),
                wire.outputs[1].datatype.as_str()
            ),
            ("text", "BYTES")
        );
        assert!(wire.outputs.iter().all(|o| o.contents.is_none()));
        assert_eq!(wire.raw_output_contents[0].as_ptr(), a.as_ptr());
        assert_eq!(wire.raw_output_contents[1], s);
        assert_eq!(
            wire.parameters["sequence_id"],
            param(ParameterChoice::Uint64Param(5))
        );
        assert_eq!(
            wire.parameters["note"],
            param(ParameterChoice::StringParam("ok".into()))
        );
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
            outputs: vec![InferOutputTensor {
                name: "y".into(),
                datatype: "FP32".into(),
                shape: vec![1],
                ..Default::default()
            }],
            raw_output_contents: vec![Bytes::from_static(&[0, 0, 128, 63])],
        };
        let r = decode_response(good.clone()).unwrap();
        assert_eq!(r.outputs[0].datatype(), DataType::Fp32);
        assert_eq!(r.parameters["p"], ParamValue::String("v".into()));
        assert_eq!(
            r.outputs[0].data().as_ptr(),
            good.raw_output_contents[0].as_ptr()
        );
        let mut short = good.clone();
        short.raw_output_contents[0] = Bytes::from_static(&[0]);
        assert!(matches!(
            decode_response(short),
            Err(ServiceError::Internal(_))
        ));
        let mut unpaired = good.clone();
        unpaired.raw_output_contents.clear();
        assert!(matches!(
            decode_response(unpaired),
            Err(ServiceError::Internal(_))
        ));
        let mut unknown = good;
        unknown.outputs[0].datatype = "FP8".into();
        assert_eq!(
            decode_response(unknown),
            Err(ServiceError::internal(
                "output 'y' has unknown datatype 'FP8'"
            ))
        );
    }
}
