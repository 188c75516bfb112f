//! The autoscaler's inputs built from the state of record and the workers' last heartbeats.
//!
//! For every model with an autoscale policy: the requests in flight summed over the
//! `ModelLoad` entries of its served versions in the last heartbeat of every node that is
//! up, the ready replicas of those versions on up nodes (both per served version: a model
//! serving two versions counts half of each, as its count is per version), the count placement keeps now
//! ([`ClusterState::wanted_replicas`]) and the model's `[min_replicas, max_replicas]`.

use std::collections::HashMap;

use nereid_proto::pb::cluster as pb;

use super::Input;
use crate::state::{AutoscalePolicy, ClusterState, NodeStatus, ReplicaState};

/// One autoscaled model this round.
#[derive(Debug, Clone, PartialEq)]
pub struct Observed {
    pub model: String,
    pub policy: AutoscalePolicy,
    pub input: Input,
}

/// The inputs for every autoscaled model, in name order.
pub fn inputs(
    state: &ClusterState,
    heartbeats: &HashMap<String, pb::HeartbeatRequest>,
    now_ms: u64,
) -> Vec<Observed> {
    let up = |node: &str| state.node(node).is_some_and(|n| n.status == NodeStatus::Up);
    state
        .models()
        .values()
        .filter_map(|spec| {
            let autoscale = state.autoscale(&spec.name)?;
            let served = spec.served_versions();
            let total_in_flight: u64 = heartbeats
                .iter()
                .filter(|(node, _)| up(node))
                .flat_map(|(_, hb)| hb.models.iter())
                .filter(|l| l.model == spec.name && served.contains(&l.version))
                .map(|l| l.in_flight)
                .sum();
            let ready = state
                .replicas_of(&spec.name)
                .filter(|r| r.state == ReplicaState::Ready && served.contains(&r.version))
                .filter(|r| up(&r.node))
                .count();
            // The count is per served version: several versions share the load, so the
            // input is one version's share (total and ready replicas over the versions).
            let versions = served.len().max(1);
            Some(Observed {
                model: spec.name.clone(),
                policy: autoscale.policy.clone(),
                input: Input {
                    now_ms,
                    total_in_flight: total_in_flight as f64 / versions as f64,
                    current: state.wanted_replicas(spec),
                    ready: u32::try_from(ready.div_ceil(versions)).unwrap_or(u32::MAX),
                    min: spec.min_replicas,
                    max: spec.max_replicas,
                },
            })
        })
        .collect()
}
