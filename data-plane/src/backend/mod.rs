//! Backends: the code that loads a model version's files and executes requests on them.
//!
//! ```text
//!  ModelConfig (wire) + version dirs ─► complete: platform/backend (Backend::platforms),
//!                                       Backend::auto_complete (fill inputs/outputs/batching
//!                                       from the file), GPU defaults; then config's defaults
//!                                       and validation
//!  ValidModelConfig + version dir   ──► Backend::load_instance ×N (one per instance)
//!  instance thread:  BackendInstance::execute(&BatchInputs) -> outputs   (blocking, never on tokio)
//! ```
//!
//! Backends load from the typed [`ValidModelConfig`]. The wire config stays only where the
//! repository loader hands it over: `auto_complete` runs on the wire config before it is
//! validated and typed (it completes what validation then checks). The Python backend also
//! renders the validated config's wire form as Triton's JSON for the model's `initialize`.
//!
//! A backend is chosen by the config's `backend` / `platform`, or by the model file in the
//! version directories: each backend says which of Triton's platform names and files are its
//! own ([`Backend::platforms`]), and `complete` fills the config from those answers.
//! Instances are synchronous: each runs on its own OS thread owned by the model's
//! instance pool, so a slow model never blocks the async runtime.

mod batch_inputs;
mod complete;
mod identity;
mod library_path;
mod onnx;
mod params;
mod python;
mod pytorch;
mod shape;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock, Weak};

use nereid_proto::InferenceService;
use nereid_proto::pb::inference::ModelConfig;

use crate::config::ValidModelConfig;
use nereid_proto::{CorrelationId, Parameters, Tensor};
use parking_lot::Mutex;

pub use self::batch_inputs::{BatchInput, BatchInputs};
pub(crate) use self::complete::{CompleteOptions, complete, fill_platform_and_backend};
/// Public for callers that drive the Python backend through the [`Backend`] API directly
/// (its tests, the `python_overhead` example); the others load only through [`Backends`].
pub use self::python::PythonBackend;
/// The stub protocol's decoder as the fuzz targets drive it (the crate's `fuzzing` module).
pub(crate) use self::python::fuzzing as python_fuzzing;

/// What can go wrong inside a backend, by meaning.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// The model cannot be loaded (missing file, bad graph, unavailable device). The message is
    /// the model's UNAVAILABLE reason.
    #[error("{0}")]
    Load(String),
    /// The inputs do not fit the model (the request is at fault).
    #[error("{0}")]
    InvalidInput(String),
    /// The framework failed while executing.
    #[error("{0}")]
    Execution(String),
    /// The model or config uses something this backend does not support.
    #[error("{0}")]
    Unsupported(String),
}

/// The kind of device an instance runs on (from `instance_group.kind`, resolved).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    /// `KIND_CPU`: the instance runs on the host.
    Cpu,
    /// `KIND_GPU`: the instance runs on one GPU.
    Gpu {
        /// The CUDA device ordinal of the GPU (as listed in `instance_group.gpus`).
        device_id: i32,
    },
}

/// Everything a backend needs to create one instance of a model version.
#[derive(Clone, Debug)]
pub struct InstanceContext {
    /// The model's name (its directory name in the repository).
    pub model_name: String,
    /// The version being loaded (the numeric version directory).
    pub version: i64,
    /// The model's directory (`<repo>/<model>`).
    pub model_dir: PathBuf,
    /// The model file or directory inside the version directory (e.g. `<repo>/<model>/1/model.onnx`).
    pub model_path: PathBuf,
    /// The complete, validated config, shared by the version's instances.
    pub config: Arc<ValidModelConfig>,
    /// Instance name as Triton forms it: `<group name>_<index in group>`.
    pub instance_name: String,
    /// Where this instance runs: the host, or the one GPU its group placed it on.
    pub device: DeviceKind,
    /// The version's health board: an instance that loses its worker process marks itself
    /// unhealthy here until it has recovered.
    pub health: Arc<Health>,
    /// The server this instance runs in, for models that call other models (Python BLS).
    pub server: Arc<ServerHandle>,
}

/// Per-version record of unhealthy instances. While any instance is unhealthy the version
/// reports UNAVAILABLE with that instance's reason (Triton: a dead Python stub).
#[derive(Debug, Default)]
pub struct Health {
    unhealthy: Mutex<BTreeMap<String, String>>,
}

