//! One test per rule and per [`Reason`], on small hand-built clusters.

use super::*;

pub(super) const GIB: u64 = 1 << 30;

pub(super) fn node(id: &str, gib: u64) -> NodeView {
    NodeView {
        id: id.to_string(),
        memory_capacity_bytes: gib * GIB,
        cpu_millis_capacity: 8000,
        up: true,
        drained: false,
        gpus: Vec::new(),
    }
}

pub(super) fn model(name: &str, wanted: u32, gib: u64) -> ModelView {
    ModelView {
        name: name.to_string(),
        version: 1,
        replicas_wanted: wanted,
        memory_estimate_bytes: gib * GIB,
        measured_memory_bytes: None,
        gpus: 0,
        gpu_memory_estimate_bytes: 0,
        measured_gpu_memory_bytes: None,
    }
}

pub(super) fn replica(id: u64, model: &str, node: &str, ready: bool) -> CurrentReplica {
    CurrentReplica {
        id,
        model: model.to_string(),
        version: 1,
        node: node.to_string(),
        ready,
        memory_bytes: None,
        gpus: Vec::new(),
        gpu_memory_bytes: None,
    }
}

fn add(model: &str, node: &str, reason: Reason) -> Addition {
    Addition {
        model: model.to_string(),
        version: 1,
        node: node.to_string(),
        reason,
        gpus: Vec::new(),
        skipped: Vec::new(),
        moves: None,
        evicted: Vec::new(),
    }
}

fn removal(replica: u64, reason: Reason) -> Removal {
    Removal { replica, reason }
}

fn no_load() -> Load {
    Load::default()
}

fn load(pairs: &[(&str, f64)]) -> Load {
    Load {
        node_utilization: pairs.iter().map(|(n, u)| (n.to_string(), *u)).collect(),
        ..Default::default()
    }
}

#[test]
fn new_model_goes_to_the_nodes_with_most_free_memory_one_replica_per_node() {
    let nodes = [node("a", 4), node("b", 16), node("c", 8)];
    let p = plan(&nodes, &[model("m", 2, 2)], &[], &no_load());
    assert_eq!(
        p.add,
        vec![
            add("m", "b", Reason::NewModel),
            add("m", "c", Reason::NewModel)
        ]
    );
    assert!(p.remove.is_empty() && p.unplaced.is_empty());
}

#[test]
fn ties_are_broken_by_load_then_node_id() {
    let nodes = [node("a", 8), node("b", 8), node("c", 8)];
    let m = [model("m", 1, 1)];
    let by_id = plan(&nodes, &m, &[], &no_load());
    assert_eq!(by_id.add, vec![add("m", "a", Reason::NewModel)]);
    let by_load = plan(
        &nodes,
        &m,
        &[],
        &load(&[("a", 0.5), ("b", 0.2), ("c", 0.1)]),
    );
    assert_eq!(by_load.add, vec![add("m", "c", Reason::NewModel)]);
}

#[test]
fn scale_up_adds_on_a_node_without_the_model() {
    let nodes = [node("a", 16), node("b", 4)];
    let p = plan(
        &nodes,
        &[model("m", 2, 1)],
        &[replica(1, "m", "a", true)],
        &no_load(),
    );
    assert_eq!(p.add, vec![add("m", "b", Reason::ScaleUp)]);
    assert!(p.remove.is_empty());
}

#[test]
fn replicas_on_a_down_or_unknown_node_are_replaced_and_removed() {
    let mut nodes = [node("a", 8), node("b", 8), node("c", 8)];
    nodes[0].up = false;
    let current = [replica(1, "m", "a", true), replica(2, "m", "gone", true)];
    let p = plan(&nodes, &[model("m", 2, 1)], &current, &no_load());
    assert_eq!(
        p.add,
        vec![
            add("m", "b", Reason::NodeDown),
            add("m", "c", Reason::NodeDown)
        ]
    );
    assert_eq!(
        p.remove,
        vec![removal(1, Reason::NodeDown), removal(2, Reason::NodeDown)]
    );
}

