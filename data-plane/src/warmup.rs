//! Warmup samples: the synthetic requests of a config's `model_warmup` that every instance runs
//! before its model version reports READY. Pure construction; running them is the caller's job.
//!
//! ```text
//!  model_warmup[i] ─► batch_size check ─► per config input: data_type, dims, one data source
//!                  ─► one batch item of data (zeros | random | <model_dir>/warmup/<file>)
//!                  ─► repeated batch_size times ─► Tensor [batch_size, dims...]  (or [dims...])
//! ```
//!
//! Triton's rules: a sample with `batch_size` 0 is skipped; every input of the sample must have
//! all dimensions fixed and exactly one data source; `dims` leave out the batch dimension, and a
//! batch repeats the one item; `count` 0 runs the sample once. A data file holds one batch item
//! (fixed-size types: at least its byte size, the first bytes are used; `BYTES`: 4-byte
//! length-prefixed elements, exactly one item's element count). Random data is random bytes
//! for integers, 0/1 for `BOOL`, finite values in [-1, 1] for floats (Triton's raw random
//! bytes can be NaN); random `BYTES` elements are empty, as in Triton.
//!
//! A `sequence_batching` model's sample also feeds its control and state inputs, as its
//! requests get them: a sample may set them by name, as in Triton (a control's dims are `[1]`,
//! a state's those of its initial value); those it leaves out are generated: START, READY and
//! END true (the sample is a whole sequence), CORRID 0, and the state's initial value.

use std::path::{Component, Path};

use bytes::Bytes;
use nereid_proto::{
    CorrelationId, DataType, Tensor, count_bytes_elements, element_count, format_shape,
};

use crate::config::{InputSpec, ValidModelConfig, WarmupData, WarmupInput, WarmupSetting};
use crate::request_check::{SequenceFlags, dims_match};
use crate::scheduler::sequence::SequencePolicy;

/// The folder under the model directory that holds warmup data files (Triton's `warmup/`).
pub const WARMUP_DATA_FOLDER: &str = "warmup";

/// One warmup request, ready to execute on an instance.
#[derive(Clone, Debug, PartialEq)]
pub struct WarmupSample {
    pub name: String,
    /// One tensor per input the sample sets, in config order; shaped `[batch_size] + dims` when
    /// the model batches.
    pub inputs: Vec<Tensor>,
    /// Every output of the config, in config order.
    pub outputs: Vec<String>,
    /// Times to run (Triton: count 0 means once).
    pub count: u32,
}

/// Builds the samples of the config's `model_warmup`. `model_dir` is `<repo>/<model>`: input_data_file
/// names a file under `<model_dir>/warmup/`. Errors are full sentences naming the model, the
/// sample and the input: they become the model's load failure reason.
pub fn warmup_samples(
    config: &ValidModelConfig,
    model_dir: &Path,
) -> Result<Vec<WarmupSample>, String> {
    let mut samples = Vec::with_capacity(config.warmup.len());
    let sequence = match config.warmup.iter().any(|w| w.batch_size > 0) {
        true => SequencePolicy::load(config, model_dir)?,
        false => None,
    };
    for (index, setting) in config.warmup.iter().enumerate() {
        if setting.batch_size == 0 {
            tracing::debug!(model = %config.name, sample = %setting.name, "skipping batch 0 warmup sample");
            continue;
        }
        let label = if setting.name.is_empty() {
            format!("model '{}' warmup sample #{index}", config.name)
        } else {
            format!("model '{}' warmup sample '{}'", config.name, setting.name)
        };
        let mut sample = sample(config, model_dir, setting, &label)?;
        if let Some(policy) = &sequence {
            let batch_dim = config.batching().then_some(setting.batch_size);
            let generated = sequence_inputs(policy, setting, batch_dim, model_dir, &label)?;
            sample.inputs.extend(generated);
        }
        samples.push(sample);
    }
    Ok(samples)
}

