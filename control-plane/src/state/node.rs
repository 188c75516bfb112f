//! Worker nodes in the registry and the commands that change them.
//!
//! A worker registers itself with its addresses and capacity. Liveness is soft state the
//! leader keeps from heartbeats; only its transitions reach the log as
//! `SetNodeStatus { Up | Down }`. Draining is the operator's: a drained or down node gets no
//! new replicas, and re-registering (a worker restart) keeps the operator's drain flag.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::ClusterState;
use super::error::{EntityKind, StateError};
use super::name::validate_name;
use super::replica::ReplicaState;

/// What a worker says about itself when it registers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeSpec {
    /// Stable id chosen by the worker (its `--node-id`); unique in the cluster.
    pub id: String,
    pub addresses: NodeAddresses,
    pub capacity: NodeCapacity,
    /// Free-form labels, e.g. for placement constraints.
    pub labels: BTreeMap<String, String>,
    /// Set by an operator: no new replicas go here, existing ones move away.
    pub drained: bool,
}

/// Where to reach a worker (`host:port`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeAddresses {
    /// KServe v2 HTTP, for clients that bypass the router.
    pub data_http: String,
    /// KServe v2 gRPC; the router forwards here.
    pub data_grpc: String,
    /// The worker agent's own endpoint, if it serves one (optional: today's workers only
    /// call out to the control plane).
    pub agent: String,
}

/// What a worker can hold.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeCapacity {
    pub cpu_millis: u64,
    pub memory_bytes: u64,
    pub gpus: Vec<Gpu>,
}

/// One GPU of a worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gpu {
    /// The device index as the worker's runtime numbers it.
    pub index: u32,
    pub memory_bytes: u64,
}

/// Liveness as recorded in the log: only its transitions are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeStatus {
    Up,
    Down,
}

/// A registered node: what it said about itself and whether it is up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    pub spec: NodeSpec,
    pub status: NodeStatus,
}

impl Node {
    /// Whether new replicas may be placed here.
    pub fn schedulable(&self) -> bool {
        !self.spec.drained && self.status == NodeStatus::Up
    }
}

impl NodeSpec {
    /// Checks everything about the spec that does not depend on the cluster state.
    pub fn validate(&self) -> Result<(), StateError> {
        validate_name("node", "id", &self.id)?;
        let subject = format!("node '{}'", self.id);
        for (field, addr) in [
            ("addresses.data_http", &self.addresses.data_http),
            ("addresses.data_grpc", &self.addresses.data_grpc),
        ] {
            if addr.trim().is_empty() {
                return Err(StateError::invalid(&subject, field, "must not be empty"));
            }
        }
        let mut seen = BTreeSet::new();
        for gpu in &self.capacity.gpus {
            if !seen.insert(gpu.index) {
                return Err(StateError::invalid(
                    &subject,
                    "capacity.gpus",
                    format!("lists GPU index {} twice", gpu.index),
                ));
            }
        }
        Ok(())
    }
}

impl ClusterState {
    /// Adds a node, or updates a re-registering one (addresses, capacity, labels). A
    /// registration means the worker is alive, so the node is `Up` afterwards; an existing
    /// node keeps the operator's drain flag.
    pub(super) fn register_node(&mut self, mut spec: NodeSpec) -> Result<bool, StateError> {
        spec.validate()?;
        if let Some(existing) = self.nodes.get(&spec.id) {
            spec.drained = existing.spec.drained;
            if existing.spec == spec && existing.status == NodeStatus::Up {
                return Ok(false);
            }
        }
        let node = Node {
            spec,
            status: NodeStatus::Up,
        };
        self.nodes.insert(node.spec.id.clone(), node);
        Ok(true)
    }

    /// Removes a node. Refused while it holds a replica that is not `Failed` or
    /// `Unloading`; those remaining are dropped with it, as no worker is left to report them.
    pub(super) fn remove_node(&mut self, id: &str) -> Result<bool, StateError> {
        if !self.nodes.contains_key(id) {
            return Err(StateError::not_found(EntityKind::Node, id));
        }
        let live: Vec<String> = self
            .replicas_on(id)
            .filter(|r| {
                !matches!(
                    r.state,
                    ReplicaState::Failed { .. } | ReplicaState::Unloading
                )
            })
            .map(|r| format!("{} ({} v{}, {})", r.id, r.model, r.version, r.state))
            .collect();
        if !live.is_empty() {
            return Err(StateError::Conflict(format!(
                "node '{id}' still holds replicas {}; drain it and wait for them to unload",
                live.join(", ")
            )));
        }
        self.nodes.remove(id);
        self.replicas.retain(|_, r| r.node != id);
        Ok(true)
    }

    pub(super) fn set_node_drained(&mut self, id: &str, drained: bool) -> Result<bool, StateError> {
        let Some(node) = self.nodes.get_mut(id) else {
            return Err(StateError::not_found(EntityKind::Node, id));
        };
        let changed = node.spec.drained != drained;
        node.spec.drained = drained;
        Ok(changed)
    }

    pub(super) fn set_node_status(
        &mut self,
        id: &str,
        status: NodeStatus,
    ) -> Result<bool, StateError> {
        let Some(node) = self.nodes.get_mut(id) else {
            return Err(StateError::not_found(EntityKind::Node, id));
        };
        let changed = node.status != status;
        node.status = status;
        Ok(changed)
    }
}
