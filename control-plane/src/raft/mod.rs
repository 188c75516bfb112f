//! The replicated log behind the control plane: openraft over redb and tonic.
//!
//! ```text
//!             ┌──────────────────────────── RaftNode (Consensus) ───────────────────────────┐
//!  write ────►│ leader: client_write        follower: ForwardWrite ─► leader's RaftService │
//!  reads ────►│ watch<Arc<ClusterState>>   linearizable: ReadIndex ─► wait applied ≥ index │
//!             └──────┬──────────────────────────────┬──────────────────────────────────────┘
//!                    │ openraft::Raft               │ network: tonic RaftClient per peer
//!         ┌──────────┴──────────┐                   ▼
//!         │ store: raft.redb    │         peers' RaftService (AppendEntries, Vote,
//!         │  log_store (fsync)  │                             InstallSnapshot)
//!         │  state_machine      │
//!         └─────────────────────┘
//! ```
//!
//! openraft types stay inside this module: the rest of the crate sees [`RaftNode`] (through
//! [`crate::consensus::Consensus`]), [`RaftConfig`], [`RaftService`] and [`RaftError`].
//!
//! - `types`: the openraft type configuration.
//! - `store`, `log_store`, `state_machine`: durable storage in one redb file.
//! - `network`: outgoing RPCs; `service`: incoming RPCs.
//! - `node`: start, bootstrap, and the `Consensus` implementation.

mod config;
mod error;
mod log_store;
mod network;
mod node;
mod service;
mod state_machine;
mod store;
mod types;

#[cfg(test)]
mod tests;

pub use config::RaftConfig;
pub use node::RaftNode;
