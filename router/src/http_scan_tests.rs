//! Tests of the HTTP inference body scan.

use super::*;
use nereid_proto::CorrelationId;

fn scan(body: &str) -> HttpScanned {
    scan_http_request(body.as_bytes(), None)
        .expect("scans")
        .expect("has a JSON header")
}

fn scan_err(body: &[u8], header_len: Option<usize>) -> String {
    scan_http_request(body, header_len)
        .expect_err("refused")
        .to_string()
}

#[test]
fn json_body_gives_id_inputs_and_outputs_without_reading_data() {
    let s = scan(
        r#"{"id":"r1","inputs":[
            {"name":"a","shape":[2,3],"datatype":"FP32","data":[[1,2,3],[4,5,6]]},
            {"name":"b","shape":[1],"datatype":"BYTES","data":["x"],"extra":{"k":[1]}}],
          "outputs":[{"name":"y","parameters":{"binary_data":true}}],
          "unknown":{"deep":[1,2,{"x":null}]}}"#,
    );
    assert_eq!(s.id, "r1");
    assert_eq!(
        s.inputs,
        vec![
            ScannedInput {
                name: "a".into(),
                shape: vec![2, 3]
            },
            ScannedInput {
                name: "b".into(),
                shape: vec![1]
            },
        ]
    );
    assert_eq!(s.outputs, 1);
    assert_eq!(s.shared_memory, None);
    assert_eq!(s.options.sequence_id, None);
}

#[test]
fn binary_header_scans_only_the_json_part() {
    let json = r#"{"inputs":[{"name":"a","shape":[4],"datatype":"UINT8","parameters":{"binary_data_size":4}}]}"#;
    let mut body = json.as_bytes().to_vec();
    // Binary tensor bytes that are not JSON (and not UTF-8).
    body.extend_from_slice(&[0xff, 0x00, b'{', 0x80]);
    let s = scan_http_request(&body, Some(json.len()))
        .expect("scans")
        .expect("has a JSON header");
    assert_eq!(s.inputs[0].shape, vec![4]);
    // The same body without the header length is not JSON.
    assert!(scan_err(&body, None).contains("failed to parse the request JSON buffer"));
}

#[test]
fn raw_binary_request_has_nothing_to_scan() {
    assert_eq!(scan_http_request(&[1, 2, 3], Some(0)), Ok(None));
}

#[test]
fn header_length_past_the_body_is_refused() {
    assert_eq!(
        scan_err(b"{}", Some(3)),
        "Inference-Header-Content-Length 3 is longer than the request body (2 bytes)"
    );
}

#[test]
fn sequence_parameters_are_read() {
    let s = scan(
        r#"{"parameters":{"sequence_id":7,"sequence_start":true,"priority":2},
            "inputs":[{"name":"a","shape":[1],"datatype":"INT32","data":[1]}]}"#,
    );
    assert_eq!(s.options.sequence_id, Some(CorrelationId::Uint(7)));
    assert!(s.options.sequence_start);
    assert!(!s.options.sequence_end);
    let s = scan(r#"{"parameters":{"sequence_id":"abc","sequence_end":true}}"#);
    assert_eq!(
        s.options.sequence_id,
        Some(CorrelationId::String("abc".into()))
    );
    assert!(s.options.sequence_end);
}

#[test]
fn sequence_parameter_of_the_wrong_type_is_refused() {
    let err = scan_err(br#"{"parameters":{"sequence_start":"yes"}}"#, None);
    assert!(err.contains("sequence_start"), "{err}");
    let err = scan_err(br#"{"parameters":{"sequence_id":[1]}}"#, None);
    assert_eq!(
        err,
        "parameter 'sequence_id' must be a string, integer, number or boolean, got an array"
    );
}

#[test]
fn shared_memory_tensors_are_noted() {
    let s = scan(
        r#"{"inputs":[{"name":"a","shape":[1],"datatype":"INT32",
              "parameters":{"shared_memory_region":"r","shared_memory_byte_size":4}}],
            "outputs":[{"name":"y","parameters":{"shared_memory_region":"o"}}]}"#,
    );
    assert_eq!(s.shared_memory.as_deref(), Some("input 'a'"));
    let s = scan(r#"{"outputs":[{"name":"y","parameters":{"shared_memory_region":"o"}}]}"#);
    assert_eq!(s.shared_memory.as_deref(), Some("output 'y'"));
}

