//! JSON inference: request decoding, parameters, output formats, malformed input.

use axum::http::StatusCode;
use serde_json::json;

use super::*;
use nereid_proto::{CorrelationId, DataType, ParamValue};

const URI: &str = "/v2/models/echo/infer";

async fn infer(app: &axum::Router, body: &Value) -> Reply {
    send(app, post_json(URI, body)).await
}

async fn error_of(body: Value) -> (StatusCode, String) {
    let (_, app) = app();
    let reply = infer(&app, &body).await;
    let message = reply.error();
    (reply.status, message)
}

#[tokio::test]
async fn json_round_trip_with_id_and_version() {
    let (mock, app) = app();
    let body = json!({
        "id": "req-1",
        "inputs": [
            {"name": "a", "datatype": "FP32", "shape": [2, 2], "data": [[1.0, 2.0], [3.5, -4.0]]},
            {"name": "b", "datatype": "BYTES", "shape": [2], "data": ["hi", "ünï"]}
        ]
    });
    let reply = send(&app, post_json("/v2/models/echo/versions/3/infer", &body)).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.header("content-type"), Some("application/json"));
    assert_eq!(
        reply.json(),
        json!({"id": "req-1", "model_name": "echo", "model_version": "3", "outputs": [
            {"name": "a", "datatype": "FP32", "shape": [2, 2], "data": [1.0, 2.0, 3.5, -4.0]},
            {"name": "b", "datatype": "BYTES", "shape": [2], "data": ["hi", "ünï"]}
        ]})
    );
    let request = last_request(&mock);
    assert_eq!(request.model_version, Some(3));
    assert_eq!(request.inputs[1].datatype(), DataType::Bytes);
    assert_eq!(&request.inputs[1].data()[..6], &[2, 0, 0, 0, b'h', b'i']);
}

#[tokio::test]
async fn empty_id_is_not_echoed() {
    let (_, app) = app();
    let body =
        json!({"id": "", "inputs": [{"name": "x", "datatype": "INT8", "shape": [0], "data": []}]});
    let reply = infer(&app, &body).await.json();
    assert!(reply.get("id").is_none());
    assert_eq!(reply["outputs"][0]["shape"], json!([0]));
}

#[tokio::test]
async fn parameters_are_typed_and_split() {
    let (mock, app) = app();
    let body = json!({
        "parameters": {"sequence_id": 42, "sequence_start": true, "priority": 2, "timeout": 100,
                       "custom_s": "v", "custom_i": -3, "custom_u": u64::MAX, "custom_f": 0.5, "custom_b": false},
        "inputs": [{"name": "x", "datatype": "INT32", "shape": [1], "data": [1]}]
    });
    let reply = infer(&app, &body).await;
    assert_eq!(reply.status, StatusCode::OK);
    let request = last_request(&mock);
    assert_eq!(request.options.sequence_id, Some(CorrelationId::Uint(42)));
    assert!(request.options.sequence_start);
    assert_eq!(
        (request.options.priority, request.options.timeout_us),
        (2, 100)
    );
    let p = &request.parameters;
    assert_eq!(p.len(), 5);
    assert_eq!(p["custom_s"], ParamValue::String("v".into()));
    assert_eq!(p["custom_i"], ParamValue::Int(-3));
    assert_eq!(p["custom_u"], ParamValue::Uint(u64::MAX));
    assert_eq!(p["custom_f"], ParamValue::Double(0.5));
    // The mock echoes custom parameters back as response parameters.
    assert_eq!(reply.json()["parameters"]["custom_u"], json!(u64::MAX));
}

