//! What the node measures about itself: the host from `/proc` ([`host`]: memory, CPU time,
//! the process's resident memory, the host name) and the GPUs through NVML ([`gpu`]).
//!
//! ```text
//! probe::host ─┬─► system_metrics (nv_cpu_*)        probe::gpu ─┬─► system_metrics (nv_gpu_*)
//!              ├─► manager (memory per loaded model)             └─► agent (capacity, heartbeat)
//!              └─► agent (capacity, heartbeat, node id)
//! ```
//!
//! Used by `serve` and the worker alike, so the single-node server never depends on the
//! cluster agent.

pub mod gpu;
pub mod host;
