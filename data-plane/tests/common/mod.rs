//! Helpers shared by the data plane's integration tests: where the workspace and its ONNX
//! Runtime library are, and a data plane over a test repository. FP32 tensors and waiting
//! helpers come from `nereid-test-support`, shared with the other crates' tests.
//!
//! Each test file compiles this module on its own and uses part of it.
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;

use nereid_data_plane::{
    Backends, ControlMode, DataPlane, DataPlaneConfig, ManagerConfig, ModelManager,
};

// Not every test file that compiles this module uses both.
#[allow(unused_imports)]
pub use nereid_test_support::{ort_library, workspace};

/// A data plane over `repo` (models not loaded yet: call `load_startup_models`).
pub fn data_plane(
    repo: &Path,
    mode: ControlMode,
    startup: &[&str],
    backends: Backends,
    queue_capacity: usize,
    strict_readiness: bool,
) -> Arc<DataPlane> {
    let manager = Arc::new(ModelManager::new(
        ManagerConfig {
            repositories: vec![repo.to_path_buf()],
            control_mode: mode,
            startup_models: startup.iter().map(|s| s.to_string()).collect(),
            auto_complete: true,
            queue_capacity,
            cluster_managed: false,
            rate_limit: Default::default(),
            response_cache_bytes: None,
            config_name: None,
            namespacing: false,
        },
        backends,
    ));
    Arc::new(DataPlane::new(
        DataPlaneConfig {
            server_name: "nereid".into(),
            strict_readiness,
        },
        manager,
    ))
}
