//! Conversions between the state machine's types ([`crate::state`]) and the wire messages of
//! `nereid.cluster.v1` ([`pb`]).
//!
//! ```text
//!  client pb::Model ──model_from_pb (validates)──► ModelSpec ──model_to_pb──► pb::Model
//!  RegisterNodeRequest ──node_spec_from_register (validates)──► NodeSpec
//!  Node / Replica / ClusterState ──node_to_pb / replica_to_pb / snapshot_to_pb──► pb
//!  (ReplicaState enum, failure_reason) ──replica_state_from_pb──► ReplicaState
//!  placement::Plan ──plan_to_decisions──► pb::PlacementDecision[]
//! ```
//!
//! The state side is the source of truth: every state value maps to exactly one message, and a
//! model survives `model_to_pb` then `model_from_pb` unchanged. The wire side is what clients
//! type, so its conversions validate and fill defaults: a missing `version_policy` means
//! `latest 1` (Triton's default), a missing `resources` means zeros, an empty
//! `config_override` means none. Errors are [`StateError::Invalid`] naming the field.

use std::collections::BTreeMap;

use nereid_proto::pb::cluster as pb;
use pb::version_policy::Policy;

use crate::state::{
    ClusterState, Gpu, ModelSpec, Node, NodeAddresses, NodeCapacity, NodeSpec, NodeStatus, Replica,
    ReplicaState, Resources, StateError, VersionPolicy,
};
use nereid_placement::Plan;

// ----- models ---------------------------------------------------------------------------------

pub fn version_policy_to_pb(policy: &VersionPolicy) -> pb::VersionPolicy {
    let policy = match policy {
        VersionPolicy::Latest { n } => {
            Policy::Latest(pb::version_policy::Latest { num_versions: *n })
        }
        VersionPolicy::All => Policy::All(pb::version_policy::All {}),
        VersionPolicy::Specific { versions } => Policy::Specific(pb::version_policy::Specific {
            versions: versions.clone(),
        }),
    };
    pb::VersionPolicy {
        policy: Some(policy),
    }
}

/// A missing policy (absent message or no oneof member set) is Triton's default, `latest 1`.
/// Whether the numbers make sense is [`ModelSpec::validate`]'s concern.
pub fn version_policy_from_pb(policy: Option<pb::VersionPolicy>) -> VersionPolicy {
    match policy.and_then(|p| p.policy) {
        None => VersionPolicy::Latest { n: 1 },
        Some(Policy::Latest(l)) => VersionPolicy::Latest { n: l.num_versions },
        Some(Policy::All(_)) => VersionPolicy::All,
        Some(Policy::Specific(s)) => VersionPolicy::Specific {
            versions: s.versions,
        },
    }
}

pub fn resources_to_pb(r: &Resources) -> pb::Resources {
    pb::Resources {
        cpu_millis: r.cpu_millis,
        memory_bytes: r.memory_bytes,
        gpus: r.gpus,
        gpu_memory_bytes: r.gpu_memory_bytes,
    }
}

pub fn resources_from_pb(r: Option<pb::Resources>) -> Resources {
    let r = r.unwrap_or_default();
    Resources {
        cpu_millis: r.cpu_millis,
        memory_bytes: r.memory_bytes,
        gpus: r.gpus,
        gpu_memory_bytes: r.gpu_memory_bytes,
    }
}

pub fn model_to_pb(spec: &ModelSpec) -> pb::Model {
    pb::Model {
        name: spec.name.clone(),
        source: spec.source.clone(),
        version_policy: Some(version_policy_to_pb(&spec.version_policy)),
        config_override: spec.config_override.clone().unwrap_or_default(),
        min_replicas: spec.min_replicas,
        max_replicas: spec.max_replicas,
        resources: Some(resources_to_pb(&spec.resources)),
        labels: spec
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        available_versions: spec.available_versions.clone(),
        traffic: spec.traffic.iter().map(|(v, w)| (*v, *w)).collect(),
        served_versions: spec.served_versions(),
    }
}

/// A model as a client sent it, validated ([`ModelSpec::validate`]): the error names the
/// field. `available_versions` is copied as given; the management API replaces it with what it
/// finds in the source.
pub fn model_from_pb(model: pb::Model) -> Result<ModelSpec, StateError> {
    let config_override = if model.config_override.trim().is_empty() {
        None
    } else {
        Some(model.config_override)
    };
    let mut available_versions = model.available_versions;
    available_versions.sort_unstable();
    available_versions.dedup();
    let spec = ModelSpec {
        name: model.name,
        source: model.source,
        version_policy: version_policy_from_pb(model.version_policy),
        config_override,
        min_replicas: model.min_replicas,
        max_replicas: model.max_replicas,
        resources: resources_from_pb(model.resources),
        labels: model.labels.into_iter().collect::<BTreeMap<_, _>>(),
        available_versions,
        traffic: model.traffic.into_iter().collect(),
    };
    spec.validate()?;
    Ok(spec)
}

