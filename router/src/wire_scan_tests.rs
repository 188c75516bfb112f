//! Unit tests of the wire scanner: built messages (prost) and hand-made bytes.

use std::collections::HashMap;

use nereid_proto::CorrelationId;
use nereid_proto::pb::inference::model_infer_request::{
    InferInputTensor, InferRequestedOutputTensor,
};
use nereid_proto::pb::inference::{InferTensorContents, ModelInferRequest};

use super::*;

fn param(choice: ParameterChoice) -> InferParameter {
    InferParameter {
        parameter_choice: Some(choice),
    }
}

fn request() -> ModelInferRequest {
    ModelInferRequest {
        model_name: "simple".into(),
        model_version: "2".into(),
        id: "req-1".into(),
        parameters: HashMap::from([
            ("sequence_id".into(), param(ParameterChoice::Uint64Param(7))),
            (
                "sequence_start".into(),
                param(ParameterChoice::BoolParam(true)),
            ),
            ("custom".into(), param(ParameterChoice::DoubleParam(0.5))),
        ]),
        inputs: vec![
            InferInputTensor {
                name: "a".into(),
                datatype: "INT32".into(),
                shape: vec![1, 16],
                ..Default::default()
            },
            InferInputTensor {
                name: "b".into(),
                datatype: "INT32".into(),
                shape: vec![300, 2],
                contents: Some(InferTensorContents {
                    int_contents: vec![1, 2, 3],
                    ..Default::default()
                }),
                ..Default::default()
            },
        ],
        outputs: vec![InferRequestedOutputTensor {
            name: "y".into(),
            ..Default::default()
        }],
        raw_input_contents: vec![Bytes::from(vec![9u8; 64])],
    }
}

fn scan(m: &ModelInferRequest) -> ScanResult<ScannedRequest> {
    scan_request(&m.encode_to_vec())
}

#[test]
fn a_request_gives_what_routing_needs() {
    let s = scan(&request()).unwrap();
    assert_eq!(
        (s.model_name.as_str(), s.model_version.as_str()),
        ("simple", "2")
    );
    assert_eq!(s.options.sequence_id, Some(CorrelationId::Uint(7)));
    assert!(s.options.sequence_start && !s.options.sequence_end);
    let inputs: Vec<_> = s
        .inputs
        .iter()
        .map(|i| (i.name.as_str(), i.shape.clone()))
        .collect();
    assert_eq!(inputs, vec![("a", vec![1, 16]), ("b", vec![300, 2])]);
    assert_eq!(s.outputs, 1);
    assert_eq!(s.shared_memory, None);
}

#[test]
fn negative_and_unpacked_dims_are_read() {
    let mut m = request();
    m.inputs[0].shape = vec![-1, 3];
    assert_eq!(scan(&m).unwrap().inputs[0].shape, vec![-1, 3]);
    // An unpacked repeated field (one varint per dim) is valid protobuf too.
    let mut input = vec![0x0a, 1, b'x'];
    input.extend([0x18, 4, 0x18, 5]);
    let mut bytes = vec![0x0a, 1, b'm'];
    bytes.push(0x2a);
    bytes.push(input.len() as u8);
    bytes.extend(&input);
    assert_eq!(scan_request(&bytes).unwrap().inputs[0].shape, vec![4, 5]);
}

#[test]
fn shared_memory_tensors_are_named() {
    let mut m = request();
    m.outputs[0].parameters.insert(
        "shared_memory_region".into(),
        param(ParameterChoice::StringParam("r".into())),
    );
    assert_eq!(
        scan(&m).unwrap().shared_memory.as_deref(),
        Some("output 'y'")
    );
    m.inputs[1].parameters.insert(
        "shared_memory_region".into(),
        param(ParameterChoice::StringParam("r".into())),
    );
    assert_eq!(
        scan(&m).unwrap().shared_memory.as_deref(),
        Some("input 'b'")
    );
}

/// `tag` then a length-delimited `body`.
fn delimited(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut field = vec![tag];
    prost::encoding::encode_varint(body.len() as u64, &mut field);
    field.extend(body);
    field
}

