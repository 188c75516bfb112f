//! Leader rounds against the in-memory consensus: placement writes, node death, drains, and the
//! recorded decisions.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Observations;
use super::soft::SoftState;
use super::task::round;
use crate::consensus::Consensus;
use crate::consensus::memory::MemoryConsensus;
use crate::metrics::{PlacementAction, PlacementDecisions};
use crate::state::{Command, ModelSpec, NodeStatus, ReplicaState};
use crate::testing::{self, node};

const TIMEOUT: Duration = Duration::from_secs(2);

fn model(name: &str, replicas: u32) -> ModelSpec {
    ModelSpec {
        min_replicas: replicas,
        max_replicas: replicas,
        ..testing::model(name)
    }
}

/// A leader that has been in office long enough to declare nodes down.
fn setup() -> (Arc<MemoryConsensus>, SoftState) {
    let soft = SoftState::new(TIMEOUT);
    soft.begin_term(Instant::now() - Duration::from_secs(60));
    (Arc::new(MemoryConsensus::new(1)), soft)
}

async fn write(c: &MemoryConsensus, cmd: Command) {
    c.write(cmd).await.expect("write accepted");
}

/// (node, state) of every replica of `model`, sorted by node.
fn replicas_of(c: &MemoryConsensus, model: &str) -> Vec<(String, ReplicaState)> {
    let mut v: Vec<_> = c
        .local_state()
        .replicas_of(model)
        .map(|r| (r.node.clone(), r.state.clone()))
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

async fn set_ready(c: &MemoryConsensus, model: &str) {
    let ids: Vec<u64> = c
        .local_state()
        .replicas_of(model)
        .filter(|r| r.state == ReplicaState::Pending)
        .map(|r| r.id)
        .collect();
    for id in ids {
        for state in [ReplicaState::Loading, ReplicaState::Ready] {
            write(
                c,
                Command::SetReplicaState {
                    id,
                    state,
                    measured_memory_bytes: Some(512 << 20),
                    measured_gpu_memory_bytes: None,
                },
            )
            .await;
        }
    }
}

#[tokio::test]
async fn a_round_places_replicas_spread_and_records_why() {
    let (c, soft) = setup();
    for id in ["a", "b"] {
        write(&c, Command::RegisterNode(node(id))).await;
        soft.heard_from(id, Instant::now(), None);
    }
    write(&c, Command::UpsertModel(model("m", 2))).await;
    let decisions = PlacementDecisions::default();
    round(&*c, &soft, &decisions).await.unwrap();
    assert_eq!(decisions.get(PlacementAction::Place), 2);

    let placed = replicas_of(&c, "m");
    assert_eq!(
        placed,
        vec![
            ("a".into(), ReplicaState::Pending),
            ("b".into(), ReplicaState::Pending)
        ]
    );
    let state = c.local_state();
    assert!(
        state
            .replicas_of("m")
            .all(|r| r.placement_reason.starts_with("new model version"))
    );
    let history = soft.placement_history("m");
    assert_eq!(history.len(), 1);
    assert_eq!(history[0].decisions.len(), 2);
    assert!(history[0].decisions.iter().all(|d| d.rule == "NewModel"));
    assert_eq!(history[0].inputs.len(), 2, "{:?}", history[0].inputs);

    round(&*c, &soft, &Default::default()).await.unwrap();
    assert_eq!(
        replicas_of(&c, "m").len(),
        2,
        "a settled round adds nothing"
    );
    assert_eq!(soft.placement_history("m").len(), 1, "nothing new recorded");
}

#[tokio::test]
async fn a_silent_node_goes_down_and_its_replica_moves() {
    let (c, soft) = setup();
    for id in ["a", "b", "c"] {
        write(&c, Command::RegisterNode(node(id))).await;
        soft.heard_from(id, Instant::now(), None);
    }
    write(&c, Command::UpsertModel(model("m", 2))).await;
    round(&*c, &soft, &Default::default()).await.unwrap();
    set_ready(&c, "m").await;
    let victim = replicas_of(&c, "m")[0].0.clone();

    let old = Instant::now() - Duration::from_secs(30);
    let mut live: Vec<&str> = vec!["a", "b", "c"];
    live.retain(|n| *n != victim);
    soft.begin_term(old);
    soft.heard_from(&victim, old, None);
    for n in &live {
        soft.heard_from(n, Instant::now(), None);
    }
    round(&*c, &soft, &Default::default()).await.unwrap();

    let state = c.local_state();
    assert_eq!(state.node(&victim).unwrap().status, NodeStatus::Down);
    let nodes: Vec<String> = state.replicas_of("m").map(|r| r.node.clone()).collect();
    assert_eq!(nodes.len(), 2, "{nodes:?}");
    assert!(
        !nodes.contains(&victim),
        "the dead node's replica is gone: {nodes:?}"
    );
    let moved = state
        .replicas_of("m")
        .find(|r| r.state == ReplicaState::Pending)
        .expect("a replacement");
    assert!(
        moved.placement_reason.contains("down"),
        "{}",
        moved.placement_reason
    );

    soft.heard_from(&victim, Instant::now(), None);
    round(&*c, &soft, &Default::default()).await.unwrap();
    assert_eq!(
        c.local_state().node(&victim).unwrap().status,
        NodeStatus::Up
    );
}

#[tokio::test]
async fn a_new_leader_waits_one_timeout_before_declaring_nodes_down() {
    let c = Arc::new(MemoryConsensus::new(1));
    let soft = SoftState::new(TIMEOUT);
    write(&c, Command::RegisterNode(node("a"))).await;
    soft.begin_term(Instant::now());
    round(&*c, &soft, &Default::default()).await.unwrap();
    assert_eq!(c.local_state().node("a").unwrap().status, NodeStatus::Up);
}

#[tokio::test]
async fn drain_is_make_before_break() {
    let (c, soft) = setup();
    for id in ["a", "b"] {
        write(&c, Command::RegisterNode(node(id))).await;
        soft.heard_from(id, Instant::now(), None);
    }
    write(&c, Command::UpsertModel(model("m", 1))).await;
    round(&*c, &soft, &Default::default()).await.unwrap();
    set_ready(&c, "m").await;
    let first = replicas_of(&c, "m")[0].0.clone();
    let other = if first == "a" { "b" } else { "a" };

    write(
        &c,
        Command::SetNodeDrained {
            id: first.clone(),
            drained: true,
        },
    )
    .await;
    round(&*c, &soft, &Default::default()).await.unwrap();
    let now = replicas_of(&c, "m");
    let expected_pair = |drained_state: ReplicaState| {
        let mut v = vec![
            (first.clone(), drained_state),
            (other.to_string(), ReplicaState::Pending),
        ];
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    };
    assert_eq!(
        now,
        expected_pair(ReplicaState::Ready),
        "old stays until new is ready"
    );

    set_ready(&c, "m").await;
    round(&*c, &soft, &Default::default()).await.unwrap();
    let state = c.local_state();
    let on_first = state.replicas_of("m").find(|r| r.node == first).unwrap();
    assert_eq!(on_first.state, ReplicaState::Unloading);
    let on_other = state.replicas_of("m").find(|r| r.node == other).unwrap();
    assert_eq!(on_other.state, ReplicaState::Ready);
}

#[tokio::test]
async fn a_model_that_fits_nowhere_is_recorded_unplaced() {
    let (c, soft) = setup();
    write(&c, Command::RegisterNode(node("a"))).await;
    soft.heard_from("a", Instant::now(), None);
    let mut big = model("big", 1);
    big.resources.memory_bytes = 64 << 30;
    write(&c, Command::UpsertModel(big)).await;
    round(&*c, &soft, &Default::default()).await.unwrap();
    assert!(replicas_of(&c, "big").is_empty());
    let history = soft.placement_history("big");
    assert_eq!(history.len(), 1);
    assert_eq!(history[0].decisions[0].action, "unplaced");
    assert_eq!(history[0].decisions[0].rule, "NoCapacity");
}

#[tokio::test]
async fn activation_scales_a_model_from_zero_and_lapsed_demand_back_to_zero() {
    let (c, soft) = setup();
    for id in ["a", "b"] {
        write(&c, Command::RegisterNode(node(id))).await;
        soft.heard_from(id, Instant::now(), None);
    }
    let mut m = model("m", 0);
    m.max_replicas = 3;
    write(&c, Command::UpsertModel(m)).await;
    round(&*c, &soft, &Default::default()).await.unwrap();
    assert!(replicas_of(&c, "m").is_empty(), "min 0: nothing placed");

    soft.activate("m", Instant::now());
    round(&*c, &soft, &Default::default()).await.unwrap();
    assert_eq!(replicas_of(&c, "m").len(), 1, "one replica on demand");
    set_ready(&c, "m").await;
    round(&*c, &soft, &Default::default()).await.unwrap();
    assert_eq!(
        replicas_of(&c, "m")[0].1,
        ReplicaState::Ready,
        "kept while in demand"
    );

    // The last activation is older than the scale-to-zero delay: the replica unloads.
    soft.activate("m", Instant::now() - soft.scale_to_zero_after() * 2);
    round(&*c, &soft, &Default::default()).await.unwrap();
    assert_eq!(replicas_of(&c, "m")[0].1, ReplicaState::Unloading);

    // A model with max_replicas 0 is never started by demand.
    let mut off = model("off", 0);
    off.max_replicas = 0;
    write(&c, Command::UpsertModel(off)).await;
    soft.activate("off", Instant::now());
    round(&*c, &soft, &Default::default()).await.unwrap();
    assert!(replicas_of(&c, "off").is_empty());
}

#[tokio::test]
async fn a_new_leader_assumes_demand_for_models_running_above_their_floor() {
    let soft = SoftState::new(TIMEOUT);
    soft.assume_demand(["m".to_string()], Instant::now());
    assert!(soft.load().demanded.contains("m"));
    soft.begin_term(Instant::now());
    assert!(soft.load().demanded.is_empty(), "a new term starts empty");
}

#[tokio::test]
async fn a_round_scales_an_autoscaled_model_on_heartbeat_load_and_explains_it() {
    use nereid_proto::pb::cluster as pb;
    let (c, soft) = setup();
    for id in ["a", "b"] {
        write(&c, Command::RegisterNode(node(id))).await;
        soft.heard_from(id, Instant::now(), None);
    }
    write(&c, Command::UpsertModel(model("m", 1))).await;
    let policy = crate::state::AutoscalePolicy {
        target_in_flight_milli: 2000,
        tolerance_percent: 10,
        up_window_ms: 0,
        down_window_ms: 0,
        cooldown_ms: 0,
        max_step: 4,
    };
    write(
        &c,
        Command::SetAutoscale {
            name: "m".into(),
            min: 1,
            max: 2,
            policy: Some(policy),
        },
    )
    .await;
    let decisions = PlacementDecisions::default();
    round(&*c, &soft, &decisions).await.unwrap();
    set_ready(&c, "m").await;
    assert_eq!(replicas_of(&c, "m").len(), 1);
    // 8 requests in flight on the one replica: 4 wanted, max_replicas 2.
    let host = replicas_of(&c, "m")[0].0.clone();
    let heartbeat = pb::HeartbeatRequest {
        node_id: host.clone(),
        models: vec![pb::ModelLoad {
            model: "m".into(),
            version: 2,
            queue_depth: 6,
            in_flight: 8,
            ..Default::default()
        }],
        ..Default::default()
    };
    soft.heard_from(&host, Instant::now(), Some(heartbeat));
    round(&*c, &soft, &decisions).await.unwrap();
    let state = c.local_state();
    let autoscale = state.autoscale("m").expect("policy kept");
    assert_eq!(autoscale.replicas, Some(2));
    assert!(
        autoscale.reason.starts_with("scale up 1 -> 2"),
        "{}",
        autoscale.reason
    );
    assert_eq!(replicas_of(&c, "m").len(), 2, "placement follows the count");
    let rules: Vec<String> = soft
        .placement_history("m")
        .iter()
        .flat_map(|r| r.decisions.iter().map(|d| d.rule.clone()))
        .collect();
    assert!(rules.contains(&"Autoscale".to_string()), "{rules:?}");
    assert!(
        soft.autoscale_latest("m").is_some(),
        "the latest evaluation is kept for explanations"
    );
}

#[tokio::test]
async fn a_late_worker_receives_replicas_make_before_break_within_the_budget() {
    let c = Arc::new(MemoryConsensus::new(1));
    let soft = SoftState::new(TIMEOUT).with_rebalance_max_moves(2);
    soft.begin_term(Instant::now() - Duration::from_secs(60));
    write(&c, Command::RegisterNode(node("a"))).await;
    soft.heard_from("a", Instant::now(), None);
    let names: Vec<String> = (0..6).map(|i| format!("m{i}")).collect();
    for name in &names {
        write(&c, Command::UpsertModel(model(name, 1))).await;
    }
    round(&*c, &soft, &Default::default()).await.unwrap();
    for name in &names {
        set_ready(&c, name).await;
    }

    write(&c, Command::RegisterNode(node("b"))).await;
    soft.heard_from("b", Instant::now(), None);
    for step in 0..8 {
        round(&*c, &soft, &Default::default()).await.unwrap();
        let live = |m: &str| -> Vec<(String, ReplicaState)> {
            replicas_of(&c, m)
                .into_iter()
                .filter(|(_, s)| *s != ReplicaState::Unloading)
                .collect()
        };
        let moving = names.iter().filter(|m| live(m).len() == 2).count();
        assert!(
            moving <= 2,
            "step {step}: {moving} moves in flight, budget 2"
        );
        for m in &names {
            assert!(
                live(m).iter().any(|(_, s)| *s == ReplicaState::Ready),
                "step {step}: {m} lost its ready replica: {:?}",
                replicas_of(&c, m)
            );
        }
        for m in &names {
            set_ready(&c, m).await;
        }
    }
    let state = c.local_state();
    let on = |n: &str| {
        state
            .replicas()
            .values()
            .filter(|r| r.node == n && r.state == ReplicaState::Ready)
            .count()
    };
    assert_eq!((on("a"), on("b")), (3, 3));
    let moved = state
        .replicas()
        .values()
        .find(|r| r.node == "b")
        .expect("a replica on b");
    assert!(
        moved
            .placement_reason
            .starts_with("rebalancing: a replica moves from a to b"),
        "{}",
        moved.placement_reason
    );
    let rules: Vec<(String, String)> = soft
        .placement_history(&moved.model)
        .iter()
        .flat_map(|r| {
            r.decisions
                .iter()
                .map(|d| (d.action.clone(), d.rule.clone()))
        })
        .collect();
    assert!(
        rules.contains(&("add".into(), "Rebalance".into()))
            && rules.contains(&("remove".into(), "Rebalance".into())),
        "{rules:?}"
    );
}

#[tokio::test]
async fn an_activation_without_room_evicts_the_least_recently_used_idle_model_in_one_round() {
    let soft = SoftState::new(TIMEOUT).with_min_residency(Some(Duration::ZERO));
    soft.begin_term(Instant::now() - Duration::from_secs(60));
    let c = Arc::new(MemoryConsensus::new(1));
    let mut small = node("a");
    // Room for two replicas as measured (512 MiB each) and not for a third (1 GiB declared).
    small.capacity.memory_bytes = 3 << 29;
    write(&c, Command::RegisterNode(small)).await;
    soft.heard_from("a", Instant::now(), None);
    for name in ["old", "warm", "new"] {
        let mut m = model(name, 0);
        m.max_replicas = 1;
        write(&c, Command::UpsertModel(m)).await;
    }
    let decisions = PlacementDecisions::default();
    for name in ["old", "warm"] {
        soft.activate(name, Instant::now());
        round(&*c, &soft, &decisions).await.unwrap();
        set_ready(&c, name).await;
    }
    round(&*c, &soft, &decisions).await.unwrap();
    // "warm" was used after "old": "old" is the least recently used.
    soft.activate("warm", Instant::now());
    soft.activate("new", Instant::now());
    round(&*c, &soft, &decisions).await.unwrap();
    assert_eq!(replicas_of(&c, "old")[0].1, ReplicaState::Unloading);
    assert_eq!(replicas_of(&c, "warm")[0].1, ReplicaState::Ready);
    let placed = c.local_state();
    let new = placed.replicas_of("new").next().expect("new is placed");
    assert!(
        new.placement_reason
            .contains("placed after evicting old v2"),
        "{}",
        new.placement_reason
    );
    let old = soft.placement_history("old");
    let last = &old.last().expect("recorded").decisions[0];
    assert_eq!(last.rule, "Evicted");
    assert!(
        last.explanation
            .starts_with("evicted to make room for new v2")
    );
    assert!(
        !soft.load().demanded.contains("old"),
        "its activation is forgotten"
    );
    let metrics = nereid_telemetry::render_prometheus(&soft.cache_stats().families());
    assert!(
        metrics.contains("nereid_cache_evictions_total{model=\"old\"} 1"),
        "{metrics}"
    );

    // The next rounds change nothing: "old" is not brought back, "new" is not evicted.
    set_ready(&c, "new").await;
    round(&*c, &soft, &decisions).await.unwrap();
    round(&*c, &soft, &decisions).await.unwrap();
    assert_eq!(replicas_of(&c, "new")[0].1, ReplicaState::Ready);
    assert_eq!(
        replicas_of(&c, "old").len(),
        1,
        "still only the unloading one"
    );
}
