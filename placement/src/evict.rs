//! Eviction, the model cache's rule: when a missing replica finds no node with room, the least
//! recently used idle replicas of one node make room for it, in the same plan.
//!
//! ```text
//!  plan_model: pick fails (NoCapacity / NoGpuCapacity) ─► Evictor::make_room
//!    per eligible node that does not hold the version: its evictable replicas, least recently
//!    used first, taken one by one until the replica fits (host memory and, for a GPU model,
//!    GPUs with room); the best node is the one whose most recently used victim is the least
//!    recent, then the fewest victims, the least memory freed, the node order
//!  ─► Removal { Evicted } per victim (memory released in the pool) + Addition { evicted }
//!  no node ─► Unplaced { CacheFull { cause, held } }
//! ```
//!
//! Evictable: a ready replica on an up, undrained node, of a registered model version with
//! replicas above its floor ([`Cache::floor`]: `min_replicas` or the autoscaler's count, the
//! pinned part), idle (not in [`Cache::busy`]: nothing in flight or queued, no live sequence),
//! placed at least [`Cache::min_residency_ms`] ago, of a version no rebalancing move touches,
//! not removed by this plan already and not of the model being placed. Victims are charged
//! with the memory placement counts for them (measured, else the model's figure), so the node
//! never holds more than its capacity once the plan is applied: the leader writes the
//! evictions before the addition.
//!
//! Why it does not flap: a replica stays at least the minimum residency once placed, whatever
//! the demand; the leader forgets the activation of an evicted model, so only a new request
//! brings it back; and a replica that serves requests is never evicted.

use std::collections::{BTreeMap, BTreeSet};

use super::pool::{Charge, ModelKey, NodePool, PoolNode, replica_charge};
use super::{Cache, CurrentReplica, Evicted, ModelView, Move, Plan, Reason, Removal};

/// An evictable replica.
struct Candidate<'a> {
    replica: &'a CurrentReplica,
    charge: Charge<'a>,
    last_used: u64,
}

/// Ready replicas that could not be candidates, by why: for [`Reason::CacheFull`].
#[derive(Debug, Default)]
struct Held {
    pinned: usize,
    busy: usize,
    recent: usize,
    moving: usize,
}

/// The evictable replicas of one plan, per node, least recently used first.
pub(super) struct Evictor<'a> {
    cache: &'a Cache,
    by_node: BTreeMap<usize, Vec<Candidate<'a>>>,
    /// Per model version: how many more of its replicas may go before it is at its floor.
    budget: BTreeMap<ModelKey<'a>, u32>,
    held: Held,
}

/// Where a replica goes once `evicted` have made room: the node and, for a GPU model, its GPUs.
pub(super) struct Room {
    pub node: usize,
    pub gpus: Vec<u32>,
    pub evicted: Vec<Evicted>,
}

/// A node's best set of victims: rank, positions in the node's list, the GPUs it frees.
type Choice = ((u64, usize, u64, usize), Vec<usize>, Vec<u32>);

impl<'a> Evictor<'a> {
    pub fn new(
        cache: &'a Cache,
        models: &BTreeMap<ModelKey<'a>, &'a ModelView>,
        replicas: &'a [CurrentReplica],
        moves: &[Move],
        pool: &NodePool,
    ) -> Self {
        let moving: BTreeSet<(&str, i64)> = moves
            .iter()
            .map(|m| (m.model.as_str(), m.version))
            .collect();
        let eligible =
            |r: &CurrentReplica| pool.index_of(&r.node).filter(|&i| pool.node(i).eligible());
        let mut count: BTreeMap<ModelKey, u32> = BTreeMap::new();
        for r in replicas {
            let key = (r.model.as_str(), r.version);
            if models.contains_key(&key) && eligible(r).is_some() {
                *count.entry(key).or_default() += 1;
            }
        }
        let budget: BTreeMap<ModelKey, u32> = count
            .into_iter()
            .map(|(key, n)| {
                let floor = cache.floor.get(key.0).copied().unwrap_or(u32::MAX);
                (key, n.saturating_sub(floor))
            })
            .collect();
        let mut held = Held::default();
        let mut by_node: BTreeMap<usize, Vec<Candidate>> = BTreeMap::new();
        for r in replicas.iter().filter(|r| r.ready) {
            let key = (r.model.as_str(), r.version);
            let (Some(&model), Some(i)) = (models.get(&key), eligible(r)) else {
                continue;
            };
            if budget.get(&key).is_none_or(|&b| b == 0) {
                held.pinned += 1;
            } else if moving.contains(&key) {
                held.moving += 1;
            } else if cache
                .busy
                .contains(&(r.model.clone(), r.version, r.node.clone()))
            {
                held.busy += 1;
            } else if cache.placed_at_ms.get(&r.id).is_none_or(|&at| {
                // Resident and idle for the minimum residency: counted from its placement or
                // its model's last use, whichever is later, so a replica in steady use is never
                // the only one old enough to go (the hot set stays when the cache turns over).
                let last = cache.last_used_ms.get(&r.model).map_or(at, |&u| u.max(at));
                cache.now_ms.saturating_sub(last) < cache.min_residency_ms
            }) {
                held.recent += 1;
            } else {
                by_node.entry(i).or_default().push(Candidate {
                    replica: r,
                    charge: replica_charge(r, Some(model)),
                    last_used: cache.last_used_ms.get(&r.model).copied().unwrap_or(0),
                });
            }
        }
        for list in by_node.values_mut() {
            list.sort_by_key(|c| {
                (
                    c.last_used,
                    c.replica.model.as_str(),
                    c.replica.version,
                    c.replica.id,
                )
            });
        }
        Evictor {
            cache,
            by_node,
            budget,
            held,
        }
    }

