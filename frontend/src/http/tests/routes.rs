//! Routing, the non-infer endpoints and the status of every error class.

use axum::http::{Method, Request, StatusCode};
use serde_json::json;

use super::*;

#[tokio::test]
async fn unknown_paths_are_404_and_wrong_methods_405() {
    let (_, app) = app();
    for path in [
        "/",
        "/v1",
        "/v2/",
        "/v2/models/m/versions/x",
        "/v2/models/m/versions/1/trace/setting",
        "/v2/nothing",
    ] {
        let reply = send(&app, get(path)).await;
        assert_eq!(reply.status, StatusCode::NOT_FOUND, "{path}");
        assert_eq!(reply.error(), "Not Found");
    }
    for (method, path) in [
        (Method::POST, "/v2/health/live"),
        (Method::GET, "/v2/models/m/infer"),
        (Method::DELETE, "/v2/models/m"),
        (Method::GET, "/v2/repository/index"),
        (Method::PUT, "/v2/logging"),
    ] {
        let reply = send(
            &app,
            Request::builder()
                .method(method.clone())
                .uri(path)
                .body(Body::empty())
                .unwrap(),
        )
        .await;
        assert_eq!(
            reply.status,
            StatusCode::METHOD_NOT_ALLOWED,
            "{method} {path}"
        );
        assert_eq!(reply.error(), "Method Not Allowed");
        assert!(reply.header("allow").is_some());
    }
}

#[tokio::test]
async fn health_answers_with_empty_bodies() {
    let (_, app) = app();
    for path in ["/v2/health/live", "/v2/health/ready"] {
        let reply = send(&app, get(path)).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert!(reply.body.is_empty());
    }
    let fake = fake();
    fake.set_ready(false);
    let (_, app) = app_with(fake, 1024);
    let reply = send(&app, get("/v2/health/ready")).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert!(reply.body.is_empty());
}

