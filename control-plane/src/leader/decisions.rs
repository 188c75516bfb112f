//! A plan as the API shows it: one [`pb::PlacementDecision`] per addition, removal or unplaced
//! group, narrowed to one model, and the inputs a round decided on, in words.

use nereid_proto::pb::cluster as pb;

use crate::placement::{Load, NodeView, Plan};
use crate::state::ClusterState;

/// The decisions of `plan` that concern `model` (all its versions), adds then removes then
/// unplaced.
pub fn decisions_for_model(
    state: &ClusterState,
    plan: &Plan,
    model: &str,
) -> Vec<pb::PlacementDecision> {
    let narrowed = plan.for_model(model, |id| state.replica(id).map(|r| r.model.clone()));
    let adds = narrowed.add.iter().map(|a| pb::PlacementDecision {
        action: "add".into(),
        version: a.version,
        node: a.node.clone(),
        replica: 0,
        missing: 0,
        rule: a.reason.rule().into(),
        explanation: a.reason.to_string(),
    });
    let removes = narrowed.remove.iter().map(|r| {
        let replica = state.replica(r.replica);
        pb::PlacementDecision {
            action: "remove".into(),
            version: replica.map(|x| x.version).unwrap_or_default(),
            node: replica.map(|x| x.node.clone()).unwrap_or_default(),
            replica: r.replica,
            missing: 0,
            rule: r.reason.rule().into(),
            explanation: r.reason.to_string(),
        }
    });
    let unplaced = narrowed.unplaced.iter().map(|u| pb::PlacementDecision {
        action: "unplaced".into(),
        version: u.version,
        node: String::new(),
        replica: 0,
        missing: u.missing,
        rule: u.reason.rule().into(),
        explanation: u.reason.to_string(),
    });
    adds.chain(removes).chain(unplaced).collect()
}

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
