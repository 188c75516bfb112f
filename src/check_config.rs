//! `nereid check-config PATH...`: lint `config.pbtxt` files or model directories with the same
//! parser and validation the server uses. Prints each normalized config as JSON, or the errors
//! (`file:line:col: message`). Exit status 1 if any path has an error.

use std::path::Path;
use std::process::ExitCode;

use nereid_data_plane::backend::Backends;
use nereid_data_plane::config::{self, CONFIG_FILE, ConfigError, validate};
use nereid_data_plane::repository;
use nereid_proto::message_to_json;
use nereid_proto::pb::inference::ModelConfig;

use crate::cli::CheckConfigArgs;

pub fn run(args: CheckConfigArgs) -> ExitCode {
    let backends = args.auto_complete.then(|| {
        Backends::new(crate::ort_library::resolve(
            args.onnxruntime_library.clone(),
        ))
        .with_python(args.python.clone().interpreter())
    });
    let mut failed = false;
    for path in &args.paths {
        match check(path, backends.as_ref()) {
            Ok(config) => {
                let json = message_to_json(&config);
                println!(
                    "{}",
                    serde_json::to_string_pretty(&json).unwrap_or_default()
                );
            }
            Err(e) => {
                failed = true;
                match e {
                    ConfigError::Invalid(errors) => {
                        for error in errors {
                            eprintln!("{}: {error}", path.display());
                        }
                    }
                    other => eprintln!("{other}"),
                }
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Checks one path: a config file, or a model directory (with its version folders).
fn check(path: &Path, backends: Option<&Backends>) -> Result<ModelConfig, ConfigError> {
    let (model_dir, file) = if path.is_dir() {
        (Some(path), path.join(CONFIG_FILE))
    } else {
        (path.parent(), path.to_path_buf())
    };
    let text = std::fs::read_to_string(&file).map_err(|e| ConfigError::Read {
        path: file.clone(),
        message: e.to_string(),
    })?;
    let mut cfg = config::parse_config_text(&file, &text)?;
    let dir_name = model_dir
        .and_then(|d| d.canonicalize().ok())
        .and_then(|d| d.file_name().and_then(|n| n.to_str()).map(str::to_string))
        .unwrap_or_default();
    if cfg.name.is_empty() {
        cfg.name = dir_name.clone();
    } else if path.is_dir() && cfg.name != dir_name {
        return Err(ConfigError::Invalid(vec![format!(
            "model name '{}' in config.pbtxt does not match the model directory name '{dir_name}'",
            cfg.name
        )]));
    }
    let versions: Vec<_> = if path.is_dir() {
        let mut policy_view = cfg.clone();
        config::fill_defaults(&mut policy_view);
        let available = repository::version_dirs(path);
        let keys: Vec<i64> = available.keys().copied().collect();
        repository::select_versions(policy_view.version_policy.as_ref(), &keys)
            .iter()
            .map(|v| available[v].clone())
            .collect()
    } else {
        Vec::new()
    };
    config::fill_platform_and_backend(&mut cfg, &versions)?;
    if let (Some(backends), Some(latest)) = (backends, versions.last())
        && cfg.platform != "ensemble"
    {
        let backend = backends
            .get(&cfg.backend)
            .map_err(|e| ConfigError::Invalid(vec![e]))?;
        if cfg.default_model_filename.is_empty() {
            cfg.default_model_filename = backend.default_model_filename().to_string();
        }
        let model_path = latest.join(&cfg.default_model_filename);
        backend
            .auto_complete(&mut cfg, &model_path)
            .map_err(|e| ConfigError::Invalid(vec![e.to_string()]))?;
    }
    config::fill_defaults(&mut cfg);
    let errors = validate::validate(&cfg);
    if errors.is_empty() {
        Ok(cfg)
    } else {
        Err(ConfigError::Invalid(errors))
    }
}
