//! Periodic background work that stops with the server.

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;

/// Runs `work` every `interval` (the first run one interval from now; a slow run delays the
/// next instead of bunching them) until `stop` becomes true.
pub async fn every<F, Fut>(interval: Duration, mut stop: watch::Receiver<bool>, mut work: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        work().await;
    }
}
