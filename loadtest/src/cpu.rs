//! Client CPU time from `/proc/self/stat` (user + system time of all threads of this process).
//!
//! Read at each window's start and end; the difference over the window's wall time is the
//! client's CPU use in percent of one core. A load generator near 100% × cores is measuring
//! itself, not the server. Off Linux the reading is `None` and reports say `n/a`.

use std::time::Duration;

/// Clock ticks per second of `/proc` times (`USER_HZ`), 100 on every Linux architecture
/// this tool targets.
const TICKS_PER_SEC: u64 = 100;

/// Current CPU time (user + system) of this process, if it can be read.
pub fn process_cpu_time() -> Option<Duration> {
    let text = std::fs::read_to_string("/proc/self/stat").ok()?;
    parse_stat(&text)
}

/// Parses `utime` and `stime` (fields 14 and 15) of a `/proc/<pid>/stat` line. The command
/// name (field 2) is in parentheses and may hold spaces, so fields are counted after the last
/// `)`.
pub fn parse_stat(text: &str) -> Option<Duration> {
    let after = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // `after` starts at field 3 (state), so field N is at index N - 3.
    let utime: u64 = fields.get(14 - 3)?.parse().ok()?;
    let stime: u64 = fields.get(15 - 3)?.parse().ok()?;
    let ticks = utime + stime;
    Some(Duration::from_millis(ticks * 1000 / TICKS_PER_SEC))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_utime_and_stime() {
        let line = "4242 (nereid loadtest) S 1 4242 4242 0 -1 4194560 1510 0 0 0 250 31 0 0 20 0 9 0 \
                    12345 1000000 500 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
        assert_eq!(parse_stat(line), Some(Duration::from_millis(2810)));
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat("1 (x) S 1 2"), None);
    }

    #[test]
    fn reads_this_process_on_linux() {
        if cfg!(target_os = "linux") {
            assert!(process_cpu_time().is_some());
        }
    }
}