#[tokio::test]
async fn server_and_model_metadata() {
    let (_, app) = app();
    let reply = send(&app, get("/v2")).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.header("content-type"), Some("application/json"));
    assert_eq!(
        reply.json(),
        json!({"name": "nereid", "version": "0.1.0", "extensions": ["binary_tensor_data", "statistics"]})
    );
    // Key order as Triton prints it.
    assert!(
        std::str::from_utf8(&reply.body)
            .unwrap()
            .starts_with(r#"{"name":"#)
    );

    let reply = send(&app, get("/v2/models/m/versions/7")).await;
    assert_eq!(
        reply.json(),
        json!({"name": "m", "versions": ["7"], "platform": "onnxruntime_onnx",
               "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 2]}],
               "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 2]}]})
    );
    let reply = send(&app, get("/v2/models/missing")).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    assert_eq!(
        reply.error(),
        "Request for unknown model: 'missing' is not found"
    );
    // A version too large for i64 is digits (routed) but not a valid version.
    let reply = send(&app, get("/v2/models/m/versions/99999999999999999999")).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn model_ready() {
    let (_, app) = app();
    let reply = send(&app, get("/v2/models/m/versions/1/ready")).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(reply.body.is_empty());
    let reply = send(&app, get("/v2/models/notready/ready")).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(reply.error(), "Model version not ready");
    let reply = send(&app, get("/v2/models/missing/ready")).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn config_and_statistics() {
    let (_, app) = app();
    let reply = send(&app, get("/v2/models/raw_fp32/config")).await;
    let config = reply.json();
    assert_eq!(config["name"], "raw_fp32");
    assert_eq!(config["max_batch_size"], 4);
    assert_eq!(config["input"][0]["data_type"], "TYPE_FP32");
    assert_eq!(config["input"][0]["dims"], json!([-1, 2]));

    let all = send(&app, get("/v2/models/stats")).await.json();
    let names: Vec<&str> = all["model_stats"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a", "b"]);
    let one = send(&app, get("/v2/models/m/versions/2/stats"))
        .await
        .json();
    assert_eq!(one["model_stats"][0]["version"], "2");
    assert_eq!(one["model_stats"][0]["inference_count"], 3);
    assert_eq!(
        send(&app, get("/v2/models/missing/stats")).await.status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn cuda_shared_memory_endpoints_reach_the_registry() {
    // This app has no registry (as the router): nothing is listed, every other use says why.
    let (_, app) = app();
    let status = send(&app, get("/v2/cudasharedmemory/status")).await;
    assert_eq!(status.status, StatusCode::OK);
    assert_eq!(status.json(), serde_json::json!([]));
    let reply = send(&app, post("/v2/cudasharedmemory/region/r/unregister", "")).await;
    assert_eq!(reply.status, StatusCode::NOT_IMPLEMENTED);
    assert!(
        reply
            .error()
            .starts_with("CUDA shared memory is not available: "),
        "{}",
        reply.error()
    );
    let reply = send(&app, post("/v2/cudasharedmemory/register", "{}")).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        reply.error(),
        "'region name' is necessary to register cuda shared memory region"
    );
}

#[tokio::test]
async fn settings_endpoints_reach_the_service() {
    // The mock service keeps the trait's defaults: the frontend passes the call through and
    // maps the service's refusal (501) instead of answering itself.
    let (_, app) = app();
    let cases = [
        (get("/v2/trace/setting"), "trace settings"),
        (get("/v2/models/m/trace/setting"), "trace settings"),
        (post("/v2/logging", "{}"), "log settings"),
    ];
    for (request, name) in cases {
        let reply = send(&app, request).await;
        assert_eq!(reply.status, StatusCode::NOT_IMPLEMENTED, "{name}");
        assert!(reply.error().starts_with(name), "{}", reply.error());
    }
    let reply = send(&app, post("/v2/logging", "[1]")).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn repository_index_load_unload() {
    let (mock, app) = app();
    let reply = send(&app, post("/v2/repository/index", "")).await;
    assert_eq!(
        reply.json(),
        json!([{"name": "a", "version": "1", "state": "READY"}, {"name": "b"}])
    );
    let reply = send(
        &app,
        post_json("/v2/repository/index", &json!({"ready": true})),
    )
    .await;
    assert_eq!(reply.json().as_array().unwrap().len(), 1);
    let reply = send(
        &app,
        post_json("/v2/repository/index", &json!({"ready": "yes"})),
    )
    .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        reply.error(),
        "Invalid value for 'ready': expected a boolean"
    );

    let load = json!({"parameters": {"config": "{\"backend\":\"onnxruntime\"}", "file:1/model.onnx": "aGVsbG8="}});
    let reply = send(&app, post_json("/v2/repository/models/m/load", &load)).await;
    assert_eq!(reply.status, StatusCode::OK);
    let (name, request) = mock.take_loads().pop().unwrap();
    assert_eq!(name, "m");
    assert_eq!(
        request.config.as_deref(),
        Some("{\"backend\":\"onnxruntime\"}")
    );
    assert_eq!(&request.files["file:1/model.onnx"][..], b"hello");

    let bad = json!({"parameters": {"config": "{}", "file:1/model.onnx": "%%%"}});
    let reply = send(&app, post_json("/v2/repository/models/m/load", &bad)).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert!(reply.error().contains("'file:1/model.onnx'"));
    let reply = send(&app, post("/v2/repository/models/missing/load", "")).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);

    let reply = send(
        &app,
        post_json(
            "/v2/repository/models/e/unload",
            &json!({"parameters": {"unload_dependents": true}}),
        ),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(mock.take_unloads().pop(), Some(("e".into(), true)));
    send(&app, post("/v2/repository/models/e/unload", "")).await;
    assert_eq!(mock.take_unloads().pop(), Some(("e".into(), false)));
    let reply = send(
        &app,
        post_json(
            "/v2/repository/models/e/unload",
            &json!({"parameters": {"unload_dependents": 1}}),
        ),
    )
    .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn named_repositories_are_501() {
    let (_, app) = app();
    for path in [
        "/v2/repository/r/index",
        "/v2/repository/r/models/m/load",
        "/v2/repository/r/models/m/unload",
    ] {
        let reply = send(&app, post(path, "")).await;
        assert_eq!(reply.status, StatusCode::NOT_IMPLEMENTED, "{path}");
        assert_eq!(
            reply.error(),
            "'repository_name' specification is not supported"
        );
    }
}

#[tokio::test]
async fn every_error_class_reaches_the_client_with_its_status() {
    let (_, app) = app();
    let request =
        json!({"inputs": [{"name": "x", "datatype": "INT32", "shape": [1], "data": [1]}]});
    let cases = [
        ("error_invalid", 400),
        ("error_not_found", 404),
        ("error_unavailable", 503),
        ("error_overloaded", 503),
        ("error_unsupported", 501),
        ("error_exists", 400),
        ("error_cancelled", 400),
        ("error_internal", 500),
    ];
    for (model, status) in cases {
        let reply = send(
            &app,
            post_json(&format!("/v2/models/{model}/infer"), &request),
        )
        .await;
        assert_eq!(reply.status.as_u16(), status, "{model}");
        assert_eq!(reply.error(), "boom");
    }
}
