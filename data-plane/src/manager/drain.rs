//! Unloading without dropping work: the requests a version accepted are answered before it
//! goes, and those that arrive meanwhile are refused retryably.
//!
//! ```text
//! unload ─► versions out of the map: new requests get UNAVAILABLE ("... is unloading")
//!        ─► wait until no request of theirs is in flight (queued or running), at most the
//!           drain timeout
//!        └─► out of time: queued requests answered UNAVAILABLE, naming the model and why;
//!            running ones finish on their instance (a backend execution is never cut short)
//!        ─► unloaded: new requests get "Request for unknown model", as in Triton
//! ```
//!
//! Requests hold their version (`Arc<LoadedVersion>`), so its scheduler and instances live on
//! until the last one is answered whatever the drain does; the drain decides when the unload
//! is done (and reported to the control plane) and bounds how long queued work may still wait.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::request::{LoadedVersion, Runner};

/// How long an unload waits for the requests its versions accepted.
pub(super) const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// How often the drain looks at the versions' in-flight counts.
const POLL: Duration = Duration::from_millis(5);

/// Why a request the unload is about to refuse cannot wait: what UNAVAILABLE says.
pub(super) fn unloading(name: &str, version: i64) -> String {
    format!("model '{name}' version {version} is unloading")
}

/// Waits until no request of `versions` (of model `name`) is in flight, at most `timeout`;
/// then answers the requests still queued UNAVAILABLE. Returns how many were refused.
pub(super) async fn drain(name: &str, versions: &[Arc<LoadedVersion>], timeout: Duration) -> usize {
    let started = Instant::now();
    let busy = || versions.iter().any(|v| v.stats.in_flight() > 0);
    while busy() {
        if started.elapsed() >= timeout {
            return refuse_queued(name, versions, timeout);
        }
        tokio::time::sleep(POLL).await;
    }
    0
}

/// The drain ran out of time: the queued requests are refused; the running ones finish.
fn refuse_queued(name: &str, versions: &[Arc<LoadedVersion>], timeout: Duration) -> usize {
    let mut refused = 0;
    for v in versions {
        let (Runner::Batched(scheduler) | Runner::Decoupled(scheduler)) = &v.runner else {
            // An ensemble queues nothing of its own: its steps queue on the composing models.
            continue;
        };
        let reason = format!(
            "{}: its queued requests did not start within the {} ms unload drain",
            unloading(name, v.version),
            timeout.as_millis()
        );
        let n = scheduler.refuse_queued(&reason);
        refused += n;
        tracing::warn!(
            model = %name,
            version = v.version,
            refused = n,
            drain_ms = timeout.as_millis() as u64,
            "unload drain timed out: queued requests refused UNAVAILABLE, running ones finish"
        );
    }
    refused
}
