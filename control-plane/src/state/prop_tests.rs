//! Random command sequences, valid and invalid, checked against the state machine's
//! invariants after every step. A tiny xorshift generator keeps runs reproducible: a failure
//! names its seed and step.

use std::collections::BTreeSet;

use nereid_test_support::Rng;

use super::*;
use crate::testing::{model, node};

const STEPS: usize = 2_000;
const SEEDS: [u64; 4] = [1, 0x9e37_79b9_7f4a_7c15, 42, 0xdead_beef];

/// Names mostly valid and colliding (so commands interact), some invalid.
const MODELS: [&str; 3] = ["a", "b", "c"];
const BAD_MODELS: [&str; 2] = ["", "bad/name"];
const NODES: [&str; 3] = ["n1", "n2", "n3"];
const BAD_NODES: [&str; 2] = ["-bad", "n9"];

fn random_state(rng: &mut Rng) -> ReplicaState {
    match rng.below(5) {
        0 => ReplicaState::Pending,
        1 => ReplicaState::Loading,
        2 => ReplicaState::Ready,
        3 => ReplicaState::Failed {
            reason: if rng.chance(90) {
                "oom".into()
            } else {
                String::new()
            },
        },
        _ => ReplicaState::Unloading,
    }
}

fn random_command(rng: &mut Rng, state: &ClusterState) -> Command {
    let model_name = if rng.chance(92) {
        rng.pick(&MODELS)
    } else {
        rng.pick(&BAD_MODELS)
    }
    .to_string();
    let node_id = if rng.chance(92) {
        rng.pick(&NODES)
    } else {
        rng.pick(&BAD_NODES)
    }
    .to_string();
    // Mostly ids that exist, sometimes one that does not.
    let replica_id = if !state.replicas.is_empty() && rng.chance(85) {
        let ids: Vec<u64> = state.replicas.keys().copied().collect();
        *rng.pick(&ids)
    } else {
        rng.below(state.next_replica_id + 2)
    };
    match rng.below(24) {
        0..=2 => {
            let mut spec = model(&model_name);
            spec.min_replicas = rng.below(3) as u32;
            spec.max_replicas = rng.below(3) as u32;
            if rng.chance(10) {
                spec.source = "no-scheme".into();
            }
            if rng.chance(20) {
                spec.version_policy = VersionPolicy::Specific {
                    versions: vec![1 + rng.below(2) as i64],
                };
            }
            Command::UpsertModel(spec)
        }
        3 => Command::DeleteModel { name: model_name },
        4 if rng.chance(50) => Command::SetTraffic {
            name: model_name,
            weights: (1..=rng.below(3) as i64)
                .map(|v| (v, rng.below(3) as u32))
                .collect(),
        },
        4 => Command::ScaleModel {
            name: model_name,
            min: rng.below(3) as u32,
            max: rng.below(3) as u32,
        },
        5 | 6 => {
            let mut spec = node(&node_id);
            spec.drained = rng.chance(10);
            spec.capacity.memory_bytes = rng.below(3) << 30;
            Command::RegisterNode(spec)
        }
        7 => Command::RemoveNode { id: node_id },
        8 => Command::SetNodeDrained {
            id: node_id,
            drained: rng.chance(25),
        },
        9 => Command::SetNodeStatus {
            id: node_id,
            status: if rng.chance(25) {
                NodeStatus::Down
            } else {
                NodeStatus::Up
            },
        },
        10..=15 => Command::AddReplica {
            model: model_name,
            version: if rng.chance(95) {
                1 + rng.below(2) as i64
            } else {
                0
            },
            node: node_id,
            reason: "random".into(),
            // Mostly none; sometimes a GPU the node may lack or the model may not want.
            gpus: if rng.chance(10) {
                vec![rng.below(2) as u32]
            } else {
                Vec::new()
            },
        },
        16..=21 => Command::SetReplicaState {
            id: replica_id,
            state: random_state(rng),
            measured_memory_bytes: if rng.chance(30) {
                Some(rng.below(4) << 20)
            } else {
                None
            },
            measured_gpu_memory_bytes: None,
        },
        _ => Command::RemoveReplica { id: replica_id },
    }
}

fn check_invariants(s: &ClusterState, context: &str) {
    let mut live_slots = BTreeSet::new();
    for (id, r) in &s.replicas {
        assert_eq!(*id, r.id, "{context}: replica keyed by the wrong id");
        assert!(
            *id < s.next_replica_id,
            "{context}: replica {id} beyond the id counter"
        );
        assert!(
            s.nodes.contains_key(&r.node),
            "{context}: replica {id} on missing node '{}'",
            r.node
        );
        assert!(
            s.models.contains_key(&r.model) || r.state == ReplicaState::Unloading,
            "{context}: replica {id} of missing model '{}' is {}",
            r.model,
            r.state
        );
        if r.state != ReplicaState::Unloading {
            assert!(
                live_slots.insert((r.model.clone(), r.version, r.node.clone())),
                "{context}: two live replicas of '{}' v{} on '{}'",
                r.model,
                r.version,
                r.node
            );
        }
    }
    for m in s.models.values() {
        assert!(
            m.validate_traffic(&m.traffic).is_ok(),
            "{context}: model '{}' holds an invalid traffic split {:?}",
            m.name,
            m.traffic
        );
    }
    let json = serde_json::to_string(s).expect("state serializes");
    let back: ClusterState = serde_json::from_str(&json).expect("state deserializes");
    assert_eq!(&back, s, "{context}: serde round trip differs");
}

