//! `nereid-placement`: the cluster's placement core, with no I/O, consensus or storage, so that
//! the control plane's leader (`nereid-control-plane`, which builds the views from its state)
//! and the load generator's placement simulator (`nereid-loadtest placement-sim`) run the same
//! code. Entry points: [`plan`] over [`NodeView`], [`ModelView`], [`CurrentReplica`] and
//! [`Load`], giving a [`Plan`]; [`parse_bytes`] and [`format_bytes`]: byte sizes as operators
//! write them (`512Mi`, `2Gi`) and as explanations show them (`2.0 GiB`).
//!
//! Placement: a pure function from (nodes, models, current replicas, load) to a [`Plan`] of
//! replicas to add, replicas to remove and replicas that cannot be placed, each with the
//! [`Reason`] (the rule that fired) that `GET /api/v1/models/{name}/placement` shows.
//!
//! ```text
//!  NodeView[] ──┐
//!  ModelView[] ─┼─► plan() ── per model version, largest first ──► classify its replicas:
//!  CurrentReplica[] ┤            healthy (up, undrained) │ draining │ dead │ duplicate │ orphan
//!  Load ────────┘                                        ▼
//!                 remove: dead, duplicates, orphans, surplus (scale down), drained once replaced
//!                 add:    missing replicas on the node with the most free memory (NodePool)
//!                 unplaced: what no node can take, with the reason
//! ```
//!
//! The function never sees the control plane's state: callers build the views, so the core stays
//! pure and is tested by properties (`proptests.rs`). Memory is counted conservatively: a replica
//! being removed still holds its memory in this round (make-before-break may load the new replica
//! before the old one unloads), so applying a plan in any order never over-commits a node. The
//! next round sees the freed memory. Drain is make-before-break over rounds: the first plan adds
//! the replacement, a later plan (once the replacement is `ready`) removes the drained replica.
//!
//! GPUs: a model version that wants GPUs (`gpus > 0`) also needs, on its node, that many
//! distinct GPUs each with `gpu_memory` free (the GPU's reported total minus what the replicas
//! assigned to it take: their measured GPU memory, else the model's, else its estimate). Among
//! the eligible nodes, in the usual order, the first that has them wins and the replica is
//! assigned the GPUs with the most free memory there ([`Addition::gpus`]); the nodes passed over
//! are explained ([`Addition::skipped`], [`Reason::NoGpuCapacity`]). GPU memory is counted as
//! conservatively as host memory, so applying a plan never over-commits a GPU either.
//!
//! Rebalancing ([`Rebalance`], off unless the leader sets a budget): after the rules above, when
//! eligible nodes are badly skewed, ready replicas move make-before-break — an [`Addition`] with
//! [`Addition::moves`] names the replica it replaces; later plans treat that replica like a
//! drained one (kept until enough replicas are ready elsewhere, then removed). The rule and why
//! it cannot oscillate are in `rebalance.rs`.
//!
//! Model cache ([`Cache`], on when the leader sets `evict`): a missing replica that no node has
//! room for may take the place of least-recently-used idle replicas on one node — they are
//! removed ([`Reason::Evicted`]) and the replica added ([`Addition::evicted`]) in the same plan.
//! Which replicas may go and how the node is chosen are in `evict.rs`.

#![warn(missing_docs)]

mod evict;
mod explain;
mod plan;
mod pool;
mod rebalance;
mod units;

#[cfg(test)]
mod evict_proptests;
#[cfg(test)]
mod evict_tests;
#[cfg(test)]
mod gpu_tests;
#[cfg(test)]
mod proptests;
#[cfg(test)]
mod rebalance_proptests;
#[cfg(test)]
mod rebalance_tests;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};

pub use plan::plan;
pub use units::{format_bytes, parse_bytes};

/// A worker node as placement sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    /// The worker's node id, unique in the cluster.
    pub id: String,
    /// Memory available to model replicas; the sum of replica memory never exceeds it.
    pub memory_capacity_bytes: u64,
    /// Reported for explanations and future CPU-aware rules; not a constraint yet.
    pub cpu_millis_capacity: u64,
    /// False once the leader declared the node down (missed heartbeats): its replicas are dead.
    pub up: bool,
    /// An operator asked to empty the node: nothing new lands here, replicas move away
    /// make-before-break.
    pub drained: bool,
    /// The GPUs the worker registered; empty for a node without GPUs.
    pub gpus: Vec<GpuView>,
}

/// One GPU of a node: its device index on the worker and its total memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuView {
    /// The device index on the worker (`CUDA_VISIBLE_DEVICES` numbering).
    pub index: u32,
    /// Total memory of the device.
    pub memory_bytes: u64,
}

