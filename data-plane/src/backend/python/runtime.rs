//! The runtime directory: the shipped Python files (embedded in the binary) and a copy of the
//! compiled stub core ([`super::stub_core`]) written once per backend into a private directory
//! (mode 0700), which every stub gets first on `PYTHONPATH`.

use std::path::{Path, PathBuf};

use super::process::private_dir;

/// The stub's main program.
const STUB_FILE: &str = "nereid_stub.py";
const STUB_SOURCE: &str = include_str!("../../../python/nereid_stub.py");
/// `import triton_python_backend_utils as pb_utils` in user code finds this.
const UTILS_FILE: &str = "triton_python_backend_utils.py";
const UTILS_SOURCE: &str = include_str!("../../../python/triton_python_backend_utils.py");
/// A shared stub process's members, imported by the stub when it hosts several instances.
const SHARED_FILE: &str = "nereid_stub_shared.py";
const SHARED_SOURCE: &str = include_str!("../../../python/nereid_stub_shared.py");
/// DLPack capsules and GPU tensors, imported by the utils.
const DLPACK_FILE: &str = "nereid_dlpack.py";
const DLPACK_SOURCE: &str = include_str!("../../../python/nereid_dlpack.py");

/// The written files; removed when the last user is gone.
#[derive(Debug)]
pub struct RuntimeDir {
    dir: tempfile::TempDir,
}

impl RuntimeDir {
    /// Fails with a message naming what is missing (the compiled core) or cannot be written.
    pub fn create() -> Result<Self, String> {
        let dir = private_dir("nereid-python-")
            .map_err(|e| format!("cannot create the Python backend's runtime directory: {e}"))?;
        for (name, source) in [
            (STUB_FILE, STUB_SOURCE),
            (UTILS_FILE, UTILS_SOURCE),
            (DLPACK_FILE, DLPACK_SOURCE),
            (SHARED_FILE, SHARED_SOURCE),
        ] {
            std::fs::write(dir.path().join(name), source).map_err(|e| {
                format!("cannot write the Python backend's runtime file {name}: {e}")
            })?;
        }
        super::stub_core::install_into(dir.path())?;
        Ok(RuntimeDir { dir })
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn stub_script(&self) -> PathBuf {
        self.dir.path().join(STUB_FILE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_and_the_compiled_core_are_written() {
        let runtime = RuntimeDir::create().unwrap();
        let stub = std::fs::read_to_string(runtime.stub_script()).unwrap();
        assert_eq!(stub, STUB_SOURCE);
        let utils = std::fs::read_to_string(runtime.path().join(UTILS_FILE)).unwrap();
        assert_eq!(utils, UTILS_SOURCE);
        let dlpack = std::fs::read_to_string(runtime.path().join(DLPACK_FILE)).unwrap();
        assert_eq!(dlpack, DLPACK_SOURCE);
        let shared = std::fs::read_to_string(runtime.path().join(SHARED_FILE)).unwrap();
        assert_eq!(shared, SHARED_SOURCE);
        assert!(
            runtime
                .path()
                .join(super::super::stub_core::MODULE_FILE)
                .is_file()
        );
        let path = runtime.path().to_path_buf();
        drop(runtime);
        assert!(!path.exists(), "removed with its owner");
    }
}
