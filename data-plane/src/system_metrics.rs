//! Host and GPU metrics of the data plane: `nv_cpu_*` from `/proc`, `nv_gpu_*` and
//! `nv_energy_consumption` through NVML ([`crate::probe::gpu`]).
//!
//! ```text
//! serve start ─► SystemMetrics::probe (NVML if --allow-gpu-metrics; first /proc sample)
//!             ─► refresh_task: every --metrics-interval-ms, on a blocking thread,
//!                  refresh(): read /proc/stat, /proc/meminfo, NVML ─► latest readings
//!                until the server stops
//! scrape / OTLP tick ─► families(): the latest readings (no I/O)
//! ```
//!
//! Sampling on a timer rather than at scrape time, as Triton does: CPU utilization is the
//! busy share of CPU time between two samples, so a fixed interval gives it a fixed meaning
//! whoever scrapes and how often (two scrapers would otherwise split each other's intervals),
//! and a scrape never waits on NVML. Readings are at most one interval old.
//!
//! Without GPUs (no NVML, no driver, or `--allow-gpu-metrics=false`) the `nv_gpu_*` families
//! are absent, not zero. Energy is counted from when the server started.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use nereid_telemetry::{Family, Labels};
use parking_lot::Mutex;
use tokio::sync::watch;

use crate::probe::gpu::{GpuReading, Gpus};
use crate::probe::host;

/// The host's CPU and memory at one sample.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CpuReading {
    /// Busy share of all CPUs since the previous sample (since boot for the first), 0.0..=1.0.
    pub utilization: f64,
    pub memory_total_bytes: u64,
    /// Total minus available.
    pub memory_used_bytes: u64,
}

/// A CPU reading from the texts of `/proc/stat` and `/proc/meminfo`, given the CPU ticks
/// (busy, total) of the previous sample. Also returns the ticks now, for the next one.
/// `None` when either text lacks what is needed.
pub fn cpu_reading(
    previous_ticks: Option<(u64, u64)>,
    stat: &str,
    meminfo: &str,
) -> Option<(CpuReading, (u64, u64))> {
    let ticks = host::parse_stat_cpu(stat)?;
    let (total, available) = host::parse_meminfo(meminfo);
    let (total, available) = (total?, available?);
    let reading = CpuReading {
        utilization: host::cpu_between(previous_ticks.unwrap_or((0, 0)), ticks),
        memory_total_bytes: total,
        memory_used_bytes: total.saturating_sub(available),
    };
    Some((reading, ticks))
}

#[derive(Debug, Default)]
struct Latest {
    cpu: Option<CpuReading>,
    ticks: Option<(u64, u64)>,
    gpus: Vec<GpuReading>,
    /// Each GPU's energy counter at its first reading, by uuid.
    energy_start: HashMap<String, u64>,
}

/// The latest host and GPU readings, refreshed by [`refresh_task`].
#[derive(Debug)]
pub struct SystemMetrics {
    cpu: bool,
    gpus: Option<Gpus>,
    latest: Mutex<Latest>,
}

impl SystemMetrics {
    /// Opens NVML when `gpu` is set and takes a first sample. Blocking (NVML init).
    pub fn probe(cpu: bool, gpu: bool) -> SystemMetrics {
        let metrics = SystemMetrics {
            cpu,
            gpus: gpu.then(Gpus::probe),
            latest: Mutex::new(Latest::default()),
        };
        metrics.refresh();
        metrics
    }

    /// Takes a new sample. Blocking (reads `/proc`, queries NVML).
    pub fn refresh(&self) {
        let cpu_texts = self.cpu.then(|| {
            (
                std::fs::read_to_string("/proc/stat").unwrap_or_default(),
                std::fs::read_to_string("/proc/meminfo").unwrap_or_default(),
            )
        });
        let gpus = self.gpus.as_ref().map(Gpus::readings).unwrap_or_default();
        let mut latest = self.latest.lock();
        if let Some((stat, meminfo)) = cpu_texts {
            match cpu_reading(latest.ticks, &stat, &meminfo) {
                Some((reading, ticks)) => {
                    latest.cpu = Some(reading);
                    latest.ticks = Some(ticks);
                }
                None => latest.cpu = None,
            }
        }
        for g in &gpus {
            if let Some(e) = g.energy_millijoules {
                latest.energy_start.entry(g.uuid.clone()).or_insert(e);
            }
        }
        latest.gpus = gpus;
    }

    /// The families of the latest sample; GPU families are empty (so absent) without GPUs.
    pub fn families(&self) -> Vec<Family> {
        let latest = self.latest.lock();
        families(latest.cpu.as_ref(), &latest.gpus, &latest.energy_start)
    }
}

/// Refreshes `metrics` every `interval` until `stop` is set.
pub async fn refresh_task(
    metrics: Arc<SystemMetrics>,
    interval: Duration,
    stop: watch::Receiver<bool>,
) {
    crate::ticker::every(interval, stop, || {
        let m = metrics.clone();
        async move {
            if let Err(e) = tokio::task::spawn_blocking(move || m.refresh()).await {
                tracing::warn!(error = %e, "system metrics refresh failed");
            }
        }
    })
    .await;
}

