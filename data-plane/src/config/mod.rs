//! Model configuration: from `config.pbtxt` (or a load request's override) to the complete,
//! validated, typed [`ValidModelConfig`] a model is loaded with.
//!
//! ```text
//! config.pbtxt ─► text::parse_model_config ─┐
//! load override (JSON) ─────────────────────┴► backend::complete (what the backends know:
//!     name check ─► platform/backend from config or files ─► backend auto-complete)
//!     ─► fill_defaults_with (version policy, instance groups; InstanceDefaults from the
//!        backend) ─► ValidModelConfig::try_from
//!        (validate::validate, with ensemble_graph for an ensemble's data flow, then typed fields)
//! ```
//!
//! Nothing here knows the backends: completion by a backend lives in `backend::complete`, one
//! layer up, and hands the result back to [`fill_defaults_with`] and validation here, with the
//! backend's answers (GPU use, default CPU instance count) as plain [`InstanceDefaults`].

/// `config.pbtxt` text parsing lives in `nereid-proto` (the control plane reads configs too).
pub mod text {
    pub use nereid_proto::{TextError, parse_model_config};
}
mod batch_io;
pub(crate) mod ensemble_graph;
mod model_metrics;
mod valid;
pub(crate) mod validate;

pub use batch_io::{BatchInputKind, BatchInputSpec, RaggedBatching, ScatterOutput};
pub use model_metrics::{FIRST_RESPONSE_HISTOGRAM, ModelMetrics};
pub use valid::{
    Accelerator, ControlKind, DynamicBatching, EnsembleStep, GroupKind, GroupResource, InputSpec,
    InstanceGroup, OutputSpec, QueuePolicy, Scheduling, SequenceBatching, SequenceControl,
    SequenceStrategy, StateIo, TimeoutAction, Utilization, ValidModelConfig, WarmupData,
    WarmupInput, WarmupSetting,
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

/// Why a model's config could not be completed. The `Display` text is the model's
/// UNAVAILABLE reason and what `nereid check-config` prints.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: {message}")]
    /// The config file could not be read.
    Read {
        /// The file that could not be read.
        path: PathBuf,
        /// The I/O error, as text.
        message: String,
    },
    #[error("{path}:{error}")]
    /// The config file is not valid protobuf text format.
    Text {
        /// The config file.
        path: PathBuf,
        /// Where in the file parsing failed, and why.
        error: text::TextError,
    },
    #[error("{}", .0.join("; "))]
    /// The config parsed but breaks load-time rules: every problem found, one message each.
    Invalid(Vec<String>),
}

/// The `platform` of ensemble configs (they name no backend).
pub const ENSEMBLE_PLATFORM: &str = "ensemble";

/// The config file name inside a model directory.
pub const CONFIG_FILE: &str = "config.pbtxt";

/// The folder of a model directory holding named configs (`--model-config-name`).
pub const CONFIGS_DIR: &str = "configs";

/// The config file a model directory is read from: `configs/<name>.pbtxt` when a config name
/// is set (`--model-config-name`) and that file exists, else `config.pbtxt`, as in Triton.
pub fn config_path(model_dir: &Path, config_name: Option<&str>) -> PathBuf {
    if let Some(name) = config_name {
        let named = model_dir.join(CONFIGS_DIR).join(format!("{name}.pbtxt"));
        if named.is_file() {
            return named;
        }
    }
    model_dir.join(CONFIG_FILE)
}

/// Reads the model directory's config file ([`config_path`]). A missing file gives an empty
/// config (auto-complete or validation decides whether that is enough).
pub fn read_config_file(
    model_dir: &Path,
    config_name: Option<&str>,
) -> Result<ModelConfig, ConfigError> {
    let path = config_path(model_dir, config_name);
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

/// What [`fill_defaults_with`] needs that the config does not say: the GPUs instance groups can
/// go on, whether `KIND_AUTO` may become `KIND_GPU` for this model, and how many instances the
/// model's backend runs on the CPU by default. The backend layer fills it from the model's
/// backend (`backend::complete`); this module knows no backend by name. `Default`: a host
/// without GPUs and one CPU instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceDefaults {
    /// The GPU ids the server sees (NVML's numbering); `KIND_GPU` groups that list none are
    /// placed on all of them.
    pub visible: Vec<i32>,
    /// `KIND_AUTO` groups become `KIND_GPU` (there are GPUs and the model's backend can use
    /// them); otherwise `KIND_CPU`.
    pub auto_gpu: bool,
    /// The `count` a `KIND_CPU` group that sets none gets (the backend's
    /// `default_cpu_instance_count`: 2 for ONNX Runtime, 1 otherwise, as Triton).
    pub cpu_count: u32,
}

impl Default for InstanceDefaults {
    fn default() -> Self {
        InstanceDefaults {
            visible: Vec::new(),
            auto_gpu: false,
            cpu_count: 1,
        }
    }
}

/// Defaults Triton fills in every config: version policy (latest 1), the preferred batch size
/// of a dynamic or oldest-sequence batcher that names none (`max_batch_size`), the optimization
/// policy's pinned-memory switches (on) and instance groups (one CPU group named after the model when
/// none is declared, of one instance; an unnamed declared group is named `<model>_<index>`), as
/// on a host without GPUs (`KIND_AUTO` resolves to `KIND_CPU`) for a backend that runs one CPU
/// instance by default. Enough for what no backend changes (the version policy); a model being
/// loaded gets [`fill_defaults_with`] its backend's [`InstanceDefaults`].
pub fn fill_defaults(config: &mut ModelConfig) {
    fill_defaults_with(config, &InstanceDefaults::default());
}

