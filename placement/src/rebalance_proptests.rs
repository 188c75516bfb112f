//! Rebalancing simulated over rounds on random clusters (fixed seeds, so failures reproduce):
//! models are placed while only some nodes have joined, then the rest join and rounds run with a
//! budget, the leader's bookkeeping of moves and replicas turning ready at random. Every round
//! must keep the budget, never over-commit memory and never lower a model's ready count below
//! what it wants; every simulation must settle (a plan with nothing to do, then nothing again:
//! no flapping); with one replica per model and memory unknown, counts end within one.

use std::collections::{BTreeMap, BTreeSet};

use super::proptests::{HALF_GIB, Rng};
use super::tests::GIB;
use super::*;

const CASES: u64 = 400;
const MAX_ROUNDS: usize = 300;

struct Sim {
    nodes: Vec<NodeView>,
    models: Vec<ModelView>,
    replicas: Vec<CurrentReplica>,
    moves: Vec<Move>,
    next_id: u64,
    max_moves: u32,
}

impl Sim {
    fn model(&self, name: &str, version: i64) -> &ModelView {
        self.models
            .iter()
            .find(|m| m.name == name && m.version == version)
            .expect("the simulation only places registered models")
    }

    fn load(&self) -> Load {
        Load {
            rebalance: Rebalance {
                max_moves: self.max_moves,
                in_flight: self.moves.clone(),
            },
            ..Default::default()
        }
    }

    /// Carries out a plan as the leader and the workers would: additions appear not ready,
    /// moves are remembered, removals go, then some replicas finish loading.
    fn apply(&mut self, plan: &Plan, rng: &mut Rng) {
        let gone: BTreeSet<u64> = plan.remove.iter().map(|r| r.replica).collect();
        for a in &plan.add {
            self.next_id += 1;
            if let Some(source) = a.moves {
                let from = self
                    .replicas
                    .iter()
                    .find(|r| r.id == source)
                    .map(|r| r.node.clone())
                    .expect("a move names a current replica");
                self.moves.retain(|m| m.replica != source);
                self.moves.push(Move {
                    model: a.model.clone(),
                    version: a.version,
                    replica: source,
                    from,
                    to: a.node.clone(),
                });
            }
            self.replicas.push(CurrentReplica {
                id: self.next_id,
                model: a.model.clone(),
                version: a.version,
                node: a.node.clone(),
                ready: false,
                memory_bytes: None,
                gpus: a.gpus.clone(),
                gpu_memory_bytes: None,
            });
        }
        self.replicas.retain(|r| !gone.contains(&r.id));
        for r in &mut self.replicas {
            if !r.ready && rng.chance(60) {
                r.ready = true;
            }
        }
        let replicas = &self.replicas;
        self.moves.retain(|m| {
            replicas.iter().any(|r| r.id == m.replica)
                && replicas
                    .iter()
                    .any(|r| r.model == m.model && r.version == m.version && r.node == m.to)
        });
    }
}

fn random_sim(rng: &mut Rng) -> (Sim, Vec<NodeView>) {
    let unknown_memory = rng.chance(40);
    let nodes: Vec<NodeView> = (0..2 + rng.below(5))
        .map(|i| NodeView {
            id: format!("n{i}"),
            memory_capacity_bytes: (4 + rng.below(13)) * GIB,
            cpu_millis_capacity: 4000,
            up: true,
            drained: false,
            gpus: (0..if rng.chance(40) { 1 + rng.below(2) } else { 0 })
                .map(|g| GpuView {
                    index: g as u32,
                    memory_bytes: 8 * GIB,
                })
                .collect(),
        })
        .collect();
    let models: Vec<ModelView> = (0..1 + rng.below(20))
        .map(|i| {
            let gpus = u32::from(!unknown_memory && rng.chance(20));
            ModelView {
                name: format!("m{i:02}"),
                version: 1,
                replicas_wanted: if unknown_memory {
                    1
                } else {
                    1 + rng.below(2) as u32
                },
                memory_estimate_bytes: if unknown_memory {
                    0
                } else {
                    (1 + rng.below(4)) * HALF_GIB
                },
                measured_memory_bytes: None,
                gpus,
                gpu_memory_estimate_bytes: u64::from(gpus) * (1 + rng.below(4)) * HALF_GIB,
                measured_gpu_memory_bytes: None,
            }
        })
        .collect();
    let joined = 1 + rng.below(nodes.len() as u64 - 1) as usize;
    let mut sim = Sim {
        nodes: nodes[..joined].to_vec(),
        models,
        replicas: Vec::new(),
        moves: Vec::new(),
        next_id: 0,
        max_moves: 0,
    };
    // Place everything on the first nodes, rebalancing off, all ready.
    for _ in 0..4 {
        let p = plan(&sim.nodes, &sim.models, &sim.replicas, &sim.load());
        sim.apply(&p, rng);
        for r in &mut sim.replicas {
            r.ready = true;
        }
    }
    sim.max_moves = 1 + rng.below(3) as u32;
    (sim, nodes)
}