/// The `nv_cpu_*`, `nv_gpu_*` and `nv_energy_consumption` families of one sample.
pub fn families(
    cpu: Option<&CpuReading>,
    gpus: &[GpuReading],
    energy_start: &HashMap<String, u64>,
) -> Vec<Family> {
    let mut out = Vec::new();
    if let Some(c) = cpu {
        let none = Labels::none;
        out.push(
            Family::gauge("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]")
                .with(none(), c.utilization),
        );
        out.push(
            Family::gauge(
                "nv_cpu_memory_total_bytes",
                "CPU total memory (RAM), in bytes",
            )
            .with(none(), c.memory_total_bytes as f64),
        );
        out.push(
            Family::gauge(
                "nv_cpu_memory_used_bytes",
                "CPU used memory (RAM), in bytes",
            )
            .with(none(), c.memory_used_bytes as f64),
        );
    }
    type Pick = fn(&GpuReading, &HashMap<String, u64>) -> Option<f64>;
    let gpu_families: [(&str, &str, bool, Pick); 6] = [
        (
            "nv_gpu_utilization",
            "GPU utilization rate [0.0 - 1.0)",
            false,
            |g, _| Some(g.utilization),
        ),
        (
            "nv_gpu_memory_total_bytes",
            "GPU total memory, in bytes",
            false,
            |g, _| Some(g.memory_total_bytes as f64),
        ),
        (
            "nv_gpu_memory_used_bytes",
            "GPU used memory, in bytes",
            false,
            |g, _| Some(g.memory_used_bytes as f64),
        ),
        (
            "nv_gpu_power_usage",
            "GPU power usage in watts",
            false,
            |g, _| g.power_watts,
        ),
        (
            "nv_gpu_power_limit",
            "GPU power management limit in watts",
            false,
            |g, _| g.power_limit_watts,
        ),
        (
            "nv_energy_consumption",
            "GPU energy consumption in joules since the server started",
            true,
            |g, start| {
                let now = g.energy_millijoules?;
                let base = start.get(&g.uuid).copied().unwrap_or(now);
                Some(now.saturating_sub(base) as f64 / 1000.0)
            },
        ),
    ];
    for (name, help, counter, pick) in gpu_families {
        let mut family = if counter {
            Family::counter(name, help)
        } else {
            Family::gauge(name, help)
        };
        for g in gpus {
            if let Some(v) = pick(g, energy_start) {
                family.number(Labels::of([("gpu_uuid", g.uuid.as_str())]), v);
            }
        }
        out.push(family);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use nereid_telemetry::render_prometheus;

    const STAT_1: &str = "cpu  100 0 100 700 100 0 0 0 0 0\ncpu0 50 0 50 350 50 0 0 0 0 0\n";
    const STAT_2: &str = "cpu  250 0 150 900 100 0 0 0 0 0\ncpu0 1 1 1 1 1 0 0 0 0 0\n";
    const MEMINFO: &str =
        "MemTotal:       16000 kB\nMemFree:         1000 kB\nMemAvailable:    4000 kB\n";

    #[test]
    fn cpu_reading_from_proc_texts() {
        let (first, ticks) = cpu_reading(None, STAT_1, MEMINFO).unwrap();
        // Since boot: busy 200 of 1000 ticks (idle + iowait are not busy).
        assert_eq!(first.utilization, 0.2);
        assert_eq!(ticks, (200, 1000));
        assert_eq!(first.memory_total_bytes, 16000 * 1024);
        assert_eq!(first.memory_used_bytes, 12000 * 1024);
        // Between samples: busy +200 of +400 ticks.
        let (second, _) = cpu_reading(Some(ticks), STAT_2, MEMINFO).unwrap();
        assert_eq!(second.utilization, 0.5);
    }

    #[test]
    fn cpu_reading_needs_both_files() {
        assert!(cpu_reading(None, "", MEMINFO).is_none());
        assert!(cpu_reading(None, STAT_1, "MemTotal: 1 kB\n").is_none());
    }

    fn gpu(uuid: &str, energy: Option<u64>) -> GpuReading {
        GpuReading {
            uuid: uuid.into(),
            utilization: 0.25,
            memory_used_bytes: 1,
            memory_total_bytes: 2,
            power_watts: Some(70.5),
            power_limit_watts: None,
            energy_millijoules: energy,
        }
    }

    #[test]
    fn without_gpus_the_gpu_families_are_absent() {
        let cpu = CpuReading {
            utilization: 0.5,
            memory_total_bytes: 10,
            memory_used_bytes: 4,
        };
        let text = render_prometheus(&families(Some(&cpu), &[], &HashMap::new()));
        assert!(text.contains("nv_cpu_utilization 0.5\n"), "{text}");
        assert!(text.contains("nv_cpu_memory_total_bytes 10\n"));
        assert!(text.contains("nv_cpu_memory_used_bytes 4\n"));
        assert!(!text.contains("nv_gpu"), "{text}");
        assert!(!text.contains("nv_energy"), "{text}");
    }

    #[test]
    fn gpu_families_by_uuid_with_energy_since_start() {
        let start = HashMap::from([("GPU-a".to_string(), 1_000)]);
        let text = render_prometheus(&families(None, &[gpu("GPU-a", Some(3_500))], &start));
        assert!(
            text.contains("nv_gpu_utilization{gpu_uuid=\"GPU-a\"} 0.25\n"),
            "{text}"
        );
        assert!(text.contains("nv_gpu_power_usage{gpu_uuid=\"GPU-a\"} 70.5\n"));
        assert!(text.contains("nv_energy_consumption{gpu_uuid=\"GPU-a\"} 2.5\n"));
        assert!(text.contains("# TYPE nv_energy_consumption counter\n"));
        // A reading the device does not support is left out.
        assert!(!text.contains("nv_gpu_power_limit"), "{text}");
        assert!(!text.contains("nv_cpu"), "{text}");
    }

    #[test]
    fn probe_without_gpus_reports_cpu_only() {
        let m = SystemMetrics::probe(true, false);
        let text = render_prometheus(&m.families());
        assert!(text.contains("nv_cpu_memory_total_bytes"), "{text}");
        assert!(!text.contains("nv_gpu"));
        let m = SystemMetrics::probe(false, false);
        assert!(render_prometheus(&m.families()).is_empty());
    }
}
