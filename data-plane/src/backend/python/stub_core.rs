//! Finds the stub's compiled core, `libnereid_stub_core.so` (crate `nereid-stub-core`, built by
//! `make build` next to the `nereid` binary), without environment variables, where
//! `backend/library_path.rs` looks for Nereid's libraries: next to the running executable (a
//! deployment copies the two together), `/opt/nereid`, then where this build put it.
//! The runtime directory gets a copy named `nereid_stub_core.abi3.so`, so a rebuild under a
//! running server does not change what its stubs import.

use std::path::{Path, PathBuf};

use crate::backend::library_path;

/// The library's file name as cargo builds it.
pub const LIBRARY_NAME: &str = "libnereid_stub_core.so";
/// The name Python imports it by (`import nereid_stub_core`; abi3 suffix).
pub const MODULE_FILE: &str = "nereid_stub_core.abi3.so";

/// The library to copy, or an error naming every place looked at.
pub fn locate() -> Result<PathBuf, String> {
    library_path::locate(LIBRARY_NAME).map_err(|places| missing_message(&places))
}

fn missing_message(candidates: &[PathBuf]) -> String {
    format!(
        "the Python backend's compiled stub core {LIBRARY_NAME} was not found (looked at {}); build it with `make build` (cargo build --release -p nereid-stub-core) and keep it next to the nereid binary",
        library_path::list(candidates)
    )
}

/// Copies the library into `dir` under the module's name.
pub fn install_into(dir: &Path) -> Result<(), String> {
    let library = locate()?;
    std::fs::copy(&library, dir.join(MODULE_FILE))
        .map(|_| ())
        .map_err(|e| {
            format!(
                "cannot copy the Python stub core {} into {}: {e}",
                library.display(),
                dir.display()
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_missing_library_is_named_with_where_it_was_looked_for() {
        let message = missing_message(&[PathBuf::from("/opt/nereid/libnereid_stub_core.so")]);
        assert!(message.contains("libnereid_stub_core.so"), "{message}");
        assert!(
            message.contains("/opt/nereid/libnereid_stub_core.so"),
            "{message}"
        );
        assert!(message.contains("make build"), "{message}");
    }
}
