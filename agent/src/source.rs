//! Model sources on a worker: the private model repository the data plane loads from, and the
//! config each load uses.
//!
//! ```text
//! <work-dir>/models/<name> ──symlink──► /abs/path   (from the spec's file:///abs/path)
//! <work-dir>/models/<name> ──symlink──► <work-dir>/model-cache/<slug>/<folder>
//!                                       (s3://bucket/repo/<folder>, gs://, as://: downloaded
//!                                       or brought up to date before every load)
//! config = config.pbtxt of the source, the spec's config_override merged over it (top-level
//!          fields replace), version_policy = specific{versions of this node's replicas},
//!          every KIND_GPU instance group's gpus = the GPU indices assigned to the replicas
//! ```
//!
//! The GPU override is what makes two replicas placed on one node use their own GPUs: the
//! control plane assigns indices per replica, and the load pins the model's `KIND_GPU` groups
//! to exactly those (with `count` instances on each), whatever GPUs the config listed.
//! `KIND_AUTO` and `KIND_CPU` groups are left as they are (a `KIND_AUTO` group still goes on
//! every visible GPU when its backend can use them; declare `KIND_GPU` to be pinned).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use nereid_proto::pb::inference::ModelConfig;
use nereid_proto::pb::inference::model_instance_group::Kind;
use nereid_proto::{message_from_json, to_dynamic};
use prost_reflect::SerializeOptions;

use nereid_data_plane::config;

/// Where a worker mirrors object-store sources: beside its repository of links.
pub fn cache_dir(repository: &Path) -> PathBuf {
    repository.with_file_name("model-cache")
}

/// The local directory of a source: a `file://` directory as it is, an object-store model
/// folder (`s3://`, `gs://`, `as://`, `az://`) after it is mirrored into `cache`.
pub async fn fetch_source(uri: &str, cache: &Path) -> Result<PathBuf, String> {
    if nereid_data_plane::is_remote(uri) {
        nereid_data_plane::fetch_model(uri, cache).await
    } else {
        source_dir(uri)
    }
}

/// The directory a `file:///abs/path` source names.
pub fn source_dir(uri: &str) -> Result<PathBuf, String> {
    let Some((scheme, rest)) = uri.split_once("://") else {
        return Err(format!(
            "source '{uri}' is not a URI; use file:///absolute/path/to/model"
        ));
    };
    if scheme != "file" {
        return Err(format!(
            "source scheme '{scheme}' is not supported; use file://, s3://, gs:// or as://"
        ));
    }
    let path = Path::new(rest);
    if !path.is_absolute() {
        return Err(format!(
            "source '{uri}' must name an absolute path (file:///abs/path)"
        ));
    }
    if !path.is_dir() {
        return Err(format!(
            "source '{uri}': '{}' is not a directory on this node",
            path.display()
        ));
    }
    Ok(path.to_path_buf())
}

/// Whether a model name can be an entry of the repository directory.
fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\\']) {
        return Err(format!("model name '{name}' cannot be a directory name"));
    }
    Ok(())
}

/// Points `<repo>/<name>` at `source`, replacing an older link.
pub fn link_model(repo: &Path, name: &str, source: &Path) -> Result<(), String> {
    check_name(name)?;
    let link = repo.join(name);
    if std::fs::symlink_metadata(&link).is_ok() {
        std::fs::remove_file(&link)
            .map_err(|e| format!("cannot replace '{}': {e}", link.display()))?;
    }
    std::os::unix::fs::symlink(source, &link).map_err(|e| {
        format!(
            "cannot link '{}' to '{}': {e}",
            link.display(),
            source.display()
        )
    })
}

/// Removes `<repo>/<name>` if it is there.
pub fn unlink_model(repo: &Path, name: &str) {
    if check_name(name).is_ok() {
        let _ = std::fs::remove_file(repo.join(name));
    }
}

/// The config a worker loads a model with: the source's config.pbtxt (empty when it has none:
/// auto-complete fills it), `config_override` (a JSON object, or empty) merged over it, and a
/// `specific` version policy naming `versions`, and every `KIND_GPU` instance group placed on
/// `gpus` (the indices assigned to this node's replicas; nothing changes when it is empty).
pub fn load_config(
    model_dir: &Path,
    config_override: &str,
    versions: &BTreeSet<i64>,
    gpus: &BTreeSet<u32>,
) -> Result<ModelConfig, String> {
    let base = config::read_config_file(model_dir, None).map_err(|e| e.to_string())?;
    let options = SerializeOptions::new()
        .use_proto_field_name(true)
        .stringify_64_bit_integers(false)
        .skip_default_fields(true);
    let mut merged = to_dynamic(&base)
        .serialize_with_options(serde_json::value::Serializer, &options)
        .map_err(|e| format!("cannot read the model config: {e}"))?;
    let serde_json::Value::Object(fields) = &mut merged else {
        return Err("the model config is not an object".into());
    };
    if !config_override.trim().is_empty() {
        let over: serde_json::Value = serde_json::from_str(config_override)
            .map_err(|e| format!("config_override is not valid JSON: {e}"))?;
        let serde_json::Value::Object(over) = over else {
            return Err("config_override must be a JSON object".into());
        };
        fields.extend(over);
    }
    fields.insert(
        "version_policy".into(),
        serde_json::json!({ "specific": { "versions": versions } }),
    );
    let mut config = message_from_json::<ModelConfig>(&merged.to_string())
        .map_err(|e| format!("invalid model config after config_override: {e}"))?;
    pin_gpu_groups(&mut config, gpus)?;
    Ok(config)
}

