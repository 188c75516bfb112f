//! One loaded ONNX model instance: an ONNX Runtime session and what it needs to run requests.
//!
//! ```text
//!  execute(batch inputs, outputs)
//!    check each input's name and datatype against the model ─► reshape (config)
//!      ─► ort values (each request's bytes copied straight into the batch's buffer)
//!    Session::run with only the requested outputs
//!    ort outputs ─► one copy into Bytes ─► reshape back (config) ─► Tensor, in the requested order
//! ```

use std::collections::HashMap;

use nereid_proto::{DataType, Tensor};
use ort::session::{OutputSelector, RunOptions, Session};
use ort::value::DynValue;

use super::convert::{from_value, to_value};
use super::signature::ModelSignature;
use crate::backend::shape::resolve_shape;
use crate::backend::{BackendError, BackendInstance, BatchInput, BatchInputs};
use crate::config::ValidModelConfig;

/// How one model input is fed.
struct InputPlan {
    /// The ONNX element type, as a Triton datatype (`Err`: not servable; validation refused
    /// configs naming it, so only a request can reach it).
    datatype: Result<DataType, String>,
    /// The config's `reshape.shape`: the shape the model sees, without the batch dimension.
    reshape: Option<Vec<i64>>,
}

/// How one model output is returned.
struct OutputPlan {
    /// The config `dims` to present when the config reshapes this output.
    reshape_to: Option<Vec<i64>>,
}

pub(crate) struct OnnxInstance {
    session: Session,
    model_name: String,
    batching: bool,
    inputs: HashMap<String, InputPlan>,
    outputs: HashMap<String, OutputPlan>,
    /// Outputs returned when a request names none: the config's, else the model's.
    default_outputs: Vec<String>,
}

impl OnnxInstance {
    pub fn new(session: Session, sig: &ModelSignature, config: &ValidModelConfig) -> OnnxInstance {
        let inputs = sig
            .inputs
            .iter()
            .map(|t| {
                let reshape = config.input(&t.name).and_then(|i| i.reshape.clone());
                (
                    t.name.clone(),
                    InputPlan {
                        datatype: t.datatype.clone(),
                        reshape,
                    },
                )
            })
            .collect();
        let outputs = sig
            .outputs
            .iter()
            .map(|t| {
                let reshape_to = config
                    .output(&t.name)
                    .filter(|o| o.reshape.is_some())
                    .map(|o| o.dims.clone());
                (t.name.clone(), OutputPlan { reshape_to })
            })
            .collect();
        let default_outputs = if config.outputs.is_empty() {
            sig.outputs.iter().map(|t| t.name.clone()).collect()
        } else {
            config.outputs.iter().map(|o| o.name.clone()).collect()
        };
        OnnxInstance {
            session,
            model_name: config.name.clone(),
            batching: config.batching(),
            inputs,
            outputs,
            default_outputs,
        }
    }

    fn input_value(&self, input: &BatchInput<'_>) -> Result<(String, DynValue), BackendError> {
        let model = &self.model_name;
        let name = input.name();
        let plan = self.inputs.get(name).ok_or_else(|| {
            BackendError::InvalidInput(format!(
                "unexpected inference input '{name}' for model '{model}'"
            ))
        })?;
        let expected = plan.datatype.as_ref().map_err(|what| {
            BackendError::Unsupported(format!(
                "model '{model}' input '{name}' is {what}, which Triton cannot serve"
            ))
        })?;
        if input.datatype() != *expected {
            return Err(BackendError::InvalidInput(format!(
                "inference input '{name}' data-type is '{}', but model '{model}' expects '{expected}'",
                input.datatype()
            )));
        }
        let shape = match &plan.reshape {
            None => input.shape().to_vec(),
            Some(target) => {
                let batch = if self.batching {
                    input.shape().first().copied()
                } else {
                    None
                };
                resolve_shape(input.element_count(), batch, target).ok_or_else(|| {
                    BackendError::InvalidInput(format!(
                        "input '{name}' for model '{model}': shape {:?} cannot be reshaped to the configured {:?}",
                        input.shape(),
                        target
                    ))
                })?
            }
        };
        Ok((name.to_string(), to_value(input, shape)?))
    }
}

impl BackendInstance for OnnxInstance {
    /// Runs the session. An empty `outputs` asks for the config's outputs (all model outputs
    /// when the config lists none).
    fn execute(
        &mut self,
        inputs: &BatchInputs<'_>,
        outputs: &[String],
    ) -> Result<Vec<Tensor>, BackendError> {
        let model = self.model_name.clone();
        let values = inputs
            .iter()
            .map(|t| self.input_value(t))
            .collect::<Result<Vec<_>, _>>()?;
        let requested: Vec<String> = if outputs.is_empty() {
            self.default_outputs.clone()
        } else {
            outputs.to_vec()
        };
        let mut selector = OutputSelector::no_default();
        for name in &requested {
            if !self.outputs.contains_key(name) {
                return Err(BackendError::InvalidInput(format!(
                    "unexpected inference output '{name}' for model '{model}'"
                )));
            }
            selector = selector.with(name.clone());
        }
        let run_options = RunOptions::new()
            .map_err(|e| {
                BackendError::Execution(format!(
                    "model '{model}': cannot create ONNX Runtime run options: {e}"
                ))
            })?
            .with_outputs(selector);
        let mut results = self
            .session
            .run_with_options(values, &run_options)
            .map_err(|e| {
                BackendError::Execution(format!(
                    "onnxruntime execute failure for model '{model}': {e}"
                ))
            })?;

        let mut tensors = Vec::with_capacity(requested.len());
        for name in &requested {
            let value = results.remove(name.as_str()).ok_or_else(|| {
                BackendError::Execution(format!(
                    "model '{model}': ONNX Runtime returned no output '{name}'"
                ))
            })?;
            let (datatype, mut shape, data) = from_value(name, &value)?;
            if let Some(Some(dims)) = self.outputs.get(name).map(|p| &p.reshape_to) {
                let elements = shape.iter().product::<i64>();
                let batch = if self.batching {
                    shape.first().copied()
                } else {
                    None
                };
                if let Some(api) = usize::try_from(elements)
                    .ok()
                    .and_then(|n| resolve_shape(n, batch, dims))
                {
                    shape = api;
                }
            }
            let tensor = Tensor::new(name.clone(), datatype, shape, data).map_err(|e| {
                BackendError::Execution(format!("model '{model}' output '{name}': {}", e.message()))
            })?;
            tensors.push(tensor);
        }
        Ok(tensors)
    }
}
