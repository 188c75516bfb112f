//! One behaviour suite for every [`Consensus`] store: each case runs against Nereid's Raft
//! (three in-process nodes over real sockets and redb files) and against etcd (a real `etcd`
//! process, three [`EtcdStore`] processes' worth of clients sharing one prefix).
//!
//! ```text
//!  case(store: &impl TestStore) ─► store.start(3) ─► Cluster { nodes: [Arc<dyn Consensus>; 3] }
//!     writes and refusals │ subscribers see writes │ linearizable read after a write elsewhere
//!     concurrent writers lose nothing │ one leader; its death ─► a successor with a higher term
//! ```
//!
//! The etcd cases print `SKIPPED` and pass only when no `etcd` binary is installed
//! (scripts/setup.sh installs Debian's etcd-server, so `make test` runs them). Every wait is on
//! a watch channel, bounded by [`WAIT`].

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::future::BoxFuture;
use nereid_proto::pb::cluster::raft_server::RaftServer;
use tempfile::TempDir;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;

use super::{Consensus, ConsensusError, Leadership};
use crate::etcd::test_server::EtcdServer;
use crate::etcd::{EtcdConfig, EtcdStore};
use crate::raft::{RaftConfig, RaftNode};
use crate::state::{ClusterState, Command, ModelSpec};

/// Upper bound on one wait (an election, a watch delivering a write).
const WAIT: Duration = Duration::from_secs(20);

/// One member of a test cluster.
struct Node {
    id: u64,
    consensus: Arc<dyn Consensus>,
    stop: Option<Box<dyn FnOnce() -> BoxFuture<'static, ()> + Send>>,
}

impl Node {
    /// Stops the node (Raft shut down and its server closed; the etcd client's lease revoked).
    async fn kill(&mut self) {
        if let Some(stop) = self.stop.take() {
            within("the node to stop", stop()).await;
        }
    }
}

/// A running cluster; what keeps it alive (tempdirs, the etcd process) is in `_guard`.
struct Cluster {
    nodes: Vec<Node>,
    _guard: Box<dyn std::any::Any + Send>,
}

#[async_trait]
trait TestStore: Sync {
    /// Starts `n` nodes (ids 1..=n) of one cluster; `None` when the store cannot run here.
    async fn start(&self, n: u64) -> Option<Cluster>;
}

struct Raft;

#[async_trait]
impl TestStore for Raft {
    async fn start(&self, n: u64) -> Option<Cluster> {
        let root = TempDir::new().expect("tempdir");
        let mut listeners = Vec::new();
        let mut peers = BTreeMap::new();
        for id in 1..=n {
            let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            peers.insert(id, listener.local_addr().expect("addr").to_string());
            listeners.push(listener);
        }
        let mut nodes = Vec::new();
        for (id, listener) in (1..=n).zip(listeners) {
            let mut config =
                RaftConfig::new(id, peers[&id].clone(), root.path().join(id.to_string()));
            config.peers = peers.clone();
            config.heartbeat_interval = Duration::from_millis(100);
            config.election_timeout_min = Duration::from_millis(500);
            config.election_timeout_max = Duration::from_millis(1000);
            config.leader_wait = WAIT;
            let (raft, service) = RaftNode::start(config).await.expect("start raft node");
            let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
            let server = tokio::spawn(
                tonic::transport::Server::builder()
                    .add_service(RaftServer::new(service))
                    .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                        stop_rx.await.ok();
                    }),
            );
            let node = raft.clone();
            nodes.push(Node {
                id,
                consensus: raft,
                stop: Some(Box::new(move || {
                    Box::pin(async move {
                        node.shutdown().await.expect("raft shutdown");
                        stop_tx.send(()).ok();
                        let _ = server.await;
                    })
                })),
            });
        }
        Some(Cluster {
            nodes,
            _guard: Box::new(root),
        })
    }
}

struct Etcd;

#[async_trait]
impl TestStore for Etcd {
    async fn start(&self, n: u64) -> Option<Cluster> {
        let server = EtcdServer::start().await?;
        let config = EtcdConfig {
            endpoints: vec![server.endpoint()],
            prefix: "/conformance".to_string(),
            user: None,
            lease_ttl: Duration::from_secs(1),
            tls: None,
        };
        let mut nodes = Vec::new();
        for id in 1..=n {
            let store = EtcdStore::start(id, format!("cp-{id}:7000"), config.clone())
                .await
                .expect("start etcd store");
            let node = store.clone();
            nodes.push(Node {
                id,
                consensus: store,
                stop: Some(Box::new(move || {
                    Box::pin(async move { node.shutdown().await })
                })),
            });
        }
        Some(Cluster {
            nodes,
            _guard: Box::new(server),
        })
    }
}

async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(WAIT, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out waiting for {what}"),
    }
}

fn upsert(name: &str) -> Command {
    Command::UpsertModel(ModelSpec {
        available_versions: vec![1],
        ..crate::testing::model(name)
    })
}

/// Waits until every node in `nodes` names the same leader (not `not`) and exactly one of them
/// is that leader; returns its id and term.
async fn agreed_leader(nodes: &[&Node], not: Option<u64>) -> (u64, u64) {
    let mut rxs: Vec<_> = nodes.iter().map(|n| n.consensus.leadership()).collect();
    within("one leader every node agrees on", async {
        loop {
            let seen: Vec<Leadership> = rxs.iter_mut().map(|rx| *rx.borrow_and_update()).collect();
            let leader = seen[0].leader_id.filter(|id| Some(*id) != not);
            if let Some(id) = leader
                && seen.iter().all(|l| l.leader_id == Some(id))
                && seen.iter().filter(|l| l.is_self).count() == 1
                && let Some(me) = seen.iter().find(|l| l.is_self)
            {
                return (id, me.term);
            }
            let changes = rxs.iter_mut().map(|rx| Box::pin(rx.changed()));
            let _ = futures::future::select_all(changes).await;
        }
    })
    .await
}

