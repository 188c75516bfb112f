//! Model configuration: from `config.pbtxt` (or a load request's override) to the complete,
//! validated, typed [`ValidModelConfig`] a model is loaded with.
//!
//! ```text
//! config.pbtxt ─► text::parse_model_config ─┐
//! load override (JSON) ─────────────────────┴► complete():
//!     name check ─► platform/backend from config or files ─► backend auto-complete
//!     ─► defaults (version policy, instance groups) ─► ValidModelConfig::try_from
//!        (validate::validate, then typed fields)
//! ```

/// `config.pbtxt` text parsing lives in `nereid-proto` (the control plane reads configs too).
pub mod text {
    pub use nereid_proto::{TextError, parse_model_config};
}
mod valid;
pub(crate) mod validate;

pub use valid::{
    Accelerator, ControlKind, DynamicBatching, EnsembleStep, GroupKind, GroupResource, InputSpec,
    InstanceGroup, OutputSpec, QueuePolicy, Scheduling, SequenceBatching, SequenceControl,
    SequenceStrategy, StateIo, TimeoutAction, ValidModelConfig, WarmupData, WarmupInput,
    WarmupSetting,
};
pub(crate) use valid::{composing_models, ensemble_steps, parameters};

use std::path::{Path, PathBuf};

use nereid_proto::pb::inference::model_config::SchedulingChoice;
use nereid_proto::pb::inference::model_instance_group::Kind;
use nereid_proto::pb::inference::model_optimization_policy::PinnedMemoryBuffer;
use nereid_proto::pb::inference::model_sequence_batching::StrategyChoice;
use nereid_proto::pb::inference::model_version_policy::{Latest, PolicyChoice};
use nereid_proto::pb::inference::{
    ModelConfig, ModelInstanceGroup, ModelOptimizationPolicy, ModelVersionPolicy,
};

use crate::backend::Backends;

/// Why a model's config could not be completed. The `Display` text is the model's
/// UNAVAILABLE reason and what `nereid check-config` prints.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: {message}")]
    Read { path: PathBuf, message: String },
    #[error("{path}:{error}")]
    Text {
        path: PathBuf,
        error: text::TextError,
    },
    #[error("{}", .0.join("; "))]
    Invalid(Vec<String>),
}

/// Options that shape how a config is completed.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CompleteOptions {
    /// Let the backend fill inputs, outputs and batching from the model file.
    pub auto_complete: bool,
}

/// The config file name inside a model directory.
pub const CONFIG_FILE: &str = "config.pbtxt";

