//! CPU-heavy request work (HTTP body codecs, shared-memory copies) runs inline when it is
//! small and on tokio's blocking pool when it is larger than [`OFFLOAD_BYTES`], so a large
//! tensor never stalls the async workers.

use nereid_proto::{ServiceError, ServiceResult};

/// Work on more bytes than this runs on the blocking pool.
pub(crate) const OFFLOAD_BYTES: u64 = 256 * 1024;

/// Runs `work` (which handles `size` bytes) inline when small, else on the blocking pool;
/// `what` names the work in the error if the blocking task fails.
pub(crate) async fn offload<T: Send + 'static>(
    size: u64,
    what: &'static str,
    work: impl FnOnce() -> ServiceResult<T> + Send + 'static,
) -> ServiceResult<T> {
    if size < OFFLOAD_BYTES {
        return work();
    }
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| ServiceError::internal(format!("{what} task failed: {e}")))?
}
