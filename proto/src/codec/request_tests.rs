//! Tests of `request`: decoding a client's `ModelInferRequest`, encoding one for a worker.

use bytes::Bytes;

use super::*;
use crate::pb::inference::InferTensorContents;
use crate::pb::inference::infer_parameter::ParameterChoice;

fn input(
    name: &str,
    datatype: &str,
    shape: Vec<i64>,
    contents: Option<InferTensorContents>,
) -> InferInputTensor {
    InferInputTensor {
        name: name.into(),
        datatype: datatype.into(),
        shape,
        parameters: HashMap::new(),
        contents,
    }
}

fn request(inputs: Vec<InferInputTensor>, raw: Vec<Bytes>) -> ModelInferRequest {
    ModelInferRequest {
        model_name: "m".into(),
        inputs,
        raw_input_contents: raw,
        ..Default::default()
    }
}

fn param(choice: ParameterChoice) -> InferParameter {
    InferParameter {
        parameter_choice: Some(choice),
    }
}

#[test]
fn half_precision_travels_raw() {
    for datatype in ["FP16", "BF16"] {
        let raw = Bytes::from_static(&[0, 0x3c, 0, 0]);
        let inputs = vec![input("x", datatype, vec![2], None)];
        let req = decode_request(request(inputs, vec![raw])).unwrap();
        assert_eq!(req.inputs[0].datatype().as_wire(), datatype);
    }
}

#[test]
fn typed_contents_reach_the_tensor() {
    let contents = InferTensorContents {
        int_contents: vec![-1, 300],
        ..Default::default()
    };
    let req = request(vec![input("x", "INT16", vec![2], Some(contents))], vec![]);
    let r = decode_request(req).unwrap();
    let expected: Vec<u8> = [-1i16, 300].iter().flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(r.inputs[0].data(), &Bytes::from(expected));
    let contents = InferTensorContents {
        int_contents: vec![300],
        ..Default::default()
    };
    let err = decode_request(request(
        vec![input("x", "INT8", vec![1], Some(contents))],
        vec![],
    ));
    assert!(
        err.unwrap_err()
            .message()
            .contains("input 'x' for model 'm'")
    );
}

#[test]
fn raw_contents_pair_by_position_without_copying() {
    let a = Bytes::from(vec![1u8, 2, 3, 4]);
    let b = Bytes::from(vec![9u8; 8]);
    let inputs = vec![
        input("a", "INT32", vec![1], None),
        input("b", "FP64", vec![1, 1], None),
    ];
    let req = decode_request(request(inputs, vec![a.clone(), b.clone()])).unwrap();
    assert_eq!(req.inputs[0].name(), "a");
    assert_eq!(req.inputs[0].data().as_ptr(), a.as_ptr());
    assert_eq!(req.inputs[1].data().as_ptr(), b.as_ptr());
    assert_eq!(req.inputs[1].shape(), &[1, 1]);
}

#[test]
fn raw_and_typed_contents_do_not_mix() {
    let typed_input = input(
        "b",
        "INT32",
        vec![1],
        Some(InferTensorContents {
            int_contents: vec![1],
            ..Default::default()
        }),
    );
    let inputs = vec![input("a", "INT32", vec![1], None), typed_input];
    let err = decode_request(request(inputs, vec![Bytes::from(vec![0u8; 4])])).unwrap_err();
    assert!(matches!(err, ServiceError::InvalidArgument(_)));
    assert_eq!(
        err.message(),
        "contents field must not be specified when using raw_input_contents for 'b' for model 'm'"
    );
}

#[test]
fn raw_count_must_match_input_count() {
    let inputs = vec![
        input("a", "INT32", vec![1], None),
        input("b", "INT32", vec![1], None),
    ];
    let err = decode_request(request(inputs, vec![Bytes::from(vec![0u8; 4])])).unwrap_err();
    assert!(
        err.message()
            .contains("2 inputs not in shared memory but 1 raw_input_contents"),
        "{}",
        err.message()
    );
    let err = decode_request(request(
        vec![input("a", "INT32", vec![1], None)],
        vec![Bytes::new(), Bytes::new()],
    ));
    assert!(err.is_err());
}

