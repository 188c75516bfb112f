//! `nereid check-config`'s engine: config files, model directories and whole repositories
//! checked as a load would check them, without serving anything.
//!
//! ```text
//! paths ─► models (a repository expands to its model directories)
//!   each ─► parse ─► backend::complete (name, platform/backend, backend name, auto-complete,
//!           defaults, validation) ─► ValidModelConfig
//!   ensembles ─► ensemble::plan against the other models (those checked, and an ensemble's
//!                siblings in its repository): cycles, self-reference, unmapped or mismatched
//!                tensors, missing composing models or versions, decoupled steps
//!   model files present ─► one instance loaded per served version (ONNX Runtime, PyTorch,
//!                identity): the file's signature against the config, as a load checks it
//! ```
//!
//! Python models are not started (their `initialize` may do anything); their `model.py` must
//! exist in each served version.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;

use nereid_proto::pb::inference::ModelConfig;

use crate::backend::{self, Backends, CompleteOptions, DeviceKind, Health, InstanceContext};
use crate::config::{self, CONFIG_FILE, ConfigError, ValidModelConfig};
use crate::ensemble;
use crate::repository;

/// What to check beyond the config itself.
#[derive(Clone, Copy, Debug, Default)]
pub struct CheckOptions {
    /// Fill inputs and outputs from the model file, as the server's auto-complete does.
    pub auto_complete: bool,
    /// Load one instance of each served version whose backend reads a model file.
    pub load_models: bool,
}

/// One checked model: its complete config, or every problem found, each a line that names
/// the file (`path: message`, or `file:line:col: message` for syntax errors).
#[derive(Debug)]
pub struct Checked {
    /// The config file or model directory.
    pub path: PathBuf,
    /// The complete config (after auto-completion and defaults), or every problem found, each a
    /// line as described on [`Checked`].
    pub result: Result<ModelConfig, Vec<String>>,
}

/// A model read and completed, before the checks that need the other models.
struct Model {
    path: PathBuf,
    name: String,
    /// Served version directories; `None` for a lone config file (no versions to look at).
    versions: Option<BTreeMap<i64, PathBuf>>,
    config: Result<Arc<ValidModelConfig>, Vec<String>>,
}

/// Checks every path: a `config.pbtxt`, a model directory, or a model repository (a directory
/// of model directories). Results come in the order the models were found.
pub fn check_paths(paths: &[PathBuf], backends: &Backends, options: CheckOptions) -> Vec<Checked> {
    let mut models = Vec::new();
    for path in paths {
        if is_repository(path) {
            match repository::scan(std::slice::from_ref(path)) {
                Ok(scan) => models.extend(
                    scan.models
                        .into_values()
                        .map(|m| read_model(&m.path, backends, options)),
                ),
                Err(e) => models.push(unreadable(path, e.to_string())),
            }
        } else {
            models.push(read_model(path, backends, options));
        }
    }
    let siblings = Siblings {
        backends,
        options,
        read: RefCell::new(BTreeMap::new()),
    };
    models
        .iter()
        .map(|model| Checked {
            path: model.path.clone(),
            result: finish(model, &models, &siblings, backends, options).map_err(|errors| {
                let path = model.path.display().to_string();
                errors
                    .into_iter()
                    .map(|e| {
                        if e.starts_with(&path) {
                            e
                        } else {
                            format!("{path}: {e}")
                        }
                    })
                    .collect()
            }),
        })
        .collect()
}

/// A directory that holds model directories rather than being one: no `config.pbtxt` and no
/// version directories of its own, but subdirectories.
fn is_repository(path: &Path) -> bool {
    path.is_dir()
        && !path.join(CONFIG_FILE).exists()
        && repository::version_dirs(path).is_empty()
        && std::fs::read_dir(path).is_ok_and(|entries| {
            entries
                .flatten()
                .any(|e| e.path().is_dir() && !e.file_name().to_string_lossy().starts_with('.'))
        })
}

fn unreadable(path: &Path, message: String) -> Model {
    Model {
        path: path.to_path_buf(),
        name: String::new(),
        versions: None,
        config: Err(vec![message]),
    }
}

