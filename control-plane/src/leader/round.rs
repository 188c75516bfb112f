//! One placement round turned into log commands: what the leader writes for a [`Plan`], and the
//! clean-up of replicas whose worker can no longer report.
//!
//! ```text
//!  add                         ─► AddReplica { reason, gpus }
//!  remove Pending              ─► RemoveReplica                (never loaded)
//!  remove on a down node       ─► SetReplicaState(Unloading), RemoveReplica   (nobody will report)
//!  remove Loading/Ready/Failed ─► SetReplicaState(Unloading)   (the worker unloads, then reports)
//!  Unloading on a down/unknown node ─► RemoveReplica
//!  add after evictions (model cache) ─► one chain: SetReplicaState(Unloading) per victim,
//!                                       then AddReplica (break-before-make: the node never
//!                                       holds more than its capacity)
//! ```
//!
//! Pure: reads the state, returns commands. [`chains`] splits them into independent sequences
//! (the commands for one replica stay in order) that the leader task writes concurrently, so
//! Raft can batch many into one disk flush; [`plan_chains`] does both, evictions included.

use std::collections::{BTreeSet, HashMap};

use crate::state::{ClusterState, Command, NodeStatus, ReplicaState};
use nereid_placement::Plan;

/// The commands that carry out `plan` against `state`, in a safe order: additions first
/// (make-before-break), then removals.
pub fn commands_for(state: &ClusterState, plan: &Plan) -> Vec<Command> {
    let mut out = Vec::new();
    for add in &plan.add {
        out.push(Command::AddReplica {
            model: add.model.clone(),
            version: add.version,
            node: add.node.clone(),
            reason: add.explanation(),
            gpus: add.gpus.clone(),
        });
    }
    for removal in &plan.remove {
        let Some(replica) = state.replica(removal.replica) else {
            continue;
        };
        let node_gone = !node_is_up(state, &replica.node);
        match replica.state {
            ReplicaState::Unloading => {}
            ReplicaState::Pending => out.push(Command::RemoveReplica { id: replica.id }),
            _ if node_gone => {
                out.push(unloading(replica.id));
                out.push(Command::RemoveReplica { id: replica.id });
            }
            _ => out.push(unloading(replica.id)),
        }
    }
    for replica in state.replicas().values() {
        if replica.state == ReplicaState::Unloading && !node_is_up(state, &replica.node) {
            out.push(Command::RemoveReplica { id: replica.id });
        }
    }
    out
}

/// The chains that carry out `plan`: one per addition that evicts (its victims' unloading
/// first, then the addition), then [`chains`] of the rest of [`commands_for`].
pub fn plan_chains(state: &ClusterState, plan: &Plan) -> Vec<Vec<Command>> {
    let victims: BTreeSet<u64> = plan
        .add
        .iter()
        .flat_map(|a| a.evicted.iter().map(|e| e.replica))
        .collect();
    let (evicting, rest): (Vec<_>, Vec<_>) = plan
        .add
        .iter()
        .cloned()
        .partition(|a| !a.evicted.is_empty());
    let mut out: Vec<Vec<Command>> = evicting
        .iter()
        .map(|a| {
            let single = Plan {
                add: vec![a.clone()],
                ..Default::default()
            };
            let mut chain: Vec<Command> = a.evicted.iter().map(|e| unloading(e.replica)).collect();
            chain.extend(
                commands_for(state, &single)
                    .into_iter()
                    .filter(|c| matches!(c, Command::AddReplica { .. })),
            );
            chain
        })
        .collect();
    let rest = Plan {
        add: rest,
        remove: plan
            .remove
            .iter()
            .filter(|r| !victims.contains(&r.replica))
            .cloned()
            .collect(),
        unplaced: Vec::new(),
    };
    out.extend(chains(commands_for(state, &rest)));
    out
}

/// Groups commands into chains that may be written concurrently: the commands that name the same
/// replica stay together, in order; every other command is a chain of its own.
pub fn chains(commands: Vec<Command>) -> Vec<Vec<Command>> {
    let mut out: Vec<Vec<Command>> = Vec::new();
    let mut by_replica: HashMap<u64, usize> = HashMap::new();
    for cmd in commands {
        let replica = match &cmd {
            Command::SetReplicaState { id, .. } | Command::RemoveReplica { id } => Some(*id),
            _ => None,
        };
        match replica.and_then(|id| by_replica.get(&id).copied()) {
            Some(chain) => out[chain].push(cmd),
            None => {
                if let Some(id) = replica {
                    by_replica.insert(id, out.len());
                }
                out.push(vec![cmd]);
            }
        }
    }
    out
}

fn unloading(id: u64) -> Command {
    Command::SetReplicaState {
        id,
        state: ReplicaState::Unloading,
        measured_memory_bytes: None,
        measured_gpu_memory_bytes: None,
    }
}

fn node_is_up(state: &ClusterState, node: &str) -> bool {
    state.node(node).is_some_and(|n| n.status == NodeStatus::Up)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_addition_carries_its_gpus_and_their_explanation_into_the_log() {
        use nereid_placement::{Addition, Reason};
        let plan = Plan {
            add: vec![Addition {
                model: "llm".into(),
                version: 1,
                node: "b".into(),
                reason: Reason::NewModel,
                gpus: vec![0, 2],
                skipped: vec!["node a: no GPU".into()],
                moves: None,
                evicted: Vec::new(),
            }],
            ..Default::default()
        };
        let cmds = commands_for(&ClusterState::new(), &plan);
        let [Command::AddReplica { gpus, reason, .. }] = cmds.as_slice() else {
            panic!("{cmds:?}")
        };
        assert_eq!(gpus, &[0, 2]);
        assert!(reason.starts_with("new model version"), "{reason}");
        assert!(reason.contains("GPU(s) 0, 2"), "{reason}");
        assert!(reason.contains("skipped node a: no GPU"), "{reason}");
    }

    #[test]
    fn commands_for_one_replica_stay_in_order_in_one_chain() {
        let add = |model: &str| Command::AddReplica {
            model: model.into(),
            version: 1,
            node: "a".into(),
            reason: String::new(),
            gpus: Vec::new(),
        };
        let got = chains(vec![
            add("m"),
            unloading(7),
            add("n"),
            Command::RemoveReplica { id: 7 },
            Command::RemoveReplica { id: 8 },
        ]);
        assert_eq!(
            got,
            vec![
                vec![add("m")],
                vec![unloading(7), Command::RemoveReplica { id: 7 }],
                vec![add("n")],
                vec![Command::RemoveReplica { id: 8 }],
            ]
        );
    }
}
