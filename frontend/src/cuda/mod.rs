//! CUDA for the frontends: the driver API, loaded at run time, so the binary builds and runs
//! without CUDA and a GPU-less host answers CUDA shared memory requests with an error instead
//! of failing to start. Used by the shared-memory registry for CUDA regions.

mod driver;

pub(crate) use driver::{DeviceRegion, Driver, IPC_HANDLE_BYTES};

/// Why a CUDA operation failed.
#[derive(Clone, Debug, thiserror::Error)]
pub enum CudaError {
    /// No usable driver: the library, a symbol, or `cuInit` (no device) failed.
    #[error("{0}")]
    NoDriver(String),
    /// A driver call answered an error.
    #[error("{call} failed: {message} (CUresult {code})")]
    Call {
        call: &'static str,
        code: i32,
        message: String,
    },
    /// A copy outside the registered region (the caller checks first; this is the backstop).
    #[error("bytes {offset}..{end} are outside the {byte_size}-byte region")]
    OutOfRange {
        offset: u64,
        end: u64,
        byte_size: u64,
    },
}
