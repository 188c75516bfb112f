//! Repository load overrides: `file:<version>/<path>` contents written into a private model
//! directory, refusing any path that would land outside it.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use bytes::Bytes;
use nereid_proto::ServiceError;

/// A model directory made from a load request's files; removed when dropped.
#[derive(Debug)]
pub struct OverrideDir {
    dir: tempfile::TempDir,
}

impl OverrideDir {
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// Checks a `file:` key and returns the relative path it names (`1/model.onnx`).
pub fn override_path(model: &str, key: &str) -> Result<PathBuf, ServiceError> {
    let Some(rel) = key.strip_prefix("file:") else {
        return Err(ServiceError::invalid(format!(
            "failed to load '{model}': unexpected parameter '{key}': override files are named 'file:<version>/<path>'"
        )));
    };
    let path = Path::new(rel);
    let escapes = rel.is_empty()
        || path
            .components()
            .any(|c| !matches!(c, Component::Normal(_)))
        || rel.contains('\\');
    if escapes {
        return Err(ServiceError::invalid(format!(
            "failed to load '{model}': file override '{key}' must be a relative path inside the model directory (no '..', no absolute paths)"
        )));
    }
    Ok(path.to_path_buf())
}

/// Writes the override files (and `config.pbtxt` is not needed: the config travels separately)
/// into a fresh directory.
pub fn write_override_dir(
    model: &str,
    files: &BTreeMap<String, Bytes>,
) -> Result<OverrideDir, ServiceError> {
    let io = |e: std::io::Error| {
        ServiceError::internal(format!(
            "failed to load '{model}': cannot write override files: {e}"
        ))
    };
    let dir = tempfile::Builder::new()
        .prefix("nereid-override-")
        .tempdir()
        .map_err(io)?;
    for (key, contents) in files {
        let rel = override_path(model, key)?;
        let target = dir.path().join(&rel);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(io)?;
        }
        std::fs::write(&target, contents).map_err(io)?;
    }
    Ok(OverrideDir { dir })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_paths_that_escape() {
        for bad in [
            "file:../x",
            "file:1/../../x",
            "file:/etc/passwd",
            "file:",
            "other",
        ] {
            assert!(override_path("m", bad).is_err(), "{bad}");
        }
        assert_eq!(
            override_path("m", "file:1/model.onnx").unwrap(),
            PathBuf::from("1/model.onnx")
        );
    }

    #[test]
    fn writes_files() {
        let mut files = BTreeMap::new();
        files.insert(
            "file:2/sub/model.onnx".to_string(),
            Bytes::from_static(b"abc"),
        );
        let d = write_override_dir("m", &files).unwrap();
        assert_eq!(
            std::fs::read(d.path().join("2/sub/model.onnx")).unwrap(),
            b"abc"
        );
    }
}
