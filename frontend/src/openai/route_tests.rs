//! The `/v1/` routes over a `FakeService`: what request reaches the service, what the client
//! reads back, keys, and cancellation when the event stream's body is dropped.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use futures::StreamExt;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::http::HttpConfig;
use crate::restrict::RestrictedApis;
use crate::router;
use nereid_proto::testing::{Answer, FakeEvent, FakeModel, FakeService, Step};
use nereid_proto::{DataType, Tensor, TensorMetadata, bytes_elements, push_bytes_element};

fn meta(name: &str, datatype: &str) -> TensorMetadata {
    TensorMetadata {
        name: name.into(),
        datatype: datatype.into(),
        shape: vec![1],
    }
}

fn text(name: &str, value: &str) -> Tensor {
    let mut data = Vec::new();
    push_bytes_element(&mut data, value.as_bytes());
    Tensor::new(name, DataType::Bytes, vec![1], data.into()).unwrap()
}

/// A vLLM-style model answering "hi" per response, with `steps` when streamed.
fn llm(steps: Vec<Step>) -> FakeModel {
    FakeModel::echo()
        .inputs(vec![
            meta("text_input", "BYTES"),
            meta("stream", "BOOL"),
            meta("sampling_parameters", "BYTES"),
        ])
        .outputs(vec![meta("text_output", "BYTES")])
        .answer(Answer::Outputs(vec![text("text_output", "hi")]))
        .stream(steps)
}

fn app(fake: FakeService, restricted: RestrictedApis) -> (Arc<FakeService>, axum::Router) {
    let fake = Arc::new(fake);
    let config = HttpConfig {
        restricted,
        ..HttpConfig::default()
    };
    (fake.clone(), router(fake, config))
}

fn post(path: &str, body: Value) -> Request<Body> {
    Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

async fn json_reply(app: &axum::Router, request: Request<Body>) -> (StatusCode, Value) {
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&body).unwrap())
}

#[tokio::test]
async fn completion_builds_the_vllm_request_and_answers_openai_json() {
    let fake = FakeService::new("t").model("llm", llm(vec![Step::respond(true)]));
    let (fake, app) = app(fake, RestrictedApis::default());
    let body = json!({"model": "llm", "prompt": "a b", "max_tokens": 3, "stop": "x"});
    let (status, reply) = json_reply(&app, post("/v1/completions", body)).await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert_eq!(reply["choices"][0]["text"], "hi");
    assert_eq!(reply["choices"][0]["finish_reason"], "stop");
    assert_eq!(
        reply["usage"],
        json!({"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3})
    );
    let request = fake.last_request().unwrap();
    let input = |name: &str| request.inputs.iter().find(|t| t.name() == name).unwrap();
    let first = |t: &Tensor| bytes_elements(t.data()).next().unwrap().to_vec();
    assert_eq!(first(input("text_input")), b"a b");
    assert_eq!(input("stream").data().as_ref(), [0u8]);
    assert_eq!(
        first(input("sampling_parameters")),
        br#"{"max_tokens":3,"stop":["x"]}"#
    );
    let outputs: Vec<&str> = request.outputs.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(outputs, ["text_output"]);
}

#[tokio::test]
async fn unknown_and_unsuitable_models() {
    let fake = FakeService::new("t")
        .model("llm", llm(vec![Step::respond(true)]))
        .model("plain", FakeModel::echo().inputs(vec![meta("x", "FP32")]));
    let (_, app) = app(fake.unknown("nope"), RestrictedApis::default());
    let (status, reply) = json_reply(
        &app,
        post("/v1/completions", json!({"model": "nope", "prompt": "a"})),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(reply["error"]["code"], "model_not_found");
    let (status, reply) = json_reply(
        &app,
        post("/v1/embeddings", json!({"model": "llm", "input": "a"})),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{reply}");
    let (status, _) = json_reply(
        &app,
        post("/v1/completions", json!({"model": "plain", "prompt": "a"})),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let (status, reply) = json_reply(
        &app,
        Request::get("/v1/nothing").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(reply["error"]["type"], "invalid_request_error");
}

#[tokio::test]
async fn api_key_is_the_openai_category() {
    let fake = FakeService::new("t").model("llm", llm(vec![Step::respond(true)]));
    let keys = RestrictedApis::parse_http(&["openai:authorization=Bearer k1".into()]).unwrap();
    let (_, app) = app(fake, keys);
    let list = |key: Option<&str>| {
        let mut request = Request::get("/v1/models");
        if let Some(key) = key {
            request = request.header("authorization", format!("Bearer {key}"));
        }
        request.body(Body::empty()).unwrap()
    };
    let (status, reply) = json_reply(&app, list(None)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(reply["error"]["code"], "invalid_api_key");
    assert_eq!(
        json_reply(&app, list(Some("k2"))).await.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(json_reply(&app, list(Some("k1"))).await.0, StatusCode::OK);
}

#[tokio::test]
async fn dropping_the_event_stream_cancels_the_request() {
    let fake = FakeService::new("t").model("llm", llm(vec![Step::respond(false), Step::Pending]));
    let (fake, app) = app(fake, RestrictedApis::default());
    let mut events = fake.events();
    let body = json!({"model": "llm", "prompt": "a", "stream": true});
    let response = app
        .clone()
        .oneshot(post("/v1/completions", body))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut frames = response.into_body().into_data_stream();
    let first = frames.next().await.unwrap().unwrap();
    assert!(first.starts_with(b"data: "), "{first:?}");
    drop(frames);
    while let Some(event) = events.recv().await {
        if matches!(event, FakeEvent::Cancelled { .. }) {
            return;
        }
    }
    panic!("the service never saw the cancellation");
}
