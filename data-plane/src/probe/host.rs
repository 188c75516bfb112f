//! What the node measures about its host, from `/proc` (Linux): memory, CPU time, the
//! process's resident memory, the host name. Parsers are pure; readers return `None` where the
//! file is missing (other systems), and callers then report 0.
//!
//! GPUs are read through NVML instead ([`super::gpu`]).

/// `MemTotal` and `MemAvailable` of `/proc/meminfo`, in bytes.
pub fn parse_meminfo(text: &str) -> (Option<u64>, Option<u64>) {
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
            .map(|kib| kib * 1024)
    };
    (field("MemTotal"), field("MemAvailable"))
}

/// `VmRSS` of `/proc/self/status`, in bytes.
pub fn parse_status_rss(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
        .map(|kib| kib * 1024)
}

/// CPU time from the `cpu` line of `/proc/stat`: (busy, total) in clock ticks.
pub fn parse_stat_cpu(text: &str) -> Option<(u64, u64)> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let ticks: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|t| t.parse().ok())
        .collect();
    if ticks.len() < 4 {
        return None;
    }
    // user nice system idle iowait irq softirq steal (guest time is already in user).
    let total: u64 = ticks.iter().take(8).sum();
    let idle = ticks[3] + ticks.get(4).copied().unwrap_or(0);
    Some((total - idle, total))
}

/// The busy share of the CPUs between two `/proc/stat` readings, 0.0 ..= 1.0.
pub fn cpu_between(before: (u64, u64), after: (u64, u64)) -> f64 {
    let busy = after.0.saturating_sub(before.0);
    let total = after.1.saturating_sub(before.1);
    if total == 0 {
        0.0
    } else {
        (busy as f64 / total as f64).clamp(0.0, 1.0)
    }
}

/// Memory of the host: (total, used) in bytes.
pub fn memory() -> (Option<u64>, Option<u64>) {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let (total, available) = parse_meminfo(&text);
    let used = total.zip(available).map(|(t, a)| t.saturating_sub(a));
    (total, used)
}

/// The process's resident memory in bytes.
pub fn process_rss() -> Option<u64> {
    parse_status_rss(&std::fs::read_to_string("/proc/self/status").ok()?)
}

/// CPU ticks now: (busy, total).
pub fn cpu_ticks() -> Option<(u64, u64)> {
    parse_stat_cpu(&std::fs::read_to_string("/proc/stat").ok()?)
}

/// Logical CPUs of the host.
pub fn cpu_count() -> u64 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as u64)
}

/// The host name (`localhost` when unknown).
pub fn hostname() -> String {
    ["/proc/sys/kernel/hostname", "/etc/hostname"]
        .iter()
        .find_map(|p| {
            let name = std::fs::read_to_string(p).ok()?;
            let name = name.trim();
            (!name.is_empty()).then(|| name.to_string())
        })
        .unwrap_or_else(|| "localhost".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_files() {
        let meminfo = "MemTotal:       16000 kB\nMemFree:  1 kB\nMemAvailable:    4000 kB\n";
        assert_eq!(
            parse_meminfo(meminfo),
            (Some(16000 * 1024), Some(4000 * 1024))
        );
        assert_eq!(parse_meminfo("x"), (None, None));
        assert_eq!(
            parse_status_rss("Name: x\nVmRSS:\t  2048 kB\n"),
            Some(2048 * 1024)
        );
        let stat = "cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3 4\n";
        assert_eq!(parse_stat_cpu(stat), Some((150, 1000)));
        assert_eq!(cpu_between((150, 1000), (250, 1200)), 0.5);
        assert_eq!(cpu_between((150, 1000), (150, 1000)), 0.0);
    }

    #[test]
    fn reads_this_host() {
        assert!(cpu_count() >= 1);
        assert!(!hostname().is_empty());
        if cfg!(target_os = "linux") {
            assert!(process_rss().unwrap() > 0);
            assert!(memory().0.unwrap() > 0);
            assert!(cpu_ticks().is_some());
        }
    }
}
