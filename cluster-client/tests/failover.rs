//! The client against fake control-plane nodes on 127.0.0.1:0: a pass follows a listed
//! leader hint past other nodes, stops at a refusal the policy does not retry, reports the
//! unreachable and an unlisted leader; the node in use moves to a named leader.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nereid_cluster_client::{ClientConfig, ControlPlaneClient, Failure, LEADER_HINT, PassError};
use nereid_proto::pb::cluster::cluster_client::ClusterClient;
use nereid_proto::pb::cluster::cluster_server::{Cluster, ClusterServer};
use nereid_proto::pb::cluster::*;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::Channel;
use tonic::{Code, Request, Response, Status};

/// How a fake node answers a heartbeat.
#[derive(Clone)]
enum Answer {
    Ok,
    /// UNAVAILABLE, naming this leader (empty: none known).
    NotLeader(String),
    Invalid,
}

struct Node {
    answer: Mutex<Answer>,
    calls: AtomicUsize,
    tokens: Mutex<Vec<String>>,
}

struct Fake(Arc<Node>);

type R<T> = Result<Response<T>, Status>;

#[tonic::async_trait]
impl Cluster for Fake {
    async fn register_node(&self, _: Request<RegisterNodeRequest>) -> R<RegisterNodeResponse> {
        Err(Status::unimplemented("fake"))
    }
    async fn heartbeat(&self, request: Request<HeartbeatRequest>) -> R<HeartbeatResponse> {
        self.0.calls.fetch_add(1, Ordering::SeqCst);
        let token = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        self.0.tokens.lock().unwrap().push(token);
        let answer = self.0.answer.lock().unwrap().clone();
        match answer {
            Answer::Ok => Ok(Response::new(HeartbeatResponse::default())),
            Answer::NotLeader(leader) => {
                let mut status = Status::unavailable("this node is not the leader");
                status
                    .metadata_mut()
                    .insert(LEADER_HINT, leader.parse().unwrap());
                Err(status)
            }
            Answer::Invalid => Err(Status::invalid_argument("bad heartbeat")),
        }
    }
    async fn report_replica(&self, _: Request<ReportReplicaRequest>) -> R<ReportReplicaResponse> {
        Err(Status::unimplemented("fake"))
    }
    async fn activate(&self, _: Request<ActivateRequest>) -> R<ActivateResponse> {
        Err(Status::unimplemented("fake"))
    }
    async fn leave_node(
        &self,
        _: Request<nereid_proto::pb::cluster::LeaveNodeRequest>,
    ) -> R<nereid_proto::pb::cluster::LeaveNodeResponse> {
        Err(Status::unimplemented("fake"))
    }
    type WatchStream = Pin<Box<dyn futures::Stream<Item = Result<WatchEvent, Status>> + Send>>;
    async fn watch(&self, _: Request<WatchRequest>) -> R<Self::WatchStream> {
        Err(Status::unimplemented("fake"))
    }
}

/// Serves a fake node; returns it and its `host:port`.
async fn serve(answer: Answer) -> (Arc<Node>, String) {
    let node = Arc::new(Node {
        answer: Mutex::new(answer),
        calls: AtomicUsize::new(0),
        tokens: Mutex::default(),
    });
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(ClusterServer::new(Fake(node.clone())))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    (node, address)
}

/// An address nothing listens on (bound, then closed).
async fn dead_address() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap().to_string()
}

fn client(addresses: &[&str]) -> ControlPlaneClient {
    ControlPlaneClient::new(&ClientConfig {
        addresses: addresses.iter().map(|a| a.to_string()).collect(),
        token: Some("s3cret".into()),
        connect_timeout: Duration::from_secs(2),
        call_timeout: Duration::from_secs(5),
    })
    .unwrap()
}

async fn heartbeat(
    cp: &ControlPlaneClient,
    moves_on: impl Fn(Code) -> bool,
) -> Result<HeartbeatResponse, PassError> {
    cp.call_each(
        HeartbeatRequest::default(),
        moves_on,
        |mut c: ClusterClient<Channel>, r| async move { c.heartbeat(r).await },
    )
    .await
}

