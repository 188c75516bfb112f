//! One test per command and per refusal; the invariants over random sequences are in
//! `prop_tests`.

use super::model::MAX_TRAFFIC_WEIGHT;
use super::*;
use crate::testing::{model, node};

#[test]
fn served_versions_apply_the_policy_to_the_available_folders() {
    let mut m = model("m");
    m.available_versions = vec![3, 1, 2];
    m.version_policy = VersionPolicy::Latest { n: 2 };
    assert_eq!(m.served_versions(), vec![2, 3]);
    m.version_policy = VersionPolicy::All;
    assert_eq!(m.served_versions(), vec![1, 2, 3]);
    m.version_policy = VersionPolicy::Specific {
        versions: vec![3, 7],
    };
    assert_eq!(m.served_versions(), vec![3], "7 is not in the source");
    m.available_versions.clear();
    assert_eq!(
        m.served_versions(),
        vec![3, 7],
        "unknown source: trust the list"
    );
    m.version_policy = VersionPolicy::Latest { n: 1 };
    assert!(m.served_versions().is_empty());
}

fn ok(state: &mut ClusterState, cmd: Command) -> Applied {
    match state.apply(cmd.clone()) {
        Ok(applied) => applied,
        Err(e) => panic!("{cmd:?} refused: {e}"),
    }
}

/// Applies a command that must be refused and checks that it changed nothing.
fn refused(state: &mut ClusterState, cmd: Command) -> StateError {
    let before = state.clone();
    let err = match state.apply(cmd.clone()) {
        Ok(applied) => panic!("{cmd:?} accepted: {applied:?}"),
        Err(e) => e,
    };
    assert_eq!(*state, before, "refused {cmd:?} changed the state");
    err
}

fn set(id: u64, state: ReplicaState) -> Command {
    Command::SetReplicaState {
        id,
        state,
        measured_memory_bytes: None,
        measured_gpu_memory_bytes: None,
    }
}

fn failed(reason: &str) -> ReplicaState {
    ReplicaState::Failed {
        reason: reason.to_string(),
    }
}

/// A state with model `m`, nodes `n1` and `n2`, and replica 1 of `m` v1 `Pending` on `n1`.
fn with_replica() -> (ClusterState, u64) {
    let mut s = ClusterState::new();
    ok(&mut s, Command::UpsertModel(model("m")));
    ok(&mut s, Command::RegisterNode(node("n1")));
    ok(&mut s, Command::RegisterNode(node("n2")));
    let id = ok(
        &mut s,
        Command::AddReplica {
            model: "m".into(),
            version: 1,
            node: "n1".into(),
            reason: String::new(),
            gpus: Vec::new(),
        },
    )
    .replica_id
    .expect("AddReplica returns an id");
    (s, id)
}

fn add(model: &str, version: i64, node: &str) -> Command {
    Command::AddReplica {
        model: model.into(),
        version,
        node: node.into(),
        reason: "test".into(),
        gpus: Vec::new(),
    }
}

#[test]
fn upsert_model_creates_replaces_and_is_idempotent() {
    let mut s = ClusterState::new();
    assert_eq!(s.revision(), 0);
    let a = ok(&mut s, Command::UpsertModel(model("resnet50")));
    assert_eq!((a.revision, a.changed), (1, true));
    assert_eq!(s.model("resnet50"), Some(&model("resnet50")));

    let again = ok(&mut s, Command::UpsertModel(model("resnet50")));
    assert_eq!((again.revision, again.changed), (1, false));

    let mut updated = model("resnet50");
    updated.source = "s3://bucket/resnet50".into();
    let b = ok(&mut s, Command::UpsertModel(updated.clone()));
    assert_eq!((b.revision, b.changed), (2, true));
    assert_eq!(s.model("resnet50"), Some(&updated));
}

