//! Property tests over many random clusters (a tiny xorshift RNG, fixed seeds, so failures
//! reproduce), and an ignored timing harness at 1,000 nodes × 10,000 models. Some nodes have
//! GPUs and some models need one or two of them.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use super::tests::GIB;
use super::*;

pub(super) const HALF_GIB: u64 = GIB / 2;

pub(super) use nereid_test_support::Rng;

#[derive(Clone)]
struct Cluster {
    nodes: Vec<NodeView>,
    models: Vec<ModelView>,
    replicas: Vec<CurrentReplica>,
    load: Load,
}

impl Cluster {
    fn plan(&self) -> Plan {
        plan(&self.nodes, &self.models, &self.replicas, &self.load)
    }

    fn model(&self, name: &str, version: i64) -> Option<&ModelView> {
        self.models
            .iter()
            .find(|m| m.name == name && m.version == version)
    }

    fn node(&self, id: &str) -> Option<&NodeView> {
        self.nodes.iter().find(|n| n.id == id)
    }

    /// Written independently of the planner: own measurement, else the model's, else estimate.
    fn memory(&self, r: &CurrentReplica) -> u64 {
        let model = self.model(&r.model, r.version);
        r.memory_bytes
            .or_else(|| model.map(|m| m.measured_memory_bytes.unwrap_or(m.memory_estimate_bytes)))
            .unwrap_or(0)
    }

    fn used(&self, replicas: &[CurrentReplica]) -> BTreeMap<String, u64> {
        let mut used = BTreeMap::new();
        for r in replicas {
            *used.entry(r.node.clone()).or_insert(0) += self.memory(r);
        }
        used
    }

    /// Written independently of the planner, per GPU: own measurement, else the model's, else
    /// its estimate.
    fn gpu_memory(&self, r: &CurrentReplica) -> u64 {
        let model = self.model(&r.model, r.version);
        r.gpu_memory_bytes
            .or_else(|| {
                model.map(|m| {
                    m.measured_gpu_memory_bytes
                        .unwrap_or(m.gpu_memory_estimate_bytes)
                })
            })
            .unwrap_or(0)
    }

    /// GPU memory held per (node, GPU index).
    fn gpu_used(&self, replicas: &[CurrentReplica]) -> BTreeMap<(String, u32), u64> {
        let mut used = BTreeMap::new();
        for r in replicas {
            for g in &r.gpus {
                *used.entry((r.node.clone(), *g)).or_insert(0) += self.gpu_memory(r);
            }
        }
        used
    }

    fn healthy_node(&self, id: &str) -> bool {
        self.node(id).is_some_and(|n| n.up && !n.drained)
    }

    /// Adds the planned replicas (not ready, unmeasured) without removing anything yet.
    fn with_adds(&self, plan: &Plan, next_id: &mut u64) -> Vec<CurrentReplica> {
        let mut all = self.replicas.clone();
        for a in &plan.add {
            *next_id += 1;
            all.push(CurrentReplica {
                id: *next_id,
                model: a.model.clone(),
                version: a.version,
                node: a.node.clone(),
                ready: false,
                memory_bytes: None,
                gpus: a.gpus.clone(),
                gpu_memory_bytes: None,
            });
        }
        all
    }

    fn apply(&self, plan: &Plan, next_id: &mut u64) -> Vec<CurrentReplica> {
        let gone: BTreeSet<u64> = plan.remove.iter().map(|r| r.replica).collect();
        let mut all = self.with_adds(plan, next_id);
        all.retain(|r| !gone.contains(&r.id));
        all
    }
}

