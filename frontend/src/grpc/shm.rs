//! The `SystemSharedMemory*` and `CudaSharedMemory*` rpcs' messages ⇄ the process's registry
//! (`crate::shm`).

use nereid_proto::pb::inference::cuda_shared_memory_status_response::RegionStatus as CudaWireStatus;
use nereid_proto::pb::inference::system_shared_memory_status_response::RegionStatus as WireStatus;
use nereid_proto::pb::inference::{
    CudaSharedMemoryStatusResponse, SystemSharedMemoryStatusResponse,
};
use nereid_proto::{ServiceError, ServiceResult};

use crate::shm::{CudaRegionStatus, RegionStatus};

/// The CUDA status response: regions keyed by name.
pub(crate) fn cuda_status_response(
    regions: Vec<CudaRegionStatus>,
) -> CudaSharedMemoryStatusResponse {
    let regions = regions
        .into_iter()
        .map(|r| {
            let wire = CudaWireStatus {
                name: r.name.clone(),
                device_id: r.device_id,
                byte_size: r.byte_size,
            };
            (r.name, wire)
        })
        .collect();
    CudaSharedMemoryStatusResponse { regions }
}

/// The status response: regions keyed by name.
pub(crate) fn status_response(regions: Vec<RegionStatus>) -> SystemSharedMemoryStatusResponse {
    let regions = regions
        .into_iter()
        .map(|r| {
            let wire = WireStatus {
                name: r.name.clone(),
                key: r.key,
                offset: r.offset,
                byte_size: r.byte_size,
            };
            (r.name, wire)
        })
        .collect();
    SystemSharedMemoryStatusResponse { regions }
}

/// A region to register needs a name (an empty one means "every region" elsewhere).
pub(crate) fn check_name(name: &str) -> ServiceResult<()> {
    if name.is_empty() {
        return Err(ServiceError::invalid(
            "a shared memory region to register needs a non-empty 'name'",
        ));
    }
    Ok(())
}
