//! Loading a TorchScript instance through the PyTorch backend library, and the libtorch
//! settings that are process-wide.
//!
//! ```text
//!  load(ctx) ─► settings ─► datatypes ─► the library (opened on the first PyTorch model)
//!            ─► device (KIND_GPU needs a CUDA libtorch and GPU)
//!            ─► process-wide threads (first model that sets them wins, as in Triton)
//!            ─► forward() signature ─► input/output binding
//!            ─► library load of the module (or the shared copy) ─► TorchInstance
//! ```

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use super::binding::{bind_inputs, bind_outputs};
use super::elements::element_type;
use super::instance::TorchInstance;
use super::library::{TorchLibrary, TorchModule, library};
use super::settings::TorchSettings;
use super::signature;
use crate::backend::{BackendError, BackendInstance, DeviceKind, InstanceContext};
use crate::config::ValidModelConfig;

/// A shared module's key: its file and CUDA device (`None`: the CPU).
type ModuleKey = (PathBuf, Option<usize>);

/// Modules loaded with `ENABLE_WEIGHT_SHARING`, by file and device, while an instance holds them.
#[derive(Default)]
pub(crate) struct SharedModules(Mutex<HashMap<ModuleKey, Weak<TorchModule>>>);

impl SharedModules {
    /// How many shared modules are alive.
    #[cfg(all(test, feature = "torch"))]
    pub fn len(&self) -> usize {
        self.0
            .lock()
            .values()
            .filter(|m| m.strong_count() > 0)
            .count()
    }
}

/// The thread counts set so far (libtorch's are process-wide).
static THREADS: Mutex<(Option<i32>, Option<i32>)> = Mutex::new((None, None));

pub(crate) fn load(
    shared: &SharedModules,
    ctx: &InstanceContext,
) -> Result<Box<dyn BackendInstance>, BackendError> {
    let model = &ctx.model_name;
    let label = format!("model '{model}' instance '{}'", ctx.instance_name);
    let unable = |e: String| BackendError::Load(format!("unable to load model '{model}': {e}"));
    let config = &ctx.config;
    if config.platform == "torch_aoti" {
        return Err(unable(
            "platform 'torch_aoti' (AOTInductor, model.pt2) is not supported; export the model with torch.jit.script or torch.jit.trace and serve model.pt with platform 'pytorch_libtorch'".into(),
        ));
    }
    let settings = TorchSettings::from_config(config).map_err(unable)?;
    check_datatypes(config).map_err(unable)?;
    if config.outputs.is_empty() {
        return Err(unable(
            "config.pbtxt lists no outputs; the PyTorch backend needs them listed (a TorchScript file does not name its outputs)".into(),
        ));
    }
    let torch = library().map_err(unable)?;
    let device =
        device(torch, ctx.device).map_err(|e| BackendError::Load(format!("{label}: {e}")))?;
    let file = &ctx.model_path;
    if !file.is_file() {
        return Err(BackendError::Load(format!(
            "{label}: model file '{}' does not exist",
            file.display()
        )));
    }
    apply_process_settings(torch, model, &settings);

    let signature = match signature::read(file) {
        Ok(sig) => Some(sig),
        Err(e) => {
            tracing::warn!(model = %model, error = %e, "cannot read forward()'s signature from the TorchScript file; binding inputs by name convention or config order");
            None
        }
    };
    let inputs: Vec<String> = config.inputs.iter().map(|i| i.name.clone()).collect();
    let outputs: Vec<String> = config.outputs.iter().map(|o| o.name.clone()).collect();
    let binding = bind_inputs(&inputs, signature.as_ref()).map_err(unable)?;
    let output_indices = bind_outputs(&outputs).map_err(unable)?;

    let module = module(torch, shared, file, device, settings.weight_sharing)
        .map_err(|e| BackendError::Load(format!("{label}: {e}")))?;
    tracing::info!(
        model = %model,
        version = ctx.version,
        instance = %ctx.instance_name,
        device = ?ctx.device,
        intra_op_threads = torch.num_threads(),
        optimized_execution = settings.optimized_execution,
        weight_sharing = settings.weight_sharing,
        "loaded TorchScript module"
    );
    Ok(Box::new(TorchInstance::new(
        module,
        config,
        settings,
        binding,
        output_indices,
    )))
}