#[test]
fn malformed_bodies_name_the_field() {
    let cases: [(&str, &str); 10] = [
        ("", "the request body is empty"),
        ("[1,2]", "the request JSON must be an object"),
        (r#"{"id":5}"#, "'id' must be a string, got a number"),
        (
            r#"{"parameters":[]}"#,
            "'parameters' must be an object, got an array",
        ),
        (r#"{"inputs":{}}"#, "'inputs'"),
        (
            r#"{"inputs":[{"shape":[1]}]}"#,
            "'inputs[0].name' must be a string",
        ),
        (
            r#"{"inputs":[{"name":"a"}]}"#,
            "'input 'a': shape' must be an array of integers, got nothing",
        ),
        (
            r#"{"inputs":[{"name":"a","shape":[1,-2]}]}"#,
            "input 'a': shape dimension 1 must be a non-negative integer",
        ),
        (
            r#"{"outputs":[{"name":"y","parameters":3}]}"#,
            "'output 'y': parameters' must be an object, got a number",
        ),
        (
            r#"{"id":"x"} trailing"#,
            "failed to parse the request JSON buffer",
        ),
    ];
    for (body, expected) in cases {
        let err = scan_err(body.as_bytes(), None);
        assert!(err.contains(expected), "{body}: {err}");
    }
}

#[test]
fn malformed_tensor_data_is_still_json_checked() {
    // Data is skipped, not trusted: an unterminated array is a JSON error.
    let err = scan_err(br#"{"inputs":[{"name":"a","shape":[1],"data":[1,}]}"#, None);
    assert!(
        err.contains("failed to parse the request JSON buffer"),
        "{err}"
    );
}

#[test]
fn scan_errors_become_invalid_argument() {
    let e: ServiceError = HttpScanError::NotObject.into();
    assert_eq!(
        e,
        ServiceError::invalid("the request JSON must be an object")
    );
}

#[test]
fn keys_set_to_null_are_present() {
    // As in the typed decoder, `null` is a value of the wrong type, not an absent key.
    let cases = [
        (r#"{"id":null}"#, "'id' must be a string, got null"),
        (
            r#"{"parameters":null}"#,
            "'parameters' must be an object, got null",
        ),
        (r#"{"inputs":null}"#, "'inputs': invalid type: null"),
        (r#"{"outputs":null}"#, "'outputs': invalid type: null"),
        (
            r#"{"inputs":[{"name":"a","shape":[1],"parameters":null}]}"#,
            "'input 'a': parameters' must be an object, got null",
        ),
        (
            r#"{"outputs":[{"name":null}]}"#,
            "'outputs[0].name' must be a string, got null",
        ),
    ];
    for (body, expected) in cases {
        let err = scan_err(body.as_bytes(), None);
        assert!(err.contains(expected), "{body}: {err}");
    }
}

#[test]
fn tensors_must_be_objects() {
    // serde's derive would read an array as the fields by position.
    let err = scan_err(br#"{"inputs":[["a",[1],{}]]}"#, None);
    assert!(err.contains("expected an input tensor object"), "{err}");
    let err = scan_err(br#"{"outputs":[["y"]]}"#, None);
    assert!(err.contains("expected an output tensor object"), "{err}");
}

#[test]
fn a_key_the_scan_reads_may_appear_once() {
    // At the top level too: the document is an object, so this is not "must be an object".
    let err = scan_err(br#"{"id":"a","id":"b"}"#, None);
    assert!(err.contains("duplicate field `id`"), "{err}");
    let err = scan_err(
        br#"{"inputs":[{"name":"a","shape":[1],"shape":[2]}]}"#,
        None,
    );
    assert!(err.contains("duplicate field `shape`"), "{err}");
    // Keys it skips may repeat, tensor data included.
    let s = scan(r#"{"x":1,"x":2,"inputs":[{"name":"a","shape":[1],"data":[1],"data":[2]}]}"#);
    assert_eq!(s.inputs[0].shape, vec![1]);
}