impl Health {
    /// Marks `instance` unhealthy with `reason`.
    pub fn set_unhealthy(&self, instance: &str, reason: impl Into<String>) {
        self.unhealthy
            .lock()
            .insert(instance.to_string(), reason.into());
    }

    /// Marks `instance` healthy again.
    pub fn set_healthy(&self, instance: &str) {
        self.unhealthy.lock().remove(instance);
    }

    /// The reason of the first unhealthy instance, if any.
    pub fn unavailable_reason(&self) -> Option<String> {
        self.unhealthy.lock().values().next().cloned()
    }
}

/// A late-bound handle to the server's [`InferenceService`]: the data plane registers itself
/// once it exists (backends are created before it), instances call through it.
#[derive(Default)]
pub struct ServerHandle {
    service: OnceLock<Weak<dyn InferenceService>>,
    runtime: OnceLock<tokio::runtime::Handle>,
    /// The families models define (Python `pb_utils.MetricFamily`), exported on `/metrics`.
    custom_metrics: Arc<crate::custom_metrics::CustomMetrics>,
}

impl std::fmt::Debug for ServerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerHandle")
            .field("bound", &self.service.get().is_some())
            .finish()
    }
}

impl ServerHandle {
    /// Registers the server (first call wins) and the runtime its async calls run on.
    pub fn bind(&self, service: Weak<dyn InferenceService>, runtime: tokio::runtime::Handle) {
        let _ = self.service.set(service);
        let _ = self.runtime.set(runtime);
    }

    /// The server and its runtime, while the server is alive.
    pub fn get(&self) -> Option<(Arc<dyn InferenceService>, tokio::runtime::Handle)> {
        let service = self.service.get()?.upgrade()?;
        Some((service, self.runtime.get()?.clone()))
    }

    /// The registry of the metric families models define.
    pub(crate) fn custom_metrics(&self) -> &Arc<crate::custom_metrics::CustomMetrics> {
        &self.custom_metrics
    }
}

/// One response of a request-level backend: its outputs and the response parameters the model
/// set (Python's `InferenceResponse(..., parameters=...)`), which go to the client's
/// `InferResponse.parameters`. Joined-batch backends set none. Derefs to the tensors, which is
/// what most callers read.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelResponse {
    /// The output tensors, named as the request asked for them.
    pub tensors: Vec<Tensor>,
    /// Response parameters the model set; empty for joined-batch backends.
    pub parameters: Parameters,
}

impl From<Vec<Tensor>> for ModelResponse {
    fn from(tensors: Vec<Tensor>) -> Self {
        ModelResponse {
            tensors,
            parameters: Parameters::new(),
        }
    }
}

/// When a request-level execution passed its phases, as the backend marks them: the inputs
/// handed to the model (compute input ends), the model's answer in (compute infer ends; the
/// rest, reading the outputs, is compute output). Unmarked phases count as compute infer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Phases {
    /// When the inputs were handed to the model (end of compute input); `None`: unmarked.
    pub inputs_sent: Option<std::time::Instant>,
    /// When the model's answer came back (end of compute infer); `None`: unmarked.
    pub answered: Option<std::time::Instant>,
}

impl Phases {
    /// (compute input, compute infer, compute output) of an execution from `started` to
    /// `finished`; marks outside that span or out of order are clamped into it.
    pub fn split(
        &self,
        started: std::time::Instant,
        finished: std::time::Instant,
    ) -> (
        std::time::Duration,
        std::time::Duration,
        std::time::Duration,
    ) {
        let inputs = self.inputs_sent.unwrap_or(started).clamp(started, finished);
        let answered = self.answered.unwrap_or(finished).clamp(inputs, finished);
        (inputs - started, answered - inputs, finished - answered)
    }
}

/// What a request-level execution did with one request.
#[derive(Debug)]
pub enum RequestOutcome {
    /// The request is done: its outputs (a decoupled model's: empty, its responses went to
    /// its stream) with the response parameters the model set, or its error.
    Answered(Result<ModelResponse, BackendError>),
    /// The model handed the request back to run again (Triton's request rescheduling:
    /// `TRITONSERVER_REQUEST_RELEASE_RESCHEDULE`) instead of completing it; a decoupled
    /// request's stream stays open. Only the `iterative_sequence` scheduler runs it again.
    Rescheduled,
}

