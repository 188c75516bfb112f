//! One loaded TorchScript instance: the module and what it needs to run a batch.
//!
//! ```text
//!  execute(inputs, outputs)
//!    config input ─► (reshape) ─► tch::Tensor on the instance's device
//!    arguments in forward() order (or one Dict[str, Tensor]) ─► forward, without autograd
//!    returned Tensor | Tuple | List ─► element bound to each requested output ─► Tensor
//! ```

use std::collections::HashMap;
use std::sync::Arc;

use nereid_proto::pb::inference::ModelConfig;
use nereid_proto::types::Tensor;
use tch::{CModule, Device, IValue};

use super::binding::InputBinding;
use super::convert::{from_torch, to_torch};
use super::settings::TorchSettings;
use crate::backend::shape::resolve_shape;
use crate::backend::{BackendError, BackendInstance};

pub(crate) struct TorchInstance {
    module: Arc<CModule>,
    model_name: String,
    device: Device,
    settings: TorchSettings,
    batching: bool,
    binding: InputBinding,
    /// Config `reshape.shape` per input that has one.
    input_reshape: HashMap<String, Vec<i64>>,
    /// Index in the returned tuple/list per config output.
    output_index: HashMap<String, usize>,
    /// Config `dims` per output that the config reshapes.
    output_reshape: HashMap<String, Vec<i64>>,
    /// Outputs returned when a request names none: every config output.
    default_outputs: Vec<String>,
}

impl TorchInstance {
    pub fn new(
        module: Arc<CModule>,
        device: Device,
        config: &ModelConfig,
        settings: TorchSettings,
        binding: InputBinding,
        output_indices: Vec<usize>,
    ) -> TorchInstance {
        TorchInstance {
            module,
            model_name: config.name.clone(),
            device,
            settings,
            batching: config.max_batch_size > 0,
            binding,
            input_reshape: config
                .input
                .iter()
                .filter_map(|i| Some((i.name.clone(), i.reshape.as_ref()?.shape.clone())))
                .collect(),
            output_index: config
                .output
                .iter()
                .zip(output_indices)
                .map(|(o, index)| (o.name.clone(), index))
                .collect(),
            output_reshape: config
                .output
                .iter()
                .filter(|o| o.reshape.is_some())
                .map(|o| (o.name.clone(), o.dims.clone()))
                .collect(),
            default_outputs: config.output.iter().map(|o| o.name.clone()).collect(),
        }
    }

    /// The batch size when batching (first dimension), for reshapes.
    fn batch_of(&self, shape: &[i64]) -> Option<i64> {
        if self.batching {
            shape.first().copied()
        } else {
            None
        }
    }

