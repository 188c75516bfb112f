//! Unit tests of warmup sample construction.

use std::path::Path;

use nereid_proto::{DataType, Tensor, bytes_elements, push_bytes_element};

use super::*;
use crate::config::text::parse_model_config;

const INPUTS: &str = r#"
    input [
      { name: "f" data_type: TYPE_FP32 dims: [ 2, -1 ] },
      { name: "i" data_type: TYPE_INT64 dims: [ 3 ] },
      { name: "b" data_type: TYPE_BOOL dims: [ 4 ] },
      { name: "s" data_type: TYPE_STRING dims: [ -1 ] },
      { name: "opt" data_type: TYPE_INT32 dims: [ 1 ] optional: true }
    ]
    output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "z" data_type: TYPE_INT32 dims: [ 1 ] } ]"#;

/// The model of [`INPUTS`] with `max_batch_size` and the `model_warmup` text `warmup`.
fn config(max_batch_size: i32, warmup: &str) -> ValidModelConfig {
    let text = format!(
        "name: \"m\" backend: \"identity\" max_batch_size: {max_batch_size} {INPUTS}\n{warmup}"
    );
    ValidModelConfig::unchecked(parse_model_config(&text).unwrap())
}

/// One sample "w" (count 3) setting the four required inputs, each with its data source text.
fn all_inputs(batch: u32, f: &str, i: &str, b: &str, s: &str) -> String {
    format!(
        r#"model_warmup [{{ name: "w" batch_size: {batch} count: 3 inputs [
            {{ key: "f" value: {{ data_type: TYPE_FP32 dims: [2, 3] {f} }} }},
            {{ key: "i" value: {{ data_type: TYPE_INT64 dims: [3] {i} }} }},
            {{ key: "b" value: {{ data_type: TYPE_BOOL dims: [4] {b} }} }},
            {{ key: "s" value: {{ data_type: TYPE_STRING dims: [2] {s} }} }}
        ] }}]"#
    )
}

fn by_name<'a>(sample: &'a WarmupSample, name: &str) -> &'a Tensor {
    sample.inputs.iter().find(|t| t.name() == name).unwrap()
}

fn error(config: &ValidModelConfig, dir: &Path) -> String {
    warmup_samples(config, dir).unwrap_err()
}

#[test]
fn zero_data_with_batch_dimension() {
    let z = "zero_data: true";
    let c = config(8, &all_inputs(2, z, z, z, z));
    let samples = warmup_samples(&c, Path::new("/nonexistent")).unwrap();
    assert_eq!(samples.len(), 1);
    let s = &samples[0];
    assert_eq!((s.name.as_str(), s.count), ("w", 3));
    assert_eq!(s.outputs, ["y", "z"]);
    let names: Vec<&str> = s.inputs.iter().map(Tensor::name).collect();
    assert_eq!(
        names,
        ["f", "i", "b", "s"],
        "config order, optional input left out"
    );
    let f = by_name(s, "f");
    assert_eq!((f.datatype(), f.shape()), (DataType::Fp32, &[2, 2, 3][..]));
    assert!(f.data().iter().all(|&b| b == 0) && f.data().len() == 48);
    assert_eq!(by_name(s, "i").shape(), [2, 3]);
    assert_eq!(by_name(s, "b").shape(), [2, 4]);
    let strings = by_name(s, "s");
    assert_eq!(
        (strings.datatype(), strings.shape()),
        (DataType::Bytes, &[2, 2][..])
    );
    assert!(bytes_elements(strings.data()).all(<[u8]>::is_empty));
}

#[test]
fn non_batching_model_has_no_batch_dimension_and_count_zero_runs_once() {
    let z = "zero_data: true";
    let mut c = config(0, &all_inputs(1, z, z, z, z));
    c.warmup[0].count = 0;
    let s = &warmup_samples(&c, Path::new("/nonexistent")).unwrap()[0];
    assert_eq!(s.count, 1);
    assert_eq!(by_name(s, "f").shape(), [2, 3]);
    assert_eq!(by_name(s, "s").shape(), [2]);
}

