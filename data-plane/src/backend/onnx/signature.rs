//! What an ONNX model declares: its inputs and outputs, read once from a loaded session.
//!
//! Validation ([`super::validate`]) and auto-complete ([`super::autocomplete`]) are plain
//! functions of (config, signature), so they are unit-tested without ONNX Runtime.

use nereid_proto::DataType;
use ort::session::Session;
use ort::value::Outlet;

use super::types::datatype_of_value;

/// One model input or output.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct TensorSig {
    pub name: String,
    /// The Triton datatype, or a description of an ONNX type Triton cannot serve.
    pub datatype: Result<DataType, String>,
    /// The model's shape; `-1` for a dynamic dimension, named (symbolic) or not.
    pub dims: Vec<i64>,
}

impl TensorSig {
    fn from_outlet(outlet: &Outlet) -> TensorSig {
        let dtype = outlet.dtype();
        TensorSig {
            name: outlet.name().to_string(),
            datatype: datatype_of_value(dtype),
            dims: dtype
                .tensor_shape()
                .map(|s| s.iter().copied().collect())
                .unwrap_or_default(),
        }
    }

    /// Whether the first dimension is dynamic, so that it can be a batch dimension.
    pub fn batchable(&self) -> bool {
        self.dims.first() == Some(&-1)
    }
}

/// The inputs and outputs of a model, in the model's order.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct ModelSignature {
    pub inputs: Vec<TensorSig>,
    pub outputs: Vec<TensorSig>,
}

impl ModelSignature {
    pub fn from_session(session: &Session) -> ModelSignature {
        ModelSignature {
            inputs: session
                .inputs()
                .iter()
                .map(TensorSig::from_outlet)
                .collect(),
            outputs: session
                .outputs()
                .iter()
                .map(TensorSig::from_outlet)
                .collect(),
        }
    }

    pub fn input(&self, name: &str) -> Option<&TensorSig> {
        self.inputs.iter().find(|t| t.name == name)
    }

    pub fn output(&self, name: &str) -> Option<&TensorSig> {
        self.outputs.iter().find(|t| t.name == name)
    }

    /// Triton's rule: a model can batch when every input and output has a dynamic first dimension.
    pub fn can_batch(&self) -> bool {
        self.inputs
            .iter()
            .chain(&self.outputs)
            .all(TensorSig::batchable)
    }

    /// Comma-separated names, for messages.
    pub fn input_names(&self) -> String {
        join_names(&self.inputs)
    }

    pub fn output_names(&self) -> String {
        join_names(&self.outputs)
    }
}

fn join_names(tensors: &[TensorSig]) -> String {
    tensors
        .iter()
        .map(|t| format!("'{}'", t.name))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
pub(crate) fn sig(name: &str, dt: DataType, dims: &[i64]) -> TensorSig {
    TensorSig {
        name: name.to_string(),
        datatype: Ok(dt),
        dims: dims.to_vec(),
    }
}
