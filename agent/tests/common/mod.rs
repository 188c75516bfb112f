//! Helpers of the agent's integration tests: where the workspace and its ONNX Runtime library
//! are (shared with the data plane's tests through `nereid-test-support`).
#![allow(dead_code)]

// Not every test file that compiles this module uses both.
#[allow(unused_imports)]
pub use nereid_test_support::{ort_library, workspace};