#[test]
fn random_data_is_finite_boolean_and_deterministic() {
    let r = "random_data: true";
    let c = config(4, &all_inputs(1, r, r, r, r));
    let s = &warmup_samples(&c, Path::new("/nonexistent")).unwrap()[0];
    let floats: Vec<f32> = by_name(s, "f")
        .data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert!(
        floats
            .iter()
            .all(|v| v.is_finite() && (-1.0..=1.0).contains(v)),
        "{floats:?}"
    );
    assert!(
        floats.windows(2).any(|w| w[0] != w[1]),
        "not random: {floats:?}"
    );
    assert!(by_name(s, "b").data().iter().all(|&b| b <= 1));
    assert!(by_name(s, "i").data().iter().any(|&b| b != 0));
    assert_eq!(bytes_elements(by_name(s, "s").data()).count(), 2);
    let again = &warmup_samples(&c, Path::new("/nonexistent")).unwrap()[0];
    assert_eq!(s, again);
    for datatype in [DataType::Fp16, DataType::Bf16] {
        let data = random_item(datatype, 64, "half");
        let finite = data.chunks_exact(2).all(|c| {
            let bits = u16::from_le_bytes([c[0], c[1]]);
            if datatype == DataType::Fp16 {
                half::f16::from_bits(bits).is_finite()
            } else {
                half::bf16::from_bits(bits).is_finite()
            }
        });
        assert!(finite, "{datatype}");
    }
}

#[test]
fn file_data_holds_one_batch_item() {
    let dir = tempfile::tempdir().unwrap();
    let warmup = dir.path().join("warmup");
    std::fs::create_dir_all(warmup.join("sub")).unwrap();
    let floats: Vec<u8> = (0..6).flat_map(|v| (v as f32).to_le_bytes()).collect();
    std::fs::write(warmup.join("f.bin"), &floats).unwrap();
    let mut longs: Vec<u8> = [5i64, 6, 7].iter().flat_map(|v| v.to_le_bytes()).collect();
    longs.extend_from_slice(&[0xAA; 3]); // extra bytes are ignored, as in Triton
    std::fs::write(warmup.join("sub/i.bin"), &longs).unwrap();
    std::fs::write(warmup.join("b.bin"), [1, 0, 1, 1]).unwrap();
    let mut strings = Vec::new();
    push_bytes_element(&mut strings, b"ab");
    push_bytes_element(&mut strings, b"xyz");
    std::fs::write(warmup.join("s.bin"), &strings).unwrap();

    let file = |f: &str| format!("input_data_file: \"{f}\"");
    let c = config(
        4,
        &all_inputs(
            2,
            &file("f.bin"),
            &file("sub/i.bin"),
            &file("b.bin"),
            &file("s.bin"),
        ),
    );
    let s = &warmup_samples(&c, dir.path()).unwrap()[0];
    assert_eq!(
        by_name(s, "f").data().as_ref(),
        [floats.clone(), floats].concat()
    );
    assert_eq!(by_name(s, "i").shape(), [2, 3]);
    assert_eq!(&by_name(s, "i").data()[..24], &longs[..24]);
    assert_eq!(by_name(s, "b").data().as_ref(), [1, 0, 1, 1, 1, 0, 1, 1]);
    let elems: Vec<&[u8]> = bytes_elements(by_name(s, "s").data()).collect();
    assert_eq!(elems, [&b"ab"[..], b"xyz", b"ab", b"xyz"]);

    std::fs::write(warmup.join("short.bin"), [0u8; 20]).unwrap();
    let c = config(
        4,
        &all_inputs(
            1,
            &file("short.bin"),
            &file("sub/i.bin"),
            &file("b.bin"),
            &file("s.bin"),
        ),
    );
    assert_eq!(
        error(&c, dir.path()),
        "model 'm' warmup sample 'w' input 'f': FP32 dims of 6 element(s) need 24 bytes, but input_data_file 'short.bin' has only 20"
    );
    let c = config(
        4,
        &all_inputs(
            1,
            &file("f.bin"),
            &file("sub/i.bin"),
            &file("b.bin"),
            &file("b.bin"),
        ),
    );
    assert!(error(&c, dir.path()).contains("input 's': input_data_file 'b.bin' is not BYTES data"));
    let one = &strings[..6];
    std::fs::write(warmup.join("one.bin"), one).unwrap();
    let c = config(
        4,
        &all_inputs(
            1,
            &file("f.bin"),
            &file("sub/i.bin"),
            &file("b.bin"),
            &file("one.bin"),
        ),
    );
    assert!(
        error(&c, dir.path())
            .contains("BYTES dims need 2 element(s), but input_data_file 'one.bin' holds 1")
    );
    let c = config(
        4,
        &all_inputs(
            1,
            &file("missing.bin"),
            &file("sub/i.bin"),
            &file("b.bin"),
            &file("s.bin"),
        ),
    );
    assert!(error(&c, dir.path()).contains("input 'f': cannot read input_data_file"));
}