#[test]
fn upsert_model_rejects_bad_fields_naming_them() {
    let mut s = ClusterState::new();
    let cases: Vec<(ModelSpec, &str)> = vec![
        (model(""), "model: name must not be empty"),
        (
            model("-x"),
            "model: name must start and end with a letter or digit",
        ),
        (model("a/b"), "model: name contains '/'"),
        (model(&"x".repeat(64)), "is 64 characters long"),
        (
            ModelSpec {
                source: "/models/m".into(),
                ..model("m")
            },
            "model 'm': source '/models/m' has no scheme",
        ),
        (
            ModelSpec {
                source: "file://".into(),
                ..model("m")
            },
            "model 'm': source 'file://' has no location",
        ),
        (
            ModelSpec {
                source: "1x://a".into(),
                ..model("m")
            },
            "invalid scheme '1x'",
        ),
        (
            ModelSpec {
                min_replicas: 2,
                max_replicas: 1,
                ..model("m")
            },
            "model 'm': max_replicas 1 is below min_replicas 2",
        ),
        (
            ModelSpec {
                version_policy: VersionPolicy::Latest { n: 0 },
                ..model("m")
            },
            "model 'm': version_policy latest 0",
        ),
        (
            ModelSpec {
                version_policy: VersionPolicy::Specific { versions: vec![] },
                ..model("m")
            },
            "specific lists no versions",
        ),
        (
            ModelSpec {
                version_policy: VersionPolicy::Specific {
                    versions: vec![1, 0],
                },
                ..model("m")
            },
            "version 0 is not a positive",
        ),
        (
            ModelSpec {
                version_policy: VersionPolicy::Specific {
                    versions: vec![2, 2],
                },
                ..model("m")
            },
            "lists a version twice",
        ),
        (
            ModelSpec {
                config_override: Some("{not json".into()),
                ..model("m")
            },
            "model 'm': config_override is not valid JSON",
        ),
        (
            ModelSpec {
                config_override: Some("[1]".into()),
                ..model("m")
            },
            "model 'm': config_override must be a JSON object",
        ),
    ];
    for (spec, want) in cases {
        let err = refused(&mut s, Command::UpsertModel(spec.clone()));
        assert!(
            matches!(err, StateError::Invalid { .. }),
            "{spec:?}: expected Invalid, got {err:?}"
        );
        assert!(
            err.to_string().contains(want),
            "{spec:?}: message {err} lacks {want:?}"
        );
    }
    let mut fine = model("densenet_onnx.v2");
    fine.config_override = Some(r#"{"max_batch_size": 8}"#.into());
    fine.version_policy = VersionPolicy::Specific {
        versions: vec![1, 3],
    };
    ok(&mut s, Command::UpsertModel(fine));
}

#[test]
fn delete_model_marks_replicas_unloading_and_keeps_them() {
    let (mut s, id) = with_replica();
    let other = ok(&mut s, Command::UpsertModel(model("other")));
    let _ = other;
    let keep = ok(&mut s, add("other", 1, "n1")).replica_id.unwrap();
    let rev = s.revision();
    let a = ok(&mut s, Command::DeleteModel { name: "m".into() });
    assert_eq!(a.revision, rev + 1);
    assert!(s.model("m").is_none());
    assert_eq!(s.replica(id).unwrap().state, ReplicaState::Unloading);
    assert_eq!(s.replica(keep).unwrap().state, ReplicaState::Pending);
    // Unloading is terminal: a late report cannot revive it.
    let err = refused(&mut s, set(id, ReplicaState::Ready));
    assert!(matches!(err, StateError::Conflict(_)), "{err:?}");
    ok(&mut s, Command::RemoveReplica { id });
    assert!(s.replica(id).is_none());
}

#[test]
fn delete_missing_model_is_not_found() {
    let mut s = ClusterState::new();
    let err = refused(
        &mut s,
        Command::DeleteModel {
            name: "nope".into(),
        },
    );
    assert_eq!(
        err,
        StateError::NotFound {
            kind: EntityKind::Model,
            name: "nope".into()
        }
    );
    assert_eq!(err.to_string(), "model 'nope' not found");
}

#[test]
fn scale_model_updates_bounds_and_validates() {
    let mut s = ClusterState::new();
    ok(&mut s, Command::UpsertModel(model("m")));
    let scale = |min, max| Command::ScaleModel {
        name: "m".into(),
        min,
        max,
    };
    let a = ok(&mut s, scale(3, 5));
    assert!(a.changed);
    assert_eq!(
        (
            s.model("m").unwrap().min_replicas,
            s.model("m").unwrap().max_replicas
        ),
        (3, 5)
    );
    assert!(!ok(&mut s, scale(3, 5)).changed);
    let err = refused(&mut s, scale(2, 1));
    assert_eq!(
        err.to_string(),
        "model 'm': max_replicas 1 is below min_replicas 2"
    );
    let err = refused(
        &mut s,
        Command::ScaleModel {
            name: "x".into(),
            min: 1,
            max: 1,
        },
    );
    assert!(matches!(
        err,
        StateError::NotFound {
            kind: EntityKind::Model,
            ..
        }
    ));
}

#[test]
fn set_traffic_validates_versions_and_weights() {
    let mut s = ClusterState::new();
    let mut m = model("m");
    m.available_versions = vec![1, 2, 3];
    m.version_policy = VersionPolicy::Latest { n: 2 };
    ok(&mut s, Command::UpsertModel(m));
    let traffic = |weights: &[(i64, u32)]| Command::SetTraffic {
        name: "m".into(),
        weights: weights.iter().copied().collect(),
    };
    assert!(ok(&mut s, traffic(&[(2, 90), (3, 10)])).changed);
    assert_eq!(s.model("m").unwrap().traffic, [(2, 90), (3, 10)].into());
    assert!(!ok(&mut s, traffic(&[(2, 90), (3, 10)])).changed);
    assert!(
        ok(&mut s, traffic(&[(2, 0), (3, 1)])).changed,
        "a zero weight keeps a version out of the split"
    );

    let err = refused(&mut s, traffic(&[(1, 50), (3, 50)]));
    assert_eq!(
        err.to_string(),
        "model 'm': traffic version 1 is not served by the model's version policy (served: 2, 3)"
    );
    let err = refused(&mut s, traffic(&[(2, 0), (3, 0)]));
    assert!(err.to_string().contains("every weight is 0"), "{err}");
    let err = refused(&mut s, traffic(&[(2, MAX_TRAFFIC_WEIGHT + 1)]));
    assert!(err.to_string().contains("above 1000000"), "{err}");
    let err = refused(
        &mut s,
        Command::SetTraffic {
            name: "x".into(),
            weights: Default::default(),
        },
    );
    assert!(matches!(err, StateError::NotFound { .. }));

    assert!(ok(&mut s, traffic(&[])).changed, "empty clears the split");
    assert!(s.model("m").unwrap().traffic.is_empty());

    // A redeploy whose policy no longer serves a split version is refused with the field.
    ok(&mut s, traffic(&[(2, 1)]));
    let mut narrowed = s.model("m").unwrap().clone();
    narrowed.version_policy = VersionPolicy::Latest { n: 1 };
    let err = refused(&mut s, Command::UpsertModel(narrowed));
    assert!(err.to_string().contains("traffic version 2"), "{err}");
}

#[test]
fn register_node_adds_updates_and_keeps_drain_flag() {
    let mut s = ClusterState::new();
    ok(&mut s, Command::RegisterNode(node("n1")));
    let n = s.node("n1").unwrap();
    assert_eq!(n.status, NodeStatus::Up);
    assert!(n.schedulable());
    assert!(!ok(&mut s, Command::RegisterNode(node("n1"))).changed);

    ok(
        &mut s,
        Command::SetNodeDrained {
            id: "n1".into(),
            drained: true,
        },
    );
    ok(
        &mut s,
        Command::SetNodeStatus {
            id: "n1".into(),
            status: NodeStatus::Down,
        },
    );
    let mut restarted = node("n1");
    restarted.capacity.memory_bytes = 64 << 30;
    assert!(ok(&mut s, Command::RegisterNode(restarted)).changed);
    let n = s.node("n1").unwrap();
    assert_eq!(n.status, NodeStatus::Up, "a registration means it is alive");
    assert!(n.spec.drained, "a worker restart must not undrain it");
    assert_eq!(n.spec.capacity.memory_bytes, 64 << 30);
}

#[test]
fn register_node_rejects_bad_fields() {
    let mut s = ClusterState::new();
    let err = refused(&mut s, Command::RegisterNode(node("")));
    assert_eq!(err.to_string(), "node: id must not be empty");
    let mut bad = node("n1");
    bad.addresses.data_grpc = " ".into();
    let err = refused(&mut s, Command::RegisterNode(bad));
    assert_eq!(
        err.to_string(),
        "node 'n1': addresses.data_grpc must not be empty"
    );
    let mut bad = node("n1");
    bad.capacity.gpus.push(Gpu {
        index: 0,
        memory_bytes: 1,
    });
    let err = refused(&mut s, Command::RegisterNode(bad));
    assert_eq!(
        err.to_string(),
        "node 'n1': capacity.gpus lists GPU index 0 twice"
    );
}

#[test]
fn remove_node_refuses_live_replicas_and_drops_dead_ones() {
    let (mut s, id) = with_replica();
    let err = refused(&mut s, Command::RemoveNode { id: "n1".into() });
    assert!(matches!(err, StateError::Conflict(_)), "{err:?}");
    assert!(
        err.to_string().contains("node 'n1' still holds replicas 1"),
        "{err}"
    );

    ok(&mut s, set(id, failed("OOM")));
    ok(&mut s, Command::RemoveNode { id: "n1".into() });
    assert!(s.node("n1").is_none());
    assert!(s.replica(id).is_none(), "its failed replica leaves with it");

    let err = refused(&mut s, Command::RemoveNode { id: "n1".into() });
    assert!(matches!(
        err,
        StateError::NotFound {
            kind: EntityKind::Node,
            ..
        }
    ));
}

#[test]
fn drain_and_status_are_idempotent_and_need_the_node() {
    let mut s = ClusterState::new();
    ok(&mut s, Command::RegisterNode(node("n1")));
    let drain = |drained| Command::SetNodeDrained {
        id: "n1".into(),
        drained,
    };
    assert!(ok(&mut s, drain(true)).changed);
    assert!(!ok(&mut s, drain(true)).changed);
    assert!(ok(&mut s, drain(false)).changed);
    let down = Command::SetNodeStatus {
        id: "n1".into(),
        status: NodeStatus::Down,
    };
    assert!(ok(&mut s, down.clone()).changed);
    assert!(!ok(&mut s, down).changed);
    assert_eq!(s.node("n1").unwrap().status, NodeStatus::Down);
    for cmd in [
        Command::SetNodeDrained {
            id: "x".into(),
            drained: true,
        },
        Command::SetNodeStatus {
            id: "x".into(),
            status: NodeStatus::Up,
        },
    ] {
        let err = refused(&mut s, cmd);
        assert_eq!(err.to_string(), "node 'x' not found");
    }
}

#[test]
fn add_replica_allocates_increasing_ids() {
    let (mut s, first) = with_replica();
    assert_eq!(first, 1);
    let second = ok(&mut s, add("m", 1, "n2")).replica_id.unwrap();
    let third = ok(&mut s, add("m", 2, "n1")).replica_id.unwrap();
    assert_eq!((second, third), (2, 3));
    let r = s.replica(second).unwrap();
    assert_eq!(
        (r.model.as_str(), r.version, r.node.as_str(), &r.state),
        ("m", 1, "n2", &ReplicaState::Pending)
    );
    // Ids are never reused, even after a removal.
    ok(&mut s, Command::RemoveReplica { id: third });
    assert_eq!(ok(&mut s, add("m", 3, "n1")).replica_id, Some(4));
}

#[test]
fn add_replica_refusals() {
    let (mut s, id) = with_replica();
    let err = refused(&mut s, add("x", 1, "n1"));
    assert_eq!(err.to_string(), "model 'x' not found");
    let err = refused(&mut s, add("m", 1, "x"));
    assert_eq!(err.to_string(), "node 'x' not found");
    let err = refused(&mut s, add("m", 0, "n2"));
    assert!(
        matches!(err, StateError::Invalid { ref field, .. } if field == "version"),
        "{err:?}"
    );

    let err = refused(&mut s, add("m", 1, "n1"));
    assert!(
        err.to_string()
            .contains("already has replica 1 on node 'n1'"),
        "{err}"
    );
    // A failed replica still occupies its slot; an unloading one does not.
    ok(&mut s, set(id, failed("crash")));
    refused(&mut s, add("m", 1, "n1"));
    ok(&mut s, set(id, ReplicaState::Unloading));
    ok(&mut s, add("m", 1, "n1"));

    ok(
        &mut s,
        Command::SetNodeDrained {
            id: "n2".into(),
            drained: true,
        },
    );
    let err = refused(&mut s, add("m", 1, "n2"));
    assert!(err.to_string().contains("node 'n2' is drained"), "{err}");
    ok(
        &mut s,
        Command::SetNodeDrained {
            id: "n2".into(),
            drained: false,
        },
    );
    ok(
        &mut s,
        Command::SetNodeStatus {
            id: "n2".into(),
            status: NodeStatus::Down,
        },
    );
    let err = refused(&mut s, add("m", 1, "n2"));
    assert!(err.to_string().contains("node 'n2' is down"), "{err}");

    let mut pinned = model("pinned");
    pinned.version_policy = VersionPolicy::Specific { versions: vec![2] };
    ok(&mut s, Command::UpsertModel(pinned));
    let err = refused(&mut s, add("pinned", 1, "n1"));
    assert!(matches!(err, StateError::Conflict(_)), "{err:?}");
    ok(&mut s, add("pinned", 2, "n1"));
}

#[test]
fn replica_lifecycle_happy_path_with_measured_memory() {
    let (mut s, id) = with_replica();
    ok(&mut s, set(id, ReplicaState::Loading));
    let a = ok(
        &mut s,
        Command::SetReplicaState {
            id,
            state: ReplicaState::Ready,
            measured_memory_bytes: Some(123),
            measured_gpu_memory_bytes: None,
        },
    );
    assert!(a.changed);
    assert_eq!(
        s.ready_replicas("m").map(|r| r.id).collect::<Vec<_>>(),
        vec![id]
    );
    // A repeated report is a no-op and keeps the measurement.
    assert!(!ok(&mut s, set(id, ReplicaState::Ready)).changed);
    assert_eq!(s.replica(id).unwrap().measured_memory_bytes, Some(123));
    // A new measurement in the same state is a change.
    let a = ok(
        &mut s,
        Command::SetReplicaState {
            id,
            state: ReplicaState::Ready,
            measured_memory_bytes: Some(456),
            measured_gpu_memory_bytes: None,
        },
    );
    assert!(a.changed);
    assert_eq!(s.replica(id).unwrap().measured_memory_bytes, Some(456));
    ok(&mut s, set(id, ReplicaState::Unloading));
    assert_eq!(s.ready_replicas("m").count(), 0);
    ok(&mut s, Command::RemoveReplica { id });
    assert_eq!(s.replicas_of("m").count(), 0);
}

#[test]
fn replica_transition_table() {
    use ReplicaState::*;
    let states = [Pending, Loading, Ready, failed("x"), Unloading];
    let legal = |from: &ReplicaState, to: &ReplicaState| -> bool {
        matches!(
            (from, to),
            (Pending, Loading)
                | (Loading, Ready)
                | (Pending | Loading | Ready | Failed { .. }, Failed { .. })
                | (Ready | Loading | Failed { .. }, Unloading)
        ) || from == to
    };
    for from in &states {
        for to in &states {
            // Drive a fresh replica to `from` through legal steps, then try `to`.
            let (mut s, id) = with_replica();
            let path: &[ReplicaState] = match from {
                Pending => &[],
                Loading => &[Loading],
                Ready => &[Loading, Ready],
                Failed { .. } => &[failed("x")],
                Unloading => &[Loading, Unloading],
            };
            for step in path {
                ok(&mut s, set(id, step.clone()));
            }
            let result = s.clone().apply(set(id, to.clone()));
            assert_eq!(
                result.is_ok(),
                legal(from, to),
                "{from} -> {to}: {result:?}"
            );
            if let Err(e) = result {
                assert!(
                    matches!(e, StateError::Conflict(_)),
                    "{from} -> {to}: {e:?}"
                );
                assert!(
                    e.to_string()
                        .contains(&format!("cannot go from {from} to {to}"))
                );
            }
        }
    }
}

#[test]
fn set_replica_state_refusals() {
    let (mut s, id) = with_replica();
    let err = refused(&mut s, set(99, ReplicaState::Loading));
    assert_eq!(err.to_string(), "replica '99' not found");
    let err = refused(&mut s, set(id, failed(" ")));
    assert_eq!(
        err.to_string(),
        "replica 1: state.reason must say why the replica failed"
    );
}

#[test]
fn remove_replica_refuses_loaded_ones() {
    let (mut s, id) = with_replica();
    ok(&mut s, set(id, ReplicaState::Loading));
    let err = refused(&mut s, Command::RemoveReplica { id });
    assert!(err.to_string().contains("mark it Unloading first"), "{err}");
    ok(&mut s, set(id, ReplicaState::Ready));
    refused(&mut s, Command::RemoveReplica { id });
    let err = refused(&mut s, Command::RemoveReplica { id: 42 });
    assert_eq!(err.to_string(), "replica '42' not found");
    // A pending replica was never loaded and may be removed directly.
    let pending = ok(&mut s, add("m", 1, "n2")).replica_id.unwrap();
    ok(&mut s, Command::RemoveReplica { id: pending });
}

#[test]
fn queries_filter_by_model_node_and_readiness() {
    let (mut s, a) = with_replica();
    ok(&mut s, Command::UpsertModel(model("other")));
    let b = ok(&mut s, add("m", 1, "n2")).replica_id.unwrap();
    let c = ok(&mut s, add("other", 1, "n1")).replica_id.unwrap();
    ok(&mut s, set(b, ReplicaState::Loading));
    ok(&mut s, set(b, ReplicaState::Ready));
    let ids = |it: &mut dyn Iterator<Item = &Replica>| it.map(|r| r.id).collect::<Vec<_>>();
    assert_eq!(ids(&mut s.replicas_of("m")), vec![a, b]);
    assert_eq!(ids(&mut s.replicas_on("n1")), vec![a, c]);
    assert_eq!(ids(&mut s.ready_replicas("m")), vec![b]);
    assert_eq!(ids(&mut s.ready_replicas("other")), Vec::<u64>::new());
}

#[test]
fn state_and_commands_round_trip_through_json() {
    let (mut s, id) = with_replica();
    ok(
        &mut s,
        Command::SetReplicaState {
            id,
            state: failed("CUDA out of memory"),
            measured_memory_bytes: Some(7),
            measured_gpu_memory_bytes: None,
        },
    );
    let json = serde_json::to_string(&s).expect("serialize");
    let back: ClusterState = serde_json::from_str(&json).expect("deserialize");
    assert_eq!(back, s);
    let cmd = Command::UpsertModel(model("m"));
    let back: Command = serde_json::from_str(&serde_json::to_string(&cmd).unwrap()).unwrap();
    assert_eq!(back, cmd);
}

fn add_on_gpus(model: &str, node: &str, gpus: &[u32]) -> Command {
    Command::AddReplica {
        model: model.into(),
        version: 1,
        node: node.into(),
        reason: "test".into(),
        gpus: gpus.to_vec(),
    }
}

#[test]
fn a_replica_records_its_gpus_and_measured_gpu_memory() {
    let mut s = ClusterState::new();
    let mut m = model("llm");
    m.resources.gpus = 2;
    m.resources.gpu_memory_bytes = 4 << 30;
    ok(&mut s, Command::UpsertModel(m));
    let mut n = node("n1");
    n.capacity.gpus.push(Gpu {
        index: 3,
        memory_bytes: 80 << 30,
    });
    ok(&mut s, Command::RegisterNode(n));

    let err = refused(&mut s, add_on_gpus("llm", "n1", &[0]));
    assert!(
        err.to_string()
            .contains("assigns 1 GPU(s) but the model needs 2"),
        "{err}"
    );
    let err = refused(&mut s, add_on_gpus("llm", "n1", &[0, 0]));
    assert!(err.to_string().contains("lists a GPU twice"), "{err}");
    let err = refused(&mut s, add_on_gpus("llm", "n1", &[0, 1]));
    assert!(
        err.to_string()
            .contains("GPU 1 is not one the node registered"),
        "{err}"
    );

    let id = ok(&mut s, add_on_gpus("llm", "n1", &[3, 0]))
        .replica_id
        .unwrap();
    assert_eq!(
        s.replica(id).unwrap().gpus,
        [0, 3],
        "kept in ascending order"
    );

    ok(&mut s, set(id, ReplicaState::Loading));
    let applied = ok(
        &mut s,
        Command::SetReplicaState {
            id,
            state: ReplicaState::Ready,
            measured_memory_bytes: Some(1 << 30),
            measured_gpu_memory_bytes: Some(5 << 30),
        },
    );
    assert!(applied.changed);
    assert_eq!(
        s.replica(id).unwrap().measured_gpu_memory_bytes,
        Some(5 << 30)
    );
    // A later report without a GPU figure keeps it; the same figure again changes nothing.
    assert!(!ok(&mut s, set(id, ReplicaState::Ready)).changed);
    assert_eq!(
        s.replica(id).unwrap().measured_gpu_memory_bytes,
        Some(5 << 30)
    );
}

#[test]
fn a_cpu_model_gets_no_gpus() {
    let mut s = ClusterState::new();
    ok(&mut s, Command::UpsertModel(model("m")));
    ok(&mut s, Command::RegisterNode(node("n1")));
    let err = refused(&mut s, add_on_gpus("m", "n1", &[0]));
    assert!(err.to_string().contains("the model needs 0"), "{err}");
}
