//! Eviction over random clusters (fixed seeds, so failures reproduce): CPU-only nodes filled
//! with one replica per model, some pinned, some busy, some just placed, and models that want a
//! replica and find no room. One plan must never evict a protected replica, never leave a node
//! over its capacity once applied, and take the least recently used replicas of a node first.
//! Rounds over the same demand, applied as the leader applies them (an evicted model's demand
//! is forgotten), must settle: no flapping.

use std::collections::{BTreeMap, BTreeSet};

use super::proptests::{HALF_GIB, Rng};
use super::tests::GIB;
use super::*;

const CASES: u64 = 500;
const RESIDENCY: u64 = 30_000;
const ROUND_MS: u64 = 5_000;

struct World {
    nodes: Vec<NodeView>,
    /// Every model, with the floor (pinned count) and whether it is wanted (demanded).
    models: Vec<(ModelView, u32)>,
    demanded: BTreeSet<String>,
    replicas: Vec<CurrentReplica>,
    cache: Cache,
    next_id: u64,
}

impl World {
    fn random(rng: &mut Rng) -> World {
        let nodes: Vec<NodeView> = (0..1 + rng.below(4))
            .map(|i| NodeView {
                id: format!("n{i}"),
                memory_capacity_bytes: (2 + rng.below(7)) * GIB,
                cpu_millis_capacity: 4000,
                up: true,
                drained: false,
                gpus: Vec::new(),
            })
            .collect();
        let models: Vec<(ModelView, u32)> = (0..3 + rng.below(14))
            .map(|i| {
                let floor = u32::from(rng.chance(15));
                let view = ModelView {
                    name: format!("m{i:02}"),
                    version: 1,
                    replicas_wanted: 0,
                    memory_estimate_bytes: (1 + rng.below(4)) * HALF_GIB,
                    measured_memory_bytes: None,
                    gpus: 0,
                    gpu_memory_estimate_bytes: 0,
                    measured_gpu_memory_bytes: None,
                };
                (view, floor)
            })
            .collect();
        let mut w = World {
            nodes,
            models,
            demanded: BTreeSet::new(),
            replicas: Vec::new(),
            cache: Cache {
                evict: true,
                now_ms: 1_000_000,
                min_residency_ms: RESIDENCY,
                ..Default::default()
            },
            next_id: 0,
        };
        // Fill the nodes first fit, one replica per model, with random history.
        let mut used: BTreeMap<String, u64> = BTreeMap::new();
        for (m, floor) in w.models.clone() {
            if floor == 0 && rng.chance(30) {
                continue;
            }
            let bytes = m.memory_estimate_bytes;
            let Some(n) = w
                .nodes
                .iter()
                .find(|n| used.get(&n.id).copied().unwrap_or(0) + bytes <= n.memory_capacity_bytes)
            else {
                continue;
            };
            *used.entry(n.id.clone()).or_default() += bytes;
            w.next_id += 1;
            let id = w.next_id;
            w.replicas.push(CurrentReplica {
                id,
                model: m.name.clone(),
                version: 1,
                node: n.id.clone(),
                ready: !rng.chance(10),
                memory_bytes: rng.chance(30).then(|| bytes / 2 + rng.below(bytes)),
                gpus: Vec::new(),
                gpu_memory_bytes: None,
            });
            w.cache
                .placed_at_ms
                .insert(id, w.cache.now_ms - rng.below(2 * RESIDENCY));
            if rng.chance(20) {
                w.cache.busy.insert((m.name.clone(), 1, n.id.clone()));
            }
            w.demanded.insert(m.name.clone());
        }
        // Recency for most models; every model may be asked for.
        for (m, _) in &w.models {
            if rng.chance(80) {
                let t = w.cache.now_ms - rng.below(100_000);
                w.cache.last_used_ms.insert(m.name.clone(), t);
            }
            if rng.chance(40) {
                w.demanded.insert(m.name.clone());
            }
        }
        w
    }

    fn views(&mut self) -> (Vec<ModelView>, Load) {
        self.cache.floor = self
            .models
            .iter()
            .map(|(m, floor)| (m.name.clone(), *floor))
            .collect();
        let views = self
            .models
            .iter()
            .map(|(m, floor)| {
                let mut v = m.clone();
                v.replicas_wanted = (*floor).max(u32::from(self.demanded.contains(&m.name)));
                v
            })
            .collect();
        let load = Load {
            cache: self.cache.clone(),
            ..Default::default()
        };
        (views, load)
    }

    fn memory(&self, r: &CurrentReplica) -> u64 {
        let m = self.models.iter().find(|(m, _)| m.name == r.model);
        r.memory_bytes
            .or(m.map(|(m, _)| m.memory_estimate_bytes))
            .unwrap_or(0)
    }

    /// What an evictable replica is, written independently of the planner.
    fn evictable(&self, r: &CurrentReplica) -> bool {
        let floor = self
            .models
            .iter()
            .find(|(m, _)| m.name == r.model)
            .map_or(u32::MAX, |(_, f)| *f);
        r.ready
            && floor == 0
            && !self
                .cache
                .busy
                .contains(&(r.model.clone(), r.version, r.node.clone()))
            && self
                .cache
                .placed_at_ms
                .get(&r.id)
                .is_some_and(|&t| self.cache.now_ms - t >= RESIDENCY)
    }

