//! Model metadata → the input tensors of each request, built once before any load is applied.
//!
//! ```text
//! ModelInfo (metadata + max_batch_size) ─┐
//! --shape NAME:d1,d2 ────────────────────┼─► per-input element shape (no batch dim)
//! --input-data random|zero|FILE ─────────┘        │ one batch element's data, repeated -b times
//!                                                 ▼
//!                          Vec<Step>: each step is one request's tensors (file: one per entry)
//! ```
//!
//! perf_analyzer conventions: `--shape` and a file entry's `shape` exclude the batch dimension,
//! and a file entry holds one batch element.

use std::collections::HashMap;
use std::path::PathBuf;

use bytes::Bytes;
use nereid_proto::{DataType, format_shape};
use serde_json::Value;

use crate::elements;
use crate::rng::SplitMix64;

/// One input or output as model metadata lists it (batch dimension as -1).
#[derive(Clone, Debug, PartialEq)]
pub struct TensorSpec {
    pub name: String,
    pub datatype: String,
    pub shape: Vec<i64>,
}

/// What the load generator needs to know about a model.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelInfo {
    pub name: String,
    pub inputs: Vec<TensorSpec>,
    pub outputs: Vec<TensorSpec>,
    /// From the model config when the server has the configuration extension; `None` for
    /// servers without it (then batching is guessed from the metadata shapes).
    pub max_batch_size: Option<i64>,
}

impl ModelInfo {
    /// Whether inputs carry a leading batch dimension.
    pub fn batching(&self) -> bool {
        match self.max_batch_size {
            Some(m) => m > 0,
            None => {
                !self.inputs.is_empty() && self.inputs.iter().all(|i| i.shape.first() == Some(&-1))
            }
        }
    }
}

/// One input tensor, ready to encode: full shape (with batch dimension) and raw bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct InputTensor {
    pub name: String,
    pub datatype: DataType,
    pub shape: Vec<i64>,
    pub data: Bytes,
}

/// The tensors of one request.
pub type Step = Vec<InputTensor>;

/// Where input values come from.
#[derive(Clone, Debug, PartialEq)]
pub enum DataSource {
    Random,
    Zero,
    File(PathBuf),
}

impl DataSource {
    /// `random`, `zero` (or `zeros`), anything else is a file path.
    pub fn parse(text: &str) -> DataSource {
        match text {
            "random" => DataSource::Random,
            "zero" | "zeros" => DataSource::Zero,
            path => DataSource::File(PathBuf::from(path)),
        }
    }
}

/// How to build inputs.
#[derive(Clone, Debug)]
pub struct InputOptions {
    pub batch_size: u32,
    /// `--shape` values by input name (without the batch dimension).
    pub shapes: HashMap<String, Vec<i64>>,
    pub source: DataSource,
    pub seed: u64,
    pub string_length: usize,
}

/// Builds the request steps for `model`: one for random or zero data, one per file entry.
pub fn build_steps(model: &ModelInfo, options: &InputOptions) -> Result<Vec<Step>, String> {
    if model.inputs.is_empty() {
        return Err(format!(
            "model '{}' has no inputs in its metadata",
            model.name
        ));
    }
    for name in options.shapes.keys() {
        if !model.inputs.iter().any(|i| &i.name == name) {
            return Err(format!(
                "--shape names input '{name}', but model '{}' has inputs {}",
                model.name,
                input_names(model)
            ));
        }
    }
    let batching = model.batching();
    if !batching && options.batch_size != 1 {
        return Err(format!(
            "model '{}' does not support batching (max_batch_size 0); use -b 1",
            model.name
        ));
    }
    if let Some(max) = model.max_batch_size.filter(|m| *m > 0)
        && i64::from(options.batch_size) > max
    {
        return Err(format!(
            "-b {} exceeds model '{}' max_batch_size {max}",
            options.batch_size, model.name
        ));
    }
    match &options.source {
        DataSource::Random | DataSource::Zero => {
            let mut rng = SplitMix64::new(options.seed);
            let step = model
                .inputs
                .iter()
                .map(|spec| {
                    let dtype = datatype(spec)?;
                    let dims = element_dims(spec, batching, options.shapes.get(&spec.name), None)?;
                    let count = element_count(&dims) * options.batch_size as usize;
                    let mut data = Vec::new();
                    if options.source == DataSource::Zero {
                        elements::push_zeros(&mut data, dtype, count);
                    } else {
                        elements::push_random(
                            &mut data,
                            dtype,
                            count,
                            &mut rng,
                            options.string_length,
                        );
                    }
                    Ok(tensor(
                        spec,
                        dtype,
                        batching,
                        options.batch_size,
                        dims,
                        data,
                    ))
                })
                .collect::<Result<Step, String>>()?;
            Ok(vec![step])
        }
        DataSource::File(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("--input-data '{}': {e}", path.display()))?;
            steps_from_json(model, options, batching, &text)
                .map_err(|e| format!("--input-data '{}': {e}", path.display()))
        }
    }
}

