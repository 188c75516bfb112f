//! The node pool: per-node used memory and an ordered index of eligible nodes (up, undrained)
//! by free memory, so choosing a node for a replica costs O(log nodes) plus one skip per node
//! that already holds the model version, never a scan of all nodes. A GPU model walks the same
//! order until a node also has the GPUs it needs ([`NodePool::pick_gpus`]).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use super::{CurrentReplica, Load, ModelView, NodeView, Reason};
use crate::units::format_bytes;

/// How many skipped nodes an explanation names before it summarizes the rest.
const SKIPPED_NAMED: usize = 8;

/// Where a GPU replica goes: the node and its GPU indices (ascending), and why the nodes tried
/// before it could not take it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GpuPick {
    pub node: usize,
    pub gpus: Vec<u32>,
    pub skipped: Vec<String>,
}

/// Order of candidates: most free memory first (spreads load, keeps room for large models),
/// ties broken by lower load, then by node id (nodes are indexed in id order).
type Key = (Reverse<u64>, u32, usize);

#[derive(Clone)]
pub(crate) struct PoolNode<'a> {
    pub view: &'a NodeView,
    pub used: u64,
    pub load_ppm: u32,
    /// GPU memory charged per GPU, in the order of `view.gpus`.
    pub gpu_used: Vec<u64>,
}

impl PoolNode<'_> {
    pub fn free(&self) -> u64 {
        self.view.memory_capacity_bytes.saturating_sub(self.used)
    }

    pub fn eligible(&self) -> bool {
        self.view.up && !self.view.drained
    }

    fn key(&self, index: usize) -> Key {
        (Reverse(self.free()), self.load_ppm, index)
    }

    /// Free memory of each GPU as (free, index).
    pub fn gpu_free(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.view
            .gpus
            .iter()
            .zip(&self.gpu_used)
            .map(|(g, used)| (g.memory_bytes.saturating_sub(*used), g.index))
    }

    /// The `count` GPUs with the most free memory (ties: lower index), ascending by index, if
    /// each has `bytes` free; otherwise why not, in words.
    pub fn fit_gpus(&self, count: u32, bytes: u64) -> Result<Vec<u32>, String> {
        let id = &self.view.id;
        if self.view.gpus.is_empty() {
            return Err(format!("node {id}: no GPU"));
        }
        if self.view.gpus.len() < count as usize {
            return Err(format!(
                "node {id}: has {} GPU(s), needs {count}",
                self.view.gpus.len()
            ));
        }
        let mut by_free: Vec<(u64, u32)> = self.gpu_free().collect();
        by_free.sort_by_key(|&(free, index)| (Reverse(free), index));
        let chosen = &by_free[..count as usize];
        if let Some(&(free, index)) = chosen.iter().find(|(free, _)| *free < bytes) {
            let which = if count == 1 {
                format!("GPU {index}")
            } else {
                format!(
                    "only {} GPU(s) fit; GPU {index}",
                    chosen.iter().filter(|(f, _)| *f >= bytes).count()
                )
            };
            return Err(format!(
                "node {id}: {which} has {} free, needs {}",
                format_bytes(free),
                format_bytes(bytes)
            ));
        }
        let mut gpus: Vec<u32> = chosen.iter().map(|&(_, index)| index).collect();
        gpus.sort_unstable();
        Ok(gpus)
    }
}

pub(crate) struct NodePool<'a> {
    nodes: Vec<PoolNode<'a>>,
    by_id: BTreeMap<&'a str, usize>,
    candidates: BTreeSet<Key>,
}

/// A model version: (name, version).
pub(crate) type ModelKey<'a> = (&'a str, i64);

/// What a replica holds, host memory and on each of its GPUs: its own measurement, else the
/// model's, else the model's estimate.
pub(crate) fn replica_charge<'a>(
    replica: &'a CurrentReplica,
    model: Option<&ModelView>,
) -> Charge<'a> {
    Charge {
        memory: replica
            .memory_bytes
            .or_else(|| model.map(ModelView::replica_memory_bytes))
            .unwrap_or(0),
        gpus: &replica.gpus,
        gpu_memory: replica
            .gpu_memory_bytes
            .or_else(|| model.map(ModelView::replica_gpu_memory_bytes))
            .unwrap_or(0),
    }
}

/// What a replica takes from its node: host memory, and memory on each of its GPUs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Charge<'g> {
    pub memory: u64,
    pub gpus: &'g [u32],
    pub gpu_memory: u64,
}

impl PoolNode<'_> {
    /// GPUs the node does not (or no longer) report are not charged.
    fn charge(&mut self, charge: &Charge) {
        self.used = self.used.saturating_add(charge.memory);
        for index in charge.gpus {
            if let Some(at) = self.view.gpus.iter().position(|g| g.index == *index) {
                self.gpu_used[at] = self.gpu_used[at].saturating_add(charge.gpu_memory);
            }
        }
    }

    /// Gives back what [`Self::charge`] took (a replica leaving in this very plan).
    pub fn release(&mut self, charge: &Charge) {
        self.used = self.used.saturating_sub(charge.memory);
        for index in charge.gpus {
            if let Some(at) = self.view.gpus.iter().position(|g| g.index == *index) {
                self.gpu_used[at] = self.gpu_used[at].saturating_sub(charge.gpu_memory);
            }
        }
    }
}