// ----- nodes ----------------------------------------------------------------------------------

pub fn node_status_to_pb(status: NodeStatus) -> pb::NodeStatus {
    match status {
        NodeStatus::Up => pb::NodeStatus::Up,
        NodeStatus::Down => pb::NodeStatus::Down,
    }
}

pub fn node_to_pb(node: &Node) -> pb::Node {
    let spec = &node.spec;
    pb::Node {
        id: spec.id.clone(),
        addresses: Some(pb::NodeAddresses {
            data_http: spec.addresses.data_http.clone(),
            data_grpc: spec.addresses.data_grpc.clone(),
            agent: spec.addresses.agent.clone(),
        }),
        capacity: Some(pb::NodeCapacity {
            cpu_millis: spec.capacity.cpu_millis,
            memory_bytes: spec.capacity.memory_bytes,
            gpus: spec
                .capacity
                .gpus
                .iter()
                .map(|g| pb::Gpu {
                    index: g.index,
                    memory_bytes: g.memory_bytes,
                })
                .collect(),
        }),
        labels: spec
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        drained: spec.drained,
        status: node_status_to_pb(node.status) as i32,
    }
}

/// What a registering worker says about itself, validated ([`NodeSpec::validate`]). The drain
/// flag is the operator's: a registration never sets it (the state keeps an existing one).
pub fn node_spec_from_register(req: pb::RegisterNodeRequest) -> Result<NodeSpec, StateError> {
    let subject = format!("node '{}'", req.id);
    let Some(addresses) = req.addresses else {
        return Err(StateError::invalid(
            subject,
            "addresses",
            "is missing; a node must say where its data plane and agent listen",
        ));
    };
    let Some(capacity) = req.capacity else {
        return Err(StateError::invalid(
            subject,
            "capacity",
            "is missing; a node must say how much memory and CPU it offers",
        ));
    };
    let spec = NodeSpec {
        id: req.id,
        addresses: NodeAddresses {
            data_http: addresses.data_http,
            data_grpc: addresses.data_grpc,
            agent: addresses.agent,
        },
        capacity: NodeCapacity {
            cpu_millis: capacity.cpu_millis,
            memory_bytes: capacity.memory_bytes,
            gpus: capacity
                .gpus
                .into_iter()
                .map(|g| Gpu {
                    index: g.index,
                    memory_bytes: g.memory_bytes,
                })
                .collect(),
        },
        labels: req.labels.into_iter().collect(),
        drained: false,
    };
    spec.validate()?;
    Ok(spec)
}

// ----- replicas -------------------------------------------------------------------------------

/// The wire enum and the failure reason (empty unless failed).
pub fn replica_state_to_pb(state: &ReplicaState) -> (pb::ReplicaState, String) {
    match state {
        ReplicaState::Pending => (pb::ReplicaState::Pending, String::new()),
        ReplicaState::Loading => (pb::ReplicaState::Loading, String::new()),
        ReplicaState::Ready => (pb::ReplicaState::Ready, String::new()),
        ReplicaState::Failed { reason } => (pb::ReplicaState::Failed, reason.clone()),
        ReplicaState::Unloading => (pb::ReplicaState::Unloading, String::new()),
    }
}

/// A worker's reported state. `UNSPECIFIED` and unknown numbers are refused, naming `state`;
/// a failed state without a reason is left for the state machine to refuse.
pub fn replica_state_from_pb(state: i32, failure_reason: &str) -> Result<ReplicaState, StateError> {
    match pb::ReplicaState::try_from(state) {
        Ok(pb::ReplicaState::Pending) => Ok(ReplicaState::Pending),
        Ok(pb::ReplicaState::Loading) => Ok(ReplicaState::Loading),
        Ok(pb::ReplicaState::Ready) => Ok(ReplicaState::Ready),
        Ok(pb::ReplicaState::Failed) => Ok(ReplicaState::Failed {
            reason: failure_reason.to_string(),
        }),
        Ok(pb::ReplicaState::Unloading) => Ok(ReplicaState::Unloading),
        Ok(pb::ReplicaState::Unspecified) => Err(StateError::invalid(
            "replica report",
            "state",
            "is unspecified; send LOADING, READY, FAILED or UNLOADING",
        )),
        Err(_) => Err(StateError::invalid(
            "replica report",
            "state",
            format!("{state} is not a known replica state"),
        )),
    }
}

