//! Ragged batching in a model config: the inputs marked `allow_ragged_batch`, the `batch_input`
//! tensors the server generates for each batch, and the `batch_output` tensors it scatters back
//! per request. Triton's checks of them (`ValidateBatchIO`) and their typed form.
//!
//! ```text
//! wire batch_input / batch_output ──check (load errors naming the entry and field)──┐
//!                                  ──RaggedBatching::from_wire (after validation) ──┴► scheduler
//!     ragged:  input names whose shapes may differ within a batch (flattened to 1-D)
//!     inputs:  per batch: kind + source input ─► one generated tensor per target name
//!     scatter: per target output: source input + shape template ([-1] + dims)
//! ```

use std::collections::HashSet;

use nereid_proto::DataType;
use nereid_proto::pb::inference::batch_input::Kind as WireInputKind;
use nereid_proto::pb::inference::batch_output::Kind as WireOutputKind;
use nereid_proto::pb::inference::{DataType as ConfigDataType, ModelConfig};

/// What a batch input holds, per Triton's `BatchInput.Kind`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BatchInputKind {
    /// `[requests]`: each request's element count of the source input.
    ElementCount,
    /// `[requests]`: the running total of those counts (where each request's elements end).
    AccumulatedElementCount,
    /// `[requests + 1]`: 0, then the running total (where each request's elements start).
    AccumulatedElementCountWithZero,
    /// A tensor whose shape `[max]` is the largest element count of a request; its data is
    /// not meant to be read (Triton leaves it uninitialised; here it is zeros).
    MaxElementCountAsShape,
    /// `[batch items, rank - 1]`: each batch item's shape without the batch dimension.
    ItemShape,
    /// The same values flattened to one dimension.
    ItemShapeFlatten,
}

/// One `batch_input` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchInputSpec {
    /// What the generated tensor holds (`batch_input.kind`).
    pub kind: BatchInputKind,
    /// The model inputs fed with the generated tensor (each gets the same values).
    pub targets: Vec<String>,
    /// `TYPE_INT32` or `TYPE_FP32`.
    pub datatype: DataType,
    /// The request input whose shapes the tensor describes.
    pub source: String,
}

/// One output a `batch_output` (`BATCH_SCATTER_WITH_INPUT_SHAPE`) scatters back per request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScatterOutput {
    /// The model output to scatter (`batch_output.target_name`).
    pub output: String,
    /// The request input whose shape gives each request's part.
    pub source: String,
    /// The output's shape with the batch dimension (`-1`) when the model batches; every `-1`
    /// is taken, dimension by dimension, from the request's source input shape.
    pub shape: Vec<i64>,
}

/// The ragged batching of a model: empty for most models.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RaggedBatching {
    /// Inputs with `allow_ragged_batch`: requests may differ in their shape; a batch holds
    /// them concatenated and flattened to one dimension.
    pub ragged_inputs: Vec<String>,
    /// The `batch_input` entries: tensors the server computes from the batch and feeds the model.
    pub inputs: Vec<BatchInputSpec>,
    /// The `batch_output` entries: outputs split back to the requests by input shape.
    pub scatter: Vec<ScatterOutput>,
}

impl RaggedBatching {
    /// Whether the model uses none of it (batches are joined and split by batch size alone).
    pub fn is_empty(&self) -> bool {
        self.ragged_inputs.is_empty() && self.inputs.is_empty() && self.scatter.is_empty()
    }

    /// Whether requests may differ in the shape of input `name`.
    pub fn is_ragged(&self, name: &str) -> bool {
        self.ragged_inputs.iter().any(|r| r == name)
    }

    /// The scatter of output `name`, when a `batch_output` names it.
    pub fn scatter_of(&self, name: &str) -> Option<&ScatterOutput> {
        self.scatter.iter().find(|s| s.output == name)
    }

    /// The typed form of a config that passed [`check`].
    pub(crate) fn from_wire(wire: &ModelConfig) -> RaggedBatching {
        let ragged_inputs = wire
            .input
            .iter()
            .filter(|i| i.allow_ragged_batch)
            .map(|i| i.name.clone())
            .collect();
        let inputs = wire
            .batch_input
            .iter()
            .filter_map(|b| {
                Some(BatchInputSpec {
                    kind: input_kind(b.kind)?,
                    targets: b.target_name.clone(),
                    datatype: DataType::from_config_i32(b.data_type)?,
                    source: b.source_input.first()?.clone(),
                })
            })
            .collect();
        let batching = wire.max_batch_size > 0;
        let scatter = wire
            .batch_output
            .iter()
            .flat_map(|b| b.target_name.iter().map(move |t| (t, b)))
            .filter_map(|(target, b)| {
                let output = wire.output.iter().find(|o| &o.name == target)?;
                let dims = output.reshape.as_ref().map_or(&output.dims, |r| &r.shape);
                let mut shape = if batching { vec![-1] } else { Vec::new() };
                shape.extend_from_slice(dims);
                Some(ScatterOutput {
                    output: target.clone(),
                    source: b.source_input.first()?.clone(),
                    shape,
                })
            })
            .collect();
        RaggedBatching {
            ragged_inputs,
            inputs,
            scatter,
        }
    }
}