#[test]
fn data_files_must_stay_inside_the_warmup_folder() {
    let z = "zero_data: true";
    for bad in ["../config.pbtxt", "sub/../../x", "/etc/passwd", ""] {
        let f = format!("input_data_file: \"{bad}\"");
        let c = config(4, &all_inputs(1, &f, z, z, z));
        assert_eq!(
            error(&c, Path::new("/r/m")),
            format!(
                "model 'm' warmup sample 'w' input 'f': input_data_file '{bad}' must be a relative path inside the model's 'warmup/' folder"
            )
        );
    }
}

#[test]
fn sample_errors_name_the_model_sample_and_input() {
    let z = "zero_data: true";
    let dir = Path::new("/nonexistent");
    let missing = r#"model_warmup [{ name: "w" batch_size: 1 inputs [
        { key: "f" value: { data_type: TYPE_FP32 dims: [2, 1] zero_data: true } } ] }]"#;
    assert_eq!(
        error(&config(4, missing), dir),
        "model 'm' warmup sample 'w': the model's required input 'i' is missing from the sample"
    );
    let c = config(
        4,
        &all_inputs(1, z, z, "zero_data: true", z).replace("TYPE_BOOL dims", "TYPE_INT8 dims"),
    );
    assert_eq!(
        error(&c, dir),
        "model 'm' warmup sample 'w' input 'b': data_type TYPE_INT8 does not match the model input's TYPE_BOOL"
    );
    let c = config(4, &all_inputs(1, z, z, "", z));
    assert_eq!(
        error(&c, dir),
        "model 'm' warmup sample 'w' input 'b': set one of zero_data, random_data or input_data_file"
    );
    let c = config(4, &all_inputs(5, z, z, z, z));
    assert_eq!(
        error(&c, dir),
        "model 'm' warmup sample 'w': batch_size 5 exceeds the model's max_batch_size 4"
    );
    let c = config(0, &all_inputs(2, z, z, z, z));
    assert!(
        error(&c, dir).contains("batch_size 2 is not allowed because the model does not batch")
    );
    let c = config(
        4,
        &all_inputs(1, z, z, z, z).replace("dims: [3]", "dims: [4]"),
    );
    assert!(error(&c, dir).contains("input 'i': dims [4] do not match the model input's dims [3]"));
    let c = config(
        4,
        &all_inputs(1, z, z, z, z).replace("dims: [2, 3]", "dims: [2, -1]"),
    );
    assert!(error(&c, dir).contains("input 'f': dims [2,-1] must have every dimension specified"));
    let c = config(
        4,
        &all_inputs(1, z, z, z, z).replace("key: \"b\"", "key: \"nope\""),
    );
    assert_eq!(
        error(&c, dir),
        "model 'm' warmup sample 'w': input 'nope' is not an input of the model"
    );
}

#[test]
fn batch_zero_samples_are_skipped_and_unnamed_samples_get_an_index() {
    let z = "zero_data: true";
    let mut c = config(4, &all_inputs(0, z, z, z, z));
    assert!(warmup_samples(&c, Path::new("/x")).unwrap().is_empty());
    c.warmup[0].batch_size = 9;
    c.warmup[0].name.clear();
    assert!(error(&c, Path::new("/x")).starts_with("model 'm' warmup sample #0: batch_size 9"));
}

