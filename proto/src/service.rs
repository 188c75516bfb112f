//! [`InferenceService`]: what the HTTP and gRPC frontends call.
//!
//! The single-node data plane implements it by running models; in cluster mode the router
//! implements it by forwarding to a worker. Frontends stay thin translations over this trait.

use std::collections::BTreeMap;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;

use crate::error::{ServiceError, ServiceResult};
use crate::pb::inference::{ModelConfig, ModelStatistics};
use crate::settings::{LogSettings, TraceSettings, TraceSettingsUpdate};
use crate::types::{InferRequest, InferResponse};

/// `GET /v2` / gRPC `ServerMetadata`.
#[derive(Clone, Debug, PartialEq)]
pub struct ServerMetadata {
    /// The server's name (Triton answers `triton`).
    pub name: String,
    /// The server's version string.
    pub version: String,
    /// The protocol extensions the server supports (`model_repository`, `statistics`, ...).
    pub extensions: Vec<String>,
}

/// One input or output as model metadata describes it (batch dimension shown as -1).
#[derive(Clone, Debug, PartialEq)]
pub struct TensorMetadata {
    /// The tensor's name in the model.
    pub name: String,
    /// Its wire datatype (`"FP32"`).
    pub datatype: String,
    /// Its dims; `-1` for a variable dim, and first for the batch dimension when batching.
    pub shape: Vec<i64>,
}

/// `GET /v2/models/{m}` / gRPC `ModelMetadata`.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelMetadata {
    /// The model's name.
    pub name: String,
    /// The versions it serves, as strings.
    pub versions: Vec<String>,
    /// The platform (`onnxruntime_onnx`, `pytorch_libtorch`, ...) or backend name.
    pub platform: String,
    /// Its inputs, in config order.
    pub inputs: Vec<TensorMetadata>,
    /// Its outputs, in config order.
    pub outputs: Vec<TensorMetadata>,
}

/// One row of the repository index.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelIndexEntry {
    /// The model's name (its folder in the repository).
    pub name: String,
    /// Empty for a model on disk that was never loaded.
    pub version: String,
    /// `READY`, `UNAVAILABLE`, `LOADING`, `UNLOADING`; empty when never loaded.
    pub state: String,
    /// Why the model is not ready; empty when there is nothing to say.
    pub reason: String,
}

/// The caller's own credential, as it came: the value of the HTTP `Authorization` header or
/// the gRPC `authorization` metadata (`Bearer <token>`). A service that acts elsewhere on the
/// caller's behalf (the router asking the control plane to load a model) sends this, never its
/// own credential. `Debug` never shows it.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Credential(String);

impl Credential {
    /// The header value; `None` when it is blank.
    pub fn new(value: impl Into<String>) -> Option<Credential> {
        let value = value.into();
        (!value.trim().is_empty()).then_some(Credential(value))
    }

    /// The header value, to be sent on.
    pub fn header_value(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Credential(<redacted>)")
    }
}

/// A repository load request's overrides.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LoadRequest {
    /// A `ModelConfig` in protobuf JSON form that replaces the model's `config.pbtxt`.
    pub config: Option<String>,
    /// `file:<version>/<path>` entries: file contents for an override model directory.
    pub files: BTreeMap<String, Bytes>,
    /// The caller's credential, when the request carried one.
    pub credential: Option<Credential>,
}

/// A repository unload request.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct UnloadRequest {
    /// Also unload the models an ensemble uses that nothing else uses.
    pub unload_dependents: bool,
    /// The caller's credential, when the request carried one.
    pub credential: Option<Credential>,
}

impl UnloadRequest {
    /// An unload without a credential.
    pub fn new(unload_dependents: bool) -> UnloadRequest {
        UnloadRequest {
            unload_dependents,
            credential: None,
        }
    }
}

/// How loaded a model is right now, summed over its versions: what the ORCA
/// `endpoint-load-metrics` response header reports to a load balancer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ModelLoadReport {
    /// Requests received and not executing yet (`nv_inference_pending_request_count`).
    pub pending_requests: u64,
    /// Requests received and not answered yet, queued or executing.
    pub in_flight_requests: u64,
}