/// Reads `<model_dir>/config.pbtxt`. A missing file gives an empty config (auto-complete or
/// validation decides whether that is enough).
pub fn read_config_file(model_dir: &Path) -> Result<ModelConfig, ConfigError> {
    let path = model_dir.join(CONFIG_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => parse_config_text(&path, &text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(ModelConfig::default()),
        Err(e) => Err(ConfigError::Read {
            path,
            message: e.to_string(),
        }),
    }
}

/// Parses config text, naming `path` in errors (`path:line:col: message`).
pub fn parse_config_text(path: &Path, text: &str) -> Result<ModelConfig, ConfigError> {
    text::parse_model_config(text).map_err(|error| {
        let error = if error.line.is_some() {
            error
        } else {
            text::TextError {
                message: format!(" {}", error.message),
                ..error
            }
        };
        ConfigError::Text {
            path: path.to_path_buf(),
            error,
        }
    })
}

/// Platform ↔ backend pairs Triton knows, and the file that implies them.
const PLATFORMS: &[(&str, &str, &str)] = &[
    ("onnxruntime_onnx", "onnxruntime", "model.onnx"),
    ("pytorch_libtorch", "pytorch", "model.pt"),
    ("libtorch", "pytorch", ""),
    ("torch_aoti", "pytorch", "model.pt2"),
    ("tensorrt_plan", "tensorrt", "model.plan"),
    ("tensorflow_savedmodel", "tensorflow", "model.savedmodel"),
    ("tensorflow_graphdef", "tensorflow", "model.graphdef"),
];

/// Backends that are named by file alone (no platform string).
const BACKEND_FILES: &[(&str, &str)] = &[("python", "model.py"), ("openvino", "model.xml")];

/// Completes a parsed config for the model `name` in `model_dir` whose served version
/// directories are `versions`: fills platform/backend and defaults, runs the backend's
/// auto-complete, and validates. Errors are full sentences naming the model.
pub(crate) fn complete(
    name: &str,
    mut config: ModelConfig,
    versions: &[PathBuf],
    backends: &Backends,
    options: CompleteOptions,
) -> Result<ValidModelConfig, ConfigError> {
    if !config.name.is_empty() && config.name != name {
        return Err(ConfigError::Invalid(vec![format!(
            "model name '{}' in config.pbtxt does not match the model directory name '{name}'",
            config.name
        )]));
    }
    config.name = name.to_string();
    fill_platform_and_backend(&mut config, versions)?;

    // Ensembles have no backend and no model file: their steps name other models. A model with
    // no backend at all is left to validation, which says how to name one.
    if config.platform != crate::ensemble::PLATFORM && !config.backend.is_empty() {
        let backend = backends
            .get(&config.backend)
            .map_err(|e| ConfigError::Invalid(vec![e]))?;
        if config.default_model_filename.is_empty() {
            config.default_model_filename = backend.default_model_filename().to_string();
        }
        if options.auto_complete {
            // The newest version's file is the one Triton auto-completes from.
            if let Some(dir) = versions.last() {
                let path = dir.join(&config.default_model_filename);
                backend
                    .auto_complete(&mut config, &path)
                    .map_err(|e| ConfigError::Invalid(vec![e.to_string()]))?;
            }
        }
    }
    let gpus = gpu_defaults(&config, backends);
    fill_defaults_with_gpus(&mut config, &gpus);
    unknown_gpus(&config, &gpus.visible)?;
    ValidModelConfig::try_from(config)
}

/// On a host where NVML sees GPUs, a `KIND_GPU` group may list only those (Triton's check).
/// Without any visible GPU the backends say what is missing instead (a Python model may still
/// take a `KIND_GPU` instance).
fn unknown_gpus(config: &ModelConfig, visible: &[i32]) -> Result<(), ConfigError> {
    if visible.is_empty() {
        return Ok(());
    }
    let errors: Vec<String> = config
        .instance_group
        .iter()
        .filter(|g| g.kind == Kind::Gpu as i32)
        .flat_map(|g| g.gpus.iter().map(move |id| (g, id)))
        .filter(|(_, id)| !visible.contains(id))
        .map(|(g, id)| {
            let seen: Vec<String> = visible.iter().map(i32::to_string).collect();
            format!(
                "instance group '{}' of model '{}' specifies invalid or unsupported gpu id {id}; the GPUs this server sees are: {}",
                g.name,
                config.name,
                seen.join(" ")
            )
        })
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ConfigError::Invalid(errors))
    }
}

/// What [`fill_defaults_with_gpus`] places instance groups on: the GPUs the host has, and
/// whether `KIND_AUTO` may become `KIND_GPU` for this model.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuDefaults {
    /// The GPU ids the server sees (NVML's numbering); `KIND_GPU` groups that list none are
    /// placed on all of them.
    pub visible: Vec<i32>,
    /// `KIND_AUTO` groups become `KIND_GPU` (there are GPUs and the model's backend can use
    /// them); otherwise `KIND_CPU`.
    pub auto_gpu: bool,
}

/// The GPU defaults for `config`: the GPUs [`Backends`] sees, and whether the model's backend
/// can use them (asked only when there are GPUs, so a GPU-less host never touches a GPU
/// runtime here).
fn gpu_defaults(config: &ModelConfig, backends: &Backends) -> GpuDefaults {
    let count = backends.visible_gpus();
    if count == 0 || config.platform == crate::ensemble::PLATFORM {
        return GpuDefaults::default();
    }
    let visible: Vec<i32> = (0..count).map(|i| i as i32).collect();
    let auto_gpu = match backends.get(&config.backend) {
        Ok(backend) => match backend.gpu_support() {
            Ok(()) => true,
            Err(reason) => {
                tracing::info!(
                    model = %config.name,
                    %reason,
                    "KIND_AUTO instance groups stay on the CPU"
                );
                false
            }
        },
        Err(_) => false,
    };
    GpuDefaults { visible, auto_gpu }
}