/// A sequence model (INT32 input "x" [1]) with START / READY / CORRID controls and one state
/// `si` [2], and the `model_warmup` text `warmup`.
fn sequence_config(max_batch_size: i32, warmup: &str) -> ValidModelConfig {
    let text = format!(
        r#"name: "m" backend: "identity" max_batch_size: {max_batch_size}
           input [{{ name: "x" data_type: TYPE_INT32 dims: [1] }}]
           output [{{ name: "y" data_type: TYPE_INT32 dims: [1] }}]
           sequence_batching {{
             control_input [
               {{name: "START" control [{{kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1]}}]}},
               {{name: "READY" control [{{kind: CONTROL_SEQUENCE_READY fp32_false_true: [0, 1]}}]}},
               {{name: "CORRID" control [{{kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64}}]}}
             ]
             state [{{input_name: "si" output_name: "so" data_type: TYPE_INT32 dims: [2]}}]
           }}
           {warmup}"#
    );
    ValidModelConfig::unchecked(parse_model_config(&text).unwrap())
}

#[test]
fn a_sequence_sample_gets_controls_and_initial_state() {
    let x = r#"{ key: "x" value: { data_type: TYPE_INT32 dims: [1] zero_data: true } }"#;
    let c = sequence_config(
        4,
        &format!(r#"model_warmup [{{ name: "w" batch_size: 2 inputs [{x}] }}]"#),
    );
    let s = &warmup_samples(&c, Path::new("/nonexistent")).unwrap()[0];
    let names: Vec<&str> = s.inputs.iter().map(Tensor::name).collect();
    assert_eq!(names, ["x", "START", "READY", "CORRID", "si"]);
    // A whole sequence of one request: START and READY true, CORRID 0, initial state zeros.
    assert_eq!(by_name(s, "START").shape(), [2, 1]);
    assert_eq!(
        by_name(s, "START").data().as_ref(),
        [1i32.to_le_bytes(), 1i32.to_le_bytes()].concat()
    );
    assert_eq!(
        by_name(s, "READY").data().as_ref(),
        [1f32.to_le_bytes(), 1f32.to_le_bytes()].concat()
    );
    assert_eq!(by_name(s, "CORRID").data().as_ref(), [0u8; 16]);
    assert_eq!(by_name(s, "si").shape(), [2, 2]);
    assert_eq!(by_name(s, "si").data().as_ref(), [0u8; 16]);
    // Without batching: no batch dimension.
    let c = sequence_config(
        0,
        &format!(r#"model_warmup [{{ name: "w" batch_size: 1 inputs [{x}] }}]"#),
    );
    let s = &warmup_samples(&c, Path::new("/nonexistent")).unwrap()[0];
    assert_eq!(
        (by_name(s, "START").shape(), by_name(s, "si").shape()),
        (&[1i64][..], &[2i64][..])
    );
}

#[test]
fn a_sequence_sample_may_set_controls_and_state_by_name() {
    let c = sequence_config(
        4,
        r#"model_warmup [{ name: "w" batch_size: 1 inputs [
             { key: "x" value: { data_type: TYPE_INT32 dims: [1] zero_data: true } },
             { key: "START" value: { data_type: TYPE_INT32 dims: [1] zero_data: true } },
             { key: "si" value: { data_type: TYPE_INT32 dims: [2] random_data: true } }
           ] }]"#,
    );
    let s = &warmup_samples(&c, Path::new("/nonexistent")).unwrap()[0];
    assert_eq!(
        by_name(s, "START").data().as_ref(),
        [0u8; 4],
        "as the sample sets it"
    );
    assert_eq!(
        by_name(s, "READY").data().as_ref(),
        1f32.to_le_bytes(),
        "generated"
    );
    assert_eq!(by_name(s, "si").shape(), [1, 2]);
    // A control set with the wrong type is named.
    let c = sequence_config(
        4,
        r#"model_warmup [{ name: "w" batch_size: 1 inputs [
             { key: "x" value: { data_type: TYPE_INT32 dims: [1] zero_data: true } },
             { key: "READY" value: { data_type: TYPE_INT32 dims: [1] zero_data: true } }
           ] }]"#,
    );
    assert_eq!(
        error(&c, Path::new("/nonexistent")),
        "model 'm' warmup sample 'w' input 'READY': data_type TYPE_INT32 does not match the model input's TYPE_FP32"
    );
}