/// Parses perf_analyzer's input-data JSON: `{"data":[{"NAME": [..] | {"content":[..],
/// "shape":[..]}, ...}, ...]}`. Each entry must give every model input.
pub fn steps_from_json(
    model: &ModelInfo,
    options: &InputOptions,
    batching: bool,
    text: &str,
) -> Result<Vec<Step>, String> {
    let doc: Value = serde_json::from_str(text).map_err(|e| format!("not valid JSON: {e}"))?;
    let Some(entries) = doc.get("data").and_then(Value::as_array) else {
        return Err("expected an object with a \"data\" array".into());
    };
    if entries.is_empty() {
        return Err("\"data\" is empty".into());
    }
    entries
        .iter()
        .enumerate()
        .map(|(i, entry)| {
            let Some(entry) = entry.as_object() else {
                return Err(format!("data[{i}] is not an object of input names"));
            };
            model
                .inputs
                .iter()
                .map(|spec| {
                    let value = entry.get(&spec.name).ok_or_else(|| {
                        format!("data[{i}] has no value for input '{}'", spec.name)
                    })?;
                    entry_tensor(spec, value, options, batching).map_err(|e| match e {
                        EntryError::NamesInput(e) => format!("data[{i}] {e}"),
                        EntryError::Value(e) => format!("data[{i}] input '{}': {e}", spec.name),
                    })
                })
                .collect::<Result<Step, String>>()
        })
        .collect()
}

/// Why one entry of an `--input-data` file cannot be made into an input tensor; the caller
/// prefixes the entry's index, and the input's name unless the message already starts with it.
enum EntryError {
    /// A message that starts with `input 'NAME'` (shared with the flag-driven path).
    NamesInput(String),
    /// A message about the value alone.
    Value(String),
}

impl From<String> for EntryError {
    fn from(message: String) -> Self {
        EntryError::Value(message)
    }
}

impl From<&str> for EntryError {
    fn from(message: &str) -> Self {
        EntryError::Value(message.to_string())
    }
}

fn entry_tensor(
    spec: &TensorSpec,
    value: &Value,
    options: &InputOptions,
    batching: bool,
) -> Result<InputTensor, EntryError> {
    let dtype = datatype(spec).map_err(EntryError::NamesInput)?;
    let (content, file_shape) = match value {
        Value::Object(o) => {
            if o.contains_key("b64") {
                return Err("\"b64\" content is not supported; give \"content\" as values".into());
            }
            let content = o
                .get("content")
                .ok_or("expected \"content\" (and optionally \"shape\")")?;
            let shape = match o.get("shape") {
                None => None,
                Some(s) => Some(
                    s.as_array()
                        .and_then(|a| a.iter().map(Value::as_i64).collect::<Option<Vec<i64>>>())
                        .filter(|d| d.iter().all(|x| *x >= 0))
                        .ok_or("\"shape\" must be an array of non-negative integers")?,
                ),
            };
            (content, shape)
        }
        other => (other, None),
    };
    let mut values = Vec::new();
    elements::flatten(content, &mut values);
    let dims = match file_shape {
        Some(s) => element_dims(spec, batching, Some(&s), None),
        None => element_dims(
            spec,
            batching,
            options.shapes.get(&spec.name),
            Some(values.len()),
        ),
    }
    .map_err(EntryError::NamesInput)?;
    if values.len() != element_count(&dims) {
        return Err(EntryError::Value(format!(
            "{} values given, shape {} needs {}",
            values.len(),
            format_shape(&dims),
            element_count(&dims)
        )));
    }
    let one = elements::json_to_bytes(dtype, &values)?;
    let data = one.repeat(options.batch_size as usize);
    Ok(tensor(
        spec,
        dtype,
        batching,
        options.batch_size,
        dims,
        data,
    ))
}

