//! The change between two states as a [`pb::StateDelta`]: entities present in `new` and
//! different (by value) or absent in `old` are upserted whole; keys present only in `old` are
//! deleted. Pure; each list is in key order.

use std::collections::BTreeMap;

use nereid_proto::pb::cluster as pb;

use crate::convert::{model_to_pb, node_to_pb, replica_to_pb};
use crate::state::ClusterState;

/// What turns `old` into `new`.
pub fn diff(old: &ClusterState, new: &ClusterState) -> pb::StateDelta {
    let (upserted_models, deleted_models) = changes(old.models(), new.models(), model_to_pb);
    let (upserted_nodes, deleted_nodes) = changes(old.nodes(), new.nodes(), node_to_pb);
    let (upserted_replicas, deleted_replicas) =
        changes(old.replicas(), new.replicas(), replica_to_pb);
    pb::StateDelta {
        upserted_models,
        deleted_models,
        upserted_nodes,
        deleted_nodes,
        upserted_replicas,
        deleted_replicas,
    }
}

/// Whether a delta changes nothing.
#[cfg(test)]
pub fn is_empty(delta: &pb::StateDelta) -> bool {
    delta.upserted_models.is_empty()
        && delta.deleted_models.is_empty()
        && delta.upserted_nodes.is_empty()
        && delta.deleted_nodes.is_empty()
        && delta.upserted_replicas.is_empty()
        && delta.deleted_replicas.is_empty()
}

fn changes<K: Ord + Clone, V: PartialEq, P>(
    old: &BTreeMap<K, V>,
    new: &BTreeMap<K, V>,
    to_pb: impl Fn(&V) -> P,
) -> (Vec<P>, Vec<K>) {
    let upserted = new
        .iter()
        .filter(|(k, v)| old.get(*k) != Some(*v))
        .map(|(_, v)| to_pb(v))
        .collect();
    let deleted = old
        .keys()
        .filter(|k| !new.contains_key(*k))
        .cloned()
        .collect();
    (upserted, deleted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{
        Command, ModelSpec, NodeAddresses, NodeCapacity, NodeSpec, ReplicaState, VersionPolicy,
    };

    fn model(name: &str) -> ModelSpec {
        ModelSpec {
            name: name.into(),
            source: format!("file:///models/{name}"),
            version_policy: VersionPolicy::All,
            config_override: None,
            min_replicas: 1,
            max_replicas: 1,
            resources: Default::default(),
            labels: Default::default(),
            available_versions: vec![1],
            traffic: Default::default(),
        }
    }

    fn node(id: &str) -> NodeSpec {
        NodeSpec {
            id: id.into(),
            addresses: NodeAddresses {
                data_http: "h:1".into(),
                data_grpc: "h:2".into(),
                agent: "h:3".into(),
            },
            capacity: NodeCapacity::default(),
            labels: Default::default(),
            drained: false,
        }
    }

    #[test]
    fn equal_states_diff_to_nothing() {
        let s = ClusterState::new();
        assert!(is_empty(&diff(&s, &s)));
    }

    #[test]
    fn reports_upserts_and_deletes_by_value() {
        let mut old = ClusterState::new();
        old.apply(Command::UpsertModel(model("a"))).unwrap();
        old.apply(Command::UpsertModel(model("b"))).unwrap();
        old.apply(Command::RegisterNode(node("n1"))).unwrap();
        old.apply(Command::RegisterNode(node("n2"))).unwrap();
        old.apply(Command::AddReplica {
            model: "a".into(),
            version: 1,
            node: "n1".into(),
            reason: String::new(),
            gpus: Vec::new(),
        })
        .unwrap();

        let mut new = old.clone();
        new.apply(Command::DeleteModel { name: "b".into() })
            .unwrap();
        new.apply(Command::UpsertModel(model("c"))).unwrap();
        new.apply(Command::SetNodeDrained {
            id: "n2".into(),
            drained: true,
        })
        .unwrap();
        new.apply(Command::SetReplicaState {
            id: 1,
            state: ReplicaState::Failed {
                reason: "oom".into(),
            },
            measured_memory_bytes: None,
            measured_gpu_memory_bytes: None,
        })
        .unwrap();
        new.apply(Command::RemoveReplica { id: 1 }).unwrap();
        new.apply(Command::AddReplica {
            model: "a".into(),
            version: 1,
            node: "n1".into(),
            reason: String::new(),
            gpus: Vec::new(),
        })
        .unwrap();

        let d = diff(&old, &new);
        let models: Vec<_> = d.upserted_models.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(models, ["c"]);
        assert_eq!(d.deleted_models, ["b"]);
        let nodes: Vec<_> = d.upserted_nodes.iter().map(|n| n.id.as_str()).collect();
        assert_eq!(nodes, ["n2"]);
        assert!(d.upserted_nodes[0].drained);
        assert!(d.deleted_nodes.is_empty());
        let replicas: Vec<_> = d.upserted_replicas.iter().map(|r| r.id).collect();
        assert_eq!(replicas, [2]);
        assert_eq!(d.deleted_replicas, [1]);

        let back = diff(&new, &old);
        assert_eq!(back.deleted_models, ["c"]);
        assert_eq!(back.upserted_models[0].name, "b");
        assert_eq!(back.deleted_replicas, [2]);
    }
}
