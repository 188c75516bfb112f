//! Config auto-complete from an ONNX model, following Triton's ONNX Runtime backend.
//!
//! The rules, applied in this order (`sig` = the model's inputs and outputs):
//!
//! 1. **Can the model batch?** Only if every model input *and* output has at least one dimension
//!    and a dynamic (-1, named or unnamed) first dimension.
//! 2. **`max_batch_size`.** If the config's `max_batch_size` is 0, the model can batch, and no
//!    config input/output that names a model tensor gives `dims` of the model's full rank (which
//!    would mean the config already counts the batch dimension), it becomes
//!    `default_max_batch_size` (Triton's `--backend-config=onnxruntime,default-max-batch-size`,
//!    4). If the config asks for batching (`max_batch_size > 0`) but the model cannot batch, that
//!    is an error, as in Triton.
//! 3. **Inputs / outputs.** With no `input` in the config, every model input is added (model
//!    order) with its name, `data_type` and `dims`; the same for `output`. A config entry that
//!    names a model tensor but has no `data_type` (`TYPE_INVALID`) or no `dims` (and no
//!    `reshape`) gets them from the model. Filled `dims` leave out the batch dimension when
//!    `max_batch_size > 0`; symbolic dimensions become -1. If nothing is left (a model tensor of
//!    shape `[batch]`), dims are `[1]`, plus an empty `reshape` when batching, exactly as Triton
//!    writes them.
//! 4. **Scheduler.** If `max_batch_size > 1`, no scheduler (`dynamic_batching`,
//!    `sequence_batching`, `ensemble_scheduling`) is configured, and this pass changed the config
//!    (set `max_batch_size` or filled an input/output), `dynamic_batching {}` is added.
//!
//! A config whose inputs and outputs are complete and whose `max_batch_size` needs no change is
//! left as it is, so an explicit config keeps the default scheduler like in Triton.

use nereid_proto::pb::inference::model_config::SchedulingChoice;
use nereid_proto::pb::inference::{
    ModelConfig, ModelDynamicBatching, ModelInput, ModelOutput, ModelTensorReshape,
};

use super::signature::{ModelSignature, TensorSig};

/// Triton's default for `default-max-batch-size`.
pub(crate) const DEFAULT_MAX_BATCH_SIZE: i32 = 4;

/// Applies the rules above to `config`; `Err` is a reason the config cannot be completed.
pub(crate) fn complete(
    config: &mut ModelConfig,
    sig: &ModelSignature,
    default_max_batch_size: i32,
) -> Result<(), String> {
    let can_batch = sig.can_batch();
    let mut changed = false;
    if config.max_batch_size == 0 {
        if can_batch && !config_counts_batch_dim(config, sig) && default_max_batch_size > 0 {
            config.max_batch_size = default_max_batch_size;
            changed = true;
        }
    } else if !can_batch {
        return Err(format!(
            "autofill failed for model '{}': model does not support batching while non-zero max_batch_size is specified",
            config.name
        ));
    }
    let batching = config.max_batch_size > 0;

    if config.input.is_empty() {
        for t in &sig.inputs {
            let (dims, reshape) = config_dims(t, batching);
            config.input.push(ModelInput {
                name: t.name.clone(),
                data_type: data_type(t)?,
                dims,
                reshape,
                ..Default::default()
            });
        }
        changed |= !sig.inputs.is_empty();
    } else {
        for input in &mut config.input {
            if let Some(t) = sig.input(&input.name) {
                changed |= fill(
                    t,
                    batching,
                    &mut input.data_type,
                    &mut input.dims,
                    &mut input.reshape,
                )?;
            }
        }
    }
    if config.output.is_empty() {
        for t in &sig.outputs {
            let (dims, reshape) = config_dims(t, batching);
            config.output.push(ModelOutput {
                name: t.name.clone(),
                data_type: data_type(t)?,
                dims,
                reshape,
                ..Default::default()
            });
        }
        changed |= !sig.outputs.is_empty();
    } else {
        for output in &mut config.output {
            if let Some(t) = sig.output(&output.name) {
                changed |= fill(
                    t,
                    batching,
                    &mut output.data_type,
                    &mut output.dims,
                    &mut output.reshape,
                )?;
            }
        }
    }

    if changed && config.max_batch_size > 1 && config.scheduling_choice.is_none() {
        config.scheduling_choice = Some(SchedulingChoice::DynamicBatching(
            ModelDynamicBatching::default(),
        ));
    }
    Ok(())
}

/// Whether some config tensor already lists a model tensor's full shape (batch dim included).
fn config_counts_batch_dim(config: &ModelConfig, sig: &ModelSignature) -> bool {
    let inputs = config
        .input
        .iter()
        .filter(|i| i.reshape.is_none())
        .filter_map(|i| sig.input(&i.name).map(|t| (t, &i.dims)));
    let outputs = config
        .output
        .iter()
        .filter(|o| o.reshape.is_none())
        .filter_map(|o| sig.output(&o.name).map(|t| (t, &o.dims)));
    inputs
        .chain(outputs)
        .any(|(t, dims)| !dims.is_empty() && dims.len() == t.dims.len())
}

/// Fills a missing data type or shape of one config tensor; returns whether anything changed.
fn fill(
    t: &TensorSig,
    batching: bool,
    data_type_field: &mut i32,
    dims: &mut Vec<i64>,
    reshape: &mut Option<ModelTensorReshape>,
) -> Result<bool, String> {
    let mut changed = false;
    if *data_type_field == 0 {
        *data_type_field = data_type(t)?;
        changed = true;
    }
    if dims.is_empty() && reshape.is_none() {
        (*dims, *reshape) = config_dims(t, batching);
        changed = true;
    }
    Ok(changed)
}

