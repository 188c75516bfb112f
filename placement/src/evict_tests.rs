//! Eviction (the model cache) on small hand-built clusters: who goes, who stays, on which node,
//! and how the plan explains it.

use super::tests::{GIB, model, node, replica};
use super::*;

const NOW: u64 = 600_000;
const RESIDENCY: u64 = 60_000;

/// A cache with eviction on where every model has floor 0, every listed replica was placed
/// long ago, and `used` gives each model's last use.
fn cache(replicas: &[CurrentReplica], used: &[(&str, u64)]) -> Cache {
    Cache {
        evict: true,
        now_ms: NOW,
        min_residency_ms: RESIDENCY,
        last_used_ms: used.iter().map(|(m, t)| (m.to_string(), *t)).collect(),
        placed_at_ms: replicas.iter().map(|r| (r.id, 0)).collect(),
        floor: replicas
            .iter()
            .map(|r| (r.model.clone(), 0))
            .chain([("new".to_string(), 0)])
            .collect(),
        busy: BTreeSet::new(),
        remembered: BTreeMap::new(),
    }
}

fn load(cache: Cache) -> Load {
    Load {
        cache,
        ..Default::default()
    }
}

fn evicted(p: &Plan) -> Vec<u64> {
    p.remove
        .iter()
        .filter(|r| matches!(r.reason, Reason::Evicted { .. }))
        .map(|r| r.replica)
        .collect()
}

/// Node `a` (2 GiB) is full with `old` and `recent`, 1 GiB each; `new` wants 1 GiB.
fn full_node() -> (Vec<NodeView>, Vec<ModelView>, Vec<CurrentReplica>) {
    let nodes = vec![node("a", 2)];
    let models = vec![
        model("old", 1, 1),
        model("recent", 1, 1),
        model("new", 1, 1),
    ];
    let replicas = vec![
        replica(1, "old", "a", true),
        replica(2, "recent", "a", true),
    ];
    (nodes, models, replicas)
}

#[test]
fn the_least_recently_used_idle_replica_makes_room_in_the_same_plan() {
    let (nodes, models, replicas) = full_node();
    let c = cache(&replicas, &[("old", 1_000), ("recent", 500_000)]);
    let p = plan(&nodes, &models, &replicas, &load(c));
    assert_eq!(evicted(&p), [1]);
    assert_eq!(
        p.remove[0].reason,
        Reason::Evicted {
            for_model: "new".into(),
            version: 1,
            idle_ms: Some(NOW - 1_000),
        }
    );
    assert_eq!(p.add.len(), 1);
    let add = &p.add[0];
    assert_eq!((add.model.as_str(), add.node.as_str()), ("new", "a"));
    assert_eq!(
        add.evicted,
        [Evicted {
            replica: 1,
            model: "old".into(),
            version: 1
        }]
    );
    assert!(p.unplaced.is_empty());
    let why = add.explanation();
    assert!(
        why.contains("placed after evicting old v1 (replica 1)"),
        "{why}"
    );
    let removal = p.remove[0].reason.to_string();
    assert!(
        removal.starts_with("evicted to make room for new v1"),
        "{removal}"
    );
    assert!(removal.contains("599.0 s ago"), "{removal}");
}

#[test]
fn eviction_off_leaves_the_replica_unplaced_as_before() {
    let (nodes, models, replicas) = full_node();
    let mut c = cache(&replicas, &[]);
    c.evict = false;
    let p = plan(&nodes, &models, &replicas, &load(c));
    assert!(p.remove.is_empty() && p.add.is_empty());
    assert_eq!(p.unplaced[0].reason.rule(), "NoCapacity");
}

#[test]
fn pinned_busy_recent_and_loading_replicas_stay() {
    let (nodes, models, mut replicas) = full_node();
    // Pinned: its floor is its one replica. The other one is the least recent.
    let mut c = cache(&replicas, &[("old", 1_000), ("recent", 500_000)]);
    c.floor.insert("old".into(), 1);
    let p = plan(&nodes, &models, &replicas, &load(c.clone()));
    assert_eq!(evicted(&p), [2], "the pinned one stays, the unpinned goes");

    c.busy.insert(("recent".into(), 1, "a".into()));
    let p = plan(&nodes, &models, &replicas, &load(c.clone()));
    assert!(evicted(&p).is_empty(), "busy and pinned: nothing to evict");
    let [u] = p.unplaced.as_slice() else {
        panic!("{p:?}")
    };
    assert_eq!(u.reason.rule(), "CacheFull");
    let text = u.reason.to_string();
    assert!(text.starts_with("no capacity"), "{text}");
    assert!(text.contains("1 pinned"), "{text}");
    assert!(text.contains("1 serving requests"), "{text}");

    c.busy.clear();
    c.placed_at_ms.insert(2, NOW - 1_000);
    let p = plan(&nodes, &models, &replicas, &load(c.clone()));
    assert!(evicted(&p).is_empty(), "placed a second ago: it stays");
    let text = p.unplaced[0].reason.to_string();
    assert!(
        text.contains("1 placed or used less than 60 s ago"),
        "{text}"
    );

    c.placed_at_ms.insert(2, 0);
    replicas[1].ready = false;
    let p = plan(&nodes, &models, &replicas, &load(c));
    assert!(evicted(&p).is_empty(), "a loading replica is not idle");
}

