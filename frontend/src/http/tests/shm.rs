//! The system shared memory extension over HTTP: the region endpoints, and infer requests whose
//! inputs and outputs live in a region (objects under /dev/shm, unique per test, removed after).

use std::sync::Arc;

use axum::http::StatusCode;
use serde_json::{Value, json};

use super::{fake, get, last_request, post, post_json, send};
use crate::http::HttpConfig;
use crate::router;
use crate::shm::SharedMemory;
use crate::shm::test_object::TestObject;

fn app_with_shm(shm: SharedMemory) -> (Arc<nereid_proto::testing::FakeService>, axum::Router) {
    let fake = Arc::new(fake());
    let config = HttpConfig {
        shared_memory: shm,
        ..Default::default()
    };
    (fake.clone(), router(fake, config))
}

async fn register(app: &axum::Router, name: &str, key: &str, offset: u64, size: u64) -> StatusCode {
    let uri = format!("/v2/systemsharedmemory/region/{name}/register");
    let body = json!({"key": key, "offset": offset, "byte_size": size});
    send(app, post_json(&uri, &body)).await.status
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

#[tokio::test]
async fn register_status_and_unregister() {
    let obj = TestObject::new(64);
    let (_, app) = app_with_shm(SharedMemory::enabled());
    assert_eq!(register(&app, "in", &obj.key, 0, 32).await, StatusCode::OK);
    assert_eq!(
        register(&app, "out", &obj.key, 32, 32).await,
        StatusCode::OK
    );

    let all = send(&app, get("/v2/systemsharedmemory/status")).await;
    assert_eq!(all.status, StatusCode::OK);
    assert_eq!(
        all.json(),
        json!([{"name": "in", "key": obj.key, "offset": 0, "byte_size": 32},
               {"name": "out", "key": obj.key, "offset": 32, "byte_size": 32}])
    );
    let one = send(&app, get("/v2/systemsharedmemory/region/out/status")).await;
    assert_eq!(one.json().as_array().map(Vec::len), Some(1));

    let again = "/v2/systemsharedmemory/region/in/register";
    let dup = send(
        &app,
        post_json(again, &json!({"key": obj.key, "byte_size": 8})),
    )
    .await;
    assert_eq!(dup.status, StatusCode::BAD_REQUEST);
    assert_eq!(dup.error(), "shared memory region 'in' already in manager");

    let gone = send(
        &app,
        post("/v2/systemsharedmemory/region/in/unregister", ""),
    )
    .await;
    assert_eq!(gone.status, StatusCode::OK);
    let missing = send(&app, get("/v2/systemsharedmemory/region/in/status")).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert_eq!(
        missing.error(),
        "Unable to find system shared memory region: 'in'"
    );
    let all = send(&app, post("/v2/systemsharedmemory/unregister", "")).await;
    assert_eq!(all.status, StatusCode::OK);
    let none = send(&app, get("/v2/systemsharedmemory/status")).await;
    assert_eq!(none.json(), json!([]));
}

#[tokio::test]
async fn bad_registrations_are_400s_naming_the_problem() {
    let obj = TestObject::new(16);
    let (_, app) = app_with_shm(SharedMemory::enabled());
    let uri = "/v2/systemsharedmemory/region/r/register";
    let cases = [
        (
            json!({"key": "/nereid_no_such_key", "byte_size": 4}),
            "Unable to open shared memory region: '/nereid_no_such_key'".to_string(),
        ),
        (
            json!({"key": obj.key, "offset": 8, "byte_size": 16}),
            "failed to register shared memory region 'r': invalid args".to_string(),
        ),
        (
            json!({"byte_size": 4}),
            "Shared memory register request has no 'key' field".to_string(),
        ),
    ];
    for (body, message) in cases {
        let reply = send(&app, post_json(uri, &body)).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(reply.error(), message);
    }
    let no_name = send(
        &app,
        post_json(
            "/v2/systemsharedmemory/register",
            &json!({"key": obj.key, "byte_size": 4}),
        ),
    )
    .await;
    assert_eq!(no_name.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn inputs_are_read_from_and_outputs_written_to_regions() {
    let obj = TestObject::new(64);
    obj.fill(8, &f32_bytes(&[1.5, -2.0]));
    let (fake, app) = app_with_shm(SharedMemory::enabled());
    assert_eq!(register(&app, "in", &obj.key, 0, 32).await, StatusCode::OK);
    assert_eq!(
        register(&app, "out", &obj.key, 32, 32).await,
        StatusCode::OK
    );
    let body = json!({
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2],
                    "parameters": {"shared_memory_region": "in", "shared_memory_offset": 8,
                                   "shared_memory_byte_size": 8}}],
        "outputs": [{"name": "y", "parameters": {"shared_memory_region": "out",
                                                  "shared_memory_offset": 4,
                                                  "shared_memory_byte_size": 16}}]
    });
    let reply = send(&app, post_json("/v2/models/echo/infer", &body)).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    assert_eq!(reply.header("content-type"), Some("application/json"));
    // Listed without data or parameters, as Triton does.
    assert_eq!(
        reply.json()["outputs"],
        json!([{"name": "y", "datatype": "FP32", "shape": [1, 2]}])
    );
    // The service saw an ordinary tensor, and no shared-memory parameters.
    let seen = last_request(&fake);
    assert_eq!(seen.inputs[0].data().as_ref(), &f32_bytes(&[1.5, -2.0])[..]);
    assert!(seen.outputs[0].parameters.is_empty());
    assert_eq!(&obj.contents()[36..44], &f32_bytes(&[1.5, -2.0])[..]);
}