#[tokio::test]
async fn reserved_and_malformed_parameters_are_refused() {
    let input = json!([{"name": "x", "datatype": "INT32", "shape": [1], "data": [1]}]);
    let (status, message) = error_of(json!({"parameters": {"triton_x": 1}, "inputs": input})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(message.contains("'triton_' are reserved"), "{message}");
    let (_, message) = error_of(json!({"parameters": {"headers": "x"}, "inputs": input})).await;
    assert!(message.contains("'headers' is reserved"), "{message}");
    let (_, message) = error_of(json!({"parameters": {"k": [1]}, "inputs": input})).await;
    assert_eq!(
        message,
        "parameter 'k' must be a string, integer, number or boolean, got an array"
    );
    let (_, message) = error_of(json!({"parameters": {"k": null}, "inputs": input})).await;
    assert!(message.contains("'k'"));
    let (_, message) =
        error_of(json!({"parameters": {"binary_data_output": 1}, "inputs": input})).await;
    assert_eq!(message, "parameter 'binary_data_output' must be a boolean");
    let (_, message) = error_of(json!({"id": 5, "inputs": input})).await;
    assert_eq!(message, "'id' must be a string, got 5");
}

#[tokio::test]
async fn malformed_requests_name_what_is_wrong() {
    let cases = [
        (json!({}), "the request JSON has no 'inputs'"),
        (json!([]), "the request JSON must be an object"),
        (
            json!({"inputs": {}}),
            "'inputs' must be an array, got an object",
        ),
        (
            json!({"inputs": [{"datatype": "FP32", "shape": [1], "data": [1]}]}),
            "inputs[0] must have a string 'name'",
        ),
        (
            json!({"inputs": [{"name": "x", "datatype": "FLOAT", "shape": [1], "data": [1]}]}),
            "input 'x': unknown datatype 'FLOAT'",
        ),
        (
            json!({"inputs": [{"name": "x", "datatype": "UINT8", "shape": [1], "data": [300]}]}),
            "input 'x': value 300 is out of range for UINT8",
        ),
        (
            json!({"inputs": [{"name": "x", "datatype": "FP16", "shape": [1], "data": [1]}]}),
            "receiving FP16 data via JSON is not supported. Please use the binary data format for input x",
        ),
        (
            json!({"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 2], "data": [1, 2]}]}),
            "input 'x': 'shape' must be an array of non-negative integers, got [-1,2]",
        ),
        (
            json!({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1]}]}),
            "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', 'shared_memory_region' in 'parameters'. But no field is set",
        ),
        (
            json!({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1], "parameters": {"binary_data_size": 4}}]}),
            "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', 'shared_memory_region' in 'parameters'. But set 'data' 'binary_data_size'",
        ),
        (
            json!({"inputs": [{"name": "x", "datatype": "INT8", "shape": [1], "data": [1]}, {"name": "x", "datatype": "INT8", "shape": [1], "data": [1]}]}),
            "input 'x' already exists in request",
        ),
        (
            json!({"inputs": [{"name": "x", "datatype": "INT8", "shape": [1], "data": [1]}], "outputs": [{"name": "y"}, {"name": "y"}]}),
            "output 'y' already exists in request",
        ),
        (
            json!({"inputs": [{"name": "x", "datatype": "INT8", "shape": [1], "data": [1]}], "outputs": [{"name": "y", "parameters": {"binary_data": "yes"}}]}),
            "output 'y': parameter 'binary_data' must be a boolean",
        ),
    ];
    for (body, expected) in cases {
        let (status, message) = error_of(body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(message, expected, "{body}");
    }
}

#[tokio::test]
async fn syntax_errors_are_500s_as_triton_and_deep_nesting_a_clear_400() {
    let (_, app) = app();
    // Triton 2.51 answers a request body that is not JSON with 500 and this prefix.
    let reply = send(&app, post(URI, r#"{"inputs": [}"#)).await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
    let message = reply.error();
    assert!(
        message.starts_with("failed to parse the request JSON buffer: ")
            && message.contains("column"),
        "{message}"
    );

    // An empty body is refused as such (see infer_request.rs).
    let reply = send(&app, post(URI, "")).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);

    // Data that does not fill the shape: Triton's words and code.
    let reply = send(
        &app,
        post(
            URI,
            r#"{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [1]}]}"#,
        ),
    )
    .await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        reply.error(),
        "Unable to parse 'data': Shape does not match true shape of 'data' field"
    );

    // Deeper than serde_json's own recursion limit: still our message, no crash.
    let deep = format!(
        r#"{{"inputs":[{{"name":"x","datatype":"INT32","shape":[1],"data":{}1{}}}]}}"#,
        "[".repeat(500),
        "]".repeat(500)
    );
    let reply = send(&app, post(URI, deep)).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        reply.error(),
        "JSON nesting depth exceeds maximum allowed limit (100)"
    );
}

