//! Placement's inputs built from the state of record: one [`NodeView`] per node, one
//! [`ModelView`] per served model version, one [`CurrentReplica`] per replica that is not
//! leaving.
//!
//! A model version wants `min_replicas` replicas (0 keeps it registered but unplaced). Its
//! memory per replica is the largest a worker measured on any of its replicas, else the
//! model's `resources.memory_bytes` estimate.

use std::collections::BTreeMap;

use crate::placement::{CurrentReplica, ModelView, NodeView};
use crate::state::{ClusterState, NodeStatus, ReplicaState};

/// The three views placement takes, in the state's (sorted) order.
pub fn placement_views(state: &ClusterState) -> (Vec<NodeView>, Vec<ModelView>, Vec<CurrentReplica>) {
    let nodes = state
        .nodes()
        .values()
        .map(|n| NodeView {
            id: n.spec.id.clone(),
            memory_capacity_bytes: n.spec.capacity.memory_bytes,
            cpu_millis_capacity: n.spec.capacity.cpu_millis,
            up: n.status == NodeStatus::Up,
            drained: n.spec.drained,
        })
        .collect();

    let mut measured: BTreeMap<(&str, i64), u64> = BTreeMap::new();
    for r in state.replicas().values() {
        if let Some(bytes) = r.measured_memory_bytes {
            let entry = measured.entry((r.model.as_str(), r.version)).or_default();
            *entry = (*entry).max(bytes);
        }
    }
    let models = state
        .models()
        .values()
        .flat_map(|m| {
            let measured = &measured;
            m.served_versions().into_iter().map(move |version| ModelView {
                name: m.name.clone(),
                version,
                replicas_wanted: m.min_replicas,
                memory_estimate_bytes: m.resources.memory_bytes,
                measured_memory_bytes: measured.get(&(m.name.as_str(), version)).copied(),
            })
        })
        .collect();

    let replicas = state
        .replicas()
        .values()
        .filter(|r| r.state != ReplicaState::Unloading)
        .map(|r| CurrentReplica {
            id: r.id,
            model: r.model.clone(),
            version: r.version,
            node: r.node.clone(),
            ready: r.state == ReplicaState::Ready,
            memory_bytes: r.measured_memory_bytes,
        })
        .collect();
    (nodes, models, replicas)
}
