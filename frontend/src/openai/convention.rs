//! Which models serve which `/v1/` routes, read from their metadata alone (a pure function).
//!
//! - **Generation** (completions, chat): the convention of Triton's vLLM and TensorRT-LLM
//!   backends. Input `text_input` (BYTES) and output `text_output` (BYTES) are required; the
//!   optional inputs are filled in when the model declares them: `stream` (BOOL),
//!   `sampling_parameters` (BYTES, JSON), `exclude_input_in_output` (BOOL, set true), and the
//!   vLLM backend's `return_num_input_tokens`, `return_num_output_tokens`,
//!   `return_finish_reason` (BOOL, set true; read back from the outputs `num_input_tokens`,
//!   `num_output_tokens`, `finish_reason`). A model with TensorRT-LLM-style typed inputs named
//!   like the sampling fields (`max_tokens`, `temperature`, `top_p`, `seed`, ...) gets those too.
//! - **Embedding**: not a generation model, with a BYTES input (the one named `text_input`, else
//!   the only BYTES input) and an FP32 output (the one named `embedding`, else the only FP32
//!   output); each text is one request, the output's elements are its vector.

use nereid_proto::{ModelMetadata, TensorMetadata};

/// The generation convention's input and output names.
pub const TEXT_INPUT: &str = "text_input";
pub const TEXT_OUTPUT: &str = "text_output";
pub const STREAM: &str = "stream";
pub const SAMPLING_PARAMETERS: &str = "sampling_parameters";
pub const EXCLUDE_INPUT: &str = "exclude_input_in_output";
pub const RETURN_NUM_INPUT_TOKENS: &str = "return_num_input_tokens";
pub const RETURN_NUM_OUTPUT_TOKENS: &str = "return_num_output_tokens";
pub const RETURN_FINISH_REASON: &str = "return_finish_reason";
pub const NUM_INPUT_TOKENS: &str = "num_input_tokens";
pub const NUM_OUTPUT_TOKENS: &str = "num_output_tokens";
pub const FINISH_REASON: &str = "finish_reason";
/// The preferred names of an embedding model's output.
pub const EMBEDDING_OUTPUT: &str = "embedding";

/// What a model can serve.
#[derive(Clone, Debug, PartialEq)]
pub enum ModelKind {
    Generation(GenerationModel),
    Embedding(EmbeddingModel),
}

/// A generation model's inputs, as the requests to it are built.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerationModel {
    /// Every input, for shaping the values sent (`request_from_keys`).
    pub inputs: Vec<TensorMetadata>,
    /// The outputs' names.
    pub outputs: Vec<String>,
}

impl GenerationModel {
    /// Whether the model declares the input `name`.
    pub fn has_input(&self, name: &str) -> bool {
        self.inputs.iter().any(|i| i.name == name)
    }

    /// The outputs to ask for: `text_output`, and each count or reason whose `return_*` input
    /// the request sets. Named explicitly, so that other outputs the model declares but does
    /// not produce on every response are not expected.
    pub fn requested_outputs(&self) -> Vec<&str> {
        let mut names = vec![TEXT_OUTPUT];
        for (flag, output) in [
            (RETURN_NUM_INPUT_TOKENS, NUM_INPUT_TOKENS),
            (RETURN_NUM_OUTPUT_TOKENS, NUM_OUTPUT_TOKENS),
            (RETURN_FINISH_REASON, FINISH_REASON),
        ] {
            if self.has_input(flag) && self.outputs.iter().any(|o| o == output) {
                names.push(output);
            }
        }
        names
    }
}

/// An embedding model's text input and vector output.
#[derive(Clone, Debug, PartialEq)]
pub struct EmbeddingModel {
    pub inputs: Vec<TensorMetadata>,
    pub input: String,
    pub output: String,
}

