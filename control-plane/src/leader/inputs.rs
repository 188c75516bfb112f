//! The inputs a placement round decided on, in words, as placement records keep them.

use crate::state::ClusterState;
use nereid_placement::{Load, NodeView, format_bytes};

/// One line per node placement considered: status, memory used of capacity, load, and per GPU
/// the memory its replicas hold of its total.
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
            let gpus: String = n
                .gpus
                .iter()
                .map(|g| {
                    let held: u64 = state
                        .replicas_on(&n.id)
                        .filter(|r| r.gpus.contains(&g.index))
                        .map(|r| {
                            r.measured_gpu_memory_bytes.unwrap_or_else(|| {
                                state
                                    .model(&r.model)
                                    .map(|m| m.resources.gpu_memory_bytes)
                                    .unwrap_or(0)
                            })
                        })
                        .sum();
                    format!(
                        "; GPU {} {} of {} placed",
                        g.index,
                        format_bytes(held),
                        format_bytes(g.memory_bytes)
                    )
                })
                .collect();
            format!(
                "node {}: {status}; memory {used} of {} bytes used; cpu utilization {:.2}{gpus}",
                n.id, n.memory_capacity_bytes, util
            )
        })
        .collect()
}