    /// Evicts least-recently-used idle replicas on the best node outside `exclude` so that a
    /// replica of `model` fits there: their removals go into `out`, their memory back into the
    /// pool. `None` (and nothing changed) when no node can make room.
    pub fn make_room(
        &mut self,
        model: &ModelView,
        exclude: &BTreeSet<usize>,
        pool: &mut NodePool,
        out: &mut Plan,
    ) -> Option<Room> {
        let removed: BTreeSet<u64> = out.remove.iter().map(|r| r.replica).collect();
        let mut best: Option<Choice> = None;
        for (&i, list) in &self.by_node {
            if exclude.contains(&i) {
                continue;
            }
            let Some(choice) = self.victims_on(pool.node(i), i, list, model, &removed) else {
                continue;
            };
            if best.as_ref().is_none_or(|(rank, _, _)| choice.0 < *rank) {
                best = Some(choice);
            }
        }
        let ((_, _, _, node), taken, gpus) = best?;
        let mut evicted = Vec::new();
        let mut gone = BTreeSet::new();
        if let Some(list) = self.by_node.get(&node) {
            for &at in &taken {
                let c = &list[at];
                let r = c.replica;
                pool.release(node, &c.charge);
                if let Some(b) = self.budget.get_mut(&(r.model.as_str(), r.version)) {
                    *b = b.saturating_sub(1);
                }
                out.remove.push(Removal {
                    replica: r.id,
                    reason: Reason::Evicted {
                        for_model: model.name.clone(),
                        version: model.version,
                        idle_ms: self
                            .cache
                            .last_used_ms
                            .get(&r.model)
                            .map(|&t| self.cache.now_ms.saturating_sub(t)),
                    },
                });
                evicted.push(Evicted {
                    replica: r.id,
                    model: r.model.clone(),
                    version: r.version,
                });
                gone.insert(r.id);
            }
        }
        if let Some(list) = self.by_node.get_mut(&node) {
            list.retain(|c| !gone.contains(&c.replica.id));
        }
        Some(Room {
            node,
            gpus,
            evicted,
        })
    }

    /// On node `i`: the least recently used candidates, in order, until a replica of `model`
    /// fits; `None` when all of them together are not enough.
    fn victims_on(
        &self,
        node: &PoolNode,
        i: usize,
        list: &[Candidate],
        model: &ModelView,
        removed: &BTreeSet<u64>,
    ) -> Option<Choice> {
        let bytes = model.replica_memory_bytes();
        let gpu_bytes = model.replica_gpu_memory_bytes();
        let mut sim = node.clone();
        let mut taken_of: BTreeMap<ModelKey, u32> = BTreeMap::new();
        let mut taken = Vec::new();
        let (mut newest, mut freed) = (0u64, 0u64);
        for (at, c) in list.iter().enumerate() {
            let r = c.replica;
            if r.model == model.name || removed.contains(&r.id) {
                continue;
            }
            let key = (r.model.as_str(), r.version);
            let left = self.budget.get(&key).copied().unwrap_or(0);
            let n = taken_of.entry(key).or_default();
            // A GPU model short of GPU room only: a CPU replica frees nothing it needs.
            let useless = sim.free() >= bytes && c.charge.gpus.is_empty();
            if *n >= left || useless {
                continue;
            }
            *n += 1;
            sim.release(&c.charge);
            taken.push(at);
            newest = newest.max(c.last_used);
            freed = freed.saturating_add(c.charge.memory);
            if sim.free() < bytes {
                continue;
            }
            if model.gpus == 0 {
                return Some(((newest, taken.len(), freed, i), taken, Vec::new()));
            }
            if let Ok(gpus) = sim.fit_gpus(model.gpus, gpu_bytes) {
                return Some(((newest, taken.len(), freed, i), taken, gpus));
            }
        }
        None
    }

    /// Why nothing could be evicted, in words; `None` when no ready replica runs on an eligible
    /// node (eviction had nothing to consider, the plain reason says it all).
    pub fn held(&self) -> Option<String> {
        let h = &self.held;
        let mut parts = Vec::new();
        let residency = match self.cache.min_residency_ms {
            ms if ms % 1000 == 0 => format!("{} s", ms / 1000),
            ms => format!("{ms} ms"),
        };
        for (n, what) in [
            (
                h.pinned,
                "pinned (min_replicas or the autoscaler's count)".to_string(),
            ),
            (
                h.busy,
                "serving requests or holding a live sequence".to_string(),
            ),
            (
                h.recent,
                format!("placed or used less than {residency} ago"),
            ),
            (h.moving, "part of a rebalancing move".to_string()),
        ] {
            if n > 0 {
                parts.push(format!("{n} {what}"));
            }
        }
        let idle: usize = self.by_node.values().map(Vec::len).sum();
        if idle > 0 {
            parts.push(format!(
                "the {idle} idle replica(s) do not free enough on any one node"
            ));
        }
        if parts.is_empty() {
            return None;
        }
        Some(format!("of the ready replicas, {}", parts.join("; ")))
    }
}
