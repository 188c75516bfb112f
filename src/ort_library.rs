//! Finds the ONNX Runtime shared library, so `target/release/nereid` runs without environment
//! variables after `make build`.
//!
//! Order: the `--onnxruntime-library` flag (or `NEREID_ONNXRUNTIME_LIBRARY`), `ORT_DYLIB_PATH`,
//! a `libonnxruntime.so*` next to the executable, then the library `make setup` installed,
//! whose path the build recorded.

use std::path::{Path, PathBuf};

/// The first candidate that exists; `None` if there is none (ONNX models then fail to load
/// with a reason that says how to fix it).
pub fn resolve(flag: Option<PathBuf>) -> Option<PathBuf> {
    if let Some(path) = flag {
        // An explicit choice is kept even if missing: the load error will name it.
        return Some(path);
    }
    if let Some(path) = std::env::var_os("ORT_DYLIB_PATH") {
        return Some(PathBuf::from(path));
    }
    if let Some(found) = std::env::current_exe()
        .ok()
        .as_deref()
        .and_then(Path::parent)
        .and_then(beside)
    {
        return Some(found);
    }
    option_env!("NEREID_BUILTIN_ORT_LIBRARY")
        .map(PathBuf::from)
        .filter(|p| p.exists())
}

fn beside(dir: &Path) -> Option<PathBuf> {
    let plain = dir.join("libonnxruntime.so");
    if plain.exists() {
        return Some(plain);
    }
    let mut versioned: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libonnxruntime.so."))
        })
        .collect();
    versioned.sort();
    versioned.pop()
}
