//! Which version folders a model's source holds, as DeployModel records them in
//! `available_versions` (placement serves the policy applied to them).
//!
//! ```text
//!  file:///dir, dir exists ─► list numeric folders ─► none: Invalid(source) unless Specific
//!                                                      Specific names a missing one: Invalid(version_policy)
//!  file:///dir, no dir     ─► Specific: accepted, available_versions empty (trust the list)
//!                             Latest / All: Invalid(source): nothing to choose from
//!  s3://, gs://, as://     ─► Specific or available_versions given: trusted as they are
//!                             else listed in the store (credentials from this node's
//!                             environment); none: Invalid(source) naming the store's error
//! ```
//!
//! A `file://` source is read on the control-plane node; workers are expected to see the same
//! path (a shared volume). `config.pbtxt` is not required: Triton completes ONNX configs itself.
//!
//! [`check_config_name`] refuses a deploy whose config names another model (the `name` of the
//! config override, else of the source's `config.pbtxt`): a worker would fail to load every
//! replica of it, so it is refused before anything is written.

use std::io::ErrorKind;
use std::path::Path;

use super::error::ApiError;
use crate::state::{ModelSpec, VersionPolicy};

/// Fills `spec.available_versions` from its source, or explains why the source is unusable.
pub(super) async fn resolve_versions(spec: &mut ModelSpec) -> Result<(), ApiError> {
    let specific = matches!(spec.version_policy, VersionPolicy::Specific { .. });
    let Some(path) = spec.source.strip_prefix("file://") else {
        if !specific
            && spec.available_versions.is_empty()
            && nereid_remote_repository::is_remote(&spec.source)
        {
            let versions = nereid_remote_repository::model_versions(&spec.source)
                .await
                .map_err(|e| ApiError::invalid("source", e.to_string()))?;
            if versions.is_empty() {
                return Err(ApiError::invalid(
                    "source",
                    format!(
                        "'{}' has no numeric version folders (e.g. {}/1)",
                        spec.source, spec.source
                    ),
                ));
            }
            spec.available_versions = versions;
            return Ok(());
        }
        if !specific && spec.available_versions.is_empty() {
            return Err(ApiError::invalid(
                "source",
                format!(
                    "'{}' cannot be listed by the control plane; name the versions with a \
                     specific version_policy or list them in available_versions",
                    spec.source
                ),
            ));
        }
        return Ok(());
    };
    if !path.starts_with('/') {
        return Err(ApiError::invalid(
            "source",
            format!(
                "'{}' must hold an absolute path, e.g. file:///models/{}",
                spec.source, spec.name
            ),
        ));
    }
    let versions = match list_versions(Path::new(path)).await {
        Ok(versions) => versions,
        Err(e) if e.kind() == ErrorKind::NotFound && specific => {
            spec.available_versions.clear();
            return Ok(());
        }
        Err(e) if e.kind() == ErrorKind::NotFound => {
            return Err(ApiError::invalid(
                "source",
                format!(
                    "directory {path} not found on the control plane; create it or name the \
                     versions with a specific version_policy"
                ),
            ));
        }
        Err(e) => {
            return Err(ApiError::invalid(
                "source",
                format!("cannot list directory {path}: {e}"),
            ));
        }
    };
    match &spec.version_policy {
        VersionPolicy::Specific { versions: wanted } => {
            let missing: Vec<String> = wanted
                .iter()
                .filter(|v| !versions.contains(v))
                .map(|v| v.to_string())
                .collect();
            if !missing.is_empty() {
                return Err(ApiError::invalid(
                    "version_policy",
                    format!(
                        "version {} not found in {path} (it has {})",
                        missing.join(", "),
                        describe(&versions)
                    ),
                ));
            }
        }
        VersionPolicy::Latest { .. } | VersionPolicy::All if versions.is_empty() => {
            return Err(ApiError::invalid(
                "source",
                format!("directory {path} has no numeric version folders (e.g. {path}/1)"),
            ));
        }
        VersionPolicy::Latest { .. } | VersionPolicy::All => {}
    }
    spec.available_versions = versions;
    Ok(())
}