#[test]
fn inputs_without_data_or_with_bad_shape_or_type_are_refused() {
    let err =
        decode_request(request(vec![input("a", "INT32", vec![1], None)], vec![])).unwrap_err();
    assert_eq!(
        err.message(),
        "unable to find data for input tensor 'a' for model 'm' in request."
    );

    let err = decode_request(request(
        vec![input("a", "INT32", vec![2, -1], None)],
        vec![Bytes::new()],
    ))
    .unwrap_err();
    assert!(matches!(err, ServiceError::InvalidArgument(_)));
    assert!(
        err.message().contains("input 'a'") && err.message().contains("[2,-1]"),
        "{}",
        err.message()
    );

    let err = decode_request(request(
        vec![input("a", "FLOAT", vec![1], None)],
        vec![Bytes::new()],
    ))
    .unwrap_err();
    assert!(err.message().contains("unknown datatype 'FLOAT'"));

    // Raw byte length against the shape is checked by Tensor::new.
    let err = decode_request(request(
        vec![input("a", "INT32", vec![2], None)],
        vec![Bytes::from(vec![0u8; 4])],
    ));
    assert!(err.is_err());
}

#[test]
fn duplicate_inputs_and_outputs_are_refused() {
    let inputs = vec![
        input("a", "INT32", vec![0], None),
        input("a", "INT32", vec![0], None),
    ];
    let err = decode_request(request(inputs, vec![Bytes::new(), Bytes::new()])).unwrap_err();
    assert_eq!(err.message(), "input 'a' already exists in request");

    let mut req = request(vec![], vec![]);
    let out = |name: &str| InferRequestedOutputTensor {
        name: name.into(),
        parameters: HashMap::new(),
    };
    req.outputs = vec![out("y"), out("z"), out("y")];
    let err = decode_request(req).unwrap_err();
    assert!(matches!(err, ServiceError::InvalidArgument(_)));
    assert_eq!(err.message(), "output 'y' already exists in request");
}

#[test]
fn requested_outputs_keep_order_and_parameters() {
    let mut req = request(vec![], vec![]);
    let mut params = HashMap::new();
    params.insert(
        "classification".to_string(),
        param(ParameterChoice::Int64Param(3)),
    );
    params.insert(
        "binary_data".to_string(),
        param(ParameterChoice::BoolParam(true)),
    );
    req.outputs = vec![
        InferRequestedOutputTensor {
            name: "z".into(),
            parameters: params,
        },
        InferRequestedOutputTensor {
            name: "y".into(),
            parameters: HashMap::new(),
        },
    ];
    let r = decode_request(req).unwrap();
    assert_eq!(r.outputs[0].name, "z");
    assert_eq!(
        r.outputs[0].parameters["classification"],
        ParamValue::Int(3)
    );
    assert_eq!(
        r.outputs[0].parameters["binary_data"],
        ParamValue::Bool(true)
    );
    assert_eq!(r.outputs[1].name, "y");
}

fn in_region(mut i: InferInputTensor, region: &str, offset: i64, size: i64) -> InferInputTensor {
    let p = &mut i.parameters;
    p.insert(
        "shared_memory_region".into(),
        param(ParameterChoice::StringParam(region.into())),
    );
    p.insert(
        "shared_memory_offset".into(),
        param(ParameterChoice::Int64Param(offset)),
    );
    p.insert(
        "shared_memory_byte_size".into(),
        param(ParameterChoice::Int64Param(size)),
    );
    i
}

#[test]
fn shared_memory_tensors_need_a_frontend_with_a_registry() {
    let i = in_region(input("a", "INT32", vec![1], None), "r", 0, 4);
    let err = decode_request(request(vec![i], vec![])).unwrap_err();
    assert_eq!(
        err,
        ServiceError::unsupported("input 'a': client shared memory is not available here")
    );
}

#[test]
fn shared_memory_inputs_and_outputs_come_back_as_a_plan() {
    // Raw contents pair with the inputs not in shared memory, in order (Triton's rule).
    let inputs = vec![
        in_region(input("a", "INT32", vec![2], None), "r", 8, 8),
        input("b", "INT32", vec![1], None),
    ];
    let mut req = request(inputs, vec![Bytes::from(vec![7, 0, 0, 0])]);
    let mut out = InferRequestedOutputTensor {
        name: "y".into(),
        ..Default::default()
    };
    out.parameters.insert(
        "shared_memory_region".into(),
        param(ParameterChoice::StringParam("o".into())),
    );
    out.parameters.insert(
        "shared_memory_byte_size".into(),
        param(ParameterChoice::Uint64Param(64)),
    );
    req.outputs.push(out);
    let decoded = decode_stream_request(req, &RequestLimits::default()).unwrap();
    assert_eq!(decoded.request.inputs.len(), 1);
    assert_eq!(decoded.request.inputs[0].name(), "b");
    let shm = decoded.shm;
    assert_eq!(
        shm.inputs,
        vec![ShmInput {
            position: 0,
            name: "a".into(),
            datatype: DataType::Int32,
            shape: vec![2],
            at: ShmRef {
                region: "r".into(),
                offset: 8,
                byte_size: 8
            },
        }]
    );
    assert_eq!(shm.outputs.len(), 1);
    assert_eq!(shm.outputs[0].at.byte_size, 64);
    // The output's shared-memory keys are not passed on as parameters.
    assert!(decoded.request.outputs[0].parameters.is_empty());
}