fn sample(
    config: &ValidModelConfig,
    model_dir: &Path,
    setting: &WarmupSetting,
    label: &str,
) -> Result<WarmupSample, String> {
    let batch = setting.batch_size;
    if !config.batching() && batch > 1 {
        return Err(format!(
            "{label}: batch_size {batch} is not allowed because the model does not batch (max_batch_size 0); use batch_size 1"
        ));
    }
    if config.batching() && batch > config.max_batch_size {
        return Err(format!(
            "{label}: batch_size {batch} exceeds the model's max_batch_size {}",
            config.max_batch_size
        ));
    }
    // The inputs are sorted by name, so the first unknown one is the same on every load.
    let fed_by_batcher = |name: &str| {
        config.sequence().is_some_and(|sb| {
            sb.control_inputs.iter().any(|c| c == name)
                || sb.states.iter().any(|s| s.input_name == name)
        })
    };
    let mut unknown = setting
        .inputs
        .keys()
        .filter(|name| config.input(name).is_none() && !fed_by_batcher(name));
    if let Some(name) = unknown.next() {
        return Err(format!(
            "{label}: input '{name}' is not an input of the model"
        ));
    }
    let batch_dim = config.batching().then_some(batch);
    let mut inputs = Vec::with_capacity(setting.inputs.len());
    for spec in &config.inputs {
        match setting.inputs.get(&spec.name) {
            Some(warmup) => {
                let label = format!("{label} input '{}'", spec.name);
                inputs.push(input_tensor(spec, warmup, batch_dim, model_dir, &label)?);
            }
            None if spec.optional => {}
            None => {
                return Err(format!(
                    "{label}: the model's required input '{}' is missing from the sample",
                    spec.name
                ));
            }
        }
    }
    Ok(WarmupSample {
        name: setting.name.clone(),
        inputs,
        outputs: config.outputs.iter().map(|o| o.name.clone()).collect(),
        count: setting.count.max(1),
    })
}

/// The control and state inputs of a sequence model's sample: those the sample sets, else the
/// batcher's own for a one-request sequence (START, READY, END; CORRID 0; the initial state),
/// repeated `batch` times.
fn sequence_inputs(
    policy: &SequencePolicy,
    setting: &WarmupSetting,
    batch: Option<u32>,
    model_dir: &Path,
    label: &str,
) -> Result<Vec<Tensor>, String> {
    let whole = SequenceFlags {
        id: CorrelationId::Uint(0),
        start: true,
        end: true,
    };
    let generated = policy
        .control_inputs(&whole)
        .into_iter()
        .chain(policy.initial_states());
    let mut inputs = Vec::new();
    for tensor in generated {
        let name = tensor.name().to_string();
        let tensor = match setting.inputs.get(&name) {
            Some(warmup) => {
                // Shaped as the batcher shapes it: one item is the tensor without its batch
                // dimension.
                let item_dims = match batch {
                    Some(_) => tensor.shape().get(1..).unwrap_or(&[]).to_vec(),
                    None => tensor.shape().to_vec(),
                };
                let spec = InputSpec {
                    name: name.clone(),
                    datatype: tensor.datatype(),
                    dims: item_dims,
                    reshape: None,
                    optional: false,
                    allow_ragged_batch: false,
                };
                let label = format!("{label} input '{name}'");
                input_tensor(&spec, warmup, batch, model_dir, &label)?
            }
            None => repeat_item(tensor, batch).map_err(|e| format!("{label}: {e}"))?,
        };
        inputs.push(tensor);
    }
    Ok(inputs)
}

/// A tensor of one batch item (batch dimension 1 when `batch` is set) repeated `batch` times.
fn repeat_item(tensor: Tensor, batch: Option<u32>) -> Result<Tensor, String> {
    let Some(b) = batch else {
        return Ok(tensor);
    };
    let mut shape = tensor.shape().to_vec();
    if let Some(first) = shape.first_mut() {
        *first = i64::from(b);
    }
    let data = tensor.data().repeat(b as usize);
    Tensor::new(tensor.name(), tensor.datatype(), shape, Bytes::from(data))
        .map_err(|e| e.message().to_string())
}

