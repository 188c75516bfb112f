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
        ScanError::VarintTooLong { .. }
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
        ScanError::FieldZero { .. }
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
