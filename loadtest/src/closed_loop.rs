//! Closed loop: N workers, each with exactly one request outstanding.
//!
//! ```text
//! worker 0 ──infer──► wait ──record──► infer ──► ...   (requests taken round-robin
//! worker 1 ──infer──► wait ──record──► ...              from the prepared steps)
//!   ...
//! measure() watches the Recorder; then stop is raised, workers finish their current
//! request (bounded by the request timeout) and exit; the level's totals are read after that,
//! so those last requests are counted too.
//! ```
//! Throughput here is set by latency × concurrency, so a slow server sees less load, not a
//! growing queue (use the open loop for that).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::client::{Client, Prepared};
use crate::measure::{LevelOutcome, LevelSettings, measure};
use crate::progress::Progress;
use crate::stats::Recorder;

/// Runs and measures one concurrency level.
pub async fn run_level(
    client: Arc<dyn Client>,
    requests: Arc<Vec<Prepared>>,
    concurrency: u64,
    settings: &LevelSettings,
    progress: &Progress,
) -> LevelOutcome {
    let recorder = Arc::new(Recorder::default());
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut workers = JoinSet::new();
    for id in 0..concurrency {
        workers.spawn(worker_task(
            client.clone(),
            requests.clone(),
            recorder.clone(),
            stop_rx.clone(),
            id as usize,
            settings.request_timeout,
        ));
    }
    let measurement = measure(
        &recorder,
        settings,
        progress,
        &format!("concurrency {concurrency}"),
    )
    .await;
    let _ = stop_tx.send(true);
    progress.set(format!(
        "concurrency {concurrency}: waiting for the requests in flight"
    ));
    drain(&mut workers, settings.request_timeout).await;
    LevelOutcome {
        measurement,
        totals: recorder.totals(),
    }
}

/// Waits for tasks to finish their current request; aborts what is left after `timeout`.
pub async fn drain(tasks: &mut JoinSet<()>, timeout: Duration) {
    let all = async { while tasks.join_next().await.is_some() {} };
    if tokio::time::timeout(timeout + Duration::from_secs(1), all)
        .await
        .is_err()
    {
        tasks.abort_all();
    }
}

/// Sends one request with the timeout and records it (counted as started first, so a request
/// aborted mid-flight still shows in the level's totals).
pub async fn timed_infer(
    client: &dyn Client,
    request: &Prepared,
    timeout: Duration,
    recorder: &Recorder,
) {
    recorder.started();
    let start = Instant::now();
    let result = match tokio::time::timeout(timeout, client.infer(request)).await {
        Ok(r) => r,
        Err(_) => Err(format!(
            "request timed out after {:.1} s (--request-timeout-secs)",
            timeout.as_secs_f64()
        )),
    };
    recorder.record(start.elapsed(), &result);
}

async fn worker_task(
    client: Arc<dyn Client>,
    requests: Arc<Vec<Prepared>>,
    recorder: Arc<Recorder>,
    stop: watch::Receiver<bool>,
    id: usize,
    timeout: Duration,
) {
    let mut next = id;
    while !*stop.borrow() {
        let request = &requests[next % requests.len()];
        next = next.wrapping_add(1);
        timed_infer(client.as_ref(), request, timeout, &recorder).await;
    }
}
