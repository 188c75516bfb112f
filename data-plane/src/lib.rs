//! `nereid-data-plane`: everything that runs models on one node.
//!
//! ```text
//! repository (disk) ─► config (parse) ─► backend::complete ─► config (defaults, validate)
//!                                                 ─► manager (load / unload / poll)
//!                                                                │
//! InferenceService (server) ─► request (LoadedVersion) ─► request_check ─► scheduler
//!                                │                        ─► instances (threads) ─► backend
//!                                └─► ensemble: steps ─► InferenceService (each step)
//! ```
//!
//! Modules import downward only (no cycles; `scripts/module_cycles.py` checks it in
//! `make lint`): server and metrics over manager, over request, over scheduler and warm-up,
//! over request_check, over backend, ensemble and classification, over config and stats.
//!
//! Entry points (re-exported here; the modules behind them are private):
//! - [`serve`] with [`ServeConfig`]: `nereid serve`, until a shutdown future resolves;
//!   [`serve_with`]: the same with a [`Companion`] task started beside the server once it
//!   listens ([`Started`]), which is how `nereid worker` (crate `nereid-agent`) runs its agent.
//! - [`DataPlane`] ([`DataPlaneConfig`]): the `InferenceService` over a [`ModelManager`]
//!   ([`ManagerConfig`], [`ControlMode`]), for callers that bring their own frontends;
//!   [`LoadSource`]: where [`ModelManager::load`] takes a model from (the worker's agent loads
//!   what the control plane assigns through it).
//! - [`check_paths`] ([`CheckOptions`]): `nereid check-config`, a lint as strict as loading.
//! - [`MetricsConfig`]: what the metrics endpoint reports; [`hostname`]: the default node id.
//! - [`mirror_repository`]: an object-store repository URL (`s3://`, `gs://`, `as://`) as the
//!   local directory the manager scans, kept up to date from the store at each scan;
//!   [`fetch_model`]: one model folder of a store, mirrored (a worker's `s3://` model source).
//!
//! Three modules stay public because other code is written against them:
//! - [`backend`]: the `Backend` / `BackendInstance` traits and the
//!   [`InstanceContext`](backend::InstanceContext) a backend loads from: what a backend built
//!   outside this crate would implement, and what the Python backend's tests and the
//!   `python_overhead` example drive directly ([`PythonBackend`](backend::PythonBackend));
//!   [`Backends`] is the registry of the built-in ones.
//! - [`config`]: the typed [`ValidModelConfig`](config::ValidModelConfig) every backend reads
//!   from its `InstanceContext`, and what builds one from a `config.pbtxt` outside a load
//!   (`read_config_file` / `parse_config_text`, `fill_defaults`, then `try_from`, which
//!   validates); completion by a backend and the lint stay inside the crate.
//! - [`probe`]: what the node measures about itself (host memory and CPU, GPUs through NVML,
//!   the C heap), which the worker's agent also reports to the control plane (capacity,
//!   heartbeats).

#![warn(missing_docs)]

pub mod backend;
mod check;
mod classification;
pub mod config;
mod custom_metrics;
mod ensemble;
#[doc(hidden)]
pub mod fuzzing;
mod manager;
mod metrics;
pub mod probe;
mod rate_limit;
mod repository;
mod request;
mod request_check;
mod scheduler;
mod serve;
mod server;
mod stats;
mod system_metrics;
mod ticker;
mod warmup;

pub use backend::Backends;
pub use check::{CheckOptions, Checked, check_paths};
pub use manager::{ControlMode, LoadSource, ManagerConfig, ModelManager};
pub use metrics::{LatencyMetrics, MetricsConfig, MetricsConfigError};
pub use nereid_remote_repository::{RemoteError, default_cache_dir, is_remote};
pub use probe::host::hostname;
pub use rate_limit::RateLimitConfig;
pub use repository::remote::{fetch_model, mirror_repository};
pub use request::cache::{CacheConfigError, parse_cache_config};
pub use serve::{
    Companion, ServeConfig, ServeError, Started, run as serve, run_with as serve_with,
};
pub use server::{DataPlane, DataPlaneConfig};
