//! The placement function's inputs built from the state of record: the one place that decides
//! how models, nodes and replicas look to [`nereid_placement::plan`]. The management API uses
//! it to explain placement; the leader's placement loop uses it to decide.
//!
//! - [`NodeView`]: memory capacity and GPUs (index, total memory) from the node's registration,
//!   `up` when its status is `Up`, `drained` as the operator set it.
//! - [`ModelView`]: one per (model, served version) ([`crate::state::ModelSpec::served_versions`]);
//!   `replicas_wanted` is `min_replicas` — the floor placement maintains — raised to 1 for a
//!   model with `min_replicas` 0 that routers activated recently ([`Load::demanded`]: scale
//!   from zero; when the demand lapses the surplus replica is removed, scale to zero).
//!   `max_replicas` caps that (0 turns scale from zero off) and is the ceiling of load-driven
//!   scaling: a model with an autoscale policy wants the autoscaler's count
//!   ([`ClusterState::wanted_replicas`], `crate::autoscale`) instead of its floor. The memory
//!   estimate is `resources.memory_bytes`; the measured memory is the largest any replica of
//!   that version reported (or, once none is left, what the leader remembers of them:
//!   [`nereid_placement::Cache::remembered`]). Likewise for GPUs: `resources.gpus` GPUs per replica, each needing
//!   `resources.gpu_memory_bytes` until a replica reported its measured GPU memory.
//! - [`CurrentReplica`]: every replica not `Unloading` (those are already leaving), `ready`
//!   when `Ready`, with its assigned GPUs. A `Failed` replica still counts (not ready) and keeps its slot: whoever
//!   retires failed replicas marks them `Unloading`, and the next plan replaces them.
//! - [`cache_floors`]: per model, the replicas eviction must leave it ([`nereid_placement::Cache::floor`]):
//!   what it keeps without activations (`min_replicas` or the autoscaler's count).

use std::collections::BTreeMap;

use crate::state::{ClusterState, ModelSpec, NodeStatus, ReplicaState};
use nereid_placement::{CurrentReplica, GpuView, Load, ModelView, NodeView, Plan};

/// Every registered node, in id order.
pub fn node_views(state: &ClusterState) -> Vec<NodeView> {
    state
        .nodes()
        .values()
        .map(|n| NodeView {
            id: n.spec.id.clone(),
            memory_capacity_bytes: n.spec.capacity.memory_bytes,
            cpu_millis_capacity: n.spec.capacity.cpu_millis,
            up: n.status == NodeStatus::Up,
            drained: n.spec.drained,
            gpus: n
                .spec
                .capacity
                .gpus
                .iter()
                .map(|g| GpuView {
                    index: g.index,
                    memory_bytes: g.memory_bytes,
                })
                .collect(),
        })
        .collect()
}

/// One view per (model, served version), in that order.
pub fn model_views(state: &ClusterState, load: &Load) -> Vec<ModelView> {
    let mut views = Vec::new();
    for spec in state.models().values() {
        for version in spec.served_versions() {
            let remembered = load
                .cache
                .remembered
                .get(&(spec.name.clone(), version))
                .copied()
                .unwrap_or_default();
            let measured = state
                .replicas_of(&spec.name)
                .filter(|r| r.version == version)
                .filter_map(|r| r.measured_memory_bytes)
                .max()
                .or(remembered.0);
            let measured_gpu = state
                .replicas_of(&spec.name)
                .filter(|r| r.version == version)
                .filter_map(|r| r.measured_gpu_memory_bytes)
                .max()
                .or(remembered.1);
            views.push(ModelView {
                name: spec.name.clone(),
                version,
                replicas_wanted: replicas_wanted(state, spec, load),
                memory_estimate_bytes: spec.resources.memory_bytes,
                measured_memory_bytes: measured,
                gpus: spec.resources.gpus,
                gpu_memory_estimate_bytes: spec.resources.gpu_memory_bytes,
                measured_gpu_memory_bytes: measured_gpu,
            });
        }
    }
    views
}

