//! The leader's control loop. On every node it waits for this node to become leader; while it
//! is, it runs rounds on a timer and on every state change:
//!
//! ```text
//!  round: liveness transitions ─► SetNodeStatus writes
//!         heartbeats' load ─► autoscaler ─► SetAutoscaledReplicas writes (count changes only)
//!         state ─► note placement times, cold starts over (model cache)
//!         state ─► views ─► plan(load, moves in flight, cache) ─► record decisions per model,
//!                                                    remember the moves it starts,
//!                                                    forget evicted models' activations
//!                                         └──────► plan_chains ─► writes, in order
//!                                                  (each committed one counted: metrics)
//! ```
//!
//! Commands are written as independent chains, up to 64 at once (see [`chains`]). A refused
//! write (the state moved under the round) is logged; the next round starts from the new state. Losing leadership ends the inner loop; the task then waits again.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::Observations;
use super::inputs::describe_inputs;
use super::round::plan_chains;
use super::soft::SoftState;
use nereid_proto::pb::cluster as pb;

use crate::autoscale::Decision;
use crate::consensus::{Consensus, ConsensusError};
use crate::convert::plan_to_decisions;
use crate::metrics::{PlacementDecisions, placement_action};
use crate::state::{ClusterState, Command, ReplicaState};
use crate::views::{current_replicas, model_views, node_views, with_floors};
use nereid_placement::plan;

/// Placement commands in flight at once. Raft batches concurrent writes into one append (one
/// fsync), so placing thousands of replicas does not cost one disk flush each.
const CONCURRENT_WRITES: usize = 64;

/// How often the leader re-evaluates liveness and placement without a state change.
#[derive(Debug, Clone, Copy)]
pub struct LeaderConfig {
    pub round_interval: Duration,
}

/// Runs the leader loop until `shutdown` turns true.
pub async fn run(
    consensus: Arc<dyn Consensus>,
    soft: Arc<SoftState>,
    config: LeaderConfig,
    decisions: Arc<PlacementDecisions>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut leadership = consensus.leadership();
    loop {
        let current = *leadership.borrow_and_update();
        if current.is_self {
            info!(
                term = current.term,
                "this node is the leader: running placement"
            );
            let now = Instant::now();
            soft.begin_term(now);
            soft.assume_demand(scaled_from_zero(&consensus.local_state()), now);
            lead(
                &*consensus,
                &soft,
                config,
                &decisions,
                &mut leadership,
                &mut shutdown,
            )
            .await;
        }
        if *shutdown.borrow() {
            return;
        }
        tokio::select! {
            changed = leadership.changed() => if changed.is_err() { return },
            _ = shutdown.changed() => return,
        }
    }
}

/// Runs rounds while this node stays leader.
async fn lead(
    consensus: &dyn Consensus,
    soft: &SoftState,
    config: LeaderConfig,
    decisions: &PlacementDecisions,
    leadership: &mut watch::Receiver<crate::consensus::Leadership>,
    shutdown: &mut watch::Receiver<bool>,
) {
    let mut states = consensus.subscribe();
    let mut ticker = tokio::time::interval(config.round_interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        if *shutdown.borrow() || !leadership.borrow().is_self {
            return;
        }
        match round(consensus, soft, decisions).await {
            Ok(()) => {}
            Err(ConsensusError::NotLeader { .. }) => return,
            Err(e) => debug!("placement round ended early: {e}"),
        }
        tokio::select! {
            _ = ticker.tick() => {}
            _ = soft.woken() => {}
            changed = states.changed() => if changed.is_err() { return },
            changed = leadership.changed() => if changed.is_err() { return },
            _ = shutdown.changed() => return,
        }
    }
}