/// Checks one round's plan against the state it was made from.
fn check_round(seed: u64, sim: &Sim, p: &Plan) {
    let removed: BTreeSet<u64> = p.remove.iter().map(|r| r.replica).collect();
    let by_id: BTreeMap<u64, &CurrentReplica> = sim.replicas.iter().map(|r| (r.id, r)).collect();

    // The budget: moves still in flight after this plan plus the new ones.
    let in_flight = sim
        .moves
        .iter()
        .filter(|m| by_id.contains_key(&m.replica) && !removed.contains(&m.replica))
        .count();
    let started = p.add.iter().filter(|a| a.moves.is_some()).count();
    assert!(
        in_flight + started <= sim.max_moves as usize,
        "seed {seed}: {in_flight} in flight + {started} new > budget {}",
        sim.max_moves
    );

    // Memory: everything present (removed replicas still hold theirs) plus the additions.
    let mut used: BTreeMap<&str, u64> = BTreeMap::new();
    for r in &sim.replicas {
        let m = sim.model(&r.model, r.version);
        *used.entry(&r.node).or_default() += r.memory_bytes.unwrap_or(m.replica_memory_bytes());
    }
    for a in &p.add {
        *used.entry(&a.node).or_default() += sim.model(&a.model, a.version).replica_memory_bytes();
        let node = sim.nodes.iter().find(|n| n.id == a.node).unwrap();
        let wants = sim.model(&a.model, a.version).gpus as usize;
        assert_eq!(a.gpus.len(), wants, "seed {seed}: {a:?} on {node:?}");
    }
    for n in &sim.nodes {
        let u = used.get(n.id.as_str()).copied().unwrap_or(0);
        assert!(
            u <= n.memory_capacity_bytes,
            "seed {seed}: {} over-committed: {u} > {}",
            n.id,
            n.memory_capacity_bytes
        );
    }

    // The ready floor: removals never take a model below what it wants (or had).
    for m in &sim.models {
        let ready = |skip: &BTreeSet<u64>| {
            sim.replicas
                .iter()
                .filter(|r| r.model == m.name && r.version == m.version && r.ready)
                .filter(|r| !skip.contains(&r.id))
                .count()
        };
        let before = ready(&BTreeSet::new());
        let after = ready(&removed);
        assert!(
            after >= before.min(m.replicas_wanted as usize),
            "seed {seed}: {} ready {before} -> {after}, wants {}",
            m.name,
            m.replicas_wanted
        );
    }

    // A moved replica goes only once its replacement is ready.
    for r in &p.remove {
        if let Reason::Rebalance { to, .. } = &r.reason {
            let source = by_id[&r.replica];
            assert!(
                sim.replicas.iter().any(|x| x.model == source.model
                    && x.version == source.version
                    && &x.node == to
                    && x.ready),
                "seed {seed}: replica {} removed before its replacement on {to} is ready",
                r.replica
            );
        }
    }
}

#[test]
fn rebalancing_keeps_the_budget_memory_and_floor_and_settles_without_flapping() {
    let mut moved_somewhere = 0;
    for seed in 1..=CASES {
        let mut rng = Rng::new(seed);
        let (mut sim, all_nodes) = random_sim(&mut rng);
        let first = sim.nodes.len();
        sim.nodes = all_nodes;
        let mut quiet = 0;
        let mut rounds = 0;
        let mut moves = 0;
        while quiet < 3 {
            rounds += 1;
            assert!(
                rounds <= MAX_ROUNDS,
                "seed {seed}: no settled placement after {MAX_ROUNDS} rounds"
            );
            let p = plan(&sim.nodes, &sim.models, &sim.replicas, &sim.load());
            check_round(seed, &sim, &p);
            moves += p.add.iter().filter(|a| a.moves.is_some()).count();
            let all_ready = sim.replicas.iter().all(|r| r.ready);
            if p.is_settled() && all_ready {
                quiet += 1;
            } else {
                assert_eq!(quiet, 0, "seed {seed}: settled, then moved again: {p:?}");
            }
            sim.apply(&p, &mut rng);
        }
        if moves > 0 {
            moved_somewhere += 1;
        }

        // One replica per model, memory unknown: the nodes that joined late received replicas
        // until counts are within one.
        let unknown = sim.models.iter().all(|m| m.memory_estimate_bytes == 0);
        if unknown {
            let mut count: BTreeMap<&str, usize> =
                sim.nodes.iter().map(|n| (n.id.as_str(), 0)).collect();
            for r in &sim.replicas {
                *count.get_mut(r.node.as_str()).unwrap() += 1;
            }
            let (lo, hi) = (
                count.values().min().copied().unwrap_or(0),
                count.values().max().copied().unwrap_or(0),
            );
            assert!(
                hi - lo <= 1,
                "seed {seed}: counts {count:?} after nodes {first}.. joined"
            );
        }
    }
    assert!(
        moved_somewhere > CASES / 4,
        "only {moved_somewhere} of {CASES} simulations moved anything"
    );
}
