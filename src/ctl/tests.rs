//! `ctl` end to end against a fake `Management` server on 127.0.0.1:0: flags parse through the
//! real clap tree, the request arrives as built, the token rides in metadata, JSON output is
//! valid, and UNAVAILABLE fails over to the next address.

use std::sync::{Arc, Mutex};

use clap::Parser;
use nereid_proto::pb::cluster::management_server::{Management, ManagementServer};
use nereid_proto::pb::cluster::*;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Request, Response, Status};

use super::{CtlArgs, execute};
use crate::cli::{Cli, Command};

/// What the fake server saw: each deploy request with its `authorization` metadata.
#[derive(Default)]
struct Recorded {
    deploys: Mutex<Vec<(DeployModelRequest, Option<String>)>>,
}

struct Fake {
    seen: Arc<Recorded>,
    /// Refuse everything as a follower naming this leader.
    follower_of: Option<String>,
}

fn refuse(leader: &str) -> Status {
    let mut status = Status::unavailable("this node is not the leader");
    status
        .metadata_mut()
        .insert("x-nereid-leader", leader.parse().unwrap());
    status
}

type R<T> = Result<Response<T>, Status>;

#[tonic::async_trait]
impl Management for Fake {
    async fn deploy_model(&self, request: Request<DeployModelRequest>) -> R<ModelStatus> {
        if let Some(l) = &self.follower_of {
            return Err(refuse(l));
        }
        let token = request
            .metadata()
            .get("authorization")
            .map(|v| v.to_str().unwrap().to_string());
        let message = request.into_inner();
        self.seen
            .deploys
            .lock()
            .unwrap()
            .push((message.clone(), token));
        Ok(Response::new(ModelStatus {
            model: message.model,
            replicas: vec![],
            ready_replicas: 0,
            revision: 5,
            ..Default::default()
        }))
    }
    async fn scale_model(&self, _: Request<ScaleModelRequest>) -> R<ModelStatus> {
        Err(Status::unimplemented("fake"))
    }
    /// Echoes the split back on a model of that name.
    async fn set_traffic(&self, request: Request<SetTrafficRequest>) -> R<ModelStatus> {
        let r = request.into_inner();
        Ok(Response::new(ModelStatus {
            model: Some(Model {
                name: r.name,
                traffic: r.weights,
                ..Default::default()
            }),
            revision: 9,
            ..Default::default()
        }))
    }
    async fn set_autoscale(&self, _: Request<SetAutoscaleRequest>) -> R<AutoscaleStatus> {
        Err(Status::unimplemented("fake"))
    }
    async fn delete_model(&self, _: Request<ModelRef>) -> R<DeleteModelResponse> {
        Err(Status::unimplemented("fake"))
    }
    async fn get_model(&self, request: Request<ModelRef>) -> R<ModelStatus> {
        Err(Status::not_found(format!(
            "model '{}' not found",
            request.into_inner().name
        )))
    }
    async fn list_models(&self, _: Request<ListModelsRequest>) -> R<ListModelsResponse> {
        Err(Status::unimplemented("fake"))
    }
    async fn explain_placement(&self, _: Request<ModelRef>) -> R<PlacementExplanation> {
        Err(Status::unimplemented("fake"))
    }
    async fn list_nodes(&self, _: Request<ListNodesRequest>) -> R<ListNodesResponse> {
        Err(Status::unimplemented("fake"))
    }
    async fn get_node(&self, _: Request<NodeRef>) -> R<NodeStatusResponse> {
        Err(Status::unimplemented("fake"))
    }
    async fn drain_node(&self, _: Request<NodeRef>) -> R<NodeStatusResponse> {
        Err(Status::unimplemented("fake"))
    }
    async fn undrain_node(&self, _: Request<NodeRef>) -> R<NodeStatusResponse> {
        Err(Status::unimplemented("fake"))
    }
    async fn list_placements(
        &self,
        _: Request<ListPlacementsRequest>,
    ) -> R<ListPlacementsResponse> {
        Err(Status::unimplemented("fake"))
    }
    async fn get_cluster_status(&self, _: Request<ClusterStatusRequest>) -> R<ClusterStatus> {
        Err(Status::unimplemented("fake"))
    }
    async fn add_member(&self, _: Request<AddMemberRequest>) -> R<ClusterStatus> {
        Err(Status::unimplemented("fake"))
    }
    async fn remove_member(&self, _: Request<RemoveMemberRequest>) -> R<ClusterStatus> {
        Err(Status::unimplemented("fake"))
    }
}

/// Serves a fake on an ephemeral port; returns its `host:port`.
async fn serve(fake: Fake) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(ManagementServer::new(fake))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    address
}

fn ctl(argv: &[&str]) -> CtlArgs {
    let cli = Cli::try_parse_from(["nereid", "ctl"].iter().chain(argv)).unwrap();
    match cli.command {
        Command::Ctl(args) => *args,
        other => panic!("parsed as {other:?}"),
    }
}

