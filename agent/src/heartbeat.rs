//! Heartbeats: every interval the node's utilization, the versions it serves, and the measured
//! memory of its replicas. A control plane that answers `reregister` gets a new RegisterNode.
//!
//! Per version it sends the queue depth (requests waiting for an instance), the requests in
//! flight (received, not answered yet), the requests received since it loaded (the control
//! plane's model cache reads recency from it) and, for a sequence-batched model, how long a
//! sequence stays live after its last request. Per GPU that NVML reports ([`nereid_data_plane::probe::gpu`]; none without
//! NVML) the busy fraction and memory used and total.

use std::sync::Arc;
use std::time::Duration;

use nereid_proto::pb::cluster::{HeartbeatRequest, ModelLoad, ReplicaMemory};
use parking_lot::Mutex;
use tokio::sync::{Notify, watch};

use super::client::ControlPlane;
use super::reconcile::Local;
use super::state::ClusterMirror;
use nereid_data_plane::ModelManager;
use nereid_data_plane::probe::gpu::Gpus;
use nereid_data_plane::probe::host;

/// The replicas of `node` that are served here, with their measured memory.
pub fn replica_memory(mirror: &ClusterMirror, node: &str, local: &Local) -> Vec<ReplicaMemory> {
    mirror
        .replicas_on(node)
        .filter_map(|r| {
            let m = local.models.get(&r.model)?;
            m.served.contains(&r.version).then(|| ReplicaMemory {
                replica: r.id,
                memory_bytes: m.memory.get(&r.version).copied().unwrap_or(0),
            })
        })
        .collect()
}

/// What a heartbeat reads: the agent's mirror and local loads, the data plane, the GPUs.
pub struct Sources {
    pub shared: Arc<Mutex<(ClusterMirror, Local)>>,
    pub manager: Arc<ModelManager>,
    pub gpus: Arc<Gpus>,
}

/// Sends heartbeats until `stop`; wakes `reregister` when the control plane asks for it.
pub async fn run(
    cp: Arc<ControlPlane>,
    node: String,
    interval: Duration,
    sources: Sources,
    reregister: Arc<Notify>,
    mut stop: watch::Receiver<bool>,
) {
    let Sources {
        shared,
        manager,
        gpus,
    } = sources;
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_cpu = host::cpu_ticks();
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let now_cpu = host::cpu_ticks();
        let cpu = match (last_cpu, now_cpu) {
            (Some(a), Some(b)) => host::cpu_between(a, b),
            _ => 0.0,
        };
        last_cpu = now_cpu;
        let (total, used) = host::memory();
        let models = manager
            .all_versions()
            .iter()
            .map(|v| ModelLoad {
                model: v.name.clone(),
                version: v.version,
                queue_depth: v.queue_depth() as u64,
                in_flight: v.stats.in_flight(),
                requests: v.stats.received(),
                sequence_idle_ms: v
                    .config
                    .sequence()
                    .map_or(0, |s| s.max_idle.as_millis() as u64),
            })
            .collect();
        let replica_memory = {
            let guard = shared.lock();
            replica_memory(&guard.0, &node, &guard.1)
        };
        let request = HeartbeatRequest {
            node_id: node.clone(),
            cpu_utilization: cpu,
            memory_used_bytes: used.unwrap_or(0),
            memory_total_bytes: total.unwrap_or(0),
            gpus: gpus.utilization(),
            models,
            replica_memory,
        };
        // One attempt per tick: the next tick carries fresher figures than a retry would.
        let request = cp.request(request, true);
        match cp
            .once(|mut c| async move { c.heartbeat(request).await })
            .await
        {
            Ok(r) if r.reregister => {
                tracing::info!("control plane asks this node to register again");
                reregister.notify_one();
            }
            Ok(_) => {}
            Err(failure) => {
                tracing::debug!(addr = %cp.current_addr(), error = %failure, "heartbeat failed");
                if super::client::retryable(failure.code()) {
                    cp.fail_over(Some(&failure));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use nereid_proto::pb::cluster::Replica;

    use super::*;
    use crate::reconcile::LocalModel;

    #[test]
    fn replica_memory_covers_served_replicas_of_this_node() {
        let mut mirror = ClusterMirror::default();
        for (id, version, node) in [(1, 1, "n1"), (2, 2, "n1"), (3, 1, "n2")] {
            mirror.replicas.insert(
                id,
                Replica {
                    id,
                    model: "a".into(),
                    version,
                    node: node.into(),
                    ..Default::default()
                },
            );
        }
        let mut local = Local::default();
        local.models.insert(
            "a".into(),
            LocalModel {
                served: [1].into(),
                memory: [(1, 42)].into(),
                ..Default::default()
            },
        );
        assert_eq!(
            replica_memory(&mirror, "n1", &local),
            vec![ReplicaMemory {
                replica: 1,
                memory_bytes: 42
            }]
        );
    }
}
