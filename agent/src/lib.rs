//! `nereid-agent`: the worker agent (`nereid worker`), which follows the control plane's
//! assignments on this node's data plane. All of a worker's cluster traffic is here; the data
//! plane (`nereid-data-plane`) knows nothing of the cluster.
//!
//! Entry points: [`run_worker`] (`nereid worker`: the data plane's serve loop in explicit mode
//! with the agent beside it, set up by an [`AgentConfig`]) and [`run`] (the agent alone, over a
//! [`ModelManager`] the caller built); [`AgentError`] when the agent cannot start.
//!
//! ```text
//! RegisterNode (id, addresses, capacity) ──► heartbeat task (every interval; `reregister` ─┐
//!      ▲                                                                                    │
//!      └──────────────────────────────────────────────────────────────────────────────────┘
//! Watch (snapshot, then deltas; resumed from the last revision on another node after a
//!        disconnect) ─► ClusterMirror ─► reconcile::plan ─┬─► reports ─► reporter task (FIFO,
//!                                                        │     retried until acknowledged)
//!                                                        └─► one load / unload at a time on
//!                                                              a task ─► result ─► plan again
//! ```
//!
//! Models are served from a private repository directory of symlinks to their `file://` sources, or
//! to the local mirror of their `s3://` / `gs://` / `as://` sources (`source.rs`); the data plane
//! runs in explicit mode and refuses client loads and unloads
//! ([`ManagerConfig::cluster_managed`](nereid_data_plane::ManagerConfig::cluster_managed)). Memory
//! per replica is what the data plane measured when it built the version (its `LoadReport`): the C
//! heap its load kept ([`nereid_data_plane::probe::heap`], in-process backends, loads measured one
//! at a time) or its Python stubs' anonymous memory; the same model measures the same on every
//! worker. GPU memory per replica is the growth of device memory used (NVML) on the GPUs the
//! control plane assigned the model here, per GPU ([`gpu_growth_per_gpu`]); 0 without NVML or
//! without assigned GPUs. Device memory is shared with every other process on the GPU, so a
//! concurrent allocation skews the figure; placement takes the largest figure reported for a
//! version.

#![warn(missing_docs)]

mod client;
mod companions;
mod heartbeat;
mod reconcile;
mod source;
mod state;
mod worker;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use nereid_proto::pb::cluster::{
    GpuUtilization, LeaveNodeRequest, NodeAddresses, NodeCapacity, RegisterNodeRequest,
    ReplicaState, ReportReplicaRequest, WatchRequest,
};
use parking_lot::Mutex;
use tokio::sync::{Notify, mpsc, watch};
use tokio_stream::StreamExt;

use client::ControlPlane;
use nereid_data_plane::probe::{gpu, host};
use nereid_data_plane::{LoadSource, ModelManager};
use reconcile::{Local, LocalModel, Op, Report};
use state::ClusterMirror;

pub use worker::run as run_worker;

/// Settings of the agent.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// Control-plane gRPC addresses (`host:port`), tried in turn.
    pub control_plane: Vec<String>,
    /// This node's identity in the cluster: the key of its registration, heartbeats and
    /// assignments.
    pub node_id: String,
    /// Data-plane HTTP and gRPC addresses as other machines reach them.
    pub data_http: String,
    /// The gRPC counterpart of `data_http`: where routers send this node's inference calls.
    pub data_grpc: String,
    /// How often the heartbeat task reports this node's utilization and served versions.
    pub heartbeat_interval: Duration,
    /// The data plane's model repository: the agent keeps one symlink per assigned model here.
    pub repository: PathBuf,
    /// Memory the node offers; `None`: the host's total memory.
    pub memory_capacity: Option<u64>,
    /// The bearer token sent with every control-plane call; `None` when the cluster has no auth.
    pub auth_token: Option<String>,
    /// How the control plane is dialed: plaintext, or TLS with the cluster identity.
    pub cluster_dial: nereid_tls::ClusterDial,
}

/// The node's capacity: CPUs × 1000 millis, memory (configured or the host's), and the GPUs
/// NVML reports ([`gpu`]; none without NVML).
pub fn capacity(memory_capacity: Option<u64>, gpus: &gpu::Gpus) -> NodeCapacity {
    NodeCapacity {
        cpu_millis: host::cpu_count() * 1000,
        memory_bytes: memory_capacity.or(host::memory().0).unwrap_or(0),
        gpus: gpus.capacity(),
    }
}

type Shared = Arc<Mutex<(ClusterMirror, Local)>>;

