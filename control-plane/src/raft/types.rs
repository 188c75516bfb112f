//! The openraft type configuration: what the replicated log carries and how nodes are named.
//!
//! Log entries carry [`Command`]s (as [`LogCommand`]); applying one answers what [`ClusterState::apply`] answered
//! (blank and membership entries answer the unchanged revision). Nodes are `u64` ids whose
//! [`BasicNode::addr`] is the node's advertised gRPC address. Nothing here leaves the `raft`
//! module.
//!
//! [`ClusterState::apply`]: crate::state::ClusterState::apply

use std::fmt;
use std::io::Cursor;

use openraft::BasicNode;
use serde::{Deserialize, Serialize};

use crate::state::{Applied, Command, StateError};

/// A log entry's command. openraft wants its payload printable; the wire form is the bare
/// [`Command`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub(crate) struct LogCommand(pub(crate) Command);

impl fmt::Display for LogCommand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

/// What applying one log entry answers.
pub(crate) type ApplyResult = Result<Applied, StateError>;

openraft::declare_raft_types!(
    /// Nereid's control-plane Raft types.
    pub(crate) TypeConfig:
        D = LogCommand,
        R = ApplyResult,
        NodeId = u64,
        Node = BasicNode,
        AsyncRuntime = openraft::TokioRuntime,
);

/// Snapshots travel and are kept whole, as the serialized `ClusterState`.
pub(crate) type SnapshotData = Cursor<Vec<u8>>;

pub(crate) type LogId = openraft::type_config::alias::LogIdOf<TypeConfig>;
pub(crate) type Vote = openraft::type_config::alias::VoteOf<TypeConfig>;
pub(crate) type Entry = openraft::type_config::alias::EntryOf<TypeConfig>;
pub(crate) type StoredMembership = openraft::type_config::alias::StoredMembershipOf<TypeConfig>;
pub(crate) type SnapshotMeta = openraft::type_config::alias::SnapshotMetaOf<TypeConfig>;
pub(crate) type Snapshot = openraft::type_config::alias::SnapshotOf<TypeConfig, SnapshotData>;
pub(crate) type Raft = openraft::Raft<TypeConfig, super::state_machine::StateMachineStore>;
