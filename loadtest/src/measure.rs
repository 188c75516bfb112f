//! One level's measurement: warm up, then windows until stable, out of trials, or (with
//! `--duration-secs`) until the fixed duration is over.
//!
//! ```text
//! load running (closed or open loop) ──► Recorder (windows + the level's tally)
//! measure(): sleep warm-up, take (not reported) ─► [sleep window, take window, CPU delta]×
//!            WindowPlan: stop when stats::is_stable(last 3) or max trials ─► merge last 3
//!                        or a fixed number of equal windows           ─► merge all
//!            ─► Measurement
//! the loop: stop the load, drain in-flight requests ─► Recorder::totals ─► LevelOutcome
//! ```
//! The loops own the load; this module only watches the clock and the recorder. Requests of
//! the warm-up and the drain are in no window, but they are in the level's totals.

use std::time::{Duration, Instant};

use crate::cpu::process_cpu_time;
use crate::progress::Progress;
use crate::stats::{Recorder, STABLE_WINDOWS, Summary, Totals, Window, is_stable};

/// How each level is measured (from the run flags).
#[derive(Clone, Debug)]
pub struct LevelSettings {
    pub warmup: Duration,
    pub interval: Duration,
    pub stability_percentage: f64,
    pub max_trials: u32,
    /// `--duration-secs`: measure exactly this long instead of until stable.
    pub duration: Option<Duration>,
    pub batch_size: u32,
    pub request_timeout: Duration,
}

/// The windows a level is measured in.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WindowPlan {
    pub length: Duration,
    /// Most windows.
    pub count: u32,
    /// Stop at the first stable point and report the last 3 windows; otherwise run every
    /// window and report them all.
    pub until_stable: bool,
}

impl WindowPlan {
    /// Until stable: `max_trials` windows of `interval`. Fixed duration: the duration cut into
    /// equal windows of at most `interval` (equal, so the stability check stays meaningful).
    pub fn new(settings: &LevelSettings) -> WindowPlan {
        match settings.duration {
            None => WindowPlan {
                length: settings.interval,
                count: settings.max_trials,
                until_stable: true,
            },
            Some(total) => {
                let interval = settings.interval.as_nanos().max(1);
                let count = total.as_nanos().div_ceil(interval).max(1);
                let count = u32::try_from(count).unwrap_or(u32::MAX);
                WindowPlan {
                    length: total / count,
                    count,
                    until_stable: false,
                }
            }
        }
    }
}

/// The reported figures of a level's windows.
#[derive(Clone, Debug)]
pub struct Measurement {
    pub summary: Summary,
    pub stable: bool,
    pub windows: u32,
}

/// A measured level: its windows' figures and every request it sent.
#[derive(Clone, Debug)]
pub struct LevelOutcome {
    pub measurement: Measurement,
    pub totals: Totals,
}

/// Measures the load that is already running into `recorder`.
pub async fn measure(
    recorder: &Recorder,
    settings: &LevelSettings,
    progress: &Progress,
    label: &str,
) -> Measurement {
    progress.set(format!("{label}: warming up"));
    tokio::time::sleep(settings.warmup).await;
    recorder.take();
    let plan = WindowPlan::new(settings);
    let mut windows: Vec<Window> = Vec::new();
    let mut summaries: Vec<Summary> = Vec::new();
    let mut stable = false;
    let mut start = Instant::now();
    let mut cpu_start = process_cpu_time();
    for trial in 1..=plan.count {
        tokio::time::sleep(plan.length).await;
        let mut window = recorder.take();
        let end = Instant::now();
        let cpu_end = process_cpu_time();
        window.elapsed = end - start;
        window.cpu = cpu_start.zip(cpu_end).map(|(a, b)| b.saturating_sub(a));
        (start, cpu_start) = (end, cpu_end);
        let s = window.summary(settings.batch_size);
        progress.set(format!(
            "{label}: window {trial}/{}: {:.1} infer/s, p99 {} us, {} errors",
            plan.count, s.throughput, s.p99_us, s.errors
        ));
        summaries.push(s);
        windows.push(window);
        stable = is_stable(&summaries, settings.stability_percentage);
        if stable && plan.until_stable {
            break;
        }
    }
    let reported = if plan.until_stable {
        &windows[windows.len().saturating_sub(STABLE_WINDOWS)..]
    } else {
        &windows[..]
    };
    Measurement {
        summary: Window::merge(reported).summary(settings.batch_size),
        stable,
        windows: windows.len() as u32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(duration: Option<Duration>) -> LevelSettings {
        LevelSettings {
            warmup: Duration::ZERO,
            interval: Duration::from_millis(1000),
            stability_percentage: 10.0,
            max_trials: 7,
            duration,
            batch_size: 1,
            request_timeout: Duration::from_secs(1),
        }
    }

    #[test]
    fn until_stable_uses_the_interval_and_max_trials() {
        let plan = WindowPlan::new(&settings(None));
        assert_eq!(
            plan,
            WindowPlan {
                length: Duration::from_secs(1),
                count: 7,
                until_stable: true
            }
        );
    }

    #[test]
    fn fixed_duration_is_cut_into_equal_windows() {
        let plan = |ms| WindowPlan::new(&settings(Some(Duration::from_millis(ms))));
        assert_eq!(
            (plan(2500).count, plan(2500).length),
            (3, Duration::from_nanos(833_333_333))
        );
        assert_eq!(
            (plan(3000).count, plan(3000).length),
            (3, Duration::from_secs(1))
        );
        assert_eq!(
            (plan(300).count, plan(300).length),
            (1, Duration::from_millis(300))
        );
        assert!(!plan(300).until_stable);
        // The windows add up to the duration, within a nanosecond per window.
        let p = plan(2500);
        let total = p.length * p.count;
        assert!(Duration::from_millis(2500) - total < Duration::from_nanos(u64::from(p.count)));
    }
}
