//! What the node measures about its host, from `/proc` (Linux): memory, CPU time, another
//! process's anonymous memory (a Python stub's), the host name. Parsers are pure; readers
//! return `None` where the file is missing (other systems), and callers then report 0.
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

/// A `Name:  N kB` field of a `/proc` file, in bytes.
fn kib_field(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
        .map(|kib| kib * 1024)
}

/// The anonymous memory of a process, in bytes: `Pss_Anon` of `/proc/<pid>/smaps_rollup`
/// (Linux 5.8 and newer), else `RssAnon` of `/proc/<pid>/status`.
pub fn parse_anon_memory(smaps_rollup: &str, status: &str) -> Option<u64> {
    kib_field(smaps_rollup, "Pss_Anon").or_else(|| kib_field(status, "RssAnon"))
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

/// The memory another process (a Python stub) holds of its own, in bytes: its anonymous
/// pages (heap, arrays, the interpreter's objects; [`parse_anon_memory`]). Pages of files it
/// maps (the interpreter, libraries) are left out: they are shared with every other process
/// mapping them, so counting them (RSS), or a share of them (PSS), would make the same model
/// measure differently depending on how many other stubs run beside it. `None` when the
/// process is gone.
pub fn process_anon_memory(pid: u32) -> Option<u64> {
    let read =
        |file: &str| std::fs::read_to_string(format!("/proc/{pid}/{file}")).unwrap_or_default();
    parse_anon_memory(&read("smaps_rollup"), &read("status"))
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
        let rollup =
            "55d0-7ffd ---p 0 00:00 0 [rollup]\nRss:  900 kB\nPss:  300 kB\nPss_Anon: 100 kB\n";
        let status = "Name: python\nVmRSS:  900 kB\nRssAnon:\t  120 kB\n";
        assert_eq!(parse_anon_memory(rollup, status), Some(100 * 1024));
        let old_kernel = "55d0-7ffd ---p 0 00:00 0 [rollup]\nRss:  900 kB\nPss:  300 kB\n";
        assert_eq!(parse_anon_memory(old_kernel, status), Some(120 * 1024));
        assert_eq!(parse_anon_memory("", ""), None);
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
            assert!(process_anon_memory(std::process::id()).unwrap() > 0);
            assert_eq!(process_anon_memory(u32::MAX), None, "no such process");
            assert!(memory().0.unwrap() > 0);
            assert!(cpu_ticks().is_some());
        }
    }
}