/// Triton's answer to a request the model rescheduled where nothing runs it again (a model
/// without `iterative_sequence`).
pub const RESCHEDULE_UNSUPPORTED: &str = "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model is not configured to handle such a flag.";

impl RequestOutcome {
    /// The request's result where nothing runs a request again (warm-up, direct calls): a
    /// rescheduled request fails with Triton's error.
    pub fn into_answer(self) -> Result<ModelResponse, BackendError> {
        match self {
            RequestOutcome::Answered(result) => result,
            RequestOutcome::Rescheduled => {
                Err(BackendError::InvalidInput(RESCHEDULE_UNSUPPORTED.into()))
            }
        }
    }
}

/// One event of a decoupled model's response stream.
#[derive(Debug)]
pub enum StreamEvent {
    /// A response: outputs (named as the request asked) with its parameters, or this
    /// response's error. More events follow.
    Response(Result<ModelResponse, BackendError>),
    /// The model's last response, sent together with the final flag (one response marked
    /// final, as Triton's `TRITONSERVER_RESPONSE_COMPLETE_FINAL` on a response); nothing follows.
    LastResponse(Result<ModelResponse, BackendError>),
    /// The final flag alone (the model sent it without a response): the request is complete;
    /// nothing follows. Triton answers it with an empty final response only where the client
    /// asked for one.
    Final,
    /// The request failed outside the model's own responses (rejected by the queue, or its
    /// `execute` failed as a whole); sent by the data plane, never by backends. Ends the stream.
    Failed(nereid_proto::ServiceError),
}

/// Where a decoupled request's responses go.
pub type ResponseSink = tokio::sync::mpsc::UnboundedSender<StreamEvent>;

/// The request parameter that carries a traced request's W3C `traceparent` to its backend,
/// set by the request path (the `request` module) so the calls a model makes (Python BLS) can
/// join the request's trace; the Python backend takes it out before the model sees the
/// parameters, the other backends ignore it.
pub const TRACE_PARAMETER: &str = "nereid_traceparent";

/// One request of a batch, as request-level backends (Python) see it: what Triton's
/// `pb_utils.InferenceRequest` exposes.
#[derive(Debug)]
pub struct RequestView<'a> {
    /// Unique within the server process; names the request for cancellation and streaming.
    pub key: u64,
    /// The client's request id (empty when it sent none).
    pub id: &'a str,
    /// The request's input tensors, as the client sent them (after shape and type checks).
    pub inputs: &'a [Tensor],
    /// Outputs the client asked for (every output of the model when it named none).
    pub outputs: &'a [String],
    /// The request's parameters (the trace parameter [`TRACE_PARAMETER`] included, when traced).
    pub parameters: &'a Parameters,
    /// The sequence id of `sequence_batching` models.
    pub correlation_id: Option<&'a CorrelationId>,
    /// Triton's request flags: 1 = sequence start, 2 = sequence end.
    pub flags: u32,
    /// Set for decoupled models: where their responses go.
    pub stream: Option<&'a ResponseSink>,
}

/// One loaded copy of a model version. `execute` is called from a dedicated thread, one call at
/// a time per instance.
pub trait BackendInstance: Send {
    /// Runs the model on one batch. `inputs` are validated against the config (names,
    /// datatypes, shapes with the batch dimension first when `max_batch_size > 0`); each holds
    /// the batched requests' parts, which the backend copies straight into its own buffers
    /// ([`BatchInput::copy_into`]) or takes as tensors ([`BatchInputs::joined`]). Returns the
    /// outputs named in `outputs`, in that order, with the batch dimension first.
    fn execute(
        &mut self,
        inputs: &BatchInputs<'_>,
        outputs: &[String],
    ) -> Result<Vec<Tensor>, BackendError>;

    /// Whether the scheduler hands this instance whole requests ([`Self::execute_requests`])
    /// instead of one batch of joined inputs ([`Self::execute`]).
    fn request_level(&self) -> bool {
        false
    }