/// One version of a model and how many replicas it wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelView {
    /// The model's registered name.
    pub name: String,
    /// The version number.
    pub version: i64,
    /// Replicas the version should have this round (the control plane's view of its floor,
    /// autoscaler and demand).
    pub replicas_wanted: u32,
    /// Used for replicas until a worker has measured one.
    pub memory_estimate_bytes: u64,
    /// Measured memory of a loaded replica; preferred over the estimate once known.
    pub measured_memory_bytes: Option<u64>,
    /// GPUs one replica needs, all on its node; 0 for a CPU-only model.
    pub gpus: u32,
    /// Memory a replica needs on each of its GPUs until a worker has measured one.
    pub gpu_memory_estimate_bytes: u64,
    /// Measured GPU memory (per GPU) of a loaded replica; preferred over the estimate.
    pub measured_gpu_memory_bytes: Option<u64>,
}

impl ModelView {
    /// Memory a new replica of this model is expected to take.
    pub fn replica_memory_bytes(&self) -> u64 {
        self.measured_memory_bytes
            .unwrap_or(self.memory_estimate_bytes)
    }

    /// GPU memory a new replica of this model is expected to take on each of its GPUs.
    pub fn replica_gpu_memory_bytes(&self) -> u64 {
        self.measured_gpu_memory_bytes
            .unwrap_or(self.gpu_memory_estimate_bytes)
    }
}

/// A replica that exists in the current placement (any state short of unloaded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CurrentReplica {
    /// The replica's id, unique for the life of the cluster.
    pub id: u64,
    /// Its model's name.
    pub model: String,
    /// Its model version.
    pub version: i64,
    /// The node it is on.
    pub node: String,
    /// Loaded and serving; only ready replicas let a drained replica go.
    pub ready: bool,
    /// Memory the worker measured for this very replica, when it has.
    pub memory_bytes: Option<u64>,
    /// The GPU indices of its node the replica was assigned; empty for a CPU replica.
    pub gpus: Vec<u32>,
    /// GPU memory (per GPU) the worker measured for this very replica, when it has.
    pub gpu_memory_bytes: Option<u64>,
}

/// Soft state the leader observed: per-node utilization in `0.0..=1.0` from heartbeats, used
/// only to break ties (nodes without an entry count as idle), the models routers asked to
/// activate recently (scale from zero; see `views::model_views`), the rebalancing budget
/// with the moves in flight, and what eviction needs to know (the model cache).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Load {
    /// Per node id: utilization in `0.0..=1.0` from its latest heartbeat.
    pub node_utilization: BTreeMap<String, f64>,
    /// Models routers asked to activate recently (scale from zero).
    pub demanded: BTreeSet<String>,
    /// The rebalancing budget and the moves in flight.
    pub rebalance: Rebalance,
    /// What eviction needs to know.
    pub cache: Cache,
}

/// The model cache (more models than memory): what eviction needs to know. With `evict` off
/// (the default) a replica that does not fit stays unplaced, as without a cache.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cache {
    /// Make room for a missing replica by evicting least-recently-used idle replicas.
    pub evict: bool,
    /// The leader's clock in milliseconds (any epoch; the times below are on the same clock).
    pub now_ms: u64,
    /// A replica placed, or whose model was used, less than this long ago is never evicted
    /// (hysteresis: what was just loaded for a request stays long enough to serve it and the
    /// ones after it, and a model in steady use stays whatever its replica's age).
    pub min_residency_ms: u64,
    /// Per model: when a request for it was last seen (a worker's heartbeat counted one, or a
    /// router activated it). A model without an entry counts as used at 0, the least recent.
    pub last_used_ms: BTreeMap<String, u64>,
    /// Per replica id: when it was placed, as far as the leader knows. A replica without an
    /// entry is never evicted.
    pub placed_at_ms: BTreeMap<u64, u64>,
    /// Per model: replicas per served version it keeps whatever its recency (`min_replicas`,
    /// or the autoscaler's count): those are pinned. A model without an entry is never evicted.
    pub floor: BTreeMap<String, u32>,
    /// (model, version, node) with requests in flight or queued, or a live sequence, in the
    /// latest heartbeats: such replicas are serving and never evicted.
    pub busy: BTreeSet<(String, i64, String)>,
    /// Per (model, version): the largest host and GPU memory its replicas measured, kept by the
    /// leader after they are gone, so a model evicted and loaded again is placed on its
    /// measured figure (`views::model_views` uses it when no replica measured one now).
    pub remembered: BTreeMap<(String, i64), (Option<u64>, Option<u64>)>,
}

/// Rebalancing: how many moves may be in flight at once (0, the default, turns it off) and the
/// moves the leader started that may still be in flight.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rebalance {
    /// Moves in flight at most; 0 turns rebalancing off.
    pub max_moves: u32,
    /// The moves started and not known to be finished.
    pub in_flight: Vec<Move>,
}

/// A move the leader started: replica `replica` of `model` `version` on `from` is being replaced
/// by a new replica on `to`. While a replica of that version exists on `to`, placement keeps
/// `replica` only until enough replicas are ready elsewhere; without one the move is void.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Move {
    /// The moved replica's model.
    pub model: String,
    /// Its model version.
    pub version: i64,
    /// The id of the replica being replaced.
    pub replica: u64,
    /// The node it leaves.
    pub from: String,
    /// The node its replacement goes to.
    pub to: String,
}