fn datatype(spec: &TensorSpec) -> Result<DataType, String> {
    DataType::from_wire(&spec.datatype).ok_or_else(|| {
        format!(
            "input '{}' has datatype '{}', which this tool does not know",
            spec.name, spec.datatype
        )
    })
}

/// The input's shape without the batch dimension: the model's dims, with variable (-1) dims
/// taken from `given` (`--shape` or the file), or inferred from `value_count` when exactly one
/// dim is variable.
fn element_dims(
    spec: &TensorSpec,
    batching: bool,
    given: Option<&Vec<i64>>,
    value_count: Option<usize>,
) -> Result<Vec<i64>, String> {
    let model_dims: &[i64] = if batching {
        spec.shape.get(1..).unwrap_or(&[])
    } else {
        &spec.shape
    };
    if let Some(given) = given {
        let compatible = given.len() == model_dims.len()
            && given.iter().zip(model_dims).all(|(g, m)| *m < 0 || g == m);
        if !compatible {
            return Err(format!(
                "input '{}': shape {} does not fit the model's dims {} (batch dimension excluded)",
                spec.name,
                format_shape(given),
                format_shape(model_dims)
            ));
        }
        return Ok(given.clone());
    }
    let variable = model_dims.iter().filter(|d| **d < 0).count();
    if variable == 0 {
        return Ok(model_dims.to_vec());
    }
    if variable == 1
        && let Some(count) = value_count
    {
        let fixed: usize = element_count(
            &model_dims
                .iter()
                .copied()
                .filter(|d| *d >= 0)
                .collect::<Vec<_>>(),
        );
        if fixed > 0 && count % fixed == 0 {
            let inferred = (count / fixed) as i64;
            return Ok(model_dims
                .iter()
                .map(|d| if *d < 0 { inferred } else { *d })
                .collect());
        }
    }
    Err(format!(
        "input '{}' has variable dims {}; give them with --shape {}:{}",
        spec.name,
        format_shape(model_dims),
        spec.name,
        model_dims
            .iter()
            .map(|d| if *d < 0 {
                "N".to_string()
            } else {
                d.to_string()
            })
            .collect::<Vec<_>>()
            .join(",")
    ))
}

fn element_count(dims: &[i64]) -> usize {
    dims.iter()
        .map(|d| usize::try_from(*d).unwrap_or(0))
        .product()
}

fn tensor(
    spec: &TensorSpec,
    datatype: DataType,
    batching: bool,
    batch_size: u32,
    dims: Vec<i64>,
    data: Vec<u8>,
) -> InputTensor {
    let shape = if batching {
        std::iter::once(i64::from(batch_size)).chain(dims).collect()
    } else {
        dims
    };
    InputTensor {
        name: spec.name.clone(),
        datatype,
        shape,
        data: Bytes::from(data),
    }
}

fn input_names(model: &ModelInfo) -> String {
    let names: Vec<&str> = model.inputs.iter().map(|i| i.name.as_str()).collect();
    format!("[{}]", names.join(", "))
}

