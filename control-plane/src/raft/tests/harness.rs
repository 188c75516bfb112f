//! In-process cluster nodes: a [`RaftNode`] with its own tonic server on 127.0.0.1, and the
//! waits the tests use.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nereid_proto::pb::cluster::raft_server::RaftServer;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;

use super::WAIT;
use crate::consensus::Consensus;
use crate::raft::{RaftConfig, RaftNode};
use crate::state::{ClusterState, Command, ModelSpec};

/// A running node and the server that carries its Raft traffic.
pub(super) struct TestNode {
    pub(super) id: u64,
    pub(super) node: Arc<RaftNode>,
    pub(super) addr: String,
    pub(super) dir: PathBuf,
    stop_server: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<()>>,
}

/// Every test node carries this token; the servers refuse calls without it.
pub(super) const TOKEN: &str = "test-token";

/// What the mounting server does in production: check the bearer token.
fn require_token(request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
    let expected = format!("Bearer {TOKEN}");
    match request.metadata().get("authorization") {
        Some(v) if v.as_bytes() == expected.as_bytes() => Ok(request),
        _ => Err(tonic::Status::unauthenticated(
            "missing or wrong bearer token",
        )),
    }
}

/// Fast timings for tests on a loaded 2-core machine.
pub(super) fn test_config(id: u64, addr: &str, dir: &Path) -> RaftConfig {
    let mut config = RaftConfig::new(id, addr, dir);
    config.heartbeat_interval = Duration::from_millis(100);
    config.election_timeout_min = Duration::from_millis(500);
    config.election_timeout_max = Duration::from_millis(1000);
    config.leader_wait = WAIT;
    config.auth_token = Some(TOKEN.to_string());
    config
}

/// Binds a listener first, to learn the address the node advertises.
pub(super) async fn listen(addr: &str) -> (TcpListener, String) {
    let listener = TcpListener::bind(addr).await.expect("bind");
    let addr = listener.local_addr().expect("local addr").to_string();
    (listener, addr)
}

impl TestNode {
    /// Starts `config`'s node and serves its Raft service on `listener`.
    pub(super) async fn start(config: RaftConfig, listener: TcpListener) -> TestNode {
        let id = config.node_id;
        let addr = config.address.clone();
        let dir = config.data_dir.clone();
        let (node, service) = RaftNode::start(config).await.expect("start raft node");
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            let result = tonic::transport::Server::builder()
                .add_service(RaftServer::with_interceptor(service, require_token))
                .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                    stop_rx.await.ok();
                })
                .await;
            if let Err(e) = result {
                panic!("raft server failed: {e}");
            }
        });
        TestNode {
            id,
            node,
            addr,
            dir,
            stop_server: Some(stop_tx),
            server: Some(server),
        }
    }

    /// Stops Raft and the server (connections closed, port free) and lets go of the node, so
    /// that its database is closed.
    pub(super) async fn stop(mut self) -> StoppedNode {
        self.node.shutdown().await.expect("raft shutdown");
        if let Some(tx) = self.stop_server.take() {
            tx.send(()).ok();
        }
        if let Some(server) = self.server.take() {
            tokio::time::timeout(WAIT, server)
                .await
                .expect("server stops in time")
                .expect("server task");
        }
        StoppedNode {
            id: self.id,
            addr: self.addr,
            dir: self.dir,
        }
    }
}

/// A node that was stopped; its data dir stays.
pub(super) struct StoppedNode {
    pub(super) id: u64,
    addr: String,
    dir: PathBuf,
}

impl StoppedNode {
    /// Restarts the node from its data dir on the same address.
    pub(super) async fn restart(self, peers: &BTreeMap<u64, String>) -> TestNode {
        let (listener, _) = listen(&self.addr).await;
        let mut config = test_config(self.id, &self.addr, &self.dir);
        config.peers = peers.clone();
        TestNode::start(config, listener).await
    }
}

/// Starts `n` nodes (ids 1..=n) that bootstrap one cluster.
pub(super) async fn start_cluster(n: u64, root: &Path) -> (Vec<TestNode>, BTreeMap<u64, String>) {
    let mut listeners = Vec::new();
    let mut peers = BTreeMap::new();
    for id in 1..=n {
        let (listener, addr) = listen("127.0.0.1:0").await;
        peers.insert(id, addr);
        listeners.push(listener);
    }
    let mut nodes = Vec::new();
    for (id, listener) in (1..=n).zip(listeners) {
        let mut config = test_config(id, &peers[&id], &root.join(format!("n{id}")));
        config.peers = peers.clone();
        nodes.push(TestNode::start(config, listener).await);
    }
    (nodes, peers)
}

/// Bounds `fut` by [`WAIT`].
pub(super) async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(WAIT, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out waiting for {what}"),
    }
}

/// Waits until `node` sees a leader other than `not` and returns its id.
pub(super) async fn leader_seen_by(node: &TestNode, not: Option<u64>) -> u64 {
    let mut rx = node.node.leadership();
    let l = within(
        "a leader",
        rx.wait_for(|l| l.leader_id.is_some() && l.leader_id != not),
    )
    .await
    .expect("leadership channel open");
    l.leader_id.unwrap_or_default()
}

/// Waits until `node`'s applied state satisfies `pred`.
pub(super) async fn state_where(
    node: &TestNode,
    what: &str,
    pred: impl Fn(&ClusterState) -> bool,
) -> Arc<ClusterState> {
    let mut rx = node.node.subscribe();
    let state = within(what, rx.wait_for(|s| pred(s)))
        .await
        .expect("state channel open");
    state.clone()
}

pub(super) fn model(name: &str) -> ModelSpec {
    ModelSpec {
        available_versions: vec![1],
        ..crate::testing::model(name)
    }
}

pub(super) fn upsert(name: &str) -> Command {
    Command::UpsertModel(model(name))
}
