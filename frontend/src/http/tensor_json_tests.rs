//! Unit tests of [`super`]: every datatype both ways, nesting, ranges, wrong JSON types, BYTES.

use serde_json::json;

use super::*;

const MAX: usize = 1 << 20;

fn decode(datatype: DataType, count: usize, data: Value) -> ServiceResult<Bytes> {
    decode_data("x", datatype, count, &data, MAX)
}

fn encode(datatype: DataType, data: &[u8]) -> Value {
    serde_json::to_value(JsonData { datatype, data }).unwrap()
}

fn err(datatype: DataType, count: usize, data: Value) -> String {
    decode(datatype, count, data)
        .unwrap_err()
        .message()
        .to_string()
}

#[test]
fn every_fixed_size_type_decodes_to_le_bytes_and_back() {
    let cases: Vec<(DataType, Value, Vec<u8>)> = vec![
        (DataType::Bool, json!([true, false]), vec![1, 0]),
        (DataType::Uint8, json!([0, 255]), vec![0, 255]),
        (
            DataType::Uint16,
            json!([1, 65535]),
            [1u16.to_le_bytes(), 65535u16.to_le_bytes()].concat(),
        ),
        (
            DataType::Uint32,
            json!([7, 4294967295u32]),
            [7u32.to_le_bytes(), u32::MAX.to_le_bytes()].concat(),
        ),
        (
            DataType::Uint64,
            json!([0, u64::MAX]),
            [0u64.to_le_bytes(), u64::MAX.to_le_bytes()].concat(),
        ),
        (DataType::Int8, json!([-128, 127]), vec![0x80, 0x7f]),
        (
            DataType::Int16,
            json!([-32768, 5]),
            [i16::MIN.to_le_bytes(), 5i16.to_le_bytes()].concat(),
        ),
        (
            DataType::Int32,
            json!([-1, i32::MAX]),
            [(-1i32).to_le_bytes(), i32::MAX.to_le_bytes()].concat(),
        ),
        (
            DataType::Int64,
            json!([i64::MIN, i64::MAX]),
            [i64::MIN.to_le_bytes(), i64::MAX.to_le_bytes()].concat(),
        ),
        (
            DataType::Fp32,
            json!([1.5, -2.25]),
            [1.5f32.to_le_bytes(), (-2.25f32).to_le_bytes()].concat(),
        ),
        (
            DataType::Fp64,
            json!([0.1, -1e300]),
            [0.1f64.to_le_bytes(), (-1e300f64).to_le_bytes()].concat(),
        ),
    ];
    for (datatype, data, bytes) in cases {
        let decoded = decode(datatype, 2, data.clone()).unwrap();
        assert_eq!(&decoded[..], &bytes[..], "{datatype}");
        assert_eq!(encode(datatype, &bytes), data, "{datatype}");
    }
}

#[test]
fn floats_accept_integers_and_print_shortest() {
    let decoded = decode(DataType::Fp32, 2, json!([3, 0.1])).unwrap();
    assert_eq!(&decoded[..4], &3.0f32.to_le_bytes());
    // 0.1f32 prints as 0.1, not as its f64 expansion 0.10000000149011612.
    assert_eq!(
        serde_json::to_string(&JsonData {
            datatype: DataType::Fp32,
            data: &decoded
        })
        .unwrap(),
        "[3.0,0.1]"
    );
}

#[test]
fn bytes_use_length_prefixed_layout() {
    let decoded = decode(DataType::Bytes, 3, json!(["ab", "", "é"])).unwrap();
    let mut expected = Vec::new();
    for s in ["ab", "", "é"] {
        push_bytes_element(&mut expected, s.as_bytes());
    }
    assert_eq!(&decoded[..], &expected[..]);
    assert_eq!(encode(DataType::Bytes, &expected), json!(["ab", "", "é"]));
    assert!(bytes_are_utf8(&expected));
}

#[test]
fn non_utf8_bytes_are_detected_and_never_mangled() {
    let mut data = Vec::new();
    push_bytes_element(&mut data, b"ok");
    push_bytes_element(&mut data, &[0xff, 0xfe]);
    assert!(!bytes_are_utf8(&data));
    assert!(
        serde_json::to_string(&JsonData {
            datatype: DataType::Bytes,
            data: &data
        })
        .is_err()
    );
}

#[test]
fn nested_and_flat_data_give_the_same_bytes() {
    let flat = decode(DataType::Int32, 6, json!([1, 2, 3, 4, 5, 6])).unwrap();
    let nested = decode(DataType::Int32, 6, json!([[1, 2, 3], [4, 5, 6]])).unwrap();
    let ragged = decode(DataType::Int32, 6, json!([[1], [2, [3, 4]], 5, [[6]]])).unwrap();
    assert_eq!(flat, nested);
    assert_eq!(flat, ragged);
    assert_eq!(encode(DataType::Int32, &nested), json!([1, 2, 3, 4, 5, 6]));
}