fn random_cluster(rng: &mut Rng) -> Cluster {
    let nodes: Vec<NodeView> = (0..1 + rng.below(10))
        .map(|i| NodeView {
            id: format!("n{i:02}"),
            memory_capacity_bytes: rng.below(9) * GIB,
            cpu_millis_capacity: 4000,
            up: !rng.chance(15),
            drained: rng.chance(15),
            gpus: (0..if rng.chance(50) { rng.below(4) } else { 0 })
                .map(|g| GpuView {
                    index: g as u32,
                    memory_bytes: rng.below(9) * HALF_GIB,
                })
                .collect(),
        })
        .collect();
    let models: Vec<ModelView> = (0..rng.below(12))
        .map(|i| ModelView {
            name: format!("m{}", i / 2),
            version: (i % 2) as i64 + 1,
            replicas_wanted: rng.below(5) as u32,
            memory_estimate_bytes: (1 + rng.below(3)) * HALF_GIB,
            measured_memory_bytes: rng.chance(30).then(|| (1 + rng.below(4)) * HALF_GIB),
            gpus: if rng.chance(40) {
                1 + rng.below(2) as u32
            } else {
                0
            },
            gpu_memory_estimate_bytes: rng.below(4) * HALF_GIB,
            measured_gpu_memory_bytes: rng.chance(30).then(|| (1 + rng.below(4)) * HALF_GIB),
        })
        .collect();
    let mut used: BTreeMap<String, u64> = BTreeMap::new();
    let mut replicas = Vec::new();
    let mut next_id = 100;
    let mut place = |rng: &mut Rng, model: &str, version: i64, estimate: u64, gpus: u32| {
        let node = if rng.chance(5) {
            "ghost".to_string()
        } else {
            nodes[rng.below(nodes.len() as u64) as usize].id.clone()
        };
        let memory_bytes = rng.chance(30).then(|| (1 + rng.below(4)) * HALF_GIB);
        let bytes = memory_bytes.unwrap_or(estimate);
        let cap = nodes
            .iter()
            .find(|n| n.id == node)
            .map_or(u64::MAX, |n| n.memory_capacity_bytes);
        let on_node = used.entry(node.clone()).or_insert(0);
        // Mostly valid starting states, sometimes an over-committed one.
        if *on_node + bytes > cap && !rng.chance(10) {
            return;
        }
        *on_node += bytes;
        // GPU replicas get random GPUs of their node (GPU memory may start over-committed: the
        // planner must then add nothing more there); a node without enough GPUs gives none.
        let node_gpus = nodes
            .iter()
            .find(|n| n.id == node)
            .map_or(0, |n| n.gpus.len() as u32);
        let assigned: Vec<u32> = if gpus > 0 && node_gpus >= gpus {
            let mut all: Vec<u32> = (0..node_gpus).collect();
            rng.shuffle(&mut all);
            let mut some = all[..gpus as usize].to_vec();
            some.sort_unstable();
            some
        } else {
            Vec::new()
        };
        next_id += 1;
        replicas.push(CurrentReplica {
            id: next_id,
            model: model.to_string(),
            version,
            node,
            ready: rng.chance(70),
            memory_bytes,
            gpus: assigned,
            gpu_memory_bytes: rng.chance(20).then(|| rng.below(4) * HALF_GIB),
        });
    };
    for m in &models {
        let estimate = m.measured_memory_bytes.unwrap_or(m.memory_estimate_bytes);
        for _ in 0..rng.below(m.replicas_wanted as u64 + 2) {
            place(rng, &m.name, m.version, estimate, m.gpus);
        }
    }
    if rng.chance(20) {
        place(rng, "retired", 1, HALF_GIB, 0);
    }
    let mut load = Load::default();
    for n in &nodes {
        if rng.chance(50) {
            let utilization = rng.below(1001) as f64 / 1000.0;
            load.node_utilization.insert(n.id.clone(), utilization);
        }
    }
    Cluster {
        nodes,
        models,
        replicas,
        load,
    }
}

const CASES: u64 = 3000;

fn for_each_cluster(mut check: impl FnMut(u64, &Cluster)) {
    for seed in 1..=CASES {
        let cluster = random_cluster(&mut Rng::new(seed));
        check(seed, &cluster);
    }
}

