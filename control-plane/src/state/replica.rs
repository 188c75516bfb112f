//! Replicas: one model version placed on one node, and its life as workers report it.
//!
//! ```text
//!  AddReplica ─► Pending ─► Loading ─► Ready
//!                   │          │  │      │
//!                   │          │  └──────┴──► Unloading ─► RemoveReplica
//!                   └──────────┴─► Failed ───────┘
//! ```
//!
//! Any live state (`Pending`, `Loading`, `Ready`) may fail; `Loading`, `Ready` and `Failed`
//! may start unloading. `Unloading` is terminal: the replica only leaves the state through
//! `RemoveReplica` once the worker has unloaded it. A `Pending` replica was never loaded, so
//! it is removed directly. Reporting the state a replica already has is an idempotent no-op
//! (so a worker may retry a report), except that it may update the measured memory.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::ClusterState;
use super::error::{EntityKind, StateError};
use super::node::Gpu;

/// One model version assigned to one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Replica {
    /// Allocated by the state machine from a counter; never reused.
    pub id: u64,
    pub model: String,
    pub version: i64,
    pub node: String,
    pub state: ReplicaState,
    /// What the worker measured after loading; placement prefers it to the model's estimate.
    pub measured_memory_bytes: Option<u64>,
    /// Why placement put the replica on this node, in words.
    #[serde(default)]
    pub placement_reason: String,
    /// The GPU indices of its node the replica was assigned (ascending); the worker loads it on
    /// those devices. Empty for a CPU model.
    #[serde(default)]
    pub gpus: Vec<u32>,
    /// Per GPU: the device memory the worker measured across the load (growth of used GPU
    /// memory on the replica's GPUs, divided by their number); placement prefers it to the
    /// model's `gpu_memory_bytes`.
    #[serde(default)]
    pub measured_gpu_memory_bytes: Option<u64>,
}

/// Where a replica is in its life; see the module docs for the legal transitions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReplicaState {
    /// Assigned; the worker has not started loading it.
    Pending,
    Loading,
    /// Serving; the router may send it requests.
    Ready,
    Failed {
        reason: String,
    },
    /// Leaving: the worker is unloading it or its model was deleted.
    Unloading,
}

impl fmt::Display for ReplicaState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplicaState::Pending => f.write_str("Pending"),
            ReplicaState::Loading => f.write_str("Loading"),
            ReplicaState::Ready => f.write_str("Ready"),
            ReplicaState::Failed { reason } => write!(f, "Failed ({reason})"),
            ReplicaState::Unloading => f.write_str("Unloading"),
        }
    }
}

impl ReplicaState {
    /// Whether the state machine accepts going from `self` to `next` (a same-state report
    /// included, as a no-op).
    pub fn can_become(&self, next: &ReplicaState) -> bool {
        use ReplicaState::*;
        matches!(
            (self, next),
            (Pending, Pending | Loading | Failed { .. })
                | (Loading, Loading | Ready | Failed { .. } | Unloading)
                | (Ready, Ready | Failed { .. } | Unloading)
                | (Failed { .. }, Failed { .. } | Unloading)
                | (Unloading, Unloading)
        )
    }
}

