//! The worker agent end to end, in process: a fake control plane (a tonic Cluster server on
//! 127.0.0.1:0 that records registrations, heartbeats and reports and streams a scripted watch),
//! a real data plane and the real ONNX Runtime.
//!
//! The agent registers, loads the model assigned to its node (and nothing else), reports
//! Loading then Ready with measured memory, the model answers inference, the repository API
//! refuses client loads, an Unloading delta unloads it and the agent reports it unloaded, and a
//! source the worker cannot read fails the replica with the reason.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use nereid_agent::{AgentConfig, run as run_agent, run_worker};
use nereid_data_plane::{
    Backends, ControlMode, DataPlane, DataPlaneConfig, ManagerConfig, ModelManager, ServeConfig,
};
use nereid_proto::pb::cluster::cluster_server::{Cluster, ClusterServer};
use nereid_proto::pb::cluster::{
    HeartbeatRequest, HeartbeatResponse, Model, RegisterNodeRequest, RegisterNodeResponse, Replica,
    ReplicaState, ReportReplicaRequest, ReportReplicaResponse, StateDelta, StateSnapshot,
    WatchEvent, WatchRequest, watch_event,
};
use nereid_proto::{InferRequest, InferenceService, LoadRequest, ServiceError, UnloadRequest};
use parking_lot::Mutex;
use tokio::sync::{broadcast, mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

mod common;
use common::{ort_library, workspace};
use nereid_test_support::{floats, fp32};

const NODE: &str = "w1";
const TOKEN: &str = "t0ken";

/// A control plane that accepts everything and remembers it.
#[derive(Default)]
struct Fake {
    registrations: Mutex<Vec<RegisterNodeRequest>>,
    heartbeats: Mutex<Vec<HeartbeatRequest>>,
    reports: Mutex<Vec<ReportReplicaRequest>>,
    /// Node ids of `LeaveNode` calls.
    leaves: Mutex<Vec<String>>,
    watches: Mutex<Vec<u64>>,
    snapshot: Mutex<Option<WatchEvent>>,
    deltas: Mutex<Option<broadcast::Sender<WatchEvent>>>,
    /// The next heartbeat answers `reregister`.
    reregister_next: std::sync::atomic::AtomicBool,
    /// Bumped to end every open watch stream (a control-plane node going away).
    generation: Mutex<Option<watch::Sender<u32>>>,
}

impl Fake {
    fn deltas(&self) -> broadcast::Sender<WatchEvent> {
        self.deltas
            .lock()
            .get_or_insert_with(|| broadcast::channel(16).0)
            .clone()
    }

    fn generation(&self) -> watch::Sender<u32> {
        self.generation
            .lock()
            .get_or_insert_with(|| watch::channel(0).0)
            .clone()
    }

    fn count(&self, replica: u64, state: ReplicaState) -> usize {
        self.reports
            .lock()
            .iter()
            .filter(|r| r.replica == replica && r.state == state as i32)
            .count()
    }
}

fn authorized<T>(r: &Request<T>) -> Result<(), Status> {
    match r.metadata().get("authorization") {
        Some(v) if v == format!("Bearer {TOKEN}").as_str() => Ok(()),
        _ => Err(Status::unauthenticated("missing or wrong token")),
    }
}

/// The service over a shared [`Fake`] the test reads.
struct Svc(Arc<Fake>);

impl std::ops::Deref for Svc {
    type Target = Fake;
    fn deref(&self) -> &Fake {
        &self.0
    }
}

#[tonic::async_trait]
impl Cluster for Svc {
    async fn register_node(
        &self,
        r: Request<RegisterNodeRequest>,
    ) -> Result<Response<RegisterNodeResponse>, Status> {
        authorized(&r)?;
        self.registrations.lock().push(r.into_inner());
        Ok(Response::new(RegisterNodeResponse {
            revision: 1,
            heartbeat_interval_ms: 100,
            heartbeat_timeout_ms: 1000,
        }))
    }

    async fn heartbeat(
        &self,
        r: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatResponse>, Status> {
        authorized(&r)?;
        self.heartbeats.lock().push(r.into_inner());
        let reregister = self
            .reregister_next
            .swap(false, std::sync::atomic::Ordering::SeqCst);
        Ok(Response::new(HeartbeatResponse {
            reregister,
            revision: 1,
        }))
    }

    async fn activate(
        &self,
        _: Request<nereid_proto::pb::cluster::ActivateRequest>,
    ) -> Result<Response<nereid_proto::pb::cluster::ActivateResponse>, Status> {
        Err(Status::unimplemented("workers do not activate models"))
    }

    async fn report_replica(
        &self,
        r: Request<ReportReplicaRequest>,
    ) -> Result<Response<ReportReplicaResponse>, Status> {
        authorized(&r)?;
        self.reports.lock().push(r.into_inner());
        Ok(Response::new(ReportReplicaResponse { revision: 1 }))
    }

    async fn leave_node(
        &self,
        r: Request<nereid_proto::pb::cluster::LeaveNodeRequest>,
    ) -> Result<Response<nereid_proto::pb::cluster::LeaveNodeResponse>, Status> {
        authorized(&r)?;
        self.leaves.lock().push(r.into_inner().node_id);
        Ok(Response::new(
            nereid_proto::pb::cluster::LeaveNodeResponse { revision: 1 },
        ))
    }

    type WatchStream = ReceiverStream<Result<WatchEvent, Status>>;

    async fn watch(&self, r: Request<WatchRequest>) -> Result<Response<Self::WatchStream>, Status> {
        authorized(&r)?;
        let from = r.get_ref().from_revision;
        self.watches.lock().push(from);
        let (tx, rx) = mpsc::channel(16);
        // A resumed watch gets the deltas only.
        let snapshot = if from == 0 {
            self.snapshot.lock().clone()
        } else {
            None
        };
        let mut deltas = self.deltas().subscribe();
        let mut generation = self.generation().subscribe();
        generation.mark_unchanged();
        tokio::spawn(async move {
            if let Some(s) = snapshot {
                let _ = tx.send(Ok(s)).await;
            }
            loop {
                tokio::select! {
                    d = deltas.recv() => match d {
                        Ok(d) => if tx.send(Ok(d)).await.is_err() { return },
                        Err(_) => return,
                    },
                    _ = generation.changed() => return,
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

const ADD_SUB_CONFIG: &str = r#"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
version_policy: { all: {} }
"#;

/// A Triton-layout model directory with versions 1 and 2 of add_sub.
fn add_sub_source(dir: &Path) {
    for v in [1, 2] {
        std::fs::create_dir_all(dir.join(v.to_string())).unwrap();
        std::fs::copy(
            workspace().join("data-plane/src/backend/onnx/testdata/add_sub.onnx"),
            dir.join(format!("{v}/model.onnx")),
        )
        .unwrap();
    }
    std::fs::write(dir.join("config.pbtxt"), ADD_SUB_CONFIG).unwrap();
}

fn replica(id: u64, model: &str, version: i64, node: &str, state: ReplicaState) -> Replica {
    Replica {
        id,
        model: model.into(),
        version,
        node: node.into(),
        state: state as i32,
        ..Default::default()
    }
}

fn model(name: &str, source: String) -> Model {
    Model {
        name: name.into(),
        source,
        ..Default::default()
    }
}

/// Serves `fake` on 127.0.0.1:0.
async fn serve_fake(fake: &Arc<Fake>) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let service = ClusterServer::new(Svc(fake.clone()));
    let server = tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
            .await;
    });
    (addr, server)
}

/// Polls `f` until it returns `Some`, for at most `secs` seconds.
async fn eventually<T>(what: &str, secs: u64, f: impl FnMut() -> Option<T>) -> T {
    nereid_test_support::eventually_some(what, Duration::from_secs(secs), f).await
}

fn report_of(fake: &Fake, replica: u64, state: ReplicaState) -> Option<ReportReplicaRequest> {
    fake.reports
        .lock()
        .iter()
        .find(|r| r.replica == replica && r.state == state as i32)
        .cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_follows_its_assignments() {
    let sources = tempfile::tempdir().unwrap();
    let add_sub_dir = sources.path().join("add_sub");
    add_sub_source(&add_sub_dir);
    let other_dir = sources.path().join("other");
    add_sub_source(&other_dir);
    let work = tempfile::tempdir().unwrap();
    let repo = work.path().join("models");
    std::fs::create_dir_all(&repo).unwrap();

    // The cluster: add_sub v1 here, `other` only on another node, `remote` here from a
    // source scheme no worker reads (object stores are covered by test_object_store.py).
    let fake = Arc::new(Fake::default());
    *fake.snapshot.lock() = Some(WatchEvent {
        revision: 5,
        event: Some(watch_event::Event::Snapshot(StateSnapshot {
            models: vec![
                model("add_sub", format!("file://{}", add_sub_dir.display())),
                model("other", format!("file://{}", other_dir.display())),
                model("remote", "ftp://bucket/remote".into()),
            ],
            nodes: vec![],
            replicas: vec![
                replica(1, "add_sub", 1, NODE, ReplicaState::Pending),
                replica(2, "other", 1, "w2", ReplicaState::Pending),
                replica(3, "remote", 1, NODE, ReplicaState::Pending),
            ],
        })),
    });
    let (cp_addr, server) = serve_fake(&fake).await;

    let manager = Arc::new(ModelManager::new(
        ManagerConfig {
            repositories: vec![repo.clone()],
            control_mode: ControlMode::Explicit,
            startup_models: vec![],
            auto_complete: true,
            queue_capacity: 16,
            cluster_managed: true,
            rate_limit: Default::default(),
            response_cache_bytes: None,
            config_name: None,
            namespacing: false,
        },
        Backends::new(Some(ort_library())),
    ));
    let dp = DataPlane::new(
        DataPlaneConfig {
            server_name: "nereid".into(),
            strict_readiness: true,
        },
        manager.clone(),
    );
    let (stop_tx, stop_rx) = watch::channel(false);
    let agent = tokio::spawn(run_agent(
        AgentConfig {
            // An unreachable node first: the agent fails over to the live one.
            control_plane: vec!["127.0.0.1:1".into(), cp_addr.to_string()],
            node_id: NODE.into(),
            data_http: "127.0.0.1:8000".into(),
            data_grpc: "127.0.0.1:8001".into(),
            heartbeat_interval: Duration::from_millis(50),
            repository: repo.clone(),
            memory_capacity: Some(1 << 30),
            auth_token: Some(TOKEN.into()),
            cluster_dial: Default::default(),
        },
        manager.clone(),
        stop_rx,
    ));

    let reg = eventually("registration", 30, || {
        fake.registrations.lock().first().cloned()
    })
    .await;
    assert_eq!(reg.id, NODE);
    assert_eq!(reg.addresses.unwrap().data_grpc, "127.0.0.1:8001");
    let capacity = reg.capacity.unwrap();
    assert_eq!(capacity.memory_bytes, 1 << 30);
    assert!(capacity.cpu_millis >= 1000);

    let ready = eventually("add_sub ready", 120, || {
        report_of(&fake, 1, ReplicaState::Ready)
    })
    .await;
    assert!(ready.measured_memory_bytes > 0, "{ready:?}");
    {
        let reports = fake.reports.lock();
        let loading = reports
            .iter()
            .position(|r| r.replica == 1 && r.state == ReplicaState::Loading as i32)
            .expect("a Loading report");
        let ready = reports
            .iter()
            .position(|r| r.replica == 1 && r.state == ReplicaState::Ready as i32)
            .unwrap();
        assert!(loading < ready);
    }
    // Only the assigned version, from the private repository's link to the source.
    assert_eq!(manager.versions("add_sub"), vec![1]);
    assert_eq!(
        std::fs::read_link(repo.join("add_sub")).unwrap(),
        add_sub_dir
    );

    let response = dp
        .infer(InferRequest {
            model_name: "add_sub".into(),
            inputs: vec![
                fp32("INPUT0", vec![1, 4], &[1.0, 2.0, 3.0, 4.0]),
                fp32("INPUT1", vec![1, 4], &[0.5, 0.5, 0.5, 0.5]),
            ],
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(floats(&response.outputs[0]), vec![1.5, 2.5, 3.5, 4.5]);

    let failed = eventually("remote failed", 30, || {
        report_of(&fake, 3, ReplicaState::Failed)
    })
    .await;
    assert_eq!(
        failed.failure_reason,
        "source scheme 'ftp' is not supported; use file://, s3://, gs:// or as://"
    );

    // Heartbeats carry the served version and the replica's memory.
    eventually("a heartbeat with the replica", 30, || {
        fake.heartbeats.lock().iter().find_map(|h| {
            let served = h
                .models
                .iter()
                .any(|m| m.model == "add_sub" && m.version == 1);
            let memory = h
                .replica_memory
                .iter()
                .any(|m| m.replica == 1 && m.memory_bytes > 0);
            (served && memory && h.node_id == NODE && h.memory_total_bytes > 0).then_some(())
        })
    })
    .await;

    // Clients cannot load or unload: the control plane decides.
    for refused in [
        dp.load_model("other", LoadRequest::default()).await,
        dp.unload_model("add_sub", UnloadRequest::new(false)).await,
    ] {
        match refused {
            Err(ServiceError::Unavailable(m)) => {
                assert!(m.contains("managed by the control plane"), "{m}")
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    // The control plane takes the replica away.
    assert_eq!(*fake.watches.lock(), vec![0]);
    let deltas = fake.deltas();
    deltas
        .send(WatchEvent {
            revision: 6,
            event: Some(watch_event::Event::Delta(StateDelta {
                upserted_replicas: vec![replica(1, "add_sub", 1, NODE, ReplicaState::Unloading)],
                ..Default::default()
            })),
        })
        .unwrap();
    let gone = eventually("add_sub unloaded", 30, || {
        fake.reports
            .lock()
            .iter()
            .find(|r| r.replica == 1 && r.unloaded)
            .cloned()
    })
    .await;
    assert_eq!(gone.node_id, NODE);
    assert!(manager.versions("add_sub").is_empty());
    assert!(std::fs::symlink_metadata(repo.join("add_sub")).is_err());

    // Nothing that was not assigned here was ever loaded, and nothing was reported twice.
    assert!(manager.versions("other").is_empty());
    assert!(manager.readiness("other", None).is_err());
    {
        let reports = fake.reports.lock();
        assert!(reports.iter().all(|r| r.replica != 2));
        let readies = reports
            .iter()
            .filter(|r| r.replica == 1 && r.state == ReplicaState::Ready as i32)
            .count();
        assert_eq!(readies, 1, "{reports:?}");
    }

    // The watch stream breaks: the agent resumes from the last revision it applied, and
    // follows the deltas that come next.
    fake.generation().send_modify(|g| *g += 1);
    eventually("a resumed watch", 30, || {
        (fake.watches.lock().len() == 2).then_some(())
    })
    .await;
    assert_eq!(*fake.watches.lock(), vec![0, 6]);
    deltas
        .send(WatchEvent {
            revision: 7,
            event: Some(watch_event::Event::Delta(StateDelta {
                upserted_replicas: vec![replica(4, "add_sub", 2, NODE, ReplicaState::Pending)],
                deleted_replicas: vec![1],
                ..Default::default()
            })),
        })
        .unwrap();
    eventually("add_sub v2 ready", 60, || {
        report_of(&fake, 4, ReplicaState::Ready)
    })
    .await;
    assert_eq!(manager.versions("add_sub"), vec![2]);

    stop_tx.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(10), agent)
        .await
        .expect("the agent stops")
        .unwrap()
        .unwrap();

    // A restarted worker (nothing loaded) gets the snapshot, where its replica is Ready, and
    // converges: it loads the model again and reports Loading, then Ready.
    *fake.snapshot.lock() = Some(WatchEvent {
        revision: 9,
        event: Some(watch_event::Event::Snapshot(StateSnapshot {
            models: vec![model(
                "add_sub",
                format!("file://{}", add_sub_dir.display()),
            )],
            nodes: vec![],
            replicas: vec![replica(4, "add_sub", 2, NODE, ReplicaState::Ready)],
        })),
    });
    let manager = Arc::new(ModelManager::new(
        ManagerConfig {
            repositories: vec![repo.clone()],
            control_mode: ControlMode::Explicit,
            startup_models: vec![],
            auto_complete: true,
            queue_capacity: 16,
            cluster_managed: true,
            rate_limit: Default::default(),
            response_cache_bytes: None,
            config_name: None,
            namespacing: false,
        },
        Backends::new(Some(ort_library())),
    ));
    let (stop_tx, stop_rx) = watch::channel(false);
    let agent = tokio::spawn(run_agent(
        AgentConfig {
            control_plane: vec![cp_addr.to_string()],
            node_id: NODE.into(),
            data_http: "127.0.0.1:8000".into(),
            data_grpc: "127.0.0.1:8001".into(),
            heartbeat_interval: Duration::from_millis(50),
            repository: repo.clone(),
            memory_capacity: None,
            auth_token: Some(TOKEN.into()),
            cluster_dial: Default::default(),
        },
        manager.clone(),
        stop_rx,
    ));
    eventually("add_sub v2 ready again", 60, || {
        (fake.count(4, ReplicaState::Ready) == 2).then_some(())
    })
    .await;
    assert_eq!(fake.count(4, ReplicaState::Loading), 2);
    assert_eq!(fake.registrations.lock().len(), 2);
    assert_eq!(manager.versions("add_sub"), vec![2]);
    stop_tx.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(10), agent)
        .await
        .expect("the agent stops")
        .unwrap()
        .unwrap();
    server.abort();
}

/// `nereid worker`'s startup in process: the data plane binds its ports, the agent advertises
/// them under the configured host, registers again when a heartbeat asks, and a shutdown
/// signal stops both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_advertises_its_bound_ports_and_shuts_down() {
    let fake = Arc::new(Fake::default());
    *fake.snapshot.lock() = Some(WatchEvent {
        revision: 1,
        event: Some(watch_event::Event::Snapshot(StateSnapshot::default())),
    });
    fake.reregister_next
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let (cp_addr, server) = serve_fake(&fake).await;
    let work = tempfile::tempdir().unwrap();
    let repo = work.path().join("models");
    std::fs::create_dir_all(&repo).unwrap();
    // A link left by an earlier run is cleared at start.
    std::os::unix::fs::symlink(work.path(), repo.join("stale")).unwrap();
    let local = "127.0.0.1".parse().unwrap();
    let serve = ServeConfig {
        manager: ManagerConfig {
            repositories: vec![],
            control_mode: ControlMode::None,
            startup_models: vec!["x".into()],
            auto_complete: true,
            queue_capacity: 16,
            cluster_managed: false,
            rate_limit: Default::default(),
            response_cache_bytes: None,
            config_name: None,
            namespacing: false,
        },
        data_plane: DataPlaneConfig {
            server_name: "nereid".into(),
            strict_readiness: true,
        },
        http_addr: Some(SocketAddr::new(local, 0)),
        grpc_addr: Some(SocketAddr::new(local, 0)),
        metrics_addr: None,
        metrics: Default::default(),
        http_max_input_size: 1 << 20,
        frontend: Default::default(),
        poll_interval: Duration::from_secs(15),
        exit_timeout: Duration::from_secs(5),
        exit_on_error: false,
        onnxruntime_library: Some(ort_library()),
        python: None,
        telemetry: Default::default(),
        ports: Default::default(),
        allow_client_shm: false,
        http_on_grpc_port: false,
    };
    let agent = AgentConfig {
        control_plane: vec![cp_addr.to_string()],
        node_id: NODE.into(),
        data_http: String::new(),
        data_grpc: String::new(),
        heartbeat_interval: Duration::from_millis(50),
        repository: repo.clone(),
        memory_capacity: None,
        auth_token: Some(TOKEN.into()),
        cluster_dial: Default::default(),
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let worker = tokio::spawn(run_worker(serve, agent, "10.1.2.3".into(), async move {
        let _ = stop_rx.await;
    }));
    let reg = eventually("registration", 30, || {
        fake.registrations.lock().first().cloned()
    })
    .await;
    let addresses = reg.addresses.unwrap();
    for a in [&addresses.data_http, &addresses.data_grpc] {
        let port: u16 = a.strip_prefix("10.1.2.3:").expect(a).parse().unwrap();
        assert_ne!(port, 0);
    }
    assert_ne!(addresses.data_http, addresses.data_grpc);
    assert!(reg.capacity.unwrap().memory_bytes > 0);
    assert!(std::fs::symlink_metadata(repo.join("stale")).is_err());
    // The first heartbeat is answered `reregister`: the worker registers again.
    eventually("a second registration", 30, || {
        (fake.registrations.lock().len() == 2).then_some(())
    })
    .await;
    assert!(fake.leaves.lock().is_empty());
    stop_tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(20), worker)
        .await
        .expect("the worker stops")
        .unwrap()
        .unwrap();
    // On the way down the worker told the control plane it leaves.
    assert_eq!(fake.leaves.lock().len(), 1);
    server.abort();
}

/// A Python model whose output is its input plus the device id its instance was given.
const DEVICE_MODEL_PY: &str = r#"
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        assert args["model_instance_kind"] == "GPU", args
        self.device = int(args["model_instance_device_id"])

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            y = (x + self.device).astype(np.float32)
            out.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", y)]))
        return out
"#;

/// Two replicas of a `KIND_GPU` model placed on GPUs 3 and 1 of a node with four (pretend)
/// GPUs: the model loads with its instance group on exactly those GPUs, not on the GPU its
/// config lists nor on every visible one, and its instances run with those device ids.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn assigned_gpus_are_the_gpus_the_model_loads_on() {
    let sources = tempfile::tempdir().unwrap();
    let dir = sources.path().join("on_gpu");
    for v in [1, 2] {
        std::fs::create_dir_all(dir.join(v.to_string())).unwrap();
        std::fs::write(dir.join(format!("{v}/model.py")), DEVICE_MODEL_PY).unwrap();
    }
    let python = workspace().join(".venv/bin/python");
    std::fs::write(
        dir.join("config.pbtxt"),
        format!(
            r#"backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
instance_group [ {{ name: "gpu" count: 1 kind: KIND_GPU gpus: [ 0 ] }} ]
parameters {{ key: "EXECUTION_ENV_PATH" value {{ string_value: "{}" }} }}
"#,
            python.display()
        ),
    )
    .unwrap();
    let work = tempfile::tempdir().unwrap();
    let repo = work.path().join("models");
    std::fs::create_dir_all(&repo).unwrap();
    let on = |id, version, gpu| Replica {
        gpus: vec![gpu],
        ..replica(id, "on_gpu", version, NODE, ReplicaState::Pending)
    };
    let fake = Arc::new(Fake::default());
    *fake.snapshot.lock() = Some(WatchEvent {
        revision: 2,
        event: Some(watch_event::Event::Snapshot(StateSnapshot {
            models: vec![model("on_gpu", format!("file://{}", dir.display()))],
            nodes: vec![],
            replicas: vec![on(1, 1, 3), on(2, 2, 1)],
        })),
    });
    let (cp_addr, server) = serve_fake(&fake).await;
    let manager = Arc::new(ModelManager::new(
        ManagerConfig {
            repositories: vec![repo.clone()],
            control_mode: ControlMode::Explicit,
            startup_models: vec![],
            auto_complete: true,
            queue_capacity: 16,
            cluster_managed: true,
            rate_limit: Default::default(),
            response_cache_bytes: None,
            config_name: None,
            namespacing: false,
        },
        Backends::new(None).with_gpu_count(4),
    ));
    let dp = DataPlane::new(
        DataPlaneConfig {
            server_name: "nereid".into(),
            strict_readiness: true,
        },
        manager.clone(),
    );
    let (stop_tx, stop_rx) = watch::channel(false);
    let agent = tokio::spawn(run_agent(
        AgentConfig {
            control_plane: vec![cp_addr.to_string()],
            node_id: NODE.into(),
            data_http: "127.0.0.1:8000".into(),
            data_grpc: "127.0.0.1:8001".into(),
            heartbeat_interval: Duration::from_millis(50),
            repository: repo.clone(),
            memory_capacity: Some(1 << 30),
            auth_token: Some(TOKEN.into()),
            cluster_dial: Default::default(),
        },
        manager.clone(),
        stop_rx,
    ));
    for id in [1, 2] {
        eventually("the replicas ready", 120, || {
            if let Some(f) = report_of(&fake, id, ReplicaState::Failed) {
                panic!("replica {id} failed: {}", f.failure_reason);
            }
            report_of(&fake, id, ReplicaState::Ready)
        })
        .await;
    }
    for version in [1, 2] {
        let config = dp.model_config("on_gpu", Some(version)).await.unwrap();
        let groups: Vec<_> = config
            .instance_group
            .iter()
            .map(|g| (g.name.as_str(), g.count, g.gpus.clone()))
            .collect();
        assert_eq!(groups, [("gpu", 1, vec![1, 3])], "version {version}");
        // Each request runs on one of the two instances: GPU 1 or GPU 3, never the config's 0.
        let response = dp
            .infer(InferRequest {
                model_name: "on_gpu".into(),
                model_version: Some(version),
                inputs: vec![fp32("INPUT0", vec![2], &[10.0, 20.0])],
                ..Default::default()
            })
            .await
            .unwrap();
        let out = floats(&response.outputs[0]);
        assert!(
            out == [11.0, 21.0] || out == [13.0, 23.0],
            "version {version}: {out:?}"
        );
    }
    stop_tx.send(true).unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(20), agent).await;
    server.abort();
}