/// [`fill_defaults`] with what the host and the model's backend say, as Triton's
/// `NormalizeInstanceGroup`: `KIND_AUTO` becomes `KIND_GPU` when `defaults.auto_gpu` and every
/// GPU the group lists is visible, else `KIND_CPU`; a `KIND_GPU` group that lists no GPUs is
/// placed on every visible GPU (GPU 0 when none is visible: the backend then says what is
/// missing). A group without a count gets 1 on a GPU and `defaults.cpu_count` on the CPU
/// (Triton's `SetDefaultInstanceCount`).
pub fn fill_defaults_with(config: &mut ModelConfig, defaults: &InstanceDefaults) {
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
    if config.platform == ENSEMBLE_PLATFORM {
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
    let cpu_count = i32::try_from(defaults.cpu_count).unwrap_or(i32::MAX);
    for (index, group) in config.instance_group.iter_mut().enumerate() {
        if group.name.is_empty() {
            group.name = format!("{name}_{index}");
        }
        if group.kind == Kind::Auto as i32 {
            let on_gpus =
                defaults.auto_gpu && group.gpus.iter().all(|g| defaults.visible.contains(g));
            group.kind = if on_gpus { Kind::Gpu } else { Kind::Cpu } as i32;
        }
        if group.kind == Kind::Gpu as i32 && group.gpus.is_empty() {
            group.gpus = if defaults.visible.is_empty() {
                vec![0]
            } else {
                defaults.visible.clone()
            };
        }
        if group.count == 0 {
            group.count = if group.kind == Kind::Cpu as i32 {
                cpu_count
            } else {
                1
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_named_config_is_read_where_the_model_has_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(CONFIG_FILE), "max_batch_size: 1").unwrap();
        std::fs::create_dir(dir.path().join(CONFIGS_DIR)).unwrap();
        std::fs::write(dir.path().join("configs/h100.pbtxt"), "max_batch_size: 8").unwrap();
        let batch = |name| read_config_file(dir.path(), name).unwrap().max_batch_size;
        assert_eq!(batch(None), 1);
        assert_eq!(batch(Some("h100")), 8);
        // No configs/a100.pbtxt: the default config, as in Triton.
        assert_eq!(batch(Some("a100")), 1);
        std::fs::write(dir.path().join("configs/bad.pbtxt"), "max_batch_size: [").unwrap();
        let err = read_config_file(dir.path(), Some("bad"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("configs/bad.pbtxt"), "{err}");
    }

    #[test]
    fn defaults_fill_instance_groups_and_policy() {
        let mut c = ModelConfig {
            name: "m".into(),
            ..Default::default()
        };
        fill_defaults(&mut c);
        assert_eq!(c.instance_group.len(), 1);
        assert_eq!(c.instance_group[0].name, "m");
        assert_eq!(c.instance_group[0].count, 1);
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
    fn gpu_defaults_resolve_groups_as_triton() {
        let group = |kind: Kind, gpus: Vec<i32>| ModelInstanceGroup {
            kind: kind as i32,
            gpus,
            ..Default::default()
        };
        let filled = |groups: Vec<ModelInstanceGroup>, defaults: &InstanceDefaults| {
            let mut c = ModelConfig {
                name: "m".into(),
                instance_group: groups,
                ..Default::default()
            };
            fill_defaults_with(&mut c, defaults);
            c.instance_group
                .into_iter()
                .map(|g| (Kind::try_from(g.kind).unwrap(), g.gpus, g.count))
                .collect::<Vec<_>>()
        };
        let two = InstanceDefaults {
            visible: vec![0, 1],
            auto_gpu: true,
            cpu_count: 1,
        };
        // KIND_AUTO listing GPUs the host has stays on them; listing one it lacks: the CPU
        // (with the GPUs kept, which validation then refuses, as Triton does).
        assert_eq!(
            filled(
                vec![group(Kind::Auto, vec![1]), group(Kind::Auto, vec![1, 3])],
                &two
            ),
            vec![(Kind::Gpu, vec![1], 1), (Kind::Cpu, vec![1, 3], 1)]
        );
        // A backend's default CPU count (ONNX Runtime's two) is for the CPU only.
        let two_on_cpu = |defaults: &InstanceDefaults| InstanceDefaults {
            cpu_count: 2,
            ..defaults.clone()
        };
        assert_eq!(
            filled(vec![group(Kind::Auto, vec![])], &two_on_cpu(&two)),
            vec![(Kind::Gpu, vec![0, 1], 1)]
        );
        let cpu_only = InstanceDefaults {
            auto_gpu: false,
            ..two.clone()
        };
        assert_eq!(
            filled(vec![group(Kind::Auto, vec![])], &two_on_cpu(&cpu_only)),
            vec![(Kind::Cpu, vec![], 2)]
        );
        // A count the config sets is kept.
        let three = ModelInstanceGroup {
            count: 3,
            ..group(Kind::Cpu, vec![])
        };
        assert_eq!(
            filled(vec![three], &two_on_cpu(&cpu_only)),
            vec![(Kind::Cpu, vec![], 3)]
        );
        // KIND_GPU listing none: every visible GPU, or GPU 0 on a host without any (the
        // backend then says what is missing).
        assert_eq!(
            filled(vec![group(Kind::Gpu, vec![])], &cpu_only),
            vec![(Kind::Gpu, vec![0, 1], 1)]
        );
        assert_eq!(
            filled(vec![group(Kind::Gpu, vec![])], &InstanceDefaults::default()),
            vec![(Kind::Gpu, vec![0], 1)]
        );
    }

    #[test]
    fn text_errors_carry_the_path() {
        let e = parse_config_text(Path::new("/r/m/config.pbtxt"), "name: \"m\"\nbogus: 1\n")
            .unwrap_err();
        assert!(e.to_string().starts_with("/r/m/config.pbtxt:2:1: "), "{e}");
    }
}
