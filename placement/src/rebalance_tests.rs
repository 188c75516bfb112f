//! Rebalancing on small hand-built clusters: when moves start, where they go, the budget, and
//! make-before-break over rounds.

use super::tests::{GIB, model, node, replica};
use super::*;

fn budget(max_moves: u32, in_flight: Vec<Move>) -> Load {
    Load {
        rebalance: Rebalance {
            max_moves,
            in_flight,
        },
        ..Default::default()
    }
}

fn moving(replica: u64, model: &str, from: &str, to: &str) -> Move {
    Move {
        model: model.to_string(),
        version: 1,
        replica,
        from: from.to_string(),
        to: to.to_string(),
    }
}

/// `n` models of one replica each (memory `gib`, 0 = unknown), all ready on node `a`.
fn all_on_a(n: u64, gib: u64) -> (Vec<ModelView>, Vec<CurrentReplica>) {
    let models = (0..n).map(|i| model(&format!("m{i:02}"), 1, gib)).collect();
    let replicas = (0..n)
        .map(|i| replica(i + 1, &format!("m{i:02}"), "a", true))
        .collect();
    (models, replicas)
}

fn moves_of(p: &Plan) -> Vec<(&str, u64, &str)> {
    p.add
        .iter()
        .filter_map(|a| Some((a.model.as_str(), a.moves?, a.node.as_str())))
        .collect()
}

#[test]
fn a_node_that_joined_empty_receives_replicas_within_the_budget() {
    let nodes = [node("a", 16), node("b", 16)];
    let (models, replicas) = all_on_a(12, 0);
    let p = plan(&nodes, &models, &replicas, &budget(2, Vec::new()));
    assert_eq!(moves_of(&p), vec![("m00", 1, "b"), ("m01", 2, "b")]);
    assert!(p.remove.is_empty(), "make-before-break: {:?}", p.remove);
    let Reason::Rebalance { from, to, why } = &p.add[0].reason else {
        panic!("{:?}", p.add[0].reason)
    };
    assert_eq!((from.as_str(), to.as_str()), ("a", "b"));
    assert_eq!(why, "a holds 12 replicas, b holds 0");
    assert_eq!(p.add[0].reason.rule(), "Rebalance");
    assert!(
        p.explain()[0].starts_with("add m00 v1 on b: rebalancing: a replica moves from a to b"),
        "{:?}",
        p.explain()
    );
}

#[test]
fn a_budget_of_zero_turns_rebalancing_off() {
    let nodes = [node("a", 16), node("b", 16)];
    let (models, replicas) = all_on_a(12, 1);
    assert!(plan(&nodes, &models, &replicas, &budget(0, Vec::new())).is_settled());
    assert!(plan(&nodes, &models, &replicas, &Load::default()).is_settled());
}

#[test]
fn skewed_memory_moves_replicas_and_the_target_stays_below_the_source() {
    let nodes = [node("a", 10), node("b", 10)];
    // One 8 GiB replica: moving it would only swap the nodes (b would be as full as a was).
    let big = [model("big", 1, 8)];
    let on_a = [replica(1, "big", "a", true)];
    assert!(plan(&nodes, &big, &on_a, &budget(2, Vec::new())).is_settled());

    // Two 4 GiB replicas: one moves, and the budget is not spent on the second.
    let (models, replicas) = all_on_a(2, 4);
    let p = plan(&nodes, &models, &replicas, &budget(2, Vec::new()));
    assert_eq!(moves_of(&p), vec![("m00", 1, "b")]);
    let Reason::Rebalance { why, .. } = &p.add[0].reason else {
        panic!()
    };
    assert_eq!(
        why,
        "memory 80% used on a, 0% on b: more than 20 points apart"
    );
}

#[test]
fn a_balanced_cluster_makes_no_moves() {
    let nodes = [node("a", 16), node("b", 16)];
    let (models, mut replicas) = all_on_a(11, 0);
    for r in replicas.iter_mut().take(5) {
        r.node = "b".into();
    }
    assert!(plan(&nodes, &models, &replicas, &budget(2, Vec::new())).is_settled());
}