#[test]
fn applying_a_plan_never_overcommits_a_node() {
    for_each_cluster(|seed, c| {
        let p = c.plan();
        let before = c.used(&c.replicas);
        // Conservative: removals may happen after adds (make-before-break).
        let during = c.used(&c.with_adds(&p, &mut 1_000_000));
        for n in &c.nodes {
            let was = before.get(&n.id).copied().unwrap_or(0);
            let now = during.get(&n.id).copied().unwrap_or(0);
            if now > was {
                assert!(
                    now <= n.memory_capacity_bytes,
                    "seed {seed}: node {} holds {now} > capacity {}",
                    n.id,
                    n.memory_capacity_bytes
                );
            }
        }
    });
}

#[test]
fn applying_a_plan_never_overcommits_a_gpu() {
    let mut gpu_adds = 0;
    for_each_cluster(|seed, c| {
        let p = c.plan();
        let before = c.gpu_used(&c.replicas);
        let during = c.gpu_used(&c.with_adds(&p, &mut 1_000_000));
        for n in &c.nodes {
            for g in &n.gpus {
                let key = (n.id.clone(), g.index);
                let was = before.get(&key).copied().unwrap_or(0);
                let now = during.get(&key).copied().unwrap_or(0);
                if now > was {
                    assert!(
                        now <= g.memory_bytes,
                        "seed {seed}: node {} GPU {} holds {now} > total {}",
                        n.id,
                        g.index,
                        g.memory_bytes
                    );
                }
            }
        }
        for a in &p.add {
            let m = c.model(&a.model, a.version).unwrap();
            let node = c.node(&a.node).unwrap();
            let distinct: BTreeSet<u32> = a.gpus.iter().copied().collect();
            assert_eq!(distinct.len(), m.gpus as usize, "seed {seed}: {a:?}");
            assert!(a.gpus.is_sorted(), "seed {seed}: {a:?}");
            assert!(
                a.gpus
                    .iter()
                    .all(|i| node.gpus.iter().any(|g| g.index == *i)),
                "seed {seed}: {a:?} names a GPU the node lacks"
            );
            gpu_adds += usize::from(m.gpus > 0);
        }
    });
    assert!(
        gpu_adds > 100,
        "too few GPU placements exercised: {gpu_adds}"
    );
}

#[test]
fn no_two_replicas_of_a_model_version_share_a_node_after_applying() {
    for_each_cluster(|seed, c| {
        let after = c.apply(&c.plan(), &mut 1_000_000);
        let mut seen = BTreeSet::new();
        for r in &after {
            assert!(
                seen.insert((r.model.clone(), r.version, r.node.clone())),
                "seed {seed}: two replicas of {} v{} on {}",
                r.model,
                r.version,
                r.node
            );
        }
    });
}