/// One heartbeat at the node in use.
async fn once(cp: &ControlPlaneClient) -> Result<HeartbeatResponse, Failure> {
    let request = cp.request(HeartbeatRequest::default());
    cp.attempt(cp.current(), |mut c: ClusterClient<Channel>| async move {
        c.heartbeat(request).await
    })
    .await
}

fn unavailable(code: Code) -> bool {
    code == Code::Unavailable
}

#[tokio::test]
async fn a_pass_goes_to_the_listed_leader_a_follower_names() {
    let (leader, leader_addr) = serve(Answer::Ok).await;
    let (follower, follower_addr) = serve(Answer::NotLeader(leader_addr.clone())).await;
    let (bystander, bystander_addr) = serve(Answer::Ok).await;
    // In list order the bystander would answer first; the hint sends the call to the leader.
    let cp = client(&[
        &follower_addr,
        &bystander_addr,
        &format!("http://{leader_addr}/"),
    ]);
    heartbeat(&cp, unavailable).await.unwrap();
    assert_eq!(follower.calls.load(Ordering::SeqCst), 1);
    assert_eq!(bystander.calls.load(Ordering::SeqCst), 0);
    assert_eq!(*leader.tokens.lock().unwrap(), ["Bearer s3cret"]);
}

#[tokio::test]
async fn a_pass_skips_unreachable_nodes_and_stops_at_a_final_refusal() {
    let (invalid, invalid_addr) = serve(Answer::Invalid).await;
    let (after, after_addr) = serve(Answer::Ok).await;
    let dead = dead_address().await;
    let cp = client(&[&dead, &invalid_addr, &after_addr]);
    match heartbeat(&cp, unavailable).await {
        Err(PassError::Refused(s)) => assert_eq!(s.code(), Code::InvalidArgument),
        other => panic!("{other:?}"),
    }
    assert_eq!(invalid.calls.load(Ordering::SeqCst), 1);
    assert_eq!(
        after.calls.load(Ordering::SeqCst),
        0,
        "not retried elsewhere"
    );
    // The same refusal moves on under a policy that retries it.
    heartbeat(&cp, |c| c == Code::InvalidArgument)
        .await
        .unwrap();
    assert_eq!(after.calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn an_exhausted_pass_reports_the_unreachable_and_an_unlisted_leader() {
    let dead = [dead_address().await, dead_address().await];
    let cp = client(&[&dead[0], &dead[1]]);
    match heartbeat(&cp, unavailable).await {
        Err(e @ PassError::Exhausted { answered: None, .. }) => {
            let text = e.to_string();
            assert!(
                text.starts_with("cannot reach the control plane at"),
                "{text}"
            );
            assert!(text.contains(&dead[0]) && text.contains(&dead[1]), "{text}");
        }
        other => panic!("{other:?}"),
    }

    let (follower, follower_addr) = serve(Answer::NotLeader("10.1.1.1:7000".into())).await;
    let cp = client(&[&follower_addr]);
    match heartbeat(&cp, unavailable).await {
        Err(PassError::Exhausted {
            answered: Some(s),
            leader,
            ..
        }) => {
            assert_eq!(s.code(), Code::Unavailable);
            assert_eq!(
                leader.as_deref(),
                Some("10.1.1.1:7000"),
                "reported, not followed"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(follower.calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn the_node_in_use_moves_to_the_named_leader() {
    let (_, leader_addr) = serve(Answer::Ok).await;
    let (_, follower_addr) = serve(Answer::NotLeader(leader_addr.clone())).await;
    let dead = dead_address().await;
    let cp = client(&[&follower_addr, &dead, &leader_addr]);
    let failure = once(&cp).await.unwrap_err();
    assert_eq!(failure.leader_hint(), Some(leader_addr.as_str()));
    cp.fail_over(failure.leader_hint());
    assert_eq!(cp.current_address(), leader_addr, "past the dead node");
    once(&cp).await.unwrap();
}
