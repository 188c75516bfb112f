//! Triton's system and CUDA shared memory extensions, written once for both frontends of a
//! server process: the registry of regions a client registered (POSIX shared-memory objects,
//! and CUDA allocations named by IPC handles: `cuda`), and the copies between those regions and
//! a request's tensors.
//!
//! ```text
//!  HTTP /v2/systemsharedmemory/...  ─┐                      ┌─ gRPC SystemSharedMemory* rpcs
//!                                    ├─► registry::SharedMemory (one per process, shared) ◄─┤
//!  HTTP infer: ShmPlan ─► transfer ──┘   register / status / unregister / region(name)     └── gRPC ModelInfer: ShmPlan
//!     transfer::resolve_inputs (before InferenceService::infer)
//!     transfer::write_outputs  (after it answers) ─► Written: outputs sent without data
//! ```
//!
//! The data plane and the router only ever see ordinary tensors. A registry is enabled by the
//! process that serves models (`nereid serve`, `nereid worker`); the router's is disabled, since
//! a client's memory is on another host, and says so to every use.

mod cuda;
mod registry;
#[cfg(test)]
pub(crate) mod test_object;
mod transfer;

pub use cuda::CudaRegionStatus;
pub use registry::{RegionStatus, SharedMemory};
pub(crate) use transfer::{Written, resolve_inputs, write_outputs};