/// Why the agent could not start.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct AgentError(String);

/// Runs the agent until `stop` is set.
pub async fn run(
    config: AgentConfig,
    manager: Arc<ModelManager>,
    mut stop: watch::Receiver<bool>,
) -> Result<(), AgentError> {
    let cp = Arc::new(
        ControlPlane::new(&config.control_plane, config.auth_token.as_deref())
            .map_err(AgentError)?
            .with_dial(config.cluster_dial.clone()),
    );
    let shared: Shared = Arc::default();
    let node = config.node_id.clone();
    // Probed once; the NVML handle lives as long as the agent.
    let gpus = Arc::new(
        tokio::task::spawn_blocking(gpu::Gpus::probe)
            .await
            .unwrap_or_else(|e| gpu::Gpus::none(format!("NVML probe failed: {e}"))),
    );

    if !register(&cp, &config, &gpus, &mut stop).await? {
        return Ok(());
    }
    let reregister = Arc::new(Notify::new());
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(heartbeat::run(
        cp.clone(),
        node.clone(),
        config.heartbeat_interval,
        heartbeat::Sources {
            shared: shared.clone(),
            manager: manager.clone(),
            gpus: gpus.clone(),
        },
        reregister.clone(),
        stop.clone(),
    ));
    let (report_tx, report_rx) = mpsc::unbounded_channel();
    tasks.spawn(reporter(cp.clone(), node.clone(), report_rx, stop.clone()));

    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<(String, Option<LocalModel>)>();
    let executor = Executor {
        manager,
        gpus: gpus.clone(),
        repository: config.repository.clone(),
        done: done_tx,
        brought: Arc::default(),
    };
    let mut backoff = nereid_cluster_client::Backoff::default();
    'watch: loop {
        let from_revision = {
            let guard = shared.lock();
            if guard.0.synced { guard.0.revision } else { 0 }
        };
        let request = cp.request(WatchRequest { from_revision }, false);
        let mut stream = tokio::select! {
            r = cp.once(|mut c| async move { c.watch(request).await }) => match r {
                Ok(s) => s,
                Err(failure) => {
                    tracing::warn!(addr = %cp.current_addr(), error = %failure, "cannot watch the control plane");
                    if client::retryable(failure.code()) { cp.fail_over(Some(&failure)); }
                    tokio::select! {
                        _ = tokio::time::sleep(backoff.next_wait()) => continue 'watch,
                        _ = stopped(stop.clone()) => break 'watch,
                    }
                }
            },
            _ = stopped(stop.clone()) => break 'watch,
        };
        tracing::info!(addr = %cp.current_addr(), from_revision, "watching the control plane");
        loop {
            tokio::select! {
                event = stream.next() => match event {
                    Some(Ok(event)) => {
                        backoff.reset();
                        let changed = shared.lock().0.apply(&event);
                        if changed {
                            step(&shared, &node, &executor, &report_tx);
                        }
                    }
                    Some(Err(s)) => {
                        tracing::warn!(addr = %cp.current_addr(), error = %s, "watch stream failed; resuming");
                        cp.fail_over(Some(&nereid_cluster_client::Failure::Refused(s)));
                        break;
                    }
                    None => {
                        tracing::warn!(addr = %cp.current_addr(), "watch stream ended; resuming");
                        cp.fail_over(None);
                        break;
                    }
                },
                Some((model, result)) = done_rx.recv() => {
                    {
                        let mut guard = shared.lock();
                        guard.1.busy = false;
                        match result {
                            Some(m) => { guard.1.models.insert(model, m); }
                            None => { guard.1.models.remove(&model); }
                        }
                    }
                    step(&shared, &node, &executor, &report_tx);
                }
                _ = reregister.notified() => {
                    if !register(&cp, &config, &gpus, &mut stop).await? {
                        break 'watch;
                    }
                }
                _ = stopped(stop.clone()) => break 'watch,
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff.next_wait()) => {}
            _ = stopped(stop.clone()) => break 'watch,
        }
    }
    // Heartbeats end before the leave, so that none arrives after it and turns the node up.
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    leave(&cp, &node).await;
    tracing::info!("agent stopped");
    Ok(())
}

/// How long a stopping worker waits for the control plane to acknowledge that it leaves.
const LEAVE_TIMEOUT: Duration = Duration::from_secs(2);

