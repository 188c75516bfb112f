//! The commands the replicated log carries, and what applying one reports.
//!
//! Every change to the cluster's state of record is one [`Command`]: the management API
//! writes model and drain commands, workers' registrations and reports write node and
//! replica commands, and placement writes `AddReplica` / `SetReplicaState { Unloading }`.

use serde::{Deserialize, Serialize};

use super::autoscale::AutoscalePolicy;
use super::model::ModelSpec;
use super::node::{NodeSpec, NodeStatus};
use super::replica::ReplicaState;

/// One entry of the replicated log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Create or replace a model.
    UpsertModel(ModelSpec),
    /// Remove a model; its replicas become `Unloading`.
    DeleteModel {
        name: String,
    },
    ScaleModel {
        name: String,
        min: u32,
        max: u32,
    },
    /// Replace a model's version traffic split; empty clears it.
    SetTraffic {
        name: String,
        weights: std::collections::BTreeMap<i64, u32>,
    },
    /// Add a node, or update a re-registering one.
    RegisterNode(NodeSpec),
    /// Remove a node that holds no live replica.
    RemoveNode {
        id: String,
    },
    SetNodeDrained {
        id: String,
        drained: bool,
    },
    /// A liveness transition decided by the leader from heartbeats.
    SetNodeStatus {
        id: String,
        status: NodeStatus,
    },
    /// Assign a model version to a node; [`Applied::replica_id`] carries the new id.
    AddReplica {
        model: String,
        version: i64,
        node: String,
        /// The placement rule that fired, in words; kept on the replica for explanations.
        #[serde(default)]
        reason: String,
        /// The GPU indices of `node` the replica is assigned (as many as the model's
        /// `resources.gpus`, each one the node registered); empty for a CPU model.
        #[serde(default)]
        gpus: Vec<u32>,
    },
    /// A worker's report; a measurement of `None` keeps the previous value.
    SetReplicaState {
        id: u64,
        state: ReplicaState,
        measured_memory_bytes: Option<u64>,
        /// Per GPU: the device memory the replica took on its GPUs.
        #[serde(default)]
        measured_gpu_memory_bytes: Option<u64>,
    },
    RemoveReplica {
        id: u64,
    },
    /// Set a model's replica range and autoscale policy; `None` turns autoscaling off.
    SetAutoscale {
        name: String,
        min: u32,
        max: u32,
        policy: Option<AutoscalePolicy>,
    },
    /// The leader's autoscaler decided a replica count (per served version) for a model.
    SetAutoscaledReplicas {
        name: String,
        replicas: u32,
        reason: String,
    },
}

/// What applying a command did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    /// The state's revision after the command: one more than before if `changed`.
    pub revision: u64,
    /// False for an idempotent repeat (same spec, same drain flag, same state report);
    /// watchers see no delta for it.
    pub changed: bool,
    /// The id `AddReplica` allocated.
    pub replica_id: Option<u64>,
}
