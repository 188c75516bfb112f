//! [`DataPlane`]: the single-node [`InferenceService`] — requests in, models run, answers out.
//!
//! ```text
//! infer: shutdown gate ─► trace (sampled) ─► manager.get(model, version)
//!        ─► LoadedVersion::infer (crate::request: check, count, run on the version's runner)
//!        ensemble steps come back through infer_model (never refused while draining)
//! infer_stream: shutdown gate ─► RequestPath::stream_model: a decoupled model's or decoupled
//!        ensemble's responses (LoadedVersion::infer_stream), any other model's one answer;
//!        a decoupled ensemble's steps come back through stream_model
//! ```
//!
//! The request path runs on owned handles ([`RequestPath`]: the manager and the tracer), so a
//! decoupled ensemble's response stream, which outlives the call that started it, can still
//! run its steps.
//!
//! This module only adapts [`InferenceService`] to the model manager and the request path; it
//! holds no request logic of its own.
//!
//! A sampled request (see `nereid_telemetry::trace_config`) gets a root span `InferRequest`
//! (child of the caller's `traceparent`) with phases `receive` (frontend decode and checks),
//! `queue`, `compute_input`, `compute_infer`, `compute_output` and `send` (the frontend's
//! encoding, closed through the request's response hook; a stream records each response
//! instead). Ensemble steps, a decoupled ensemble's too, run with the ensemble's span as their
//! parent, so each step is a child trace of it. Log lines written while a traced unary request
//! runs carry its `trace_id`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use nereid_proto::{LogSettings, TraceSettings, TraceSettingsUpdate};
use nereid_telemetry::logging::LogControl;
use nereid_telemetry::{AttrValue, RequestTrace, SpanKind, Tracer};
use tracing::Instrument;

use async_trait::async_trait;
use futures::future::BoxFuture;
use nereid_proto::pb::inference::{ModelConfig, ModelStatistics};
use nereid_proto::{
    DataType, InferRequest, InferResponse, InferenceService, LoadRequest, ModelIndexEntry,
    ModelLoadReport, ModelMetadata, ResponseStream, ServerMetadata, ServiceError, ServiceResult,
    TensorMetadata, UnloadRequest, message_from_json,
};

use crate::manager::{ControlMode, LoadSource, ModelManager, overrides};
use crate::request::{RunContext, StreamContext};

/// Triton's server extensions that Nereid implements, in Triton's order.
pub const EXTENSIONS: &[&str] = &[
    "classification",
    "sequence",
    "model_repository",
    "model_repository(unload_dependents)",
    "schedule_policy",
    "model_configuration",
    "system_shared_memory",
    "cuda_shared_memory",
    "binary_tensor_data",
    "parameters",
    "statistics",
    "trace",
    "logging",
];

/// Server-level settings visible through the API.
#[derive(Clone, Debug)]
pub struct DataPlaneConfig {
    /// Name in server metadata (Triton's `--id`).
    pub server_name: String,
    /// Ready requires every model to be ready.
    pub strict_readiness: bool,
}

/// The single-node inference service.
pub struct DataPlane {
    config: DataPlaneConfig,
    manager: Arc<ModelManager>,
    shutting_down: AtomicBool,
    tracer: Tracer,
    logs: Arc<LogControl>,
}

impl DataPlane {
    /// A data plane serving `manager`'s models with `config`; tracing is off and logging
    /// uses the process's log control until [`DataPlane::with_telemetry`].
    pub fn new(config: DataPlaneConfig, manager: Arc<ModelManager>) -> DataPlane {
        DataPlane {
            config,
            manager,
            shutting_down: AtomicBool::new(false),
            tracer: Tracer::disabled(),
            logs: nereid_telemetry::logging::control(),
        }
    }

    /// Traces requests with `tracer` and serves the logging API with `logs`.
    pub fn with_telemetry(mut self, tracer: Tracer, logs: Arc<LogControl>) -> DataPlane {
        self.tracer = tracer;
        self.logs = logs;
        self
    }

    /// The model manager whose models this data plane serves.
    pub fn manager(&self) -> &Arc<ModelManager> {
        &self.manager
    }

    /// Marks the server as shutting down: not ready, new inferences refused.
    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
    }
}

#[async_trait]
impl InferenceService for DataPlane {
    async fn server_live(&self) -> bool {
        true
    }

    async fn server_ready(&self) -> bool {
        if self.shutting_down.load(Ordering::SeqCst) || !self.manager.startup_done() {
            return false;
        }
        !self.config.strict_readiness || self.manager.all_ready()
    }

    async fn model_load(&self, name: &str) -> Option<ModelLoadReport> {
        let versions: Vec<_> = self
            .manager
            .all_versions()
            .into_iter()
            .filter(|v| v.name == name)
            .collect();
        (!versions.is_empty()).then(|| ModelLoadReport {
            pending_requests: versions.iter().map(|v| v.stats.pending_count()).sum(),
            in_flight_requests: versions.iter().map(|v| v.stats.in_flight()).sum(),
        })
    }