#[test]
fn healthy_replicas_are_removed_only_when_scaling_down_and_ready_ones_stay_enough() {
    for_each_cluster(|seed, c| {
        let p = c.plan();
        let gone: BTreeSet<u64> = p.remove.iter().map(|r| r.replica).collect();
        for removal in &p.remove {
            let r = c.replicas.iter().find(|r| r.id == removal.replica).unwrap();
            let Some(m) = c.model(&r.model, r.version) else {
                assert_eq!(removal.reason, Reason::ModelRemoved, "seed {seed}");
                continue;
            };
            if !c.healthy_node(&r.node) {
                continue;
            }
            let same = |o: &&CurrentReplica| o.model == r.model && o.version == r.version;
            match removal.reason {
                Reason::ScaleDown => {
                    let distinct: BTreeSet<&str> = c
                        .replicas
                        .iter()
                        .filter(same)
                        .filter(|o| c.healthy_node(&o.node))
                        .map(|o| o.node.as_str())
                        .collect();
                    assert!(distinct.len() > m.replicas_wanted as usize, "seed {seed}");
                }
                Reason::SpreadConflict => assert!(
                    c.replicas
                        .iter()
                        .filter(same)
                        .any(|o| o.node == r.node && !gone.contains(&o.id)),
                    "seed {seed}: conflict removal left the node without the model"
                ),
                ref other => panic!("seed {seed}: healthy replica {} removed: {other:?}", r.id),
            }
        }
        for m in &c.models {
            let ready_nodes = |keep: &dyn Fn(&CurrentReplica) -> bool| {
                c.replicas
                    .iter()
                    .filter(|r| r.model == m.name && r.version == m.version && r.ready)
                    .filter(|r| c.node(&r.node).is_some_and(|n| n.up) && keep(r))
                    .map(|r| r.node.as_str())
                    .collect::<BTreeSet<_>>()
                    .len()
            };
            let before = ready_nodes(&|_| true);
            let after = ready_nodes(&|r| !gone.contains(&r.id));
            assert!(
                after >= before.min(m.replicas_wanted as usize),
                "seed {seed}: {} v{} ready replicas {before} -> {after}",
                m.name,
                m.version
            );
        }
    });
}

#[test]
fn nothing_is_placed_on_down_drained_or_unknown_nodes() {
    for_each_cluster(|seed, c| {
        for a in &c.plan().add {
            assert!(c.healthy_node(&a.node), "seed {seed}: added on {}", a.node);
        }
    });
}

#[test]
fn plans_are_deterministic_whatever_the_input_order() {
    for_each_cluster(|seed, c| {
        let mut shuffled = c.clone();
        let mut rng = Rng::new(seed ^ 0xDEAD_BEEF);
        rng.shuffle(&mut shuffled.nodes);
        rng.shuffle(&mut shuffled.models);
        rng.shuffle(&mut shuffled.replicas);
        assert_eq!(c.plan(), c.plan(), "seed {seed}");
        assert_eq!(c.plan(), shuffled.plan(), "seed {seed}");
        let p = c.plan();
        let adds: Vec<_> = p
            .add
            .iter()
            .map(|a| (&a.model, a.version, &a.node))
            .collect();
        let removes: Vec<_> = p.remove.iter().map(|r| r.replica).collect();
        let unplaced: Vec<_> = p.unplaced.iter().map(|u| (&u.model, u.version)).collect();
        assert!(adds.is_sorted(), "seed {seed}: adds not sorted");
        assert!(removes.is_sorted(), "seed {seed}: removals not sorted");
        assert!(unplaced.is_sorted(), "seed {seed}: unplaced not sorted");
    });
}

