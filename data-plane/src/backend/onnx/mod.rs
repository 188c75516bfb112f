//! ONNX Runtime backend (`backend: "onnxruntime"`, `platform: "onnxruntime_onnx"`).
//!
//! ```text
//!  OnnxRuntimeBackend::new(library)        nothing loaded yet
//!  auto_complete(config, model.onnx)  ──► runtime::environment (dlopen once) ─► Session
//!                                     ──► signature ─► autocomplete::complete
//!  load_instance(ctx)                 ──► providers (KIND_GPU: TensorRT/CUDA on its GPU)
//!                                     ──► options ─► Session ─► validate
//!                                     ──► OnnxInstance (owns its Session; Session::run is &mut)
//! ```
//! Behaviour follows Triton's ONNX Runtime backend: the same session parameters
//! (`options.rs`), execution providers and accelerators (`providers.rs`), config checks
//! (`validate.rs`) and auto-complete rules (`autocomplete.rs`). `KIND_GPU` needs a GPU build of
//! ONNX Runtime (the `onnxruntime-gpu` wheel's library); with a CPU-only library the load fails
//! naming the missing provider. GPU sessions have never run in Nereid's tests (no GPU there).

mod autocomplete;
mod convert;
mod instance;
mod options;
mod providers;
mod runtime;
mod signature;
mod types;
mod validate;

#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};

use nereid_proto::pb::inference::ModelConfig;
use ort::session::Session;
use ort::session::builder::GraphOptimizationLevel;

use self::instance::OnnxInstance;
use self::options::SessionSettings;
use self::providers::GpuPlan;
use self::signature::ModelSignature;
use super::{Backend, BackendError, BackendInstance, DeviceKind, InstanceContext, Platforms};

/// The ONNX Runtime backend. Cheap to create: the library is loaded by the first model that
/// needs it.
pub struct OnnxRuntimeBackend {
    library: Option<PathBuf>,
    default_max_batch_size: i32,
}

impl OnnxRuntimeBackend {
    /// `library`: path of `libonnxruntime.so` to load. `None` lets the system loader search for
    /// `libonnxruntime.so`. A missing or broken library becomes a [`BackendError::Load`] for the
    /// model that needs it.
    pub fn new(library: Option<PathBuf>) -> Self {
        OnnxRuntimeBackend {
            library,
            default_max_batch_size: autocomplete::DEFAULT_MAX_BATCH_SIZE,
        }
    }

    /// Opens `model_path` (a `model.onnx` file, or a directory holding one and its external
    /// data) with `settings`, on the GPU of `gpu` when given (on the CPU otherwise).
    fn session(
        &self,
        model_path: &Path,
        settings: &SessionSettings,
        gpu: Option<&GpuPlan>,
    ) -> Result<Session, String> {
        let file = model_file(model_path)?;
        let environment = runtime::environment(self.library.as_deref())?;
        let mut providers = match gpu {
            Some(plan) => providers::gpu_providers(plan)?,
            None => Vec::new(),
        };
        let mut builder = Session::builder(&environment)
            .and_then(|b| {
                b.with_optimization_level(settings.level)
                    .map_err(Into::into)
            })
            .and_then(|b| {
                b.with_parallel_execution(settings.parallel)
                    .map_err(Into::into)
            })
            .map_err(|e| format!("cannot create ONNX Runtime session options: {e}"))?;
        if let Some(n) = settings.intra_threads {
            builder = builder
                .with_intra_threads(n)
                .map_err(|e| format!("intra_op_thread_count {n}: {e}"))?;
        }
        if let Some(n) = settings.inter_threads {
            builder = builder
                .with_inter_threads(n)
                .map_err(|e| format!("inter_op_thread_count {n}: {e}"))?;
        }
        if let Some(on) = settings.mem_pattern {
            builder = builder
                .with_memory_pattern(on)
                .map_err(|e| format!("enable_mem_pattern: {e}"))?;
        }
        if let Some(on) = settings.mem_arena {
            providers.push(ort::ep::CPU::default().with_arena_allocator(on).build());
        }
        if !providers.is_empty() {
            builder = builder
                .with_execution_providers(providers)
                .map_err(|e| format!("cannot register ONNX Runtime's execution providers: {e}"))?;
        }
        for (key, value) in &settings.config_entries {
            builder = builder
                .with_config_entry(key, value)
                .map_err(|e| format!("parameter '{key}': {e}"))?;
        }
        builder
            .commit_from_file(&file)
            .map_err(|e| format!("cannot load '{}' with ONNX Runtime: {e}", file.display()))
    }
}