#[derive(Default)]
struct Tally {
    changed: usize,
    unchanged: usize,
    added: usize,
    not_found: usize,
    conflict: usize,
    invalid: usize,
}

fn run(
    seed: u64,
) -> (
    Vec<Command>,
    Vec<Result<Applied, StateError>>,
    ClusterState,
    Tally,
) {
    let mut rng = Rng::from_state(seed);
    let mut s = ClusterState::new();
    let mut commands = Vec::with_capacity(STEPS);
    let mut results = Vec::with_capacity(STEPS);
    let mut tally = Tally::default();
    for step in 0..STEPS {
        let cmd = random_command(&mut rng, &s);
        let before = s.clone();
        let result = s.apply(cmd.clone());
        let context = format!("seed {seed:#x} step {step} {cmd:?} -> {result:?}");
        match &result {
            Ok(applied) => {
                assert_eq!(applied.revision, s.revision, "{context}");
                if applied.changed {
                    tally.changed += 1;
                    assert_eq!(s.revision, before.revision + 1, "{context}");
                    assert_ne!(s, before, "{context}: 'changed' but equal");
                } else {
                    tally.unchanged += 1;
                    assert_eq!(s, before, "{context}: no-op changed the state");
                }
                match (&cmd, applied.replica_id) {
                    (Command::AddReplica { .. }, Some(id)) => {
                        tally.added += 1;
                        assert!(!before.replicas.contains_key(&id), "{context}: id reused");
                        assert_eq!(s.replicas[&id].state, ReplicaState::Pending, "{context}");
                    }
                    (Command::AddReplica { .. }, None) => panic!("{context}: no id"),
                    (_, Some(_)) => panic!("{context}: unexpected id"),
                    (_, None) => {}
                }
            }
            Err(e) => {
                assert_eq!(s, before, "{context}: refused command changed the state");
                match e {
                    StateError::NotFound { .. } => tally.not_found += 1,
                    StateError::Conflict(_) => tally.conflict += 1,
                    StateError::Invalid { .. } => tally.invalid += 1,
                }
            }
        }
        check_invariants(&s, &context);
        commands.push(cmd);
        results.push(result);
    }
    (commands, results, s, tally)
}

#[test]
fn random_commands_keep_invariants() {
    for seed in SEEDS {
        let (_, _, state, t) = run(seed);
        // The generator must exercise every outcome, or the checks above prove little.
        assert!(
            t.changed > 400,
            "seed {seed:#x}: only {} changes",
            t.changed
        );
        assert!(
            t.added > 50,
            "seed {seed:#x}: only {} replicas added",
            t.added
        );
        assert!(t.unchanged > 0, "seed {seed:#x}: no idempotent repeats");
        assert!(
            t.not_found > 0 && t.conflict > 0 && t.invalid > 0,
            "seed {seed:#x}: not every error class seen"
        );
        eprintln!(
            "seed {seed:#x}: {} changed, {} no-ops, {} added, {} not found, {} conflicts, \
             {} invalid; final revision {}",
            t.changed, t.unchanged, t.added, t.not_found, t.conflict, t.invalid, state.revision
        );
    }
}

#[test]
fn same_commands_give_same_state() {
    for seed in SEEDS {
        let (commands, results, state, _) = run(seed);
        let mut replay = ClusterState::new();
        let replayed: Vec<_> = commands.into_iter().map(|c| replay.apply(c)).collect();
        assert_eq!(replayed, results, "seed {seed:#x}: outcomes differ");
        assert_eq!(replay, state, "seed {seed:#x}: states differ");
        assert_eq!(
            serde_json::to_string(&replay).unwrap(),
            serde_json::to_string(&state).unwrap(),
            "seed {seed:#x}: snapshots differ byte for byte"
        );
    }
}

#[test]
fn random_walks_reach_ready_replicas() {
    // Guards the generator: a walk that never reaches Ready would leave the transition
    // checks above untested on their most important path.
    let ready_seen = SEEDS.iter().any(|&seed| {
        let mut rng = Rng::from_state(seed);
        let mut s = ClusterState::new();
        (0..STEPS).any(|_| {
            let cmd = random_command(&mut rng, &s);
            let _ = s.apply(cmd);
            s.replicas.values().any(|r| r.state == ReplicaState::Ready)
        })
    });
    assert!(ready_seen);
}
