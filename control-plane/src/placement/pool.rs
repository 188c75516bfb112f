//! The node pool: per-node used memory and an ordered index of eligible nodes (up, undrained)
//! by free memory, so choosing a node for a replica costs O(log nodes) plus one skip per node
//! that already holds the model version, never a scan of all nodes.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use super::{Load, NodeView, Reason};

/// Order of candidates: most free memory first (spreads load, keeps room for large models),
/// ties broken by lower load, then by node id (nodes are indexed in id order).
type Key = (Reverse<u64>, u32, usize);

pub(crate) struct PoolNode<'a> {
    pub view: &'a NodeView,
    pub used: u64,
    pub load_ppm: u32,
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
}

pub(crate) struct NodePool<'a> {
    nodes: Vec<PoolNode<'a>>,
    by_id: BTreeMap<&'a str, usize>,
    candidates: BTreeSet<Key>,
}

impl<'a> NodePool<'a> {
    /// Builds the pool with the memory of the current replicas already charged. A node id that
    /// appears twice keeps its first view.
    pub fn new(
        nodes: &'a [NodeView],
        load: &Load,
        charged: impl IntoIterator<Item = (&'a str, u64)>,
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
            })
            .collect();
        for (id, bytes) in charged {
            if let Some(&i) = by_id.get(id) {
                nodes[i].used = nodes[i].used.saturating_add(bytes);
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

    /// Charges a replica being added to a node.
    pub fn charge(&mut self, index: usize, bytes: u64) {
        let node = &mut self.nodes[index];
        let was = node.key(index);
        node.used = node.used.saturating_add(bytes);
        if self.candidates.remove(&was) {
            self.candidates.insert(self.nodes[index].key(index));
        }
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
}
