//! One loaded TorchScript instance: the library's module and what the config says about
//! running it.
//!
//! ```text
//!  execute(inputs, outputs)      (a batch's parts joined into one Tensor per input first)
//!    config input ─► (reshape) ─► lent to the library in place, in forward() order (or by name
//!    for one Dict[str, Tensor]) ─► library: forward, without autograd
//!    each requested output ─► its index in what forward returns ─► the library copies it into
//!    a buffer of ours ─► Tensor (BYTES reshaped to the config dims)
//! ```

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use nereid_proto::{DataType, Tensor};
use nereid_torch_abi::Status;

use super::binding::InputBinding;
use super::elements::{datatype, element_type};
use super::library::{ExecInput, ExecOptions, Produced, TorchModule};
use super::settings::TorchSettings;
use crate::backend::shape::resolve_shape;
use crate::backend::{BackendError, BackendInstance, BatchInputs};
use crate::config::ValidModelConfig;

/// How one config output is returned.
struct OutputPlan {
    /// Index in the returned tuple/list.
    index: usize,
    /// The config `dims`.
    dims: Vec<i64>,
    /// The config reshapes it: a tensor is presented as `[batch] + dims`.
    reshaped: bool,
}

pub(crate) struct TorchInstance {
    module: Arc<TorchModule>,
    model_name: String,
    settings: TorchSettings,
    batching: bool,
    binding: InputBinding,
    /// Config `reshape.shape` per input that has one.
    input_reshape: HashMap<String, Vec<i64>>,
    outputs: HashMap<String, OutputPlan>,
    /// Outputs returned when a request names none: every config output.
    default_outputs: Vec<String>,
}

impl TorchInstance {
    pub fn new(
        module: Arc<TorchModule>,
        config: &ValidModelConfig,
        settings: TorchSettings,
        binding: InputBinding,
        output_indices: Vec<usize>,
    ) -> TorchInstance {
        TorchInstance {
            module,
            model_name: config.name.clone(),
            settings,
            batching: config.batching(),
            binding,
            input_reshape: config
                .inputs
                .iter()
                .filter_map(|i| Some((i.name.clone(), i.reshape.clone()?)))
                .collect(),
            outputs: config
                .outputs
                .iter()
                .zip(output_indices)
                .map(|(o, index)| {
                    let plan = OutputPlan {
                        index,
                        dims: o.dims.clone(),
                        reshaped: o.reshape.is_some(),
                    };
                    (o.name.clone(), plan)
                })
                .collect(),
            default_outputs: config.outputs.iter().map(|o| o.name.clone()).collect(),
        }
    }

    /// The shape of a returned list of `n` strings: the config `dims` (after the batch
    /// dimension when batching) with one `-1` taking what is left, else `[n]`.
    fn string_shape(&self, plan: &OutputPlan, n: usize) -> Vec<i64> {
        let batch = self.batching.then_some(-1);
        let target: Vec<i64> = batch.into_iter().chain(plan.dims.iter().copied()).collect();
        resolve_shape(n, None, &target).unwrap_or_else(|| vec![n as i64])
    }

    /// The batch size when batching (first dimension), for reshapes.
    fn batch_of(&self, shape: &[i64]) -> Option<i64> {
        if self.batching {
            shape.first().copied()
        } else {
            None
        }
    }

    /// The input named `name` and the shape it goes to libtorch with (its config reshape).
    fn input<'t>(
        &self,
        inputs: &'t [Tensor],
        name: &str,
    ) -> Result<(&'t Tensor, Vec<i64>), BackendError> {
        let model = &self.model_name;
        let tensor = inputs.iter().find(|t| t.name() == name).ok_or_else(|| {
            BackendError::InvalidInput(format!(
                "expected input '{name}' for model '{model}', but the request does not have it"
            ))
        })?;
        let shape = match self.input_reshape.get(name) {
            Some(target) if tensor.datatype() != DataType::Bytes => resolve_shape(
                tensor.element_count(),
                self.batch_of(tensor.shape()),
                target,
            )
            .ok_or_else(|| {
                BackendError::InvalidInput(format!(
                    "input '{name}' for model '{model}': shape {:?} cannot be reshaped to the configured {target:?}",
                    tensor.shape()
                ))
            })?,
            _ => tensor.shape().to_vec(),
        };
        Ok((tensor, shape))
    }

    /// The model's outputs as tensors: the library's buffers, shaped as the config says.
    fn output(&self, name: &str, produced: Produced) -> Result<Tensor, BackendError> {
        let model = &self.model_name;
        let plan = &self.outputs[name];
        let Produced {
            element,
            mut shape,
            data,
        } = produced;
        let datatype = datatype(element);
        if datatype == DataType::Bytes {
            shape = self.string_shape(plan, shape.first().copied().unwrap_or(0) as usize);
        } else if plan.reshaped {
            let elements = shape.iter().product::<i64>().max(0) as usize;
            if let Some(reshaped) = resolve_shape(elements, self.batch_of(&shape), &plan.dims) {
                shape = reshaped;
            }
        }
        Tensor::new(name, datatype, shape, Bytes::from(data))
            .map_err(|e| BackendError::Execution(format!("model '{model}': {}", e.message())))
    }
}

/// The library's class of a failure, as the backend's.
fn classify((status, message): (Status, String)) -> BackendError {
    match status {
        Status::InvalidInput => BackendError::InvalidInput(message),
        Status::Unsupported => BackendError::Unsupported(message),
        Status::Ok | Status::Execution | Status::Load => BackendError::Execution(message),
    }
}

impl BackendInstance for TorchInstance {
    fn execute(
        &mut self,
        inputs: &BatchInputs<'_>,
        outputs: &[String],
    ) -> Result<Vec<Tensor>, BackendError> {
        let model = &self.model_name;
        let requested = if outputs.is_empty() {
            &self.default_outputs
        } else {
            outputs
        };
        let mut wanted = Vec::with_capacity(requested.len());
        for name in requested {
            let plan = self.outputs.get(name).ok_or_else(|| {
                BackendError::InvalidInput(format!(
                    "unexpected inference output '{name}' for model '{model}'"
                ))
            })?;
            wanted.push((name.as_str(), plan.index));
        }
        let joined = inputs.joined()?;
        let (names, dict_inputs) = match &self.binding {
            InputBinding::Positional(names) => (names, false),
            InputBinding::Dict(names) => (names, true),
        };
        let bound = names
            .iter()
            .map(|name| self.input(&joined, name))
            .collect::<Result<Vec<_>, _>>()?;
        let mut lent = Vec::with_capacity(bound.len());
        for (tensor, shape) in &bound {
            let element = element_type(tensor.datatype()).ok_or_else(|| {
                BackendError::Unsupported(format!(
                    "input '{}': datatype {} has no libtorch equivalent",
                    tensor.name(),
                    tensor.datatype()
                ))
            })?;
            lent.push(ExecInput {
                name: tensor.name(),
                element,
                shape,
                data: tensor.data(),
            });
        }
        let options = ExecOptions {
            model,
            optimized_execution: self.settings.optimized_execution,
            jit_profiling: self.settings.jit_profiling,
            tensor_fuser: self.settings.tensor_fuser,
            dict_inputs,
        };
        let produced = self
            .module
            .execute(&lent, &wanted, &options)
            .map_err(classify)?;
        wanted
            .iter()
            .zip(produced)
            .map(|(&(name, _), produced)| self.output(name, produced))
            .collect()
    }
}