/// One item of a streamed request's answer.
#[derive(Clone, Debug, PartialEq)]
pub struct StreamedResponse {
    /// `None` only for an empty closing item (`last` set, nothing to send): a decoupled model
    /// that signalled completion without a response.
    pub response: Option<InferResponse>,
    /// No more responses follow for this request (Triton's `triton_final_response`).
    pub last: bool,
}

/// The answers of one streamed request, in the order the model produced them.
pub type ResponseStream = BoxStream<'static, ServiceResult<StreamedResponse>>;

/// The operations every frontend exposes. `version: None` means the latest served version.
#[async_trait]
pub trait InferenceService: Send + Sync + 'static {
    /// Liveness: the process is up and serving requests.
    async fn server_live(&self) -> bool;
    /// Readiness: live and, with strict readiness, every model loaded successfully.
    async fn server_ready(&self) -> bool;
    /// What `GET /v2` answers (no I/O, so synchronous).
    fn server_metadata(&self) -> ServerMetadata;
    /// Whether the model version is ready; `NotFound` for an unknown model or version.
    async fn model_ready(&self, name: &str, version: Option<i64>) -> ServiceResult<bool>;
    /// The model version's metadata; `NotFound` for an unknown model or version.
    async fn model_metadata(
        &self,
        name: &str,
        version: Option<i64>,
    ) -> ServiceResult<ModelMetadata>;
    /// The model version's configuration as it is served (auto-completed); `NotFound` as above.
    async fn model_config(&self, name: &str, version: Option<i64>) -> ServiceResult<ModelConfig>;
    /// Statistics of one model (version), or of every loaded model when `name` is empty.
    async fn model_statistics(
        &self,
        name: &str,
        version: Option<i64>,
    ) -> ServiceResult<Vec<ModelStatistics>>;
    /// Runs one request. Dropping the future cancels the request.
    async fn infer(&self, request: InferRequest) -> ServiceResult<InferResponse>;
    /// Runs one request whose answers stream back (gRPC `ModelStreamInfer`, HTTP
    /// `generate_stream`): a decoupled model sends zero or more responses, any other model
    /// exactly one. An error before anything ran is the outer error; errors after that are
    /// items of the stream, which then ends. The default serves non-decoupled models through
    /// [`Self::infer`].
    async fn infer_stream(&self, request: InferRequest) -> ServiceResult<ResponseStream> {
        let response = self.infer(request).await?;
        Ok(Box::pin(futures::stream::once(async move {
            Ok(StreamedResponse {
                response: Some(response),
                last: true,
            })
        })))
    }
    /// The model's current load; `None` where the service does not measure it (the router)
    /// or the model is not loaded.
    async fn model_load(&self, name: &str) -> Option<ModelLoadReport> {
        let _ = name;
        None
    }
    /// Every model the repository holds, or only the ready versions when `ready_only`.
    async fn repository_index(&self, ready_only: bool) -> ServiceResult<Vec<ModelIndexEntry>>;
    /// Loads (or reloads) a model; `request` may carry a config override and file contents.
    async fn load_model(&self, name: &str, request: LoadRequest) -> ServiceResult<()>;
    /// Unloads a model; `request` says whether the models an ensemble uses go too.
    async fn unload_model(&self, name: &str, request: UnloadRequest) -> ServiceResult<()>;
    /// The trace settings, global (`model: None`) or of one model, after applying `update`
    /// (when given). An unknown model is `NotFound`; an unknown key or bad value
    /// `InvalidArgument` naming it.
    async fn trace_settings(
        &self,
        model: Option<&str>,
        update: Option<TraceSettingsUpdate>,
    ) -> ServiceResult<TraceSettings> {
        let _ = (model, update);
        Err(ServiceError::unsupported(
            "trace settings are not supported by this server",
        ))
    }
    /// The log settings after applying `update` (when given).
    async fn log_settings(&self, update: Option<LogSettings>) -> ServiceResult<LogSettings> {
        let _ = update;
        Err(ServiceError::unsupported(
            "log settings are not supported by this server",
        ))
    }
}
