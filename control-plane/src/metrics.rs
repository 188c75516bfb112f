//! The control plane's own metrics (`nereid_raft_*`, `nereid_cluster_*`,
//! `nereid_placement_*`), built on a scrape from what the node already knows.
//!
//! ```text
//! GET /metrics ─► ControlPlaneCollector::collect
//!                   ├─ Consensus::status()      ─► raft_families   (term, leader, log indexes)
//!                   ├─ Consensus::local_state() ─► cluster_families (nodes, replicas, models)
//!                   ├─ PlacementDecisions        ─► nereid_placement_decisions_total{action}
//!                   └─ CacheStats                ─► nereid_cache_* (evictions, cold starts)
//! leader::task::round ─► each committed placement command ─► PlacementDecisions::add
//! leader soft state ─► evictions decided, activations without a ready replica ─► CacheStats
//! ```
//!
//! Every node, leader or follower, reports the state it has applied, so the cluster families of
//! a lagging follower lag with it. Only the leader commits placement decisions; a node's counter
//! covers the terms it led since it started.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use nereid_telemetry::Value;
use parking_lot::Mutex;

use nereid_telemetry::{Collect, Family, Labels};

use crate::consensus::{Consensus, RaftStatus};
use crate::state::{ClusterState, Command, NodeStatus, ReplicaState};

/// Node states as the registry knows them, in label order.
const NODE_STATES: [&str; 2] = ["up", "down"];
/// Replica states, in label order.
const REPLICA_STATES: [&str; 5] = ["pending", "loading", "ready", "failed", "unloading"];

fn node_state(status: NodeStatus) -> &'static str {
    match status {
        NodeStatus::Up => "up",
        NodeStatus::Down => "down",
    }
}

fn replica_state(state: &ReplicaState) -> &'static str {
    match state {
        ReplicaState::Pending => "pending",
        ReplicaState::Loading => "loading",
        ReplicaState::Ready => "ready",
        ReplicaState::Failed { .. } => "failed",
        ReplicaState::Unloading => "unloading",
    }
}

/// What a placement command does, as the `action` label says it; `None` for commands that are
/// not placement (node liveness, registrations).
pub fn placement_action(cmd: &Command) -> Option<PlacementAction> {
    match cmd {
        Command::AddReplica { .. } => Some(PlacementAction::Place),
        Command::SetReplicaState {
            state: ReplicaState::Unloading,
            ..
        } => Some(PlacementAction::Unload),
        Command::RemoveReplica { .. } => Some(PlacementAction::Remove),
        _ => None,
    }
}

/// The kinds of placement change the leader commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlacementAction {
    /// A replica assigned to a node (`AddReplica`).
    Place,
    /// A replica told to leave (`SetReplicaState` to unloading).
    Unload,
    /// A replica dropped from the state (`RemoveReplica`).
    Remove,
}

impl PlacementAction {
    const ALL: [PlacementAction; 3] = [
        PlacementAction::Place,
        PlacementAction::Unload,
        PlacementAction::Remove,
    ];

    pub fn label(self) -> &'static str {
        match self {
            PlacementAction::Place => "place",
            PlacementAction::Unload => "unload",
            PlacementAction::Remove => "remove",
        }
    }
}

/// Placement commands this node committed as leader, by action.
#[derive(Debug, Default)]
pub struct PlacementDecisions {
    counts: [AtomicU64; 3],
}

impl PlacementDecisions {
    /// Counts `cmd` if it is a placement command (the tests' shorthand for [`Self::add`]).
    #[cfg(test)]
    pub fn count(&self, cmd: &Command) {
        self.add(placement_action(cmd));
    }

