//! Load-time check that a model config fits the ONNX model, like Triton's ORT backend.
//!
//! ```text
//!  every model input  ── must be named by the config (input, batch_input, sequence control/state)
//!  every config input/output ── must exist in the model, same datatype, compatible shape
//!  every batch_input target ── must be a model input of the batch input's datatype
//! ```
//! Shapes: with `max_batch_size > 0` the model's first dimension must be dynamic (-1) and the
//! rest must match the config's `dims` (or `reshape.shape` when given); without batching the whole
//! shape must match. A -1 on either side matches any size. A scalar model tensor accepts config
//! dims that are all 1 (Triton's rule). Messages start with `unable to load model '<name>'`.

use nereid_proto::{DataType, format_shape};

use super::signature::{ModelSignature, TensorSig};
use super::types::config_name;
use crate::config::ValidModelConfig;

/// Checks `config` against `sig`; `Err` is the reason the model cannot load.
pub(crate) fn validate(config: &ValidModelConfig, sig: &ModelSignature) -> Result<(), String> {
    let prefix = format!("unable to load model '{}'", config.name);
    check_input_coverage(config, sig).map_err(|e| format!("{prefix}, {e}"))?;
    let batching = config.batching();
    for input in &config.inputs {
        if input.optional && batching {
            return Err(format!(
                "{prefix}, optional input '{}' is not supported for models that support batching",
                input.name
            ));
        }
        let Some(model) = sig.input(&input.name) else {
            if input.optional {
                // An optional input may be an initializer the model lets callers override.
                continue;
            }
            return Err(format!(
                "{prefix}, configuration input '{}' is not an input of the model; model inputs are: {}",
                input.name,
                sig.input_names()
            ));
        };
        check_datatype(input.datatype, model, "input").map_err(|e| format!("{prefix}, {e}"))?;
        let dims = input.reshape.as_ref().unwrap_or(&input.dims);
        if input.allow_ragged_batch {
            if model.dims != [-1] {
                return Err(format!(
                    "{prefix}, configuration expects model provides input with shape [-1] for ragged input '{}', model provides {}",
                    input.name,
                    format_shape(&model.dims)
                ));
            }
            continue;
        }
        check_dims(model, dims, batching).map_err(|e| format!("{prefix}, {e}"))?;
    }
    for spec in &config.ragged.inputs {
        for target in &spec.targets {
            let Some(model) = sig.input(target) else {
                return Err(format!(
                    "{prefix}, batch input target '{target}' is not an input of the model; model inputs are: {}",
                    sig.input_names()
                ));
            };
            check_datatype(spec.datatype, model, "input").map_err(|e| format!("{prefix}, {e}"))?;
        }
    }
    for output in &config.outputs {
        let Some(model) = sig.output(&output.name) else {
            return Err(format!(
                "{prefix}, configuration output '{}' is not an output of the model; model outputs are: {}",
                output.name,
                sig.output_names()
            ));
        };
        check_datatype(output.datatype, model, "output").map_err(|e| format!("{prefix}, {e}"))?;
        if config.ragged.scatter_of(&output.name).is_some() {
            continue; // a batch output's shape need not match the model's
        }
        let dims = output.reshape.as_ref().unwrap_or(&output.dims);
        check_dims(model, dims, batching).map_err(|e| format!("{prefix}, {e}"))?;
    }
    Ok(())
}

/// Every model input must be fed by something the config declares, or the model could never run.
fn check_input_coverage(config: &ValidModelConfig, sig: &ModelSignature) -> Result<(), String> {
    let mut declared: Vec<&str> = config.inputs.iter().map(|i| i.name.as_str()).collect();
    declared.extend(
        config
            .ragged
            .inputs
            .iter()
            .flat_map(|b| b.targets.iter().map(String::as_str)),
    );
    if let Some(seq) = config.sequence() {
        declared.extend(seq.control_inputs.iter().map(String::as_str));
        declared.extend(seq.states.iter().map(|s| s.input_name.as_str()));
    }
    let missing: Vec<&TensorSig> = sig
        .inputs
        .iter()
        .filter(|t| !declared.contains(&t.name.as_str()))
        .collect();
    if let Some(first) = missing.first() {
        return Err(format!(
            "configuration expects {} inputs, model provides {} (model input '{}' is not in the configuration)",
            declared.len(),
            sig.inputs.len(),
            first.name
        ));
    }
    Ok(())
}