#[test]
fn empty_tensors() {
    assert!(decode(DataType::Fp32, 0, json!([])).unwrap().is_empty());
    assert!(
        decode(DataType::Fp32, 0, json!([[], []]))
            .unwrap()
            .is_empty()
    );
    assert_eq!(encode(DataType::Fp32, &[]), json!([]));
}

#[test]
fn integer_range_errors_name_input_and_type() {
    assert_eq!(
        err(DataType::Uint8, 1, json!([300])),
        "input 'x': value 300 is out of range for UINT8"
    );
    assert_eq!(
        err(DataType::Uint32, 1, json!([-1])),
        "input 'x': value -1 is out of range for UINT32"
    );
    assert_eq!(
        err(DataType::Int8, 1, json!([-129])),
        "input 'x': value -129 is out of range for INT8"
    );
    assert_eq!(
        err(DataType::Int16, 1, json!([40000])),
        "input 'x': value 40000 is out of range for INT16"
    );
    assert_eq!(
        err(DataType::Int64, 1, json!([u64::MAX])),
        format!("input 'x': value {} is out of range for INT64", u64::MAX)
    );
}

#[test]
fn wrong_json_types_are_named() {
    assert_eq!(
        err(DataType::Int32, 1, json!([1.5])),
        "input 'x': expected an integer for INT32 data, got 1.5"
    );
    assert_eq!(
        err(DataType::Uint8, 1, json!(["1"])),
        "input 'x': expected an integer for UINT8 data, got string \"1\""
    );
    assert_eq!(
        err(DataType::Bool, 1, json!([1])),
        "input 'x': expected true or false for BOOL data, got 1"
    );
    assert_eq!(
        err(DataType::Fp32, 1, json!([null])),
        "input 'x': expected a number for FP32 data, got null"
    );
    assert_eq!(
        err(DataType::Bytes, 1, json!([7])),
        "input 'x': expected a string for BYTES data, got 7"
    );
    assert_eq!(
        err(DataType::Fp64, 1, json!([{"a": 1}])),
        "input 'x': expected a number for FP64 data, got an object"
    );
    assert_eq!(
        err(DataType::Fp32, 1, json!(1.0)),
        "input 'x': 'data' must be an array, got 1.0"
    );
}

#[test]
fn element_count_must_match_shape() {
    // Triton 2.51's words (an HTTP 500).
    assert_eq!(
        err(DataType::Fp32, 4, json!([[1, 2], [3]])),
        "Unable to parse 'data': Shape does not match true shape of 'data' field"
    );
    assert!(decode(DataType::Bytes, 1, json!(["a", "b"])).is_err());
}

#[test]
fn half_precision_json_input_is_refused_output_is_numbers() {
    assert_eq!(
        err(DataType::Fp16, 1, json!([1.0])),
        "receiving FP16 data via JSON is not supported. Please use the binary data format for input x"
    );
    assert!(err(DataType::Bf16, 1, json!([1.0])).starts_with("receiving BF16 data via JSON"));
    let fp16 = [
        half::f16::from_f32(1.5).to_le_bytes(),
        half::f16::from_f32(-0.25).to_le_bytes(),
    ]
    .concat();
    assert_eq!(encode(DataType::Fp16, &fp16), json!([1.5, -0.25]));
    let bf16 = half::bf16::from_f32(2.0).to_le_bytes();
    assert_eq!(encode(DataType::Bf16, &bf16), json!([2.0]));
}

#[test]
fn non_finite_floats_are_written_as_null() {
    let data = [
        f32::NAN.to_le_bytes(),
        f32::INFINITY.to_le_bytes(),
        1f32.to_le_bytes(),
    ]
    .concat();
    assert_eq!(encode(DataType::Fp32, &data), json!([null, null, 1.0]));
    assert_eq!(
        encode(DataType::Fp64, &f64::NEG_INFINITY.to_le_bytes()),
        json!([null])
    );
}

#[test]
fn nesting_limit_matches_triton() {
    let nest = |depth: usize| -> Value {
        let mut v = json!(1);
        for _ in 0..depth {
            v = Value::Array(vec![v]);
        }
        v
    };
    assert!(decode(DataType::Int32, 1, nest(99)).is_ok());
    assert_eq!(
        err(DataType::Int32, 1, nest(100)),
        "JSON nesting depth exceeds maximum allowed limit (100)"
    );
}

#[test]
fn decoded_size_is_bounded() {
    let message = decode_data("x", DataType::Int64, 3, &json!([1, 2, 3]), 16)
        .unwrap_err()
        .message()
        .to_string();
    assert_eq!(
        message,
        "JSON input 'x' has a byte_size (24 bytes) that exceeds the maximum allowed value of 16 bytes. Use --http-max-input-size to increase the limit."
    );
}