/// The tensor for one input of a sample; `batch` is the batch dimension to prepend, if any.
fn input_tensor(
    spec: &InputSpec,
    warmup: &WarmupInput,
    batch: Option<u32>,
    model_dir: &Path,
    label: &str,
) -> Result<Tensor, String> {
    let Some(datatype) = warmup.datatype else {
        return Err(format!("{label}: data_type must be set"));
    };
    if datatype != spec.datatype {
        return Err(format!(
            "{label}: data_type {} does not match the model input's {}",
            datatype.to_config().as_str_name(),
            spec.datatype.to_config().as_str_name()
        ));
    }
    if warmup.dims.iter().any(|&d| d < 0) {
        return Err(format!(
            "{label}: dims {} must have every dimension specified (no -1)",
            format_shape(&warmup.dims)
        ));
    }
    if !dims_match(&spec.dims, &warmup.dims) {
        return Err(format!(
            "{label}: dims {} do not match the model input's dims {} (leave out the batch dimension)",
            format_shape(&warmup.dims),
            format_shape(&spec.dims)
        ));
    }
    let count =
        element_count(&warmup.dims).ok_or_else(|| format!("{label}: dims are too large"))?;
    let item = match &warmup.data {
        None => {
            return Err(format!(
                "{label}: set one of zero_data, random_data or input_data_file"
            ));
        }
        Some(WarmupData::Zero) => zero_item(datatype, count),
        Some(WarmupData::Random) => random_item(datatype, count, label),
        Some(WarmupData::File(file)) => file_item(datatype, count, model_dir, file, label)?,
    };
    let mut shape = Vec::with_capacity(warmup.dims.len() + 1);
    let data = match batch {
        Some(b) => {
            shape.push(i64::from(b));
            item.repeat(b as usize)
        }
        None => item,
    };
    shape.extend_from_slice(&warmup.dims);
    Tensor::new(spec.name.as_str(), datatype, shape, Bytes::from(data))
        .map_err(|e| format!("{label}: {}", e.message()))
}

/// Zeros; for `BYTES`, empty elements (a zero length prefix each).
fn zero_item(datatype: DataType, count: usize) -> Vec<u8> {
    vec![0u8; count * datatype.element_size().unwrap_or(4)]
}

/// Random data for one item, seeded from the label so a sample is the same on every load.
fn random_item(datatype: DataType, count: usize, label: &str) -> Vec<u8> {
    let mut rng = XorShift::seeded(label);
    let mut out = Vec::with_capacity(count * datatype.element_size().unwrap_or(4));
    for _ in 0..count {
        match datatype {
            DataType::Bytes => out.extend_from_slice(&0u32.to_le_bytes()),
            DataType::Bool => out.push((rng.next() & 1) as u8),
            DataType::Fp32 => out.extend_from_slice(&(rng.unit() as f32).to_le_bytes()),
            DataType::Fp64 => out.extend_from_slice(&rng.unit().to_le_bytes()),
            DataType::Fp16 => out.extend_from_slice(&half::f16::from_f64(rng.unit()).to_le_bytes()),
            DataType::Bf16 => {
                out.extend_from_slice(&half::bf16::from_f64(rng.unit()).to_le_bytes())
            }
            DataType::Uint8
            | DataType::Int8
            | DataType::Uint16
            | DataType::Int16
            | DataType::Uint32
            | DataType::Int32
            | DataType::Uint64
            | DataType::Int64 => {
                let size = datatype.element_size().unwrap_or(1);
                out.extend_from_slice(&rng.next().to_le_bytes()[..size]);
            }
        }
    }
    out
}

/// One item of data read from `<model_dir>/warmup/<file>`.
fn file_item(
    datatype: DataType,
    count: usize,
    model_dir: &Path,
    file: &str,
    label: &str,
) -> Result<Vec<u8>, String> {
    let relative = Path::new(file);
    let inside = !file.is_empty()
        && relative
            .components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
    if !inside {
        return Err(format!(
            "{label}: input_data_file '{file}' must be a relative path inside the model's '{WARMUP_DATA_FOLDER}/' folder"
        ));
    }
    let path = model_dir.join(WARMUP_DATA_FOLDER).join(relative);
    let mut data = std::fs::read(&path).map_err(|e| {
        format!(
            "{label}: cannot read input_data_file '{}': {e}",
            path.display()
        )
    })?;
    match datatype.element_size() {
        Some(size) => {
            let needed = count * size;
            if data.len() < needed {
                return Err(format!(
                    "{label}: {datatype} dims of {count} element(s) need {needed} bytes, but input_data_file '{file}' has only {}",
                    data.len()
                ));
            }
            data.truncate(needed);
        }
        None => match count_bytes_elements(&data) {
            Some(found) if found == count => {}
            Some(found) => {
                return Err(format!(
                    "{label}: BYTES dims need {count} element(s), but input_data_file '{file}' holds {found}"
                ));
            }
            None => {
                return Err(format!(
                    "{label}: input_data_file '{file}' is not BYTES data: each element must be a 4-byte little-endian length followed by that many bytes"
                ));
            }
        },
    }
    Ok(data)
}

/// xorshift64*: small, fast, deterministic; plenty for warmup data.
struct XorShift(u64);

impl XorShift {
    /// Seeds from the FNV-1a hash of `seed` (never zero, which would stick).
    fn seeded(seed: &str) -> XorShift {
        let hash = seed.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        XorShift(hash.max(1))
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
    }
}

#[cfg(test)]
mod tests;
