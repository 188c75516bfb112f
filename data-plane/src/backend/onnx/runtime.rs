//! Loading the ONNX Runtime library and its environment, once per process.
//!
//! `ort` (feature `load-dynamic`) `dlopen`s the library on first use and *panics* if that fails
//! while relying on its default name. So Nereid always loads it explicitly with
//! [`ort::init_from`], after checking that the file exists, and touches no other `ort` API until
//! that succeeded. A failure is an error for the model being loaded, never a panic, and is not
//! remembered: a later load retries. Only one library can be loaded into a process; asking for a
//! different one afterwards is an error.

use std::path::{Path, PathBuf};

use ort::environment::Environment;
use parking_lot::Mutex;

/// The loaded library and the environment every session of the process shares.
struct Loaded {
    /// As given (a path, or the bare file name the system loader searched for).
    library: PathBuf,
    environment: Environment,
}

static LOADED: Mutex<Option<Loaded>> = Mutex::new(None);

/// The file name the system loader searches for when no library path is configured.
pub(crate) const DEFAULT_LIBRARY_NAME: &str = "libonnxruntime.so";

/// The process's ONNX Runtime environment, loading `library` on first use. `Err` is a message
/// for the model that needed it.
pub(crate) fn environment(library: Option<&Path>) -> Result<Environment, String> {
    if let Some(path) = library
        && !path.is_file()
    {
        return Err(format!(
            "the ONNX Runtime library '{}' does not exist (run `make setup` to install it, or point the server at libonnxruntime.so)",
            path.display()
        ));
    }
    let mut loaded = LOADED.lock();
    if let Some(l) = loaded.as_ref() {
        return match library {
            Some(wanted) if !same_file(wanted, &l.library) => Err(format!(
                "ONNX Runtime is already loaded from '{}' in this process; cannot also load '{}'",
                l.library.display(),
                wanted.display()
            )),
            _ => Ok(l.environment.clone()),
        };
    }
    let path = match library {
        Some(path) => path.to_path_buf(),
        // No path: let the system loader search (LD_LIBRARY_PATH, ld.so.cache) for the usual name.
        None => PathBuf::from(DEFAULT_LIBRARY_NAME),
    };
    let builder = ort::init_from(&path).map_err(|e| {
        format!(
            "cannot load the ONNX Runtime library '{}': {e}",
            path.display()
        )
    })?;
    let environment = builder
        .with_name("nereid")
        .with_telemetry(false)
        .build()
        .map_err(|e| format!("cannot create the ONNX Runtime environment: {e}"))?;
    tracing::info!(library = %path.display(), "loaded ONNX Runtime");
    *loaded = Some(Loaded {
        library: path,
        environment: environment.clone(),
    });
    Ok(environment)
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}
