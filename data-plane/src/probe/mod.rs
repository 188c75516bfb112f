//! What the node measures about itself: the host from `/proc` ([`host`]: memory, CPU time,
//! a Python stub's memory, the host name), the C heap in use ([`heap`]: what a load
//! keeps) and the GPUs through NVML ([`gpu`]).
//!
//! ```text
//! probe::host ─┬─► system_metrics (nv_cpu_*)        probe::gpu ─┬─► system_metrics (nv_gpu_*)
//!              ├─► manager (Python stubs' memory)                └─► agent (capacity, heartbeat)
//!              └─► agent (capacity, heartbeat, node id)
//! probe::heap ───► manager (memory per loaded version) ─► agent (replica memory, heartbeat)
//! ```
//!
//! Used by `serve` and the worker alike, so the single-node server never depends on the
//! cluster agent.

pub mod gpu;
pub mod heap;
pub mod host;