/// Places every `KIND_GPU` instance group of `config` on `gpus`, replacing the GPUs it listed;
/// nothing changes when `gpus` is empty (a model placed without GPUs).
fn pin_gpu_groups(config: &mut ModelConfig, gpus: &BTreeSet<u32>) -> Result<(), String> {
    if gpus.is_empty() {
        return Ok(());
    }
    let indices = gpus
        .iter()
        .map(|&g| i32::try_from(g).map_err(|_| format!("assigned GPU index {g} is out of range")))
        .collect::<Result<Vec<i32>, String>>()?;
    for group in &mut config.instance_group {
        if group.kind == Kind::Gpu as i32 {
            group.gpus = indices.clone();
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_file_uris_are_sources() {
        let dir = tempfile::tempdir().unwrap();
        let uri = format!("file://{}", dir.path().display());
        assert_eq!(source_dir(&uri).unwrap(), dir.path());
        assert_eq!(
            source_dir("ftp://bucket/m").unwrap_err(),
            "source scheme 'ftp' is not supported; use file://, s3://, gs:// or as://"
        );
        assert!(
            source_dir("file://relative/m")
                .unwrap_err()
                .contains("absolute")
        );
        assert!(source_dir("/abs").unwrap_err().contains("not a URI"));
        assert!(
            source_dir("file:///no/such/dir")
                .unwrap_err()
                .contains("not a directory")
        );
    }

    #[test]
    fn links_are_replaced_and_names_checked() {
        let repo = tempfile::tempdir().unwrap();
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        link_model(repo.path(), "m", a.path()).unwrap();
        link_model(repo.path(), "m", b.path()).unwrap();
        assert_eq!(std::fs::read_link(repo.path().join("m")).unwrap(), b.path());
        assert!(link_model(repo.path(), "../x", a.path()).is_err());
        unlink_model(repo.path(), "m");
        assert!(std::fs::symlink_metadata(repo.path().join("m")).is_err());
    }

    #[test]
    fn override_merges_over_the_file_and_versions_are_specific() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("config.pbtxt"),
            r#"platform: "onnxruntime_onnx" max_batch_size: 8 version_policy: { all: {} }"#,
        )
        .unwrap();
        let none = BTreeSet::new();
        let c = load_config(
            dir.path(),
            r#"{"max_batch_size": 2}"#,
            &[1, 3].into(),
            &none,
        )
        .unwrap();
        assert_eq!(c.platform, "onnxruntime_onnx");
        assert_eq!(c.max_batch_size, 2);
        let json = nereid_proto::message_to_json(&c);
        assert_eq!(
            json["version_policy"]["specific"]["versions"],
            serde_json::json!([1, 3])
        );
        let c = load_config(dir.path(), "", &[2].into(), &none).unwrap();
        assert_eq!(c.max_batch_size, 8);
        assert!(load_config(dir.path(), "[1]", &[1].into(), &none).is_err());
        assert!(load_config(dir.path(), r#"{"nope": 1}"#, &[1].into(), &none).is_err());
    }

    #[test]
    fn assigned_gpus_replace_the_gpus_of_kind_gpu_groups_only() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("config.pbtxt"),
            r#"backend: "python"
            instance_group [
              { name: "g" count: 2 kind: KIND_GPU gpus: [ 0 ] },
              { name: "all" kind: KIND_GPU },
              { name: "c" count: 1 kind: KIND_CPU },
              { name: "a" count: 1 kind: KIND_AUTO }
            ]"#,
        )
        .unwrap();
        let groups = |gpus: &[u32], over: &str| {
            load_config(
                dir.path(),
                over,
                &[1].into(),
                &gpus.iter().copied().collect(),
            )
            .unwrap()
            .instance_group
            .into_iter()
            .map(|g| (g.name, g.count, g.gpus))
            .collect::<Vec<_>>()
        };
        assert_eq!(
            groups(&[3, 1], ""),
            [
                ("g".to_string(), 2, vec![1, 3]),
                ("all".to_string(), 0, vec![1, 3]),
                ("c".to_string(), 1, vec![]),
                ("a".to_string(), 1, vec![]),
            ]
        );
        // Without an assignment the config's own GPUs stay.
        assert_eq!(groups(&[], "")[0].2, vec![0]);
        // A config_override's instance groups are pinned too.
        let over = r#"{"instance_group": [{"name": "o", "kind": "KIND_GPU", "gpus": [7]}]}"#;
        assert_eq!(groups(&[2], over), [("o".to_string(), 0, vec![2])]);
        assert!(
            load_config(dir.path(), "", &[1].into(), &[u32::MAX].into())
                .unwrap_err()
                .contains("out of range")
        );
    }
}