fn check_datatype(config_type: DataType, model: &TensorSig, kind: &str) -> Result<(), String> {
    let model_type = match &model.datatype {
        Ok(dt) => *dt,
        Err(what) => {
            return Err(format!(
                "model {kind} '{}' is {what}, which Triton cannot serve",
                model.name
            ));
        }
    };
    if config_type != model_type {
        return Err(format!(
            "configuration expects datatype {} for {kind} '{}', model provides {}",
            config_name(config_type),
            model.name,
            config_name(model_type)
        ));
    }
    Ok(())
}

/// Triton's `CompareDimsSupported`, with -1 matching on either side.
fn check_dims(model: &TensorSig, dims: &[i64], batching: bool) -> Result<(), String> {
    let name = &model.name;
    if model.dims.is_empty() && !batching {
        if dims.iter().any(|&d| d != 1) {
            return Err(format!(
                "scalar tensor '{name}', should only provide 1 in the model configuration when the model doesn't support batching. Model configuration provided: {}.",
                format_shape(dims)
            ));
        }
        return Ok(());
    }
    let full: Vec<i64> = if batching {
        if !model.batchable() {
            return Err(format!(
                "tensor '{name}': for the model to support batching the shape should have at least 1 dimension and the first dimension must be -1; but shape expected by the model is {}",
                format_shape(&model.dims)
            ));
        }
        std::iter::once(-1).chain(dims.iter().copied()).collect()
    } else {
        dims.to_vec()
    };
    let compatible = full.len() == model.dims.len()
        && full
            .iter()
            .zip(&model.dims)
            .all(|(&c, &m)| c == -1 || m == -1 || c == m);
    if !compatible {
        let how = if batching {
            "(with the batch dimension first because max_batch_size > 0) "
        } else {
            ""
        };
        return Err(format!(
            "tensor '{name}': the model expects {} dimensions (shape {}) but the model configuration specifies {} dimensions {how}(shape {})",
            model.dims.len(),
            format_shape(&model.dims),
            full.len(),
            format_shape(&full)
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::onnx::signature::sig;
    use crate::config::{InputSpec, OutputSpec};

    fn add_sub() -> ModelSignature {
        ModelSignature {
            inputs: vec![
                sig("a", DataType::Fp32, &[-1, 4]),
                sig("b", DataType::Fp32, &[-1, 4]),
            ],
            outputs: vec![sig("y", DataType::Fp32, &[-1, 4])],
        }
    }

    fn config(
        mbs: u32,
        inputs: &[(&str, DataType, &[i64])],
        outputs: &[(&str, DataType, &[i64])],
    ) -> ValidModelConfig {
        let mut c = ValidModelConfig::unchecked(Default::default());
        c.name = "m".into();
        c.max_batch_size = mbs;
        c.inputs = inputs
            .iter()
            .map(|(n, dt, d)| InputSpec {
                name: n.to_string(),
                datatype: *dt,
                dims: d.to_vec(),
                reshape: None,
                optional: false,
                allow_ragged_batch: false,
            })
            .collect();
        c.outputs = outputs
            .iter()
            .map(|(n, dt, d)| OutputSpec {
                name: n.to_string(),
                datatype: *dt,
                dims: d.to_vec(),
                reshape: None,
                label_filename: None,
            })
            .collect();
        c
    }

    const F: DataType = DataType::Fp32;

    #[test]
    fn matching_configs_pass() {
        let ok = config(8, &[("a", F, &[4]), ("b", F, &[-1])], &[("y", F, &[4])]);
        assert_eq!(validate(&ok, &add_sub()), Ok(()));
        let no_batch = config(
            0,
            &[("a", F, &[2, 4]), ("b", F, &[-1, 4])],
            &[("y", F, &[-1, -1])],
        );
        assert_eq!(validate(&no_batch, &add_sub()), Ok(()));
    }

    #[test]
    fn input_count_and_names_are_checked() {
        let one = config(8, &[("a", F, &[4])], &[("y", F, &[4])]);
        assert_eq!(
            validate(&one, &add_sub()).unwrap_err(),
            "unable to load model 'm', configuration expects 1 inputs, model provides 2 (model input 'b' is not in the configuration)"
        );
        let wrong = config(
            8,
            &[("a", F, &[4]), ("b", F, &[4]), ("c", F, &[4])],
            &[("y", F, &[4])],
        );
        let err = validate(&wrong, &add_sub()).unwrap_err();
        assert!(
            err.contains(
                "configuration input 'c' is not an input of the model; model inputs are: 'a', 'b'"
            ),
            "{err}"
        );
        let out = config(8, &[("a", F, &[4]), ("b", F, &[4])], &[("z", F, &[4])]);
        assert!(
            validate(&out, &add_sub())
                .unwrap_err()
                .contains("configuration output 'z' is not an output")
        );
    }

    #[test]
    fn datatypes_and_dims_are_checked() {
        let dt = config(
            8,
            &[("a", DataType::Fp16, &[4]), ("b", F, &[4])],
            &[("y", F, &[4])],
        );
        assert_eq!(
            validate(&dt, &add_sub()).unwrap_err(),
            "unable to load model 'm', configuration expects datatype TYPE_FP16 for input 'a', model provides TYPE_FP32"
        );
        let dims = config(8, &[("a", F, &[5]), ("b", F, &[4])], &[("y", F, &[4])]);
        let err = validate(&dims, &add_sub()).unwrap_err();
        assert!(
            err.contains("tensor 'a': the model expects 2 dimensions (shape [-1,4])"),
            "{err}"
        );
        assert!(err.contains("(shape [-1,5])"), "{err}");
        let rank = config(
            0,
            &[("a", F, &[4]), ("b", F, &[-1, 4])],
            &[("y", F, &[-1, 4])],
        );
        assert!(
            validate(&rank, &add_sub())
                .unwrap_err()
                .contains("tensor 'a': the model expects 2 dimensions")
        );
    }

    #[test]
    fn batching_needs_a_dynamic_first_dimension() {
        let fixed = ModelSignature {
            inputs: vec![sig("x", F, &[1, 3])],
            outputs: vec![sig("y", F, &[1, 3])],
        };
        let err = validate(&config(4, &[("x", F, &[3])], &[("y", F, &[3])]), &fixed).unwrap_err();
        assert!(
            err.contains(
                "the first dimension must be -1; but shape expected by the model is [1,3]"
            ),
            "{err}"
        );
        assert_eq!(
            validate(
                &config(0, &[("x", F, &[1, 3])], &[("y", F, &[1, 3])]),
                &fixed
            ),
            Ok(())
        );
    }

    #[test]
    fn scalars_and_reshape() {
        let scalar = ModelSignature {
            inputs: vec![sig("x", F, &[])],
            outputs: vec![sig("y", F, &[])],
        };
        assert_eq!(
            validate(&config(0, &[("x", F, &[1])], &[("y", F, &[1])]), &scalar),
            Ok(())
        );
        assert!(validate(&config(0, &[("x", F, &[2])], &[("y", F, &[1])]), &scalar).is_err());
        let batched = ModelSignature {
            inputs: vec![sig("x", F, &[-1])],
            outputs: vec![sig("y", F, &[-1])],
        };
        let mut cfg = config(4, &[("x", F, &[1])], &[("y", F, &[1])]);
        assert!(validate(&cfg, &batched).is_err());
        cfg.inputs[0].reshape = Some(Vec::new());
        cfg.outputs[0].reshape = Some(Vec::new());
        assert_eq!(validate(&cfg, &batched), Ok(()));
    }

    #[test]
    fn batch_input_targets_must_be_model_inputs_of_their_datatype() {
        use crate::config::{BatchInputKind, BatchInputSpec};
        let ragged = ModelSignature {
            inputs: vec![sig("x", F, &[-1]), sig("INDEX", DataType::Int32, &[-1])],
            outputs: vec![sig("y", F, &[-1, 1])],
        };
        let mut cfg = config(8, &[("x", F, &[-1])], &[("y", F, &[1])]);
        cfg.inputs[0].allow_ragged_batch = true;
        let spec = |target: &str, datatype| BatchInputSpec {
            kind: BatchInputKind::AccumulatedElementCount,
            targets: vec![target.into()],
            datatype,
            source: "x".into(),
        };
        cfg.ragged.inputs = vec![spec("INDEX", DataType::Int32)];
        assert_eq!(validate(&cfg, &ragged), Ok(()));
        cfg.ragged.inputs = vec![spec("INDEX", F)];
        assert_eq!(
            validate(&cfg, &ragged).unwrap_err(),
            "unable to load model 'm', configuration expects datatype TYPE_FP32 for input 'INDEX', model provides TYPE_INT32"
        );
        cfg.ragged.inputs = vec![spec("INDEX", DataType::Int32), spec("NOPE", F)];
        assert!(
            validate(&cfg, &ragged)
                .unwrap_err()
                .contains("batch input target 'NOPE' is not an input of the model")
        );
    }

    #[test]
    fn unservable_model_types_are_named() {
        let mut s = add_sub();
        s.inputs[0].datatype = Err("an ONNX sequence".into());
        let err = validate(
            &config(8, &[("a", F, &[4]), ("b", F, &[4])], &[("y", F, &[4])]),
            &s,
        )
        .unwrap_err();
        assert!(
            err.contains("model input 'a' is an ONNX sequence, which Triton cannot serve"),
            "{err}"
        );
    }
}
