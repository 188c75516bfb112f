//! What Nereid's tests share, so they stop copying it: a seeded generator ([`Rng`]), FP32
//! and INT32 tensor builders ([`fp32`], [`floats`], [`int32_1d`], [`ints`]), the workspace and
//! its ONNX Runtime library ([`workspace`], [`ort_library`]), [`eventually`] (poll a condition
//! up to a deadline instead of sleeping before an assertion), [`serve_routes`] (gRPC routes on a
//! free port) and a [`Gate`] (a test backend or fake server signals "started" and waits for
//! "release", so a test orders events without sleeping).
//!
//! Only ever a dev-dependency: nothing here belongs in a shipped binary.
//!
//! The rule these serve: no fixed sleeps in tests. A test that waits for something to happen
//! waits on a [`Gate`] or polls with [`eventually`]; a test whose subject is timing runs on
//! tokio's paused clock (`#[tokio::test(start_paused = true)]`, `tokio::time::advance`).

#![forbid(unsafe_code)]
#![warn(missing_docs)]
// Only tests call it, and a test fails by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod eventually;
mod gate;
mod grpc;
mod paths;
mod rng;
mod tensor;

pub use eventually::{eventually, eventually_async, eventually_ok, eventually_some};
pub use gate::Gate;
pub use grpc::serve_routes;
pub use paths::{ort_library, workspace};
pub use rng::Rng;
pub use tensor::{floats, fp32, fp32_1d, fp32_zeros, int32_1d, ints};