/// `model.onnx` itself, or `model.onnx` inside a model directory (Triton's layout for models
/// with external data).
fn model_file(model_path: &Path) -> Result<PathBuf, String> {
    let file = if model_path.is_dir() {
        model_path.join("model.onnx")
    } else {
        model_path.to_path_buf()
    };
    if !file.is_file() {
        return Err(format!("model file '{}' does not exist", file.display()));
    }
    Ok(file)
}

impl Backend for OnnxRuntimeBackend {
    fn name(&self) -> &'static str {
        "onnxruntime"
    }

    fn default_model_filename(&self) -> &'static str {
        "model.onnx"
    }

    fn platforms(&self) -> Platforms {
        Platforms {
            names: &["onnxruntime_onnx"],
            implied: Some("onnxruntime_onnx"),
            files: &[("model.onnx", Some("onnxruntime_onnx"))],
        }
    }

    /// Two, as Triton's ONNX Runtime backend (a GPU group still runs one per GPU).
    fn default_cpu_instance_count(&self) -> u32 {
        2
    }

    /// The loaded library must have the CUDA execution provider (`onnxruntime-gpu`).
    fn gpu_support(&self) -> Result<(), String> {
        runtime::environment(self.library.as_deref())?;
        providers::cuda_available()
    }

    /// Fills inputs, outputs, `max_batch_size` and `dynamic_batching` from the model, with the
    /// rules documented in `autocomplete.rs`.
    fn auto_complete(
        &self,
        config: &mut ModelConfig,
        model_path: &Path,
    ) -> Result<(), BackendError> {
        let fail = |e| BackendError::auto_complete(&config.name, e);
        // Reading the signature needs no optimisation and no thread pool.
        let settings = SessionSettings {
            intra_threads: Some(1),
            inter_threads: None,
            parallel: false,
            level: GraphOptimizationLevel::Disable,
            mem_arena: None,
            mem_pattern: None,
            config_entries: Vec::new(),
        };
        let session = self.session(model_path, &settings, None).map_err(fail)?;
        let sig = ModelSignature::from_session(&session);
        let mut completed = config.clone();
        autocomplete::complete(&mut completed, &sig, self.default_max_batch_size).map_err(fail)?;
        *config = completed;
        Ok(())
    }

    fn load_instance(
        &self,
        ctx: &InstanceContext,
    ) -> Result<Box<dyn BackendInstance>, BackendError> {
        let label = format!(
            "model '{}' instance '{}'",
            ctx.model_name, ctx.instance_name
        );
        let config = &ctx.config;
        let gpu = match ctx.device {
            DeviceKind::Cpu => None,
            DeviceKind::Gpu { device_id } => Some(
                providers::gpu_plan(&config.gpu_accelerators, device_id)
                    .map_err(|e| BackendError::Load(format!("{label}: {e}")))?,
            ),
        };
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let settings = options::session_settings(config, cores).map_err(|e| {
            BackendError::Load(format!("unable to load model '{}': {e}", ctx.model_name))
        })?;
        let session = self
            .session(&ctx.model_path, &settings, gpu.as_ref())
            .map_err(|e| BackendError::Load(format!("{label}: {e}")))?;
        let sig = ModelSignature::from_session(&session);
        validate::validate(config, &sig).map_err(BackendError::Load)?;
        tracing::info!(
            model = %ctx.model_name,
            version = ctx.version,
            instance = %ctx.instance_name,
            device = ?ctx.device,
            intra_threads = ?settings.intra_threads,
            level = ?settings.level,
            "loaded ONNX Runtime session"
        );
        Ok(Box::new(OnnxInstance::new(session, &sig, config)))
    }
}
