//! Backends: the code that loads a model version's files and executes requests on them.
//!
//! ```text
//!  ModelConfig + version dir ──► Backend::auto_complete (fill inputs/outputs/batching from file)
//!                            ──► Backend::load_instance ×N (one per instance_group instance)
//!  instance thread:  BackendInstance::execute(inputs) -> outputs   (blocking, never on tokio)
//! ```
//!
//! A backend is chosen by the config's `backend` / `platform` ([`crate::config`] normalizes
//! them). Instances are synchronous: each runs on its own OS thread owned by the model's
//! instance pool, so a slow model never blocks the async runtime.

pub mod identity;
pub mod onnx;

use std::path::PathBuf;
use std::sync::Arc;

use nereid_proto::pb::inference::ModelConfig;
use nereid_proto::types::Tensor;

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
    Cpu,
    Gpu { device_id: i32 },
}

/// Everything a backend needs to create one instance of a model version.
#[derive(Clone, Debug)]
pub struct InstanceContext {
    pub model_name: String,
    pub version: i64,
    /// The model's directory (`<repo>/<model>`).
    pub model_dir: PathBuf,
    /// The model file or directory inside the version directory (e.g. `<repo>/<model>/1/model.onnx`).
    pub model_path: PathBuf,
    /// The complete, validated config.
    pub config: Arc<ModelConfig>,
    /// Instance name as Triton forms it: `<group name>_<index in group>`.
    pub instance_name: String,
    pub device: DeviceKind,
}

/// One loaded copy of a model version. `execute` is called from a dedicated thread, one call at
/// a time per instance.
pub trait BackendInstance: Send {
    /// Runs the model. `inputs` are validated against the config (names, datatypes, shapes with
    /// the batch dimension first when `max_batch_size > 0`). Returns the outputs named in
    /// `outputs`, in that order.
    fn execute(
        &mut self,
        inputs: &[Tensor],
        outputs: &[String],
    ) -> Result<Vec<Tensor>, BackendError>;
}

/// A kind of model (ONNX Runtime, PyTorch, Python...).
pub trait Backend: Send + Sync {
    /// Triton's backend name (`onnxruntime`).
    fn name(&self) -> &'static str;
    /// Default model file name inside a version directory (`model.onnx`).
    fn default_model_filename(&self) -> &'static str;
    /// Fills what the config leaves out (inputs, outputs, `max_batch_size`) from the model file,
    /// the way Triton's backend does. Called only when auto-complete is enabled.
    fn auto_complete(
        &self,
        config: &mut ModelConfig,
        model_path: &std::path::Path,
    ) -> Result<(), BackendError>;
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
}

impl Backends {
    /// `onnxruntime_library`: the ONNX Runtime shared library to load (see
    /// [`onnx::OnnxRuntimeBackend::new`]).
    pub fn new(onnxruntime_library: Option<PathBuf>) -> Self {
        Backends {
            onnxruntime: Arc::new(onnx::OnnxRuntimeBackend::new(onnxruntime_library)),
            identity: Arc::new(identity::IdentityBackend),
        }
    }

    /// The backend for a config's `backend` field; a message naming it when this build has none.
    pub fn get(&self, name: &str) -> Result<Arc<dyn Backend>, String> {
        match name {
            "onnxruntime" => Ok(self.onnxruntime.clone()),
            "identity" => Ok(self.identity.clone()),
            "" => Err("ensemble models (platform 'ensemble') are not supported by this version of Nereid yet".to_string()),
            "pytorch" | "python" => Err(format!(
                "backend '{name}' is not supported by this version of Nereid yet"
            )),
            other => Err(format!("unknown backend '{other}': this build supports 'onnxruntime' and 'identity'")),
        }
    }
}
