//! The one interface the rest of the control plane uses to reach the replicated log.
//!
//! ```text
//!  management API / cluster service / leader loop
//!        │ write(Command)            │ local_state() / subscribe()     │ status(), leadership()
//!        ▼                           ▼                                  ▼
//!  ┌─────────────── Consensus (implemented by raft::RaftNode and etcd::EtcdStore) ────────────┐
//!  │ leader: append, replicate to a quorum, fsync, apply      follower: forward to the leader │
//!  └─────────────────────────────────────────────────────────────────────────────────────────┘
//! ```
//!
//! No openraft type crosses this boundary: commands and state are [`crate::state`]'s, errors are
//! [`ConsensusError`]. Unit tests of the layers above use an in-memory implementation;
//! `conformance_tests` runs one behaviour suite against both stores (Raft and etcd); it is a
//! test file (named `_tests`) so that this module, which the stores implement, imports neither.

#[cfg(test)]
mod conformance_tests;
#[cfg(test)]
pub mod memory;

use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::watch;

use crate::state::{Applied, ClusterState, Command, StateError};

/// A control-plane node as the membership lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub id: u64,
    /// The node's gRPC address (Raft, management and cluster services).
    pub address: String,
    /// False for a learner that is still catching up.
    pub voter: bool,
}

/// What this node knows of the cluster right now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RaftStatus {
    pub node_id: u64,
    pub leader_id: Option<u64>,
    pub leader_address: Option<String>,
    pub term: u64,
    /// Index of the last log entry known committed; 0 before the first.
    pub commit_index: u64,
    /// Index of the last log entry applied to this node's state.
    pub applied_index: u64,
    /// Index of the last entry in this node's log (committed or not); 0 when empty.
    pub last_log_index: u64,
    pub members: Vec<Member>,
}

impl RaftStatus {
    pub fn is_leader(&self) -> bool {
        self.leader_id == Some(self.node_id)
    }
}

/// Why a consensus operation did not happen. Each transport maps it once.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConsensusError {
    /// The operation must run on the leader and this node cannot forward it. The caller may
    /// retry at `leader_address`.
    #[error("this node is not the leader{}", leader_hint(.leader_id, .leader_address))]
    NotLeader {
        leader_id: Option<u64>,
        leader_address: Option<String>,
    },
    /// No leader is known (election in progress, or no quorum). Retry later.
    #[error("no control-plane leader is available: {0}")]
    NoLeader(String),
    /// The command was committed but the state machine refused it; nothing changed.
    #[error(transparent)]
    Rejected(#[from] StateError),
    /// A membership change that cannot be made (unknown member, removing the last voter...).
    #[error("invalid membership change: {0}")]
    InvalidMembership(String),
    /// The node is shutting down, the leader could not be reached, or the disk failed.
    #[error("control plane unavailable: {0}")]
    Unavailable(String),
}

fn leader_hint(id: &Option<u64>, address: &Option<String>) -> String {
    match (id, address) {
        (Some(id), Some(addr)) => format!("; the leader is node {id} at {addr}"),
        (Some(id), None) => format!("; the leader is node {id}"),
        _ => "; no leader is known".to_string(),
    }
}

/// Leadership as a watch value; changes whenever the known leader or the term changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Leadership {
    pub leader_id: Option<u64>,
    pub term: u64,
    /// This node is the leader of `term`.
    pub is_self: bool,
}

/// The replicated log and state machine behind the control plane.
#[async_trait]
pub trait Consensus: Send + Sync + 'static {
    /// Commits `cmd` (through the leader: a follower forwards it) and returns what applying it
    /// did once it is durable on a quorum and applied on the node that answers. A refused
    /// command comes back as `Rejected` and changed nothing.
    async fn write(&self, cmd: Command) -> Result<Applied, ConsensusError>;

    /// This node's applied state; may lag the leader.
    fn local_state(&self) -> Arc<ClusterState>;

    /// Follows the applied state: a new value after each applied batch or installed snapshot.
    fn subscribe(&self) -> watch::Receiver<Arc<ClusterState>>;

    /// State that reflects every write committed before the call: the leader confirms its
    /// leadership with a quorum; a follower asks the leader for a read index and waits until it
    /// has applied up to it.
    async fn linearizable_state(&self) -> Result<Arc<ClusterState>, ConsensusError>;

    fn status(&self) -> RaftStatus;

    fn leadership(&self) -> watch::Receiver<Leadership>;

    /// Adds a control-plane node: as a learner, then (once it caught up) as a voter.
    /// Runs on the leader; `NotLeader` elsewhere.
    async fn add_member(&self, id: u64, address: String) -> Result<(), ConsensusError>;

    /// Removes a control-plane node from the voters and the learners. Runs on the leader.
    async fn remove_member(&self, id: u64) -> Result<(), ConsensusError>;
}
