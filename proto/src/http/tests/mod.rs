//! Router-level tests: a mock [`InferenceService`] behind [`router`], driven with
//! `tower::ServiceExt::oneshot`, asserting what a client would see.

mod binary;
mod generate;
mod infer;
mod limits;
mod routes;
mod serve;

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode};
use bytes::Bytes;
use futures::StreamExt;
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;

use super::{HttpConfig, router};
use crate::error::{ServiceError, ServiceResult};
use crate::pb::inference::{ModelConfig, ModelInput, ModelStatistics};
use crate::service::{
    InferenceService, LoadRequest, ModelIndexEntry, ModelMetadata, ResponseStream, ServerMetadata,
    StreamedResponse, TensorMetadata,
};
use crate::types::{InferRequest, InferResponse};

/// A service that echoes inputs back as outputs and fails on cue.
///
/// Models: `missing` is unknown (404); `notready` is loaded but not ready; `error_<class>`
/// fails inference with that error class; `raw_fp32` (batching, dims `[-1, 2]`), `raw_bytes`
/// (dims `[1]`) and `two_inputs` have configs for raw binary requests. Any other model echoes:
/// output `i` is input `i`, renamed to requested output `i` when outputs are named.
///
/// Models named `gen*` have the generate inputs of [`generate_inputs`] (`gen_reserved` also one
/// named `parameters`); their streams are described at [`Mock::infer_stream`].
#[derive(Default)]
pub struct Mock {
    pub not_ready: bool,
    pub last_infer: Mutex<Option<InferRequest>>,
    pub last_load: Mutex<Option<(String, LoadRequest)>>,
    pub last_unload: Mutex<Option<(String, bool)>>,
    /// Lets the second response of `gen_gate` go.
    pub gate: Arc<tokio::sync::Notify>,
    /// Fires when the last `gen_gate` stream is dropped.
    pub gate_dropped: Mutex<Option<tokio::sync::oneshot::Receiver<()>>>,
}

/// Sends on drop: proof that a response stream was dropped.
struct DropSignal(Option<tokio::sync::oneshot::Sender<()>>);

impl Drop for DropSignal {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}

fn tensor_metadata(name: &str, datatype: &str, shape: Vec<i64>) -> TensorMetadata {
    TensorMetadata {
        name: name.into(),
        datatype: datatype.into(),
        shape,
    }
}

/// Inputs of the `gen*` models: batching (leading -1) except `fixed`.
pub fn generate_inputs() -> Vec<TensorMetadata> {
    vec![
        tensor_metadata("text_input", "BYTES", vec![-1, -1]),
        tensor_metadata("max_tokens", "INT32", vec![-1, 1]),
        tensor_metadata("stream", "BOOL", vec![-1, 1]),
        tensor_metadata("bias", "FP32", vec![-1, 2]),
        tensor_metadata("fixed", "UINT8", vec![3]),
    ]
}

fn unknown(name: &str) -> ServiceError {
    ServiceError::not_found(format!("Request for unknown model: '{name}' is not found"))
}

fn input(name: &str, data_type: i32, dims: Vec<i64>) -> ModelInput {
    ModelInput {
        name: name.into(),
        data_type,
        dims,
        ..Default::default()
    }
}

#[async_trait]
impl InferenceService for Mock {
    async fn server_live(&self) -> bool {
        true
    }

    async fn server_ready(&self) -> bool {
        !self.not_ready
    }

    fn server_metadata(&self) -> ServerMetadata {
        ServerMetadata {
            name: "nereid".into(),
            version: "0.1.0".into(),
            extensions: vec!["binary_tensor_data".into(), "statistics".into()],
        }
    }

    async fn model_ready(&self, name: &str, _version: Option<i64>) -> ServiceResult<bool> {
        match name {
            "missing" => Err(unknown(name)),
            "notready" => Ok(false),
            _ => Ok(true),
        }
    }

    async fn model_metadata(
        &self,
        name: &str,
        version: Option<i64>,
    ) -> ServiceResult<ModelMetadata> {
        if name == "missing" {
            return Err(unknown(name));
        }
        let inputs = match name {
            "gen_reserved" => {
                let mut inputs = generate_inputs();
                inputs.push(tensor_metadata("parameters", "BYTES", vec![1]));
                inputs
            }
            _ if name.starts_with("gen") => generate_inputs(),
            _ => vec![tensor_metadata("x", "FP32", vec![-1, 2])],
        };
        Ok(ModelMetadata {
            name: name.into(),
            versions: vec![version.unwrap_or(1).to_string()],
            platform: "onnxruntime_onnx".into(),
            inputs,
            outputs: vec![tensor_metadata("y", "FP32", vec![-1, 2])],
        })
    }

    async fn model_config(&self, name: &str, _version: Option<i64>) -> ServiceResult<ModelConfig> {
        let (max_batch_size, inputs) = match name {
            "missing" => return Err(unknown(name)),
            "raw_fp32" => (4, vec![input("x", 11, vec![-1, 2])]),
            "raw_bytes" => (0, vec![input("s", 13, vec![1])]),
            "raw_two_vars" => (0, vec![input("x", 11, vec![-1, -1])]),
            "two_inputs" => (0, vec![input("a", 11, vec![1]), input("b", 11, vec![1])]),
            _ => (0, vec![]),
        };
        Ok(ModelConfig {
            name: name.into(),
            max_batch_size,
            input: inputs,
            ..Default::default()
        })
    }