/// Every configured input and output must have a libtorch element type, or be `BYTES`
/// (a `List[str]`).
fn check_datatypes(config: &ValidModelConfig) -> Result<(), String> {
    let ios = config
        .inputs
        .iter()
        .map(|i| ("input", &i.name, i.datatype))
        .chain(
            config
                .outputs
                .iter()
                .map(|o| ("output", &o.name, o.datatype)),
        );
    for (kind, name, d) in ios {
        if element_type(d).is_none() {
            return Err(format!(
                "{kind} '{name}': data type {} is not supported by the PyTorch backend (libtorch has no tensor of that type)",
                d.to_config().as_str_name()
            ));
        }
    }
    Ok(())
}

/// Whether libtorch can run on a GPU here (opens the library); `Err` says what is missing.
pub(super) fn cuda_support() -> Result<(), String> {
    let count = library()?.cuda_device_count()?;
    if count == 0 {
        return Err("libtorch sees no CUDA device (no GPU or driver here)".into());
    }
    Ok(())
}

/// The CUDA device of an instance (`None`: the CPU). `KIND_GPU` needs libtorch to see that GPU.
fn device(torch: &TorchLibrary, kind: DeviceKind) -> Result<Option<usize>, String> {
    match kind {
        DeviceKind::Cpu => Ok(None),
        DeviceKind::Gpu { device_id } => {
            let count = torch
                .cuda_device_count()
                .and_then(|n| match n {
                    0 => Err("libtorch sees no CUDA device (no GPU or driver here)".into()),
                    n => Ok(n),
                })
                .map_err(|why| {
                    format!(
                        "KIND_GPU (GPU {device_id}) requested, but libtorch cannot use CUDA here: {why}; use KIND_CPU to run this model on the CPU"
                    )
                })?;
            match usize::try_from(device_id) {
                Ok(id) if (device_id as i64) < count => Ok(Some(id)),
                _ => Err(format!(
                    "KIND_GPU (GPU {device_id}) requested, but libtorch sees {count} CUDA device(s)"
                )),
            }
        }
    }
}

/// Loads (or, with weight sharing, reuses) the module on `device`, in eval mode. Only shared
/// loads take the cache's lock (held across the load, so one file is not loaded twice); other
/// instances load in parallel.
fn module(
    torch: &'static TorchLibrary,
    shared: &SharedModules,
    file: &std::path::Path,
    device: Option<usize>,
    sharing: bool,
) -> Result<Arc<TorchModule>, String> {
    if !sharing {
        return torch.load_module(file, device).map(Arc::new);
    }
    let key = (file.to_path_buf(), device);
    let mut cache = shared.0.lock();
    if let Some(module) = cache.get(&key).and_then(Weak::upgrade) {
        return Ok(module);
    }
    let module = Arc::new(torch.load_module(file, device)?);
    cache.retain(|_, m| m.strong_count() > 0);
    cache.insert(key, Arc::downgrade(&module));
    Ok(module)
}

/// Thread counts are process-wide in libtorch: the first model that sets one wins; a later,
/// different value is reported and ignored (Triton's rule).
fn apply_process_settings(torch: &TorchLibrary, model: &str, settings: &TorchSettings) {
    let mut threads = THREADS.lock();
    if let Some(n) = settings.intra_op_threads {
        match threads.0 {
            None => {
                torch.set_num_threads(n);
                threads.0 = Some(n);
            }
            Some(set) if set != n => tracing::warn!(
                model = %model, requested = n, in_effect = set,
                "INTRA_OP_THREAD_COUNT is process-wide and was already set by another model; ignoring"
            ),
            Some(_) => {}
        }
    }
    if let Some(n) = settings.inter_op_threads {
        match threads.1 {
            None => {
                // libtorch refuses once its inter-op pool has started.
                if torch.set_num_interop_threads(n) {
                    threads.1 = Some(n);
                } else {
                    tracing::warn!(
                        model = %model, requested = n,
                        "INTER_OP_THREAD_COUNT: libtorch's inter-op pool has already started; ignoring"
                    );
                }
            }
            Some(set) if set != n => tracing::warn!(
                model = %model, requested = n, in_effect = set,
                "INTER_OP_THREAD_COUNT is process-wide and was already set by another model; ignoring"
            ),
            Some(_) => {}
        }
    }
    if settings.jit_executor == Some(false) {
        tracing::warn!(
            model = %model,
            "ENABLE_JIT_EXECUTOR=false has no effect here: libtorch's executor mode is not reachable through tch; ENABLE_JIT_PROFILING=false turns the profiling executor off"
        );
    }
}
