//! `generate` and `generate_stream`: key mapping, shapes, bad values, one-response rule, SSE
//! framing, errors before and after the first event, streaming as responses arrive.

use std::time::Duration;

use axum::http::StatusCode;
use serde_json::json;

use super::*;
use crate::http::generate::NOT_ONE_RESPONSE;
use nereid_proto::{DataType, ParamValue, Parameters, bytes_elements};

const LIMIT: Duration = Duration::from_secs(10);

/// Awaits `future`, failing the test if it takes longer than [`LIMIT`].
async fn bounded<F: std::future::Future>(future: F) -> F::Output {
    tokio::time::timeout(LIMIT, future)
        .await
        .expect("finished within the time limit")
}

async fn generate(app: &axum::Router, model: &str, body: &Value) -> Reply {
    send(
        app,
        post_json(&format!("/v2/models/{model}/generate"), body),
    )
    .await
}

async fn generate_stream(app: &axum::Router, model: &str, body: &Value) -> Reply {
    let uri = format!("/v2/models/{model}/generate_stream");
    send(app, post_json(&uri, body)).await
}

#[tokio::test]
async fn keys_become_inputs_or_parameters_by_model_metadata() {
    let (mock, app) = app();
    let body = json!({
        "id": "g1",
        "text_input": "Hello",
        "max_tokens": 8,
        "parameters": {"stream": false, "temperature": 0.5, "note": "x", "big": u64::MAX, "priority": 2}
    });
    let reply = generate(&app, "gen", &body).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    assert_eq!(reply.header("content-type"), Some("application/json"));

    let request = last_request(&mock);
    assert_eq!(request.id, "g1");
    let inputs: Vec<(&str, DataType, &[i64])> = request
        .inputs
        .iter()
        .map(|t| (t.name(), t.datatype(), t.shape()))
        .collect();
    assert_eq!(
        inputs,
        [
            ("text_input", DataType::Bytes, &[1i64, 1][..]),
            ("max_tokens", DataType::Int32, &[1, 1][..]),
            // From inside `parameters`: it names an input, so it is one.
            ("stream", DataType::Bool, &[1, 1][..]),
        ]
    );
    let text: Vec<&[u8]> = bytes_elements(request.inputs[0].data()).collect();
    assert_eq!(text, [b"Hello"]);
    assert_eq!(&request.inputs[1].data()[..], 8i32.to_le_bytes());
    assert_eq!(&request.inputs[2].data()[..], [0]);
    assert_eq!(request.options.priority, 2);
    let expected: Parameters = [
        ("temperature", ParamValue::Double(0.5)),
        ("note", ParamValue::String("x".into())),
        ("big", ParamValue::Uint(u64::MAX)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    assert_eq!(request.parameters, expected);

    // The echo's outputs and parameters come back as keys; one element is a scalar.
    assert_eq!(
        reply.json(),
        json!({
            "big": u64::MAX, "id": "g1", "max_tokens": 8, "model_name": "gen",
            "model_version": "1", "note": "x", "stream": false, "temperature": 0.5,
            "text_input": "Hello"
        })
    );
    let keys: Vec<String> = reply.json().as_object().unwrap().keys().cloned().collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted, "keys in name order, as Triton writes them");
}

#[tokio::test]
async fn arrays_take_the_model_shape_and_come_back_flat() {
    let (mock, app) = app();
    let body =
        json!({"text_input": ["a", "b", "c"], "bias": [1.0, 2.0, 3.0, 4.5], "fixed": [1, 2, 3]});
    let reply = generate(&app, "gen", &body).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    let shapes: Vec<Vec<i64>> = last_request(&mock)
        .inputs
        .iter()
        .map(|t| t.shape().to_vec())
        .collect();
    assert_eq!(shapes, [vec![1, 3], vec![2, 2], vec![3]]);
    assert_eq!(
        reply.json(),
        json!({
            "bias": [1.0, 2.0, 3.0, 4.5], "fixed": [1, 2, 3], "model_name": "gen",
            "model_version": "1", "text_input": ["a", "b", "c"]
        })
    );

    // An empty body is an empty request; no id, no id key.
    let reply = send(&app, post("/v2/models/gen/versions/4/generate", "")).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(
        reply.json(),
        json!({"model_name": "gen", "model_version": "4"})
    );
}

#[tokio::test]
async fn bad_values_are_400_naming_the_key() {
    let (_, app) = app();
    let cases = [
        (
            json!({"max_tokens": "ten"}),
            "input 'max_tokens': expected an integer for INT32 data, got string \"ten\"",
        ),
        (
            json!({"max_tokens": 3_000_000_000u64}),
            "input 'max_tokens': value 3000000000 is out of range for INT32",
        ),
        (
            json!({"stream": 1}),
            "input 'stream': expected true or false for BOOL data, got 1",
        ),
        (
            json!({"text_input": [["a"]]}),
            "input 'text_input': expected a string or a flat array of them, got an array holding an array",
        ),
        (
            json!({"text_input": null}),
            "input 'text_input': expected a string or a flat array of them, got null",
        ),
        (
            json!({"bias": [1.0, 2.0, 3.0]}),
            "input 'bias': cannot shape 3 element(s) to the model's input shape [-1,2]",
        ),
        (
            json!({"fixed": 1}),
            "input 'fixed': cannot shape 1 element(s) to the model's input shape [3]",
        ),
        (
            json!({"custom": [1, 2]}),
            "parameter 'custom' must be a string, integer, number or boolean, got an array",
        ),
        (
            json!({"parameters": {"custom": null}}),
            "parameter 'custom' must be a string, integer, number or boolean, got null",
        ),
        (json!({"id": 5}), "'id' must be a string, got 5"),
        (
            json!({"parameters": 3}),
            "Expected JSON object for keyword: 'parameters', got 3",
        ),
        (
            json!({"text_input": "a", "parameters": {"text_input": "b"}}),
            "key 'text_input' is given both at the top level and inside 'parameters'; give it once",
        ),
        (
            json!({"id": "a", "parameters": {"id": "b"}}),
            "key 'id' is given both at the top level and inside 'parameters'; give it once",
        ),
        (
            json!({"triton_x": true}),
            "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified, got 'triton_x'",
        ),
        (
            json!([1]),
            "the generate request must be a JSON object, got an array",
        ),
    ];
    for (body, expected) in cases {
        for reply in [
            generate(&app, "gen", &body).await,
            generate_stream(&app, "gen", &body).await,
        ] {
            assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{body}");
            assert_eq!(reply.error(), expected, "{body}");
        }
    }

    let reply = generate(&app, "gen_reserved", &json!({"parameters": {}})).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        reply.error(),
        "Keyword 'parameters' for nested schema also given as input tensor name"
    );
    let reply = send(&app, post("/v2/models/gen/generate", "{")).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert!(
        reply
            .error()
            .starts_with("failed to parse the generate request JSON: ")
    );
}