pub fn replica_to_pb(replica: &Replica) -> pb::Replica {
    let (state, failure_reason) = replica_state_to_pb(&replica.state);
    pb::Replica {
        id: replica.id,
        model: replica.model.clone(),
        version: replica.version,
        node: replica.node.clone(),
        state: state as i32,
        failure_reason,
        measured_memory_bytes: replica.measured_memory_bytes.unwrap_or(0),
        placement_reason: replica.placement_reason.clone(),
        gpus: replica.gpus.clone(),
        measured_gpu_memory_bytes: replica.measured_gpu_memory_bytes.unwrap_or(0),
    }
}

// ----- the whole state ------------------------------------------------------------------------

/// Every model, node and replica, each list in key order.
pub fn snapshot_to_pb(state: &ClusterState) -> pb::StateSnapshot {
    pb::StateSnapshot {
        models: state.models().values().map(model_to_pb).collect(),
        nodes: state.nodes().values().map(node_to_pb).collect(),
        replicas: state.replicas().values().map(replica_to_pb).collect(),
    }
}

// ----- placement decisions --------------------------------------------------------------------

/// A plan as decisions: additions, then removals (their version and node looked up in
/// `state`), then what could not be placed.
pub fn plan_to_decisions(plan: &Plan, state: &ClusterState) -> Vec<pb::PlacementDecision> {
    let adds = plan.add.iter().map(|a| pb::PlacementDecision {
        action: "add".into(),
        version: a.version,
        node: a.node.clone(),
        rule: a.reason.rule().into(),
        explanation: a.explanation(),
        gpus: a.gpus.clone(),
        ..Default::default()
    });
    let removes = plan.remove.iter().map(|r| {
        let replica = state.replica(r.replica);
        pb::PlacementDecision {
            action: "remove".into(),
            version: replica.map_or(0, |x| x.version),
            node: replica.map(|x| x.node.clone()).unwrap_or_default(),
            replica: r.replica,
            rule: r.reason.rule().into(),
            explanation: r.reason.to_string(),
            ..Default::default()
        }
    });
    let unplaced = plan.unplaced.iter().map(|u| pb::PlacementDecision {
        action: "unplaced".into(),
        version: u.version,
        missing: u.missing,
        rule: u.reason.rule().into(),
        explanation: u.reason.to_string(),
        ..Default::default()
    });
    adds.chain(removes).chain(unplaced).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Command;

    fn spec(policy: VersionPolicy) -> ModelSpec {
        ModelSpec {
            name: "resnet50".into(),
            source: "file:///models/resnet50".into(),
            version_policy: policy,
            config_override: Some(r#"{"max_batch_size":8}"#.into()),
            min_replicas: 1,
            max_replicas: 3,
            resources: Resources {
                cpu_millis: 500,
                memory_bytes: 1 << 30,
                gpus: 1,
                gpu_memory_bytes: 2 << 30,
            },
            labels: [("team".to_string(), "vision".to_string())].into(),
            available_versions: vec![1, 2, 3],
            traffic: Default::default(),
        }
    }

    fn node_req(id: &str) -> pb::RegisterNodeRequest {
        pb::RegisterNodeRequest {
            id: id.into(),
            addresses: Some(pb::NodeAddresses {
                data_http: format!("{id}:8000"),
                data_grpc: format!("{id}:8001"),
                agent: format!("{id}:8003"),
            }),
            capacity: Some(pb::NodeCapacity {
                cpu_millis: 8000,
                memory_bytes: 16 << 30,
                gpus: vec![pb::Gpu {
                    index: 0,
                    memory_bytes: 80 << 30,
                }],
            }),
            labels: [("zone".to_string(), "a".to_string())].into(),
        }
    }

    fn invalid_field(e: StateError) -> String {
        match e {
            StateError::Invalid { field, .. } => field,
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    #[test]
    fn models_round_trip_for_every_policy() {
        for policy in [
            VersionPolicy::Latest { n: 2 },
            VersionPolicy::All,
            VersionPolicy::Specific {
                versions: vec![1, 3],
            },
        ] {
            let s = spec(policy);
            assert_eq!(model_from_pb(model_to_pb(&s)).unwrap(), s);
        }
        let mut s = spec(VersionPolicy::All);
        s.config_override = None;
        let pb = model_to_pb(&s);
        assert_eq!(pb.config_override, "");
        assert_eq!(model_from_pb(pb).unwrap(), s);
    }

    #[test]
    fn client_models_get_defaults() {
        let m = pb::Model {
            name: "m".into(),
            source: "s3://bucket/m".into(),
            min_replicas: 1,
            max_replicas: 1,
            ..Default::default()
        };
        let s = model_from_pb(m.clone()).unwrap();
        assert_eq!(s.version_policy, VersionPolicy::Latest { n: 1 });
        assert_eq!(s.resources, Resources::default());
        assert_eq!(s.config_override, None);
        let empty_oneof = pb::Model {
            version_policy: Some(pb::VersionPolicy { policy: None }),
            ..m
        };
        assert_eq!(
            model_from_pb(empty_oneof).unwrap().version_policy,
            VersionPolicy::Latest { n: 1 }
        );
    }

    #[test]
    fn bad_client_models_name_the_field() {
        let mut m = model_to_pb(&spec(VersionPolicy::All));
        m.version_policy = Some(version_policy_to_pb(&VersionPolicy::Latest { n: 0 }));
        assert_eq!(
            invalid_field(model_from_pb(m.clone()).unwrap_err()),
            "version_policy"
        );
        m.version_policy = None;
        m.source = "models/resnet".into();
        assert_eq!(
            invalid_field(model_from_pb(m.clone()).unwrap_err()),
            "source"
        );
        m.source = "file:///m".into();
        m.config_override = "[1]".into();
        assert_eq!(
            invalid_field(model_from_pb(m.clone()).unwrap_err()),
            "config_override"
        );
        m.config_override.clear();
        m.min_replicas = 4;
        assert_eq!(
            invalid_field(model_from_pb(m.clone()).unwrap_err()),
            "max_replicas"
        );
        m.name = "bad name".into();
        assert_eq!(invalid_field(model_from_pb(m).unwrap_err()), "name");
    }

    #[test]
    fn nodes_convert_from_registration_and_to_pb() {
        let spec = node_spec_from_register(node_req("n1")).unwrap();
        assert!(!spec.drained);
        let node = Node {
            spec: spec.clone(),
            status: NodeStatus::Down,
        };
        let pb = node_to_pb(&node);
        assert_eq!(pb.status, pb::NodeStatus::Down as i32);
        // Back through a registration: the same spec.
        let again = node_spec_from_register(pb::RegisterNodeRequest {
            id: pb.id,
            addresses: pb.addresses,
            capacity: pb.capacity,
            labels: pb.labels,
        })
        .unwrap();
        assert_eq!(again, spec);

        let mut r = node_req("n1");
        r.addresses = None;
        assert_eq!(
            invalid_field(node_spec_from_register(r).unwrap_err()),
            "addresses"
        );
        let mut r = node_req("n1");
        r.capacity = None;
        assert_eq!(
            invalid_field(node_spec_from_register(r).unwrap_err()),
            "capacity"
        );
        let mut r = node_req("n1");
        r.addresses.as_mut().unwrap().data_http.clear();
        assert_eq!(
            invalid_field(node_spec_from_register(r).unwrap_err()),
            "addresses.data_http"
        );
    }

    #[test]
    fn replica_states_round_trip() {
        for state in [
            ReplicaState::Pending,
            ReplicaState::Loading,
            ReplicaState::Ready,
            ReplicaState::Failed {
                reason: "out of memory".into(),
            },
            ReplicaState::Unloading,
        ] {
            let (wire, reason) = replica_state_to_pb(&state);
            assert_eq!(replica_state_from_pb(wire as i32, &reason).unwrap(), state);
        }
        assert_eq!(
            invalid_field(replica_state_from_pb(0, "").unwrap_err()),
            "state"
        );
        assert_eq!(
            invalid_field(replica_state_from_pb(42, "").unwrap_err()),
            "state"
        );
    }

    #[test]
    fn snapshot_lists_everything_in_key_order() {
        let mut s = ClusterState::new();
        s.apply(Command::UpsertModel(spec(VersionPolicy::All)))
            .unwrap();
        for id in ["n2", "n1"] {
            s.apply(Command::RegisterNode(
                node_spec_from_register(node_req(id)).unwrap(),
            ))
            .unwrap();
        }
        s.apply(Command::AddReplica {
            model: "resnet50".into(),
            version: 1,
            node: "n2".into(),
            reason: "new model".into(),
            gpus: vec![0],
        })
        .unwrap();
        s.apply(Command::SetReplicaState {
            id: 1,
            state: ReplicaState::Failed {
                reason: "boom".into(),
            },
            measured_memory_bytes: Some(7),
            measured_gpu_memory_bytes: Some(5),
        })
        .unwrap();
        let snap = snapshot_to_pb(&s);
        assert_eq!(snap.models.len(), 1);
        let ids: Vec<_> = snap.nodes.iter().map(|n| n.id.as_str()).collect();
        assert_eq!(ids, ["n1", "n2"]);
        let r = &snap.replicas[0];
        assert_eq!(r.state, pb::ReplicaState::Failed as i32);
        assert_eq!(r.failure_reason, "boom");
        assert_eq!(r.measured_memory_bytes, 7);
        assert_eq!(r.placement_reason, "new model");
        assert_eq!(r.gpus, [0]);
        assert_eq!(r.measured_gpu_memory_bytes, 5);
    }
}
