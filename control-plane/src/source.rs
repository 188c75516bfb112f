//! Model sources as the control plane sees them: listing the version folders of a `file://`
//! Triton-layout directory, reading its version policy, estimating a replica's memory, and
//! turning a whole model repository into model specs (`nereid control-plane
//! --model-repository DIR`).
//!
//! Workers do the real loading and validation; the control plane only reads what placement
//! needs, so a `config.pbtxt` it cannot parse falls back to Triton's default policy (latest 1).

use std::collections::BTreeMap;
use std::path::Path;

use nereid_proto::pb::inference::ModelConfig;
use nereid_proto::pb::inference::model_config::SchedulingChoice;
use nereid_proto::pb::inference::model_version_policy::PolicyChoice;

use crate::state::{ModelSpec, Resources, VersionPolicy};

/// The smallest memory estimate for a replica whose files are tiny (runtime overhead).
const MIN_ESTIMATE_BYTES: u64 = 16 << 20;

/// What a model directory holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceInfo {
    /// Numeric version folders, sorted.
    pub versions: Vec<i64>,
    /// From `config.pbtxt`; `None` when absent or unreadable.
    pub policy: Option<VersionPolicy>,
    /// Bytes of files under the directory: the memory estimate before a worker measures.
    pub bytes_on_disk: u64,
    /// `config.pbtxt` declares an ensemble (its steps run on other models).
    pub ensemble: bool,
}

/// The local path of a `file://` URI; `None` for other schemes.
#[cfg(test)]
pub fn local_path(uri: &str) -> Option<std::path::PathBuf> {
    uri.strip_prefix("file://").map(std::path::PathBuf::from)
}

/// The positive numeric sub-directories of `dir` (its version folders), sorted.
pub fn version_folders(dir: &Path) -> std::io::Result<Vec<i64>> {
    if !std::fs::metadata(dir)?.is_dir() {
        return Err(std::io::Error::other("it is not a directory"));
    }
    let mut versions = Vec::new();
    for entry in std::fs::read_dir(dir)?.flatten() {
        if let Some(v) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i64>().ok())
            .filter(|v| *v > 0)
            && entry.path().is_dir()
        {
            versions.push(v);
        }
    }
    versions.sort_unstable();
    Ok(versions)
}

/// Reads a model directory; an error says what is missing.
pub fn inspect(dir: &Path) -> Result<SourceInfo, String> {
    let versions = version_folders(dir)
        .map_err(|e| format!("cannot read model directory {}: {e}", dir.display()))?;
    let bytes_on_disk = versions
        .iter()
        .map(|v| dir_size(&dir.join(v.to_string())))
        .sum();
    let config = std::fs::read_to_string(dir.join("config.pbtxt"))
        .ok()
        .and_then(|text| parse_config(&text));
    let ensemble = config.as_ref().is_some_and(|c| {
        c.platform == "ensemble"
            || matches!(
                c.scheduling_choice,
                Some(SchedulingChoice::EnsembleScheduling(_))
            )
    });
    Ok(SourceInfo {
        versions,
        policy: config.and_then(policy_of),
        bytes_on_disk,
        ensemble,
    })
}

/// A `config.pbtxt`, if it parses (Triton's list syntax included).
fn parse_config(text: &str) -> Option<ModelConfig> {
    nereid_proto::parse_model_config(text).ok()
}

/// The version policy a config names, if any.
fn policy_of(config: ModelConfig) -> Option<VersionPolicy> {
    Some(match config.version_policy?.policy_choice? {
        PolicyChoice::Latest(l) => VersionPolicy::Latest {
            n: l.num_versions.max(1),
        },
        PolicyChoice::All(_) => VersionPolicy::All,
        PolicyChoice::Specific(s) => VersionPolicy::Specific {
            versions: s.versions,
        },
    })
}

fn dir_size(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| {
            let path = e.path();
            if path.is_dir() {
                dir_size(&path)
            } else {
                e.metadata().map(|m| m.len()).unwrap_or(0)
            }
        })
        .sum()
}