async fn writes_apply_and_refusals_change_nothing(store: &impl TestStore) {
    let Some(cluster) = store.start(3).await else {
        return;
    };
    let nodes: Vec<&Node> = cluster.nodes.iter().collect();
    let (leader, _) = agreed_leader(&nodes, None).await;
    let a = nodes[1]
        .consensus
        .write(upsert("a"))
        .await
        .expect("write a");
    assert!(a.changed);
    let again = nodes[2]
        .consensus
        .write(upsert("a"))
        .await
        .expect("repeat a");
    assert!(!again.changed, "an identical upsert is idempotent");
    assert_eq!(again.revision, a.revision);
    let err = nodes[0]
        .consensus
        .write(Command::DeleteModel {
            name: "missing".into(),
        })
        .await
        .expect_err("deleting a missing model is refused");
    assert!(matches!(err, ConsensusError::Rejected(_)), "{err:?}");
    let state = nodes[0].consensus.linearizable_state().await.expect("read");
    assert_eq!(state.revision(), a.revision, "a refusal changes nothing");
    assert!(state.model("a").is_some());
    let leader = nodes
        .iter()
        .find(|n| n.id == leader)
        .expect("the leader is a node");
    let err = leader
        .consensus
        .remove_member(99)
        .await
        .expect_err("node 99 is no member");
    assert!(
        matches!(err, ConsensusError::InvalidMembership(_)),
        "{err:?}"
    );
}

async fn subscribers_see_writes_from_any_node(store: &impl TestStore) {
    let Some(cluster) = store.start(3).await else {
        return;
    };
    let nodes: Vec<&Node> = cluster.nodes.iter().collect();
    agreed_leader(&nodes, None).await;
    let mut rx = nodes[2].consensus.subscribe();
    let written = nodes[0]
        .consensus
        .write(upsert("b"))
        .await
        .expect("write b");
    let seen = within(
        "the subscriber to see b",
        rx.wait_for(|s| s.model("b").is_some()),
    )
    .await
    .expect("state channel open");
    assert!(seen.revision() >= written.revision);
    assert!(nodes[2].consensus.local_state().model("b").is_some());
}

async fn linearizable_read_sees_a_write_made_elsewhere(store: &impl TestStore) {
    let Some(cluster) = store.start(3).await else {
        return;
    };
    let nodes: Vec<&Node> = cluster.nodes.iter().collect();
    agreed_leader(&nodes, None).await;
    for (i, name) in ["c1", "c2", "c3"].into_iter().enumerate() {
        let writer = nodes[i % 3];
        let reader = nodes[(i + 1) % 3];
        let written = writer.consensus.write(upsert(name)).await.expect("write");
        let state = reader.consensus.linearizable_state().await.expect("read");
        assert!(
            state.model(name).is_some(),
            "node {} missed {name}",
            reader.id
        );
        assert!(state.revision() >= written.revision);
    }
}

async fn concurrent_writers_lose_nothing(store: &impl TestStore) {
    let Some(cluster) = store.start(3).await else {
        return;
    };
    let nodes: Vec<&Node> = cluster.nodes.iter().collect();
    agreed_leader(&nodes, None).await;
    let before = nodes[0].consensus.linearizable_state().await.expect("read");
    const EACH: usize = 15;
    let writers = nodes.iter().take(2).map(|node| {
        let consensus = node.consensus.clone();
        let id = node.id;
        tokio::spawn(async move {
            for i in 0..EACH {
                consensus
                    .write(upsert(&format!("w{id}-{i}")))
                    .await
                    .expect("concurrent write");
            }
        })
    });
    for writer in futures::future::join_all(writers).await {
        writer.expect("writer task");
    }
    let after: Arc<ClusterState> = nodes[2].consensus.linearizable_state().await.expect("read");
    let written = after.models().keys().filter(|m| m.starts_with('w')).count();
    assert_eq!(written, 2 * EACH, "every concurrent write is there");
    assert_eq!(after.revision(), before.revision() + 2 * EACH as u64);
}

async fn one_leader_and_a_successor_when_it_dies(store: &impl TestStore) {
    let Some(mut cluster) = store.start(3).await else {
        return;
    };
    let (leader, term) = {
        let nodes: Vec<&Node> = cluster.nodes.iter().collect();
        agreed_leader(&nodes, None).await
    };
    let index = cluster
        .nodes
        .iter()
        .position(|n| n.id == leader)
        .expect("the leader is a node");
    cluster.nodes[index].kill().await;
    let survivors: Vec<&Node> = cluster.nodes.iter().filter(|n| n.id != leader).collect();
    let (successor, new_term) = agreed_leader(&survivors, Some(leader)).await;
    assert_ne!(successor, leader);
    assert!(new_term > term, "term {new_term} after {term}");
    let applied = survivors[0]
        .consensus
        .write(upsert("after-failover"))
        .await
        .expect("write after fail-over");
    assert!(applied.changed);
}

/// Each case against each store.
macro_rules! conformance {
    ($($case:ident),* $(,)?) => {
        mod raft {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(&super::Raft).await
                }
            )*
        }
        mod etcd {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(&super::Etcd).await
                }
            )*
        }
    };
}

conformance!(
    writes_apply_and_refusals_change_nothing,
    subscribers_see_writes_from_any_node,
    linearizable_read_sees_a_write_made_elsewhere,
    concurrent_writers_lose_nothing,
    one_leader_and_a_successor_when_it_dies,
);
