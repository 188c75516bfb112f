//! Revisioned watch streams: what workers and routers follow to learn the cluster's state
//! without polling (the Cluster service's `Watch` RPC).
//!
//! ```text
//!  consensus.subscribe() ──► WatchHub task ──diff(prev, new)──► ring of the last N deltas
//!                                                │                 (revision boundaries)
//!                                                └─► broadcast ──► one stream per watcher:
//!    from_revision 0 / too old / unknown ─► snapshot, then live deltas
//!    from_revision within the ring       ─► the retained deltas after it, then live deltas
//!    watcher too slow (channel overrun)  ─► a fresh snapshot, then live deltas
//! ```
//!
//! Deltas carry whole entities for upserts and keys for deletes, so a client that applies a
//! delta it already had (a resume from inside a batch) ends up in the same state.

pub mod diff;
pub mod hub;

#[cfg(test)]
mod tests;

pub use hub::WatchHub;
