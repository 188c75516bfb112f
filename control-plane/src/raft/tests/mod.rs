//! Tests of the Raft layer with real redb files and real tonic servers on 127.0.0.1.
//!
//! - `suite`: openraft's storage conformance suite against the redb store.
//! - `cluster`: in-process clusters: bootstrap, forwarding, fail-over, restarts, snapshots,
//!   linearizable reads on followers, membership changes.
//!
//! Nothing sleeps: every wait is on a watch channel or openraft's metrics, bounded by
//! [`WAIT`].

mod cluster;
mod harness;
mod suite;

use std::time::Duration;

/// Upper bound on any single wait (elections, replication, catch-up).
pub(super) const WAIT: Duration = Duration::from_secs(15);
