//! The HTTP infer body decoder (`POST /v2/models/m/infer`): `Inference-Header-Content-Length`
//! parsing, the JSON request with binary tensor data split off after the header, JSON tensor
//! `data`, and the raw binary request (header `0`), through `nereid_frontend::fuzzing`.
//!
//! Input: `<header line>\n<body>`. The header line is
//! `[<Inference-Header-Content-Length value>][|<TYPE_x> <max_batch_size> <dim>...]`: an empty
//! value sends no header; the part after `|` is the model's one input for a raw request
//! (default `TYPE_UINT8 0 -1`). Without a newline the whole input is a JSON body.
//!
//! Property beyond "no panic": the router forwards HTTP requests over gRPC, so a request the
//! HTTP decoder accepts and the gRPC encoder takes must decode from its gRPC form unchanged.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nereid_proto::InferRequest;
use nereid_proto::codec::{decode_request, encode_request};
use nereid_proto::pb::inference::{DataType, ModelConfig, ModelInput};

/// `--http-max-input-size` for the JSON decoder: small, so the limit is reachable.
const MAX_INPUT_SIZE: usize = 1 << 16;

fuzz_target!(|data: &[u8]| {
    let (line, body) = match data.iter().position(|&b| b == b'\n') {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (&b""[..], data),
    };
    let (header, model) = match line.iter().position(|&b| b == b'|') {
        Some(at) => (&line[..at], &line[at + 1..]),
        None => (line, &b""[..]),
    };
    let header = (!header.is_empty()).then_some(header);
    let config = raw_model(model);
    let Ok(mut request) =
        nereid_frontend::fuzzing::http_infer_body(header, body, MAX_INPUT_SIZE, &config)
    else {
        return;
    };
    if let Ok(wire) = encode_request(&request) {
        let forwarded = decode_request(wire).expect("an encoded HTTP request decodes over gRPC");
        forget_flags_without_sequence(&mut request);
        assert_eq!(
            format!("{forwarded:?}"),
            format!("{request:?}"),
            "an HTTP request changed on its way through the gRPC codec"
        );
    }
});

/// The model a raw request is for: `<TYPE_x> <max_batch_size> <dim>...`, one input `INPUT0`.
fn raw_model(spec: &[u8]) -> ModelConfig {
    let text = String::from_utf8_lossy(spec);
    let mut words = text.split_whitespace();
    let data_type = words
        .next()
        .and_then(DataType::from_str_name)
        .unwrap_or(DataType::TypeUint8);
    let max_batch_size = words.next().and_then(|w| w.parse().ok()).unwrap_or(0);
    let mut dims: Vec<i64> = words.filter_map(|w| w.parse().ok()).collect();
    if dims.is_empty() {
        dims.push(-1);
    }
    ModelConfig {
        name: "m".into(),
        max_batch_size,
        input: vec![ModelInput {
            name: "INPUT0".into(),
            data_type: data_type as i32,
            dims,
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// `sequence_start` / `sequence_end` mean something only with a `sequence_id` (the data plane
/// reads them only through a correlation ID), so the gRPC encoder leaves them out without one.
fn forget_flags_without_sequence(request: &mut InferRequest) {
    if request.options.sequence_id.is_none() {
        request.options.sequence_start = false;
        request.options.sequence_end = false;
    }
}
