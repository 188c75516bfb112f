//! The leader's soft state: liveness, the last heartbeat of every node, and the recent history
//! of placement decisions per model. Lost on a leader change by design: a new leader rebuilds it
//! from heartbeats (and waits one heartbeat timeout before declaring anyone down).

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nereid_proto::pb::cluster as pb;
use parking_lot::Mutex;

use super::Observations;
use super::liveness::Liveness;
use crate::placement::Load;
use crate::state::NodeStatus;

/// How many placement records each model keeps.
const HISTORY_PER_MODEL: usize = 32;

/// Shared between the leader task, the cluster service (heartbeats) and the management API.
pub struct SoftState {
    heartbeat_timeout: Duration,
    inner: Mutex<Inner>,
}

struct Inner {
    liveness: Liveness,
    last_heartbeat: HashMap<String, pb::HeartbeatRequest>,
    history: HashMap<String, VecDeque<pb::PlacementRecord>>,
    /// The decisions last recorded per model, so an unchanged plan is not recorded again.
    last_recorded: HashMap<String, Vec<pb::PlacementDecision>>,
}

impl SoftState {
    pub fn new(heartbeat_timeout: Duration) -> Self {
        SoftState {
            heartbeat_timeout,
            inner: Mutex::new(Inner {
                liveness: Liveness::new(heartbeat_timeout, Instant::now()),
                last_heartbeat: HashMap::new(),
                history: HashMap::new(),
                last_recorded: HashMap::new(),
            }),
        }
    }

    pub fn heartbeat_timeout(&self) -> Duration {
        self.heartbeat_timeout
    }

    /// This node became leader at `now`: forget what an earlier term knew.
    pub fn begin_term(&self, now: Instant) {
        let mut inner = self.inner.lock();
        inner.liveness = Liveness::new(self.heartbeat_timeout, now);
        inner.last_heartbeat.clear();
        inner.last_recorded.clear();
    }

    /// A node registered or sent a heartbeat.
    pub fn heard_from(&self, node: &str, now: Instant, heartbeat: Option<pb::HeartbeatRequest>) {
        let mut inner = self.inner.lock();
        inner.liveness.heartbeat(node, now);
        if let Some(hb) = heartbeat {
            inner.last_heartbeat.insert(node.to_string(), hb);
        }
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

    fn placement_history(&self, model: &str) -> Vec<pb::PlacementRecord> {
        self.inner
            .lock()
            .history
            .get(model)
            .map(|h| h.iter().cloned().collect())
            .unwrap_or_default()
    }

    fn load(&self) -> Load {
        let inner = self.inner.lock();
        Load {
            node_utilization: inner
                .last_heartbeat
                .iter()
                .map(|(node, hb)| (node.clone(), hb.cpu_utilization))
                .collect(),
        }
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