/// Fills `platform` from `backend` or vice versa, or both from the model file found in the
/// version directories.
pub(crate) fn fill_platform_and_backend(
    config: &mut ModelConfig,
    versions: &[PathBuf],
) -> Result<(), ConfigError> {
    if config.platform == "ensemble" {
        return Ok(());
    }
    if !config.platform.is_empty() {
        let Some((_, backend, _)) = PLATFORMS.iter().find(|(p, _, _)| *p == config.platform) else {
            return Err(ConfigError::Invalid(vec![format!(
                "unexpected platform type '{}' for {}",
                config.platform, config.name
            )]));
        };
        if config.backend.is_empty() {
            config.backend = backend.to_string();
        } else if config.backend != *backend {
            return Err(ConfigError::Invalid(vec![format!(
                "model '{}': platform '{}' does not match backend '{}'",
                config.name, config.platform, config.backend
            )]));
        }
        return Ok(());
    }
    if !config.backend.is_empty() {
        if let Some((platform, _, _)) = PLATFORMS
            .iter()
            .find(|(_, b, f)| *b == config.backend && !f.is_empty())
        {
            // Triton fills the platform only for backends with a single platform file.
            if config.backend == "onnxruntime" {
                config.platform = platform.to_string();
            }
        }
        return Ok(());
    }
    // A configured default_model_filename names the file, but its extension still says which
    // backend it is for: `model_a.onnx` is an ONNX model.
    let configured = config.default_model_filename.clone();
    let has = |file: &str| {
        if configured.is_empty() {
            versions.iter().any(|v| v.join(file).exists())
        } else {
            let ext = |f: &str| Path::new(f).extension().map(|e| e.to_os_string());
            ext(&configured) == ext(file) && versions.iter().any(|v| v.join(&configured).exists())
        }
    };
    for (platform, backend, file) in PLATFORMS {
        if !file.is_empty() && has(file) {
            config.backend = backend.to_string();
            if *backend == "onnxruntime" || *backend == "pytorch" && *file == "model.pt" {
                config.platform = platform.to_string();
            }
            return Ok(());
        }
    }
    for (backend, file) in BACKEND_FILES {
        if has(file) {
            config.backend = backend.to_string();
            return Ok(());
        }
    }
    Ok(())
}

/// Defaults Triton fills in every config: version policy (latest 1), the preferred batch size
/// of a dynamic or oldest-sequence batcher that names none (`max_batch_size`), the optimization
/// policy's pinned-memory switches (on) and instance groups (one CPU group named after the model when
/// none is declared; two instances for ONNX Runtime on CPU, one otherwise; an unnamed declared
/// group is named `<model>_<index>`), as on a host without GPUs: `KIND_AUTO` resolves to
/// `KIND_CPU`. [`fill_defaults_with_gpus`] is the same on a host with GPUs.
pub fn fill_defaults(config: &mut ModelConfig) {
    fill_defaults_with_gpus(config, &GpuDefaults::default());
}

