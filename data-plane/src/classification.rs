//! Triton's classification extension: an output asked for with `classification: k` comes back
//! as the top k classes of each batch entry, as a `BYTES` tensor of `value:index[:label]`.
//!
//! ```text
//! model load ─► Labels::load (each output's label_filename, one label per line)
//! request    ─► request_check: classification k per output (Classify)
//! answer     ─► apply(outputs, classify, labels, batching)
//!                 per output asked for: per batch entry, its elements sorted by value
//!                 (highest first), the first k as "value:index[:label]" ─► [batch, k] BYTES
//! ```
//!
//! Formatting follows Triton: values as C++'s `std::to_string` prints them (`%f`, six decimals,
//! for floating point; plain decimal for integers), the class index within the batch entry,
//! and the label when the output has a label file with a non-empty line at that index. `k`
//! above the entry's element count is clamped to it. FP16, BF16, BOOL and BYTES outputs cannot
//! be classified (Triton's message). Equal values keep index order (Triton's sort is an
//! insertion sort, hence stable, for entries of up to 16 elements; beyond that Triton's order
//! of ties is unspecified).

use std::collections::{BTreeMap, HashMap};
use std::path::{Component, Path};

use bytes::Bytes;
use nereid_proto::{DataType, ServiceError, Tensor, push_bytes_element};

use crate::config::ValidModelConfig;

/// The top-k count asked for per output name.
pub(crate) type Classify = BTreeMap<String, usize>;

/// Each output's class labels (outputs without a label file are absent).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Labels {
    by_output: HashMap<String, Vec<String>>,
}

impl Labels {
    /// Reads the label file of every output that names one, relative to the model directory
    /// `model_dir`. `Err` is the load failure reason, with Triton's wording.
    pub fn load(config: &ValidModelConfig, model_dir: &Path) -> Result<Labels, String> {
        let mut by_output = HashMap::new();
        for output in &config.outputs {
            let Some(file) = &output.label_filename else {
                continue;
            };
            let path = model_dir.join(file);
            if escapes(Path::new(file)) {
                return Err(format!(
                    "label file path '{}' for output '{}' in model '{}' is outside model directory",
                    path.display(),
                    output.name,
                    config.name
                ));
            }
            let text = std::fs::read(&path).map_err(|e| {
                format!(
                    "failed to open text file for read {}: {}",
                    path.display(),
                    io_reason(&e)
                )
            })?;
            by_output.insert(output.name.clone(), lines(&String::from_utf8_lossy(&text)));
        }
        Ok(Labels { by_output })
    }

    /// Labels from memory, for tests.
    #[cfg(test)]
    pub(crate) fn from_pairs(pairs: &[(&str, &[&str])]) -> Labels {
        Labels {
            by_output: pairs
                .iter()
                .map(|(o, l)| (o.to_string(), l.iter().map(|s| s.to_string()).collect()))
                .collect(),
        }
    }

    /// The label of class `index` of `output`, if there is a non-empty one.
    fn label(&self, output: &str, index: usize) -> Option<&str> {
        self.by_output
            .get(output)
            .and_then(|l| l.get(index))
            .map(String::as_str)
            .filter(|l| !l.is_empty())
    }
}

/// Whether a relative label path leaves the model directory (absolute, or `..` beyond it).
fn escapes(file: &Path) -> bool {
    let mut depth: i64 = 0;
    for c in file.components() {
        match c {
            Component::Prefix(_) | Component::RootDir => return true,
            Component::ParentDir => depth -= 1,
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
        }
        if depth < 0 {
            return true;
        }
    }
    false
}

/// The C library's wording of an I/O error (what Triton's `strerror` prints).
fn io_reason(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "No such file or directory".to_string(),
        std::io::ErrorKind::PermissionDenied => "Permission denied".to_string(),
        _ => e.to_string(),
    }
}