#[test]
fn drain_is_make_before_break_over_rounds() {
    let mut nodes = [node("a", 8), node("b", 8)];
    nodes[0].drained = true;
    let m = [model("m", 1, 1)];
    let first = plan(&nodes, &m, &[replica(1, "m", "a", true)], &no_load());
    assert_eq!(first.add, vec![add("m", "b", Reason::Drain)]);
    assert!(
        first.remove.is_empty(),
        "drained replica must serve until replaced"
    );

    let loading = [replica(1, "m", "a", true), replica(2, "m", "b", false)];
    assert_eq!(plan(&nodes, &m, &loading, &no_load()), Plan::default());

    let replaced = [replica(1, "m", "a", true), replica(2, "m", "b", true)];
    let last = plan(&nodes, &m, &replaced, &no_load());
    assert_eq!(last.remove, vec![removal(1, Reason::Drain)]);
    assert!(last.add.is_empty());
}

#[test]
fn drain_without_room_elsewhere_keeps_the_replica_and_reports_it() {
    let mut nodes = [node("a", 8), node("b", 1)];
    nodes[0].drained = true;
    let p = plan(
        &nodes,
        &[model("m", 1, 2)],
        &[replica(1, "m", "a", true)],
        &no_load(),
    );
    assert!(p.remove.is_empty() && p.add.is_empty());
    assert_eq!(
        p.unplaced,
        vec![Unplaced {
            model: "m".into(),
            version: 1,
            missing: 1,
            reason: Reason::NoCapacity {
                needed: 2 * GIB,
                best_free: GIB
            },
        }]
    );
}

#[test]
fn scale_down_removes_from_the_most_loaded_node_first() {
    let nodes = [node("a", 8), node("b", 8), node("c", 8)];
    let current = [
        replica(1, "m", "a", true),
        replica(2, "m", "b", true),
        replica(3, "m", "c", true),
    ];
    let l = load(&[("a", 0.2), ("b", 0.9), ("c", 0.5)]);
    let p = plan(&nodes, &[model("m", 1, 1)], &current, &l);
    assert_eq!(
        p.remove,
        vec![removal(2, Reason::ScaleDown), removal(3, Reason::ScaleDown)]
    );
    assert!(p.add.is_empty());
}

#[test]
fn scale_down_prefers_the_least_free_node_and_keeps_ready_replicas() {
    let nodes = [node("a", 8), node("b", 2), node("c", 8)];
    let current = [
        replica(1, "m", "a", false),
        replica(2, "m", "b", true),
        replica(3, "m", "c", true),
    ];
    let p = plan(&nodes, &[model("m", 1, 1)], &current, &no_load());
    // The not-ready replica goes first, then the one on the fullest node.
    assert_eq!(
        p.remove,
        vec![removal(1, Reason::ScaleDown), removal(2, Reason::ScaleDown)]
    );
}

#[test]
fn lacking_capacity_is_reported_not_overcommitted() {
    let nodes = [node("a", 3)];
    let models = [model("big", 1, 2), model("small", 1, 2)];
    let p = plan(&nodes, &models, &[], &no_load());
    assert_eq!(p.add, vec![add("big", "a", Reason::NewModel)]);
    assert_eq!(
        p.unplaced,
        vec![Unplaced {
            model: "small".into(),
            version: 1,
            missing: 1,
            reason: Reason::NoCapacity {
                needed: 2 * GIB,
                best_free: GIB
            },
        }]
    );
}

#[test]
fn fewer_nodes_than_replicas_is_reported() {
    let mut nodes = [node("a", 8), node("b", 8), node("c", 8)];
    nodes[2].drained = true;
    let p = plan(&nodes, &[model("m", 3, 1)], &[], &no_load());
    assert_eq!(p.add.len(), 2);
    assert!(p.add.iter().all(|a| a.node != "c"));
    assert_eq!(p.unplaced[0].missing, 1);
    assert_eq!(
        p.unplaced[0].reason,
        Reason::NotEnoughNodes { eligible_nodes: 2 }
    );
}

