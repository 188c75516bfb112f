//! A raw binary infer request (`Inference-Header-Content-Length: 0`) → [`InferRequest`].
//!
//! There is no JSON: the whole body is the model's only input, and its name, datatype and shape
//! come from the model's configuration, the way Triton's core deduces them.

use std::collections::HashMap;

use bytes::Bytes;

use super::infer_request::{DecodedRequest, OutputFormat};
use nereid_proto::pb::inference::ModelConfig;
use nereid_proto::{
    DataType, InferRequest, ServiceError, ServiceResult, Tensor, push_bytes_element,
};

/// Decodes a raw binary request (`Inference-Header-Content-Length: 0`): the whole body is the
/// model's only input. The shape comes from the config: batch dimension 1 for a batching model,
/// and at most one variable dimension, inferred from the byte size. A `BYTES` input must be a
/// single element (config dims `[1]`); the body is that element. Every output returns binary.
pub fn decode_raw(
    model: &str,
    version: Option<i64>,
    body: Bytes,
    config: &ModelConfig,
) -> ServiceResult<DecodedRequest> {
    let [input] = config.input.as_slice() else {
        return Err(ServiceError::invalid(format!(
            "a raw binary request (Inference-Header-Content-Length: 0) needs a model with exactly 1 input, but model '{model}' has {}",
            config.input.len()
        )));
    };
    let name = &input.name;
    let datatype = DataType::from_config_i32(input.data_type).ok_or_else(|| {
        ServiceError::internal(format!(
            "model '{model}': input '{name}' has no valid datatype"
        ))
    })?;
    let mut shape = Vec::with_capacity(input.dims.len() + 1);
    if config.max_batch_size > 0 {
        shape.push(1);
    }
    let mut variable = None;
    let mut fixed = 1usize;
    for &dim in &input.dims {
        if dim < 0 {
            if variable.is_some() {
                return Err(ServiceError::invalid(format!(
                    "The shape of the raw input '{name}' can not be deduced because there are more than one variable-sized dimension"
                )));
            }
            variable = Some(shape.len());
        } else {
            fixed = fixed.saturating_mul(usize::try_from(dim).unwrap_or(usize::MAX));
        }
        shape.push(dim);
    }
    let data = match datatype.element_size() {
        None => {
            if variable.is_some() || fixed != 1 || u32::try_from(body.len()).is_err() {
                return Err(ServiceError::invalid(format!(
                    "For BYTE datatype raw input '{name}', the model must have input shape [1]"
                )));
            }
            let mut element = Vec::with_capacity(body.len() + 4);
            push_bytes_element(&mut element, &body);
            Bytes::from(element)
        }
        Some(size) => {
            if let Some(axis) = variable {
                let per_row = fixed.saturating_mul(size);
                shape[axis] = body.len().checked_div(per_row).unwrap_or(0) as i64;
            }
            body
        }
    };
    let request = InferRequest {
        model_name: model.to_string(),
        model_version: version,
        inputs: vec![Tensor::new(name.clone(), datatype, shape, data)?],
        ..InferRequest::default()
    };
    let format = OutputFormat {
        default_binary: true,
        per_output: HashMap::new(),
    };
    Ok(DecodedRequest {
        request,
        format,
        shm: Default::default(),
    })
}