    fn input(&self, inputs: &[Tensor], name: &str) -> Result<tch::Tensor, BackendError> {
        let model = &self.model_name;
        let tensor = inputs.iter().find(|t| t.name() == name).ok_or_else(|| {
            BackendError::InvalidInput(format!(
                "expected input '{name}' for model '{model}', but the request does not have it"
            ))
        })?;
        let shape = match self.input_reshape.get(name) {
            None => tensor.shape().to_vec(),
            Some(target) => resolve_shape(
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
        };
        to_torch(tensor, &shape, self.device)
    }

    fn arguments(&self, inputs: &[Tensor]) -> Result<Vec<IValue>, BackendError> {
        match &self.binding {
            InputBinding::Positional(names) => names
                .iter()
                .map(|name| self.input(inputs, name).map(IValue::Tensor))
                .collect(),
            InputBinding::Dict(names) => {
                let entries = names
                    .iter()
                    .map(|name| {
                        Ok((
                            IValue::String(name.clone()),
                            IValue::Tensor(self.input(inputs, name)?),
                        ))
                    })
                    .collect::<Result<Vec<_>, BackendError>>()?;
                Ok(vec![IValue::GenericDict(entries)])
            }
        }
    }

    /// Runs forward with the model's per-execution libtorch settings, without autograd.
    fn forward(&self, arguments: &[IValue]) -> Result<IValue, BackendError> {
        let model = &self.model_name;
        let setting = |e: tch::TchError| {
            BackendError::Execution(format!("model '{model}': libtorch setting: {e}"))
        };
        // Thread-local in libtorch (the executor optimisation) or process-wide flags that
        // every execution sets for itself, as Triton's backend does.
        tch::jit::f_set_graph_executor_optimize(self.settings.optimized_execution)
            .map_err(setting)?;
        if let Some(on) = self.settings.jit_profiling {
            tch::jit::f_set_profiling_mode(on).map_err(setting)?;
        }
        if let Some(on) = self.settings.tensor_fuser {
            tch::jit::f_set_tensor_expr_fuser_enabled(on).map_err(setting)?;
        }
        let _no_grad = tch::no_grad_guard();
        self.module.forward_is(arguments).map_err(|e| {
            BackendError::Execution(format!(
                "PyTorch execute failure for model '{model}': {}",
                first_line(&e.to_string())
            ))
        })
    }
}

/// libtorch errors carry a C++ backtrace after the message; keep the message.
pub(super) fn first_line(message: &str) -> &str {
    let message = message.trim_start_matches("Internal torch error: ");
    message
        .split("\nException raised from")
        .next()
        .unwrap_or(message)
        .trim_end()
}

/// The tensors a model returned, in order: a tensor alone, or the elements of a tuple or list.
fn returned_tensors(model: &str, value: IValue) -> Result<Vec<tch::Tensor>, BackendError> {
    let not_tensor = |what: &str| {
        BackendError::Execution(format!(
            "model '{model}' returned {what}; outputs must be a tensor, or a tuple or list of tensors"
        ))
    };
    match value {
        IValue::Tensor(t) => Ok(vec![t]),
        IValue::TensorList(list) => Ok(list),
        IValue::Tuple(items) | IValue::GenericList(items) => items
            .into_iter()
            .map(|item| match item {
                IValue::Tensor(t) => Ok(t),
                _ => Err(not_tensor(
                    "a tuple or list with an element that is not a tensor",
                )),
            })
            .collect(),
        IValue::None => Err(not_tensor("None")),
        IValue::GenericDict(_) => Err(not_tensor("a dict")),
        _ => Err(not_tensor("a value that is not a tensor")),
    }
}

impl BackendInstance for TorchInstance {
    fn execute(
        &mut self,
        inputs: &[Tensor],
        outputs: &[String],
    ) -> Result<Vec<Tensor>, BackendError> {
        let model = self.model_name.clone();
        let requested: Vec<String> = if outputs.is_empty() {
            self.default_outputs.clone()
        } else {
            outputs.to_vec()
        };
        for name in &requested {
            if !self.output_index.contains_key(name) {
                return Err(BackendError::InvalidInput(format!(
                    "unexpected inference output '{name}' for model '{model}'"
                )));
            }
        }
        let arguments = self.arguments(inputs)?;
        let returned = returned_tensors(&model, self.forward(&arguments)?)?;
        let mut tensors = Vec::with_capacity(requested.len());
        for name in &requested {
            let index = self.output_index[name];
            let value = returned.get(index).ok_or_else(|| {
                BackendError::Execution(format!(
                    "model '{model}' returned {} output tensor(s), but output '{name}' is number {index} (counting from 0)",
                    returned.len()
                ))
            })?;
            let mut tensor = from_torch(name, value)?;
            if let Some(dims) = self.output_reshape.get(name) {
                let batch = self.batch_of(tensor.shape());
                if let Some(shape) = resolve_shape(tensor.element_count(), batch, dims) {
                    let (name, datatype, _, data) = tensor.into_parts();
                    tensor = Tensor::new(name, datatype, shape, data).map_err(|e| {
                        BackendError::Execution(format!("model '{model}': {}", e.message()))
                    })?;
                }
            }
            tensors.push(tensor);
        }
        Ok(tensors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backtraces_are_cut_from_libtorch_errors() {
        let e = "Internal torch error: The size of tensor a (3) must match the size of tensor b (4)\nException raised from infer_size_impl at x.cpp:1\nframe #0";
        assert_eq!(
            first_line(e),
            "The size of tensor a (3) must match the size of tensor b (4)"
        );
    }

    #[test]
    fn tuples_and_lists_of_tensors_are_outputs() {
        let t = || tch::Tensor::from_slice(&[1f32]);
        assert_eq!(returned_tensors("m", IValue::Tensor(t())).unwrap().len(), 1);
        let tuple = IValue::Tuple(vec![IValue::Tensor(t()), IValue::Tensor(t())]);
        assert_eq!(returned_tensors("m", tuple).unwrap().len(), 2);
        assert_eq!(
            returned_tensors("m", IValue::TensorList(vec![t(), t(), t()]))
                .unwrap()
                .len(),
            3
        );
        let e = returned_tensors("m", IValue::Tuple(vec![IValue::Int(1)])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "model 'm' returned a tuple or list with an element that is not a tensor; outputs must be a tensor, or a tuple or list of tensors"
        );
    }
}
