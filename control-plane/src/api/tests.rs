//! The management API over an in-memory consensus: each RPC's happy path and its refusals,
//! through the gRPC trait (the REST router's tests are in `rest_tests.rs`).

use std::path::Path;
use std::sync::Arc;

use nereid_proto::pb::cluster as pb;
use pb::management_server::Management;

use super::service::ManagementService;
use super::*;
use crate::consensus::Consensus;
use crate::consensus::memory::MemoryConsensus;
use crate::convert::version_policy_to_pb;
use crate::leader::NoObservations;
use crate::state::{Command, VersionPolicy};
use crate::testing::node;

pub(super) const TOKEN: &str = "t0ken";

pub(super) fn setup() -> (ManagementService, Arc<MemoryConsensus>) {
    let consensus = Arc::new(MemoryConsensus::new(1));
    let service = ManagementService::new(consensus.clone(), Arc::new(NoObservations));
    (service, consensus)
}

/// A Triton-layout directory with version folders `versions` (and a stray file and folder).
pub(super) fn repo(versions: &[i64]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for v in versions {
        std::fs::create_dir(dir.path().join(v.to_string())).unwrap();
    }
    std::fs::write(dir.path().join("config.pbtxt"), "").unwrap();
    std::fs::create_dir(dir.path().join("notes")).unwrap();
    std::fs::write(dir.path().join("3"), "a file, not a version").unwrap();
    dir
}

