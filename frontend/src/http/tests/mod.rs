//! Router-level tests: a [`FakeService`] behind [`router`], driven with
//! `tower::ServiceExt::oneshot`, asserting what a client would see.

mod binary;
mod generate;
mod infer;
mod limits;
mod restricted;
mod routes;
mod serve;
mod shm;

use std::sync::Arc;

use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode};
use bytes::Bytes;
use http_body_util::BodyExt;
use serde_json::Value;
use tokio::sync::mpsc;
use tower::ServiceExt;

use super::HttpConfig;
use crate::router;
use nereid_proto::testing::{Answer, FakeEvent, FakeModel, FakeService, Step, tensor};
use nereid_proto::{InferRequest, ModelIndexEntry, ServiceError, TensorMetadata};

/// A service that echoes inputs back as outputs and fails on cue.
///
/// Models: `missing` is unknown (404); `notready` is loaded but not ready; `error_<class>`
/// fails inference with that error class; `raw_fp32` (batching, dims `[-1, 2]`), `raw_bytes`
/// (dims `[1]`) and `two_inputs` have configs for raw binary requests. Any other model echoes:
/// output `i` is input `i`, renamed to requested output `i` when outputs are named; its
/// metadata has input `x` and output `y` (FP32 `[-1, 2]`).
///
/// Models named `gen*` have the generate inputs of [`generate_inputs`] (`gen_reserved` also one
/// named `parameters`); their streams, each response the echo: `gen_two` two responses;
/// `gen_empty_final` one, then an empty final item; `gen_nothing` only an empty final item;
/// `gen_fail_first` an error item first; `gen_fail_mid` one response, then an error item;
/// `gen_gate` one response, then one more once the gate opens; `gen_not_utf8` a BYTES output
/// that is not UTF-8. Any other model answers once.
///
/// The repository index lists `a` (ready, version 1) and `b` (never loaded); statistics
/// report 3 inferences.
pub fn fake() -> FakeService {
    let mut fake = FakeService::new("nereid")
        .version("0.1.0")
        .extensions(&["binary_tensor_data", "statistics"])
        .fallback(
            FakeModel::echo()
                .platform("onnxruntime_onnx")
                .inputs(vec![tensor("x", "FP32", vec![-1, 2])])
                .outputs(vec![tensor("y", "FP32", vec![-1, 2])]),
        )
        .unknown("missing")
        .model("notready", echo().not_ready())
        .model(
            "raw_fp32",
            echo().max_batch_size(4).config_input("x", 11, vec![-1, 2]),
        )
        .model("raw_bytes", echo().config_input("s", 13, vec![1]))
        .model("raw_two_vars", echo().config_input("x", 11, vec![-1, -1]))
        .model(
            "two_inputs",
            echo()
                .config_input("a", 11, vec![1])
                .config_input("b", 11, vec![1]),
        )
        .index(vec![
            index_entry("a", "1", "READY"),
            index_entry("b", "", ""),
        ])
        .statistics(3);
    let boom = || "boom".to_string();
    for (name, error) in [
        ("error_invalid", ServiceError::InvalidArgument(boom())),
        ("error_not_found", ServiceError::NotFound(boom())),
        ("error_unavailable", ServiceError::Unavailable(boom())),
        ("error_overloaded", ServiceError::Overloaded(boom())),
        ("error_unsupported", ServiceError::Unsupported(boom())),
        ("error_exists", ServiceError::AlreadyExists(boom())),
        ("error_cancelled", ServiceError::Cancelled(boom())),
        ("error_internal", ServiceError::Internal(boom())),
    ] {
        fake = fake.model(name, echo().answer(Answer::Fail(error)));
    }
    let respond = Step::respond;
    let streams = [
        ("gen", vec![respond(true)]),
        ("gen_two", vec![respond(false), respond(true)]),
        ("gen_empty_final", vec![respond(false), Step::EmptyFinal]),
        ("gen_nothing", vec![Step::EmptyFinal]),
        (
            "gen_fail_first",
            vec![Step::Fail(ServiceError::unavailable("model is warming up"))],
        ),
        (
            "gen_fail_mid",
            vec![
                respond(false),
                Step::Fail(ServiceError::internal("boom mid-stream")),
            ],
        ),
        ("gen_gate", vec![respond(false), Step::Gate, respond(true)]),
    ];
    for (name, steps) in streams {
        fake = fake.model(name, generate_model(generate_inputs()).stream(steps));
    }
    let mut reserved = generate_inputs();
    reserved.push(tensor("parameters", "BYTES", vec![1]));
    let mut not_utf8 = Vec::new();
    nereid_proto::push_bytes_element(&mut not_utf8, &[0xff, 0xfe]);
    let bad = nereid_proto::Tensor::new(
        "raw_out",
        nereid_proto::DataType::Bytes,
        vec![1],
        Bytes::from(not_utf8),
    )
    .expect("a valid BYTES tensor");
    fake.model("gen_reserved", generate_model(reserved)).model(
        "gen_not_utf8",
        generate_model(generate_inputs()).answer(Answer::Outputs(vec![bad])),
    )
}