/// One spec per model directory of `repository` (a folder holding `config.pbtxt` or numeric
/// version folders), with `replicas` replicas each: other models first, then ensembles (so
/// an ensemble is registered after the models its steps call), each group sorted by name.
pub fn repository_models(repository: &Path, replicas: u32) -> Result<Vec<ModelSpec>, String> {
    let repository = repository
        .canonicalize()
        .map_err(|e| format!("model repository {}: {e}", repository.display()))?;
    let entries = std::fs::read_dir(&repository)
        .map_err(|e| format!("cannot read model repository {}: {e}", repository.display()))?;
    let mut out = BTreeMap::new();
    let mut ensembles = Vec::new();
    for entry in entries.flatten() {
        let dir = entry.path();
        let Some(name) = dir.file_name().and_then(|n| n.to_str()).map(str::to_string) else {
            continue;
        };
        if !dir.is_dir() || name.starts_with('.') {
            continue;
        }
        let info = inspect(&dir)?;
        if info.versions.is_empty() && !dir.join("config.pbtxt").exists() {
            continue;
        }
        if info.ensemble {
            ensembles.push(name.clone());
        }
        out.insert(
            name.clone(),
            ModelSpec {
                name,
                source: format!("file://{}", dir.display()),
                version_policy: info
                    .policy
                    .clone()
                    .unwrap_or(VersionPolicy::Latest { n: 1 }),
                config_override: None,
                min_replicas: replicas,
                max_replicas: replicas,
                resources: Resources {
                    memory_bytes: info.bytes_on_disk.max(MIN_ESTIMATE_BYTES),
                    ..Resources::default()
                },
                labels: BTreeMap::new(),
                available_versions: info.versions,
                traffic: Default::default(),
            },
        );
    }
    let (last, mut first): (Vec<ModelSpec>, Vec<ModelSpec>) = out
        .into_values()
        .partition(|spec| ensembles.contains(&spec.name));
    first.extend(last);
    Ok(first)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn model_dir(root: &Path, name: &str, versions: &[i64], config: &str) {
        let dir = root.join(name);
        for v in versions {
            std::fs::create_dir_all(dir.join(v.to_string())).unwrap();
            std::fs::write(dir.join(v.to_string()).join("model.onnx"), vec![0u8; 100]).unwrap();
        }
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("config.pbtxt"), config).unwrap();
    }

    #[test]
    fn a_repository_becomes_specs_with_versions_and_policies() {
        let root = tempfile::tempdir().unwrap();
        model_dir(root.path(), "plain", &[1, 3, 2], "name: \"plain\"\n");
        model_dir(
            root.path(),
            "all",
            &[1, 2],
            "name: \"all\"\nversion_policy: { all {} }\n",
        );
        model_dir(
            root.path(),
            "two",
            &[1, 2, 5],
            "version_policy { specific { versions: [1, 5] } }",
        );
        model_dir(root.path(), "broken", &[1], "this is { not pbtxt");
        model_dir(
            root.path(),
            "a_pipeline",
            &[1],
            "platform: \"ensemble\"\nensemble_scheduling { step [ { model_name: \"plain\" \
             model_version: -1 } ] }\n",
        );
        std::fs::create_dir_all(root.path().join("not_a_model")).unwrap();

        let specs = repository_models(root.path(), 2).unwrap();
        let names: Vec<_> = specs.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            ["all", "broken", "plain", "two", "a_pipeline"],
            "ensembles after the models they call"
        );
        let by = |n: &str| specs.iter().find(|s| s.name == n).unwrap();
        assert_eq!(by("plain").available_versions, vec![1, 2, 3]);
        assert_eq!(by("plain").version_policy, VersionPolicy::Latest { n: 1 });
        assert_eq!(by("plain").served_versions(), vec![3]);
        assert_eq!(by("all").version_policy, VersionPolicy::All);
        assert_eq!(by("two").served_versions(), vec![1, 5]);
        assert_eq!(by("broken").version_policy, VersionPolicy::Latest { n: 1 });
        assert_eq!(by("plain").min_replicas, 2);
        assert!(by("plain").source.starts_with("file:///"));
        assert_eq!(by("plain").resources.memory_bytes, MIN_ESTIMATE_BYTES);
        for spec in &specs {
            spec.validate().unwrap();
        }
    }

    #[test]
    fn a_missing_directory_is_an_error_naming_it() {
        let err = inspect(Path::new("/nonexistent/model")).unwrap_err();
        assert!(err.contains("/nonexistent/model"), "{err}");
        assert!(local_path("s3://bucket/m").is_none());
        assert_eq!(local_path("file:///m"), Some(PathBuf::from("/m")));
    }
}