#[test]
fn the_moved_replica_stays_until_its_replacement_is_ready() {
    let nodes = [node("a", 16), node("b", 16)];
    let (models, mut replicas) = all_on_a(4, 0);
    let in_flight = vec![moving(1, "m00", "a", "b")];
    replicas.push(replica(10, "m00", "b", false));

    // Replacement loading: nothing removed, and the one move in flight fills a budget of 1.
    let p = plan(&nodes, &models, &replicas, &budget(1, in_flight.clone()));
    assert!(p.is_settled(), "{:?}", p);

    // Ready: the moved replica goes, explained as the move.
    replicas.last_mut().unwrap().ready = true;
    let p = plan(&nodes, &models, &replicas, &budget(1, in_flight.clone()));
    assert_eq!(p.remove.len(), 1, "{:?}", p.remove);
    assert_eq!(p.remove[0].replica, 1);
    assert!(matches!(
        &p.remove[0].reason,
        Reason::Rebalance { from, to, .. } if from == "a" && to == "b"
    ));
    // The move is over with this plan: the budget is free for the next one.
    assert_eq!(moves_of(&p), vec![("m01", 2, "b")]);
}

#[test]
fn a_move_whose_replacement_is_gone_is_void() {
    let nodes = [node("a", 16), node("b", 16)];
    let (models, replicas) = all_on_a(4, 0);
    // The replacement on b never came (or failed and was retired): replica 1 stays, and the
    // stale move neither counts against the budget nor blocks a new move of m00.
    let p = plan(
        &nodes,
        &models,
        &replicas,
        &budget(1, vec![moving(1, "m00", "a", "b")]),
    );
    assert!(p.remove.is_empty(), "{:?}", p.remove);
    assert_eq!(moves_of(&p), vec![("m00", 1, "b")]);
}

#[test]
fn nothing_moves_to_a_drained_or_down_node() {
    let mut drained = node("b", 16);
    drained.drained = true;
    let mut down = node("c", 16);
    down.up = false;
    let (models, replicas) = all_on_a(6, 0);
    let p = plan(
        &[node("a", 16), drained, down],
        &models,
        &replicas,
        &budget(2, Vec::new()),
    );
    assert!(p.is_settled(), "{p:?}");
}

#[test]
fn a_gpu_model_moves_only_to_a_node_with_the_gpus() {
    let gpu_node = |id: &str| NodeView {
        gpus: vec![GpuView {
            index: 0,
            memory_bytes: 16 * GIB,
        }],
        ..node(id, 64)
    };
    let nodes = [gpu_node("a"), node("b", 64), gpu_node("c")];
    let models: Vec<ModelView> = (0..4)
        .map(|i| ModelView {
            gpus: 1,
            gpu_memory_estimate_bytes: GIB,
            ..model(&format!("g{i}"), 1, 0)
        })
        .collect();
    let replicas: Vec<CurrentReplica> = (0..4)
        .map(|i| CurrentReplica {
            gpus: vec![0],
            ..replica(i + 1, &format!("g{i}"), "a", true)
        })
        .collect();
    let p = plan(&nodes, &models, &replicas, &budget(2, Vec::new()));
    assert_eq!(moves_of(&p), vec![("g0", 1, "c"), ("g1", 2, "c")]);
    assert!(p.add.iter().all(|a| a.gpus == vec![0]), "{:?}", p.add);
}

#[test]
fn a_model_changed_this_round_is_not_moved() {
    let nodes = [node("a", 16), node("b", 16)];
    let (mut models, replicas) = all_on_a(3, 0);
    // m00 wants a second replica: it goes to b by the usual rule; the moves take others.
    models[0].replicas_wanted = 2;
    // Counting it, b holds 1 and a 3: one move evens them, and it is not m00.
    let p = plan(&nodes, &models, &replicas, &budget(2, Vec::new()));
    assert_eq!(p.add.len(), 2, "{:?}", p.add);
    assert_eq!(
        (p.add[0].reason.clone(), p.add[0].node.as_str()),
        (Reason::ScaleUp, "b")
    );
    assert_eq!(moves_of(&p), vec![("m01", 2, "b")]);
}
