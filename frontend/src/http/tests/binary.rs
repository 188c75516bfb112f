//! The binary tensor data extension: header length, body split, raw requests, zero-copy.

use axum::http::StatusCode;
use serde_json::json;

use super::*;
use nereid_proto::push_bytes_element;

const URI: &str = "/v2/models/echo/infer";

/// A request body: JSON header then `tail`, with `Inference-Header-Content-Length` set to
/// `header` (the JSON length when `None`).
fn binary_request(uri: &str, json: &Value, tail: &[u8], header: Option<&str>) -> Request<Body> {
    let json = json.to_string();
    let len = json.len().to_string();
    let mut body = json.into_bytes();
    body.extend_from_slice(tail);
    Request::post(uri)
        .header("inference-header-content-length", header.unwrap_or(&len))
        .body(Body::from(body))
        .unwrap()
}

fn fp32_binary_input(name: &str, count: usize) -> Value {
    json!({"name": name, "datatype": "FP32", "shape": [count], "parameters": {"binary_data_size": count * 4}})
}

fn floats(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

#[tokio::test]
async fn binary_inputs_are_split_in_json_order() {
    let (mock, app) = app();
    let json = json!({
        "inputs": [fp32_binary_input("a", 2), {"name": "j", "datatype": "INT8", "shape": [1], "data": [5]}, fp32_binary_input("b", 1)],
        "outputs": [{"name": "a", "parameters": {"binary_data": true}}, {"name": "j"}, {"name": "b", "parameters": {"binary_data": true}}]
    });
    let tail = [floats(&[1.0, 2.0]), floats(&[3.0])].concat();
    let reply = send(&app, binary_request(URI, &json, &tail, None)).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    let request = last_request(&mock);
    assert_eq!(&request.inputs[0].data()[..], &floats(&[1.0, 2.0])[..]);
    assert_eq!(&request.inputs[2].data()[..], &floats(&[3.0])[..]);

    // The response carries the binary outputs after its own JSON header, in output order.
    let header_len: usize = reply
        .header("inference-header-content-length")
        .unwrap()
        .parse()
        .unwrap();
    let header: Value = serde_json::from_slice(&reply.body[..header_len]).unwrap();
    assert_eq!(header["outputs"][1]["data"], json!([5]));
    assert_eq!(&reply.body[header_len..], &tail[..]);
}

#[tokio::test]
async fn binary_input_bytes_are_slices_of_the_request_body() {
    let (mock, app) = app();
    let json = json!({"inputs": [fp32_binary_input("a", 4)]}).to_string();
    let mut body = json.clone().into_bytes();
    body.extend_from_slice(&floats(&[1.0, 2.0, 3.0, 4.0]));
    let body = Bytes::from(body);
    let request = Request::post(URI)
        .header("inference-header-content-length", json.len())
        .body(Body::from(body.clone()))
        .unwrap();
    assert_eq!(send(&app, request).await.status, StatusCode::OK);
    let seen = last_request(&mock);
    let ptr = seen.inputs[0].data().as_ptr() as usize;
    let start = body.as_ptr() as usize;
    assert_eq!(
        ptr,
        start + json.len(),
        "input data must point into the request body"
    );
}

#[tokio::test]
async fn zero_byte_inputs_and_bytes_inputs() {
    let (mock, app) = app();
    let mut strings = Vec::new();
    push_bytes_element(&mut strings, b"ab");
    push_bytes_element(&mut strings, &[0xff]);
    let json = json!({"inputs": [
        {"name": "e", "datatype": "FP32", "shape": [0], "parameters": {"binary_data_size": 0}},
        {"name": "s", "datatype": "BYTES", "shape": [2], "parameters": {"binary_data_size": strings.len()}}
    ]});
    let reply = send(&app, binary_request(URI, &json, &strings, None)).await;
    assert_eq!(reply.status, StatusCode::OK);
    let request = last_request(&mock);
    assert!(request.inputs[0].data().is_empty());
    // The non-UTF-8 BYTES output comes back binary even though JSON was the default.
    let header_len: usize = reply
        .header("inference-header-content-length")
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(&reply.body[header_len..], &strings[..]);

    // binary_data_size 0 needs no header at all, as in Triton.
    let json = json!({"inputs": [{"name": "e", "datatype": "FP32", "shape": [0], "parameters": {"binary_data_size": 0}}]});
    assert_eq!(
        send(&app, post_json(URI, &json)).await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn size_mismatches_use_tritons_messages() {
    let (_, app) = app();
    let json = json!({"inputs": [fp32_binary_input("a", 2)]});
    let reply = send(&app, binary_request(URI, &json, &floats(&[1.0]), None)).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        reply.error(),
        "unexpected size for input 'a', expecting 4 additional bytes for model 'echo'"
    );

    let reply = send(
        &app,
        binary_request(URI, &json, &floats(&[1.0, 2.0, 3.0]), None),
    )
    .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        reply.error(),
        "unexpected additional input data for model 'echo'"
    );

    // binary_data_size that disagrees with the shape.
    let json = json!({"inputs": [{"name": "a", "datatype": "FP32", "shape": [2], "parameters": {"binary_data_size": 4}}]});
    let reply = send(&app, binary_request(URI, &json, &floats(&[1.0]), None)).await;
    assert_eq!(
        reply.error(),
        "tensor 'a': FP32 shape [2] needs 8 bytes, got 4"
    );
}

#[tokio::test]
async fn binary_data_without_the_header_is_refused() {
    let (_, app) = app();
    let json = json!({"inputs": [fp32_binary_input("a", 1)]});
    let reply = send(&app, post_json(URI, &json)).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        reply.error(),
        "must specify valid 'Infer-Header-Content-Length' in request header and 'binary_data_size' when passing inputs in binary data format"
    );
}