/// Tells the control plane this node leaves (it marks the node down at once, so routers stop
/// choosing it and its replicas are placed elsewhere), one attempt per control-plane address
/// within [`LEAVE_TIMEOUT`]. Without an answer the heartbeat timeout does the same, later.
async fn leave(cp: &ControlPlane, node: &str) {
    let request = LeaveNodeRequest {
        node_id: node.to_string(),
    };
    let attempts = async {
        let mut last = None;
        for _ in 0..cp.addresses().max(1) {
            let r = cp.request(request.clone(), true);
            match cp.once(|mut c| async move { c.leave_node(r).await }).await {
                Ok(answer) => return Ok(answer.revision),
                Err(failure) => {
                    cp.fail_over(Some(&failure));
                    last = Some(failure);
                }
            }
        }
        Err(last)
    };
    match tokio::time::timeout(LEAVE_TIMEOUT, attempts).await {
        Ok(Ok(revision)) => tracing::info!(node, revision, "left the cluster"),
        Ok(Err(failure)) => tracing::warn!(
            node,
            error = ?failure.map(|f| f.to_string()),
            "the control plane did not take the leave; the heartbeat timeout will mark the node down"
        ),
        Err(_) => tracing::warn!(
            node,
            timeout_ms = LEAVE_TIMEOUT.as_millis() as u64,
            "no answer to the leave; the heartbeat timeout will mark the node down"
        ),
    }
}

/// Resolves once `stop` is set.
async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Registers the node, retrying until the control plane accepts. `false` when stopped first.
async fn register(
    cp: &ControlPlane,
    config: &AgentConfig,
    gpus: &gpu::Gpus,
    stop: &mut watch::Receiver<bool>,
) -> Result<bool, AgentError> {
    let request = RegisterNodeRequest {
        id: config.node_id.clone(),
        addresses: Some(NodeAddresses {
            data_http: config.data_http.clone(),
            data_grpc: config.data_grpc.clone(),
            agent: String::new(),
        }),
        capacity: Some(capacity(config.memory_capacity, gpus)),
        labels: Default::default(),
    };
    let answer = cp
        .call("RegisterNode", stop, |mut c| {
            let r = cp.request(request.clone(), true);
            async move { c.register_node(r).await }
        })
        .await;
    match answer {
        None => Ok(false),
        Some(Ok(r)) => {
            tracing::info!(
                node = %config.node_id,
                addr = %cp.current_addr(),
                revision = r.revision,
                heartbeat_timeout_ms = r.heartbeat_timeout_ms,
                "registered with the control plane"
            );
            Ok(true)
        }
        Some(Err(s)) => Err(AgentError(format!(
            "the control plane refused to register node '{}': {}",
            config.node_id,
            s.message()
        ))),
    }
}

/// Plans from the current state: queues the reports and starts the next operation.
fn step(
    shared: &Shared,
    node: &str,
    executor: &Executor,
    reports: &mpsc::UnboundedSender<(u64, Report)>,
) {
    let mut guard = shared.lock();
    let (mirror, local) = &mut *guard;
    if !mirror.synced {
        return;
    }
    reconcile::forget_gone(local, mirror);
    let plan = reconcile::plan(mirror, node, local);
    for (id, report) in plan.reports {
        let observed = mirror
            .replicas
            .get(&id)
            .map_or(ReplicaState::Unspecified, |r| r.state());
        reconcile::record_sent(local, id, report.clone(), observed);
        let _ = reports.send((id, report));
    }
    if let Some(op) = plan.op {
        local.busy = true;
        let previous = match &op {
            Op::Load { model, .. } | Op::Unload { model } => {
                local.models.get(model).cloned().unwrap_or_default()
            }
        };
        let catalog = mirror
            .models
            .iter()
            .map(|(name, m)| (name.clone(), m.source.clone()))
            .collect();
        let assigned = local.models.keys().cloned().collect();
        executor.start(op, previous, catalog, assigned);
    }
}