/// A file's lines as C++'s `std::getline` reads them: split at `\n`, no empty last line for a
/// final newline.
fn lines(text: &str) -> Vec<String> {
    let mut lines: Vec<String> = text.split('\n').map(str::to_string).collect();
    if text.is_empty() || text.ends_with('\n') {
        lines.pop();
    }
    lines
}

/// Reads the `classification` parameter of a requested output: `None` when absent, the
/// count when it is a positive integer, else Triton's message.
pub(crate) fn requested_count(
    parameters: &nereid_proto::Parameters,
) -> Result<Option<usize>, ServiceError> {
    use nereid_proto::ParamValue;
    let Some(value) = parameters.get("classification") else {
        return Ok(None);
    };
    let count = match value {
        ParamValue::Int(n) => i128::from(*n),
        ParamValue::Uint(n) => i128::from(*n),
        ParamValue::Bool(_) | ParamValue::Double(_) | ParamValue::String(_) => {
            return Err(ServiceError::invalid(
                "invalid value type for 'classification' parameter, expected int64_param",
            ));
        }
    };
    if count <= 0 {
        return Err(ServiceError::invalid(
            "invalid value for 'classification' parameter, expected >= 0",
        ));
    }
    Ok(Some(usize::try_from(count).unwrap_or(usize::MAX)))
}

/// Replaces each output named in `classify` by its top-k classification. `batching`: the
/// model's tensors carry a batch dimension (each batch entry is classified on its own).
pub(crate) fn apply(
    outputs: Vec<Tensor>,
    classify: &Classify,
    labels: &Labels,
    batching: bool,
) -> Result<Vec<Tensor>, ServiceError> {
    if classify.is_empty() {
        return Ok(outputs);
    }
    outputs
        .into_iter()
        .map(|t| match classify.get(t.name()) {
            Some(&k) => classify_tensor(&t, k, labels, batching),
            None => Ok(t),
        })
        .collect()
}

fn classify_tensor(
    tensor: &Tensor,
    k: usize,
    labels: &Labels,
    batching: bool,
) -> Result<Tensor, ServiceError> {
    let datatype = tensor.datatype();
    let values = Values::of(datatype).ok_or_else(|| {
        ServiceError::invalid(format!(
            "class result not available for output due to unsupported type '{}'",
            datatype.as_wire()
        ))
    })?;
    let shape = tensor.shape();
    let batch = if batching && !shape.is_empty() {
        Some(usize::try_from(shape[0]).unwrap_or(0))
    } else {
        None
    };
    let row_shape = if batch.is_some() { &shape[1..] } else { shape };
    let row_len = nereid_proto::element_count(row_shape).unwrap_or(0);
    let data = tensor.data();
    let total = data.len() / values.size;
    let mut out = Vec::new();
    let mut count = 0usize;
    for row in 0..batch.unwrap_or(0).max(1) {
        let start = row * row_len;
        // Triton classifies nothing of an entry whose data is not all there.
        let len = if start + row_len > total { 0 } else { row_len };
        let row_values: Vec<Value> = (start..start + len)
            .map(|i| values.read(&data[i * values.size..(i + 1) * values.size]))
            .collect();
        for entry in top_k(&row_values, k, |i| labels.label(tensor.name(), i)) {
            push_bytes_element(&mut out, entry.as_bytes());
            count += 1;
        }
    }
    let width = k.min(row_len) as i64;
    let out_shape = match batch {
        Some(b) if b > 0 => vec![b as i64, width],
        _ => vec![width],
    };
    if nereid_proto::element_count(&out_shape) != Some(count) {
        return Err(ServiceError::internal(format!(
            "output '{}': its data does not fill its shape {}, so it cannot be classified",
            tensor.name(),
            nereid_proto::format_shape(shape)
        )));
    }
    Tensor::new(tensor.name(), DataType::Bytes, out_shape, Bytes::from(out))
}