#[test]
fn inputs_are_named_before_outputs_whatever_the_field_order() {
    // A tensor whose parameters (field `params`) hold the key "shared_memory_region".
    let tensor = |name: &str, params: u8| {
        let mut t = delimited(0x0a, name.as_bytes());
        t.extend(delimited(
            (params << 3) | 2,
            &delimited(0x0a, b"shared_memory_region"),
        ));
        t
    };
    let mut bytes = vec![0x0a, 1, b'm'];
    bytes.extend(delimited(0x32, &tensor("y", 2))); // outputs[0] first on the wire
    bytes.extend(delimited(0x2a, &tensor("x", 4))); // then inputs[0]
    let s = scan_request(&bytes).unwrap();
    assert_eq!(s.shared_memory.as_deref(), Some("input 'x'"));
    assert_eq!(s.outputs, 1);
}

/// Groups were skipped by unbounded recursion, so a message of nested group starts overflowed
/// the router's stack. Groups and messages now nest as deep as prost allows, and no deeper.
#[test]
fn nested_groups_stop_at_prosts_recursion_limit() {
    let nested = |levels: usize| {
        let mut bytes = vec![0x0a, 1, b'm'];
        bytes.extend(std::iter::repeat_n((9 << 3) | 3, levels));
        bytes.extend(std::iter::repeat_n((9 << 3) | 4, levels));
        bytes
    };
    for levels in [1, 99, 100] {
        assert!(ModelInferRequest::decode(nested(levels).as_slice()).is_ok());
        assert!(scan_request(&nested(levels)).is_ok(), "{levels}");
    }
    for levels in [101, 1_000_000] {
        assert!(ModelInferRequest::decode(nested(levels).as_slice()).is_err());
        assert!(
            matches!(
                scan_request(&nested(levels)),
                Err(ScanError::TooDeep { field: 9, .. })
            ),
            "{levels}"
        );
    }
    // Inside an input a level is already spent on the input itself.
    let mut input = vec![0x0a, 1, b'x'];
    input.extend(std::iter::repeat_n((9 << 3) | 3, 100));
    input.extend(std::iter::repeat_n((9 << 3) | 4, 100));
    let mut bytes = vec![0x0a, 1, b'm'];
    bytes.extend(delimited(0x2a, &input));
    assert!(ModelInferRequest::decode(bytes.as_slice()).is_err());
    assert!(matches!(
        scan_request(&bytes),
        Err(ScanError::TooDeep { .. })
    ));
}

/// Varints of more than 64 bits and field numbers past 2^29 - 1 were read where prost (and so
/// the worker) refuses them.
#[test]
fn varints_and_field_numbers_are_bounded_as_prost_bounds_them() {
    let with = |tail: &[u8]| {
        let mut bytes = vec![0x0a, 1, b'm'];
        bytes.extend(tail);
        bytes
    };
    let max_varint = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01];
    let mut too_big = max_varint;
    too_big[9] = 0x02;
    let cases: [(Vec<u8>, bool); 5] = [
        // field 9, varint u64::MAX
        (with(&[&[9 << 3][..], &max_varint].concat()), true),
        // field 9, a varint of 65 bits
        (with(&[&[9 << 3][..], &too_big].concat()), false),
        // field 2^29 - 1, varint 0: the largest key
        (with(&[0xf8, 0xff, 0xff, 0xff, 0x0f, 0]), true),
        // field 2^29, varint 0: the key needs 33 bits
        (with(&[0x80, 0x80, 0x80, 0x80, 0x10, 0]), false),
        // a key of 64 bits
        (with(&[&[0xff; 9][..], &[0x01, 0]].concat()), false),
    ];
    for (bytes, valid) in cases {
        assert_eq!(ModelInferRequest::decode(bytes.as_slice()).is_ok(), valid);
        assert_eq!(scan_request(&bytes).is_ok(), valid, "{bytes:x?}");
    }
    assert!(matches!(
        scan_request(&with(&[&[9 << 3][..], &too_big].concat())),
        Err(ScanError::VarintOverflow { offset: 4, .. })
    ));
    assert!(matches!(
        scan_request(&with(&[0x80, 0x80, 0x80, 0x80, 0x10, 0])),
        Err(ScanError::FieldNumber { offset: 3, .. })
    ));
}