#[tokio::test]
async fn deploy_sends_the_model_and_prints_json() {
    let seen = Arc::new(Recorded::default());
    let leader = serve(Fake {
        seen: seen.clone(),
        follower_of: None,
    })
    .await;
    let follower = serve(Fake {
        seen: seen.clone(),
        follower_of: Some(leader.clone()),
    })
    .await;
    let addresses = format!("{follower},{leader}");
    let args = ctl(&[
        "--control-plane",
        &addresses,
        "--token",
        "s3cret",
        "--output",
        "json",
        "models",
        "deploy",
        "resnet50",
        "--source",
        "file:///models/resnet50",
        "--min-replicas",
        "2",
        "--max-replicas",
        "3",
        "--versions",
        "latest:2",
        "--memory",
        "512Mi",
        "--label",
        "team=vision",
    ]);
    let mut out = Vec::new();
    execute(&args, &mut out).await.unwrap();

    let deploys = seen.deploys.lock().unwrap();
    assert_eq!(deploys.len(), 1, "the follower refused, the leader took it");
    let (request, token) = &deploys[0];
    assert_eq!(token.as_deref(), Some("Bearer s3cret"));
    let model = request.model.as_ref().unwrap();
    assert_eq!(model.name, "resnet50");
    assert_eq!((model.min_replicas, model.max_replicas), (2, 3));
    assert_eq!(model.resources.as_ref().unwrap().memory_bytes, 512 << 20);
    assert_eq!(model.labels["team"], "vision");

    let json: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(json["model"]["name"], "resnet50");
    assert_eq!(json["model"]["version_policy"]["latest"]["num_versions"], 2);
    assert_eq!(json["revision"], 5);
}

#[tokio::test]
async fn errors_carry_the_message_and_leader_hint() {
    let seen = Arc::new(Recorded::default());
    let address = serve(Fake {
        seen: seen.clone(),
        follower_of: None,
    })
    .await;
    let mut out = Vec::new();
    let e = execute(
        &ctl(&["--control-plane", &address, "models", "get", "nope"]),
        &mut out,
    )
    .await
    .unwrap_err();
    assert_eq!(e.to_string(), "model 'nope' not found");
    assert_eq!(e.exit_code(), 1);

    let follower = serve(Fake {
        seen,
        follower_of: Some("10.1.1.1:7000".into()),
    })
    .await;
    let args = ctl(&[
        "--control-plane",
        &follower,
        "models",
        "deploy",
        "m",
        "--source",
        "file:///m",
    ]);
    let e = execute(&args, &mut out).await.unwrap_err();
    assert!(
        e.to_string().contains("try --control-plane 10.1.1.1:7000"),
        "{e}"
    );
}

#[tokio::test]
async fn unreachable_control_plane_is_reported() {
    // Bind then drop: the port is (very likely) closed now.
    let address = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let mut out = Vec::new();
    let e = execute(&ctl(&["--control-plane", &address, "placements"]), &mut out)
        .await
        .unwrap_err();
    assert!(
        e.to_string()
            .starts_with("cannot reach the control plane at"),
        "{e}"
    );
}

#[test]
fn usage_errors_are_clap_errors() {
    let parse = |argv: &[&str]| Cli::try_parse_from(["nereid", "ctl"].iter().chain(argv));
    assert!(parse(&["models", "deploy", "m", "--source", "s", "--memory", "2Xi"]).is_err());
    assert!(
        parse(&[
            "models",
            "scale",
            "m",
            "--replicas",
            "2",
            "--min-replicas",
            "1"
        ])
        .is_err()
    );
    assert!(parse(&["models", "scale", "m", "--min-replicas", "1"]).is_err());
    assert!(parse(&["models", "deploy", "m", "--source", "s", "--label", "x"]).is_err());
    assert!(parse(&["--output", "yaml", "placements"]).is_err());
}

#[tokio::test]
async fn traffic_sends_the_weights_and_shows_percentages() {
    let address = serve(Fake {
        seen: Arc::new(Recorded::default()),
        follower_of: None,
    })
    .await;
    let mut out = Vec::new();
    execute(
        &ctl(&[
            "--control-plane",
            &address,
            "models",
            "traffic",
            "m",
            "1=3",
            "2=1",
        ]),
        &mut out,
    )
    .await
    .unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(text.contains("1=75% 2=25%"), "{text}");

    let twice = ctl(&[
        "--control-plane",
        &address,
        "models",
        "traffic",
        "m",
        "1=3",
        "1=1",
    ]);
    let e = execute(&twice, &mut Vec::new()).await.unwrap_err();
    assert_eq!(e.to_string(), "version 1 is given twice");
    for bad in [["m", "x=1"], ["m", "0=1"], ["m", "1=-1"]] {
        let mut argv = vec![
            "nereid",
            "ctl",
            "--control-plane",
            "a:1",
            "models",
            "traffic",
        ];
        argv.extend(bad);
        assert!(Cli::try_parse_from(argv).is_err(), "{bad:?} accepted");
    }
    assert!(
        Cli::try_parse_from(["nereid", "ctl", "models", "traffic", "m"]).is_err(),
        "neither weights nor --clear"
    );
    let mut out = Vec::new();
    execute(
        &ctl(&[
            "--control-plane",
            &address,
            "models",
            "traffic",
            "m",
            "--clear",
        ]),
        &mut out,
    )
    .await
    .unwrap();
    assert!(String::from_utf8(out).unwrap().contains("traffic"));
}