fn data_type(t: &TensorSig) -> Result<i32, String> {
    match &t.datatype {
        Ok(dt) => Ok(dt.to_config() as i32),
        Err(what) => Err(format!(
            "model tensor '{}' is {what}, which Triton cannot serve",
            t.name
        )),
    }
}

/// The config `dims` (and `reshape`) for a model tensor, as Triton's auto-complete writes them.
fn config_dims(t: &TensorSig, batching: bool) -> (Vec<i64>, Option<ModelTensorReshape>) {
    let skip = usize::from(batching && !t.dims.is_empty());
    let dims: Vec<i64> = t.dims.iter().skip(skip).copied().collect();
    if dims.is_empty() {
        // A config tensor needs at least one dimension: [1], reshaped to the model's [batch].
        let reshape = batching.then(ModelTensorReshape::default);
        return (vec![1], reshape);
    }
    (dims, None)
}

#[cfg(test)]
mod tests {
    use nereid_proto::DataType;
    use nereid_proto::pb::inference::ModelSequenceBatching;

    use super::*;
    use crate::backend::onnx::signature::sig;

    const F: DataType = DataType::Fp32;

    fn batchable() -> ModelSignature {
        ModelSignature {
            inputs: vec![sig("a", F, &[-1, 4]), sig("s", DataType::Bytes, &[-1, -1])],
            outputs: vec![sig("y", F, &[-1])],
        }
    }

    fn fp32(dims: &[i64]) -> (i32, Vec<i64>) {
        (F.to_config() as i32, dims.to_vec())
    }

    #[test]
    fn empty_config_gets_everything_and_dynamic_batching() {
        let mut c = ModelConfig {
            name: "m".into(),
            ..Default::default()
        };
        complete(&mut c, &batchable(), 4).unwrap();
        assert_eq!(c.max_batch_size, 4);
        assert_eq!(c.input.len(), 2);
        assert_eq!((c.input[0].data_type, c.input[0].dims.clone()), fp32(&[4]));
        assert_eq!(c.input[1].data_type, DataType::Bytes.to_config() as i32);
        assert_eq!(c.input[1].dims, vec![-1]);
        assert_eq!(c.output[0].dims, vec![1]);
        assert_eq!(
            c.output[0].reshape,
            Some(ModelTensorReshape { shape: vec![] })
        );
        assert!(matches!(
            c.scheduling_choice,
            Some(SchedulingChoice::DynamicBatching(_))
        ));
    }

    #[test]
    fn fixed_first_dimension_means_no_batching() {
        let s = ModelSignature {
            inputs: vec![sig("x", F, &[1, 3])],
            outputs: vec![sig("y", F, &[-1, 3])],
        };
        let mut c = ModelConfig::default();
        complete(&mut c, &s, 4).unwrap();
        assert_eq!(c.max_batch_size, 0);
        assert_eq!(c.input[0].dims, vec![1, 3]);
        assert_eq!(c.output[0].dims, vec![-1, 3]);
        assert!(c.scheduling_choice.is_none());
        let mut c = ModelConfig {
            name: "m".into(),
            max_batch_size: 8,
            ..Default::default()
        };
        let err = complete(&mut c, &s, 4).unwrap_err();
        assert!(
            err.contains("model does not support batching while non-zero max_batch_size"),
            "{err}"
        );
    }

    #[test]
    fn partial_entries_are_filled_and_full_rank_dims_keep_batching_off() {
        let mut c = ModelConfig::default();
        c.input.push(ModelInput {
            name: "a".into(),
            dims: vec![-1, 4],
            ..Default::default()
        });
        complete(&mut c, &batchable(), 4).unwrap();
        assert_eq!(
            c.max_batch_size, 0,
            "dims [-1,4] already include the batch dimension"
        );
        assert_eq!(c.input.len(), 1, "existing inputs are not extended");
        assert_eq!(c.input[0].data_type, F.to_config() as i32);
        assert_eq!(c.output[0].dims, vec![-1]);
        assert!(c.scheduling_choice.is_none());
    }

    #[test]
    fn user_batch_size_and_scheduler_are_kept() {
        let mut c = ModelConfig {
            max_batch_size: 16,
            ..Default::default()
        };
        c.scheduling_choice = Some(SchedulingChoice::SequenceBatching(
            ModelSequenceBatching::default(),
        ));
        c.input.push(ModelInput {
            name: "a".into(),
            data_type: F.to_config() as i32,
            ..Default::default()
        });
        complete(&mut c, &batchable(), 4).unwrap();
        assert_eq!(c.max_batch_size, 16);
        assert_eq!(c.input[0].dims, vec![4]);
        assert!(matches!(
            c.scheduling_choice,
            Some(SchedulingChoice::SequenceBatching(_))
        ));
    }

    #[test]
    fn complete_config_is_left_alone() {
        let mut c = ModelConfig {
            max_batch_size: 8,
            ..Default::default()
        };
        let (data_type, dims) = fp32(&[4]);
        c.input.push(ModelInput {
            name: "a".into(),
            data_type,
            dims: dims.clone(),
            ..Default::default()
        });
        c.output.push(ModelOutput {
            name: "y".into(),
            data_type,
            dims,
            ..Default::default()
        });
        let before = c.clone();
        complete(&mut c, &batchable(), 4).unwrap();
        assert_eq!(c, before);
    }

    #[test]
    fn unservable_types_fail() {
        let mut s = batchable();
        s.outputs[0].datatype = Err("an ONNX map".into());
        let err = complete(&mut ModelConfig::default(), &s, 4).unwrap_err();
        assert_eq!(
            err,
            "model tensor 'y' is an ONNX map, which Triton cannot serve"
        );
    }
}
