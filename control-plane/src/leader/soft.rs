//! The leader's soft state: liveness, the last heartbeat of every node, the models routers
//! activated recently (scale from zero) and the recent history of placement decisions per
//! model. Lost on a leader change by design: a new leader rebuilds it from heartbeats (and waits
//! one heartbeat timeout before declaring anyone down) and from activations (and assumes demand
//! for every model that runs replicas above its floor, so a leader change scales nothing to
//! zero before routers had a chance to renew). The model cache's part (recency, placement
//! times, cold starts) is in [`super::cache`].

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::Notify;

use nereid_proto::pb::cluster as pb;
use parking_lot::Mutex;

use super::Observations;
use super::cache::Recency;
use super::liveness::Liveness;
use crate::autoscale::{Autoscaler, Decision, observe};
use crate::metrics::CacheStats;
use crate::state::{ClusterState, NodeStatus, ReplicaState};
use nereid_placement::{Load, Move, Plan, Reason, Rebalance};

/// How many placement records each model keeps.
const HISTORY_PER_MODEL: usize = 32;

/// How long an activation keeps a model scaled from zero, unless configured.
pub const DEFAULT_SCALE_TO_ZERO_AFTER: Duration = Duration::from_secs(300);

/// How long a placed replica stays before it may be evicted, unless configured.
pub const DEFAULT_MIN_RESIDENCY: Duration = Duration::from_secs(60);

/// Shared between the leader task, the cluster service (heartbeats) and the management API.
pub struct SoftState {
    heartbeat_timeout: Duration,
    scale_to_zero_after: Duration,
    /// Rebalancing moves in flight at most (0: off).
    rebalance_max_moves: u32,
    /// Model cache: evict least-recently-used idle replicas to make room (`None`: off), and
    /// how long a placed replica stays at least.
    min_residency: Option<Duration>,
    /// Evictions and cold starts, for metrics.
    cache_stats: std::sync::Arc<CacheStats>,
    /// Wakes the leader loop for a round before its timer (an activation).
    wake: Notify,
    /// The autoscaler's clock starts here (milliseconds since).
    epoch: Instant,
    inner: Mutex<Inner>,
}

struct Inner {
    liveness: Liveness,
    last_heartbeat: HashMap<String, pb::HeartbeatRequest>,
    /// When a router last activated each model.
    demand: HashMap<String, Instant>,
    history: HashMap<String, VecDeque<pb::PlacementRecord>>,
    /// The decisions last recorded per model, so an unchanged plan is not recorded again.
    last_recorded: HashMap<String, Vec<pb::PlacementDecision>>,
    /// Load windows and latest decisions of the autoscaled models.
    autoscaler: Autoscaler,
    /// Rebalancing moves this leader started that may still be in flight.
    moves: Vec<Move>,
    /// The model cache's recency, placement times and cold starts.
    recency: Recency,
}

impl SoftState {
    pub fn new(heartbeat_timeout: Duration) -> Self {
        SoftState {
            heartbeat_timeout,
            scale_to_zero_after: DEFAULT_SCALE_TO_ZERO_AFTER,
            rebalance_max_moves: 0,
            min_residency: Some(DEFAULT_MIN_RESIDENCY),
            cache_stats: Default::default(),
            wake: Notify::new(),
            epoch: Instant::now(),
            inner: Mutex::new(Inner {
                liveness: Liveness::new(heartbeat_timeout, Instant::now()),
                last_heartbeat: HashMap::new(),
                demand: HashMap::new(),
                history: HashMap::new(),
                last_recorded: HashMap::new(),
                autoscaler: Autoscaler::new(),
                moves: Vec::new(),
                recency: Recency::default(),
            }),
        }
    }

    /// The model cache: `Some(residency)` evicts least-recently-used idle replicas placed at
    /// least that long ago when a replica finds no room; `None` turns eviction off.
    pub fn with_min_residency(mut self, min_residency: Option<Duration>) -> Self {
        self.min_residency = min_residency;
        self
    }

    /// Evictions and cold starts counted by this node as leader.
    pub fn cache_stats(&self) -> std::sync::Arc<CacheStats> {
        self.cache_stats.clone()
    }

    /// A router activated `model` and no replica of it was ready: a cold start begins (its
    /// latency is observed once a replica is ready, [`Self::note_replicas`]).
    pub fn cold_start(&self, model: &str, now: Instant) {
        self.cache_stats.cold_start(model);
        self.inner.lock().recency.activated(model, true, now);
    }

