//! The model cache's soft state: when each model was last used, when each replica was placed,
//! which replicas serve requests now, and which activations wait for a cold start. The leader
//! learns it from heartbeats (`ModelLoad.requests` changing, requests in flight or queued, a
//! sequence model's idle window) and from routers' activations; placement reads it as
//! [`Cache`] (`evict.rs` decides). Lost on a leader change like the rest of the soft state: a
//! new leader counts every replica as just placed (nothing is evicted for one residency) and a
//! model seen with requests in its first heartbeat as used then.
//!
//! ```text
//!  heartbeat ModelLoad ─► requests changed / in flight ─► last use of the model, of the replica
//!  Activate ─► last use of the model; no ready replica ─► cold start begins
//!  round ─► note_replicas(state): placement times; cold starts now ready ─► latency
//!  Load.cache ◄─ to_cache(now): milliseconds since the leader's epoch
//! ```

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use nereid_proto::pb::cluster as pb;

use crate::state::{ClusterState, ReplicaState};
use nereid_placement::Cache;

/// How long a cold start is waited for before it is forgotten (its replica never got ready).
const COLD_START_GIVE_UP: Duration = Duration::from_secs(600);

/// What one node last said about one model version.
#[derive(Debug, Clone, Copy)]
struct Seen {
    requests: u64,
    /// When its request count last changed (or it had requests in flight), as the leader saw.
    last_request: Option<Instant>,
    busy: bool,
    sequence_idle: Duration,
}

/// The cache's soft state; see the module docs.
#[derive(Debug, Default)]
pub struct Recency {
    /// Per (node, model, version).
    seen: HashMap<(String, String, i64), Seen>,
    last_used: HashMap<String, Instant>,
    placed_at: HashMap<u64, Instant>,
    /// Models activated without a ready replica, since when.
    cold: HashMap<String, Instant>,
    /// Per (model, version): the largest memory its replicas measured (host, per GPU).
    measured: BTreeMap<(String, i64), (Option<u64>, Option<u64>)>,
}

impl Recency {
    /// A node's heartbeat at `now`: its versions' request counts, load and sequence windows.
    pub fn heartbeat(&mut self, hb: &pb::HeartbeatRequest, now: Instant) {
        let node = &hb.node_id;
        let mut reported = BTreeSet::new();
        for l in &hb.models {
            let key = (node.clone(), l.model.clone(), l.version);
            let busy = l.in_flight > 0 || l.queue_depth > 0;
            let previous = self.seen.get(&key);
            let used = busy || previous.map_or(l.requests > 0, |p| p.requests != l.requests);
            let last_request = if used {
                self.last_used.insert(l.model.clone(), now);
                Some(now)
            } else {
                previous.and_then(|p| p.last_request)
            };
            self.seen.insert(
                key,
                Seen {
                    requests: l.requests,
                    last_request,
                    busy,
                    sequence_idle: Duration::from_millis(l.sequence_idle_ms),
                },
            );
            reported.insert((l.model.as_str(), l.version));
        }
        self.seen
            .retain(|(n, m, v), _| n != node || reported.contains(&(m.as_str(), *v)));
    }

    /// A node left or is forgotten: what it reported goes.
    pub fn forget_node(&mut self, node: &str) {
        self.seen.retain(|(n, _, _), _| n != node);
    }

    /// A router activated `model` at `now`; `cold` when it had no ready replica.
    pub fn activated(&mut self, model: &str, cold: bool, now: Instant) {
        self.last_used.insert(model.to_string(), now);
        if cold {
            self.cold.entry(model.to_string()).or_insert(now);
        }
    }

    /// Notes when each replica of `state` was first seen (its placement time, as far as this
    /// leader knows) and forgets replicas that are gone. Answers the cold starts that are over
    /// (a ready replica now) with their latency; gives up on the ones waited for too long.
    pub fn note_replicas(&mut self, state: &ClusterState, now: Instant) -> Vec<(String, Duration)> {
        let mut live = BTreeSet::new();
        for r in state.replicas().values() {
            if r.state != ReplicaState::Unloading {
                live.insert(r.id);
                self.placed_at.entry(r.id).or_insert(now);
            }
            let m = self
                .measured
                .entry((r.model.clone(), r.version))
                .or_default();
            m.0 = m.0.max(r.measured_memory_bytes);
            m.1 = m.1.max(r.measured_gpu_memory_bytes);
        }
        self.placed_at.retain(|id, _| live.contains(id));
        let mut done = Vec::new();
        self.cold.retain(|model, since| {
            let ready = state
                .replicas_of(model)
                .any(|r| r.state == ReplicaState::Ready);
            if ready {
                done.push((model.clone(), now.saturating_duration_since(*since)));
            }
            !ready && now.saturating_duration_since(*since) < COLD_START_GIVE_UP
        });
        done
    }

    /// The largest memory (host, per GPU) any version of `model` measured.
    pub fn remembered(&self, model: &str) -> (Option<u64>, Option<u64>) {
        self.measured
            .iter()
            .filter(|((m, _), _)| m == model)
            .fold((None, None), |acc, (_, m)| (acc.0.max(m.0), acc.1.max(m.1)))
    }

