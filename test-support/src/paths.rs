//! Where the workspace is, and the ONNX Runtime library `make setup` installed, for the
//! integration tests that load real models.

use std::path::{Path, PathBuf};

/// The workspace root (this crate's parent folder).
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The ONNX Runtime library: `NEREID_ORT_LIBRARY`, else the one `make setup` recorded in
/// `.venv/ort-lib-path`. Panics, naming the fix, when neither is there.
pub fn ort_library() -> PathBuf {
    if let Some(p) = std::env::var_os("NEREID_ORT_LIBRARY") {
        return PathBuf::from(p);
    }
    let record = workspace().join(".venv/ort-lib-path");
    let p = std::fs::read_to_string(&record)
        .map(|s| PathBuf::from(s.trim()))
        .unwrap_or_else(|e| panic!("cannot read {}: {e}: run `make setup`", record.display()));
    assert!(
        p.exists(),
        "ONNX Runtime library not found at {}: run `make setup`",
        p.display()
    );
    p
}