/// One round: liveness, then placement; each placement command committed is counted in
/// `decisions`.
pub async fn round(
    consensus: &dyn Consensus,
    soft: &SoftState,
    decisions: &PlacementDecisions,
) -> Result<(), ConsensusError> {
    let state = consensus.local_state();
    let transitions = soft.liveness_transitions(
        state
            .nodes()
            .values()
            .map(|n| (n.spec.id.as_str(), n.status)),
        Instant::now(),
    );
    for (id, status) in transitions {
        info!(node = %id, ?status, "node liveness changed");
        write(consensus, Command::SetNodeStatus { id, status }).await?;
    }

    let state = consensus.local_state();
    for (model, decision) in soft.autoscale(&state, Instant::now()) {
        info!(model = %model, "autoscaler: {}", decision.reason);
        soft.record(
            &model,
            state.revision(),
            vec![autoscale_record(&decision)],
            Vec::new(),
        );
        let cmd = Command::SetAutoscaledReplicas {
            name: model,
            replicas: decision.replicas,
            reason: decision.reason,
        };
        // A refused write (the policy changed meanwhile) is logged; placement still runs.
        if let Err(e @ ConsensusError::NotLeader { .. }) = write(consensus, cmd).await {
            return Err(e);
        }
    }

    let state = consensus.local_state();
    soft.prune_moves(&state);
    soft.note_replicas(&state, Instant::now());
    let nodes = node_views(&state);
    let load = with_floors(&state, soft.load());
    let decided = plan(
        &nodes,
        &model_views(&state, &load),
        &current_replicas(&state),
        &load,
    );
    let mut touched: BTreeSet<&str> = state.models().keys().map(String::as_str).collect();
    touched.extend(decided.add.iter().map(|a| a.model.as_str()));
    touched.extend(decided.unplaced.iter().map(|u| u.model.as_str()));
    let inputs = if decided.is_settled() && decided.unplaced.is_empty() {
        Vec::new()
    } else {
        describe_inputs(&state, &nodes, &load)
    };
    for model in touched {
        let mine = decided.for_model(model, |id| state.replica(id).map(|r| r.model.clone()));
        let decisions = plan_to_decisions(&mine, &state);
        soft.record(model, state.revision(), decisions, inputs.clone());
    }
    soft.start_moves(&state, &decided);
    soft.evicting(&state, &decided);
    let writes = plan_chains(&state, &decided)
        .into_iter()
        .map(|chain| async move {
            for cmd in chain {
                let action = placement_action(&cmd);
                write(consensus, cmd).await?;
                decisions.add(action);
            }
            Ok::<(), ConsensusError>(())
        });
    let results: Vec<Result<(), ConsensusError>> = futures::stream::iter(writes)
        .buffer_unordered(CONCURRENT_WRITES)
        .collect()
        .await;
    // Losing leadership matters more than a refused write: it ends the leader loop.
    let mut first_error = None;
    for result in results {
        match result {
            Err(e @ ConsensusError::NotLeader { .. }) => return Err(e),
            Err(e) => {
                first_error.get_or_insert(e);
            }
            Ok(()) => {}
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// An autoscaler change as the placement history shows it.
fn autoscale_record(decision: &Decision) -> pb::PlacementDecision {
    pb::PlacementDecision {
        action: "scale".into(),
        rule: "Autoscale".into(),
        explanation: decision.reason.clone(),
        ..Default::default()
    }
}

/// Models with `min_replicas` 0 that run a replica: scaled from zero by an earlier leader.
fn scaled_from_zero(state: &ClusterState) -> Vec<String> {
    state
        .models()
        .values()
        .filter(|m| m.min_replicas == 0)
        .filter(|m| {
            state
                .replicas_of(&m.name)
                .any(|r| r.state != ReplicaState::Unloading)
        })
        .map(|m| m.name.clone())
        .collect()
}

async fn write(consensus: &dyn Consensus, cmd: Command) -> Result<(), ConsensusError> {
    let what = format!("{cmd:?}");
    match consensus.write(cmd).await {
        Ok(applied) => {
            debug!(revision = applied.revision, "leader wrote {what}");
            Ok(())
        }
        Err(e @ ConsensusError::Rejected(_)) => {
            warn!("leader write refused ({what}): {e}");
            Err(e)
        }
        Err(e) => Err(e),
    }
}