/// The first `k` classes of one batch entry, highest value first (ties in index order), each
/// as `value:index[:label]`.
fn top_k<'a>(values: &[Value], k: usize, label: impl Fn(usize) -> Option<&'a str>) -> Vec<String> {
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by(|&a, &b| values[b].cmp_desc(&values[a]));
    order
        .into_iter()
        .take(k)
        .map(|i| {
            let mut s = format!("{}:{i}", values[i].text());
            if let Some(l) = label(i) {
                s.push(':');
                s.push_str(l);
            }
            s
        })
        .collect()
}

/// One element, as wide as its type allows.
#[derive(Clone, Copy, Debug)]
enum Value {
    Signed(i64),
    Unsigned(u64),
    Float(f64),
}

impl Value {
    /// Ordering for "greater first": `self` before `other` when greater. NaN compares equal to
    /// everything, so it stays where it is among its neighbours.
    fn cmp_desc(&self, other: &Value) -> std::cmp::Ordering {
        use std::cmp::Ordering;
        match (self, other) {
            (Value::Signed(a), Value::Signed(b)) => a.cmp(b),
            (Value::Unsigned(a), Value::Unsigned(b)) => a.cmp(b),
            (Value::Float(a), Value::Float(b)) => a.partial_cmp(b).unwrap_or(Ordering::Equal),
            _ => Ordering::Equal,
        }
    }

    /// C++'s `std::to_string`: integers in decimal, floating point as `%f`.
    fn text(&self) -> String {
        match self {
            Value::Signed(v) => v.to_string(),
            Value::Unsigned(v) => v.to_string(),
            Value::Float(v) => printf_f(*v),
        }
    }
}

/// `printf("%f", v)` as glibc prints it: six decimals, `inf`, `-inf`, `nan`, `-nan`.
fn printf_f(v: f64) -> String {
    if v.is_nan() {
        if v.is_sign_negative() { "-nan" } else { "nan" }.to_string()
    } else if v.is_infinite() {
        if v < 0.0 { "-inf" } else { "inf" }.to_string()
    } else {
        format!("{v:.6}")
    }
}

/// How to read elements of a classifiable type.
struct Values {
    datatype: DataType,
    size: usize,
}

impl Values {
    fn of(datatype: DataType) -> Option<Values> {
        let classifiable = match datatype {
            DataType::Uint8
            | DataType::Uint16
            | DataType::Uint32
            | DataType::Uint64
            | DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::Fp32
            | DataType::Fp64 => true,
            DataType::Bool | DataType::Fp16 | DataType::Bf16 | DataType::Bytes => false,
        };
        let size = datatype.element_size()?;
        classifiable.then_some(Values { datatype, size })
    }