/// [`fill_defaults`] on a host with `gpus`, as Triton's `NormalizeInstanceGroup`: `KIND_AUTO`
/// becomes `KIND_GPU` when `gpus.auto_gpu` and every GPU the group lists is visible, else
/// `KIND_CPU`; a `KIND_GPU` group that lists no GPUs is placed on every visible GPU (GPU 0
/// when none is visible: the backend then says what is missing). The default count is 1, or 2
/// for ONNX Runtime on the CPU (Triton's `SetDefaultInstanceCount`).
pub fn fill_defaults_with_gpus(config: &mut ModelConfig, gpus: &GpuDefaults) {
    if config
        .version_policy
        .as_ref()
        .and_then(|p| p.policy_choice.as_ref())
        .is_none()
    {
        config.version_policy = Some(ModelVersionPolicy {
            policy_choice: Some(PolicyChoice::Latest(Latest { num_versions: 1 })),
        });
    }
    if config.platform == "ensemble" {
        return;
    }
    // A batching policy without preferred sizes prefers the largest batch (Triton writes it in).
    let max_batch = config.max_batch_size;
    let preferred = match &mut config.scheduling_choice {
        Some(SchedulingChoice::DynamicBatching(d)) => Some(&mut d.preferred_batch_size),
        Some(SchedulingChoice::SequenceBatching(s)) => match &mut s.strategy_choice {
            Some(StrategyChoice::Oldest(o)) => Some(&mut o.preferred_batch_size),
            _ => None,
        },
        _ => None,
    };
    if let Some(sizes) = preferred
        && sizes.is_empty()
        && max_batch > 0
    {
        sizes.push(max_batch);
    }
    let optimization = config
        .optimization
        .get_or_insert_with(ModelOptimizationPolicy::default);
    for pinned in [
        &mut optimization.input_pinned_memory,
        &mut optimization.output_pinned_memory,
    ] {
        pinned.get_or_insert(PinnedMemoryBuffer { enable: true });
    }
    if config.instance_group.is_empty() {
        config.instance_group.push(ModelInstanceGroup {
            name: config.name.clone(),
            ..Default::default()
        });
    }
    let name = config.name.clone();
    let onnxruntime = config.backend == "onnxruntime";
    for (index, group) in config.instance_group.iter_mut().enumerate() {
        if group.name.is_empty() {
            group.name = format!("{name}_{index}");
        }
        if group.kind == Kind::Auto as i32 {
            let on_gpus = gpus.auto_gpu && group.gpus.iter().all(|g| gpus.visible.contains(g));
            group.kind = if on_gpus { Kind::Gpu } else { Kind::Cpu } as i32;
        }
        if group.kind == Kind::Gpu as i32 && group.gpus.is_empty() {
            group.gpus = if gpus.visible.is_empty() {
                vec![0]
            } else {
                gpus.visible.clone()
            };
        }
        if group.count == 0 {
            group.count = if onnxruntime && group.kind == Kind::Cpu as i32 {
                2
            } else {
                1
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn versions_with(file: &str) -> (tempfile::TempDir, Vec<PathBuf>) {
        let dir = tempfile::tempdir().unwrap();
        let v = dir.path().join("1");
        std::fs::create_dir_all(&v).unwrap();
        std::fs::write(v.join(file), b"x").unwrap();
        (dir, vec![v])
    }

    #[test]
    fn platform_and_backend_fill_each_other() {
        let mut c = ModelConfig {
            name: "m".into(),
            platform: "onnxruntime_onnx".into(),
            ..Default::default()
        };
        fill_platform_and_backend(&mut c, &[]).unwrap();
        assert_eq!(c.backend, "onnxruntime");
        let mut c = ModelConfig {
            name: "m".into(),
            backend: "onnxruntime".into(),
            ..Default::default()
        };
        fill_platform_and_backend(&mut c, &[]).unwrap();
        assert_eq!(c.platform, "onnxruntime_onnx");
        let mut c = ModelConfig {
            name: "m".into(),
            platform: "caffe".into(),
            ..Default::default()
        };
        let e = fill_platform_and_backend(&mut c, &[]).unwrap_err();
        assert_eq!(e.to_string(), "unexpected platform type 'caffe' for m");
    }

    #[test]
    fn backend_is_inferred_from_files() {
        let (_d, v) = versions_with("model.onnx");
        let mut c = ModelConfig {
            name: "m".into(),
            ..Default::default()
        };
        fill_platform_and_backend(&mut c, &v).unwrap();
        assert_eq!(
            (c.platform.as_str(), c.backend.as_str()),
            ("onnxruntime_onnx", "onnxruntime")
        );
        let (_d, v) = versions_with("model.py");
        let mut c = ModelConfig {
            name: "m".into(),
            ..Default::default()
        };
        fill_platform_and_backend(&mut c, &v).unwrap();
        assert_eq!((c.platform.as_str(), c.backend.as_str()), ("", "python"));
    }

    #[test]
    fn defaults_fill_instance_groups_and_policy() {
        let mut c = ModelConfig {
            name: "m".into(),
            backend: "onnxruntime".into(),
            ..Default::default()
        };
        fill_defaults(&mut c);
        assert_eq!(c.instance_group.len(), 1);
        assert_eq!(c.instance_group[0].name, "m");
        assert_eq!(c.instance_group[0].count, 2);
        assert_eq!(c.instance_group[0].kind, Kind::Cpu as i32);
        assert!(matches!(
            c.version_policy.unwrap().policy_choice,
            Some(PolicyChoice::Latest(Latest { num_versions: 1 }))
        ));
        let optimization = c.optimization.unwrap();
        assert_eq!(
            optimization.input_pinned_memory,
            Some(PinnedMemoryBuffer { enable: true })
        );
        assert_eq!(
            optimization.output_pinned_memory,
            Some(PinnedMemoryBuffer { enable: true })
        );
        // A dynamic batcher without preferred sizes prefers the largest batch, as Triton.
        let mut c = ModelConfig {
            name: "m".into(),
            max_batch_size: 8,
            scheduling_choice: Some(SchedulingChoice::DynamicBatching(Default::default())),
            ..Default::default()
        };
        fill_defaults(&mut c);
        let Some(SchedulingChoice::DynamicBatching(d)) = &c.scheduling_choice else {
            unreachable!()
        };
        assert_eq!(d.preferred_batch_size, vec![8]);
        // A declared group without a name is named by its index.
        let mut c = ModelConfig {
            name: "m".into(),
            instance_group: vec![ModelInstanceGroup::default(); 2],
            ..Default::default()
        };
        fill_defaults(&mut c);
        assert_eq!(c.instance_group[1].name, "m_1");
    }

    #[test]
    fn kind_auto_goes_on_every_gpu_when_the_backend_can_use_them() {
        let (_d, v) = versions_with("model.py");
        let options = CompleteOptions {
            auto_complete: false,
        };
        let raw = || {
            text::parse_model_config(
                r#"input [{ name: "IN" data_type: TYPE_FP32 dims: [1] }]
                   output [{ name: "OUT" data_type: TYPE_FP32 dims: [1] }]"#,
            )
            .unwrap()
        };
        // Two GPUs and a backend that can use them (Python): one GPU group on both, as Triton.
        let two = Backends::new(None).with_gpu_count(2);
        let c = complete("m", raw(), &v, &two, options).unwrap();
        assert_eq!(
            c.instance_groups[0].kind,
            GroupKind::Gpu { gpus: vec![0, 1] }
        );
        let group = &c.wire().instance_group[0];
        assert_eq!(
            (group.kind, group.gpus.clone(), group.count),
            (Kind::Gpu as i32, vec![0, 1], 1)
        );
        // No GPU: the CPU, exactly as before.
        let none = Backends::new(None).with_gpu_count(0);
        let c = complete("m", raw(), &v, &none, options).unwrap();
        assert_eq!(c.instance_groups[0].kind, GroupKind::Cpu);
        assert!(c.wire().instance_group[0].gpus.is_empty());
        // GPUs, but a backend that runs on the CPU only (identity): the CPU.
        let mut identity = raw();
        identity.backend = "identity".into();
        let c = complete("m", identity, &v, &two, options).unwrap();
        assert_eq!(c.instance_groups[0].kind, GroupKind::Cpu);
        // KIND_GPU may list only GPUs the server sees, when it sees any.
        let on = |gpus: Vec<i32>| {
            let mut c = raw();
            c.instance_group = vec![ModelInstanceGroup {
                kind: Kind::Gpu as i32,
                gpus,
                ..Default::default()
            }];
            c
        };
        assert_eq!(
            complete("m", on(vec![1, 2]), &v, &two, options)
                .unwrap_err()
                .to_string(),
            "instance group 'm_0' of model 'm' specifies invalid or unsupported gpu id 2; the GPUs this server sees are: 0 1"
        );
        let c = complete("m", on(vec![2]), &v, &none, options).unwrap();
        assert_eq!(c.instance_groups[0].kind, GroupKind::Gpu { gpus: vec![2] });
    }

    #[test]
    fn gpu_defaults_resolve_groups_as_triton() {
        let group = |kind: Kind, gpus: Vec<i32>| ModelInstanceGroup {
            kind: kind as i32,
            gpus,
            ..Default::default()
        };
        let filled = |backend: &str, groups: Vec<ModelInstanceGroup>, gpus: &GpuDefaults| {
            let mut c = ModelConfig {
                name: "m".into(),
                backend: backend.into(),
                instance_group: groups,
                ..Default::default()
            };
            fill_defaults_with_gpus(&mut c, gpus);
            c.instance_group
                .into_iter()
                .map(|g| (Kind::try_from(g.kind).unwrap(), g.gpus, g.count))
                .collect::<Vec<_>>()
        };
        let two = GpuDefaults {
            visible: vec![0, 1],
            auto_gpu: true,
        };
        // KIND_AUTO listing GPUs the host has stays on them; listing one it lacks: the CPU
        // (with the GPUs kept, which validation then refuses, as Triton does).
        assert_eq!(
            filled(
                "python",
                vec![group(Kind::Auto, vec![1]), group(Kind::Auto, vec![1, 3])],
                &two
            ),
            vec![(Kind::Gpu, vec![1], 1), (Kind::Cpu, vec![1, 3], 1)]
        );
        // ONNX Runtime's default of two instances is for the CPU only.
        assert_eq!(
            filled("onnxruntime", vec![group(Kind::Auto, vec![])], &two),
            vec![(Kind::Gpu, vec![0, 1], 1)]
        );
        let cpu_only = GpuDefaults {
            auto_gpu: false,
            ..two.clone()
        };
        assert_eq!(
            filled("onnxruntime", vec![group(Kind::Auto, vec![])], &cpu_only),
            vec![(Kind::Cpu, vec![], 2)]
        );
        // KIND_GPU listing none: every visible GPU, or GPU 0 on a host without any (the
        // backend then says what is missing).
        assert_eq!(
            filled("pytorch", vec![group(Kind::Gpu, vec![])], &cpu_only),
            vec![(Kind::Gpu, vec![0, 1], 1)]
        );
        assert_eq!(
            filled(
                "pytorch",
                vec![group(Kind::Gpu, vec![])],
                &GpuDefaults::default()
            ),
            vec![(Kind::Gpu, vec![0], 1)]
        );
    }

    #[test]
    fn completes_an_ensemble_without_a_backend() {
        let (_d, v) = versions_with("unrelated.txt");
        let options = CompleteOptions {
            auto_complete: true,
        };
        let raw = text::parse_model_config(
            r#"platform: "ensemble" max_batch_size: 4
               input [{ name: "IN" data_type: TYPE_FP32 dims: [4] }]
               output [{ name: "OUT" data_type: TYPE_FP32 dims: [4] }]
               ensemble_scheduling { step [{ model_name: "m" model_version: -1
                 input_map { key: "x" value: "IN" } output_map { key: "y" value: "OUT" } }] }"#,
        )
        .unwrap();
        let c = complete("e", raw, &v, &Backends::new(None), options).unwrap();
        assert!(c.backend.is_empty() && c.instance_groups.is_empty());
        assert!(c.wire().version_policy.is_some());
        // Anything else without a backend gets validation's advice, not a backend lookup error.
        let e = complete(
            "m",
            ModelConfig::default(),
            &v,
            &Backends::new(None),
            options,
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("unable to find a backend for model 'm'"),
            "{e}"
        );
    }

    #[test]
    fn text_errors_carry_the_path() {
        let e = parse_config_text(Path::new("/r/m/config.pbtxt"), "name: \"m\"\nbogus: 1\n")
            .unwrap_err();
        assert!(e.to_string().starts_with("/r/m/config.pbtxt:2:1: "), "{e}");
    }
}