/// Refuses `spec` when the config its replicas would load names another model: the override's
/// `name` when it sets one (it is merged over `config.pbtxt`), else the `name` in the
/// `config.pbtxt` of a `file://` source. A config without a name takes the model's.
pub(super) async fn check_config_name(spec: &ModelSpec) -> Result<(), ApiError> {
    let from_override = spec
        .config_override
        .as_deref()
        .and_then(|json| serde_json::from_str::<serde_json::Value>(json).ok())
        .and_then(|v| v.get("name").and_then(|n| n.as_str()).map(str::to_string));
    let (named, field, place) = match from_override {
        Some(name) => (name, "config_override", "the config override".to_string()),
        None => {
            let Some(dir) = spec.source.strip_prefix("file://") else {
                return Ok(());
            };
            let path = Path::new(dir).join("config.pbtxt");
            let text = match tokio::fs::read_to_string(&path).await {
                Ok(text) => text,
                Err(_) => return Ok(()),
            };
            let config = nereid_proto::parse_model_config(&text).map_err(|e| {
                ApiError::invalid("source", format!("{} does not parse: {e}", path.display()))
            })?;
            (config.name, "source", path.display().to_string())
        }
    };
    if named.is_empty() || named == spec.name {
        return Ok(());
    }
    Err(ApiError::invalid(
        field,
        format!(
            "{place} names model '{named}', but it is deployed as '{}'; deploy it as '{named}' \
             or change the config's name (every replica would fail to load)",
            spec.name
        ),
    ))
}

fn describe(versions: &[i64]) -> String {
    if versions.is_empty() {
        return "no numeric version folders".into();
    }
    let list: Vec<String> = versions.iter().map(|v| v.to_string()).collect();
    list.join(", ")
}

/// The version folders of `dir`, read off the async runtime.
async fn list_versions(dir: &Path) -> std::io::Result<Vec<i64>> {
    let dir = dir.to_path_buf();
    tokio::task::spawn_blocking(move || crate::source::version_folders(&dir))
        .await
        .map_err(std::io::Error::other)?
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, source: String, config_override: Option<&str>) -> ModelSpec {
        ModelSpec {
            source,
            config_override: config_override.map(str::to_string),
            ..crate::testing::model(name)
        }
    }

    fn refusal(result: Result<(), ApiError>) -> (String, String) {
        match result {
            Err(ApiError::Invalid { field, reason }) => (field, reason),
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_config_naming_another_model_is_refused_before_anything_is_written() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("config.pbtxt"),
            "name: \"resnet\"\nbackend: \"onnxruntime\"\n",
        )
        .unwrap();
        let source = format!("file://{}", dir.path().display());
        let (field, reason) =
            refusal(check_config_name(&spec("resnet50", source.clone(), None)).await);
        assert_eq!(field, "source");
        assert!(reason.contains("names model 'resnet'"), "{reason}");
        assert!(reason.contains("deployed as 'resnet50'"), "{reason}");
        check_config_name(&spec("resnet", source.clone(), None))
            .await
            .expect("the config's own name");
        check_config_name(&spec(
            "resnet50",
            source.clone(),
            Some(r#"{"name":"resnet50"}"#),
        ))
        .await
        .expect("an override that renames it consistently");
        let (field, _) = refusal(
            check_config_name(&spec("resnet", source.clone(), Some(r#"{"name":"other"}"#))).await,
        );
        assert_eq!(field, "config_override");
    }

    #[tokio::test]
    async fn a_config_without_a_name_or_without_a_file_is_accepted() {
        let dir = tempfile::tempdir().unwrap();
        let source = format!("file://{}", dir.path().display());
        check_config_name(&spec("m", source.clone(), None))
            .await
            .expect("no config.pbtxt: completed from the model file");
        std::fs::write(
            dir.path().join("config.pbtxt"),
            "backend: \"onnxruntime\"\n",
        )
        .unwrap();
        check_config_name(&spec("m", source.clone(), None))
            .await
            .expect("no name: the model's");
        check_config_name(&spec("m", "s3://bucket/m".into(), None))
            .await
            .expect("not readable here: the workers decide");
        std::fs::write(dir.path().join("config.pbtxt"), "name: [").unwrap();
        let (field, reason) = refusal(check_config_name(&spec("m", source, None)).await);
        assert_eq!(field, "source");
        assert!(reason.contains("does not parse"), "{reason}");
    }
}