fn input_kind(kind: i32) -> Option<BatchInputKind> {
    Some(match WireInputKind::try_from(kind).ok()? {
        WireInputKind::BatchElementCount => BatchInputKind::ElementCount,
        WireInputKind::BatchAccumulatedElementCount => BatchInputKind::AccumulatedElementCount,
        WireInputKind::BatchAccumulatedElementCountWithZero => {
            BatchInputKind::AccumulatedElementCountWithZero
        }
        WireInputKind::BatchMaxElementCountAsShape => BatchInputKind::MaxElementCountAsShape,
        WireInputKind::BatchItemShape => BatchInputKind::ItemShape,
        WireInputKind::BatchItemShapeFlatten => BatchInputKind::ItemShapeFlatten,
    })
}

/// Triton's checks of `batch_input` and `batch_output` (its `ValidateBatchIO`), plus one it
/// leaves to the backend: a batch input's target must not be a declared input (a client would
/// send it, and the server would feed it too). Each message is Triton's, prefixed with the entry
/// (`batch_input[i]: `) and, where Triton's does not say, followed by the value at fault.
pub(crate) fn check(errors: &mut Vec<String>, config: &ModelConfig) {
    let m = &config.name;
    let inputs: HashSet<&str> = config.input.iter().map(|i| i.name.as_str()).collect();
    let outputs: HashSet<&str> = config.output.iter().map(|o| o.name.as_str()).collect();
    let mut targets = HashSet::new();
    for (i, b) in config.batch_input.iter().enumerate() {
        let entry = format!("batch_input[{i}]");
        let Ok(kind) = WireInputKind::try_from(b.kind) else {
            errors.push(format!(
                "{entry}: unknown batch input kind {} for {m}",
                b.kind
            ));
            continue;
        };
        if b.source_input.len() != 1 {
            errors.push(format!(
                "{entry}: batch input kind '{}' expects 1 source input, got {} for {m}",
                kind.as_str_name(),
                b.source_input.len()
            ));
        }
        let datatype = ConfigDataType::try_from(b.data_type).unwrap_or(ConfigDataType::TypeInvalid);
        if !matches!(
            datatype,
            ConfigDataType::TypeInt32 | ConfigDataType::TypeFp32
        ) {
            errors.push(format!(
                "{entry}: batch input data type must be TYPE_INT32 or TYPE_FP32 for {m} (data_type is {})",
                datatype.as_str_name()
            ));
        }
        check_sources(errors, &entry, &b.source_input, &inputs, m);
        for target in &b.target_name {
            if inputs.contains(target.as_str()) {
                errors.push(format!(
                    "{entry}: target_name '{target}' is also a configured input; the server generates batch inputs, so a batch input's target must be a model input that the config does not list in 'input' for {m}"
                ));
            } else if !targets.insert(target.as_str()) {
                errors.push(format!(
                    "{entry}: target_name '{target}' is the target of more than one batch input for {m}"
                ));
            }
        }
    }
    let mut scattered = HashSet::new();
    for (i, b) in config.batch_output.iter().enumerate() {
        let entry = format!("batch_output[{i}]");
        let Ok(kind) = WireOutputKind::try_from(b.kind) else {
            errors.push(format!(
                "{entry}: unknown batch output kind {} for {m}",
                b.kind
            ));
            continue;
        };
        if b.source_input.len() != 1 {
            errors.push(format!(
                "{entry}: batch output kind '{}' expects 1 source input, got {} for {m}",
                kind.as_str_name(),
                b.source_input.len()
            ));
        }
        check_sources(errors, &entry, &b.source_input, &inputs, m);
        for target in &b.target_name {
            if !outputs.contains(target.as_str()) {
                errors.push(format!(
                    "{entry}: unknown target output name '{target}' for {m}"
                ));
            } else if !scattered.insert(target.as_str()) {
                errors.push(format!(
                    "{entry}: target output name '{target}' can only be specified once for {m}"
                ));
            }
        }
    }
}

