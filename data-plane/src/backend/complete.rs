//! Completing a parsed config with what only the backends know: which backend runs the model
//! (from its platform, or from the model file in its version directories), the backend's
//! default model file and auto-complete, where `KIND_AUTO` instance groups go on a host with
//! GPUs, and how many instances a CPU group gets by default. Then [`crate::config`]'s defaults
//! and validation make it a [`ValidModelConfig`].
//!
//! ```text
//! ModelConfig (parsed) ─► name check ─► fill_platform_and_backend (each backend's Platforms)
//!     ─► Backend::default_model_filename, Backend::auto_complete (newest version's file)
//!     ─► InstanceDefaults (Backends::visible_gpus, Backend::gpu_support,
//!        Backend::default_cpu_instance_count)
//!     ─► config::fill_defaults_with ─► visible-GPU check ─► ValidModelConfig::try_from
//! ```
//!
//! The manager completes every model it loads here, and `nereid check-config` does the same.

use std::path::{Path, PathBuf};

use nereid_proto::pb::inference::ModelConfig;
use nereid_proto::pb::inference::model_instance_group::Kind;

use super::{Backend, Backends, Platforms};
use crate::config::{
    ConfigError, ENSEMBLE_PLATFORM, InstanceDefaults, ValidModelConfig, fill_defaults_with,
};

/// Options that shape how a config is completed.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CompleteOptions {
    /// Let the backend fill inputs, outputs and batching from the model file.
    pub auto_complete: bool,
}

/// Triton backends this build does not have, named here only so that a model for one of them
/// is told which backend it needs (`unknown backend 'tensorrt'`) rather than that none was found.
const OTHER_BACKENDS: &[(&str, Platforms)] = &[
    (
        "tensorrt",
        Platforms {
            names: &["tensorrt_plan"],
            implied: None,
            files: &[("model.plan", None)],
        },
    ),
    (
        "tensorflow",
        Platforms {
            names: &["tensorflow_savedmodel", "tensorflow_graphdef"],
            implied: None,
            files: &[("model.savedmodel", None), ("model.graphdef", None)],
        },
    ),
    (
        "openvino",
        Platforms {
            names: &[],
            implied: None,
            files: &[("model.xml", None)],
        },
    ),
];

