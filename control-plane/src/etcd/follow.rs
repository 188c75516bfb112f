//! Follows `<prefix>/state`: a quorum get, then a watch from the revision after it; each put
//! is decoded and published to subscribers. A closed or canceled watch (etcd restarted, the
//! revision compacted away) starts over with a fresh get, after a bounded backoff.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{EventType, WatchOptions};
use tokio::sync::watch;
use tracing::{debug, warn};

use super::{Shared, bounded, decode_state};

pub(super) async fn run(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let mut backoff = Duration::from_millis(100);
    loop {
        if *stop.borrow() {
            return;
        }
        let result = tokio::select! {
            r = follow_once(&shared) => r,
            _ = stop.changed() => return,
        };
        if let Err(e) = result {
            let e = shared.explain(e).await;
            warn!(endpoints = %shared.endpoints, "following the etcd state, retrying: {e}");
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = stop.changed() => return,
        }
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

/// One get-then-watch; returns only with the reason the watch ended.
async fn follow_once(shared: &Shared) -> Result<(), String> {
    let mut client = shared.client.clone();
    let response = bounded(client.get(shared.keys.state.as_str(), None)).await?;
    let revision = response.header().map(|h| h.revision()).unwrap_or(0);
    if let Some(kv) = response.kvs().first() {
        let state = decode_state(&shared.keys.state, kv.value()).map_err(|e| e.to_string())?;
        shared.publish(Arc::new(state));
    }
    let options = WatchOptions::new().with_start_revision(revision + 1);
    let mut stream = bounded(client.watch(shared.keys.state.as_str(), Some(options))).await?;
    debug!(revision, "watching the etcd state");
    loop {
        let Some(message) = stream
            .message()
            .await
            .map_err(|e| super::tls::describe(&e))?
        else {
            return Err("the watch stream closed".into());
        };
        if message.canceled() {
            return Err(format!(
                "the watch was canceled (compacted to revision {}): {}",
                message.compact_revision(),
                message.cancel_reason()
            ));
        }
        for event in message.events() {
            match (event.event_type(), event.kv()) {
                (EventType::Put, Some(kv)) => match decode_state(&shared.keys.state, kv.value()) {
                    Ok(state) => shared.publish(Arc::new(state)),
                    Err(e) => warn!("{e}"),
                },
                (EventType::Put, None) => {}
                (EventType::Delete, _) => {
                    warn!(key = %shared.keys.state, "the cluster state was deleted from etcd")
                }
            }
        }
    }
}
