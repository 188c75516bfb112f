//! One level's measurement: warm up, then windows until stable or out of trials.
//!
//! ```text
//! load running (closed or open loop) ──► Recorder
//! measure(): sleep warm-up, discard ─► [sleep interval, take window, CPU delta]×
//!            stop when stats::is_stable(last 3) or max trials ─► merge last 3 ─► LevelOutcome
//! ```
//! The loops own the load; this module only watches the clock and the recorder.

use std::time::{Duration, Instant};

use crate::cpu::process_cpu_time;
use crate::progress::Progress;
use crate::stats::{Recorder, STABLE_WINDOWS, Summary, Window, is_stable};

/// How each level is measured (from the run flags).
#[derive(Clone, Debug)]
pub struct LevelSettings {
    pub warmup: Duration,
    pub interval: Duration,
    pub stability_percentage: f64,
    pub max_trials: u32,
    pub batch_size: u32,
    pub request_timeout: Duration,
}

/// A measured level: the merged last windows, whether they were stable, and how many windows
/// it took.
#[derive(Clone, Debug)]
pub struct LevelOutcome {
    pub summary: Summary,
    pub stable: bool,
    pub windows: u32,
}

/// Measures the load that is already running into `recorder`.
pub async fn measure(
    recorder: &Recorder,
    settings: &LevelSettings,
    progress: &Progress,
    label: &str,
) -> LevelOutcome {
    progress.set(format!("{label}: warming up"));
    tokio::time::sleep(settings.warmup).await;
    recorder.take();
    let mut windows: Vec<Window> = Vec::new();
    let mut summaries: Vec<Summary> = Vec::new();
    let mut stable = false;
    let mut start = Instant::now();
    let mut cpu_start = process_cpu_time();
    for trial in 1..=settings.max_trials {
        tokio::time::sleep(settings.interval).await;
        let mut window = recorder.take();
        let end = Instant::now();
        let cpu_end = process_cpu_time();
        window.elapsed = end - start;
        window.cpu = cpu_start.zip(cpu_end).map(|(a, b)| b.saturating_sub(a));
        (start, cpu_start) = (end, cpu_end);
        let s = window.summary(settings.batch_size);
        progress.set(format!(
            "{label}: window {trial}/{}: {:.1} infer/s, p99 {} us, {} errors",
            settings.max_trials, s.throughput, s.p99_us, s.errors
        ));
        summaries.push(s);
        windows.push(window);
        if is_stable(&summaries, settings.stability_percentage) {
            stable = true;
            break;
        }
    }
    let last = &windows[windows.len().saturating_sub(STABLE_WINDOWS)..];
    LevelOutcome {
        summary: Window::merge(last).summary(settings.batch_size),
        stable,
        windows: windows.len() as u32,
    }
}
