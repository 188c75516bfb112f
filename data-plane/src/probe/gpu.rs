//! The node's NVIDIA GPUs, through NVML: what the worker offers at registration, what it
//! reports in heartbeats, and the data plane's `nv_gpu_*` metrics.
//!
//! ```text
//! serve/agent ─► Gpus::probe (loads libnvidia-ml.so.1 at run time, nvmlInit)
//!                  ├─ fails (no driver, no library, no permission): no devices, reason kept,
//!                  │   one info line; capacity() and utilization() are empty
//!                  └─ succeeds: handle kept for its owner's lifetime (shared by Arc)
//!                        ├─► capacity()    per device: index, total memory  ─► RegisterNode
//!                        ├─► utilization() per device: busy fraction,       ─► Heartbeat
//!                        │                 memory used / total
//!                        └─► readings()    per device: uuid, busy, memory,  ─► nv_gpu_* metrics
//!                                          power, power limit, energy         (system_metrics)
//! ```
//!
//! Nothing here needs CUDA or the driver at build time: `nvml-wrapper` opens the library with
//! `dlopen` when [`Gpus::probe`] runs. Devices are NVML's, numbered as NVML numbers them
//! (`CUDA_VISIBLE_DEVICES` does not apply). A device whose query fails is left out of that
//! answer (debug log) rather than failing it. The conversions from raw readings are pure
//! ([`gpu_capacity`], [`gpu_utilization`]).

use nereid_proto::pb::cluster::{Gpu, GpuUtilization};
use nvml_wrapper::Nvml;

/// NVML, when it could be initialised on this host.
#[derive(Debug)]
pub struct Gpus {
    /// The NVML handle, or why there is none.
    nvml: Result<Nvml, String>,
}

impl Gpus {
    /// Initialises NVML. Never fails: without it the node has no GPUs, and the reason is
    /// logged once (info) and kept (`Gpus::unavailable`, which tests read).
    pub fn probe() -> Gpus {
        match Nvml::init() {
            Ok(nvml) => {
                let gpus = Gpus { nvml: Ok(nvml) };
                tracing::info!(count = gpus.device_count(), "NVML initialised; GPUs found");
                gpus
            }
            Err(e) => {
                tracing::info!(reason = %e, "NVML unavailable; the node reports no GPUs");
                Gpus::none(e.to_string())
            }
        }
    }

    /// No GPUs, for `reason`.
    pub fn none(reason: impl Into<String>) -> Gpus {
        Gpus {
            nvml: Err(reason.into()),
        }
    }

    /// Why NVML is not available; `None` when it is.
    #[cfg(test)]
    pub fn unavailable(&self) -> Option<&str> {
        self.nvml.as_ref().err().map(String::as_str)
    }

    /// How many GPUs NVML sees; 0 without NVML or when the count fails.
    pub fn count(&self) -> u32 {
        self.device_count()
    }

    /// NVML's device count; 0 without NVML or when the count fails.
    fn device_count(&self) -> u32 {
        let Ok(nvml) = &self.nvml else { return 0 };
        nvml.device_count().unwrap_or_else(|e| {
            tracing::debug!(error = %e, "NVML device count failed");
            0
        })
    }

