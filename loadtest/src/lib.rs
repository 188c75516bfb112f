//! `nereid-loadtest`: a perf_analyzer-style load generator for any KServe v2 server (Nereid,
//! Triton, MLServer), over HTTP (binary tensor extension or JSON) and gRPC.
//!
//! ```text
//! cli ─► run::Session::open ─► client::{http,grpc} (metadata, liveness) ─► inputs (tensors)
//!                                      │ prepare(): bodies encoded once
//!        run::run_levels ─► closed_loop (N workers) | open_loop (scheduled sends)
//!                              └─► stats::Recorder ◄── measure (warm-up, windows, stability)
//!        report (table, CSV, JSON)      sweep: reload the model per grid point, then run_levels
//!
//! placement-sim: synthetic views ─► nereid_control_plane::placement::plan, timed per round
//! ```
//!
//! The pure parts (range parsing, input JSON, stability, schedules, report formatting, sweep
//! configs) are unit-tested beside their code; `tests/` drives both clients against an
//! in-process server built from `nereid-proto`'s frontends.

#![forbid(unsafe_code)]

pub mod cli;
pub mod client;
pub mod closed_loop;
pub mod cpu;
pub mod elements;
pub mod error;
pub mod inputs;
pub mod measure;
pub mod open_loop;
pub mod placement_sim;
pub mod progress;
pub mod report;
pub mod rng;
pub mod run;
pub mod stats;
pub mod sweep;

pub use error::LoadtestError;
