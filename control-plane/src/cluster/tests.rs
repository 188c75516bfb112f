//! The cluster service against the in-memory consensus: registration, heartbeats, replica
//! reports and their errors.

use std::sync::Arc;
use std::time::Duration;

use nereid_proto::pb::cluster as pb;
use nereid_proto::pb::cluster::cluster_server::Cluster;
use tonic::{Code, Request};

use super::service::ClusterService;
use crate::consensus::Consensus;
use crate::consensus::memory::MemoryConsensus;
use crate::forward::LeaderChannels;
use crate::leader::Observations;
use crate::leader::soft::SoftState;
use crate::state::{Command, ModelSpec, ReplicaState, Resources, VersionPolicy};
use crate::watch::WatchHub;

fn service() -> (Arc<MemoryConsensus>, Arc<SoftState>, ClusterService) {
    let consensus = Arc::new(MemoryConsensus::new(1));
    let dynamic: Arc<dyn Consensus> = consensus.clone();
    let soft = Arc::new(SoftState::new(Duration::from_secs(2)));
    let hub = Arc::new(WatchHub::spawn(dynamic.as_ref()));
    let leader = Arc::new(LeaderChannels::new(dynamic.clone(), None));
    let svc = ClusterService::new(
        dynamic,
        soft.clone(),
        hub,
        leader,
        Duration::from_millis(500),
    );
    (consensus, soft, svc)
}

fn register(id: &str) -> pb::RegisterNodeRequest {
    pb::RegisterNodeRequest {
        id: id.into(),
        addresses: Some(pb::NodeAddresses {
            data_http: "127.0.0.1:8000".into(),
            data_grpc: "127.0.0.1:8001".into(),
            agent: "127.0.0.1:8001".into(),
        }),
        capacity: Some(pb::NodeCapacity {
            cpu_millis: 2000,
            memory_bytes: 8 << 30,
            gpus: vec![],
        }),
        labels: Default::default(),
    }
}