/// A `sequence_id` entry with no value followed by one with a value is, as a protobuf map, the
/// second; the scanner refused the first.
#[test]
fn only_the_last_entry_of_a_parameter_counts() {
    let entry = |value: Option<u8>| {
        let mut e = delimited(0x0a, b"sequence_id");
        if let Some(v) = value {
            e.extend(delimited(0x12, &[5 << 3, v])); // value { uint64_param: v }
        }
        delimited(0x22, &e)
    };
    let mut bytes = vec![0x0a, 1, b'm'];
    bytes.extend(entry(None));
    bytes.extend(entry(Some(7)));
    let full = ModelInferRequest::decode(bytes.as_slice()).unwrap();
    assert!(full.parameters["sequence_id"].parameter_choice.is_some());
    let s = scan_request(&bytes).unwrap();
    assert_eq!(s.options.sequence_id, Some(CorrelationId::Uint(7)));
    let mut bytes = vec![0x0a, 1, b'm'];
    bytes.extend(entry(Some(7)));
    bytes.extend(entry(None));
    assert!(matches!(
        scan_request(&bytes),
        Err(ScanError::BadParameter { key, .. }) if key == "sequence_id"
    ));
}

/// Every wire type in unknown fields, at the top level and inside an input, is skipped.
#[test]
fn every_wire_type_is_skipped() {
    let mut bytes = ModelInferRequest {
        model_name: "m".into(),
        ..Default::default()
    }
    .encode_to_vec();
    // Fields 8 to 12 are not in the schema (one-byte keys).
    bytes.extend([8 << 3, 0x96, 0x01]); // varint
    bytes.extend([(9 << 3) | 1, 1, 2, 3, 4, 5, 6, 7, 8]); // fixed64
    bytes.extend([(10 << 3) | 2, 3, 1, 2, 3]); // length-delimited
    bytes.extend([(11 << 3) | 5, 1, 2, 3, 4]); // fixed32
    // A group holding a varint and a nested group.
    bytes.extend([
        (12 << 3) | 3,
        (1 << 3),
        5,
        (2 << 3) | 3,
        (2 << 3) | 4,
        (12 << 3) | 4,
    ]);
    bytes.extend([(7 << 3) | 2, 2, 0xff, 0xfe]); // raw_input_contents, never read
    bytes.extend([(3 << 3) | 2, 1, b'i']); // id
    let s = scan_request(&bytes).unwrap();
    assert_eq!(s.model_name, "m");
    assert!(s.inputs.is_empty());
}

#[test]
fn the_last_model_name_wins() {
    let mut bytes = vec![0x0a, 1, b'a'];
    bytes.extend([0x0a, 1, b'b']);
    assert_eq!(scan_request(&bytes).unwrap().model_name, "b");
}

#[test]
fn malformed_messages_name_what_is_wrong() {
    let err = |bytes: &[u8]| scan_request(bytes).unwrap_err();
    assert_eq!(
        err(&[0x0a, 1, b'm', 0x48, 0x80]),
        ScanError::TruncatedVarint {
            at: "ModelInferRequest".into(),
            offset: 4
        }
    );
    assert!(matches!(
        err(&[
            0x0a, 1, b'm', 0x48, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01
        ]),
        ScanError::VarintOverflow { .. }
    ));
    assert_eq!(
        err(&[0x0a, 1, b'm', 0x3a, 100, 1, 2]),
        ScanError::LengthPastEnd {
            at: "ModelInferRequest".into(),
            field: 7,
            len: 100,
            left: 2
        }
    );
    assert!(matches!(
        err(&[0x08, 1]),
        ScanError::WireType {
            field: 1,
            wire_type: 0,
            ..
        }
    ));
    assert!(matches!(
        err(&[0x0a, 1, b'm', 0x07]),
        ScanError::FieldNumber { .. }
    ));
    assert!(matches!(
        err(&[0x0a, 1, b'm', 0x0e]),
        ScanError::WireType { wire_type: 6, .. }
    ));
    assert!(matches!(
        err(&[0x0a, 1, b'm', (9 << 3) | 3]),
        ScanError::OpenGroup { field: 9, .. }
    ));
    assert!(matches!(
        err(&[0x0a, 1, b'm', (9 << 3) | 4]),
        ScanError::StrayGroupEnd { field: 9, .. }
    ));
    assert!(matches!(
        err(&[0x0a, 2, 0xff, 0xfe]),
        ScanError::NotUtf8 { field: 1, .. }
    ));
    assert_eq!(err(&[]), ScanError::NoModelName);
    assert_eq!(err(&[0x12, 1, b'1']), ScanError::NoModelName);
    // Inside an input the error says which.
    let e = err(&[0x0a, 1, b'm', 0x2a, 3, 0x1a, 5, 1]);
    assert!(
        e.to_string().starts_with("ModelInferRequest.inputs[0]:"),
        "{e}"
    );
    let message = ServiceError::from(e).to_string();
    assert!(message.contains("malformed ModelInferRequest"), "{message}");
}

