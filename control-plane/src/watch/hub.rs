//! [`WatchHub`]: follows the applied state, keeps the last N deltas, and serves each watcher a
//! stream that starts where the watcher left off.
//!
//! ```text
//!  task: subscribe() ─► new state ─► lock { delta = diff(current, new); ring.push(delta);
//!                                          current = new; broadcast(delta) }
//!  stream(from): lock { receiver = subscribe(broadcast); backlog from (current, ring) }
//!                └► backlog, then live deltas (skipping those already covered)
//! ```
//!
//! The ring, the current state and the broadcast change together under one lock, so a new
//! watcher's backlog and its live receiver meet exactly: nothing missed, nothing out of order.
//! One ring entry spans the revisions between two states the hub saw (the state watch may
//! coalesce several commits into one change); resuming from inside an entry replays it whole,
//! which is harmless because deltas are idempotent. A watcher whose channel overruns (it reads
//! slower than the cluster changes) gets a fresh snapshot instead of holding the hub back.

use std::collections::VecDeque;
use std::sync::Arc;

use futures::Stream;
use nereid_proto::pb::cluster as pb;
use parking_lot::Mutex;
use tokio::sync::broadcast;
use tokio::sync::broadcast::error::RecvError;
use tokio::task::JoinHandle;

use super::diff::diff;
use crate::consensus::Consensus;
use crate::convert::snapshot_to_pb;
use crate::state::ClusterState;

/// Deltas the hub keeps for watchers that resume.
pub const DEFAULT_RING: usize = 1024;
/// Live events a watcher may fall behind before it is resynchronized with a snapshot.
pub const DEFAULT_CHANNEL: usize = 256;

/// The change from revision `from` to revision `to`.
struct Entry {
    from: u64,
    to: u64,
    delta: pb::StateDelta,
}

/// What the hub broadcasts to live watchers.
#[derive(Clone)]
enum Live {
    Delta(Arc<Entry>),
    /// The state was replaced by one of another history (same or lower revision, other
    /// content): every watcher starts over from a snapshot.
    Reset,
}

struct Inner {
    current: Arc<ClusterState>,
    /// Contiguous: each entry's `from` is the previous entry's `to`; the last ends at
    /// `current`'s revision.
    ring: VecDeque<Arc<Entry>>,
    /// `None` once the hub stopped; watchers' streams then end.
    live: Option<broadcast::Sender<Live>>,
}

struct Shared {
    ring_capacity: usize,
    inner: Mutex<Inner>,
}

/// Stops the follower task when the last [`WatchHub`] handle is dropped.
struct Task {
    handle: JoinHandle<()>,
    shared: Arc<Shared>,
}

impl Drop for Task {
    fn drop(&mut self) {
        self.handle.abort();
        self.shared.inner.lock().live = None;
    }
}

/// Serves revisioned watch streams of one node's applied state. Cheap to clone; the follower
/// task stops when the last clone is dropped (and open streams then end).
#[derive(Clone)]
pub struct WatchHub {
    shared: Arc<Shared>,
    _task: Arc<Task>,
}

impl WatchHub {
    /// Follows `consensus` with the default ring ([`DEFAULT_RING`]) and per-watcher channel
    /// ([`DEFAULT_CHANNEL`]). Must be called inside a tokio runtime.
    pub fn spawn(consensus: &dyn Consensus) -> Self {
        Self::with_capacity(consensus, DEFAULT_RING, DEFAULT_CHANNEL)
    }

    /// Keeps the last `ring` deltas and lets a watcher fall `channel` events behind.
    pub fn with_capacity(consensus: &dyn Consensus, ring: usize, channel: usize) -> Self {
        let mut states = consensus.subscribe();
        let current = states.borrow_and_update().clone();
        let (live, _) = broadcast::channel(channel.max(1));
        let shared = Arc::new(Shared {
            ring_capacity: ring.max(1),
            inner: Mutex::new(Inner {
                current,
                ring: VecDeque::new(),
                live: Some(live),
            }),
        });
        let follower = shared.clone();
        let handle = tokio::spawn(async move {
            while states.changed().await.is_ok() {
                let new = states.borrow_and_update().clone();
                follower.advance(new);
            }
            tracing::debug!("state watch closed; watch hub stops");
            follower.inner.lock().live = None;
        });
        WatchHub {
            _task: Arc::new(Task {
                handle,
                shared: shared.clone(),
            }),
            shared,
        }
    }

    /// The revision of the latest state the hub has seen.
    #[cfg(test)]
    pub fn revision(&self) -> u64 {
        self.shared.current().revision()
    }

