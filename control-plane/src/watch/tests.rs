//! The watch hub over an in-memory consensus: snapshot first, live deltas, resumes, resyncs,
//! and a client that mirrors the state from the events alone.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use nereid_proto::pb::cluster as pb;
use nereid_test_support::Rng;
use pb::watch_event::Event;

use super::*;
use crate::consensus::Consensus;
use crate::consensus::memory::MemoryConsensus;
use crate::convert::snapshot_to_pb;
use crate::state::{Command, ModelSpec, NodeStatus, ReplicaState, VersionPolicy};
use crate::testing::node;

fn model(name: &str, min: u32) -> ModelSpec {
    ModelSpec {
        name: name.into(),
        source: format!("file:///models/{name}"),
        version_policy: VersionPolicy::All,
        config_override: None,
        min_replicas: min,
        max_replicas: min + 1,
        resources: Default::default(),
        labels: Default::default(),
        available_versions: vec![1, 2],
        traffic: Default::default(),
    }
}

/// Writes `cmd` and waits until the hub has seen it, so each write is its own delta.
async fn write(c: &MemoryConsensus, hub: &WatchHub, cmd: Command) {
    let _ = c.write(cmd).await;
    settle(c, hub).await;
}

async fn settle(c: &MemoryConsensus, hub: &WatchHub) {
    let target = c.local_state().revision();
    for _ in 0..1000 {
        if hub.revision() >= target {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("hub stuck at {} < {target}", hub.revision());
}

async fn next(
    s: &mut (impl Stream<Item = Result<pb::WatchEvent, tonic::Status>> + Unpin),
) -> pb::WatchEvent {
    tokio::time::timeout(Duration::from_secs(5), s.next())
        .await
        .expect("an event in time")
        .expect("the stream is open")
        .expect("not an error")
}

/// Events ready now (none pending after a short wait).
async fn drain(
    s: &mut (impl Stream<Item = Result<pb::WatchEvent, tonic::Status>> + Unpin),
) -> Vec<pb::WatchEvent> {
    let mut out = Vec::new();
    while let Ok(Some(e)) = tokio::time::timeout(Duration::from_millis(20), s.next()).await {
        out.push(e.expect("not an error"));
    }
    out
}

fn is_snapshot(e: &pb::WatchEvent) -> bool {
    matches!(e.event, Some(Event::Snapshot(_)))
}

fn delta(e: &pb::WatchEvent) -> &pb::StateDelta {
    match &e.event {
        Some(Event::Delta(d)) => d,
        other => panic!("expected a delta, got {other:?}"),
    }
}

/// A watcher's copy of the state, built from events alone.
#[derive(Default)]
struct Mirror {
    revision: u64,
    models: BTreeMap<String, pb::Model>,
    nodes: BTreeMap<String, pb::Node>,
    replicas: BTreeMap<u64, pb::Replica>,
}

impl Mirror {
    fn apply(&mut self, e: pb::WatchEvent) {
        assert!(
            e.revision >= self.revision || is_snapshot(&e),
            "revision went back from {} to {}",
            self.revision,
            e.revision
        );
        self.revision = e.revision;
        match e.event.expect("an event") {
            Event::Snapshot(s) => {
                self.models = s.models.into_iter().map(|m| (m.name.clone(), m)).collect();
                self.nodes = s.nodes.into_iter().map(|n| (n.id.clone(), n)).collect();
                self.replicas = s.replicas.into_iter().map(|r| (r.id, r)).collect();
            }
            Event::Delta(d) => {
                for m in d.upserted_models {
                    self.models.insert(m.name.clone(), m);
                }
                for m in d.deleted_models {
                    self.models.remove(&m);
                }
                for n in d.upserted_nodes {
                    self.nodes.insert(n.id.clone(), n);
                }
                for n in d.deleted_nodes {
                    self.nodes.remove(&n);
                }
                for r in d.upserted_replicas {
                    self.replicas.insert(r.id, r);
                }
                for r in d.deleted_replicas {
                    self.replicas.remove(&r);
                }
            }
        }
    }

    fn snapshot(&self) -> pb::StateSnapshot {
        pb::StateSnapshot {
            models: self.models.values().cloned().collect(),
            nodes: self.nodes.values().cloned().collect(),
            replicas: self.replicas.values().cloned().collect(),
        }
    }
}

#[tokio::test]
async fn first_event_is_a_snapshot_then_deltas_follow() {
    let c = MemoryConsensus::new(1);
    let hub = WatchHub::spawn(&c);
    write(&c, &hub, Command::UpsertModel(model("a", 1))).await;
    let mut s = Box::pin(hub.stream(0));
    let first = next(&mut s).await;
    assert_eq!(first.revision, 1);
    match &first.event {
        Some(Event::Snapshot(snap)) => assert_eq!(*snap, snapshot_to_pb(&c.local_state())),
        other => panic!("expected a snapshot, got {other:?}"),
    }

    write(&c, &hub, Command::RegisterNode(node("n1"))).await;
    let e = next(&mut s).await;
    assert_eq!(e.revision, 2);
    assert_eq!(delta(&e).upserted_nodes[0].id, "n1");

    write(&c, &hub, Command::DeleteModel { name: "a".into() }).await;
    let e = next(&mut s).await;
    assert_eq!(e.revision, 3);
    assert_eq!(delta(&e).deleted_models, ["a"]);

    // A refused command and an idempotent repeat produce no event.
    write(&c, &hub, Command::DeleteModel { name: "a".into() }).await;
    write(
        &c,
        &hub,
        Command::SetNodeDrained {
            id: "n1".into(),
            drained: false,
        },
    )
    .await;
    assert!(drain(&mut s).await.is_empty());
}

#[tokio::test]
async fn resume_gets_exactly_the_missed_changes() {
    let c = MemoryConsensus::new(1);
    let hub = WatchHub::spawn(&c);
    for (i, name) in ["a", "b", "c", "d", "e"].iter().enumerate() {
        write(&c, &hub, Command::UpsertModel(model(name, i as u32))).await;
    }
    let mut s = Box::pin(hub.stream(3));
    let events = drain(&mut s).await;
    let revisions: Vec<_> = events.iter().map(|e| e.revision).collect();
    assert_eq!(revisions, [4, 5]);
    assert_eq!(delta(&events[0]).upserted_models[0].name, "d");
    assert_eq!(delta(&events[1]).upserted_models[0].name, "e");

    // Up to date: nothing until the next change.
    let mut s = Box::pin(hub.stream(5));
    assert!(drain(&mut s).await.is_empty());
    write(&c, &hub, Command::UpsertModel(model("f", 1))).await;
    assert_eq!(next(&mut s).await.revision, 6);
}

#[tokio::test]
async fn unknown_or_forgotten_revisions_get_a_snapshot() {
    let c = MemoryConsensus::new(1);
    let hub = WatchHub::with_capacity(&c, 2, 16);
    for name in ["a", "b", "c", "d"] {
        write(&c, &hub, Command::UpsertModel(model(name, 1))).await;
    }
    for from in [1, 99] {
        let mut s = Box::pin(hub.stream(from));
        let e = next(&mut s).await;
        assert!(is_snapshot(&e), "from {from}: {e:?}");
        assert_eq!(e.revision, 4);
        assert!(drain(&mut s).await.is_empty());
    }
    // The ring still covers 2 -> 4.
    let mut s = Box::pin(hub.stream(2));
    let revisions: Vec<_> = drain(&mut s).await.iter().map(|e| e.revision).collect();
    assert_eq!(revisions, [3, 4]);
}

#[tokio::test]
async fn a_slow_watcher_is_resynchronized_with_a_snapshot() {
    let c = MemoryConsensus::new(1);
    let hub = WatchHub::with_capacity(&c, 1024, 2);
    let mut s = Box::pin(hub.stream(0));
    assert!(is_snapshot(&next(&mut s).await));
    for i in 0..10 {
        write(&c, &hub, Command::UpsertModel(model(&format!("m{i}"), 1))).await;
    }
    let events = drain(&mut s).await;
    let first = &events[0];
    assert!(is_snapshot(first), "{first:?}");
    assert_eq!(first.revision, 10);
    let mut mirror = Mirror::default();
    for e in events {
        mirror.apply(e);
    }
    assert_eq!(mirror.snapshot(), snapshot_to_pb(&c.local_state()));
}

#[tokio::test]
async fn streams_end_when_the_hub_stops() {
    let c = Arc::new(MemoryConsensus::new(1));
    let hub = WatchHub::spawn(c.as_ref());
    let mut s = Box::pin(hub.stream(0));
    assert!(is_snapshot(&next(&mut s).await));
    drop(hub);
    let end = tokio::time::timeout(Duration::from_secs(5), s.next())
        .await
        .expect("the stream ends in time");
    let status = end.expect("one last item").expect_err("an error");
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert!(s.next().await.is_none());
}

fn random_command(rng: &mut Rng, replicas: &[u64]) -> Command {
    let models = ["a", "b", "c"];
    let nodes = ["n1", "n2", "n3"];
    let m = models[rng.below(3) as usize].to_string();
    let n = nodes[rng.below(3) as usize].to_string();
    let replica = || replicas.first().copied().unwrap_or(1);
    let id = if replicas.is_empty() {
        replica()
    } else {
        replicas[rng.below(replicas.len() as u64) as usize]
    };
    match rng.below(10) {
        0 => Command::UpsertModel(model(&m, rng.below(3) as u32)),
        1 => Command::DeleteModel { name: m },
        2 => Command::RegisterNode(node(&n)),
        3 => Command::SetNodeDrained {
            id: n,
            drained: rng.below(2) == 0,
        },
        4 => Command::SetNodeStatus {
            id: n,
            status: if rng.below(2) == 0 {
                NodeStatus::Up
            } else {
                NodeStatus::Down
            },
        },
        5 | 6 => Command::AddReplica {
            model: m,
            version: 1 + rng.below(2) as i64,
            node: n,
            reason: "random".into(),
            gpus: Vec::new(),
        },
        7 | 8 => Command::SetReplicaState {
            id,
            state: match rng.below(5) {
                0 => ReplicaState::Loading,
                1 => ReplicaState::Ready,
                2 => ReplicaState::Failed {
                    reason: "boom".into(),
                },
                3 => ReplicaState::Unloading,
                _ => ReplicaState::Pending,
            },
            measured_memory_bytes: Some(rng.below(1000)),
            measured_gpu_memory_bytes: None,
        },
        _ => Command::RemoveReplica { id },
    }
}

#[tokio::test]
async fn a_client_mirrors_the_state_from_events_across_reconnects() {
    for seed in [0x9e37_79b9_7f4a_7c15u64, 0xdead_beef_cafe_f00d, 42] {
        let c = MemoryConsensus::new(1);
        // A small ring and channel, so resumes hit both deltas and snapshots.
        let hub = WatchHub::with_capacity(&c, 16, 8);
        let mut rng = Rng::from_state(seed);
        let mut mirror = Mirror::default();
        let mut stream = Box::pin(hub.stream(0));
        let (mut snapshots, mut deltas) = (0, 0);
        for round in 0..80 {
            let writes = rng.below(12);
            for _ in 0..writes {
                let ids: Vec<u64> = c.local_state().replicas().keys().copied().collect();
                let cmd = random_command(&mut rng, &ids);
                if rng.below(4) == 0 {
                    // Batched without letting the hub run: one delta spans several commits.
                    let _ = c.write(cmd).await;
                } else {
                    write(&c, &hub, cmd).await;
                }
            }
            settle(&c, &hub).await;
            for e in drain(&mut stream).await {
                if is_snapshot(&e) {
                    snapshots += 1;
                } else {
                    deltas += 1;
                }
                mirror.apply(e);
            }
            let state = c.local_state();
            assert_eq!(
                mirror.revision,
                state.revision(),
                "seed {seed:#x} round {round}"
            );
            assert_eq!(
                mirror.snapshot(),
                snapshot_to_pb(&state),
                "seed {seed:#x} round {round}"
            );
            if rng.below(3) == 0 {
                // Reconnect, resuming from what the mirror holds (sometimes from an older
                // revision: replaying deltas it already applied must be harmless).
                let from = mirror.revision.saturating_sub(rng.below(3));
                mirror.revision = from;
                stream = Box::pin(hub.stream(from));
            }
        }
        let revision = c.local_state().revision();
        assert!(revision > 60, "seed {seed:#x}: only {revision} changes");
        assert!(
            snapshots > 0 && deltas > 0,
            "seed {seed:#x}: {snapshots} snapshots, {deltas} deltas"
        );
        eprintln!("seed {seed:#x}: revision {revision}, {snapshots} snapshots, {deltas} deltas");
    }
}
