//! One loaded TorchScript instance: the module and what it needs to run a batch.
//!
//! ```text
//!  execute(inputs, outputs)      (a batch's parts joined into one Tensor per input first)
//!    config input ─► (reshape) ─► tch::Tensor on the instance's device   (BYTES ─► List[str])
//!    arguments in forward() order (or one Dict[str, Tensor]) ─► forward, without autograd
//!    returned Tensor | List[str] | Tuple | List ─► element bound to each requested output
//! ```

use std::collections::HashMap;
use std::sync::Arc;

use nereid_proto::{DataType, Tensor};
use tch::{CModule, Device, IValue};

use super::binding::InputBinding;
use super::convert::{from_strings, from_torch, to_strings, to_torch};
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
    module: Arc<CModule>,
    model_name: String,
    device: Device,
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
        module: Arc<CModule>,
        device: Device,
        config: &ValidModelConfig,
        settings: TorchSettings,
        binding: InputBinding,
        output_indices: Vec<usize>,
    ) -> TorchInstance {
        TorchInstance {
            module,
            model_name: config.name.clone(),
            device,
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

    fn input(&self, inputs: &[Tensor], name: &str) -> Result<IValue, BackendError> {
        let model = &self.model_name;
        let tensor = inputs.iter().find(|t| t.name() == name).ok_or_else(|| {
            BackendError::InvalidInput(format!(
                "expected input '{name}' for model '{model}', but the request does not have it"
            ))
        })?;
        if tensor.datatype() == DataType::Bytes {
            return to_strings(tensor).map(IValue::StringList);
        }
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
        to_torch(tensor, &shape, self.device).map(IValue::Tensor)
    }

    fn arguments(&self, inputs: &[Tensor]) -> Result<Vec<IValue>, BackendError> {
        match &self.binding {
            InputBinding::Positional(names) => {
                names.iter().map(|name| self.input(inputs, name)).collect()
            }
            InputBinding::Dict(names) => {
                let entries = names
                    .iter()
                    .map(|name| Ok((IValue::String(name.clone()), self.input(inputs, name)?)))
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

/// One value a model returned for an output.
enum Returned {
    Tensor(tch::Tensor),
    /// A `List[str]`: a `BYTES` output.
    Strings(Vec<String>),
}

/// The values a model returned, in order: a tensor or string list alone, or the elements of a
/// tuple or list.
fn returned_values(model: &str, value: IValue) -> Result<Vec<Returned>, BackendError> {
    let not_output = |what: &str| {
        BackendError::Execution(format!(
            "model '{model}' returned {what}; outputs must be a tensor or a list of strings, or a tuple or list of those"
        ))
    };
    let element = |item: IValue| match item {
        IValue::Tensor(t) => Ok(Returned::Tensor(t)),
        IValue::StringList(s) => Ok(Returned::Strings(s)),
        IValue::GenericList(items) => strings(items)
            .map(Returned::Strings)
            .ok_or_else(|| not_output("a tuple with a list element that is not a list of strings")),
        _ => Err(not_output(
            "a tuple or list with an element that is not a tensor",
        )),
    };
    match value {
        IValue::Tensor(t) => Ok(vec![Returned::Tensor(t)]),
        IValue::StringList(s) => Ok(vec![Returned::Strings(s)]),
        IValue::TensorList(list) => Ok(list.into_iter().map(Returned::Tensor).collect()),
        IValue::GenericList(items)
            if !items.is_empty() && items.iter().all(|i| matches!(i, IValue::String(_))) =>
        {
            Ok(vec![Returned::Strings(strings(items).unwrap_or_default())])
        }
        IValue::Tuple(items) | IValue::GenericList(items) => {
            items.into_iter().map(element).collect()
        }
        IValue::None => Err(not_output("None")),
        IValue::GenericDict(_) => Err(not_output("a dict")),
        _ => Err(not_output("a value that is not a tensor")),
    }
}

/// The strings of a list whose every element is a string.
fn strings(items: Vec<IValue>) -> Option<Vec<String>> {
    items
        .into_iter()
        .map(|i| match i {
            IValue::String(s) => Some(s),
            _ => None,
        })
        .collect()
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
        for name in requested {
            if !self.outputs.contains_key(name) {
                return Err(BackendError::InvalidInput(format!(
                    "unexpected inference output '{name}' for model '{model}'"
                )));
            }
        }
        let arguments = self.arguments(&inputs.joined()?)?;
        let returned = returned_values(model, self.forward(&arguments)?)?;
        let mut tensors = Vec::with_capacity(requested.len());
        for name in requested {
            let plan = &self.outputs[name];
            let index = plan.index;
            let value = returned.get(index).ok_or_else(|| {
                BackendError::Execution(format!(
                    "model '{model}' returned {} output tensor(s), but output '{name}' is number {index} (counting from 0)",
                    returned.len()
                ))
            })?;
            let value = match value {
                Returned::Tensor(t) => t,
                Returned::Strings(list) => {
                    tensors.push(from_strings(
                        name,
                        list,
                        self.string_shape(plan, list.len()),
                    )?);
                    continue;
                }
            };
            let mut tensor = from_torch(name, value)?;
            if plan.reshaped {
                let batch = self.batch_of(tensor.shape());
                if let Some(shape) = resolve_shape(tensor.element_count(), batch, &plan.dims) {
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

    fn kinds(values: Vec<Returned>) -> Vec<&'static str> {
        values
            .iter()
            .map(|v| match v {
                Returned::Tensor(_) => "tensor",
                Returned::Strings(_) => "strings",
            })
            .collect()
    }

    #[test]
    fn tuples_and_lists_of_tensors_and_strings_are_outputs() {
        let t = || tch::Tensor::from_slice(&[1f32]);
        let s = |v: &str| IValue::String(v.into());
        let got = |v| kinds(returned_values("m", v).unwrap());
        assert_eq!(got(IValue::Tensor(t())), ["tensor"]);
        assert_eq!(
            got(IValue::Tuple(vec![
                IValue::Tensor(t()),
                IValue::Tensor(t())
            ])),
            ["tensor", "tensor"]
        );
        assert_eq!(got(IValue::TensorList(vec![t(), t(), t()])), ["tensor"; 3]);
        assert_eq!(
            got(IValue::GenericList(vec![
                IValue::Tensor(t()),
                IValue::Tensor(t())
            ])),
            ["tensor", "tensor"]
        );
        assert_eq!(got(IValue::GenericList(vec![s("a"), s("b")])), ["strings"]);
        assert_eq!(
            got(IValue::Tuple(vec![
                IValue::GenericList(vec![s("a")]),
                IValue::Tensor(t())
            ])),
            ["strings", "tensor"]
        );
        let e = returned_values("m", IValue::Tuple(vec![IValue::Int(1)]))
            .err()
            .unwrap();
        assert_eq!(
            e.to_string(),
            "model 'm' returned a tuple or list with an element that is not a tensor; outputs must be a tensor or a list of strings, or a tuple or list of those"
        );
    }
}