fn check_sources(
    errors: &mut Vec<String>,
    entry: &str,
    sources: &[String],
    inputs: &HashSet<&str>,
    m: &str,
) {
    for source in sources {
        if !inputs.contains(source.as_str()) {
            errors.push(format!(
                "{entry}: unknown source input name '{source}' for {m}"
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire(text: &str) -> ModelConfig {
        crate::config::text::parse_model_config(text).unwrap()
    }

    const IO: &str = r#"name: "r" max_batch_size: 8
        input [{name: "x" data_type: TYPE_FP32 dims: [-1] allow_ragged_batch: true},
               {name: "y" data_type: TYPE_FP32 dims: [2]}]
        output [{name: "sum" data_type: TYPE_FP32 dims: [1]},
                {name: "z" data_type: TYPE_FP32 dims: [-1] reshape: {shape: [-1, 1]}}]"#;

    fn errors_of(extra: &str) -> Vec<String> {
        let mut errors = Vec::new();
        check(&mut errors, &wire(&format!("{IO} {extra}")));
        errors
    }

    #[test]
    fn a_valid_config_types_every_entry() {
        let extra = r#"
            batch_input [{kind: BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO target_name: ["i", "j"] data_type: TYPE_INT32 source_input: ["x"]},
                         {kind: BATCH_ITEM_SHAPE target_name: ["s"] data_type: TYPE_FP32 source_input: ["y"]}]
            batch_output [{kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: ["z"] source_input: ["x"]}]"#;
        assert!(errors_of(extra).is_empty(), "{:?}", errors_of(extra));
        let r = RaggedBatching::from_wire(&wire(&format!("{IO} {extra}")));
        assert_eq!(r.ragged_inputs, ["x"]);
        assert!(r.is_ragged("x") && !r.is_ragged("y") && !r.is_empty());
        assert_eq!(
            r.inputs[0],
            BatchInputSpec {
                kind: BatchInputKind::AccumulatedElementCountWithZero,
                targets: vec!["i".into(), "j".into()],
                datatype: DataType::Int32,
                source: "x".into(),
            }
        );
        assert_eq!(
            (r.inputs[1].kind, r.inputs[1].datatype),
            (BatchInputKind::ItemShape, DataType::Fp32)
        );
        // The reshape is the shape the model produces; the batch dimension comes first.
        assert_eq!(
            r.scatter_of("z"),
            Some(&ScatterOutput {
                output: "z".into(),
                source: "x".into(),
                shape: vec![-1, -1, 1],
            })
        );
        assert!(r.scatter_of("sum").is_none());
        assert!(RaggedBatching::from_wire(&wire("name: \"p\"")).is_empty());
    }

    #[test]
    fn without_batching_the_scatter_shape_has_no_batch_dimension() {
        let text = r#"name: "n" input [{name: "x" data_type: TYPE_FP32 dims: [-1]}]
            output [{name: "z" data_type: TYPE_FP32 dims: [-1]}]
            batch_output [{target_name: ["z"] source_input: ["x"]}]"#;
        assert_eq!(
            RaggedBatching::from_wire(&wire(text)).scatter[0].shape,
            [-1]
        );
    }

    #[test]
    fn refuses_batch_inputs_naming_the_entry_and_field() {
        assert_eq!(
            errors_of(
                r#"batch_input [{target_name: ["n"] data_type: TYPE_FP32 source_input: ["x", "y"]}]"#
            ),
            [
                "batch_input[0]: batch input kind 'BATCH_ELEMENT_COUNT' expects 1 source input, got 2 for r"
            ]
        );
        assert_eq!(
            errors_of(
                r#"batch_input [{target_name: ["n"] data_type: TYPE_FP32 source_input: ["q"]}]"#
            ),
            ["batch_input[0]: unknown source input name 'q' for r"]
        );
        assert_eq!(
            errors_of(
                r#"batch_input [{target_name: ["n"] data_type: TYPE_INT64 source_input: ["x"]}]"#
            ),
            [
                "batch_input[0]: batch input data type must be TYPE_INT32 or TYPE_FP32 for r (data_type is TYPE_INT64)"
            ]
        );
        let collide = errors_of(
            r#"batch_input [{target_name: ["y"] data_type: TYPE_FP32 source_input: ["x"]}]"#,
        );
        assert!(
            collide[0].starts_with("batch_input[0]: target_name 'y' is also a configured input"),
            "{collide:?}"
        );
        assert_eq!(
            errors_of(
                r#"batch_input [{target_name: ["n"] data_type: TYPE_FP32 source_input: ["x"]},
                                {kind: BATCH_ITEM_SHAPE target_name: ["n"] data_type: TYPE_FP32 source_input: ["x"]}]"#
            ),
            ["batch_input[1]: target_name 'n' is the target of more than one batch input for r"]
        );
    }

    #[test]
    fn refuses_batch_outputs_naming_the_entry_and_field() {
        assert_eq!(
            errors_of(r#"batch_output [{target_name: ["q"] source_input: ["x"]}]"#),
            ["batch_output[0]: unknown target output name 'q' for r"]
        );
        assert_eq!(
            errors_of(r#"batch_output [{target_name: ["z", "z"] source_input: ["x"]}]"#),
            ["batch_output[0]: target output name 'z' can only be specified once for r"]
        );
        assert_eq!(
            errors_of(r#"batch_output [{target_name: ["z"] source_input: ["q"]}]"#),
            ["batch_output[0]: unknown source input name 'q' for r"]
        );
        assert_eq!(
            errors_of(r#"batch_output [{target_name: ["z"]}]"#),
            [
                "batch_output[0]: batch output kind 'BATCH_SCATTER_WITH_INPUT_SHAPE' expects 1 source input, got 0 for r"
            ]
        );
    }
}