    /// Placement's view at `now`, times in milliseconds since `epoch` (the floors are the
    /// state's: `views::cache_floors`).
    pub fn to_cache(&self, epoch: Instant, now: Instant, min_residency: Duration) -> Cache {
        let ms = |t: Instant| t.saturating_duration_since(epoch).as_millis() as u64;
        let busy = self
            .seen
            .iter()
            .filter(|(_, s)| {
                s.busy
                    || (s.sequence_idle > Duration::ZERO
                        && s.last_request
                            .is_some_and(|t| now.saturating_duration_since(t) < s.sequence_idle))
            })
            .map(|((node, model, version), _)| (model.clone(), *version, node.clone()))
            .collect();
        Cache {
            evict: true,
            now_ms: ms(now),
            min_residency_ms: min_residency.as_millis() as u64,
            last_used_ms: self
                .last_used
                .iter()
                .map(|(m, t)| (m.clone(), ms(*t)))
                .collect(),
            placed_at_ms: self.placed_at.iter().map(|(id, t)| (*id, ms(*t))).collect(),
            floor: BTreeMap::new(),
            busy,
            remembered: self.measured.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hb(node: &str, loads: &[(&str, u64, u64, u64)]) -> pb::HeartbeatRequest {
        pb::HeartbeatRequest {
            node_id: node.into(),
            models: loads
                .iter()
                .map(
                    |&(model, requests, in_flight, sequence_idle_ms)| pb::ModelLoad {
                        model: model.into(),
                        version: 1,
                        requests,
                        in_flight,
                        sequence_idle_ms,
                        ..Default::default()
                    },
                )
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn a_changed_request_count_or_requests_in_flight_mark_a_model_used() {
        let epoch = Instant::now();
        let at = |s: u64| epoch + Duration::from_secs(s);
        let mut r = Recency::default();
        r.heartbeat(&hb("a", &[("x", 0, 0, 0), ("y", 3, 0, 0)]), at(1));
        let c = r.to_cache(epoch, at(1), Duration::from_secs(60));
        assert_eq!(c.last_used_ms.get("x"), None, "never used");
        assert_eq!(
            c.last_used_ms.get("y"),
            Some(&1000),
            "first seen with requests"
        );

        r.heartbeat(&hb("a", &[("x", 2, 0, 0), ("y", 3, 0, 0)]), at(5));
        let c = r.to_cache(epoch, at(5), Duration::from_secs(60));
        assert_eq!(c.last_used_ms.get("x"), Some(&5000));
        assert_eq!(c.last_used_ms.get("y"), Some(&1000), "unchanged count");
        assert!(c.busy.is_empty());

        r.heartbeat(&hb("a", &[("x", 2, 1, 0)]), at(9));
        let c = r.to_cache(epoch, at(9), Duration::from_secs(60));
        assert_eq!(c.last_used_ms.get("x"), Some(&9000), "in flight is a use");
        assert!(c.busy.contains(&("x".into(), 1, "a".into())));
    }

    #[test]
    fn a_sequence_model_is_busy_within_its_idle_window() {
        let epoch = Instant::now();
        let at = |s: u64| epoch + Duration::from_secs(s);
        let mut r = Recency::default();
        r.heartbeat(&hb("a", &[("seq", 4, 0, 10_000)]), at(1));
        let key = ("seq".to_string(), 1, "a".to_string());
        assert!(r.to_cache(epoch, at(5), Duration::ZERO).busy.contains(&key));
        assert!(
            !r.to_cache(epoch, at(12), Duration::ZERO)
                .busy
                .contains(&key)
        );
        r.forget_node("a");
        assert!(r.seen.is_empty());
    }

    #[test]
    fn measured_memory_is_remembered_after_the_replicas_are_gone() {
        use crate::state::Command;
        let mut state = ClusterState::new();
        state
            .apply(Command::RegisterNode(crate::testing::node("a")))
            .unwrap();
        state
            .apply(Command::UpsertModel(crate::testing::model("m")))
            .unwrap();
        let id = state
            .apply(Command::AddReplica {
                model: "m".into(),
                version: 2,
                node: "a".into(),
                reason: String::new(),
                gpus: Vec::new(),
            })
            .unwrap()
            .replica_id
            .unwrap();
        state
            .apply(Command::SetReplicaState {
                id,
                state: ReplicaState::Loading,
                measured_memory_bytes: Some(24 << 20),
                measured_gpu_memory_bytes: None,
            })
            .unwrap();
        let mut r = Recency::default();
        r.note_replicas(&state, Instant::now());
        state
            .apply(Command::SetReplicaState {
                id,
                state: ReplicaState::Unloading,
                measured_memory_bytes: None,
                measured_gpu_memory_bytes: None,
            })
            .unwrap();
        state.apply(Command::RemoveReplica { id }).unwrap();
        r.note_replicas(&state, Instant::now());
        assert_eq!(r.remembered("m"), (Some(24 << 20), None));
        let c = r.to_cache(Instant::now(), Instant::now(), Duration::ZERO);
        assert_eq!(c.remembered[&("m".to_string(), 2)], (Some(24 << 20), None));
        assert!(c.placed_at_ms.is_empty(), "the replica is gone");
    }
}