    /// Request-level execution (Python models): one outcome per request, in order: its
    /// result, with the response parameters the model set, or [`RequestOutcome::Rescheduled`]
    /// when the model handed it back to run again. The outer error fails every request of the
    /// batch. Decoupled models answer through each request's `stream` and return empty outputs
    /// here. The backend marks in `phases` when it handed the inputs over and when the model's
    /// answer came in, which the statistics split into compute input / infer / output.
    fn execute_requests(
        &mut self,
        requests: &[RequestView<'_>],
        phases: &mut Phases,
    ) -> Result<Vec<RequestOutcome>, BackendError> {
        let _ = (requests, phases);
        Err(BackendError::Unsupported(
            "this backend executes joined batches, not single requests".into(),
        ))
    }

    /// The process the instance runs the model in when that is not this one (a Python
    /// stub): its memory is the instance's. `None`: the instance lives in this process.
    fn process_id(&self) -> Option<u32> {
        None
    }
}

impl BackendError {
    /// An auto-complete failure of `model`, with Triton's wording.
    fn auto_complete(model: &str, reason: impl std::fmt::Display) -> BackendError {
        BackendError::Load(format!("unable to auto-complete model '{model}': {reason}"))
    }
}

/// What Triton's configs and model files call a backend's models: how `complete` tells which
/// backend a config without one is for, and which platform a config without one gets.
#[derive(Clone, Copy, Debug, Default)]
pub struct Platforms {
    /// Triton's `platform` values for this backend (`onnxruntime_onnx`); a config naming one runs
    /// on this backend.
    pub names: &'static [&'static str],
    /// The platform written into a config that names this backend and no platform (Triton does
    /// so for ONNX Runtime only).
    pub implied: Option<&'static str>,
    /// Model files that make a version directory this backend's when the config names neither
    /// backend nor platform, each with the platform Triton then writes in, if any.
    pub files: &'static [(&'static str, Option<&'static str>)],
}

/// A kind of model (ONNX Runtime, PyTorch, Python...).
pub trait Backend: Send + Sync {
    /// Triton's backend name (`onnxruntime`).
    fn name(&self) -> &'static str;
    /// Default model file name inside a version directory (`model.onnx`).
    fn default_model_filename(&self) -> &'static str;
    /// The platform names and model files that are this backend's. The default: none (the
    /// backend is chosen only by naming it in the config).
    fn platforms(&self) -> Platforms {
        Platforms::default()
    }
    /// Checks the `parameters` this backend reads from a model's config (names the parameter and
    /// what is wrong), without loading anything, so `check-config` and every load report a bad
    /// value the same way. The default: the backend reads none.
    fn check_parameters(&self, config: &ModelConfig) -> Result<(), String> {
        let _ = config;
        Ok(())
    }
    /// Fills what the config leaves out (inputs, outputs, `max_batch_size`) from the model file,
    /// the way Triton's backend does. Called only when auto-complete is enabled. The default
    /// keeps the config as it is: for backends with no file to read a signature from.
    fn auto_complete(
        &self,
        config: &mut ModelConfig,
        model_path: &std::path::Path,
    ) -> Result<(), BackendError> {
        let _ = (config, model_path);
        Ok(())
    }
    /// Whether this backend can run instances on a GPU in this process; `Err` says what is
    /// missing. Decides what `KIND_AUTO` becomes on a host with GPUs (asked only there). The
    /// default: CPU only.
    fn gpu_support(&self) -> Result<(), String> {
        Err(format!("the {} backend runs on the CPU only", self.name()))
    }
    /// How many instances a `KIND_CPU` instance group that sets no `count` runs (Triton's
    /// `SetDefaultInstanceCount`). The default: one.
    fn default_cpu_instance_count(&self) -> u32 {
        1
    }
    /// Whether instances run the model in processes of their own
    /// ([`BackendInstance::process_id`]) rather than in this one. Decides how a load's memory
    /// is measured: those processes' memory, or this process's C heap growth across the load
    /// ([`crate::probe::heap`]).
    fn out_of_process(&self) -> bool {
        false
    }
    /// Loads one instance. Fails with [`BackendError::Load`] and a reason the user can act on.
    fn load_instance(
        &self,
        ctx: &InstanceContext,
    ) -> Result<Box<dyn BackendInstance>, BackendError>;
}

/// The backends this build can run, by Triton backend name.
#[derive(Clone)]
pub struct Backends {
    onnxruntime: Arc<onnx::OnnxRuntimeBackend>,
    identity: Arc<identity::IdentityBackend>,
    python: Arc<python::PythonBackend>,
    pytorch: Arc<pytorch::PyTorchBackend>,
    server: Arc<ServerHandle>,
    /// How many GPUs the server sees: NVML's device count, probed on first use (0 without
    /// NVML), or set by [`Backends::with_gpu_count`].
    gpu_count: Arc<OnceLock<u32>>,
}

