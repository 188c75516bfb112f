//! Open loop: requests leave on a schedule (constant or Poisson gaps) whether or not earlier
//! ones have completed, so an overloaded server shows a growing latency instead of a lower
//! send rate.
//!
//! ```text
//! schedule_task: due += Schedule::next_gap(); sleep_until(due)
//!    ├─ a permit of --max-outstanding free? ─► spawn request task (records, frees permit)
//!    └─ none free ─► count as skipped (the client or server cannot keep up)
//! measure() watches the Recorder; then stop is raised and in-flight requests drain before the
//! level's totals are read.
//! ```
//! When the schedule falls behind (timer granularity, a busy client) it catches up by sending
//! the due requests at once; the reported send rate shows what was actually achieved.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::cli::Distribution;
use crate::client::{Client, Prepared};
use crate::closed_loop::{drain, timed_infer};
use crate::measure::{LevelOutcome, LevelSettings, measure};
use crate::progress::Progress;
use crate::rng::SplitMix64;
use crate::stats::Recorder;

/// Gaps between request send times.
#[derive(Clone, Debug)]
pub struct Schedule {
    mean_gap_secs: f64,
    distribution: Distribution,
    rng: SplitMix64,
}

impl Schedule {
    /// `rate` requests per second (positive).
    pub fn new(rate: f64, distribution: Distribution, seed: u64) -> Schedule {
        Schedule {
            mean_gap_secs: 1.0 / rate,
            distribution,
            rng: SplitMix64::new(seed),
        }
    }

    pub fn next_gap(&mut self) -> Duration {
        let secs = match self.distribution {
            Distribution::Constant => self.mean_gap_secs,
            // Inverse transform of the exponential distribution; 1 - u lies in (0, 1].
            Distribution::Poisson => -(1.0 - self.rng.next_f64()).ln() * self.mean_gap_secs,
        };
        Duration::from_secs_f64(secs)
    }
}

/// What the open loop needs besides the level settings.
#[derive(Clone, Debug)]
pub struct OpenLoopSettings {
    pub distribution: Distribution,
    pub seed: u64,
    pub max_outstanding: usize,
}

/// Runs and measures one request-rate level.
pub async fn run_level(
    client: Arc<dyn Client>,
    requests: Arc<Vec<Prepared>>,
    rate: f64,
    open: &OpenLoopSettings,
    settings: &LevelSettings,
    progress: &Progress,
) -> LevelOutcome {
    let recorder = Arc::new(Recorder::default());
    let (stop_tx, stop_rx) = watch::channel(false);
    let scheduler = tokio::spawn(schedule_task(
        client,
        requests,
        recorder.clone(),
        Schedule::new(rate, open.distribution, open.seed),
        open.max_outstanding,
        settings.request_timeout,
        stop_rx,
    ));
    let measurement = measure(
        &recorder,
        settings,
        progress,
        &format!("request rate {rate}/s"),
    )
    .await;
    let _ = stop_tx.send(true);
    progress.set(format!(
        "request rate {rate}/s: waiting for the requests in flight"
    ));
    if let Ok(mut in_flight) = scheduler.await {
        drain(&mut in_flight, settings.request_timeout).await;
    }
    LevelOutcome {
        measurement,
        totals: recorder.totals(),
    }
}

async fn schedule_task(
    client: Arc<dyn Client>,
    requests: Arc<Vec<Prepared>>,
    recorder: Arc<Recorder>,
    mut schedule: Schedule,
    max_outstanding: usize,
    timeout: Duration,
    mut stop: watch::Receiver<bool>,
) -> JoinSet<()> {
    let permits = Arc::new(Semaphore::new(max_outstanding));
    let mut in_flight = JoinSet::new();
    let mut due = Instant::now();
    let mut next = 0usize;
    loop {
        due += schedule.next_gap();
        tokio::select! {
            _ = tokio::time::sleep_until(due) => {}
            _ = stop.changed() => break,
        }
        if *stop.borrow() {
            break;
        }
        // Reap finished tasks so the set stays as small as the outstanding requests.
        while in_flight.try_join_next().is_some() {}
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            recorder.skipped();
            continue;
        };
        recorder.sent();
        let (client, requests, recorder) = (client.clone(), requests.clone(), recorder.clone());
        let index = next % requests.len();
        next = next.wrapping_add(1);
        in_flight.spawn(async move {
            timed_infer(client.as_ref(), &requests[index], timeout, &recorder).await;
            drop(permit);
        });
    }
    in_flight
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_gaps_are_exact() {
        let mut s = Schedule::new(250.0, Distribution::Constant, 0);
        assert_eq!(s.next_gap(), Duration::from_millis(4));
        assert_eq!(s.next_gap(), Duration::from_millis(4));
    }

    #[test]
    fn poisson_gaps_have_the_right_mean_and_spread() {
        let mut s = Schedule::new(1000.0, Distribution::Poisson, 42);
        let n = 200_000;
        let gaps: Vec<f64> = (0..n).map(|_| s.next_gap().as_secs_f64()).collect();
        let mean = gaps.iter().sum::<f64>() / n as f64;
        assert!((mean - 0.001).abs() < 0.001 * 0.02, "mean gap {mean}");
        // Exponential: standard deviation equals the mean, unlike a constant schedule.
        let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / n as f64;
        assert!(
            (var.sqrt() - 0.001).abs() < 0.001 * 0.05,
            "std dev {}",
            var.sqrt()
        );
        assert!(gaps.iter().all(|g| *g >= 0.0 && g.is_finite()));
    }
}