#[test]
fn a_replica_bigger_than_any_node_is_not_a_reason_to_evict() {
    let (nodes, mut models, replicas) = full_node();
    models[2].memory_estimate_bytes = 3 * GIB;
    let c = cache(&replicas, &[("old", 1_000), ("recent", 2_000)]);
    let p = plan(&nodes, &models, &replicas, &load(c));
    assert!(p.remove.is_empty(), "{p:?}");
    assert_eq!(p.unplaced[0].reason.rule(), "NoCapacity");
}

#[test]
fn unknown_placement_time_or_floor_protects_a_replica() {
    let (nodes, models, replicas) = full_node();
    let mut c = cache(&replicas, &[]);
    c.placed_at_ms.remove(&1);
    c.floor.remove("recent");
    let p = plan(&nodes, &models, &replicas, &load(c));
    assert!(evicted(&p).is_empty(), "{p:?}");
}

#[test]
fn the_node_whose_victims_were_used_least_recently_is_chosen() {
    let nodes = [node("a", 1), node("b", 1)];
    let models = [model("x", 1, 1), model("y", 1, 1), model("new", 1, 1)];
    let replicas = [replica(1, "x", "a", true), replica(2, "y", "b", true)];
    let c = cache(&replicas, &[("x", 5_000), ("y", 4_000)]);
    let p = plan(&nodes, &models, &replicas, &load(c));
    assert_eq!(evicted(&p), [2]);
    assert_eq!(p.add[0].node, "b");
}

#[test]
fn several_replicas_go_when_one_is_not_enough_least_recent_first() {
    let nodes = [node("a", 3)];
    let models = [
        model("x", 1, 1),
        model("y", 1, 1),
        model("z", 1, 1),
        model("new", 1, 2),
    ];
    let replicas = [
        replica(1, "x", "a", true),
        replica(2, "y", "a", true),
        replica(3, "z", "a", true),
    ];
    let c = cache(&replicas, &[("x", 3_000), ("y", 1_000), ("z", 2_000)]);
    let p = plan(&nodes, &models, &replicas, &load(c));
    assert_eq!(evicted(&p), [2, 3], "y then z; x, the most recent, stays");
    let names: Vec<&str> = p.add[0].evicted.iter().map(|e| e.model.as_str()).collect();
    assert_eq!(names, ["y", "z"]);
}

#[test]
fn measured_memory_decides_what_is_freed() {
    let nodes = [node("a", 3)];
    let models = [model("x", 1, 1), model("y", 1, 1), model("new", 1, 2)];
    let mut replicas = vec![replica(1, "x", "a", true), replica(2, "y", "a", true)];
    // x measured 2 GiB: evicting it alone makes room for 2 GiB (1 GiB was free... no: 0).
    replicas[0].memory_bytes = Some(2 * GIB);
    let c = cache(&replicas, &[("x", 1_000), ("y", 2_000)]);
    let p = plan(&nodes, &models, &replicas, &load(c));
    assert_eq!(
        evicted(&p),
        [1],
        "x's measured 2 GiB are enough on their own"
    );
}

#[test]
fn a_gpu_model_evicts_a_replica_on_a_gpu_not_a_cpu_one() {
    let mut a = node("a", 8);
    a.gpus = vec![GpuView {
        index: 0,
        memory_bytes: 10 * GIB,
    }];
    let nodes = [a];
    let mut gpu_old = model("gpu-old", 1, 1);
    gpu_old.gpus = 1;
    gpu_old.gpu_memory_estimate_bytes = 8 * GIB;
    let mut wanted = model("new", 1, 1);
    wanted.gpus = 1;
    wanted.gpu_memory_estimate_bytes = 4 * GIB;
    let models = [model("cpu", 1, 1), gpu_old, wanted];
    let mut on_gpu = replica(2, "gpu-old", "a", true);
    on_gpu.gpus = vec![0];
    let replicas = [replica(1, "cpu", "a", true), on_gpu];
    let c = cache(&replicas, &[("cpu", 1_000), ("gpu-old", 2_000)]);
    let p = plan(&nodes, &models, &replicas, &load(c));
    assert_eq!(evicted(&p), [2], "the CPU replica frees no GPU memory");
    assert_eq!(p.add[0].gpus, [0]);
}

#[test]
fn a_replica_in_a_rebalancing_move_stays() {
    let (nodes, models, replicas) = full_node();
    let c = cache(&replicas, &[("old", 1_000), ("recent", 2_000)]);
    let mut l = load(c);
    l.rebalance.in_flight.push(Move {
        model: "old".into(),
        version: 1,
        replica: 1,
        from: "a".into(),
        to: "b".into(),
    });
    let p = plan(&nodes, &models, &replicas, &l);
    assert_eq!(evicted(&p), [2]);
}