#[test]
fn measured_memory_wins_over_the_estimate() {
    let nodes = [node("a", 4)];
    let mut m = model("m", 1, 1);
    m.measured_memory_bytes = Some(5 * GIB);
    let p = plan(&nodes, &[m], &[], &no_load());
    assert!(p.add.is_empty());
    assert_eq!(
        p.unplaced[0].reason,
        Reason::NoCapacity {
            needed: 5 * GIB,
            best_free: 4 * GIB
        }
    );

    // A replica's own measurement counts against its node.
    let mut r = replica(1, "other", "a", true);
    r.memory_bytes = Some(3 * GIB);
    let models = [model("other", 1, 1), model("m", 1, 2)];
    let p = plan(&nodes, &models, &[r], &no_load());
    assert!(p.add.is_empty());
    assert_eq!(
        p.unplaced[0].reason,
        Reason::NoCapacity {
            needed: 2 * GIB,
            best_free: GIB
        }
    );
}

#[test]
fn two_replicas_on_one_node_are_a_spread_conflict() {
    let nodes = [node("a", 8), node("b", 8)];
    let current = [replica(1, "m", "a", false), replica(2, "m", "a", true)];
    let p = plan(&nodes, &[model("m", 2, 1)], &current, &no_load());
    assert_eq!(p.remove, vec![removal(1, Reason::SpreadConflict)]);
    assert_eq!(p.add, vec![add("m", "b", Reason::SpreadConflict)]);
}

#[test]
fn replicas_of_unregistered_models_are_removed() {
    let nodes = [node("a", 8)];
    let p = plan(&nodes, &[], &[replica(7, "m", "a", true)], &no_load());
    assert_eq!(p.remove, vec![removal(7, Reason::ModelRemoved)]);
}

#[test]
fn healthy_replicas_stay_even_when_a_better_node_exists() {
    let nodes = [node("a", 2), node("b", 64)];
    let current = [replica(1, "m", "a", false)];
    let p = plan(&nodes, &[model("m", 1, 2)], &current, &load(&[("a", 1.0)]));
    assert_eq!(p, Plan::default());
}

#[test]
fn nothing_lands_on_down_or_drained_nodes() {
    let mut nodes = [node("a", 64), node("b", 64), node("c", 1)];
    nodes[0].up = false;
    nodes[1].drained = true;
    let p = plan(&nodes, &[model("m", 2, 1)], &[], &no_load());
    assert_eq!(p.add, vec![add("m", "c", Reason::NewModel)]);
    assert_eq!(p.unplaced[0].missing, 1);
}

#[test]
fn every_reason_explains_itself_in_a_sentence() {
    let reasons = [
        (Reason::NewModel, "new model"),
        (Reason::ScaleUp, "fewer replicas"),
        (Reason::NodeDown, "down"),
        (Reason::Drain, "drained"),
        (Reason::ScaleDown, "more replicas"),
        (Reason::ModelRemoved, "no longer registered"),
        (Reason::SpreadConflict, "same node"),
        (
            Reason::Rebalance {
                from: "a".into(),
                to: "b".into(),
                why: "a holds 4 replicas, b holds 0".into(),
            },
            "moves from a to b (a holds 4 replicas, b holds 0)",
        ),
        (
            Reason::NoCapacity {
                needed: 10,
                best_free: 3,
            },
            "needs 10 bytes but the best eligible node has only 3 bytes free",
        ),
        (
            Reason::NotEnoughNodes { eligible_nodes: 4 },
            "all 4 up, undrained nodes",
        ),
        (
            Reason::NoGpuCapacity {
                gpus: 1,
                needed_per_gpu: 3 * GIB,
                skipped: vec!["node a: no GPU".into()],
            },
            "needs 1 GPU(s) with 3.0 GiB free each; node a: no GPU",
        ),
    ];
    for (reason, words) in reasons {
        let text = reason.to_string();
        assert!(text.contains(words), "{reason:?} explained as {text:?}");
    }
}

#[test]
fn a_plan_narrowed_to_one_model_explains_each_decision() {
    let mut nodes = [node("a", 8), node("b", 8)];
    nodes[0].up = false;
    let models = [model("m", 1, 1), model("n", 1, 1)];
    let current = [replica(1, "m", "a", true), replica(2, "n", "b", true)];
    let p = plan(&nodes, &models, &current, &no_load());
    let owner = |id| current.iter().find(|r| r.id == id).map(|r| r.model.clone());
    let lines = p.for_model("m", owner).explain();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(lines[0].starts_with("add m v1 on b: node is down"));
    assert!(lines[1].starts_with("remove replica 1: node is down"));
    assert!(p.for_model("n", owner).explain().is_empty());
}
