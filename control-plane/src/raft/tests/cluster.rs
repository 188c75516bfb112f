//! In-process clusters over real sockets and real redb files.

use tempfile::TempDir;

use super::WAIT;
use super::harness::{
    TestNode, leader_seen_by, listen, start_cluster, state_where, test_config, upsert, within,
};
use crate::consensus::{Consensus, ConsensusError};
use crate::raft::network::{Peers, Rpc};
use crate::state::Command;

fn index_of(nodes: &[TestNode], id: u64) -> usize {
    nodes
        .iter()
        .position(|n| n.id == id)
        .unwrap_or_else(|| panic!("no node {id}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_replicate_fail_over_and_recover_from_disk() {
    let root = TempDir::new().expect("tempdir");
    let (mut nodes, peers) = start_cluster(3, root.path()).await;

    let leader = leader_seen_by(&nodes[0], None).await;
    let li = index_of(&nodes, leader);
    let fi = (li + 1) % 3;
    leader_seen_by(&nodes[fi], None).await;

    // Writes through the leader and through a follower (forwarded) reach every node.
    let a = nodes[li]
        .node
        .write(upsert("a"))
        .await
        .expect("write via leader");
    assert!(a.changed);
    let b = nodes[fi]
        .node
        .write(upsert("b"))
        .await
        .expect("write via follower");
    assert_eq!(b.revision, a.revision + 1);
    for n in &nodes {
        state_where(n, "a and b everywhere", |s| {
            s.model("a").is_some() && s.model("b").is_some()
        })
        .await;
    }

    // A refused command comes back as Rejected, from a follower too, and changes nothing.
    let err = nodes[fi]
        .node
        .write(Command::DeleteModel {
            name: "missing".to_string(),
        })
        .await
        .expect_err("deleting a missing model is refused");
    assert!(matches!(err, ConsensusError::Rejected(_)), "{err:?}");

    // A follower's linearizable read sees a write just committed through the leader.
    nodes[li].node.write(upsert("c")).await.expect("write c");
    let seen = nodes[fi]
        .node
        .linearizable_state()
        .await
        .expect("follower read");
    assert!(
        seen.model("c").is_some(),
        "follower read missed a committed write"
    );
    let seen = nodes[li]
        .node
        .linearizable_state()
        .await
        .expect("leader read");
    assert!(seen.model("c").is_some());

    let status = nodes[fi].node.status();
    assert_eq!(status.leader_id, Some(leader));
    assert_eq!(
        status.leader_address.as_deref(),
        Some(peers[&leader].as_str())
    );
    assert_eq!(status.members.len(), 3);
    assert!(status.members.iter().all(|m| m.voter));
    assert!(status.commit_index >= 4 && status.applied_index <= status.commit_index);

    // The leader stops: the other two elect a new one and writes resume.
    let stopped = nodes.remove(li).stop().await;
    let new_leader = leader_seen_by(&nodes[0], Some(leader)).await;
    assert_ne!(new_leader, leader);
    nodes[1]
        .node
        .write(upsert("d"))
        .await
        .expect("write after fail-over");

    // The stopped node restarts from its data dir and catches up.
    nodes.insert(li, stopped.restart(&peers).await);
    let caught_up = state_where(&nodes[li], "restarted node catches up", |s| {
        s.model("d").is_some()
    })
    .await;
    let revision = caught_up.revision();

    // Every node restarts from disk: the state is intact and writes work again.
    let mut stopped = Vec::new();
    for n in nodes {
        stopped.push(n.stop().await);
    }
    let mut nodes = Vec::new();
    for n in stopped {
        nodes.push(n.restart(&peers).await);
    }
    for n in &nodes {
        state_where(n, "state after a full restart", |s| {
            s.revision() == revision && ["a", "b", "c", "d"].iter().all(|m| s.model(m).is_some())
        })
        .await;
    }
    let e = nodes[0]
        .node
        .write(upsert("e"))
        .await
        .expect("write after restart");
    assert_eq!(e.revision, revision + 1);
    for n in nodes {
        n.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_compact_the_log_feed_new_members_and_survive_restart() {
    let root = TempDir::new().expect("tempdir");
    let (listener, addr) = listen("127.0.0.1:0").await;
    let mut config = test_config(1, &addr, &root.path().join("n1"));
    config.snapshot_threshold = 10;
    config.logs_to_keep_after_snapshot = 0;
    let one = TestNode::start(config, listener).await;
    leader_seen_by(&one, None).await;

    // Outgoing calls carry the bearer token; the test server refuses calls without it.
    for (token, ok) in [(None, false), (Some(super::harness::TOKEN), true)] {
        let peers = Peers::new(token, WAIT).expect("peers");
        let answer = peers
            .call(&one.addr, Rpc::ReadIndex, Vec::new(), WAIT)
            .await;
        match answer {
            Ok(_) => assert!(ok, "a call without a token was accepted"),
            Err(status) => {
                assert!(!ok, "a call with the token was refused: {status}");
                assert_eq!(status.code(), tonic::Code::Unauthenticated);
            }
        }
    }

    for i in 0..40 {
        one.node
            .write(upsert(&format!("m{i}")))
            .await
            .expect("write");
    }
    let metrics = one
        .node
        .raft()
        .wait(Some(WAIT))
        .metrics(
            |m| m.snapshot.is_some_and(|s| s.index >= 30) && m.purged.is_some(),
            "a snapshot and a purged log",
        )
        .await
        .expect("snapshot built and log purged");
    let purged = metrics.purged.map(|p| p.index).unwrap_or_default();
    assert!(purged >= 30, "purged up to {purged}");

    // A new member starts from the snapshot (InstallSnapshot), the log being gone.
    let (listener2, addr2) = listen("127.0.0.1:0").await;
    let mut config2 = test_config(2, &addr2, &root.path().join("n2"));
    config2.join = true;
    let two = TestNode::start(config2, listener2).await;
    within("add member 2", one.node.add_member(2, addr2.clone()))
        .await
        .expect("add member 2");
    state_where(&two, "snapshot installed on the new member", |s| {
        s.models().len() == 40
    })
    .await;
    assert_eq!(one.node.status().members.len(), 2);

    // Removing it, then refusing to remove the last voter.
    one.node.remove_member(2).await.expect("remove member 2");
    assert_eq!(one.node.status().members.len(), 1);
    let err = one.node.remove_member(1).await.expect_err("last voter");
    assert!(
        matches!(err, ConsensusError::InvalidMembership(_)),
        "{err:?}"
    );
    two.stop().await;

    // Restart: the state comes back from the snapshot plus the entries after it.
    let revision = one.node.local_state().revision();
    assert_eq!(revision, 40);
    let one = one.stop().await.restart(&Default::default()).await;
    state_where(&one, "state restored from the snapshot", |s| {
        s.revision() == revision && s.models().len() == 40
    })
    .await;
    one.node
        .write(upsert("after"))
        .await
        .expect("write after restart");
    one.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_are_added_as_learners_then_voters_and_removed() {
    let root = TempDir::new().expect("tempdir");
    let (nodes, _peers) = start_cluster(3, root.path()).await;
    let leader = leader_seen_by(&nodes[0], None).await;
    let li = index_of(&nodes, leader);
    let fi = (li + 1) % 3;
    nodes[li].node.write(upsert("a")).await.expect("write");

    let (listener, addr) = listen("127.0.0.1:0").await;
    let mut config = test_config(4, &addr, &root.path().join("n4"));
    config.join = true;
    let four = TestNode::start(config, listener).await;

    // Only the leader changes membership; a follower names it.
    leader_seen_by(&nodes[fi], None).await;
    let err = nodes[fi]
        .node
        .add_member(4, addr.clone())
        .await
        .expect_err("follower refuses");
    match err {
        ConsensusError::NotLeader {
            leader_id,
            leader_address,
        } => {
            assert_eq!(leader_id, Some(leader));
            assert_eq!(leader_address.as_deref(), Some(nodes[li].addr.as_str()));
        }
        other => panic!("expected NotLeader, got {other:?}"),
    }

    within("add member 4", nodes[li].node.add_member(4, addr.clone()))
        .await
        .expect("add member 4");
    let status = nodes[li].node.status();
    assert_eq!(status.members.len(), 4);
    assert!(status.members.iter().all(|m| m.voter), "{status:?}");
    state_where(&four, "new member has the state", |s| {
        s.model("a").is_some()
    })
    .await;
    nodes[li]
        .node
        .write(upsert("b"))
        .await
        .expect("write with 4 voters");
    state_where(&four, "new member follows writes", |s| {
        s.model("b").is_some()
    })
    .await;

    let err = nodes[li]
        .node
        .remove_member(9)
        .await
        .expect_err("unknown member");
    assert!(
        matches!(err, ConsensusError::InvalidMembership(_)),
        "{err:?}"
    );
    nodes[li]
        .node
        .remove_member(4)
        .await
        .expect("remove member 4");
    let status = nodes[li].node.status();
    assert_eq!(status.members.len(), 3);
    assert!(status.members.iter().all(|m| m.id != 4));

    four.stop().await;
    for n in nodes {
        n.stop().await;
    }
}
