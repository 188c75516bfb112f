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
//! placement-sim: synthetic views ─► nereid_placement::plan, timed per round
//! ```
//!
//! The pure parts (range parsing, input JSON, stability, schedules, report formatting, sweep
//! configs) are unit-tested beside their code; `tests/` drives both clients against an
//! in-process server built from `nereid-proto`'s frontends.
//!
//! The modules are private; the binary and the tests use what is re-exported here: the flags
//! ([`Cli`], [`Command`]), the three runs ([`run`], [`sweep`], [`run_placement_sim`]), their
//! results ([`Level`], [`GridPoint`]) and [`LoadtestError`].

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod cli;
mod client;
mod closed_loop;
mod cpu;
mod elements;
mod error;
mod inputs;
mod measure;
mod open_loop;
mod placement_sim;
mod progress;
mod report;
mod rng;
mod run;
mod stats;
mod sweep;

pub use cli::{Cli, Command};
pub use error::LoadtestError;
pub use placement_sim::run as run_placement_sim;
pub use report::{GridPoint, Level};
pub use run::run;
pub use sweep::sweep;