#[tokio::test]
async fn unknown_model_compression_and_service_errors() {
    let (_, app) = app();
    let reply = generate(&app, "missing", &json!({})).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    assert_eq!(
        reply.error(),
        "Request for unknown model: 'missing' is not found"
    );

    let compressed = |encoding: &'static str| {
        Request::post("/v2/models/gen/generate")
            .header("content-encoding", encoding)
            .body(Body::from("{}"))
            .unwrap()
    };
    let reply = send(&app, compressed("gzip")).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        reply.error(),
        "Unsupported content-encoding 'gzip', only 'identity' is supported by the generate endpoints"
    );
    assert_eq!(
        send(&app, compressed("identity")).await.status,
        StatusCode::OK
    );

    // A refusal before anything ran keeps its class on both endpoints.
    for uri in [
        "/v2/models/error_invalid/generate",
        "/v2/models/error_unsupported/generate_stream",
    ] {
        let reply = send(&app, post_json(uri, &json!({}))).await;
        assert_ne!(reply.status, StatusCode::OK, "{uri}");
        assert_eq!(reply.error(), "boom");
    }
}

#[tokio::test]
async fn generate_needs_exactly_one_response() {
    let (_, app) = app();
    for model in ["gen_two", "gen_nothing"] {
        let reply = generate(&app, model, &json!({"text_input": "a"})).await;
        assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR, "{model}");
        assert_eq!(reply.error(), NOT_ONE_RESPONSE);
    }
    // An empty final item after the one response is not a second response.
    let reply = generate(&app, "gen_empty_final", &json!({"text_input": "a"})).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.json()["text_input"], "a");

    let reply = generate(&app, "gen_fail_first", &json!({})).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.error(), "model is warming up");
    let reply = generate(&app, "gen_not_utf8", &json!({})).await;
    assert_eq!(reply.status, StatusCode::NOT_IMPLEMENTED);
    assert!(
        reply
            .error()
            .starts_with("output 'raw_out' holds BYTES that are not valid UTF-8")
    );
}