    async fn model_statistics(
        &self,
        name: &str,
        version: Option<i64>,
    ) -> ServiceResult<Vec<ModelStatistics>> {
        if name == "missing" {
            return Err(unknown(name));
        }
        let names = if name.is_empty() {
            vec!["a", "b"]
        } else {
            vec![name]
        };
        Ok(names
            .into_iter()
            .map(|n| ModelStatistics {
                name: n.into(),
                version: version.unwrap_or(1).to_string(),
                inference_count: 3,
                ..Default::default()
            })
            .collect())
    }

    async fn infer(&self, request: InferRequest) -> ServiceResult<InferResponse> {
        *self.last_infer.lock().unwrap() = Some(request.clone());
        let message = || "boom".to_string();
        match request.model_name.as_str() {
            "missing" => return Err(unknown("missing")),
            "error_invalid" => return Err(ServiceError::InvalidArgument(message())),
            "error_not_found" => return Err(ServiceError::NotFound(message())),
            "error_unavailable" => return Err(ServiceError::Unavailable(message())),
            "error_overloaded" => return Err(ServiceError::Overloaded(message())),
            "error_unsupported" => return Err(ServiceError::Unsupported(message())),
            "error_exists" => return Err(ServiceError::AlreadyExists(message())),
            "error_cancelled" => return Err(ServiceError::Cancelled(message())),
            "error_internal" => return Err(ServiceError::Internal(message())),
            _ => {}
        }
        let outputs = if request.outputs.is_empty() {
            request.inputs.clone()
        } else {
            request
                .outputs
                .iter()
                .zip(request.inputs.iter().cycle())
                .map(|(o, t)| t.clone().renamed(o.name.clone()))
                .collect()
        };
        Ok(InferResponse {
            model_name: request.model_name.clone(),
            model_version: request.model_version.unwrap_or(1).to_string(),
            id: request.id.clone(),
            parameters: request.parameters.clone(),
            outputs,
        })
    }

    /// Streams of the `gen*` models, each response the echo of [`Mock::infer`]:
    /// `gen_two` two responses; `gen_empty_final` one, then an empty final item;
    /// `gen_nothing` only an empty final item; `gen_fail_first` an error item first;
    /// `gen_fail_mid` one response, then an error item; `gen_gate` one response, then one more
    /// once [`Mock::gate`] is notified; `gen_not_utf8` a BYTES output that is not UTF-8.
    /// Any other model answers once, through `infer`.
    async fn infer_stream(&self, request: InferRequest) -> ServiceResult<ResponseStream> {
        let model = request.model_name.clone();
        let mut response = self.infer(request).await?;
        let item = |response: &InferResponse, last| {
            Ok(StreamedResponse {
                response: Some(response.clone()),
                last,
            })
        };
        let end = || {
            Ok(StreamedResponse {
                response: None,
                last: true,
            })
        };
        let items = match model.as_str() {
            "gen_two" => vec![item(&response, false), item(&response, true)],
            "gen_empty_final" => vec![item(&response, false), end()],
            "gen_nothing" => vec![end()],
            "gen_fail_first" => vec![Err(ServiceError::unavailable("model is warming up"))],
            "gen_fail_mid" => vec![
                item(&response, false),
                Err(ServiceError::internal("boom mid-stream")),
            ],
            "gen_gate" => {
                let (tx, rx) = tokio::sync::oneshot::channel();
                *self.gate_dropped.lock().unwrap() = Some(rx);
                let guard = DropSignal(Some(tx));
                let gate = self.gate.clone();
                let first = futures::stream::iter([item(&response, false)]);
                let second = futures::stream::once(async move {
                    gate.notified().await;
                    let _held = guard;
                    item(&response, true)
                });
                return Ok(Box::pin(first.chain(second)));
            }
            "gen_not_utf8" => {
                let mut data = Vec::new();
                crate::types::push_bytes_element(&mut data, &[0xff, 0xfe]);
                let bad = crate::types::Tensor::new(
                    "raw_out",
                    crate::DataType::Bytes,
                    vec![1],
                    Bytes::from(data),
                )?;
                response.outputs = vec![bad];
                vec![item(&response, true)]
            }
            _ => vec![item(&response, true)],
        };
        Ok(Box::pin(futures::stream::iter(items)))
    }

    async fn repository_index(&self, ready_only: bool) -> ServiceResult<Vec<ModelIndexEntry>> {
        let mut entries = vec![ModelIndexEntry {
            name: "a".into(),
            version: "1".into(),
            state: "READY".into(),
            reason: String::new(),
        }];
        if !ready_only {
            entries.push(ModelIndexEntry {
                name: "b".into(),
                version: String::new(),
                state: String::new(),
                reason: String::new(),
            });
        }
        Ok(entries)
    }

    async fn load_model(&self, name: &str, request: LoadRequest) -> ServiceResult<()> {
        *self.last_load.lock().unwrap() = Some((name.into(), request));
        if name == "missing" {
            Err(unknown(name))
        } else {
            Ok(())
        }
    }

    async fn unload_model(&self, name: &str, unload_dependents: bool) -> ServiceResult<()> {
        *self.last_unload.lock().unwrap() = Some((name.into(), unload_dependents));
        Ok(())
    }
}

/// A router over a fresh mock with the given input limit.
pub fn app_with(mock: Mock, max_input_size: usize) -> (Arc<Mock>, axum::Router) {
    let mock = Arc::new(mock);
    let router = router(mock.clone(), HttpConfig { max_input_size });
    (mock, router)
}

pub fn app() -> (Arc<Mock>, axum::Router) {
    app_with(Mock::default(), HttpConfig::default().max_input_size)
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