    /// Per device, `f(index, device)`; a device that cannot be opened or whose `f` fails is
    /// skipped with a debug log.
    fn each<T>(
        &self,
        what: &str,
        f: impl Fn(u32, &nvml_wrapper::Device<'_>) -> Result<T, nvml_wrapper::error::NvmlError>,
    ) -> Vec<T> {
        let Ok(nvml) = &self.nvml else {
            return Vec::new();
        };
        (0..self.device_count())
            .filter_map(
                |index| match nvml.device_by_index(index).and_then(|d| f(index, &d)) {
                    Ok(v) => Some(v),
                    Err(e) => {
                        tracing::debug!(index, error = %e, "GPU {what} query failed; skipped");
                        None
                    }
                },
            )
            .collect()
    }

    /// The GPUs the node offers: index and total memory of each.
    pub fn capacity(&self) -> Vec<Gpu> {
        self.each("capacity", |index, d| {
            Ok(gpu_capacity(index, d.memory_info()?.total))
        })
    }

    /// Current utilization of each GPU: busy fraction over NVML's last sample period, memory
    /// used and total.
    pub fn utilization(&self) -> Vec<GpuUtilization> {
        self.each("utilization", |index, d| {
            let rates = d.utilization_rates()?;
            let memory = d.memory_info()?;
            Ok(gpu_utilization(index, rates.gpu, memory.used, memory.total))
        })
    }
}

impl Gpus {
    /// What the `nv_gpu_*` metrics report of each GPU. Power and energy readings a device
    /// does not support are `None`.
    pub fn readings(&self) -> Vec<GpuReading> {
        self.each("metrics", |_, d| {
            let memory = d.memory_info()?;
            Ok(GpuReading {
                uuid: d.uuid()?,
                utilization: f64::from(d.utilization_rates()?.gpu.min(100)) / 100.0,
                memory_used_bytes: memory.used,
                memory_total_bytes: memory.total,
                power_watts: d.power_usage().ok().map(milli),
                power_limit_watts: d.enforced_power_limit().ok().map(milli),
                energy_millijoules: d.total_energy_consumption().ok(),
            })
        })
    }
}

fn milli(v: u32) -> f64 {
    f64::from(v) / 1000.0
}

/// One GPU's readings for the metrics.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuReading {
    /// The GPU's UUID as NVML reports it (`GPU-...`), which labels its metrics.
    pub uuid: String,
    /// Busy fraction over NVML's last sample period, 0.0..=1.0.
    pub utilization: f64,
    /// Device memory in use, in bytes.
    pub memory_used_bytes: u64,
    /// Total device memory, in bytes.
    pub memory_total_bytes: u64,
    /// Current power draw, in watts; `None` where the GPU does not report it.
    pub power_watts: Option<f64>,
    /// The power management limit, in watts; `None` where the GPU does not report it.
    pub power_limit_watts: Option<f64>,
    /// Energy since the driver was loaded.
    pub energy_millijoules: Option<u64>,
}

/// A GPU of the node's capacity.
pub fn gpu_capacity(index: u32, memory_total: u64) -> Gpu {
    Gpu {
        index,
        memory_bytes: memory_total,
    }
}

/// A GPU's utilization from NVML's readings: `percent` (of time a kernel ran, 0–100; clamped)
/// becomes a fraction in 0.0..=1.0.
pub fn gpu_utilization(
    index: u32,
    percent: u32,
    memory_used: u64,
    memory_total: u64,
) -> GpuUtilization {
    GpuUtilization {
        index,
        utilization: f64::from(percent.min(100)) / 100.0,
        memory_used_bytes: memory_used,
        memory_total_bytes: memory_total,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_becomes_a_clamped_fraction() {
        let u = gpu_utilization(1, 37, 5, 10);
        assert_eq!(
            u,
            GpuUtilization {
                index: 1,
                utilization: 0.37,
                memory_used_bytes: 5,
                memory_total_bytes: 10,
            }
        );
        assert_eq!(gpu_utilization(0, 0, 0, 0).utilization, 0.0);
        assert_eq!(gpu_utilization(0, 100, 0, 0).utilization, 1.0);
        assert_eq!(gpu_utilization(0, 250, 0, 0).utilization, 1.0);
    }

    #[test]
    fn capacity_is_index_and_total_memory() {
        assert_eq!(
            gpu_capacity(3, 80 << 30),
            Gpu {
                index: 3,
                memory_bytes: 80 << 30
            }
        );
    }

    #[test]
    fn none_has_no_devices() {
        let gpus = Gpus::none("disabled");
        assert_eq!(gpus.unavailable(), Some("disabled"));
        assert!(gpus.capacity().is_empty());
        assert!(gpus.utilization().is_empty());
        assert!(gpus.readings().is_empty());
    }

    /// On a host without NVML (the test machines) the probe succeeds with no devices; on one
    /// with GPUs it reports one capacity entry per device, each with memory.
    #[test]
    fn probe_never_fails() {
        let gpus = Gpus::probe();
        let capacity = gpus.capacity();
        if gpus.unavailable().is_some() {
            assert!(capacity.is_empty());
            assert!(gpus.utilization().is_empty());
        } else {
            assert!(capacity.iter().all(|g| g.memory_bytes > 0));
            assert!(
                gpus.utilization()
                    .iter()
                    .all(|u| (0.0..=1.0).contains(&u.utilization))
            );
        }
    }
}