const ECHO_EVENT: &str = "data: {\"id\":\"s\",\"model_name\":\"gen_two\",\"model_version\":\"1\",\"text_input\":\"a\"}\n\n";

#[tokio::test]
async fn generate_stream_sends_one_event_per_response() {
    let (_, app) = app();
    let body = json!({"id": "s", "text_input": "a"});
    let reply = generate_stream(&app, "gen_two", &body).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(
        reply.header("content-type"),
        Some("text/event-stream; charset=utf-8")
    );
    assert_eq!(
        String::from_utf8_lossy(&reply.body),
        format!("{ECHO_EVENT}{ECHO_EVENT}")
    );

    // Empty final items send nothing; a model without responses gives an empty event stream.
    let reply = generate_stream(&app, "gen_empty_final", &body).await;
    assert_eq!(
        String::from_utf8_lossy(&reply.body),
        ECHO_EVENT.replace("gen_two", "gen_empty_final")
    );
    let reply = generate_stream(&app, "gen_nothing", &body).await;
    assert_eq!((reply.status, reply.body.len()), (StatusCode::OK, 0));
    // A model that is not decoupled answers through `infer`: one event.
    let reply = generate_stream(&app, "gen", &body).await;
    assert_eq!(
        String::from_utf8_lossy(&reply.body),
        ECHO_EVENT.replace("gen_two", "gen")
    );
}

#[tokio::test]
async fn generate_stream_errors_before_and_after_the_first_event() {
    let (_, app) = app();
    let reply = generate_stream(&app, "gen_fail_first", &json!({})).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.error(), "model is warming up");

    let reply = generate_stream(&app, "gen_fail_mid", &json!({"id": "s", "text_input": "a"})).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(
        String::from_utf8_lossy(&reply.body),
        format!(
            "{}data: {{\"error\":\"boom mid-stream\"}}\n\n",
            ECHO_EVENT.replace("gen_two", "gen_fail_mid")
        )
    );
}

#[tokio::test]
async fn events_go_out_as_they_arrive_and_a_dropped_body_cancels() {
    let (mock, app) = app();
    let request = || {
        post_json(
            "/v2/models/gen_gate/generate_stream",
            &json!({"id": "s", "text_input": "a"}),
        )
    };
    let event = ECHO_EVENT.replace("gen_two", "gen_gate");

    let response = app.clone().oneshot(request()).await.unwrap();
    let mut body = response.into_body();
    // The second response waits for the gate, so the first event must arrive on its own.
    let first = bounded(body.frame())
        .await
        .unwrap()
        .unwrap()
        .into_data()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&first), event);
    mock.open_gate();
    let second = bounded(body.frame())
        .await
        .unwrap()
        .unwrap()
        .into_data()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&second), event);
    assert!(
        bounded(body.frame()).await.is_none(),
        "the stream ends after the last response"
    );

    let mut events = mock.events();
    let response = app.clone().oneshot(request()).await.unwrap();
    let mut body = response.into_body();
    bounded(body.frame()).await.unwrap().unwrap();
    drop(body);
    // Panics (time limit) unless dropping the body dropped the model's stream.
    bounded(next_cancelled(&mut events)).await;
}

#[tokio::test]
async fn trace_headers_become_the_request_context() {
    let (mock, app) = app();
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let mut request = post_json("/v2/models/gen/generate", &json!({"text_input": "Hi"}));
    let headers = request.headers_mut();
    headers.insert("traceparent", traceparent.parse().unwrap());
    headers.append("tracestate", "a=1".parse().unwrap());
    headers.append("tracestate", "b=2".parse().unwrap());
    let reply = send(&app, request).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    let context = last_request(&mock).context;
    let trace = context.trace.expect("a valid traceparent is kept");
    assert_eq!(trace.traceparent(), traceparent);
    assert_eq!(trace.tracestate(), Some("a=1,b=2"));
    assert_eq!(context.deadline, None);
}