impl Load {
    /// Utilization as parts per million, so it can be an exact, ordered sort key.
    pub(crate) fn ppm(&self, node: &str) -> u32 {
        let u = self.node_utilization.get(node).copied().unwrap_or(0.0);
        if u.is_nan() {
            return 0;
        }
        (u.clamp(0.0, 1.0) * 1_000_000.0).round() as u32
    }
}

/// Why a replica is added, removed or left unplaced: the rule that fired.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// Add: the model version had no replica at all.
    NewModel,
    /// Add: fewer replicas than wanted. Remove: never.
    ScaleUp,
    /// Add: replaces a replica on a node that is down. Remove: the replica on the down (or
    /// unknown) node.
    NodeDown,
    /// Add: replaces a replica on a drained node. Remove: the drained replica, now that enough
    /// ready replicas run elsewhere.
    Drain,
    /// Remove: more replicas than wanted; taken from the most loaded, least free nodes first.
    ScaleDown,
    /// Remove: the replica's model version is no longer registered.
    ModelRemoved,
    /// Remove: a second replica of the same model version on one node. Add: its replacement.
    SpreadConflict,
    /// Unplaced: no eligible node without this model version has enough free memory.
    NoCapacity {
        /// Memory one replica needs.
        needed: u64,
        /// The most free memory any eligible node has.
        best_free: u64,
    },
    /// Add: a replica moves from the more loaded node `from` to `to` (`why` gives the numbers).
    /// Remove: the moved replica on `from`, now that enough replicas are ready elsewhere.
    Rebalance {
        /// The more loaded node the replica leaves.
        from: String,
        /// The less loaded node it goes to.
        to: String,
        /// What justifies it: the utilization figures, or for the removal, that the replacement
        /// is in place.
        why: String,
    },
    /// Unplaced: every up, undrained node already holds a replica of this model version.
    NotEnoughNodes {
        /// The up, undrained nodes (each holding one replica already).
        eligible_nodes: usize,
    },
    /// Remove: the replica was idle and the least recently used on its node, and a replica of
    /// `for_model` `version` needed its room. `idle_ms`: how long ago its model was last used
    /// (`None`: not since this leader started).
    Evicted {
        /// The model whose replica needed the room.
        for_model: String,
        /// That model's version.
        version: i64,
        /// How long ago the evicted replica's model was last used.
        idle_ms: Option<u64>,
    },
    /// Unplaced: `cause` (no memory or GPU room) and nothing can be evicted to make room;
    /// `held` says what keeps the replicas that could have made room.
    CacheFull {
        /// Why the replica did not fit ([`Reason::NoCapacity`] or [`Reason::NoGpuCapacity`]).
        cause: Box<Reason>,
        /// What pins the replicas that could have been evicted (busy, floor, residency).
        held: String,
    },
    /// Unplaced: nodes with enough host memory exist, but none has `gpus` GPUs with
    /// `needed_per_gpu` bytes free each; `skipped` says why, node by node (bounded).
    NoGpuCapacity {
        /// GPUs one replica needs.
        gpus: u32,
        /// Free memory each of them needs.
        needed_per_gpu: u64,
        /// Per node, why it could not take the replica.
        skipped: Vec<String>,
    },
}

/// A replica to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Addition {
    /// The model to load.
    pub model: String,
    /// Its version.
    pub version: i64,
    /// The node it goes to.
    pub node: String,
    /// The rule that added it.
    pub reason: Reason,
    /// The GPU indices of `node` the replica is assigned, ascending; empty for a CPU model.
    pub gpus: Vec<u32>,
    /// For a GPU model: the nodes tried before `node` and why each could not take it
    /// (bounded; empty when the first node fit).
    pub skipped: Vec<String>,
    /// For a rebalancing move: the id of the replica this one replaces (it stays until this one
    /// is ready).
    pub moves: Option<u64>,
    /// The replicas evicted to make room for this one (model cache), least recently used
    /// first; their removals are in the same plan.
    pub evicted: Vec<Evicted>,
}

/// A replica removed to make room for an [`Addition`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evicted {
    /// The evicted replica's id.
    pub replica: u64,
    /// Its model.
    pub model: String,
    /// Its model version.
    pub version: i64,
}

/// A replica to unload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Removal {
    /// The replica's id.
    pub replica: u64,
    /// The rule that removed it.
    pub reason: Reason,
}

/// Replicas of a model version that no node can take this round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unplaced {
    /// The model that lacks replicas.
    pub model: String,
    /// Its version.
    pub version: i64,
    /// Replicas wanted that could not be placed.
    pub missing: u32,
    /// Why not.
    pub reason: Reason,
}

/// The decision of one placement round. Every list is sorted, so equal inputs give equal plans.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Sorted by (model, version, node).
    pub add: Vec<Addition>,
    /// Sorted by replica id.
    pub remove: Vec<Removal>,
    /// Sorted by (model, version).
    pub unplaced: Vec<Unplaced>,
}

impl Plan {
    /// True when the placement needs no change (unplaced replicas may remain).
    pub fn is_settled(&self) -> bool {
        self.add.is_empty() && self.remove.is_empty()
    }
}
