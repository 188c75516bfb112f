//! The replicated state machine: the cluster's state of record and the pure `apply` every
//! control-plane node runs on each committed log entry.
//!
//! ```text
//!  Command ─► ClusterState::apply ─► validate against (command, state)
//!                                      ├─ refused: Err(StateError), state untouched
//!                                      └─ accepted: mutate, revision += 1 if anything changed
//!                                                   └► Applied { revision, replica_id }
//! ```
//!
//! `apply` reads no clock, no randomness and no I/O, and the state holds only `BTreeMap`s,
//! so every Raft replica that applies the same log computes the same state, byte for byte
//! when serialized. The revision is global: watch streams resume from it and every change
//! bumps it by exactly one. Liveness and load are not here — the leader keeps them as soft
//! state and writes only transitions (`SetNodeStatus`, replica reports).
//!
//! Each resource's file holds its types, its validation and the commands that change it:
//! [`model`], [`node`], [`replica`], [`autoscale`]; [`command`] holds the log entry type.

pub mod autoscale;
pub mod command;
pub mod error;
pub mod model;
pub mod name;
pub mod node;
pub mod replica;

#[cfg(test)]
mod prop_tests;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use autoscale::{Autoscale, AutoscalePolicy};
pub use command::{Applied, Command};
pub use error::{EntityKind, StateError};
pub use model::{ModelSpec, Resources, VersionPolicy};
pub use node::{Gpu, Node, NodeAddresses, NodeCapacity, NodeSpec, NodeStatus};
pub use replica::{Replica, ReplicaState};

/// Models, nodes and replicas with one global revision. Fields are private so that every
/// change goes through [`ClusterState::apply`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterState {
    revision: u64,
    models: BTreeMap<String, ModelSpec>,
    nodes: BTreeMap<String, Node>,
    replicas: BTreeMap<u64, Replica>,
    next_replica_id: u64,
    /// Per model with an autoscale policy; absent in snapshots from before autoscaling.
    #[serde(default)]
    autoscale: BTreeMap<String, Autoscale>,
}

impl Default for ClusterState {
    fn default() -> Self {
        ClusterState {
            revision: 0,
            models: BTreeMap::new(),
            nodes: BTreeMap::new(),
            replicas: BTreeMap::new(),
            next_replica_id: 1,
            autoscale: BTreeMap::new(),
        }
    }
}

impl ClusterState {
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies one committed command. A refused command changes nothing, not even the
    /// revision: each handler validates fully before it mutates.
    pub fn apply(&mut self, cmd: Command) -> Result<Applied, StateError> {
        let mut replica_id = None;
        let changed = match cmd {
            Command::UpsertModel(spec) => self.upsert_model(spec)?,
            Command::DeleteModel { name } => self.delete_model(&name)?,
            Command::ScaleModel { name, min, max } => self.scale_model(&name, min, max)?,
            Command::SetTraffic { name, weights } => self.set_traffic(&name, weights)?,
            Command::RegisterNode(spec) => self.register_node(spec)?,
            Command::RemoveNode { id } => self.remove_node(&id)?,
            Command::SetNodeDrained { id, drained } => self.set_node_drained(&id, drained)?,
            Command::SetNodeStatus { id, status } => self.set_node_status(&id, status)?,
            Command::AddReplica {
                model,
                version,
                node,
                reason,
                gpus,
            } => {
                replica_id = Some(self.add_replica(&model, version, &node, reason, gpus)?);
                true
            }
            Command::SetReplicaState {
                id,
                state,
                measured_memory_bytes,
                measured_gpu_memory_bytes,
            } => {
                self.set_replica_state(id, state, measured_memory_bytes, measured_gpu_memory_bytes)?
            }
            Command::RemoveReplica { id } => self.remove_replica(id)?,
            Command::SetAutoscale {
                name,
                min,
                max,
                policy,
            } => self.set_autoscale(&name, min, max, policy)?,
            Command::SetAutoscaledReplicas {
                name,
                replicas,
                reason,
            } => self.set_autoscaled_replicas(&name, replicas, reason)?,
        };
        if changed {
            self.revision += 1;
        }
        Ok(Applied {
            revision: self.revision,
            changed,
            replica_id,
        })
    }

    /// The revision of the last change; 0 for an empty state.
    pub fn revision(&self) -> u64 {
        self.revision
    }

    pub fn models(&self) -> &BTreeMap<String, ModelSpec> {
        &self.models
    }

    pub fn model(&self, name: &str) -> Option<&ModelSpec> {
        self.models.get(name)
    }

    pub fn nodes(&self) -> &BTreeMap<String, Node> {
        &self.nodes
    }

    pub fn node(&self, id: &str) -> Option<&Node> {
        self.nodes.get(id)
    }

    pub fn replicas(&self) -> &BTreeMap<u64, Replica> {
        &self.replicas
    }

    pub fn replica(&self, id: u64) -> Option<&Replica> {
        self.replicas.get(&id)
    }

    /// Every replica of `model`, in id order, whatever its state.
    pub fn replicas_of<'a>(&'a self, model: &'a str) -> impl Iterator<Item = &'a Replica> + 'a {
        self.replicas.values().filter(move |r| r.model == model)
    }

    /// Every replica on `node`, in id order, whatever its state.
    pub fn replicas_on<'a>(&'a self, node: &'a str) -> impl Iterator<Item = &'a Replica> + 'a {
        self.replicas.values().filter(move |r| r.node == node)
    }

    /// The replicas of `model` the router may send requests to.
    #[cfg(test)]
    pub fn ready_replicas<'a>(&'a self, model: &'a str) -> impl Iterator<Item = &'a Replica> + 'a {
        self.replicas_of(model)
            .filter(|r| r.state == ReplicaState::Ready)
    }
}