impl ClusterState {
    /// Assigns `model` `version` to `node` as a new `Pending` replica and returns its id.
    pub(super) fn add_replica(
        &mut self,
        model: &str,
        version: i64,
        node: &str,
        reason: String,
        mut gpus: Vec<u32>,
    ) -> Result<u64, StateError> {
        let Some(spec) = self.models.get(model) else {
            return Err(StateError::not_found(EntityKind::Model, model));
        };
        if version < 1 {
            return Err(StateError::invalid(
                format!("replica of model '{model}'"),
                "version",
                format!("{version} is not a positive version folder number"),
            ));
        }
        if !spec.version_policy.admits(version) {
            return Err(StateError::Conflict(format!(
                "model '{model}': version {version} is not in its version policy {:?}",
                spec.version_policy
            )));
        }
        let Some(target) = self.nodes.get(node) else {
            return Err(StateError::not_found(EntityKind::Node, node));
        };
        if target.spec.drained {
            return Err(StateError::Conflict(format!(
                "node '{node}' is drained; cannot place model '{model}' v{version} on it"
            )));
        }
        if !target.schedulable() {
            return Err(StateError::Conflict(format!(
                "node '{node}' is down; cannot place model '{model}' v{version} on it"
            )));
        }
        gpus.sort_unstable();
        validate_gpus(
            model,
            spec.resources.gpus,
            node,
            &target.spec.capacity.gpus,
            &gpus,
        )?;
        if let Some(existing) = self.replicas.values().find(|r| {
            r.model == model
                && r.version == version
                && r.node == node
                && r.state != ReplicaState::Unloading
        }) {
            return Err(StateError::Conflict(format!(
                "model '{model}' v{version} already has replica {} on node '{node}' ({})",
                existing.id, existing.state
            )));
        }
        let id = self.next_replica_id;
        self.next_replica_id += 1;
        self.replicas.insert(
            id,
            Replica {
                id,
                model: model.to_string(),
                version,
                node: node.to_string(),
                state: ReplicaState::Pending,
                measured_memory_bytes: None,
                placement_reason: reason,
                gpus,
                measured_gpu_memory_bytes: None,
            },
        );
        Ok(id)
    }

    /// Records a worker's report. A measurement of `None` keeps the previous value.
    pub(super) fn set_replica_state(
        &mut self,
        id: u64,
        state: ReplicaState,
        measured_memory_bytes: Option<u64>,
        measured_gpu_memory_bytes: Option<u64>,
    ) -> Result<bool, StateError> {
        let Some(replica) = self.replicas.get_mut(&id) else {
            return Err(StateError::not_found(EntityKind::Replica, id));
        };
        if matches!(&state, ReplicaState::Failed { reason } if reason.trim().is_empty()) {
            return Err(StateError::invalid(
                format!("replica {id}"),
                "state.reason",
                "must say why the replica failed",
            ));
        }
        if !replica.state.can_become(&state) {
            return Err(StateError::Conflict(format!(
                "replica {id} (model '{}' v{} on node '{}') cannot go from {} to {}",
                replica.model, replica.version, replica.node, replica.state, state
            )));
        }
        let memory = measured_memory_bytes.or(replica.measured_memory_bytes);
        let gpu_memory = measured_gpu_memory_bytes.or(replica.measured_gpu_memory_bytes);
        let changed = replica.state != state
            || replica.measured_memory_bytes != memory
            || replica.measured_gpu_memory_bytes != gpu_memory;
        replica.state = state;
        replica.measured_memory_bytes = memory;
        replica.measured_gpu_memory_bytes = gpu_memory;
        Ok(changed)
    }

    /// Drops a replica once its worker has unloaded it (or never loaded it).
    pub(super) fn remove_replica(&mut self, id: u64) -> Result<bool, StateError> {
        let Some(replica) = self.replicas.get(&id) else {
            return Err(StateError::not_found(EntityKind::Replica, id));
        };
        if matches!(replica.state, ReplicaState::Loading | ReplicaState::Ready) {
            return Err(StateError::Conflict(format!(
                "replica {id} (model '{}' v{} on node '{}') is {}; mark it Unloading first",
                replica.model, replica.version, replica.node, replica.state
            )));
        }
        self.replicas.remove(&id);
        Ok(true)
    }
}

/// A replica's GPU assignment: exactly the model's `gpus` count, distinct (`gpus` is sorted),
/// each one a GPU the node registered.
fn validate_gpus(
    model: &str,
    wanted: u32,
    node: &str,
    node_gpus: &[Gpu],
    gpus: &[u32],
) -> Result<(), StateError> {
    let subject = format!("replica of model '{model}' on node '{node}'");
    if gpus.len() != wanted as usize {
        return Err(StateError::invalid(
            subject,
            "gpus",
            format!("assigns {} GPU(s) but the model needs {wanted}", gpus.len()),
        ));
    }
    if gpus.windows(2).any(|w| w[0] == w[1]) {
        return Err(StateError::invalid(subject, "gpus", "lists a GPU twice"));
    }
    if let Some(missing) = gpus
        .iter()
        .find(|i| !node_gpus.iter().any(|g| g.index == **i))
    {
        return Err(StateError::invalid(
            subject,
            "gpus",
            format!("GPU {missing} is not one the node registered"),
        ));
    }
    Ok(())
}