/// Parses and completes one config file or model directory.
fn read_model(path: &Path, backends: &Backends, options: CheckOptions) -> Model {
    let (model_dir, file) = if path.is_dir() {
        (Some(path), path.join(CONFIG_FILE))
    } else {
        (None, path.to_path_buf())
    };
    let text = match std::fs::read_to_string(&file) {
        Ok(text) => text,
        Err(e) => return unreadable(&file, e.to_string()),
    };
    let parsed = match config::parse_config_text(&file, &text) {
        Ok(parsed) => parsed,
        Err(e) => return failed(path, String::new(), e),
    };
    // A lone file is named by its config, or by the directory it sits in.
    let name = match model_dir {
        Some(dir) => dir_name(dir),
        None if !parsed.name.is_empty() => parsed.name.clone(),
        None => file.parent().map(dir_name).unwrap_or_default(),
    };
    let versions = model_dir.map(|dir| {
        let mut policy_view = parsed.clone();
        config::fill_defaults(&mut policy_view);
        let available = repository::version_dirs(dir);
        let keys: Vec<i64> = available.keys().copied().collect();
        repository::select_versions(policy_view.version_policy.as_ref(), &keys)
            .into_iter()
            .map(|v| (v, available[&v].clone()))
            .collect::<BTreeMap<_, _>>()
    });
    let dirs: Vec<PathBuf> = versions.iter().flat_map(|v| v.values().cloned()).collect();
    let complete_options = CompleteOptions {
        auto_complete: options.auto_complete && model_dir.is_some(),
    };
    match backend::complete(&name, parsed, &dirs, backends, complete_options) {
        Ok(valid) => Model {
            path: path.to_path_buf(),
            name,
            versions,
            config: Ok(Arc::new(valid)),
        },
        Err(e) => failed(path, name, e),
    }
}

fn failed(path: &Path, name: String, error: ConfigError) -> Model {
    let messages = match error {
        ConfigError::Invalid(errors) => errors,
        // Names the file (and line and column) itself.
        other => vec![other.to_string()],
    };
    Model {
        path: path.to_path_buf(),
        name,
        versions: None,
        config: Err(messages),
    }
}

fn dir_name(dir: &Path) -> String {
    dir.canonicalize()
        .ok()
        .and_then(|d| d.file_name().and_then(|n| n.to_str()).map(str::to_string))
        .unwrap_or_default()
}

/// Models an ensemble names that were not among the checked paths, read on demand from the
/// ensemble's repository (its parent directory).
struct Siblings<'a> {
    backends: &'a Backends,
    options: CheckOptions,
    read: RefCell<BTreeMap<PathBuf, Rc<Model>>>,
}

impl Siblings<'_> {
    fn get(&self, dir: PathBuf) -> Rc<Model> {
        if let Some(model) = self.read.borrow().get(&dir) {
            return model.clone();
        }
        let options = CheckOptions {
            load_models: false,
            ..self.options
        };
        let model = Rc::new(read_model(&dir, self.backends, options));
        self.read.borrow_mut().insert(dir, model.clone());
        model
    }
}

/// The checks that need the other models (ensembles), then the model files.
fn finish(
    model: &Model,
    models: &[Model],
    siblings: &Siblings<'_>,
    backends: &Backends,
    options: CheckOptions,
) -> Result<ModelConfig, Vec<String>> {
    let config = model.config.clone()?;
    if config.platform == ensemble::PLATFORM {
        let repository = model.path.parent().map(Path::to_path_buf);
        let lookup = |name: &str, version: Option<i64>| {
            let sibling;
            let found: &Model = match models.iter().find(|m| m.name == name) {
                Some(m) => m,
                None => {
                    let dir = repository
                        .as_ref()
                        .map(|r| r.join(name))
                        .filter(|d| d.is_dir())
                        .ok_or_else(|| "it is not in the model repository".to_string())?;
                    sibling = siblings.get(dir);
                    &sibling
                }
            };
            let config = found
                .config
                .as_ref()
                .map_err(|errors| format!("it does not load: {}", errors.join("; ")))?;
            if let (Some(v), Some(versions)) = (version, &found.versions)
                && !versions.contains_key(&v)
            {
                return Err(format!("version {v} is not served"));
            }
            Ok(config.clone())
        };
        ensemble::plan(&config, lookup).map_err(|e| vec![e])?;
    } else if options.load_models {
        load_versions(model, &config, backends)?;
    }
    Ok(config.wire().clone())
}