#[tokio::test]
async fn shared_memory_errors_are_400s_and_the_server_keeps_serving() {
    let obj = TestObject::new(16);
    let (_, app) = app_with_shm(SharedMemory::enabled());
    assert_eq!(register(&app, "r", &obj.key, 0, 16).await, StatusCode::OK);
    let input = |params: Value| {
        json!({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2],
                           "parameters": params}]})
    };
    let cases = [
        (
            input(json!({"shared_memory_region": "nope", "shared_memory_byte_size": 8})),
            StatusCode::NOT_FOUND,
            "Unable to find shared memory region: 'nope'",
        ),
        (
            input(
                json!({"shared_memory_region": "r", "shared_memory_offset": 12,
                         "shared_memory_byte_size": 8}),
            ),
            StatusCode::BAD_REQUEST,
            "Invalid offset + byte size for shared memory region: 'r'",
        ),
        (
            input(
                json!({"shared_memory_region": "r", "shared_memory_offset": 16,
                         "shared_memory_byte_size": 8}),
            ),
            StatusCode::BAD_REQUEST,
            "Invalid offset for shared memory region: 'r'",
        ),
        (
            input(json!({"shared_memory_region": "r", "shared_memory_byte_size": 4})),
            StatusCode::BAD_REQUEST,
            "[request id: <id_unknown>] input byte size mismatch for input 'x' for model 'echo'. Expected 8, got 4",
        ),
        (
            json!({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2],
                               "data": [1, 2]}],
                   "outputs": [{"name": "y", "parameters": {"shared_memory_region": "r",
                                                            "shared_memory_byte_size": 4}}]}),
            StatusCode::BAD_REQUEST,
            "shared memory size specified with the request for output 'y' (4 bytes) should be at least 8 bytes to hold the results",
        ),
    ];
    for (body, status, message) in cases {
        let reply = send(&app, post_json("/v2/models/echo/infer", &body)).await;
        assert_eq!(reply.status, status, "{body}");
        assert_eq!(reply.error(), message);
    }
    let ok = json!({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2],
                                "data": [1, 2]}]});
    let reply = send(&app, post_json("/v2/models/echo/infer", &ok)).await;
    assert_eq!(reply.status, StatusCode::OK);
}

#[tokio::test]
async fn a_disabled_registry_refuses_with_its_reason() {
    let (_, app) = app_with_shm(SharedMemory::disabled("no client memory here"));
    let reply = send(
        &app,
        post_json(
            "/v2/systemsharedmemory/region/r/register",
            &json!({"key": "/k", "byte_size": 4}),
        ),
    )
    .await;
    assert_eq!(reply.status, StatusCode::NOT_IMPLEMENTED);
    assert_eq!(
        reply.error(),
        "system shared memory is not available: no client memory here"
    );
    let body = json!({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2],
        "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 8}}]});
    let reply = send(&app, post_json("/v2/models/echo/infer", &body)).await;
    assert_eq!(reply.status, StatusCode::NOT_IMPLEMENTED);
    let status = send(&app, get("/v2/systemsharedmemory/status")).await;
    assert_eq!(status.json(), json!([]));
}