impl<'a> NodePool<'a> {
    /// Builds the pool with the memory of the current replicas already charged. A node id that
    /// appears twice keeps its first view.
    pub fn new(
        nodes: &'a [NodeView],
        load: &Load,
        charged: impl IntoIterator<Item = (&'a str, Charge<'a>)>,
    ) -> Self {
        let mut sorted: Vec<&NodeView> = nodes.iter().collect();
        sorted.sort_by(|a, b| a.id.cmp(&b.id));
        sorted.dedup_by(|b, a| a.id == b.id);
        let by_id = sorted
            .iter()
            .enumerate()
            .map(|(i, n)| (n.id.as_str(), i))
            .collect::<BTreeMap<_, _>>();
        let mut nodes: Vec<PoolNode> = sorted
            .into_iter()
            .map(|view| PoolNode {
                view,
                used: 0,
                load_ppm: load.ppm(&view.id),
                gpu_used: vec![0; view.gpus.len()],
            })
            .collect();
        for (id, charge) in charged {
            if let Some(&i) = by_id.get(id) {
                nodes[i].charge(&charge);
            }
        }
        let candidates = nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.eligible())
            .map(|(i, n)| n.key(i))
            .collect();
        NodePool {
            nodes,
            by_id,
            candidates,
        }
    }

    pub fn index_of(&self, id: &str) -> Option<usize> {
        self.by_id.get(id).copied()
    }

    pub fn node(&self, index: usize) -> &PoolNode<'a> {
        &self.nodes[index]
    }

    /// How many distinct nodes the pool holds (indices are `0..len`, in id order).
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Charges a replica being added to a node.
    pub fn charge(&mut self, index: usize, charge: &Charge) {
        let node = &mut self.nodes[index];
        let was = node.key(index);
        node.charge(charge);
        if self.candidates.remove(&was) {
            self.candidates.insert(self.nodes[index].key(index));
        }
    }

    /// Releases what a replica evicted in this plan held on a node (its removal is written
    /// before the addition that takes its room).
    pub fn release(&mut self, index: usize, charge: &Charge) {
        let node = &mut self.nodes[index];
        let was = node.key(index);
        node.release(charge);
        if self.candidates.remove(&was) {
            self.candidates.insert(self.nodes[index].key(index));
        }
    }

    /// Whether some eligible node outside `exclude` has `bytes` of capacity at all (empty or
    /// not): if none has, no eviction can make room.
    pub fn has_capacity_for(&self, bytes: u64, exclude: &BTreeSet<usize>) -> bool {
        self.candidates.iter().any(|&(_, _, i)| {
            !exclude.contains(&i) && self.nodes[i].view.memory_capacity_bytes >= bytes
        })
    }

    /// The best eligible node outside `exclude` with at least `bytes` free, or the reason there
    /// is none.
    pub fn pick(&self, bytes: u64, exclude: &BTreeSet<usize>) -> Result<usize, Reason> {
        let best = self
            .candidates
            .iter()
            .find(|(_, _, i)| !exclude.contains(i));
        match best {
            Some(&(Reverse(free), _, i)) if free >= bytes => Ok(i),
            Some(&(Reverse(free), _, _)) => Err(Reason::NoCapacity {
                needed: bytes,
                best_free: free,
            }),
            None => Err(Reason::NotEnoughNodes {
                eligible_nodes: self.candidates.len(),
            }),
        }
    }

    /// For a model that needs `gpus` GPUs with `gpu_bytes` free each (and `bytes` of host
    /// memory): the first eligible node outside `exclude`, in the order of [`Self::pick`], that
    /// has them, the GPUs with the most free memory there, and why the nodes before it did not
    /// fit. Without such a node: the reason, naming the nodes tried.
    pub fn pick_gpus(
        &self,
        bytes: u64,
        gpus: u32,
        gpu_bytes: u64,
        exclude: &BTreeSet<usize>,
    ) -> Result<GpuPick, Reason> {
        let mut skipped = Vec::new();
        let mut tried = 0usize;
        let mut best_free = None;
        for &(Reverse(free), _, i) in self
            .candidates
            .iter()
            .filter(|(_, _, i)| !exclude.contains(i))
        {
            best_free.get_or_insert(free);
            if free < bytes {
                // Candidates are ordered by free memory: no later node has more.
                break;
            }
            match self.nodes[i].fit_gpus(gpus, gpu_bytes) {
                Ok(chosen) => {
                    return Ok(GpuPick {
                        node: i,
                        gpus: chosen,
                        skipped: summarize(skipped, tried),
                    });
                }
                Err(why) => {
                    tried += 1;
                    if skipped.len() < SKIPPED_NAMED {
                        skipped.push(why);
                    }
                }
            }
        }
        match best_free {
            None => Err(Reason::NotEnoughNodes {
                eligible_nodes: self.candidates.len(),
            }),
            Some(free) if tried == 0 => Err(Reason::NoCapacity {
                needed: bytes,
                best_free: free,
            }),
            Some(_) => Err(Reason::NoGpuCapacity {
                gpus,
                needed_per_gpu: gpu_bytes,
                skipped: summarize(skipped, tried),
            }),
        }
    }
}

/// The named skips, and one line for the nodes tried beyond them.
fn summarize(mut named: Vec<String>, tried: usize) -> Vec<String> {
    if tried > named.len() {
        let more = tried - named.len();
        named.push(format!("{more} more node(s) without room on their GPUs"));
    }
    named
}