#[test]
fn shared_memory_input_with_typed_contents_is_refused() {
    let contents = InferTensorContents {
        int_contents: vec![1],
        ..Default::default()
    };
    let i = in_region(input("a", "INT32", vec![1], Some(contents)), "r", 0, 4);
    let err =
        decode_stream_request(request(vec![i], vec![]), &RequestLimits::default()).unwrap_err();
    assert_eq!(
        err.message(),
        "unexpected 'content' provided when using shared memory for input tensor 'a' for model 'm'"
    );
}

#[test]
fn request_parameters_split_into_options_and_custom() {
    let mut req = request(vec![], vec![]);
    req.id = "req-7".into();
    req.model_version = "3".into();
    let p = &mut req.parameters;
    p.insert(
        "sequence_id".into(),
        param(ParameterChoice::StringParam("s1".into())),
    );
    p.insert(
        "sequence_start".into(),
        param(ParameterChoice::BoolParam(true)),
    );
    p.insert("priority".into(), param(ParameterChoice::Uint64Param(2)));
    p.insert("timeout".into(), param(ParameterChoice::Int64Param(500)));
    p.insert(
        "triton_enable_empty_final_response".into(),
        param(ParameterChoice::BoolParam(true)),
    );
    p.insert("flag".into(), param(ParameterChoice::BoolParam(false)));
    p.insert("count".into(), param(ParameterChoice::Int64Param(-4)));
    p.insert("ratio".into(), param(ParameterChoice::DoubleParam(0.5)));
    p.insert(
        "label".into(),
        param(ParameterChoice::StringParam("hi".into())),
    );
    let r = decode_request(req).unwrap();
    assert_eq!(
        (r.model_name.as_str(), r.model_version, r.id.as_str()),
        ("m", Some(3), "req-7")
    );
    assert_eq!(
        r.options.sequence_id,
        Some(CorrelationId::String("s1".into()))
    );
    assert!(r.options.sequence_start);
    assert_eq!((r.options.priority, r.options.timeout_us), (2, 500));
    let expected: Parameters = [
        ("flag", ParamValue::Bool(false)),
        ("count", ParamValue::Int(-4)),
        ("ratio", ParamValue::Double(0.5)),
        ("label", ParamValue::String("hi".into())),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    assert_eq!(r.parameters, expected);
}

#[test]
fn empty_final_response_flag_is_read_for_streams_only() {
    let with = |value: Option<bool>| {
        let mut req = request(vec![], vec![]);
        if let Some(v) = value {
            req.parameters.insert(
                "triton_enable_empty_final_response".into(),
                param(ParameterChoice::BoolParam(v)),
            );
        }
        req
    };
    for (value, expected) in [(None, false), (Some(false), false), (Some(true), true)] {
        let decoded = decode_stream_request(with(value), &RequestLimits::default()).unwrap();
        assert_eq!(decoded.empty_final_response, expected, "{value:?}");
        assert!(decoded.request.parameters.is_empty());
        // A unary request drops the flag without passing it to the model.
        assert!(decode_request(with(value)).unwrap().parameters.is_empty());
    }
}

#[test]
fn bad_request_parameters_are_refused() {
    let with = |key: &str, value: InferParameter| {
        let mut req = request(vec![], vec![]);
        req.parameters.insert(key.into(), value);
        decode_request(req).unwrap_err()
    };
    let err = with("my_key", param(ParameterChoice::Uint64Param(1)));
    assert!(matches!(err, ServiceError::InvalidArgument(_)));
    assert!(err.message().contains("'my_key'"), "{}", err.message());
    assert!(
        with(
            "empty",
            InferParameter {
                parameter_choice: None
            }
        )
        .message()
        .contains("'empty'")
    );
    assert!(
        with("triton_other", param(ParameterChoice::BoolParam(true)))
            .message()
            .contains("triton_")
    );
    let err = with(
        "triton_enable_empty_final_response",
        param(ParameterChoice::Int64Param(1)),
    );
    assert!(err.message().contains("expected bool_param"));
    assert!(
        with("sequence_end", param(ParameterChoice::Int64Param(1)))
            .message()
            .contains("sequence_end")
    );

    let mut req = request(vec![], vec![]);
    req.model_version = "latest".into();
    assert!(matches!(
        decode_request(req),
        Err(ServiceError::InvalidArgument(_))
    ));
}

fn internal_request() -> InferRequest {
    let data = Bytes::from(vec![1u8, 0, 0, 0, 2, 0, 0, 0]);
    let mut parameters = Parameters::new();
    parameters.insert("custom".into(), ParamValue::Uint(7));
    InferRequest {
        model_name: "m".into(),
        model_version: Some(3),
        id: "r1".into(),
        options: RequestOptions {
            priority: 1,
            timeout_us: 0,
            sequence_id: Some(CorrelationId::String("s".into())),
            sequence_start: true,
            sequence_end: false,
        },
        parameters,
        inputs: vec![Tensor::new("x", DataType::Int32, vec![2], data).unwrap()],
        outputs: vec![RequestedOutput {
            name: "y".into(),
            parameters: Parameters::new(),
        }],
        ..Default::default()
    }
}

#[test]
fn requests_encode_options_and_share_tensor_bytes() {
    let r = internal_request();
    let wire = encode_request(&r).unwrap();
    assert_eq!(wire.model_version, "3");
    assert_eq!(wire.inputs[0].datatype, "INT32");
    assert_eq!(
        wire.raw_input_contents[0].as_ptr(),
        r.inputs[0].data().as_ptr()
    );
    let p = |k: &str| wire.parameters[k].parameter_choice.clone().unwrap();
    assert_eq!(p("custom"), ParameterChoice::Int64Param(7));
    assert_eq!(p("priority"), ParameterChoice::Uint64Param(1));
    assert_eq!(p("sequence_id"), ParameterChoice::StringParam("s".into()));
    assert_eq!(p("sequence_start"), ParameterChoice::BoolParam(true));
    assert!(!wire.parameters.contains_key("timeout"));
    assert_eq!(wire.outputs[0].name, "y");
}

#[test]
fn encoded_requests_decode_to_the_same_request() {
    let r = internal_request();
    let mut expected = r.clone();
    // The custom uint64 travels as int64 (gRPC refuses uint64 custom parameters).
    expected
        .parameters
        .insert("custom".into(), ParamValue::Int(7));
    assert_eq!(decode_request(encode_request(&r).unwrap()), Ok(expected));
}

#[test]
fn oversized_custom_uint_is_refused_when_encoding() {
    let mut r = internal_request();
    r.parameters
        .insert("big".into(), ParamValue::Uint(u64::MAX));
    assert!(matches!(
        encode_request(&r),
        Err(ServiceError::InvalidArgument(_))
    ));
}

#[test]
fn limits_are_checked_on_declared_counts_and_shapes_before_contents() {
    let limits = RequestLimits {
        max_inputs: 1,
        max_outputs: 1,
        max_tensor_elements: 4,
    };
    let ints = |n: usize| InferTensorContents {
        int_contents: vec![1; n],
        ..Default::default()
    };
    let ok = request(vec![input("a", "INT32", vec![2, 2], Some(ints(4)))], vec![]);
    assert!(decode_stream_request(ok, &limits).is_ok());

    let two = request(
        vec![
            input("a", "INT32", vec![1], Some(ints(1))),
            input("b", "INT32", vec![1], Some(ints(1))),
        ],
        vec![],
    );
    let err = decode_stream_request(two, &limits).unwrap_err();
    assert!(matches!(err, ServiceError::InvalidArgument(_)));
    assert!(err.message().contains("--max-request-inputs"), "{err}");

    let mut outputs = request(vec![], vec![]);
    for name in ["x", "y"] {
        outputs.outputs.push(InferRequestedOutputTensor {
            name: name.into(),
            parameters: HashMap::new(),
        });
    }
    let err = decode_stream_request(outputs, &limits).unwrap_err();
    assert!(err.message().contains("--max-request-outputs"), "{err}");

    // The declared shape is refused even though the contents are short: nothing is converted.
    let big = request(vec![input("a", "INT32", vec![1, 5], Some(ints(1)))], vec![]);
    let err = decode_stream_request(big, &limits).unwrap_err();
    assert_eq!(
        err.message(),
        "input 'a' for model 'm' has 5 elements (shape [1,5]); the server accepts at most 4 per tensor (--max-tensor-elements)"
    );
}
