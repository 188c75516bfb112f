//! Entry points for the coverage-guided fuzz targets under `fuzz/` (not an API; hidden from the
//! docs, and nothing in the server calls them).
//!
//! - [`model_config_text`]: `config.pbtxt` text → `ModelConfig` → `ValidModelConfig`, the
//!   steps a load takes that need no model files (platform/backend filled from each other,
//!   Triton's defaults, validation and typing).
//! - [`python_stub_frames`]: bytes as a Python stub would write them to its socket, through
//!   the parent's frame reader and message dispatcher (`backend::python::fuzzing`).

use std::path::Path;

use crate::backend::{Backends, fill_platform_and_backend};
use crate::config::{ConfigError, ValidModelConfig, fill_defaults, parse_config_text};

/// Parses, completes (without model files or a backend's auto-complete) and validates a
/// config the way loading model `m` does; a config that names no model is named `m`.
pub fn model_config_text(text: &str) -> Result<ValidModelConfig, ConfigError> {
    let mut config = parse_config_text(Path::new("m/config.pbtxt"), text)?;
    if config.name.is_empty() {
        config.name = "m".into();
    }
    fill_platform_and_backend(&mut config, &[], &Backends::new(None))?;
    fill_defaults(&mut config);
    ValidModelConfig::try_from(config)
}

/// Reads and dispatches the frames in `wire` as the parent does with a stub's socket.
pub fn python_stub_frames(wire: &[u8]) {
    crate::backend::python_fuzzing::stub_frames(wire);
}