    /// Counts one committed decision of `action` (none for a command that is not placement).
    pub fn add(&self, action: Option<PlacementAction>) {
        if let Some(action) = action {
            self.counts[action as usize].fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn get(&self, action: PlacementAction) -> u64 {
        self.counts[action as usize].load(Ordering::Relaxed)
    }

    pub fn family(&self) -> Family {
        let mut f = Family::counter(
            "nereid_placement_decisions_total",
            "Placement changes this node committed as leader, by action (place, unload, remove).",
        );
        for action in PlacementAction::ALL {
            f.number(
                Labels::of([("action", action.label())]),
                self.get(action) as f64,
            );
        }
        f
    }
}

/// Raft's view from this node. `nereid_raft_leader_id` is absent while no leader is known.
pub fn raft_families(status: &RaftStatus) -> Vec<Family> {
    let gauge =
        |name: &str, help: &str, v: u64| Family::gauge(name, help).with(Labels::none(), v as f64);
    let mut leader = Family::gauge(
        "nereid_raft_leader_id",
        "Node id of the current Raft leader, as this node knows it.",
    );
    if let Some(id) = status.leader_id {
        leader.number(Labels::none(), id as f64);
    }
    vec![
        gauge(
            "nereid_raft_term",
            "Current Raft term on this node.",
            status.term,
        ),
        gauge(
            "nereid_raft_is_leader",
            "1 when this node is the Raft leader, else 0.",
            u64::from(status.is_leader()),
        ),
        leader,
        gauge(
            "nereid_raft_commit_index",
            "Index of the last log entry this node knows committed.",
            status.commit_index,
        ),
        gauge(
            "nereid_raft_applied_index",
            "Index of the last log entry applied to this node's state.",
            status.applied_index,
        ),
        gauge(
            "nereid_raft_last_log_index",
            "Index of the last entry in this node's log.",
            status.last_log_index,
        ),
    ]
}

/// The registry as this node applied it: nodes and replicas by state (every state listed,
/// 0 included) and registered models.
pub fn cluster_families(state: &ClusterState) -> Vec<Family> {
    let mut nodes = Family::gauge(
        "nereid_cluster_nodes",
        "Registered worker nodes, by state (up, down).",
    );
    for s in NODE_STATES {
        let n = state
            .nodes()
            .values()
            .filter(|n| node_state(n.status) == s)
            .count();
        nodes.number(Labels::of([("state", s)]), n as f64);
    }
    let mut replicas = Family::gauge(
        "nereid_cluster_replicas",
        "Placed model replicas, by state (pending, loading, ready, failed, unloading).",
    );
    for s in REPLICA_STATES {
        let n = state
            .replicas()
            .values()
            .filter(|r| replica_state(&r.state) == s)
            .count();
        replicas.number(Labels::of([("state", s)]), n as f64);
    }
    let models = Family::gauge("nereid_cluster_models", "Registered models.")
        .with(Labels::none(), state.models().len() as f64);
    vec![nodes, replicas, models]
}

/// Everything `nereid control-plane` reports on `/metrics`.
/// Upper bounds (seconds) of the cold-start latency histogram's buckets.
const COLD_START_BUCKETS: [f64; 10] = [0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0];

/// The model cache's counters on this node as leader: evictions and cold starts per model, and
/// how long cold starts took (activation without a ready replica until one is ready).
#[derive(Debug, Default)]
pub struct CacheStats {
    inner: Mutex<CacheCounts>,
}

#[derive(Debug, Default)]
struct CacheCounts {
    evictions: BTreeMap<String, u64>,
    cold_starts: BTreeMap<String, u64>,
    /// Per bucket of [`COLD_START_BUCKETS`] (not cumulative), then the sum and count.
    latency: [u64; COLD_START_BUCKETS.len()],
    latency_sum: f64,
    latency_count: u64,
}

impl CacheStats {
    /// A replica of `model` was evicted to make room.
    pub fn evicted(&self, model: &str) {
        *self
            .inner
            .lock()
            .evictions
            .entry(model.to_string())
            .or_default() += 1;
    }

    /// A router activated `model` while no replica of it was ready.
    pub fn cold_start(&self, model: &str) {
        *self
            .inner
            .lock()
            .cold_starts
            .entry(model.to_string())
            .or_default() += 1;
    }

    /// A cold start ended with a ready replica after `took`.
    pub fn cold_start_took(&self, took: Duration) {
        let s = took.as_secs_f64();
        let mut c = self.inner.lock();
        if let Some(b) = COLD_START_BUCKETS.iter().position(|&le| s <= le) {
            c.latency[b] += 1;
        }
        c.latency_sum += s;
        c.latency_count += 1;
    }

    pub fn families(&self) -> Vec<Family> {
        let c = self.inner.lock();
        let per_model = |name: &str, help: &str, counts: &BTreeMap<String, u64>| {
            let mut f = Family::counter(name, help);
            for (model, n) in counts {
                f.number(Labels::of([("model", model.as_str())]), *n as f64);
            }
            f
        };
        let mut cumulative = 0;
        let buckets = COLD_START_BUCKETS
            .iter()
            .zip(c.latency)
            .map(|(&le, n)| {
                cumulative += n;
                (le, cumulative)
            })
            .collect();
        let mut latency = Family::new(
            "nereid_cache_cold_start_seconds",
            "Time from an activation that found no ready replica to a ready replica.",
            nereid_telemetry::Kind::Histogram,
        );
        latency.sample(
            Labels::none(),
            Value::Histogram {
                buckets,
                sum: c.latency_sum,
                count: c.latency_count,
            },
        );
        vec![
            per_model(
                "nereid_cache_evictions_total",
                "Replicas evicted (least recently used, idle) to make room for another model.",
                &c.evictions,
            ),
            per_model(
                "nereid_cache_cold_starts_total",
                "Activations of a model that had no ready replica (scale from zero, or after an eviction).",
                &c.cold_starts,
            ),
            latency,
        ]
    }
}

pub struct ControlPlaneCollector {
    pub consensus: Arc<dyn Consensus>,
    pub decisions: Arc<PlacementDecisions>,
    pub cache: Arc<CacheStats>,
}

impl Collect for ControlPlaneCollector {
    fn collect(&self) -> Vec<Family> {
        let mut families = raft_families(&self.consensus.status());
        families.extend(cluster_families(&self.consensus.local_state()));
        families.push(self.decisions.family());
        families.extend(self.cache.families());
        families
    }
}

#[cfg(test)]
mod tests {
    use nereid_telemetry::render_prometheus;

    use super::*;
    use crate::testing::{model, node};

    fn status(leader: Option<u64>) -> RaftStatus {
        RaftStatus {
            node_id: 2,
            leader_id: leader,
            leader_address: None,
            term: 7,
            commit_index: 40,
            applied_index: 39,
            last_log_index: 41,
            members: vec![],
        }
    }

    #[test]
    fn raft_families_follow_the_status_and_leave_an_unknown_leader_out() {
        let text = render_prometheus(&raft_families(&status(Some(2))));
        for line in [
            "nereid_raft_term 7",
            "nereid_raft_is_leader 1",
            "nereid_raft_leader_id 2",
            "nereid_raft_commit_index 40",
            "nereid_raft_applied_index 39",
            "nereid_raft_last_log_index 41",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
        }
        let text = render_prometheus(&raft_families(&status(None)));
        assert!(text.contains("nereid_raft_is_leader 0"), "{text}");
        assert!(!text.contains("nereid_raft_leader_id"), "{text}");
    }

    #[test]
    fn cluster_families_count_every_state_including_empty_ones() {
        let mut state = ClusterState::new();
        for cmd in [
            Command::UpsertModel(model("m")),
            Command::UpsertModel(model("n")),
            Command::RegisterNode(node("a")),
            Command::RegisterNode(node("b")),
            Command::SetNodeStatus {
                id: "b".into(),
                status: NodeStatus::Down,
            },
            Command::AddReplica {
                model: "m".into(),
                version: 2,
                node: "a".into(),
                reason: String::new(),
                gpus: Vec::new(),
            },
        ] {
            state.apply(cmd).unwrap();
        }
        let text = render_prometheus(&cluster_families(&state));
        for line in [
            "nereid_cluster_nodes{state=\"up\"} 1",
            "nereid_cluster_nodes{state=\"down\"} 1",
            "nereid_cluster_replicas{state=\"pending\"} 1",
            "nereid_cluster_replicas{state=\"ready\"} 0",
            "nereid_cluster_replicas{state=\"failed\"} 0",
            "nereid_cluster_models 2",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
        }
    }

    #[test]
    fn only_placement_commands_are_counted_by_action() {
        let d = PlacementDecisions::default();
        d.count(&Command::AddReplica {
            model: "m".into(),
            version: 1,
            node: "a".into(),
            reason: String::new(),
            gpus: Vec::new(),
        });
        d.count(&Command::SetReplicaState {
            id: 1,
            state: ReplicaState::Unloading,
            measured_memory_bytes: None,
            measured_gpu_memory_bytes: None,
        });
        d.count(&Command::SetReplicaState {
            id: 1,
            state: ReplicaState::Ready,
            measured_memory_bytes: None,
            measured_gpu_memory_bytes: None,
        });
        d.count(&Command::RemoveReplica { id: 1 });
        d.count(&Command::RemoveReplica { id: 2 });
        d.count(&Command::SetNodeStatus {
            id: "a".into(),
            status: NodeStatus::Down,
        });
        let text = render_prometheus(&[d.family()]);
        for line in [
            "nereid_placement_decisions_total{action=\"place\"} 1",
            "nereid_placement_decisions_total{action=\"unload\"} 1",
            "nereid_placement_decisions_total{action=\"remove\"} 2",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
        }
    }
}