    /// Events for a watcher that has applied everything up to `from_revision` (0: nothing).
    ///
    /// From 0, from a revision older than the ring, or from one this node never reached (a
    /// different history), the first event is a snapshot of the current state; otherwise the
    /// retained deltas after `from_revision`. Live deltas follow. The stream ends when dropped,
    /// or with `UNAVAILABLE` when the hub stops.
    pub fn stream(
        &self,
        from_revision: u64,
    ) -> impl Stream<Item = Result<pb::WatchEvent, tonic::Status>> + Send + 'static {
        let follow = self.shared.clone().follow(from_revision);
        futures::stream::unfold(follow, Follow::next)
    }
}

impl Shared {
    fn current(&self) -> Arc<ClusterState> {
        self.inner.lock().current.clone()
    }

    /// Records a newly applied state and tells the live watchers.
    fn advance(&self, new: Arc<ClusterState>) {
        let mut inner = self.inner.lock();
        let old = inner.current.clone();
        if Arc::ptr_eq(&old, &new) {
            return;
        }
        if new.revision() > old.revision() {
            let entry = Arc::new(Entry {
                from: old.revision(),
                to: new.revision(),
                delta: diff(&old, &new),
            });
            inner.ring.push_back(entry.clone());
            while inner.ring.len() > self.ring_capacity {
                inner.ring.pop_front();
            }
            inner.current = new;
            if let Some(live) = &inner.live {
                // No receivers is fine: nobody is watching.
                let _ = live.send(Live::Delta(entry));
            }
        } else if *new != *old {
            tracing::info!(
                from = old.revision(),
                to = new.revision(),
                "applied state replaced by another history; watchers resynchronize"
            );
            inner.ring.clear();
            inner.current = new;
            if let Some(live) = &inner.live {
                let _ = live.send(Live::Reset);
            }
        } else {
            inner.current = new;
        }
    }

    /// A watcher's starting point: its live receiver and backlog, taken together.
    fn follow(self: Arc<Self>, from: u64) -> Follow {
        let (receiver, current, backlog) = {
            let inner = self.inner.lock();
            let receiver = inner.live.as_ref().map(|l| l.subscribe());
            let revision = inner.current.revision();
            let oldest = inner.ring.front().map_or(revision, |e| e.from);
            let backlog: Option<Vec<pb::WatchEvent>> =
                if from == 0 || from > revision || from < oldest {
                    None
                } else {
                    Some(
                        inner
                            .ring
                            .iter()
                            .filter(|e| e.to > from)
                            .map(|e| delta_event(e))
                            .collect(),
                    )
                };
            (receiver, inner.current.clone(), backlog)
        };
        let queue = match backlog {
            Some(deltas) => deltas.into(),
            None => VecDeque::from([snapshot_event(&current)]),
        };
        Follow {
            shared: self,
            receiver,
            queue,
            last: current.revision(),
        }
    }
}

/// One watcher's position.
struct Follow {
    shared: Arc<Shared>,
    /// `None` once the hub stopped (the stream ends after its backlog and an error).
    receiver: Option<broadcast::Receiver<Live>>,
    queue: VecDeque<pb::WatchEvent>,
    /// The revision the events sent so far bring the watcher to.
    last: u64,
}

impl Follow {
    async fn next(mut self) -> Option<(Result<pb::WatchEvent, tonic::Status>, Follow)> {
        loop {
            if let Some(event) = self.queue.pop_front() {
                return Some((Ok(event), self));
            }
            let receiver = self.receiver.as_mut()?;
            match receiver.recv().await {
                Ok(Live::Delta(entry)) => {
                    if entry.to <= self.last {
                        continue; // already covered by the backlog or a snapshot
                    }
                    self.last = entry.to;
                    return Some((Ok(delta_event(&entry)), self));
                }
                Ok(Live::Reset) | Err(RecvError::Lagged(_)) => {
                    let current = self.shared.current();
                    self.last = current.revision();
                    return Some((Ok(snapshot_event(&current)), self));
                }
                Err(RecvError::Closed) => {
                    self.receiver = None;
                    let status = tonic::Status::unavailable(
                        "the watch hub stopped (control plane shutting down); reconnect with \
                         from_revision set to the last revision applied",
                    );
                    return Some((Err(status), self));
                }
            }
        }
    }
}

fn delta_event(entry: &Entry) -> pb::WatchEvent {
    pb::WatchEvent {
        revision: entry.to,
        event: Some(pb::watch_event::Event::Delta(entry.delta.clone())),
    }
}

fn snapshot_event(state: &ClusterState) -> pb::WatchEvent {
    pb::WatchEvent {
        revision: state.revision(),
        event: Some(pb::watch_event::Event::Snapshot(snapshot_to_pb(state))),
    }
}
