//! One loaded TorchScript module and one execution of it.
//!
//! ```text
//!  load(path, device) ─► CModule::load_on_device ─► eval ─► LoadedModule
//!  execute(inputs, outputs, options, sink)
//!    input (borrowed bytes) ─► tch::Tensor on the module's device   (BYTES ─► List[str])
//!    arguments in the given order (or one Dict[str, Tensor]) ─► forward, without autograd
//!    returned Tensor | List[str] | Tuple | List ─► element `index` of each requested output
//!      ─► copied into the server's buffer for that output (convert::write_*)
//! ```
//! What the server decided from the config (binding order, reshapes, which outputs) arrives
//! ready; this side only speaks libtorch.

use std::path::Path;

use nereid_torch_abi::{ElementType, Status};
use tch::{CModule, Device, IValue};

use crate::Fail;
use crate::convert::{OutputSink, to_strings, to_torch, write_strings, write_tensor};

/// A module in eval mode on its device.
pub(crate) struct LoadedModule {
    module: CModule,
    device: Device,
}

/// One input, borrowed from the server for the call.
pub(crate) struct Input<'a> {
    pub name: &'a str,
    pub dtype: ElementType,
    pub shape: &'a [i64],
    pub data: &'a [u8],
}

/// One requested output: its position in what forward returns.
pub(crate) struct OutputRequest<'a> {
    pub name: &'a str,
    pub index: usize,
}

/// Per-execution libtorch settings.
pub(crate) struct ExecOptions<'a> {
    /// The model's name, for messages.
    pub model: &'a str,
    pub optimized_execution: bool,
    pub jit_profiling: Option<bool>,
    pub tensor_fuser: Option<bool>,
    /// Inputs go in as one `Dict[str, Tensor]` keyed by name.
    pub dict_inputs: bool,
}

/// The libtorch device of a CUDA index (`-1`: the CPU); CUDA must be usable.
pub(crate) fn device(index: i32) -> Result<Device, String> {
    let Ok(index) = usize::try_from(index) else {
        return Ok(Device::Cpu);
    };
    let count = crate::cuda::cuda_devices()?;
    if (index as i64) < count {
        Ok(Device::Cuda(index))
    } else {
        Err(format!(
            "libtorch sees {count} CUDA device(s), GPU {index} is not one of them"
        ))
    }
}

impl LoadedModule {
    pub fn load(file: &Path, device: Device) -> Result<LoadedModule, String> {
        let mut module = CModule::load_on_device(file, device).map_err(|e| {
            format!(
                "cannot load TorchScript file '{}': {}",
                file.display(),
                first_line(&e.to_string())
            )
        })?;
        module
            .f_set_eval()
            .map_err(|e| format!("cannot switch the module to eval mode: {e}"))?;
        Ok(LoadedModule { module, device })
    }

    fn input(&self, input: &Input<'_>) -> Result<IValue, Fail> {
        if input.dtype == ElementType::Bytes {
            return to_strings(input.name, input.data).map(IValue::StringList);
        }
        to_torch(
            input.name,
            input.dtype,
            input.shape,
            input.data,
            self.device,
        )
        .map(IValue::Tensor)
    }

    fn arguments(&self, inputs: &[Input<'_>], dict: bool) -> Result<Vec<IValue>, Fail> {
        if !dict {
            return inputs.iter().map(|i| self.input(i)).collect();
        }
        let entries = inputs
            .iter()
            .map(|i| Ok((IValue::String(i.name.to_string()), self.input(i)?)))
            .collect::<Result<Vec<_>, Fail>>()?;
        Ok(vec![IValue::GenericDict(entries)])
    }

    /// Runs forward with the per-execution settings, without autograd, and writes each
    /// requested output into `sink`.
    pub fn execute(
        &self,
        inputs: &[Input<'_>],
        outputs: &[OutputRequest<'_>],
        options: &ExecOptions<'_>,
        sink: &mut dyn OutputSink,
    ) -> Result<(), Fail> {
        let arguments = self.arguments(inputs, options.dict_inputs)?;
        let model = options.model;
        let returned = returned_values(model, forward(&self.module, &arguments, options)?)?;
        for (slot, output) in outputs.iter().enumerate() {
            let (name, index) = (output.name, output.index);
            let value = returned.get(index).ok_or_else(|| {
                Fail::new(
                    Status::Execution,
                    format!(
                        "model '{model}' returned {} output tensor(s), but output '{name}' is number {index} (counting from 0)",
                        returned.len()
                    ),
                )
            })?;
            match value {
                Returned::Tensor(t) => write_tensor(sink, slot, name, t)?,
                Returned::Strings(list) => write_strings(sink, slot, name, list)?,
            }
        }
        Ok(())
    }
}

fn forward(
    module: &CModule,
    arguments: &[IValue],
    options: &ExecOptions<'_>,
) -> Result<IValue, Fail> {
    let model = options.model;
    let setting = |e: tch::TchError| {
        Fail::new(
            Status::Execution,
            format!("model '{model}': libtorch setting: {e}"),
        )
    };
    // Thread-local in libtorch (the executor optimisation) or process-wide flags that every
    // execution sets for itself, as Triton's backend does.
    tch::jit::f_set_graph_executor_optimize(options.optimized_execution).map_err(setting)?;
    if let Some(on) = options.jit_profiling {
        tch::jit::f_set_profiling_mode(on).map_err(setting)?;
    }
    if let Some(on) = options.tensor_fuser {
        tch::jit::f_set_tensor_expr_fuser_enabled(on).map_err(setting)?;
    }
    let _no_grad = tch::no_grad_guard();
    module.forward_is(arguments).map_err(|e| {
        Fail::new(
            Status::Execution,
            format!(
                "PyTorch execute failure for model '{model}': {}",
                first_line(&e.to_string())
            ),
        )
    })
}

/// libtorch errors carry a C++ backtrace after the message; keep the message.
pub(crate) fn first_line(message: &str) -> &str {
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
fn returned_values(model: &str, value: IValue) -> Result<Vec<Returned>, Fail> {
    let not_output = |what: &str| {
        Fail::new(
            Status::Execution,
            format!(
                "model '{model}' returned {what}; outputs must be a tensor or a list of strings, or a tuple or list of those"
            ),
        )
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
            e.message,
            "model 'm' returned a tuple or list with an element that is not a tensor; outputs must be a tensor or a list of strings, or a tuple or list of those"
        );
    }
}