#[tokio::test]
async fn register_heartbeat_and_report_a_replica_through_its_life() {
    let (consensus, soft, svc) = service();
    let answer = svc
        .register_node(Request::new(register("w1")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.heartbeat_interval_ms, 500);
    assert_eq!(answer.heartbeat_timeout_ms, 2000);
    assert!(consensus.local_state().node("w1").is_some());

    let hb = svc
        .heartbeat(Request::new(pb::HeartbeatRequest {
            node_id: "w1".into(),
            cpu_utilization: 0.25,
            memory_used_bytes: 1 << 30,
            memory_total_bytes: 8 << 30,
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    assert!(!hb.reregister);
    assert_eq!(soft.node_utilization("w1").unwrap().cpu, 0.25);
    let unknown = svc
        .heartbeat(Request::new(pb::HeartbeatRequest {
            node_id: "ghost".into(),
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    assert!(unknown.reregister, "an unknown node is told to register");

    consensus
        .write(Command::UpsertModel(ModelSpec {
            name: "m".into(),
            source: "file:///m".into(),
            version_policy: VersionPolicy::Latest { n: 1 },
            config_override: None,
            min_replicas: 1,
            max_replicas: 1,
            resources: Resources::default(),
            labels: Default::default(),
            available_versions: vec![1],
            traffic: Default::default(),
        }))
        .await
        .unwrap();
    let id = consensus
        .write(Command::AddReplica {
            model: "m".into(),
            version: 1,
            node: "w1".into(),
            reason: "test".into(),
            gpus: Vec::new(),
        })
        .await
        .unwrap()
        .replica_id
        .unwrap();

    let report = |node: &str, state: pb::ReplicaState, unloaded: bool| pb::ReportReplicaRequest {
        node_id: node.into(),
        replica: id,
        state: state as i32,
        failure_reason: String::new(),
        measured_memory_bytes: 123,
        unloaded,
        measured_gpu_memory_bytes: 0,
    };
    let err = svc
        .report_replica(Request::new(report("w2", pb::ReplicaState::Loading, false)))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("w1"), "{}", err.message());

    for state in [pb::ReplicaState::Loading, pb::ReplicaState::Ready] {
        svc.report_replica(Request::new(report("w1", state, false)))
            .await
            .unwrap();
    }
    let replica = consensus.local_state().replica(id).cloned().unwrap();
    assert_eq!(replica.state, ReplicaState::Ready);
    assert_eq!(replica.measured_memory_bytes, Some(123));

    let err = svc
        .report_replica(Request::new(report(
            "w1",
            pb::ReplicaState::Unspecified,
            false,
        )))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");

    consensus
        .write(Command::SetReplicaState {
            id,
            state: ReplicaState::Unloading,
            measured_memory_bytes: None,
            measured_gpu_memory_bytes: None,
        })
        .await
        .unwrap();
    svc.report_replica(Request::new(report(
        "w1",
        pb::ReplicaState::Unspecified,
        true,
    )))
    .await
    .unwrap();
    assert!(consensus.local_state().replica(id).is_none());
    svc.report_replica(Request::new(report(
        "w1",
        pb::ReplicaState::Unspecified,
        true,
    )))
    .await
    .expect("a retried 'unloaded' report is harmless");
    let err = svc
        .report_replica(Request::new(report("w1", pb::ReplicaState::Ready, false)))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
}

#[tokio::test]
async fn a_bad_registration_names_the_field() {
    let (_, _, svc) = service();
    let mut req = register("w1");
    req.addresses = None;
    let err = svc.register_node(Request::new(req)).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("addresses"), "{}", err.message());
}

#[tokio::test]
async fn a_leaving_node_is_down_at_once_and_up_again_when_it_registers() {
    use crate::state::NodeStatus;
    use std::time::Instant;

    let (consensus, soft, svc) = service();
    svc.register_node(Request::new(register("w1")))
        .await
        .unwrap();
    let status = |c: &MemoryConsensus| c.local_state().node("w1").unwrap().status;
    assert_eq!(status(&consensus), NodeStatus::Up);

    let left = svc
        .leave_node(Request::new(pb::LeaveNodeRequest {
            node_id: "w1".into(),
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status(&consensus), NodeStatus::Down);
    assert!(left.revision >= consensus.local_state().revision());
    // The liveness round does not bring it back: it was forgotten, not just silent.
    let nodes = [("w1", NodeStatus::Down)];
    assert!(soft.liveness_transitions(nodes, Instant::now()).is_empty());
    // A retried leave is a success; registering again brings the node back.
    svc.leave_node(Request::new(pb::LeaveNodeRequest {
        node_id: "w1".into(),
    }))
    .await
    .unwrap();
    svc.register_node(Request::new(register("w1")))
        .await
        .unwrap();
    let transitions = soft.liveness_transitions(nodes, Instant::now());
    assert_eq!(transitions, vec![("w1".to_string(), NodeStatus::Up)]);

    for (id, code) in [("", Code::InvalidArgument), ("ghost", Code::NotFound)] {
        let err = svc
            .leave_node(Request::new(pb::LeaveNodeRequest { node_id: id.into() }))
            .await
            .unwrap_err();
        assert_eq!(err.code(), code, "{err:?}");
        assert!(
            err.message()
                .contains(if id.is_empty() { "node_id" } else { id }),
            "{err:?}"
        );
    }
}

#[tokio::test]
async fn an_activation_with_nothing_to_evict_is_refused_naming_why() {
    let (consensus, soft, svc) = service();
    svc.register_node(Request::new(register("w1")))
        .await
        .unwrap();
    let model = |name: &str, min: u32, gib: u64| ModelSpec {
        name: name.into(),
        source: format!("file:///models/{name}"),
        version_policy: VersionPolicy::Latest { n: 1 },
        config_override: None,
        min_replicas: min,
        max_replicas: 1,
        resources: Resources {
            memory_bytes: gib << 30,
            ..Default::default()
        },
        labels: Default::default(),
        available_versions: vec![1],
        traffic: Default::default(),
    };
    for spec in [
        model("pinned", 1, 6),
        model("big", 0, 4),
        model("small", 0, 1),
    ] {
        consensus.write(Command::UpsertModel(spec)).await.unwrap();
    }
    let placed = consensus
        .write(Command::AddReplica {
            model: "pinned".into(),
            version: 1,
            node: "w1".into(),
            reason: String::new(),
            gpus: Vec::new(),
        })
        .await
        .unwrap();
    for state in [ReplicaState::Loading, ReplicaState::Ready] {
        consensus
            .write(Command::SetReplicaState {
                id: placed.replica_id.unwrap(),
                state,
                measured_memory_bytes: None,
                measured_gpu_memory_bytes: None,
            })
            .await
            .unwrap();
    }
    let activate = |model: &str| {
        Request::new(pb::ActivateRequest {
            model: model.into(),
        })
    };
    let refused = svc.activate(activate("big")).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    let message = refused.message();
    assert!(
        message.starts_with("model 'big' cannot be loaded: no capacity"),
        "{message}"
    );
    assert!(message.contains("nothing can be evicted"), "{message}");
    assert!(message.contains("1 pinned"), "{message}");
    svc.activate(activate("small")).await.unwrap();
    assert!(soft.load().demanded.contains("small"));
    let metrics = nereid_telemetry::render_prometheus(&soft.cache_stats().families());
    assert!(
        metrics.contains("nereid_cache_cold_starts_total{model=\"big\"} 1"),
        "{metrics}"
    );
}
