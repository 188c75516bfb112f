//! What only the leader knows: soft state from heartbeats (liveness, utilization) and the
//! history of placement decisions. The management API reads it through [`Observations`]; on a
//! follower the API forwards such reads to the leader.
//!
//! The leader's loop ([`task`]) turns heartbeats into liveness transitions ([`liveness`]) and
//! the state into placement rounds (`crate::views` → `placement::plan` → [`round`]), recording each
//! round's decisions per model with their [`inputs`] in [`soft`]. The model cache's recency
//! (what eviction reads) is kept in [`cache`].

pub mod cache;
pub mod inputs;
pub mod liveness;
pub mod round;
pub mod soft;
pub mod task;

#[cfg(test)]
mod tests;

use nereid_proto::pb::cluster as pb;

use nereid_placement::Load;

/// The leader's soft state as the management API sees it.
pub trait Observations: Send + Sync + 'static {
    /// Utilization from the node's last heartbeat; `None` when this node has not heard from it
    /// (or is not the leader).
    fn node_utilization(&self, node: &str) -> Option<pb::NodeUtilization>;

    /// The autoscaler's latest evaluation of `model` (a change or why it holds); `None` when
    /// the model does not autoscale or this node is not the leader.
    fn autoscale_latest(&self, model: &str) -> Option<String>;

    /// Recent placement decisions that concerned `model`, oldest first.
    fn placement_history(&self, model: &str) -> Vec<pb::PlacementRecord>;

    /// Per-node load, as placement uses it to break ties.
    fn load(&self) -> Load;

    /// The largest host and GPU memory `model`'s replicas measured, as the leader remembers it
    /// after they are gone (model cache: an evicted model is placed again on it).
    fn remembered_memory(&self, model: &str) -> (Option<u64>, Option<u64>);
}

/// Observations that know nothing, for tests of the API without a leader.
#[cfg(test)]
pub struct NoObservations;

#[cfg(test)]
impl Observations for NoObservations {
    fn node_utilization(&self, _node: &str) -> Option<pb::NodeUtilization> {
        None
    }

    fn autoscale_latest(&self, _model: &str) -> Option<String> {
        None
    }

    fn placement_history(&self, _model: &str) -> Vec<pb::PlacementRecord> {
        Vec::new()
    }

    fn load(&self) -> Load {
        Load::default()
    }

    fn remembered_memory(&self, _model: &str) -> (Option<u64>, Option<u64>) {
        (None, None)
    }
}