/// Every backend Triton names a model for, in the order a version directory's files are
/// tried: ONNX Runtime, PyTorch, TensorRT, TensorFlow, Python, OpenVINO, then identity.
fn platform_table(backends: &Backends) -> Vec<(&'static str, Platforms)> {
    let own = |backend: &dyn Backend| (backend.name(), backend.platforms());
    vec![
        own(backends.onnxruntime.as_ref()),
        own(backends.pytorch.as_ref()),
        OTHER_BACKENDS[0],
        OTHER_BACKENDS[1],
        own(backends.python.as_ref()),
        OTHER_BACKENDS[2],
        own(backends.identity.as_ref()),
    ]
}

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
    fill_platform_and_backend(&mut config, versions, backends)?;

    // Ensembles have no backend and no model file: their steps name other models. A model with
    // no backend at all is left to validation, which says how to name one.
    if config.platform != ENSEMBLE_PLATFORM && !config.backend.is_empty() {
        let backend = backends
            .get(&config.backend)
            .map_err(|e| ConfigError::Invalid(vec![e]))?;
        if config.default_model_filename.is_empty() {
            config.default_model_filename = backend.default_model_filename().to_string();
        }
        backend
            .check_parameters(&config)
            .map_err(|e| ConfigError::Invalid(vec![e]))?;
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
    let defaults = instance_defaults(&config, backends);
    fill_defaults_with(&mut config, &defaults);
    unknown_gpus(&config, &defaults.visible)?;
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

/// What the host and the model's backend add to `config`'s defaults: the GPUs [`Backends`]
/// sees and whether the backend can use them (asked only when there are GPUs, so a GPU-less
/// host never touches a GPU runtime here), and the backend's default CPU instance count.
fn instance_defaults(config: &ModelConfig, backends: &Backends) -> InstanceDefaults {
    if config.platform == ENSEMBLE_PLATFORM {
        return InstanceDefaults::default();
    }
    let backend = backends.get(&config.backend).ok();
    let cpu_count = backend
        .as_ref()
        .map_or(1, |backend| backend.default_cpu_instance_count());
    let count = backends.visible_gpus();
    if count == 0 {
        return InstanceDefaults {
            cpu_count,
            ..InstanceDefaults::default()
        };
    }
    let visible: Vec<i32> = (0..count).map(|i| i as i32).collect();
    let auto_gpu = match backend.map(|backend| backend.gpu_support()) {
        Some(Ok(())) => true,
        Some(Err(reason)) => {
            tracing::info!(
                model = %config.name,
                %reason,
                "KIND_AUTO instance groups stay on the CPU"
            );
            false
        }
        None => false,
    };
    InstanceDefaults {
        visible,
        auto_gpu,
        cpu_count,
    }
}

/// Fills `platform` from `backend` or vice versa, or both from the model file found in the
/// version directories, as each backend's [`Platforms`] says.
pub(crate) fn fill_platform_and_backend(
    config: &mut ModelConfig,
    versions: &[PathBuf],
    backends: &Backends,
) -> Result<(), ConfigError> {
    if config.platform == ENSEMBLE_PLATFORM {
        return Ok(());
    }
    let table = platform_table(backends);
    if !config.platform.is_empty() {
        let Some((backend, _)) = table
            .iter()
            .find(|(_, p)| p.names.contains(&config.platform.as_str()))
        else {
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
        // Triton fills the platform only for backends with a single platform file.
        if let Some(platform) = table
            .iter()
            .find(|(b, _)| *b == config.backend)
            .and_then(|(_, p)| p.implied)
        {
            config.platform = platform.to_string();
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
    for (backend, platforms) in &table {
        for (file, platform) in platforms.files {
            if has(file) {
                config.backend = backend.to_string();
                if let Some(platform) = platform {
                    config.platform = platform.to_string();
                }
                return Ok(());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use nereid_proto::pb::inference::ModelInstanceGroup;

    use super::*;
    use crate::config::{GroupKind, text};

    fn versions_with(file: &str) -> (tempfile::TempDir, Vec<PathBuf>) {
        let dir = tempfile::tempdir().unwrap();
        let v = dir.path().join("1");
        std::fs::create_dir_all(&v).unwrap();
        std::fs::write(v.join(file), b"x").unwrap();
        (dir, vec![v])
    }

    #[test]
    fn platform_and_backend_fill_each_other() {
        let backends = Backends::new(None);
        let mut c = ModelConfig {
            name: "m".into(),
            platform: "onnxruntime_onnx".into(),
            ..Default::default()
        };
        fill_platform_and_backend(&mut c, &[], &backends).unwrap();
        assert_eq!(c.backend, "onnxruntime");
        let mut c = ModelConfig {
            name: "m".into(),
            backend: "onnxruntime".into(),
            ..Default::default()
        };
        fill_platform_and_backend(&mut c, &[], &backends).unwrap();
        assert_eq!(c.platform, "onnxruntime_onnx");
        let mut c = ModelConfig {
            name: "m".into(),
            platform: "caffe".into(),
            ..Default::default()
        };
        let e = fill_platform_and_backend(&mut c, &[], &backends).unwrap_err();
        assert_eq!(e.to_string(), "unexpected platform type 'caffe' for m");
        // A backend this build lacks is still named, so loading says which one is missing.
        let mut c = ModelConfig {
            name: "m".into(),
            platform: "tensorrt_plan".into(),
            ..Default::default()
        };
        fill_platform_and_backend(&mut c, &[], &backends).unwrap();
        assert_eq!(c.backend, "tensorrt");
        // Only ONNX Runtime has a platform written in for it.
        let mut c = ModelConfig {
            name: "m".into(),
            backend: "pytorch".into(),
            ..Default::default()
        };
        fill_platform_and_backend(&mut c, &[], &backends).unwrap();
        assert_eq!(c.platform, "");
    }

    #[test]
    fn backend_is_inferred_from_files() {
        let backends = Backends::new(None);
        let inferred = |file: &str| {
            let (_d, v) = versions_with(file);
            let mut c = ModelConfig {
                name: "m".into(),
                ..Default::default()
            };
            fill_platform_and_backend(&mut c, &v, &backends).unwrap();
            (c.platform, c.backend)
        };
        let pair = |p: &str, b: &str| (p.to_string(), b.to_string());
        assert_eq!(
            inferred("model.onnx"),
            pair("onnxruntime_onnx", "onnxruntime")
        );
        assert_eq!(inferred("model.pt"), pair("pytorch_libtorch", "pytorch"));
        assert_eq!(inferred("model.pt2"), pair("", "pytorch"));
        assert_eq!(inferred("model.plan"), pair("", "tensorrt"));
        assert_eq!(inferred("model.py"), pair("", "python"));
        assert_eq!(inferred("model.xml"), pair("", "openvino"));
        assert_eq!(inferred("notes.txt"), pair("", ""));
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
    fn the_default_cpu_instance_count_is_the_backends() {
        let backends = Backends::new(None).with_gpu_count(0);
        let options = CompleteOptions {
            auto_complete: false,
        };
        let count_for = |backend: &str| {
            let (_d, v) = versions_with("model.onnx");
            let mut raw = text::parse_model_config(
                r#"input [{ name: "IN" data_type: TYPE_FP32 dims: [1] }]
                   output [{ name: "OUT" data_type: TYPE_FP32 dims: [1] }]
                   instance_group [{ kind: KIND_CPU }, { kind: KIND_CPU count: 3 }]"#,
            )
            .unwrap();
            raw.backend = backend.into();
            let c = complete("m", raw, &v, &backends, options).unwrap();
            let counts: Vec<i32> = c.wire().instance_group.iter().map(|g| g.count).collect();
            let expected = backends.get(backend).unwrap().default_cpu_instance_count();
            assert_eq!(counts[0], expected as i32, "{backend}");
            counts
        };
        // ONNX Runtime runs two CPU instances by default (as Triton), the others one; a count
        // the config sets is kept.
        assert_eq!(count_for("onnxruntime"), vec![2, 3]);
        assert_eq!(count_for("identity"), vec![1, 3]);
        assert_eq!(count_for("python"), vec![1, 3]);
    }

    #[test]
    fn a_backend_parameter_is_checked_without_auto_complete() {
        let backends = Backends::new(None).with_gpu_count(0);
        let (_d, v) = versions_with("model.py");
        let raw = text::parse_model_config(
            r#"backend: "python"
               parameters { key: "SHARED_STUB_PROCESS" value: { string_value: "zwei" } }"#,
        )
        .unwrap();
        let options = CompleteOptions {
            auto_complete: false,
        };
        let Err(ConfigError::Invalid(errors)) = complete("m", raw, &v, &backends, options) else {
            panic!("a bad SHARED_STUB_PROCESS value was accepted");
        };
        assert!(
            errors[0].contains("parameter SHARED_STUB_PROCESS must be")
                && errors[0].contains("'zwei'"),
            "{errors:?}"
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
}