fn echo() -> FakeModel {
    FakeModel::echo()
        .platform("onnxruntime_onnx")
        .inputs(vec![tensor("x", "FP32", vec![-1, 2])])
        .outputs(vec![tensor("y", "FP32", vec![-1, 2])])
}

/// A `gen*` model: the echo, with these metadata inputs.
fn generate_model(inputs: Vec<TensorMetadata>) -> FakeModel {
    echo().inputs(inputs)
}

fn index_entry(name: &str, version: &str, state: &str) -> ModelIndexEntry {
    ModelIndexEntry {
        name: name.into(),
        version: version.into(),
        state: state.into(),
        reason: String::new(),
    }
}

/// Inputs of the `gen*` models: batching (leading -1) except `fixed`.
pub fn generate_inputs() -> Vec<TensorMetadata> {
    vec![
        tensor("text_input", "BYTES", vec![-1, -1]),
        tensor("max_tokens", "INT32", vec![-1, 1]),
        tensor("stream", "BOOL", vec![-1, 1]),
        tensor("bias", "FP32", vec![-1, 2]),
        tensor("fixed", "UINT8", vec![3]),
    ]
}

/// The last request the service received (forgetting every one received so far).
pub fn last_request(fake: &FakeService) -> InferRequest {
    fake.take_requests()
        .pop()
        .expect("the request reached the service")
}

/// Waits for the next [`FakeEvent::Cancelled`], skipping other events.
pub async fn next_cancelled(events: &mut mpsc::UnboundedReceiver<FakeEvent>) {
    while let Some(event) = events.recv().await {
        if matches!(event, FakeEvent::Cancelled { .. }) {
            return;
        }
    }
    panic!("the service is gone");
}

/// A router over `fake` with the given input limit.
pub fn app_with(fake: FakeService, max_input_size: usize) -> (Arc<FakeService>, axum::Router) {
    let fake = Arc::new(fake);
    let config = HttpConfig {
        max_input_size,
        ..Default::default()
    };
    let router = router(fake.clone(), config);
    (fake, router)
}

pub fn app() -> (Arc<FakeService>, axum::Router) {
    app_with(fake(), HttpConfig::default().max_input_size)
}

/// What a client sees.
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "body is not JSON ({e}): {:?}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    /// The `error` message of an error body, checking the body's form.
    pub fn error(&self) -> String {
        assert_eq!(self.headers["content-type"], "application/json");
        let json = self.json();
        assert_eq!(json.as_object().map(|o| o.len()), Some(1), "{json}");
        json["error"]
            .as_str()
            .expect("error is a string")
            .to_string()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// Checks that the reply uses the binary tensor extension and returns its JSON header length.
    pub fn binary_header_len(&self) -> usize {
        assert_eq!(
            self.header("content-type"),
            Some("application/octet-stream")
        );
        self.header("inference-header-content-length")
            .expect("Inference-Header-Content-Length is set")
            .parse()
            .expect("the header length is a number")
    }
}

pub async fn send(router: &axum::Router, request: Request<Body>) -> Reply {
    let response = router
        .clone()
        .oneshot(request)
        .await
        .expect("router is infallible");
    let status = response.status();
    let headers = response.headers().clone();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    Reply {
        status,
        headers,
        body,
    }
}

pub fn get(uri: &str) -> Request<Body> {
    Request::get(uri).body(Body::empty()).unwrap()
}

pub fn post(uri: &str, body: impl Into<Body>) -> Request<Body> {
    Request::post(uri).body(body.into()).unwrap()
}

pub fn post_json(uri: &str, json: &Value) -> Request<Body> {
    Request::post(uri)
        .header("content-type", "application/json")
        .body(Body::from(json.to_string()))
        .unwrap()
}