    /// Notes placement times of `state`'s replicas and observes the cold starts now over.
    pub fn note_replicas(&self, state: &ClusterState, now: Instant) {
        let done = self.inner.lock().recency.note_replicas(state, now);
        for (_, took) in done {
            self.cache_stats.cold_start_took(took);
        }
    }

    /// A plan was decided: the models it evicts lose their activation (only a new request
    /// brings them back), and the evictions are counted.
    pub fn evicting(&self, state: &ClusterState, plan: &Plan) {
        let mut inner = self.inner.lock();
        for removal in &plan.remove {
            if !matches!(removal.reason, Reason::Evicted { .. }) {
                continue;
            }
            if let Some(r) = state.replica(removal.replica) {
                inner.demand.remove(&r.model);
                self.cache_stats.evicted(&r.model);
            }
        }
    }
    /// How many rebalancing moves may be in flight at once; 0 (the default) turns rebalancing
    /// off.
    pub fn with_rebalance_max_moves(mut self, max_moves: u32) -> Self {
        self.rebalance_max_moves = max_moves;
        self
    }

    /// Forgets the moves that are over in `state`: the moved replica is gone (or unloading),
    /// or its replacement is (then placement keeps the old replica as any other).
    pub fn prune_moves(&self, state: &ClusterState) {
        let present = |id: u64| {
            state
                .replica(id)
                .is_some_and(|r| r.state != ReplicaState::Unloading)
        };
        let arrived = |m: &Move| {
            state.replicas_of(&m.model).any(|r| {
                r.version == m.version && r.node == m.to && r.state != ReplicaState::Unloading
            })
        };
        self.inner
            .lock()
            .moves
            .retain(|m| present(m.replica) && arrived(m));
    }

    /// Remembers the moves `plan` starts (additions that replace a replica).
    pub fn start_moves(&self, state: &ClusterState, plan: &Plan) {
        let started = plan.add.iter().filter_map(|a| {
            let replica = state.replica(a.moves?)?;
            Some(Move {
                model: a.model.clone(),
                version: a.version,
                replica: replica.id,
                from: replica.node.clone(),
                to: a.node.clone(),
            })
        });
        let started: Vec<Move> = started.collect();
        let mut inner = self.inner.lock();
        inner
            .moves
            .retain(|m| !started.iter().any(|s| s.replica == m.replica));
        inner.moves.extend(started);
    }

    /// How long an activation keeps a model scaled from zero.
    pub fn with_scale_to_zero_after(mut self, after: Duration) -> Self {
        self.scale_to_zero_after = after;
        self
    }

    pub fn heartbeat_timeout(&self) -> Duration {
        self.heartbeat_timeout
    }

    pub fn scale_to_zero_after(&self) -> Duration {
        self.scale_to_zero_after
    }

    /// A router has requests for `model`: keep (or start) a replica of it until
    /// [`Self::scale_to_zero_after`] passes without another activation. Wakes the leader loop
    /// when the model was not in demand yet.
    pub fn activate(&self, model: &str, now: Instant) {
        let fresh = {
            let mut inner = self.inner.lock();
            inner.recency.activated(model, false, now);
            let previous = inner.demand.insert(model.to_string(), now);
            previous.is_none_or(|t| now.saturating_duration_since(t) > self.scale_to_zero_after)
        };
        if fresh {
            self.wake.notify_one();
        }
    }

    /// Assumes demand at `now` for these models (a new leader's starting point).
    pub fn assume_demand(&self, models: impl IntoIterator<Item = String>, now: Instant) {
        let mut inner = self.inner.lock();
        for model in models {
            inner.demand.insert(model, now);
        }
    }

    /// Resolves when something asked for a round before the timer (an activation).
    pub async fn woken(&self) {
        self.wake.notified().await
    }

    /// This node became leader at `now`: forget what an earlier term knew.
    pub fn begin_term(&self, now: Instant) {
        let mut inner = self.inner.lock();
        inner.liveness = Liveness::new(self.heartbeat_timeout, now);
        inner.last_heartbeat.clear();
        inner.last_recorded.clear();
        inner.demand.clear();
        inner.autoscaler = Autoscaler::new();
        inner.recency = Recency::default();
        // Moves of an earlier term are not known here: a replica and its replacement both
        // count as healthy, and the surplus rule removes the not-ready or the busier one.
        inner.moves.clear();
    }

