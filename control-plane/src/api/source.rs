//! Which version folders a model's source holds, as DeployModel records them in
//! `available_versions` (placement serves the policy applied to them).
//!
//! ```text
//!  file:///dir, dir exists ─► list numeric folders ─► none: Invalid(source) unless Specific
//!                                                      Specific names a missing one: Invalid(version_policy)
//!  file:///dir, no dir     ─► Specific: accepted, available_versions empty (trust the list)
//!                             Latest / All: Invalid(source): nothing to choose from
//!  s3://, gs://, ...       ─► the client's available_versions; Latest / All need some
//! ```
//!
//! A `file://` source is read on the control-plane node; workers are expected to see the same
//! path (a shared volume). `config.pbtxt` is not required: Triton completes ONNX configs itself.

use std::io::ErrorKind;
use std::path::Path;

use super::error::ApiError;
use crate::state::{ModelSpec, VersionPolicy};

/// Fills `spec.available_versions` from its source, or explains why the source is unusable.
pub(super) async fn resolve_versions(spec: &mut ModelSpec) -> Result<(), ApiError> {
    let specific = matches!(spec.version_policy, VersionPolicy::Specific { .. });
    let Some(path) = spec.source.strip_prefix("file://") else {
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