/// Reads `--shape` flags into a map, refusing an input named twice.
pub fn shape_map(flags: &[String]) -> Result<HashMap<String, Vec<i64>>, String> {
    let mut map = HashMap::new();
    for flag in flags {
        let (name, dims) = crate::cli::parse_shape(flag)?;
        if map.insert(name.clone(), dims).is_some() {
            return Err(format!("--shape given twice for input '{name}'"));
        }
    }
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn simple(max_batch: Option<i64>) -> ModelInfo {
        let spec = |n: &str, dt: &str, shape: Vec<i64>| TensorSpec {
            name: n.into(),
            datatype: dt.into(),
            shape,
        };
        ModelInfo {
            name: "m".into(),
            inputs: vec![
                spec("A", "INT32", vec![-1, 4]),
                spec("B", "FP32", vec![-1, -1]),
            ],
            outputs: vec![spec("Y", "FP32", vec![-1, 4])],
            max_batch_size: max_batch,
        }
    }

    fn options(source: DataSource, batch: u32, shapes: &[(&str, Vec<i64>)]) -> InputOptions {
        InputOptions {
            batch_size: batch,
            shapes: shapes
                .iter()
                .map(|(n, d)| (n.to_string(), d.clone()))
                .collect(),
            source,
            seed: 3,
            string_length: 4,
        }
    }

    #[test]
    fn random_inputs_need_variable_dims() {
        let err = build_steps(&simple(Some(8)), &options(DataSource::Random, 2, &[])).unwrap_err();
        assert!(err.contains("--shape B:N"), "{err}");
        let steps = build_steps(
            &simple(Some(8)),
            &options(DataSource::Random, 2, &[("B", vec![3])]),
        )
        .unwrap();
        assert_eq!(steps.len(), 1);
        assert_eq!(steps[0][0].shape, vec![2, 4]);
        assert_eq!(steps[0][0].data.len(), 2 * 4 * 4);
        assert_eq!(steps[0][1].shape, vec![2, 3]);
        // Seeded: the same seed gives the same data.
        let again = build_steps(
            &simple(Some(8)),
            &options(DataSource::Random, 2, &[("B", vec![3])]),
        )
        .unwrap();
        assert_eq!(steps, again);
    }

    #[test]
    fn batching_rules() {
        let zero = options(DataSource::Zero, 2, &[("B", vec![1])]);
        let no_batch = ModelInfo {
            max_batch_size: Some(0),
            ..simple(None)
        };
        assert!(
            build_steps(&no_batch, &zero)
                .unwrap_err()
                .contains("does not support batching")
        );
        assert!(
            build_steps(&simple(Some(1)), &zero)
                .unwrap_err()
                .contains("max_batch_size 1")
        );
        // Without a config, a leading -1 on every input means batching.
        assert!(simple(None).batching());
        assert!(build_steps(&simple(None), &zero).is_ok());
        let bad = options(DataSource::Zero, 1, &[("C", vec![1])]);
        assert!(
            build_steps(&simple(Some(8)), &bad)
                .unwrap_err()
                .contains("'C'")
        );
        let rank = options(DataSource::Zero, 1, &[("A", vec![5])]);
        assert!(
            build_steps(&simple(Some(8)), &rank)
                .unwrap_err()
                .contains("does not fit")
        );
    }

    #[test]
    fn input_data_json() {
        let text = r#"{"data":[
            {"A":[1,2,3,4], "B":{"content":[[1.0,2.0],[3.0,4.0]],"shape":[4]}},
            {"A":[[5,6,7,8]], "B":[0.5,0.25,1.0]}
        ]}"#;
        let model = simple(Some(8));
        let steps =
            steps_from_json(&model, &options(DataSource::Zero, 2, &[]), true, text).unwrap();
        assert_eq!(steps.len(), 2);
        assert_eq!(steps[0][0].shape, vec![2, 4]);
        assert_eq!(&steps[0][0].data[..4], &1i32.to_le_bytes());
        assert_eq!(
            &steps[0][0].data[16..20],
            &1i32.to_le_bytes(),
            "repeated per batch element"
        );
        assert_eq!(steps[0][1].shape, vec![2, 4]);
        assert_eq!(
            steps[1][1].shape,
            vec![2, 3],
            "one variable dim inferred from the count"
        );
        assert_eq!(&steps[1][1].data[..4], &0.5f32.to_le_bytes());
    }

    #[test]
    fn input_data_json_errors() {
        let model = simple(Some(8));
        let o = options(DataSource::Zero, 1, &[]);
        let err = |t: &str| steps_from_json(&model, &o, true, t).unwrap_err();
        assert!(err("nope").contains("not valid JSON"));
        assert!(err(r#"{"x":1}"#).contains("\"data\""));
        assert!(err(r#"{"data":[{"A":[1,2,3,4]}]}"#).contains("no value for input 'B'"));
        assert!(err(r#"{"data":[{"A":[1,2,3],"B":[1]}]}"#).contains("3 values given"));
        assert!(err(r#"{"data":[{"A":[1,2,3,"x"],"B":[1]}]}"#).contains("\"x\""));
        assert!(err(r#"{"data":[{"A":[1,2,3,4],"B":{"b64":"AAAA"}}]}"#).contains("b64"));
        let e = err(r#"{"data":[{"A":[1,2,3,4],"B":{"content":[1],"shape":[1,1]}}]}"#);
        assert!(
            e.starts_with("data[0] input 'B': shape [1,1] does not fit"),
            "{e}"
        );
    }

    #[test]
    fn shape_flags() {
        let m = shape_map(&["A:1,2".into(), "B:3".into()]).unwrap();
        assert_eq!(m["A"], vec![1, 2]);
        assert!(shape_map(&["A:1".into(), "A:2".into()]).is_err());
        assert_eq!(DataSource::parse("zero"), DataSource::Zero);
        assert_eq!(
            DataSource::parse("x.json"),
            DataSource::File("x.json".into())
        );
    }
}