impl Backends {
    /// `onnxruntime_library`: the ONNX Runtime shared library to load; `None` lets the system
    /// loader search for `libonnxruntime.so`. A missing or broken library becomes a
    /// [`BackendError::Load`] for the model that needs it.
    pub fn new(onnxruntime_library: Option<PathBuf>) -> Self {
        Backends {
            onnxruntime: Arc::new(onnx::OnnxRuntimeBackend::new(onnxruntime_library)),
            identity: Arc::new(identity::IdentityBackend),
            python: Arc::new(python::PythonBackend::default()),
            pytorch: Arc::new(pytorch::PyTorchBackend::default()),
            server: Arc::new(ServerHandle::default()),
            gpu_count: Arc::new(OnceLock::new()),
        }
    }

    /// Pretends the host has `count` GPUs (ids `0..count`) instead of asking NVML: for tests,
    /// and for hosts where NVML must not be asked.
    pub fn with_gpu_count(mut self, count: u32) -> Self {
        self.gpu_count = Arc::new(OnceLock::from(count));
        self
    }

    /// How many GPUs the server sees (NVML's count, asked once; 0 without NVML). `KIND_AUTO`
    /// instance groups go on these GPUs when the model's backend can use them.
    pub fn visible_gpus(&self) -> u32 {
        *self
            .gpu_count
            .get_or_init(|| crate::probe::gpu::Gpus::probe().count())
    }

    /// Python models that name no `EXECUTION_ENV_PATH` run on `default_python` (`--python`);
    /// `None`: `python3` on `PATH`.
    pub fn with_python(mut self, default_python: Option<PathBuf>) -> Self {
        self.python = Arc::new(python::PythonBackend::new(default_python));
        self
    }

    /// The handle instances use to reach the server (bound by the data plane at start).
    pub fn server(&self) -> &Arc<ServerHandle> {
        &self.server
    }

    /// Removes files backends keep for the life of the server (the Python runtime directory);
    /// called once the server has stopped serving, just before the process exits.
    pub fn cleanup(&self) {
        self.python.cleanup();
    }

    /// Shutdown, once every model is unloaded: waits for the Python stubs to finish `finalize`
    /// and exit, at most until `deadline`, then kills and reaps those left. Returns the stubs
    /// it had to kill.
    pub fn stop_children(&self, deadline: std::time::Instant) -> Vec<String> {
        self.python.stop_stubs(deadline)
    }

    /// The backend for a config's `backend` field; a message naming it when this build has none.
    pub fn get(&self, name: &str) -> Result<Arc<dyn Backend>, String> {
        // A backend name is a directory name under the backend directory, never a path.
        if name == ".." || name.contains(['/', '\\']) {
            return Err(format!(
                "backend name '{name}' must not leave the backend directory: name a backend, not a path"
            ));
        }
        match name {
            "onnxruntime" => Ok(self.onnxruntime.clone()),
            "identity" => Ok(self.identity.clone()),
            "python" => Ok(self.python.clone()),
            "" => Err("ensemble models (platform 'ensemble') are not supported by this version of Nereid yet".to_string()),
            "pytorch" => Ok(self.pytorch.clone()),
            other => Err(format!("unknown backend '{other}': this build supports 'onnxruntime', 'pytorch', 'python' and 'identity'")),
        }
    }
}

#[cfg(test)]
mod phase_tests {
    use std::time::{Duration, Instant};

    use super::Phases;

    #[test]
    fn phases_split_an_execution_and_default_to_infer() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let end = t0 + ms(10);
        assert_eq!(Phases::default().split(t0, end), (ms(0), ms(10), ms(0)));
        let marked = Phases {
            inputs_sent: Some(t0 + ms(2)),
            answered: Some(t0 + ms(7)),
        };
        assert_eq!(marked.split(t0, end), (ms(2), ms(5), ms(3)));
        let disordered = Phases {
            inputs_sent: Some(t0 + ms(8)),
            answered: Some(t0 + ms(3)),
        };
        assert_eq!(disordered.split(t0, end), (ms(8), ms(0), ms(2)));
    }
}