#[test]
fn sequence_parameters_of_the_wrong_type_are_refused() {
    let mut m = request();
    m.parameters.insert(
        "sequence_start".into(),
        param(ParameterChoice::Int64Param(1)),
    );
    assert!(matches!(scan(&m).unwrap_err(), ScanError::Options(_)));
    let mut m = request();
    m.parameters.insert(
        "sequence_id".into(),
        InferParameter {
            parameter_choice: None,
        },
    );
    assert!(
        matches!(scan(&m).unwrap_err(), ScanError::BadParameter { key, .. } if key == "sequence_id")
    );
}

#[test]
fn the_version_suffix_makes_the_worker_read_the_chosen_version() {
    let m = request();
    let bytes = m.encode_to_vec();
    assert!(version_suffix("2", "2").is_empty());
    for version in ["3", &"9".repeat(200)] {
        let mut forwarded = bytes.clone();
        forwarded.extend_from_slice(&version_suffix("2", version));
        let seen = ModelInferRequest::decode(forwarded.as_slice()).unwrap();
        assert_eq!(seen.model_version, version);
        // Everything else, unknown to the scanner or not, is what the client sent.
        assert_eq!(
            ModelInferRequest {
                model_version: "2".into(),
                ..seen
            },
            m
        );
    }
}

/// Found by the `router_wire_scan` fuzz target: a map entry's value given twice is one message,
/// the occurrences merged (prost and the worker read `sequence_end: false` here); the scanner
/// kept only the last, an empty value, and refused the request.
#[test]
fn a_parameter_value_given_twice_is_merged() {
    let mut e = delimited(0x0a, b"sequence_end");
    e.extend(delimited(0x12, &[1 << 3, 0])); // value { bool_param: false }
    e.extend(delimited(0x12, &[])); // value {}
    let mut bytes = vec![0x0a, 1, b'm'];
    bytes.extend(delimited(0x22, &e));
    let full = ModelInferRequest::decode(bytes.as_slice()).unwrap();
    assert_eq!(
        full.parameters["sequence_end"].parameter_choice,
        Some(ParameterChoice::BoolParam(false))
    );
    assert!(!scan_request(&bytes).unwrap().options.sequence_end);
    // Merged, the later field wins: bool_param true then int64_param 1 is an int64.
    let mut e = delimited(0x0a, b"sequence_start");
    e.extend(delimited(0x12, &[1 << 3, 1]));
    e.extend(delimited(0x12, &[2 << 3, 1]));
    let mut bytes = vec![0x0a, 1, b'm'];
    bytes.extend(delimited(0x22, &e));
    assert!(matches!(scan_request(&bytes), Err(ScanError::Options(_))));
    // Each occurrence is decoded on its own: a truncated one is refused, whatever follows.
    let mut e = delimited(0x0a, b"sequence_start");
    e.extend(delimited(0x12, &[1 << 3]));
    e.extend(delimited(0x12, &[1]));
    let mut bytes = vec![0x0a, 1, b'm'];
    bytes.extend(delimited(0x22, &e));
    assert!(ModelInferRequest::decode(bytes.as_slice()).is_err());
    assert!(matches!(
        scan_request(&bytes),
        Err(ScanError::BadParameter { .. })
    ));
}

/// An intended difference from prost, which reads a map field as length-delimited whatever
/// wire type its key says: the scan keeps to the key, as protobuf specifies.
#[test]
fn a_map_field_keyed_as_a_varint_is_refused() {
    let entry = delimited(0x0a, b"k");
    let mut bytes = vec![0x0a, 1, b'm', 4 << 3]; // parameters, as a varint...
    bytes.push(entry.len() as u8); // ...whose value prost takes for the entry's length
    bytes.extend(&entry);
    assert!(ModelInferRequest::decode(bytes.as_slice()).is_ok());
    assert!(matches!(
        scan_request(&bytes),
        Err(ScanError::WireType {
            field: 4,
            wire_type: 0,
            ..
        })
    ));
}
