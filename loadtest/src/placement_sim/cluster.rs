//! The simulated cluster: synthetic node and model views (heterogeneous node memory, skewed
//! model sizes, both from a seeded generator), the current replicas, applying a [`Plan`] as if
//! every worker loaded instantly, and the packing figures of the result.

use std::collections::{BTreeMap, HashSet};

use nereid_placement::{CurrentReplica, Load, ModelView, NodeView, Plan};

use crate::rng::SplitMix64;

/// Node memory sizes with relative weights: `64Gi:4,128Gi:2,256Gi:1`.
#[derive(Debug, Clone, PartialEq)]
pub struct Weighted(pub Vec<(u64, u32)>);

impl Weighted {
    fn pick(&self, rng: &mut SplitMix64) -> u64 {
        let total: u64 = self.0.iter().map(|(_, w)| u64::from(*w)).sum();
        let mut ticket = rng.below(total);
        for (size, w) in &self.0 {
            if ticket < u64::from(*w) {
                return *size;
            }
            ticket -= u64::from(*w);
        }
        self.0.last().map_or(0, |(s, _)| *s)
    }
}

/// Model memory between `min` and `max`, log-uniform raised to `skew`: `skew` 1 spreads sizes
/// evenly over orders of magnitude, larger values make most models small and a few large.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelSizes {
    pub min: u64,
    pub max: u64,
    pub skew: f64,
}

impl ModelSizes {
    fn pick(&self, rng: &mut SplitMix64) -> u64 {
        let ratio = self.max as f64 / self.min.max(1) as f64;
        let u = rng.next_f64().powf(self.skew);
        (self.min as f64 * ratio.powf(u)).round() as u64
    }
}

/// Nodes, models and replicas at one point of the simulation.
pub struct Cluster {
    pub nodes: Vec<NodeView>,
    pub models: Vec<ModelView>,
    pub replicas: Vec<CurrentReplica>,
    pub load: Load,
    next_replica: u64,
}

impl Cluster {
    /// `nodes` nodes and `models` models of one version wanting `replicas` each.
    pub fn generate(
        nodes: usize,
        models: usize,
        replicas: u32,
        node_memory: &Weighted,
        model_sizes: ModelSizes,
        rng: &mut SplitMix64,
    ) -> Cluster {
        let nodes = (0..nodes)
            .map(|i| NodeView {
                id: format!("node-{i:05}"),
                memory_capacity_bytes: node_memory.pick(rng),
                cpu_millis_capacity: 32_000,
                up: true,
                drained: false,
                gpus: Vec::new(),
            })
            .collect();
        let models = (0..models)
            .map(|i| ModelView {
                name: format!("model-{i:05}"),
                version: 1,
                replicas_wanted: replicas,
                memory_estimate_bytes: model_sizes.pick(rng),
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
            next_replica: 1,
        }
    }

    pub fn plan(&self) -> Plan {
        nereid_placement::plan(&self.nodes, &self.models, &self.replicas, &self.load)
    }

    /// Applies `plan` as if every worker answered at once: additions become ready replicas,
    /// removals disappear.
    pub fn apply(&mut self, plan: &Plan) {
        let removed: HashSet<u64> = plan.remove.iter().map(|r| r.replica).collect();
        self.replicas.retain(|r| !removed.contains(&r.id));
        for add in &plan.add {
            self.replicas.push(CurrentReplica {
                id: self.next_replica,
                model: add.model.clone(),
                version: add.version,
                node: add.node.clone(),
                ready: true,
                memory_bytes: None,
                gpus: add.gpus.clone(),
                gpu_memory_bytes: None,
            });
            self.next_replica += 1;
        }
    }

    /// Packing of the current replicas.
    pub fn packing(&self) -> Packing {
        let memory: BTreeMap<(&str, i64), u64> = self
            .models
            .iter()
            .map(|m| ((m.name.as_str(), m.version), m.replica_memory_bytes()))
            .collect();
        let mut used: BTreeMap<&str, u64> = BTreeMap::new();
        for r in &self.replicas {
            let bytes = memory
                .get(&(r.model.as_str(), r.version))
                .copied()
                .unwrap_or(0);
            *used.entry(r.node.as_str()).or_default() += bytes;
        }
        let usable: Vec<&NodeView> = self.nodes.iter().filter(|n| n.up).collect();
        let capacity = usable.iter().map(|n| n.memory_capacity_bytes).sum();
        let hosting_capacity = usable
            .iter()
            .filter(|n| used.contains_key(n.id.as_str()))
            .map(|n| n.memory_capacity_bytes)
            .sum();
        Packing {
            replicas: self.replicas.len() as u64,
            wanted: self
                .models
                .iter()
                .map(|m| u64::from(m.replicas_wanted))
                .sum(),
            used_bytes: used.values().sum(),
            hosting_nodes: used.len() as u64,
            hosting_capacity_bytes: hosting_capacity,
            up_nodes: usable.len() as u64,
            capacity_bytes: capacity,
        }
    }
}

/// How well the placed replicas fill the nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packing {
    pub replicas: u64,
    pub wanted: u64,
    pub used_bytes: u64,
    pub hosting_nodes: u64,
    pub hosting_capacity_bytes: u64,
    pub up_nodes: u64,
    pub capacity_bytes: u64,
}

impl Packing {
    /// Memory of placed replicas over the capacity of the nodes hosting at least one.
    pub fn efficiency(&self) -> f64 {
        ratio(self.used_bytes, self.hosting_capacity_bytes)
    }

    /// Memory of placed replicas over the capacity of every up node.
    pub fn utilization(&self) -> f64 {
        ratio(self.used_bytes, self.capacity_bytes)
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn generation_is_seeded_and_within_bounds() {
        let weights = Weighted(vec![(32 * GIB, 3), (128 * GIB, 1)]);
        let sizes = ModelSizes {
            min: GIB / 4,
            max: 16 * GIB,
            skew: 2.0,
        };
        let a = Cluster::generate(50, 200, 2, &weights, sizes, &mut SplitMix64::new(3));
        let b = Cluster::generate(50, 200, 2, &weights, sizes, &mut SplitMix64::new(3));
        assert_eq!(a.nodes, b.nodes);
        assert_eq!(a.models, b.models);
        assert!(
            a.nodes
                .iter()
                .all(|n| [32 * GIB, 128 * GIB].contains(&n.memory_capacity_bytes))
        );
        assert!(
            a.models
                .iter()
                .all(|m| (GIB / 4..=16 * GIB).contains(&m.memory_estimate_bytes))
        );
        let small = a
            .models
            .iter()
            .filter(|m| m.memory_estimate_bytes < 2 * GIB)
            .count();
        assert!(small > 100, "skew 2 makes most models small ({small}/200)");
    }

    #[test]
    fn apply_and_pack() {
        let weights = Weighted(vec![(64 * GIB, 1)]);
        let sizes = ModelSizes {
            min: GIB,
            max: GIB,
            skew: 1.0,
        };
        let mut c = Cluster::generate(4, 6, 2, &weights, sizes, &mut SplitMix64::new(1));
        let plan = c.plan();
        c.apply(&plan);
        assert!(c.plan().is_settled());
        let p = c.packing();
        assert_eq!((p.replicas, p.wanted, p.used_bytes), (12, 12, 12 * GIB));
        assert_eq!(p.hosting_nodes, 4);
        assert!((p.efficiency() - 12.0 / 256.0).abs() < 1e-9);
        assert!((p.utilization() - p.efficiency()).abs() < 1e-9);
    }
}
