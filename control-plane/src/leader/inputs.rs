//! The inputs a placement round decided on, in words, as placement records keep them.

use crate::placement::{Load, NodeView};
use crate::state::ClusterState;

/// One line per node placement considered: status, memory used of capacity, load.
pub fn describe_inputs(state: &ClusterState, nodes: &[NodeView], load: &Load) -> Vec<String> {
    nodes
        .iter()
        .map(|n| {
            let used: u64 = state
                .replicas_on(&n.id)
                .map(|r| {
                    r.measured_memory_bytes.unwrap_or_else(|| {
                        state
                            .model(&r.model)
                            .map(|m| m.resources.memory_bytes)
                            .unwrap_or(0)
                    })
                })
                .sum();
            let status = match (n.up, n.drained) {
                (false, _) => "down",
                (true, true) => "up, drained",
                (true, false) => "up",
            };
            let util = load.node_utilization.get(&n.id).copied().unwrap_or(0.0);
            format!(
                "node {}: {status}; memory {used} of {} bytes used; cpu utilization {:.2}",
                n.id, n.memory_capacity_bytes, util
            )
        })
        .collect()
}
