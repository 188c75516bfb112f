//! CUDA shared memory regions in the process's registry (Triton's `cuda_shared_memory`
//! extension): a client's device allocation, named by a CUDA IPC handle, registered under a
//! name in the same namespace as system regions (a name is one region of either kind, as in
//! Triton). Inputs are copied off the device into the request's tensors and outputs onto it
//! (`Region::read`/`write`, through `crate::cuda`); the data plane only sees host tensors.
//!
//! ```text
//! register_cuda(name, raw_handle[64], device_id, byte_size)
//!     name taken? ─► 400 already in manager
//!     handle/device/driver/cuIpcOpenMemHandle fails ─► 400 "failed to register shared memory
//!         region: invalid args" (Triton 2.51's answer; the reason goes to the log)
//! cuda_status(name?) / unregister_cuda(name?) ─ CUDA regions only
//! ```
//!
//! On a host without a GPU or without the NVIDIA driver every registration fails as above, as
//! Triton 2.51 (built with GPU support) answers on such a host; status lists nothing and
//! unregister succeeds.

use std::sync::Arc;

use nereid_proto::{ServiceError, ServiceResult};

use super::SharedMemory;
use super::registry::{Backing, Region, already_registered, remove_where};
use crate::cuda::{Driver, IPC_HANDLE_BYTES};

/// What a CUDA status request reports for one region (Triton's `RegionStatus` of the
/// `CudaSharedMemoryStatus` rpc).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaRegionStatus {
    pub name: String,
    pub device_id: u64,
    pub byte_size: u64,
}

/// Triton 2.51's answer to a CUDA registration it could not carry out.
fn invalid_args() -> ServiceError {
    ServiceError::invalid("failed to register shared memory region: invalid args")
}

impl SharedMemory {
    /// Registers `name` as the `byte_size`-byte device allocation that `raw_handle` (a
    /// `cudaIpcMemHandle_t`) names on GPU `device_id`.
    pub fn register_cuda(
        &self,
        name: &str,
        raw_handle: &[u8],
        device_id: i64,
        byte_size: u64,
    ) -> ServiceResult<()> {
        if self.regions_of("CUDA")?.contains_key(name) {
            return Err(already_registered(name));
        }
        let refuse = |reason: String| {
            tracing::warn!(region = name, device_id, %reason, "CUDA shared memory register failed");
            invalid_args()
        };
        let Ok(handle) = <&[u8; IPC_HANDLE_BYTES]>::try_from(raw_handle) else {
            return Err(refuse(format!(
                "raw_handle has {} bytes, a CUDA IPC handle has {IPC_HANDLE_BYTES}",
                raw_handle.len()
            )));
        };
        let Some(device) = i32::try_from(device_id).ok().filter(|d| *d >= 0) else {
            return Err(refuse(format!(
                "device_id {device_id} is not a CUDA device"
            )));
        };
        if name.is_empty() {
            return Err(refuse("the region has no name".into()));
        }
        let driver = Driver::get().map_err(|e| refuse(e.to_string()))?;
        let memory = driver
            .open_ipc(handle, device, byte_size)
            .map_err(|e| refuse(e.to_string()))?;
        let backing = Backing::Cuda {
            device_id: device as u64,
            memory,
        };
        let region = Region::new(name, byte_size, backing);
        let mut regions = self.regions_of("CUDA")?;
        if regions.contains_key(name) {
            return Err(already_registered(name));
        }
        regions.insert(name.to_string(), Arc::new(region));
        Ok(())
    }

    /// Every CUDA region (`None`) or the one named.
    pub fn cuda_status(&self, name: Option<&str>) -> ServiceResult<Vec<CudaRegionStatus>> {
        let regions = match self.regions_of("CUDA") {
            Ok(regions) => regions,
            Err(ServiceError::Unsupported(_)) if name.is_none() => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let cuda = |r: &Region| match &r.backing {
            Backing::Cuda { device_id, .. } => Some(CudaRegionStatus {
                name: r.name().to_string(),
                device_id: *device_id,
                byte_size: r.byte_size(),
            }),
            Backing::System { .. } => None,
        };
        match name {
            None => Ok(regions.values().filter_map(|r| cuda(r)).collect()),
            Some(name) => match regions.get(name) {
                Some(r) => cuda(r).map(|s| vec![s]).ok_or_else(|| {
                    ServiceError::not_found(format!(
                        "The region named '{name}' is registered as system shared memory, not CUDA shared memory"
                    ))
                }),
                None => Err(ServiceError::not_found(format!(
                    "Unable to find cuda shared memory region: '{name}'"
                ))),
            },
        }
    }

    /// Unregisters one CUDA region, or every CUDA region (`None`); system regions stay. The
    /// handle closes when the last request using the region finishes.
    pub fn unregister_cuda(&self, name: Option<&str>) -> ServiceResult<()> {
        let mut regions = self.regions_of("CUDA")?;
        remove_where(&mut regions, name, |b| matches!(b, Backing::Cuda { .. }));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::test_object::TestObject;

    /// Whether this host has a usable CUDA driver (the refusal tests need one without).
    fn no_driver() -> bool {
        Driver::get().is_err()
    }

    #[test]
    fn without_a_driver_registration_fails_as_triton_answers() {
        if !no_driver() {
            return;
        }
        let shm = SharedMemory::enabled();
        for (handle, device) in [(vec![0u8; 64], 0), (vec![0u8; 3], 0), (vec![0u8; 64], -1)] {
            assert_eq!(
                shm.register_cuda("r", &handle, device, 64).unwrap_err(),
                invalid_args()
            );
        }
        assert!(shm.cuda_status(None).unwrap().is_empty());
        assert_eq!(
            shm.cuda_status(Some("r")).unwrap_err(),
            ServiceError::not_found("Unable to find cuda shared memory region: 'r'")
        );
        shm.unregister_cuda(Some("r")).unwrap();
        shm.unregister_cuda(None).unwrap();
    }

    #[test]
    fn one_namespace_two_kinds() {
        let obj = TestObject::new(16);
        let shm = SharedMemory::enabled();
        shm.register("sys", &obj.key, 0, 16).unwrap();
        assert_eq!(
            shm.register_cuda("sys", &[0; 64], 0, 16).unwrap_err(),
            already_registered("sys")
        );
        assert_eq!(
            shm.cuda_status(Some("sys")).unwrap_err(),
            ServiceError::not_found(
                "The region named 'sys' is registered as system shared memory, not CUDA shared memory"
            )
        );
        assert!(shm.cuda_status(None).unwrap().is_empty());
        // CUDA unregister leaves system regions alone.
        shm.unregister_cuda(Some("sys")).unwrap();
        shm.unregister_cuda(None).unwrap();
        assert_eq!(shm.status(None).unwrap().len(), 1);
    }

    #[test]
    fn a_disabled_registry_refuses_cuda_regions_too() {
        let shm = SharedMemory::disabled("the router cannot read a client's memory");
        assert_eq!(
            shm.register_cuda("r", &[0; 64], 0, 8).unwrap_err(),
            ServiceError::unsupported(
                "CUDA shared memory is not available: the router cannot read a client's memory"
            )
        );
        assert!(shm.cuda_status(None).unwrap().is_empty());
    }
}
