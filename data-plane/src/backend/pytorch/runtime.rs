//! Loading a TorchScript instance with libtorch (feature `torch`), and the libtorch settings
//! that are process-wide.
//!
//! ```text
//!  load(ctx) ─► settings ─► datatypes ─► device (KIND_GPU needs a CUDA libtorch and GPU)
//!            ─► process-wide threads (first model that sets them wins, as in Triton)
//!            ─► forward() signature ─► input/output binding
//!            ─► CModule::load_on_device (or the shared copy) ─► eval ─► TorchInstance
//! ```

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Weak};

use nereid_proto::DataType;
use parking_lot::Mutex;
use tch::{CModule, Device};

use super::binding::{bind_inputs, bind_outputs};
use super::convert::kind_of;
use super::instance::TorchInstance;
use super::settings::TorchSettings;
use super::signature;
use crate::backend::{BackendError, BackendInstance, DeviceKind, InstanceContext};
use crate::config::ValidModelConfig;

/// Modules loaded with `ENABLE_WEIGHT_SHARING`, by file and device, while an instance holds them.
#[derive(Default)]
pub(crate) struct SharedModules(Mutex<HashMap<(PathBuf, String), Weak<CModule>>>);

impl SharedModules {
    /// How many shared modules are alive.
    #[cfg(test)]
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
    let device = device(ctx.device).map_err(|e| BackendError::Load(format!("{label}: {e}")))?;
    let file = &ctx.model_path;
    if !file.is_file() {
        return Err(BackendError::Load(format!(
            "{label}: model file '{}' does not exist",
            file.display()
        )));
    }
    apply_process_settings(model, &settings);

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

    let module = module(shared, file, device, settings.weight_sharing)
        .map_err(|e| BackendError::Load(format!("{label}: {e}")))?;
    tracing::info!(
        model = %model,
        version = ctx.version,
        instance = %ctx.instance_name,
        device = ?device,
        intra_op_threads = tch::get_num_threads(),
        optimized_execution = settings.optimized_execution,
        weight_sharing = settings.weight_sharing,
        "loaded TorchScript module"
    );
    Ok(Box::new(TorchInstance::new(
        module,
        device,
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
        if d != DataType::Bytes && kind_of(d).is_none() {
            return Err(format!(
                "{kind} '{name}': data type {} is not supported by the PyTorch backend (libtorch has no tensor of that type)",
                d.to_config().as_str_name()
            ));
        }
    }
    Ok(())
}

/// Whether libtorch can run on a GPU here; `Err` says what is missing.
pub(super) fn cuda_support() -> Result<(), String> {
    super::cuda::cuda_devices().map(|_| ())
}

/// The libtorch device of an instance. `KIND_GPU` needs libtorch to see that GPU.
fn device(kind: DeviceKind) -> Result<Device, String> {
    match kind {
        DeviceKind::Cpu => Ok(Device::Cpu),
        DeviceKind::Gpu { device_id } => {
            let count = super::cuda::cuda_devices().map_err(|why| {
                format!(
                    "KIND_GPU (GPU {device_id}) requested, but libtorch cannot use CUDA here: {why}; use KIND_CPU to run this model on the CPU"
                )
            })?;
            match usize::try_from(device_id) {
                Ok(id) if (device_id as i64) < count => Ok(Device::Cuda(id)),
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
    shared: &SharedModules,
    file: &std::path::Path,
    device: Device,
    sharing: bool,
) -> Result<Arc<CModule>, String> {
    if !sharing {
        return load_module(file, device).map(Arc::new);
    }
    let key = (file.to_path_buf(), format!("{device:?}"));
    let mut cache = shared.0.lock();
    if let Some(module) = cache.get(&key).and_then(Weak::upgrade) {
        return Ok(module);
    }
    let module = Arc::new(load_module(file, device)?);
    cache.retain(|_, m| m.strong_count() > 0);
    cache.insert(key, Arc::downgrade(&module));
    Ok(module)
}

fn load_module(file: &std::path::Path, device: Device) -> Result<CModule, String> {
    let mut module = CModule::load_on_device(file, device).map_err(|e| {
        format!(
            "cannot load TorchScript file '{}': {}",
            file.display(),
            super::instance::first_line(&e.to_string())
        )
    })?;
    module
        .f_set_eval()
        .map_err(|e| format!("cannot switch the module to eval mode: {e}"))?;
    Ok(module)
}

/// Thread counts are process-wide in libtorch: the first model that sets one wins; a later,
/// different value is reported and ignored (Triton's rule).
fn apply_process_settings(model: &str, settings: &TorchSettings) {
    let mut threads = THREADS.lock();
    if let Some(n) = settings.intra_op_threads {
        match threads.0 {
            None => {
                tch::set_num_threads(n);
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
                // libtorch refuses once its inter-op pool has started; tch reports that by
                // panicking, which must not take the loading thread down.
                match std::panic::catch_unwind(|| tch::set_num_interop_threads(n)) {
                    Ok(()) => threads.1 = Some(n),
                    Err(_) => tracing::warn!(
                        model = %model, requested = n,
                        "INTER_OP_THREAD_COUNT: libtorch's inter-op pool has already started; ignoring"
                    ),
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