#[tokio::test]
async fn header_length_validation() {
    let (_, app) = app();
    let json = json!({"inputs": [fp32_binary_input("a", 1)]});
    let body_len = json.to_string().len() + 4;
    let cases = [
        ("abc", "Unable to parse Inference-Header-Content-Length, got: abc".to_string()),
        (
            "3000000000",
            "Unable to parse Inference-Header-Content-Length, value is out of range [ -2147483648, 2147483647 ], got: 3000000000"
                .to_string(),
        ),
        ("-1", format!("inference header size should be in range (0, {body_len}), got: -1")),
        ("100000", format!("inference header size should be in range (0, {body_len}), got: 100000")),
    ];
    for (header, expected) in cases {
        let reply = send(
            &app,
            binary_request(URI, &json, &floats(&[1.0]), Some(header)),
        )
        .await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{header}");
        assert_eq!(reply.error(), expected);
    }
    // A header shorter than the JSON cuts it: a parse error, not a crash.
    let reply = send(
        &app,
        binary_request(URI, &json, &floats(&[1.0]), Some("10")),
    )
    .await;
    assert!(
        reply
            .error()
            .starts_with("failed to parse the request JSON")
    );
}

#[tokio::test]
async fn raw_binary_request_infers_shape_and_returns_binary() {
    let (mock, app) = app();
    let data = floats(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let request = Request::post("/v2/models/raw_fp32/infer")
        .header("inference-header-content-length", "0")
        .body(Body::from(data.clone()))
        .unwrap();
    let reply = send(&app, request).await;
    assert_eq!(reply.status, StatusCode::OK);
    let seen = last_request(&mock);
    assert_eq!(seen.inputs[0].name(), "x");
    // Batching model: batch 1, the variable dim inferred from 24 bytes / (2 * 4).
    assert_eq!(seen.inputs[0].shape(), &[1, 3, 2]);
    let header_len = reply.binary_header_len();
    assert_eq!(&reply.body[header_len..], &data[..]);

    let bad = Request::post("/v2/models/raw_fp32/infer")
        .header("inference-header-content-length", "0")
        .body(Body::from(vec![0u8; 10]))
        .unwrap();
    let reply = send(&app, bad).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        reply.error(),
        "tensor 'x': FP32 shape [1,1,2] needs 8 bytes, got 10"
    );
}

#[tokio::test]
async fn raw_binary_bytes_and_refusals() {
    let (mock, app) = app();
    let raw = |model: &str, body: &'static [u8]| {
        Request::post(format!("/v2/models/{model}/infer"))
            .header("inference-header-content-length", "0")
            .body(Body::from(body))
            .unwrap()
    };
    assert_eq!(
        send(&app, raw("raw_bytes", b"hello")).await.status,
        StatusCode::OK
    );
    let seen = last_request(&mock);
    assert_eq!(seen.inputs[0].shape(), &[1]);
    assert_eq!(&seen.inputs[0].data()[..], b"\x05\x00\x00\x00hello");

    let reply = send(&app, raw("two_inputs", b"x")).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert!(
        reply
            .error()
            .contains("exactly 1 input, but model 'two_inputs' has 2")
    );
    let reply = send(&app, raw("raw_two_vars", b"x")).await;
    assert!(
        reply
            .error()
            .contains("more than one variable-sized dimension")
    );
    assert_eq!(
        send(&app, raw("missing", b"x")).await.status,
        StatusCode::NOT_FOUND
    );
}
