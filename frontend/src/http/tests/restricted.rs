//! `--http-restricted-api` and the request limits, through the whole router: what a client
//! sees, and that the service is never called for a refused request.

use axum::http::StatusCode;
use serde_json::json;

use super::*;
use crate::restrict::RestrictedApis;
use nereid_proto::codec::RequestLimits;

fn app_with_config(config: HttpConfig) -> (Arc<FakeService>, axum::Router) {
    let fake = Arc::new(fake());
    let router = router(fake.clone(), config);
    (fake, router)
}

fn restricted() -> (Arc<FakeService>, axum::Router) {
    let values = vec!["inference,model-repository:admin-key=s3".to_string()];
    app_with_config(HttpConfig {
        restricted: RestrictedApis::parse_http(&values).unwrap(),
        ..Default::default()
    })
}

fn echo_body() -> Value {
    json!({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1.0, 2.0]}]})
}

const REFUSAL: &str = "This API is restricted, expecting header 'admin-key'";

#[tokio::test]
async fn restricted_categories_answer_403_before_the_method_and_the_model() {
    let (fake, app) = restricted();
    for request in [
        post_json("/v2/models/echo/infer", &echo_body()),
        post_json("/v2/models/missing/infer", &echo_body()),
        get("/v2/models/echo/infer"),
        post_json("/v2/repository/index", &json!({})),
        post_json("/v2/models/echo/generate", &json!({})),
    ] {
        let reply = send(&app, request).await;
        assert_eq!(reply.status, StatusCode::FORBIDDEN);
        assert_eq!(reply.error(), REFUSAL);
        assert_eq!(reply.header("content-type"), Some("application/json"));
    }
    assert!(fake.requests().is_empty());
    // Unknown paths stay 404; open categories are untouched.
    let reply = send(&app, post("/v2/models/echo/nope", "{}")).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    for uri in [
        "/v2/health/live",
        "/v2",
        "/v2/models/echo",
        "/v2/models/stats",
    ] {
        assert_eq!(send(&app, get(uri)).await.status, StatusCode::OK, "{uri}");
    }
}

#[tokio::test]
async fn the_header_with_the_exact_value_opens_them() {
    let (fake, app) = restricted();
    let with = |value: &str| {
        let mut request = post_json("/v2/models/echo/infer", &echo_body());
        request
            .headers_mut()
            .insert("Admin-Key", value.parse().unwrap());
        request
    };
    assert_eq!(send(&app, with("S3")).await.status, StatusCode::FORBIDDEN);
    assert!(fake.requests().is_empty());
    assert_eq!(send(&app, with("s3")).await.status, StatusCode::OK);
    assert_eq!(fake.requests().len(), 1);
}

#[tokio::test]
async fn request_limits_are_checked_before_the_service() {
    let (fake, app) = app_with_config(HttpConfig {
        limits: RequestLimits {
            max_inputs: 1,
            max_outputs: 1,
            max_tensor_elements: 4,
        },
        ..Default::default()
    });
    let input = |name: &str, shape: Value| json!({"name": name, "datatype": "FP32", "shape": shape, "data": [1.0, 2.0]});
    let cases = [
        (
            json!({"inputs": [input("a", json!([1, 2])), input("b", json!([1, 2]))]}),
            "request has 2 inputs; the server accepts at most 1 (--max-request-inputs)",
        ),
        (
            json!({"inputs": [input("a", json!([1, 2]))], "outputs": [{"name": "y"}, {"name": "z"}]}),
            "request asks for 2 outputs; the server accepts at most 1 (--max-request-outputs)",
        ),
        (
            json!({"inputs": [input("a", json!([1, 5]))]}),
            "input 'a' for model 'echo' has 5 elements (shape [1,5]); the server accepts at most 4 per tensor (--max-tensor-elements)",
        ),
    ];
    for (body, message) in cases {
        let reply = send(&app, post_json("/v2/models/echo/infer", &body)).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST);
        assert_eq!(reply.error(), message);
    }
    assert!(fake.requests().is_empty());
    let ok = json!({"inputs": [input("a", json!([1, 2]))]});
    let reply = send(&app, post_json("/v2/models/echo/infer", &ok)).await;
    assert_eq!(reply.status, StatusCode::OK);
}