#[tokio::test]
async fn shared_memory_needs_a_registry() {
    let body = json!({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 4}}]});
    let (status, message) = error_of(body).await;
    assert_eq!(status, StatusCode::NOT_IMPLEMENTED);
    assert!(
        message.starts_with("system shared memory is not available"),
        "{message}"
    );
}

#[tokio::test]
async fn output_format_follows_binary_data_then_binary_data_output() {
    let (mock, app) = app();
    let input = json!([{"name": "x", "datatype": "INT16", "shape": [2], "data": [1, -2]}]);
    let body = json!({
        "parameters": {"binary_data_output": true},
        "inputs": input,
        "outputs": [
            {"name": "as_json", "parameters": {"binary_data": false}},
            {"name": "as_default"},
            {"name": "classified", "parameters": {"classification": 2}}
        ]
    });
    let reply = infer(&app, &body).await;
    assert_eq!(reply.status, StatusCode::OK);
    let header_len = reply.binary_header_len();
    let header: Value = serde_json::from_slice(&reply.body[..header_len]).unwrap();
    assert_eq!(header["outputs"][0]["data"], json!([1, -2]));
    assert_eq!(header["outputs"][1]["parameters"]["binary_data_size"], 4);
    assert!(header["outputs"][1].get("data").is_none());
    let tail = [1i16.to_le_bytes(), (-2i16).to_le_bytes()].concat();
    assert_eq!(
        &reply.body[header_len..],
        &[tail.clone(), tail].concat()[..]
    );

    let request = last_request(&mock);
    assert!(
        request.parameters.is_empty(),
        "binary_data_output is a transport setting"
    );
    assert_eq!(
        request.outputs[2].parameters["classification"],
        ParamValue::Int(2)
    );
    assert!(request.outputs[0].parameters.is_empty());

    // Without any binary setting every output is JSON.
    let reply = infer(&app, &json!({"inputs": input, "outputs": [{"name": "y"}]})).await;
    assert_eq!(reply.header("content-type"), Some("application/json"));
    assert_eq!(reply.json()["outputs"][0]["name"], "y");
}

#[tokio::test]
async fn forwarded_headers_become_string_parameters() {
    let fake = Arc::new(fake());
    let config = HttpConfig {
        header_forward: crate::forward::HeaderForward::new("^x-fwd-|triton_").unwrap(),
        ..Default::default()
    };
    let app = router(fake.clone(), config);
    let body = json!({
        "parameters": {"x-fwd-b": 1, "keep": true},
        "inputs": [{"name": "a", "datatype": "FP32", "shape": [1], "data": [1.0]}]
    });
    let mut request = post_json(URI, &body);
    let headers = request.headers_mut();
    headers.insert("X-Fwd-A", "a".parse().unwrap());
    headers.insert("x-fwd-b", "from header".parse().unwrap());
    headers.insert("x-other", "no".parse().unwrap());
    let reply = send(&app, request).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    let seen = last_request(&fake).parameters;
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert_eq!(seen["x-fwd-a"], ParamValue::String("a".into()));
    assert_eq!(seen["x-fwd-b"], ParamValue::String("from header".into()));
    assert_eq!(seen["keep"], ParamValue::Bool(true));

    // A reserved name is refused before the service is called.
    let mut request = post_json(URI, &body);
    request
        .headers_mut()
        .insert("triton_x", "1".parse().unwrap());
    let reply = send(&app, request).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        reply.error(),
        "Header 'triton_x' is reserved for Triton usage and cannot be forwarded."
    );
    assert!(fake.requests().is_empty());
}