    fn server_metadata(&self) -> ServerMetadata {
        ServerMetadata {
            name: self.config.server_name.clone(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            extensions: EXTENSIONS.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// An unknown model or version is simply not ready (Triton: HTTP 400 "Model version not
    /// ready", gRPC `ready: false`).
    async fn model_ready(&self, name: &str, version: Option<i64>) -> ServiceResult<bool> {
        match self.manager.readiness(name, version) {
            Err(ServiceError::NotFound(_)) => Ok(false),
            other => other,
        }
    }

    async fn model_metadata(
        &self,
        name: &str,
        version: Option<i64>,
    ) -> ServiceResult<ModelMetadata> {
        let loaded = self.manager.get(name, version)?;
        let config = &loaded.config;
        let tensor = |n: &str, t: DataType, dims: &[i64]| {
            let mut shape = dims.to_vec();
            if config.batching() {
                shape.insert(0, -1);
            }
            TensorMetadata {
                name: n.to_string(),
                datatype: t.as_wire().to_string(),
                shape,
            }
        };
        Ok(ModelMetadata {
            name: name.to_string(),
            versions: self
                .manager
                .versions(name)
                .iter()
                .map(i64::to_string)
                .collect(),
            platform: if config.platform.is_empty() {
                config.backend.clone()
            } else {
                config.platform.clone()
            },
            inputs: config
                .inputs
                .iter()
                .map(|i| tensor(&i.name, i.datatype, &i.dims))
                .collect(),
            outputs: config
                .outputs
                .iter()
                .map(|o| tensor(&o.name, o.datatype, &o.dims))
                .collect(),
        })
    }

    async fn model_config(&self, name: &str, version: Option<i64>) -> ServiceResult<ModelConfig> {
        Ok(self.manager.get(name, version)?.config.wire().clone())
    }

    async fn model_statistics(
        &self,
        name: &str,
        version: Option<i64>,
    ) -> ServiceResult<Vec<ModelStatistics>> {
        if name.is_empty() {
            return Ok(self
                .manager
                .all_versions()
                .iter()
                .map(|v| v.stats.snapshot(&v.name, v.version))
                .collect());
        }
        // Triton's words and code (400) for a model or version it does not serve.
        let unknown_model =
            || ServiceError::invalid(format!("requested model '{name}' is not available"));
        match version {
            Some(_) => {
                if self.manager.readiness(name, None).is_err() {
                    return Err(unknown_model());
                }
                let v = self.manager.get(name, version).map_err(|_| {
                    ServiceError::invalid(format!(
                        "requested model version is not available for model '{name}'"
                    ))
                })?;
                Ok(vec![v.stats.snapshot(&v.name, v.version)])
            }
            None => {
                let versions = self.manager.versions(name);
                if versions.is_empty() {
                    return Err(unknown_model());
                }
                versions
                    .into_iter()
                    .map(|v| {
                        self.manager
                            .get(name, Some(v))
                            .map(|l| l.stats.snapshot(&l.name, l.version))
                    })
                    .collect()
            }
        }
    }

    async fn infer(&self, request: InferRequest) -> ServiceResult<InferResponse> {
        if self.shutting_down.load(Ordering::SeqCst) {
            return Err(ServiceError::unavailable(
                "Server is shutting down and has stopped accepting new requests.",
            ));
        }
        self.path().infer_model(request).await
    }

    async fn infer_stream(&self, request: InferRequest) -> ServiceResult<ResponseStream> {
        if self.shutting_down.load(Ordering::SeqCst) {
            return Err(ServiceError::unavailable(
                "Server is shutting down and has stopped accepting new requests.",
            ));
        }
        self.path().stream_model(request).await
    }

    async fn repository_index(&self, ready_only: bool) -> ServiceResult<Vec<ModelIndexEntry>> {
        self.manager.index(ready_only)
    }

    async fn load_model(&self, name: &str, request: LoadRequest) -> ServiceResult<()> {
        self.explicit_only()?;
        let config = match &request.config {
            Some(text) => Some(message_from_json::<ModelConfig>(text).map_err(|e| {
                ServiceError::invalid(format!("failed to load '{name}': the 'config' parameter is not a valid model config: {e}"))
            })?),
            None => None,
        };
        let source = if request.files.is_empty() {
            LoadSource::Repository {
                config_override: config,
            }
        } else {
            let Some(config) = config else {
                return Err(ServiceError::invalid(format!(
                    "failed to load '{name}': file overrides require the 'config' parameter"
                )));
            };
            LoadSource::Files {
                config,
                dir: overrides::write_override_dir(name, &request.files)?,
            }
        };
        self.manager.load(name, source).await
    }

    /// With `unload_dependents`, an ensemble's composing models are unloaded too (Triton).
    async fn unload_model(&self, name: &str, request: UnloadRequest) -> ServiceResult<()> {
        self.explicit_only()?;
        if request.unload_dependents {
            self.manager.unload_with_composing(name).await
        } else {
            self.manager.unload(name).await
        }
    }

    async fn trace_settings(
        &self,
        model: Option<&str>,
        update: Option<TraceSettingsUpdate>,
    ) -> ServiceResult<TraceSettings> {
        if let Some(name) = model {
            self.manager.readiness(name, None)?;
        }
        self.tracer.settings().apply(model, update)
    }

    async fn log_settings(&self, update: Option<LogSettings>) -> ServiceResult<LogSettings> {
        self.logs.apply(update)
    }
}

/// The request path on owned handles: what runs one model's requests, a client's or an
/// ensemble step's.
#[derive(Clone)]
struct RequestPath {
    manager: Arc<ModelManager>,
    tracer: Tracer,
}

impl RequestPath {
    /// One request to one model: a client's, or an ensemble step's (never refused while the
    /// server drains, so an ensemble that is running finishes). Boxed: ensembles recurse
    /// through it.
    fn infer_model(
        &self,
        request: InferRequest,
    ) -> BoxFuture<'static, ServiceResult<InferResponse>> {
        let path = self.clone();
        Box::pin(async move { path.run_request(request).await })
    }

    /// One streamed request: a decoupled model's (or decoupled ensemble's) responses as they
    /// come, any other model's one answer (through the unary path, traced like any infer).
    /// Never refused while the server drains: a decoupled ensemble's steps come through here.
    fn stream_model(
        &self,
        request: InferRequest,
    ) -> BoxFuture<'static, ServiceResult<ResponseStream>> {
        let path = self.clone();
        Box::pin(async move {
            let started = Instant::now();
            let loaded = path
                .manager
                .get(&request.model_name, request.model_version)?;
            if loaded.streams() {
                let steps = path.clone();
                // Traced on its stream: a decoupled model's request, or a decoupled ensemble's
                // (whose steps come back here as its child traces).
                let model = &request.model_name;
                let trace =
                    path.tracer
                        .start("InferRequest", SpanKind::Server, model, &request.context);
                let ctx = StreamContext {
                    unavailable: &|loaded| path.manager.unavailable(loaded),
                    step: Arc::new(move |r| steps.stream_model(r)),
                    trace,
                };
                return loaded.infer_stream(request, started, ctx);
            }
            Ok(crate::request::single(path.run_request(request).await?))
        })
    }

    /// Runs one request, traced when the tracer samples it.
    async fn run_request(&self, request: InferRequest) -> ServiceResult<InferResponse> {
        let trace = self.tracer.start(
            "InferRequest",
            SpanKind::Server,
            &request.model_name,
            &request.context,
        );
        let Some(mut trace) = trace else {
            return self.execute(request, None).await;
        };
        let context = request.context.clone();
        if trace.wants_tensors() {
            for tensor in &request.inputs {
                trace.tensor(true, tensor);
            }
        }
        let span = tracing::info_span!("request", trace_id = %trace.trace_id());
        let result = self
            .execute(request, Some(&mut trace))
            .instrument(span)
            .await;
        match &result {
            Ok(response) => {
                trace.attribute(
                    "model.version",
                    AttrValue::Text(response.model_version.clone()),
                );
                if !response.id.is_empty() {
                    trace.attribute("request.id", AttrValue::Text(response.id.clone()));
                }
                if trace.wants_tensors() {
                    for tensor in &response.outputs {
                        trace.tensor(false, tensor);
                    }
                }
            }
            Err(e) => trace.fail(e.to_string()),
        }
        trace.done(Instant::now());
        trace.close_after_send(&context);
        result
    }

    /// Finds the version and runs the request on it ([`crate::request`]).
    async fn execute(
        &self,
        request: InferRequest,
        trace: Option<&mut RequestTrace>,
    ) -> ServiceResult<InferResponse> {
        let started = Instant::now();
        let loaded = self
            .manager
            .get(&request.model_name, request.model_version)?;
        let step = |r| -> BoxFuture<'_, ServiceResult<InferResponse>> { self.infer_model(r) };
        let ctx = RunContext {
            unavailable: &|loaded| self.manager.unavailable(loaded),
            step: &step,
            trace,
        };
        loaded.infer(request, started, ctx).await
    }
}

impl DataPlane {
    /// The request path, on this data plane's manager and tracer.
    fn path(&self) -> RequestPath {
        RequestPath {
            manager: self.manager.clone(),
            tracer: self.tracer.clone(),
        }
    }

    /// The repository API loads and unloads only in explicit mode, and never on a worker whose
    /// models a control plane assigns. Refusals are UNAVAILABLE (HTTP 503), like Triton's.
    fn explicit_only(&self) -> ServiceResult<()> {
        if self.manager.cluster_managed() {
            return Err(ServiceError::unavailable(CLUSTER_MANAGED));
        }
        match self.manager.control_mode() {
            ControlMode::Explicit => Ok(()),
            ControlMode::None | ControlMode::Poll => Err(ServiceError::unavailable(
                "explicit model load / unload is not allowed if polling is enabled",
            )),
        }
    }
}

/// Why the repository API refuses a load or unload on a worker.
pub const CLUSTER_MANAGED: &str = "explicit model load / unload is not allowed: models on this worker are managed by the control plane";