/// Sends reports in order, each until the control plane acknowledges it.
async fn reporter(
    cp: Arc<ControlPlane>,
    node: String,
    mut queue: mpsc::UnboundedReceiver<(u64, Report)>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let (replica, report) = tokio::select! {
            r = queue.recv() => match r { Some(r) => r, None => return },
            _ = stopped(stop.clone()) => return,
        };
        let mut request = ReportReplicaRequest {
            node_id: node.clone(),
            replica,
            ..Default::default()
        };
        match &report {
            Report::Loading => request.state = ReplicaState::Loading as i32,
            Report::Ready {
                memory_bytes,
                gpu_memory_bytes,
            } => {
                request.state = ReplicaState::Ready as i32;
                request.measured_memory_bytes = *memory_bytes;
                request.measured_gpu_memory_bytes = *gpu_memory_bytes;
            }
            Report::Failed { reason } => {
                request.state = ReplicaState::Failed as i32;
                request.failure_reason = reason.clone();
            }
            Report::Unloaded => request.unloaded = true,
        }
        let answer = cp
            .call("ReportReplica", &mut stop, |mut c| {
                let r = cp.request(request.clone(), true);
                async move { c.report_replica(r).await }
            })
            .await;
        match answer {
            None => return,
            Some(Ok(_)) => tracing::info!(replica, report = ?report, "replica reported"),
            Some(Err(s)) => {
                tracing::warn!(replica, report = ?report, error = %s, "control plane refused the report; dropped")
            }
        }
    }
}

/// Runs loads and unloads on the data plane, one task each, and hands back the result.
struct Executor {
    manager: Arc<ModelManager>,
    /// NVML, to measure the device memory a load takes.
    gpus: Arc<gpu::Gpus>,
    repository: PathBuf,
    done: mpsc::UnboundedSender<(String, Option<LocalModel>)>,
    /// Per loaded ensemble, the composing models its load linked ([`companions`]).
    brought: Arc<Mutex<BTreeMap<String, BTreeSet<String>>>>,
}

impl Executor {
    /// Runs `op`. `catalog` maps every registered model to its source (for an ensemble's
    /// composing models); `assigned` names the models this node serves by assignment.
    fn start(
        &self,
        op: Op,
        previous: LocalModel,
        catalog: BTreeMap<String, String>,
        assigned: BTreeSet<String>,
    ) {
        let manager = self.manager.clone();
        let gpus = self.gpus.clone();
        let repository = self.repository.clone();
        let done = self.done.clone();
        let brought = self.brought.clone();
        tokio::spawn(async move {
            let (model, result) = match op {
                Op::Load { model, spec } => {
                    let (result, companions) = load(
                        Loader {
                            manager: &manager,
                            gpus: &gpus,
                            repository: &repository,
                        },
                        &model,
                        spec,
                        previous,
                        &catalog,
                    )
                    .await;
                    brought.lock().insert(model.clone(), companions);
                    (model, Some(result))
                }
                Op::Unload { model } => {
                    if let Err(e) = manager.unload(&model).await {
                        tracing::debug!(model = %model, error = %e, "unload");
                    }
                    source::unlink_model(&repository, &model);
                    let released = {
                        let mut brought = brought.lock();
                        let released = companions::releasable(&model, &brought, &assigned);
                        brought.remove(&model);
                        released
                    };
                    for companion in released {
                        if let Err(e) = manager.unload(&companion).await {
                            tracing::debug!(model = %companion, error = %e, "unload composing");
                        }
                        source::unlink_model(&repository, &companion);
                    }
                    (model, None)
                }
            };
            let _ = done.send((model, result));
        });
    }
}

/// Loads `model` with the versions and source of `spec`; what it serves afterwards, and why
/// requested versions that are not served failed.
/// What a load runs against: the data plane, NVML and the agent's repository directory.
struct Loader<'a> {
    manager: &'a ModelManager,
    gpus: &'a gpu::Gpus,
    repository: &'a std::path::Path,
}

/// Per GPU, the growth of device memory used on the GPUs in `on` between two readings, split
/// between the `versions` a load brought (0 when `on` is empty or a GPU is missing from a
/// reading).
pub fn gpu_growth_per_gpu(
    before: &[GpuUtilization],
    after: &[GpuUtilization],
    on: &BTreeSet<u32>,
    versions: usize,
) -> u64 {
    if on.is_empty() {
        return 0;
    }
    let used = |readings: &[GpuUtilization], index: u32| {
        readings
            .iter()
            .find(|g| g.index == index)
            .map(|g| g.memory_used_bytes)
    };
    let mut growth = 0u64;
    for &index in on {
        let (Some(b), Some(a)) = (used(before, index), used(after, index)) else {
            return 0;
        };
        growth = growth.saturating_add(a.saturating_sub(b));
    }
    growth / on.len() as u64 / versions.max(1) as u64
}