/// Loads one instance of every served version, as the server would, and drops it: the model
/// file's signature is checked against the config. Python models are only looked for.
fn load_versions(
    model: &Model,
    config: &Arc<ValidModelConfig>,
    backends: &Backends,
) -> Result<(), Vec<String>> {
    let Some(versions) = &model.versions else {
        return Ok(());
    };
    let backend = backends.get(&config.backend).map_err(|e| vec![e])?;
    let mut errors = Vec::new();
    for (version, dir) in versions {
        let model_path = dir.join(&config.default_model_filename);
        // An out-of-process model (Python) is not started: its process may do anything.
        if backend.out_of_process() {
            if !model_path.exists() {
                errors.push(format!(
                    "failed to load '{}' version {version}: {} does not exist",
                    config.name,
                    model_path.display()
                ));
            }
            continue;
        }
        let ctx = InstanceContext {
            model_name: config.name.clone(),
            version: *version,
            model_dir: model.path.clone(),
            model_path,
            config: config.clone(),
            instance_name: format!("{}_check", config.name),
            device: DeviceKind::Cpu,
            health: Arc::new(Health::default()),
            server: backends.server().clone(),
        };
        if let Err(e) = backend.load_instance(&ctx) {
            errors.push(format!(
                "failed to load '{}' version {version}: {e}",
                config.name
            ));
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IDENTITY: &str = r#"backend: "identity"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"#;

    /// An ensemble of identity steps `(model, version)`, IN ─► ... ─► OUT, of type `dtype`.
    fn chain(steps: &[(&str, i64)], dtype: &str) -> String {
        let mut text = format!(
            r#"platform: "ensemble"
max_batch_size: 8
input [ {{ name: "IN" data_type: {dtype} dims: [ 4 ] }} ]
output [ {{ name: "OUT" data_type: {dtype} dims: [ 4 ] }} ]
ensemble_scheduling {{ step ["#
        );
        for (i, (model, version)) in steps.iter().enumerate() {
            let from = if i == 0 {
                "IN".to_string()
            } else {
                format!("T{i}")
            };
            let to = if i + 1 == steps.len() {
                "OUT".to_string()
            } else {
                format!("T{}", i + 1)
            };
            text += &format!(
                r#"{}{{ model_name: "{model}" model_version: {version}
   input_map {{ key: "INPUT0" value: "{from}" }} output_map {{ key: "OUTPUT0" value: "{to}" }} }}"#,
                if i == 0 { "" } else { ", " }
            );
        }
        text + "] }\n"
    }

    fn write(repo: &Path, name: &str, config: &str, versions: &[i64]) {
        std::fs::create_dir_all(repo.join(name)).unwrap();
        std::fs::write(repo.join(name).join(CONFIG_FILE), config).unwrap();
        for v in versions {
            std::fs::create_dir_all(repo.join(name).join(v.to_string())).unwrap();
        }
    }

    fn errors(paths: &[PathBuf]) -> BTreeMap<String, String> {
        let backends = Backends::new(None);
        let options = CheckOptions {
            auto_complete: false,
            load_models: true,
        };
        check_paths(paths, &backends, options)
            .into_iter()
            .map(|c| {
                let name = c.path.file_name().unwrap().to_string_lossy().to_string();
                (
                    name,
                    c.result.err().map(|e| e.join("\n")).unwrap_or_default(),
                )
            })
            .collect()
    }

    #[test]
    fn a_repository_is_checked_model_by_model_with_its_ensembles() {
        let repo = tempfile::tempdir().unwrap();
        let r = repo.path();
        write(r, "copy", IDENTITY, &[1]);
        write(
            r,
            "good",
            &chain(&[("copy", -1), ("copy", 1)], "TYPE_FP32"),
            &[1],
        );
        write(r, "self", &chain(&[("self", -1)], "TYPE_FP32"), &[1]);
        write(r, "loop_a", &chain(&[("loop_b", -1)], "TYPE_FP32"), &[1]);
        write(r, "loop_b", &chain(&[("loop_a", -1)], "TYPE_FP32"), &[1]);
        write(r, "ghost", &chain(&[("nowhere", -1)], "TYPE_FP32"), &[1]);
        write(r, "old", &chain(&[("copy", 3)], "TYPE_FP32"), &[1]);
        write(r, "ints", &chain(&[("copy", -1)], "TYPE_INT32"), &[1]);
        write(
            r,
            "escape",
            &IDENTITY.replace("identity", "../identity"),
            &[1],
        );
        write(
            r,
            "custom",
            &IDENTITY.replace("identity", "tensorrt_llm"),
            &[1],
        );
        write(r, "no_py", &IDENTITY.replace("identity", "python"), &[1]);
        let found = errors(&[r.to_path_buf()]);
        assert_eq!(found["copy"], "");
        assert_eq!(found["good"], "");
        for (model, needle) in [
            ("self", "circular dependency"),
            ("loop_a", "circular dependency"),
            (
                "ghost",
                "composing model 'nowhere' is not available: it is not in the model repository",
            ),
            ("old", "version 3 is not served"),
            ("ints", "TYPE_INT32"),
            (
                "escape",
                "backend name '../identity' must not leave the backend directory",
            ),
            ("custom", "unknown backend 'tensorrt_llm'"),
            ("no_py", "model.py does not exist"),
        ] {
            assert!(found[model].contains(needle), "{model}: {}", found[model]);
            assert!(
                found[model].starts_with(&r.join(model).display().to_string()),
                "{}",
                found[model]
            );
        }
    }

    #[test]
    fn an_ensemble_given_alone_finds_its_siblings() {
        let repo = tempfile::tempdir().unwrap();
        let r = repo.path();
        write(r, "copy", IDENTITY, &[1]);
        write(r, "broken", "max_batch_size: -1\n", &[1]);
        write(r, "good", &chain(&[("copy", -1)], "TYPE_FP32"), &[1]);
        write(r, "bad", &chain(&[("broken", -1)], "TYPE_FP32"), &[1]);
        let found = errors(&[r.join("good"), r.join("bad")]);
        assert_eq!(found["good"], "");
        assert!(
            found["bad"].contains("composing model 'broken' is not available: it does not load"),
            "{}",
            found["bad"]
        );
    }
}
