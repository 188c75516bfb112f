//! `nereid-data-plane`: everything that runs models on one node.
//!
//! ```text
//! repository (disk) ─► config (parse, complete, validate) ─► manager (load / unload / poll)
//!                                                                │
//! InferenceService (server) ─► request_check ─► instances (threads) ─► backend (ONNX Runtime)
//!                                           └─► ensemble: steps ─► InferenceService (each step)
//! ```

pub mod agent;
pub mod backend;
pub mod check;
pub mod config;
pub mod ensemble;
pub mod manager;
pub mod metrics;
pub mod probe;
pub mod repository;
pub(crate) mod request;
pub mod request_check;
pub mod scheduler;
pub mod serve;
pub mod server;
pub mod stats;
pub mod system_metrics;
mod ticker;
pub mod warmup;