async fn load(
    loader: Loader<'_>,
    model: &str,
    spec: reconcile::LoadSpec,
    previous: LocalModel,
    catalog: &BTreeMap<String, String>,
) -> (LocalModel, BTreeSet<String>) {
    let Loader {
        manager,
        gpus,
        repository,
    } = loader;
    let before: BTreeSet<i64> = manager.versions(model).into_iter().collect();
    let fetched = source::fetch_source(&spec.source, &source::cache_dir(repository)).await;
    let prepared = fetched.and_then(|dir| {
        source::link_model(repository, model, &dir)?;
        source::load_config(&dir, &spec.config_override, &spec.versions, &spec.gpus)
    });
    let load_gpus = spec.gpus.clone();
    let gpu_before = if load_gpus.is_empty() {
        Vec::new()
    } else {
        gpus.utilization()
    };
    let mut linked = BTreeSet::new();
    let error = match prepared {
        Err(reason) => Some(reason),
        Ok(config) => {
            let companions = companions::link_composing(repository, &config, catalog).await;
            linked = companions.linked;
            tracing::info!(model, versions = ?spec.versions, source = %spec.source, "loading");
            let source = LoadSource::Repository {
                config_override: Some(config),
            };
            manager.load(model, source).await.err().map(|e| {
                let reason = e.into_message();
                if companions.problems.is_empty() {
                    reason
                } else {
                    format!("{reason} ({})", companions.problems.join("; "))
                }
            })
        }
    };
    let gpu_after = if load_gpus.is_empty() {
        Vec::new()
    } else {
        gpus.utilization()
    };
    let served: BTreeSet<i64> = manager.versions(model).into_iter().collect();
    let brought: Vec<i64> = served.difference(&before).copied().collect();
    let gpu_share = gpu_growth_per_gpu(&gpu_before, &gpu_after, &load_gpus, brought.len());
    // GPU memory: a version this load brought gets its share of the growth; the others keep
    // what they had.
    let per_version = |fresh: u64, kept: &BTreeMap<i64, u64>| -> BTreeMap<i64, u64> {
        served
            .iter()
            .map(|v| {
                let m = if brought.contains(v) {
                    fresh
                } else {
                    kept.get(v).copied().unwrap_or(0)
                };
                (*v, m)
            })
            .collect()
    };
    let gpu_memory = per_version(gpu_share, &previous.gpu_memory);
    // Host memory: what the data plane measured when it built each served version.
    let memory = served
        .iter()
        .map(|&v| {
            let measured = manager
                .get(model, Some(v))
                .ok()
                .and_then(|loaded| loaded.stats.load());
            let kept = previous.memory.get(&v).copied().unwrap_or(0);
            (v, measured.map_or(kept, |report| report.memory_bytes))
        })
        .collect();
    let failures = spec
        .versions
        .iter()
        .filter(|v| !served.contains(v))
        .map(|v| {
            let reason = error.clone().unwrap_or_else(|| {
                format!(
                    "version {v} of model '{model}' is not in its source '{}'",
                    spec.source
                )
            });
            (*v, reason)
        })
        .collect();
    let local = LocalModel {
        request: Some(spec),
        served,
        failures,
        memory,
        gpu_memory,
    };
    (local, linked)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(index: u32, used_gib: u64) -> GpuUtilization {
        GpuUtilization {
            index,
            utilization: 0.0,
            memory_used_bytes: used_gib << 30,
            memory_total_bytes: 80 << 30,
        }
    }

    #[test]
    fn gpu_memory_is_the_growth_on_the_assigned_gpus_per_gpu_and_version() {
        let before = [reading(0, 1), reading(1, 2), reading(2, 0)];
        let after = [reading(0, 5), reading(1, 8), reading(2, 9)];
        // GPU 2 grew too (another process): not counted, it is not assigned.
        assert_eq!(
            gpu_growth_per_gpu(&before, &after, &[0, 1].into(), 1),
            5 << 30
        );
        assert_eq!(gpu_growth_per_gpu(&before, &after, &[1].into(), 2), 3 << 30);
        // Memory freed meanwhile counts as no growth, not as a negative one.
        assert_eq!(gpu_growth_per_gpu(&after, &before, &[0].into(), 1), 0);
    }

    #[test]
    fn without_gpus_or_readings_the_gpu_memory_is_zero() {
        let before = [reading(0, 1)];
        let after = [reading(0, 5)];
        assert_eq!(gpu_growth_per_gpu(&before, &after, &BTreeSet::new(), 1), 0);
        assert_eq!(gpu_growth_per_gpu(&[], &[], &[0].into(), 1), 0, "no NVML");
        assert_eq!(gpu_growth_per_gpu(&before, &after, &[0, 7].into(), 1), 0);
    }
}