    /// One little-endian element (`b` is exactly one element long).
    fn read(&self, b: &[u8]) -> Value {
        let mut buf = [0u8; 8];
        buf[..b.len()].copy_from_slice(b);
        let unsigned = u64::from_le_bytes(buf);
        // Sign-extends a `bits`-wide two's complement value.
        let signed = |bits: u32| ((unsigned << (64 - bits)) as i64) >> (64 - bits);
        match self.datatype {
            DataType::Int8 => Value::Signed(signed(8)),
            DataType::Int16 => Value::Signed(signed(16)),
            DataType::Int32 => Value::Signed(signed(32)),
            DataType::Int64 => Value::Signed(unsigned as i64),
            DataType::Fp32 => Value::Float(f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]]))),
            DataType::Fp64 => Value::Float(f64::from_le_bytes(buf)),
            DataType::Uint8
            | DataType::Uint16
            | DataType::Uint32
            | DataType::Uint64
            | DataType::Bool
            | DataType::Fp16
            | DataType::Bf16
            | DataType::Bytes => Value::Unsigned(unsigned),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nereid_proto::bytes_elements;

    fn tensor(name: &str, datatype: DataType, shape: Vec<i64>, data: Vec<u8>) -> Tensor {
        Tensor::new(name, datatype, shape, Bytes::from(data)).unwrap()
    }

    fn f32s(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    fn strings(t: &Tensor) -> Vec<String> {
        bytes_elements(t.data())
            .map(|e| String::from_utf8(e.to_vec()).unwrap())
            .collect()
    }

    fn classify(pairs: &[(&str, usize)]) -> Classify {
        pairs.iter().map(|(n, k)| (n.to_string(), *k)).collect()
    }

    #[test]
    fn top_k_of_fp32_with_labels_as_triton_formats_them() {
        let t = tensor("y", DataType::Fp32, vec![4], f32s(&[0.1, 0.7, 0.5, 0.25]));
        let labels = Labels::from_pairs(&[("y", &["cat", "dog", "", "fish"])]);
        let out = apply(vec![t], &classify(&[("y", 3)]), &labels, false).unwrap();
        assert_eq!(out[0].datatype(), DataType::Bytes);
        assert_eq!(out[0].shape(), &[3]);
        // Index 2 has an empty label line: no label, as Triton.
        assert_eq!(
            strings(&out[0]),
            vec!["0.700000:1:dog", "0.500000:2", "0.250000:3:fish"]
        );
    }

    #[test]
    fn batched_outputs_give_one_row_per_entry_and_k_is_clamped() {
        let t = tensor(
            "y",
            DataType::Int32,
            vec![2, 3],
            [3i32, -1, 7, -5, -2, -9]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
        );
        let out = apply(vec![t], &classify(&[("y", 10)]), &Labels::default(), true).unwrap();
        assert_eq!(out[0].shape(), &[2, 3]);
        assert_eq!(
            strings(&out[0]),
            vec!["7:2", "3:0", "-1:1", "-2:1", "-5:0", "-9:2"]
        );
    }

    #[test]
    fn non_batching_models_classify_the_whole_tensor() {
        let t = tensor("y", DataType::Uint8, vec![2, 2], vec![1, 200, 3, 4]);
        let out = apply(vec![t], &classify(&[("y", 2)]), &Labels::default(), false).unwrap();
        assert_eq!(out[0].shape(), &[2]);
        assert_eq!(strings(&out[0]), vec!["200:1", "4:3"]);
    }

    #[test]
    fn every_numeric_type_is_read_and_printed() {
        let cases: Vec<(DataType, Vec<u8>, &str)> = vec![
            (DataType::Int8, vec![0xff, 0x02], "2:1"),
            (
                DataType::Int16,
                [-3i16, -4].iter().flat_map(|v| v.to_le_bytes()).collect(),
                "-3:0",
            ),
            (
                DataType::Int64,
                [-1i64, -7].iter().flat_map(|v| v.to_le_bytes()).collect(),
                "-1:0",
            ),
            (
                DataType::Uint16,
                [9u16, 65535].iter().flat_map(|v| v.to_le_bytes()).collect(),
                "65535:1",
            ),
            (
                DataType::Uint32,
                [4_000_000_000u32, 1]
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
                "4000000000:0",
            ),
            (
                DataType::Uint64,
                [1u64, u64::MAX]
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
                "18446744073709551615:1",
            ),
            (
                DataType::Fp64,
                [0.5f64, 1.0 / 3.0]
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
                "0.500000:0",
            ),
            (DataType::Fp32, f32s(&[-1.5, -0.25]), "-0.250000:1"),
        ];
        for (datatype, data, top) in cases {
            let t = tensor("y", datatype, vec![2], data);
            let out = apply(vec![t], &classify(&[("y", 1)]), &Labels::default(), false).unwrap();
            assert_eq!(strings(&out[0]), vec![top], "{datatype}");
        }
    }

    #[test]
    fn floats_print_like_printf() {
        assert_eq!(printf_f(1234.5678901), "1234.567890");
        assert_eq!(printf_f(1e-7), "0.000000");
        assert_eq!(printf_f(f64::INFINITY), "inf");
        assert_eq!(printf_f(f64::NEG_INFINITY), "-inf");
        assert_eq!(printf_f(f64::NAN), "nan");
        assert_eq!(printf_f(f64::from(0.1f32)), "0.100000");
    }

    #[test]
    fn ties_keep_index_order_and_other_outputs_pass_through() {
        let y = tensor("y", DataType::Fp32, vec![3], f32s(&[0.5, 0.5, 0.9]));
        let z = tensor("z", DataType::Fp32, vec![1], f32s(&[1.0]));
        let out = apply(
            vec![y, z.clone()],
            &classify(&[("y", 3)]),
            &Labels::default(),
            false,
        )
        .unwrap();
        assert_eq!(
            strings(&out[0]),
            vec!["0.900000:2", "0.500000:0", "0.500000:1"]
        );
        assert_eq!(out[1], z);
    }

    #[test]
    fn unsupported_types_are_refused_with_tritons_message() {
        for datatype in [DataType::Fp16, DataType::Bf16, DataType::Bool] {
            let size = datatype.element_size().unwrap();
            let t = tensor("y", datatype, vec![2], vec![0; 2 * size]);
            let e = apply(vec![t], &classify(&[("y", 1)]), &Labels::default(), false).unwrap_err();
            assert_eq!(
                e,
                ServiceError::invalid(format!(
                    "class result not available for output due to unsupported type '{}'",
                    datatype.as_wire()
                ))
            );
        }
    }

    #[test]
    fn requested_count_reads_positive_integers_only() {
        use nereid_proto::{ParamValue, Parameters};
        let p = |v: ParamValue| Parameters::from([("classification".to_string(), v)]);
        assert_eq!(requested_count(&Parameters::new()).unwrap(), None);
        assert_eq!(requested_count(&p(ParamValue::Int(3))).unwrap(), Some(3));
        assert_eq!(requested_count(&p(ParamValue::Uint(2))).unwrap(), Some(2));
        assert!(
            requested_count(&p(ParamValue::Int(0)))
                .unwrap_err()
                .to_string()
                .contains("expected >= 0")
        );
        assert!(
            requested_count(&p(ParamValue::String("2".into())))
                .unwrap_err()
                .to_string()
                .contains("expected int64_param")
        );
    }

    #[test]
    fn label_files_load_by_lines_and_a_missing_one_is_named() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("labels.txt"), "a\nb\n\nd\n").unwrap();
        let config = |file: &str| {
            ValidModelConfig::unchecked(
                crate::config::text::parse_model_config(&format!(
                    r#"name: "m" output [{{name: "y" data_type: TYPE_FP32 dims: [4] label_filename: "{file}"}}, {{name: "z" data_type: TYPE_FP32 dims: [1]}}]"#
                ))
                .unwrap(),
            )
        };
        let labels = Labels::load(&config("labels.txt"), dir.path()).unwrap();
        assert_eq!(labels.by_output["y"], vec!["a", "b", "", "d"]);
        assert_eq!(labels.label("y", 1), Some("b"));
        assert_eq!(labels.label("y", 2), None);
        assert_eq!(labels.label("y", 9), None);
        assert_eq!(labels.label("z", 0), None);
        let e = Labels::load(&config("missing.txt"), dir.path()).unwrap_err();
        assert_eq!(
            e,
            format!(
                "failed to open text file for read {}: No such file or directory",
                dir.path().join("missing.txt").display()
            )
        );
        let e = Labels::load(&config("../x.txt"), dir.path()).unwrap_err();
        assert!(e.contains("is outside model directory"), "{e}");
    }

    #[test]
    fn getline_splitting() {
        assert_eq!(lines(""), Vec::<String>::new());
        assert_eq!(lines("a"), vec!["a"]);
        assert_eq!(lines("a\n"), vec!["a"]);
        assert_eq!(lines("a\n\n"), vec!["a", ""]);
        assert_eq!(lines("a\r\nb"), vec!["a\r", "b"]);
    }
}