    /// One autoscaler round over `state` with the last heartbeats: the decisions that change
    /// a model's count, to be written (holds are only remembered, for explanations).
    pub fn autoscale(&self, state: &ClusterState, now: Instant) -> Vec<(String, Decision)> {
        let now_ms = now.saturating_duration_since(self.epoch).as_millis() as u64;
        let mut inner = self.inner.lock();
        let observed = observe::inputs(state, &inner.last_heartbeat, now_ms);
        inner
            .autoscaler
            .retain(&observed.iter().map(|o| o.model.clone()).collect());
        observed
            .into_iter()
            .filter_map(|o| {
                let decision = inner.autoscaler.step(&o.model, &o.policy, o.input);
                (decision.replicas != o.input.current).then_some((o.model, decision))
            })
            .collect()
    }

    /// A node registered or sent a heartbeat.
    pub fn heard_from(&self, node: &str, now: Instant, heartbeat: Option<pb::HeartbeatRequest>) {
        let mut inner = self.inner.lock();
        inner.liveness.heartbeat(node, now);
        if let Some(hb) = heartbeat {
            inner.recency.heartbeat(&hb, now);
            inner.last_heartbeat.insert(node.to_string(), hb);
        }
    }

    /// A node said it leaves (`LeaveNode`): it is down until it is heard from again.
    pub fn left(&self, node: &str) {
        let mut inner = self.inner.lock();
        inner.liveness.forget(node);
        inner.last_heartbeat.remove(node);
        inner.recency.forget_node(node);
    }

    /// Status changes for the nodes of the state; see [`Liveness::transitions`].
    pub fn liveness_transitions<'a>(
        &self,
        nodes: impl IntoIterator<Item = (&'a str, NodeStatus)>,
        now: Instant,
    ) -> Vec<(String, NodeStatus)> {
        self.inner.lock().liveness.transitions(nodes, now)
    }

    /// Records the decisions of one round for `model` unless they repeat the last record.
    pub fn record(
        &self,
        model: &str,
        revision: u64,
        decisions: Vec<pb::PlacementDecision>,
        inputs: Vec<String>,
    ) {
        let mut inner = self.inner.lock();
        if inner.last_recorded.get(model) == Some(&decisions) {
            return;
        }
        inner
            .last_recorded
            .insert(model.to_string(), decisions.clone());
        if decisions.is_empty() {
            return;
        }
        let history = inner.history.entry(model.to_string()).or_default();
        if history.len() == HISTORY_PER_MODEL {
            history.pop_front();
        }
        history.push_back(pb::PlacementRecord {
            revision,
            decided_at_ms: unix_ms(),
            decisions,
            inputs,
        });
    }
}

impl Observations for SoftState {
    fn node_utilization(&self, node: &str) -> Option<pb::NodeUtilization> {
        let inner = self.inner.lock();
        let hb = inner.last_heartbeat.get(node)?;
        let age = inner
            .liveness
            .silence(node, Instant::now())
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        Some(pb::NodeUtilization {
            cpu: hb.cpu_utilization,
            memory_used_bytes: hb.memory_used_bytes,
            memory_total_bytes: hb.memory_total_bytes,
            gpus: hb.gpus.clone(),
            last_heartbeat_age_ms: age,
            models: hb.models.clone(),
        })
    }

    fn autoscale_latest(&self, model: &str) -> Option<String> {
        let inner = self.inner.lock();
        inner.autoscaler.latest(model).map(|d| d.reason.clone())
    }

    fn placement_history(&self, model: &str) -> Vec<pb::PlacementRecord> {
        self.inner
            .lock()
            .history
            .get(model)
            .map(|h| h.iter().cloned().collect())
            .unwrap_or_default()
    }

    fn remembered_memory(&self, model: &str) -> (Option<u64>, Option<u64>) {
        self.inner.lock().recency.remembered(model)
    }

    fn load(&self) -> Load {
        let inner = self.inner.lock();
        let now = Instant::now();
        Load {
            node_utilization: inner
                .last_heartbeat
                .iter()
                .map(|(node, hb)| (node.clone(), hb.cpu_utilization))
                .collect(),
            demanded: inner
                .demand
                .iter()
                .filter(|(_, t)| now.saturating_duration_since(**t) <= self.scale_to_zero_after)
                .map(|(model, _)| model.clone())
                .collect(),
            rebalance: Rebalance {
                max_moves: self.rebalance_max_moves,
                in_flight: inner.moves.clone(),
            },
            cache: match self.min_residency {
                Some(residency) => inner.recency.to_cache(self.epoch, now, residency),
                None => Default::default(),
            },
        }
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