/// `min_replicas` (or the autoscaler's count within `[min, max]`), or 1 for a model at 0
/// scaled from zero while routers keep activating it.
pub fn replicas_wanted(state: &ClusterState, spec: &ModelSpec, load: &Load) -> u32 {
    let wanted = state.wanted_replicas(spec);
    if wanted == 0 && spec.max_replicas > 0 && load.demanded.contains(&spec.name) {
        1
    } else {
        wanted
    }
}

/// Every replica that is not `Unloading`, in id order.
pub fn current_replicas(state: &ClusterState) -> Vec<CurrentReplica> {
    state
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
            gpus: r.gpus.clone(),
            gpu_memory_bytes: r.measured_gpu_memory_bytes,
        })
        .collect()
}

/// Per model, the replicas (per served version) that eviction leaves it: its count without
/// activations.
pub fn cache_floors(state: &ClusterState) -> BTreeMap<String, u32> {
    state
        .models()
        .values()
        .map(|spec| (spec.name.clone(), state.wanted_replicas(spec)))
        .collect()
}

/// `load` with the state's [`cache_floors`], as placement needs it.
pub fn with_floors(state: &ClusterState, mut load: Load) -> Load {
    if load.cache.evict {
        load.cache.floor = cache_floors(state);
    }
    load
}

/// The plan for the whole cluster as `state` stands, with `load` breaking ties.
pub fn plan_for(state: &ClusterState, load: &Load) -> Plan {
    let load = with_floors(state, load.clone());
    nereid_placement::plan(
        &node_views(state),
        &model_views(state, &load),
        &current_replicas(state),
        &load,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Command, ModelSpec, NodeSpec, Resources, VersionPolicy};
    use crate::testing;

    fn node(id: &str, memory: u64) -> NodeSpec {
        let mut spec = testing::node(id);
        spec.capacity.memory_bytes = memory;
        spec
    }

    #[test]
    fn views_follow_the_state() {
        let mut s = ClusterState::new();
        s.apply(Command::UpsertModel(ModelSpec {
            name: "m".into(),
            source: "file:///m".into(),
            version_policy: VersionPolicy::Latest { n: 2 },
            config_override: None,
            min_replicas: 2,
            max_replicas: 3,
            resources: Resources {
                memory_bytes: 100,
                ..Default::default()
            },
            labels: Default::default(),
            available_versions: vec![1, 2, 3],
            traffic: Default::default(),
        }))
        .unwrap();
        s.apply(Command::RegisterNode(node("a", 1000))).unwrap();
        s.apply(Command::RegisterNode(node("b", 1000))).unwrap();
        s.apply(Command::SetNodeDrained {
            id: "b".into(),
            drained: true,
        })
        .unwrap();
        s.apply(Command::AddReplica {
            model: "m".into(),
            version: 3,
            node: "a".into(),
            reason: String::new(),
            gpus: Vec::new(),
        })
        .unwrap();
        s.apply(Command::SetReplicaState {
            id: 1,
            state: ReplicaState::Loading,
            measured_memory_bytes: Some(150),
            measured_gpu_memory_bytes: None,
        })
        .unwrap();

        let nodes = node_views(&s);
        assert_eq!(nodes.len(), 2);
        assert!(nodes[0].up && !nodes[0].drained);
        assert!(nodes[1].drained);
        assert_eq!(nodes[0].memory_capacity_bytes, 1000);
        assert_eq!(
            nodes[0].gpus,
            [GpuView {
                index: 0,
                memory_bytes: 80 << 30
            }]
        );

        let models = model_views(&s, &Load::default());
        let versions: Vec<_> = models.iter().map(|m| m.version).collect();
        assert_eq!(versions, [2, 3]);
        assert_eq!(models[0].replicas_wanted, 2);
        assert_eq!(models[0].measured_memory_bytes, None);
        assert_eq!(models[1].measured_memory_bytes, Some(150));

        let replicas = current_replicas(&s);
        assert_eq!(replicas.len(), 1);
        assert!(!replicas[0].ready);

        s.apply(Command::DeleteModel { name: "m".into() }).unwrap();
        assert!(
            current_replicas(&s).is_empty(),
            "unloading replicas are leaving"
        );
        assert!(model_views(&s, &Load::default()).is_empty());
    }
}