pub(super) fn model(name: &str, dir: &Path, policy: VersionPolicy) -> pb::Model {
    pb::Model {
        name: name.into(),
        source: format!("file://{}", dir.display()),
        version_policy: Some(version_policy_to_pb(&policy)),
        min_replicas: 1,
        max_replicas: 2,
        resources: Some(pb::Resources {
            memory_bytes: 1 << 20,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn deploy_req(m: pb::Model) -> tonic::Request<pb::DeployModelRequest> {
    tonic::Request::new(pb::DeployModelRequest { model: Some(m) })
}

fn model_ref(name: &str) -> tonic::Request<pb::ModelRef> {
    tonic::Request::new(pb::ModelRef {
        name: name.into(),
        consistency: 0,
    })
}

fn node_ref(id: &str) -> tonic::Request<pb::NodeRef> {
    tonic::Request::new(pb::NodeRef {
        id: id.into(),
        consistency: 0,
    })
}

fn assert_status(
    result: Result<impl std::fmt::Debug, tonic::Status>,
    code: tonic::Code,
    text: &str,
) {
    let status = result.expect_err("expected an error");
    assert_eq!(status.code(), code, "{status:?}");
    assert!(
        status.message().contains(text),
        "message {:?} does not mention {text:?}",
        status.message()
    );
}

#[tokio::test]
async fn deploy_lists_version_folders_and_get_returns_the_model() {
    let (svc, _) = setup();
    let dir = repo(&[1, 2, 10]);
    let status = svc
        .deploy_model(deploy_req(model(
            "m",
            dir.path(),
            VersionPolicy::Latest { n: 2 },
        )))
        .await
        .unwrap()
        .into_inner();
    let m = status.model.unwrap();
    assert_eq!(m.available_versions, vec![1, 2, 10]);
    assert_eq!(status.revision, 1);

    let got = svc.get_model(model_ref("m")).await.unwrap().into_inner();
    assert_eq!(got.model.unwrap().name, "m");
    let linear = svc
        .get_model(tonic::Request::new(pb::ModelRef {
            name: "m".into(),
            consistency: pb::ReadConsistency::Linearizable as i32,
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(linear.revision, 1);

    let list = svc
        .list_models(tonic::Request::new(pb::ListModelsRequest {
            consistency: 0,
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(list.models.len(), 1);
    assert_eq!(list.revision, 1);

    // Redeploying the same model is idempotent.
    let again = svc
        .deploy_model(deploy_req(model(
            "m",
            dir.path(),
            VersionPolicy::Latest { n: 2 },
        )))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.revision, 1);
}

#[tokio::test]
async fn deploy_refuses_bad_models_naming_the_field() {
    let (svc, _) = setup();
    let dir = repo(&[1, 2]);
    assert_status(
        svc.deploy_model(tonic::Request::new(pb::DeployModelRequest { model: None }))
            .await,
        tonic::Code::InvalidArgument,
        "model",
    );
    assert_status(
        svc.deploy_model(deploy_req(model(
            "m",
            dir.path(),
            VersionPolicy::Latest { n: 0 },
        )))
        .await,
        tonic::Code::InvalidArgument,
        "version_policy",
    );
    assert_status(
        svc.deploy_model(deploy_req(model(
            "m",
            dir.path(),
            VersionPolicy::Specific {
                versions: vec![2, 7],
            },
        )))
        .await,
        tonic::Code::InvalidArgument,
        "version 7 not found",
    );
    let missing = dir.path().join("absent");
    assert_status(
        svc.deploy_model(deploy_req(model("m", &missing, VersionPolicy::All)))
            .await,
        tonic::Code::InvalidArgument,
        "source",
    );
    let empty = repo(&[]);
    assert_status(
        svc.deploy_model(deploy_req(model("m", empty.path(), VersionPolicy::All)))
            .await,
        tonic::Code::InvalidArgument,
        "no numeric version folders",
    );
    // A scheme nobody reads (object stores are listed against a real server in
    // tests/python/test_object_store.py; here they would reach for cloud credentials).
    let mut ftp = model("m", dir.path(), VersionPolicy::All);
    ftp.source = "ftp://bucket/m".into();
    assert_status(
        svc.deploy_model(deploy_req(ftp)).await,
        tonic::Code::InvalidArgument,
        "source",
    );
    let mut relative = model("m", dir.path(), VersionPolicy::All);
    relative.source = "file://models/m".into();
    assert_status(
        svc.deploy_model(deploy_req(relative)).await,
        tonic::Code::InvalidArgument,
        "absolute path",
    );
    let mut bad_name = model("m", dir.path(), VersionPolicy::All);
    bad_name.name = "no spaces".into();
    assert_status(
        svc.deploy_model(deploy_req(bad_name)).await,
        tonic::Code::InvalidArgument,
        "name",
    );
    assert!(svc.consensus.local_state().models().is_empty());
}

#[tokio::test]
async fn deploy_accepts_a_missing_directory_for_specific_versions() {
    let (svc, _) = setup();
    let dir = tempfile::tempdir().unwrap();
    let m = model(
        "m",
        &dir.path().join("elsewhere"),
        VersionPolicy::Specific { versions: vec![3] },
    );
    let status = svc.deploy_model(deploy_req(m)).await.unwrap().into_inner();
    assert!(status.model.unwrap().available_versions.is_empty());
    let mut s3 = model("s", dir.path(), VersionPolicy::All);
    s3.source = "s3://bucket/s".into();
    s3.available_versions = vec![2, 1];
    let status = svc.deploy_model(deploy_req(s3)).await.unwrap().into_inner();
    assert_eq!(status.model.unwrap().available_versions, vec![1, 2]);
}

#[tokio::test]
async fn scale_and_delete() {
    let (svc, _) = setup();
    let dir = repo(&[1]);
    svc.deploy_model(deploy_req(model("m", dir.path(), VersionPolicy::All)))
        .await
        .unwrap();
    let scaled = svc
        .scale_model(tonic::Request::new(pb::ScaleModelRequest {
            name: "m".into(),
            min_replicas: 2,
            max_replicas: 4,
        }))
        .await
        .unwrap()
        .into_inner();
    let m = scaled.model.unwrap();
    assert_eq!((m.min_replicas, m.max_replicas), (2, 4));
    assert_status(
        svc.scale_model(tonic::Request::new(pb::ScaleModelRequest {
            name: "m".into(),
            min_replicas: 3,
            max_replicas: 1,
        }))
        .await,
        tonic::Code::InvalidArgument,
        "max_replicas",
    );
    assert_status(
        svc.scale_model(tonic::Request::new(pb::ScaleModelRequest {
            name: "nope".into(),
            min_replicas: 1,
            max_replicas: 1,
        }))
        .await,
        tonic::Code::NotFound,
        "model 'nope' not found",
    );
    let deleted = svc.delete_model(model_ref("m")).await.unwrap().into_inner();
    assert_eq!(deleted.revision, 3);
    assert_status(
        svc.get_model(model_ref("m")).await,
        tonic::Code::NotFound,
        "'m'",
    );
    assert_status(
        svc.delete_model(model_ref("m")).await,
        tonic::Code::NotFound,
        "'m'",
    );
    assert_status(
        svc.get_model(model_ref("")).await,
        tonic::Code::InvalidArgument,
        "name",
    );
}

#[tokio::test]
async fn explain_shows_replicas_and_pending_decisions() {
    let (svc, consensus) = setup();
    let dir = repo(&[1]);
    let mut m = model("m", dir.path(), VersionPolicy::All);
    m.min_replicas = 2;
    svc.deploy_model(deploy_req(m)).await.unwrap();
    consensus
        .write(Command::RegisterNode(node("a")))
        .await
        .unwrap();
    let e = svc
        .explain_placement(model_ref("m"))
        .await
        .unwrap()
        .into_inner();
    assert!(e.replicas.is_empty());
    let adds: Vec<_> = e.pending.iter().filter(|d| d.action == "add").collect();
    assert_eq!(adds.len(), 1, "{:?}", e.pending);
    assert_eq!(adds[0].node, "a");
    assert_eq!(adds[0].rule, "NewModel");
    let unplaced: Vec<_> = e
        .pending
        .iter()
        .filter(|d| d.action == "unplaced")
        .collect();
    assert_eq!(unplaced.len(), 1, "{:?}", e.pending);
    assert_eq!(unplaced[0].rule, "NotEnoughNodes");
    assert_eq!(unplaced[0].missing, 1);
    assert!(!unplaced[0].explanation.is_empty());

    consensus
        .write(Command::AddReplica {
            model: "m".into(),
            version: 1,
            node: "a".into(),
            reason: "new model version".into(),
            gpus: Vec::new(),
        })
        .await
        .unwrap();
    let e = svc
        .explain_placement(model_ref("m"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(e.replicas.len(), 1);
    assert_eq!(e.replicas[0].placement_reason, "new model version");
    assert!(e.pending.iter().all(|d| d.action == "unplaced"));
    assert!(e.history.is_empty());

    assert_status(
        svc.explain_placement(model_ref("other")).await,
        tonic::Code::NotFound,
        "model 'other'",
    );
    // A deleted model's unloading replicas can still be explained.
    svc.delete_model(model_ref("m")).await.unwrap();
    let e = svc
        .explain_placement(model_ref("m"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(e.replicas[0].state, pb::ReplicaState::Unloading as i32);
}

#[tokio::test]
async fn a_model_shows_its_measured_replica_memory_once_a_replica_measured_it() {
    let (svc, consensus) = setup();
    let dir = repo(&[1]);
    svc.deploy_model(deploy_req(model("m", dir.path(), VersionPolicy::All)))
        .await
        .unwrap();
    consensus
        .write(Command::RegisterNode(node("a")))
        .await
        .unwrap();
    let got = svc.get_model(model_ref("m")).await.unwrap().into_inner();
    assert_eq!(got.measured_memory_bytes, 0, "nothing measured yet");
    let placed = consensus
        .write(Command::AddReplica {
            model: "m".into(),
            version: 1,
            node: "a".into(),
            reason: String::new(),
            gpus: Vec::new(),
        })
        .await
        .unwrap();
    consensus
        .write(Command::SetReplicaState {
            id: placed.replica_id.unwrap(),
            state: crate::state::ReplicaState::Loading,
            measured_memory_bytes: Some(24 << 20),
            measured_gpu_memory_bytes: None,
        })
        .await
        .unwrap();
    let got = svc.get_model(model_ref("m")).await.unwrap().into_inner();
    assert_eq!(got.measured_memory_bytes, 24 << 20);
    assert_eq!(got.model.unwrap().resources.unwrap().memory_bytes, 1 << 20);
    let listed = svc
        .list_models(tonic::Request::new(Default::default()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.models[0].measured_memory_bytes, 24 << 20);
}

#[tokio::test]
async fn nodes_drain_undrain_and_placements() {
    let (svc, consensus) = setup();
    for id in ["a", "b"] {
        consensus
            .write(Command::RegisterNode(node(id)))
            .await
            .unwrap();
    }
    let list = svc
        .list_nodes(tonic::Request::new(pb::ListNodesRequest { consistency: 0 }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(list.nodes.len(), 2);
    let a = svc.get_node(node_ref("a")).await.unwrap().into_inner();
    let node = a.node.unwrap();
    assert_eq!(node.status, pb::NodeStatus::Up as i32);
    assert!(a.utilization.is_none(), "no observations here");

    let drained = svc.drain_node(node_ref("a")).await.unwrap().into_inner();
    assert!(drained.node.unwrap().drained);
    let undrained = svc.undrain_node(node_ref("a")).await.unwrap().into_inner();
    assert!(!undrained.node.unwrap().drained);
    assert_status(
        svc.drain_node(node_ref("zz")).await,
        tonic::Code::NotFound,
        "node 'zz'",
    );
    assert_status(
        svc.get_node(node_ref("zz")).await,
        tonic::Code::NotFound,
        "node 'zz'",
    );
    assert_status(
        svc.undrain_node(node_ref("")).await,
        tonic::Code::InvalidArgument,
        "id",
    );

    let dir = repo(&[1]);
    svc.deploy_model(deploy_req(model("m", dir.path(), VersionPolicy::All)))
        .await
        .unwrap();
    consensus
        .write(Command::AddReplica {
            model: "m".into(),
            version: 1,
            node: "b".into(),
            reason: String::new(),
            gpus: Vec::new(),
        })
        .await
        .unwrap();
    let p = svc
        .list_placements(tonic::Request::new(pb::ListPlacementsRequest {
            consistency: 0,
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(p.replicas.len(), 1);
    assert_eq!(p.replicas[0].node, "b");
    let b = svc.get_node(node_ref("b")).await.unwrap().into_inner();
    assert_eq!(b.replicas.len(), 1);
}

#[tokio::test]
async fn cluster_status_and_membership() {
    let (svc, consensus) = setup();
    let s = svc
        .get_cluster_status(tonic::Request::new(pb::ClusterStatusRequest {}))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((s.node_id, s.leader_id), (1, 1));
    assert_eq!(s.members.len(), 1);
    assert_status(
        svc.add_member(tonic::Request::new(pb::AddMemberRequest {
            id: 2,
            address: "cp-2:7000".into(),
        }))
        .await,
        tonic::Code::FailedPrecondition,
        "membership",
    );
    assert_status(
        svc.add_member(tonic::Request::new(pb::AddMemberRequest {
            id: 0,
            address: "cp-2:7000".into(),
        }))
        .await,
        tonic::Code::InvalidArgument,
        "id",
    );
    assert_status(
        svc.add_member(tonic::Request::new(pb::AddMemberRequest {
            id: 2,
            address: "cp-2".into(),
        }))
        .await,
        tonic::Code::InvalidArgument,
        "address",
    );
    assert_status(
        svc.remove_member(tonic::Request::new(pb::RemoveMemberRequest { id: 2 }))
            .await,
        tonic::Code::FailedPrecondition,
        "membership",
    );

    consensus.set_leader(None);
    let s = svc.cluster_status();
    assert_eq!(s.leader_id, 0);
    assert_status(
        svc.drain_node(node_ref("a")).await,
        tonic::Code::Unavailable,
        "leader",
    );
}

#[tokio::test]
async fn unknown_read_consistency_is_refused() {
    let (svc, _) = setup();
    assert_status(
        svc.list_models(tonic::Request::new(pb::ListModelsRequest {
            consistency: 7,
        }))
        .await,
        tonic::Code::InvalidArgument,
        "consistency",
    );
}

#[test]
fn grpc_guard_requires_the_token() {
    use std::convert::Infallible;
    use std::task::{Context, Poll};

    /// Answers 200 to whatever passes the guard.
    #[derive(Clone)]
    struct Ok200;
    impl tower::Service<http::Request<()>> for Ok200 {
        type Response = http::Response<String>;
        type Error = Infallible;
        type Future = std::future::Ready<Result<http::Response<String>, Infallible>>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, _: http::Request<()>) -> Self::Future {
            std::future::ready(Ok(http::Response::new("passed".into())))
        }
    }
    fn call(token: Option<&str>) -> http::Response<String> {
        let auth = AuthToken::from_value(TOKEN).unwrap();
        let mut guarded = auth.guard(auth::Scope::Management, Ok200);
        let mut req = http::Request::builder().uri("/nereid.cluster.v1.Management/ListModels");
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let future = tower::Service::call(&mut guarded, req.body(()).unwrap());
        futures::executor::block_on(future).unwrap()
    }
    let grpc_status = |r: &http::Response<String>| {
        tonic::Status::from_header_map(r.headers()).expect("a grpc-status header")
    };
    let refused = call(None);
    let status = grpc_status(&refused);
    assert_eq!(status.code(), tonic::Code::Unauthenticated);
    assert!(status.message().contains("authorization: Bearer"));
    let status = grpc_status(&call(Some("wrong")));
    assert_eq!(status.code(), tonic::Code::Unauthenticated);
    assert!(!status.message().contains("wrong"));
    assert_eq!(call(Some(TOKEN)).body(), "passed");
}