#[test]
fn replanning_converges_to_wanted_or_explained_shortfall() {
    let mut slowest = 0;
    for_each_cluster(|seed, start| {
        let mut c = start.clone();
        let mut next_id = 1_000_000;
        let mut rounds = 0;
        let last = loop {
            let p = c.plan();
            if p.is_settled() {
                break p;
            }
            rounds += 1;
            assert!(
                rounds <= 6,
                "seed {seed}: no fixed point after 6 rounds: {p:?}"
            );
            c.replicas = c.apply(&p, &mut next_id);
            c.replicas.iter_mut().for_each(|r| r.ready = true);
        };
        assert_eq!(c.plan(), last, "seed {seed}: settled plan not stable");
        let used = c.used(&c.replicas);
        let gpu_used = c.gpu_used(&c.replicas);
        let gpus_fit = |n: &NodeView, m: &ModelView| {
            let need = m
                .measured_gpu_memory_bytes
                .unwrap_or(m.gpu_memory_estimate_bytes);
            let roomy = n
                .gpus
                .iter()
                .filter(|g| {
                    let held = gpu_used.get(&(n.id.clone(), g.index)).copied().unwrap_or(0);
                    g.memory_bytes.saturating_sub(held) >= need
                })
                .count();
            roomy >= m.gpus as usize
        };
        for m in &c.models {
            let hosts: BTreeSet<&str> = c
                .replicas
                .iter()
                .filter(|r| r.model == m.name && r.version == m.version)
                .map(|r| r.node.as_str())
                .collect();
            let live = hosts.iter().filter(|n| c.healthy_node(n)).count();
            let missing = last
                .unplaced
                .iter()
                .find(|u| u.model == m.name && u.version == m.version)
                .map_or(0, |u| u.missing as usize);
            assert_eq!(
                live + missing,
                m.replicas_wanted as usize,
                "seed {seed}: {m:?}"
            );
            if missing > 0 {
                let bytes = m.measured_memory_bytes.unwrap_or(m.memory_estimate_bytes);
                let fits = c.nodes.iter().find(|n| {
                    c.healthy_node(&n.id)
                        && !hosts.contains(n.id.as_str())
                        && n.memory_capacity_bytes
                            - used
                                .get(&n.id)
                                .copied()
                                .unwrap_or(0)
                                .min(n.memory_capacity_bytes)
                            >= bytes
                        && gpus_fit(n, m)
                });
                assert!(
                    fits.is_none(),
                    "seed {seed}: {} unplaced but {fits:?} fits",
                    m.name
                );
            }
        }
        for r in &c.replicas {
            assert!(c.model(&r.model, r.version).is_some(), "seed {seed}");
            assert!(c.node(&r.node).is_some_and(|n| n.up), "seed {seed}");
        }
        slowest = slowest.max(rounds);
    });
    // Drains and freed memory need more than one round; make sure the cases exercised that.
    assert!(slowest >= 2, "no random case needed a second round");
}

fn large_cluster() -> Cluster {
    let mut rng = Rng::new(42);
    let nodes = (0..1_000)
        .map(|i| NodeView {
            id: format!("node-{i:04}"),
            memory_capacity_bytes: 64 * GIB,
            cpu_millis_capacity: 32_000,
            up: true,
            drained: false,
            gpus: Vec::new(),
        })
        .collect();
    let models = (0..10_000)
        .map(|i| ModelView {
            name: format!("model-{i:05}"),
            version: 1,
            replicas_wanted: 1 + rng.below(3) as u32,
            memory_estimate_bytes: (1 + rng.below(8)) * HALF_GIB,
            measured_memory_bytes: None,
            gpus: 0,
            gpu_memory_estimate_bytes: 0,
            measured_gpu_memory_bytes: None,
        })
        .collect();
    Cluster {
        nodes,
        models,
        replicas: Vec::new(),
        load: Load::default(),
    }
}

#[test]
#[ignore = "timing harness: cargo test --release -p nereid-placement -- --ignored --nocapture"]
fn time_1000_nodes_by_10000_models() {
    let mut c = large_cluster();
    let started = Instant::now();
    let cold = c.plan();
    let cold_time = started.elapsed();
    c.replicas = c.apply(&cold, &mut 0);
    c.replicas.iter_mut().for_each(|r| r.ready = true);
    for (i, n) in c.nodes.iter_mut().enumerate() {
        n.up = i % 100 != 0;
        n.drained = i % 100 == 1;
    }
    c.load.node_utilization = (0..1_000)
        .map(|i| (format!("node-{i:04}"), (i % 10) as f64 / 10.0))
        .collect();
    let started = Instant::now();
    let warm = c.plan();
    let warm_time = started.elapsed();
    println!(
        "placement 1000 nodes x 10000 models: cold plan {cold_time:?} ({} adds, {} unplaced); \
         replan after 10 nodes down + 10 drained over {} replicas: {warm_time:?} \
         ({} adds, {} removes, {} unplaced)",
        cold.add.len(),
        cold.unplaced.len(),
        c.replicas.len(),
        warm.add.len(),
        warm.remove.len(),
        warm.unplaced.len()
    );
}