    /// Applies a plan as the leader and workers do: evicted and removed replicas go, the
    /// added ones load at once (placed now), evicted models lose their demand.
    fn apply(&mut self, p: &Plan) {
        let gone: BTreeSet<u64> = p.remove.iter().map(|r| r.replica).collect();
        for r in self.replicas.iter().filter(|r| gone.contains(&r.id)) {
            let evicted = p
                .remove
                .iter()
                .any(|x| x.replica == r.id && matches!(x.reason, Reason::Evicted { .. }));
            if evicted {
                self.demanded.remove(&r.model);
            }
        }
        self.replicas.retain(|r| !gone.contains(&r.id));
        for a in &p.add {
            self.next_id += 1;
            self.replicas.push(CurrentReplica {
                id: self.next_id,
                model: a.model.clone(),
                version: a.version,
                node: a.node.clone(),
                ready: true,
                memory_bytes: None,
                gpus: Vec::new(),
                gpu_memory_bytes: None,
            });
            self.cache
                .placed_at_ms
                .insert(self.next_id, self.cache.now_ms);
        }
    }
}

#[test]
fn one_plan_evicts_only_idle_unpinned_old_replicas_least_recent_first_within_capacity() {
    let mut evictions = 0;
    for seed in 0..CASES {
        let mut rng = Rng::new(seed);
        let mut w = World::random(&mut rng);
        let (models, load) = w.views();
        let p = plan(&w.nodes, &models, &w.replicas, &load);
        let victims: BTreeSet<u64> = p
            .remove
            .iter()
            .filter(|r| matches!(r.reason, Reason::Evicted { .. }))
            .map(|r| r.replica)
            .collect();
        evictions += victims.len();
        let by_id: BTreeMap<u64, &CurrentReplica> = w.replicas.iter().map(|r| (r.id, r)).collect();
        for id in &victims {
            let r = by_id[id];
            assert!(
                w.evictable(r),
                "seed {seed}: evicted a protected replica {r:?}"
            );
        }
        // Least recently used first, per node: no evictable replica left behind on a node
        // was used before one evicted there.
        let last = |r: &CurrentReplica| w.cache.last_used_ms.get(&r.model).copied().unwrap_or(0);
        for n in &w.nodes {
            let on = |r: &&CurrentReplica| r.node == n.id;
            let newest_victim = victims
                .iter()
                .map(|id| by_id[id])
                .filter(on)
                .map(last)
                .max();
            let Some(newest_victim) = newest_victim else {
                continue;
            };
            let placed_here: BTreeSet<&str> = p
                .add
                .iter()
                .filter(|a| a.node == n.id)
                .map(|a| a.model.as_str())
                .collect();
            for r in w.replicas.iter().filter(on) {
                if victims.contains(&r.id) || !w.evictable(r) {
                    continue;
                }
                assert!(
                    last(r) >= newest_victim || placed_here.contains(r.model.as_str()),
                    "seed {seed}: kept {r:?} (used at {}) but evicted one used at {newest_victim}",
                    last(r)
                );
            }
        }
        // Applied (evictions out, additions in at the model's figure), no node is over.
        let mut used: BTreeMap<&str, u64> = BTreeMap::new();
        for r in w.replicas.iter().filter(|r| !victims.contains(&r.id)) {
            *used.entry(r.node.as_str()).or_default() += w.memory(r);
        }
        for a in &p.add {
            let m = models
                .iter()
                .find(|m| m.name == a.model)
                .map_or(0, |m| m.replica_memory_bytes());
            *used.entry(a.node.as_str()).or_default() += m;
        }
        for n in &w.nodes {
            let before: u64 = w
                .replicas
                .iter()
                .filter(|r| r.node == n.id)
                .map(|r| w.memory(r))
                .sum();
            let after = used.get(n.id.as_str()).copied().unwrap_or(0);
            assert!(
                after <= n.memory_capacity_bytes.max(before),
                "seed {seed}: node {} holds {after} of {}",
                n.id,
                n.memory_capacity_bytes
            );
        }
        // Every addition that evicted names exactly its victims.
        let named: BTreeSet<u64> = p
            .add
            .iter()
            .flat_map(|a| a.evicted.iter().map(|e| e.replica))
            .collect();
        assert_eq!(named, victims, "seed {seed}");
    }
    assert!(
        evictions > CASES as usize / 4,
        "the cases evict: {evictions}"
    );
}

#[test]
fn rounds_over_the_same_demand_settle_without_flapping() {
    for seed in 0..CASES {
        let mut rng = Rng::new(seed);
        let mut w = World::random(&mut rng);
        w.cache.busy.clear();
        let mut quiet = 0;
        for round in 0..60 {
            let (models, load) = w.views();
            let p = plan(&w.nodes, &models, &w.replicas, &load);
            for r in &p.remove {
                if matches!(r.reason, Reason::Evicted { .. }) {
                    let placed = w.cache.placed_at_ms[&r.replica];
                    assert!(
                        w.cache.now_ms - placed >= RESIDENCY,
                        "seed {seed} round {round}: evicted a replica placed {} ms ago",
                        w.cache.now_ms - placed
                    );
                }
            }
            if p.is_settled() {
                quiet += 1;
                if quiet == 2 {
                    break;
                }
            } else {
                quiet = 0;
            }
            w.apply(&p);
            w.cache.now_ms += ROUND_MS;
        }
        assert_eq!(quiet, 2, "seed {seed}: rounds did not settle");
    }
}