/// The model's kind, or why it has none (for the 422 message).
pub fn classify(metadata: &ModelMetadata) -> Result<ModelKind, String> {
    let bytes_input = |name: &str| {
        metadata
            .inputs
            .iter()
            .any(|i| i.name == name && i.datatype == "BYTES")
    };
    let bytes_output = |name: &str| {
        metadata
            .outputs
            .iter()
            .any(|o| o.name == name && o.datatype == "BYTES")
    };
    if bytes_input(TEXT_INPUT) && bytes_output(TEXT_OUTPUT) {
        return Ok(ModelKind::Generation(GenerationModel {
            inputs: metadata.inputs.clone(),
            outputs: metadata.outputs.iter().map(|o| o.name.clone()).collect(),
        }));
    }
    let input = pick(&metadata.inputs, TEXT_INPUT, "BYTES");
    let output = pick(&metadata.outputs, EMBEDDING_OUTPUT, "FP32");
    match (input, output) {
        (Some(input), Some(output)) => Ok(ModelKind::Embedding(EmbeddingModel {
            inputs: metadata.inputs.clone(),
            input,
            output,
        })),
        _ => Err(format!(
            "it has neither a BYTES input '{TEXT_INPUT}' with a BYTES output '{TEXT_OUTPUT}' (a generation model) nor one BYTES input with one FP32 output (an embedding model)"
        )),
    }
}

/// The tensor named `preferred` of type `datatype`, else the only one of that type.
fn pick(tensors: &[TensorMetadata], preferred: &str, datatype: &str) -> Option<String> {
    let typed: Vec<&TensorMetadata> = tensors.iter().filter(|t| t.datatype == datatype).collect();
    if let Some(t) = typed.iter().find(|t| t.name == preferred) {
        return Some(t.name.clone());
    }
    match typed.as_slice() {
        [only] => Some(only.name.clone()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(name: &str, datatype: &str) -> TensorMetadata {
        TensorMetadata {
            name: name.into(),
            datatype: datatype.into(),
            shape: vec![1],
        }
    }

    fn metadata(inputs: &[(&str, &str)], outputs: &[(&str, &str)]) -> ModelMetadata {
        ModelMetadata {
            name: "m".into(),
            versions: vec!["1".into()],
            platform: "python".into(),
            inputs: inputs.iter().map(|(n, d)| tensor(n, d)).collect(),
            outputs: outputs.iter().map(|(n, d)| tensor(n, d)).collect(),
        }
    }

    #[test]
    fn vllm_style_model_is_generation() {
        let m = metadata(
            &[("text_input", "BYTES"), ("stream", "BOOL")],
            &[("text_output", "BYTES")],
        );
        let Ok(ModelKind::Generation(g)) = classify(&m) else {
            panic!("not generation");
        };
        assert!(g.has_input("stream"));
        assert!(!g.has_input("sampling_parameters"));
        assert_eq!(g.requested_outputs(), ["text_output"]);
        let counted = metadata(
            &[
                ("text_input", "BYTES"),
                ("return_num_output_tokens", "BOOL"),
            ],
            &[
                ("text_output", "BYTES"),
                ("num_output_tokens", "UINT32"),
                ("finish_reason", "BYTES"),
            ],
        );
        let Ok(ModelKind::Generation(g)) = classify(&counted) else {
            panic!("not generation");
        };
        assert_eq!(g.requested_outputs(), ["text_output", "num_output_tokens"]);
    }

    #[test]
    fn text_to_fp32_is_embedding() {
        let m = metadata(&[("TEXT", "BYTES")], &[("VEC", "FP32")]);
        assert_eq!(
            classify(&m),
            Ok(ModelKind::Embedding(EmbeddingModel {
                inputs: m.inputs.clone(),
                input: "TEXT".into(),
                output: "VEC".into(),
            }))
        );
        let named = metadata(
            &[("text_input", "BYTES"), ("other", "BYTES")],
            &[("embedding", "FP32"), ("norm", "FP32")],
        );
        let Ok(ModelKind::Embedding(e)) = classify(&named) else {
            panic!("not embedding");
        };
        assert_eq!(
            (e.input.as_str(), e.output.as_str()),
            ("text_input", "embedding")
        );
    }

    #[test]
    fn other_models_are_neither() {
        assert!(classify(&metadata(&[("INPUT0", "FP32")], &[("OUTPUT0", "FP32")])).is_err());
        assert!(
            classify(&metadata(
                &[("a", "BYTES"), ("b", "BYTES")],
                &[("o", "FP32")]
            ))
            .is_err()
        );
    }
}
