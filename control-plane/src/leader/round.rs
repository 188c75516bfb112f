//! One placement round turned into log commands: what the leader writes for a [`Plan`], and the
//! clean-up of replicas whose worker can no longer report.
//!
//! ```text
//!  add                         ─► AddReplica { reason }
//!  remove Pending              ─► RemoveReplica                (never loaded)
//!  remove on a down node       ─► SetReplicaState(Unloading), RemoveReplica   (nobody will report)
//!  remove Loading/Ready/Failed ─► SetReplicaState(Unloading)   (the worker unloads, then reports)
//!  Unloading on a down/unknown node ─► RemoveReplica
//! ```
//!
//! Pure: reads the state, returns commands; the leader task writes them in order.

use crate::placement::Plan;
use crate::state::{ClusterState, Command, NodeStatus, ReplicaState};

/// The commands that carry out `plan` against `state`, in a safe order: additions first
/// (make-before-break), then removals.
pub fn commands_for(state: &ClusterState, plan: &Plan) -> Vec<Command> {
    let mut out = Vec::new();
    for add in &plan.add {
        out.push(Command::AddReplica {
            model: add.model.clone(),
            version: add.version,
            node: add.node.clone(),
            reason: add.reason.to_string(),
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

fn unloading(id: u64) -> Command {
    Command::SetReplicaState {
        id,
        state: ReplicaState::Unloading,
        measured_memory_bytes: None,
    }
}

fn node_is_up(state: &ClusterState, node: &str) -> bool {
    state.node(node).is_some_and(|n| n.status == NodeStatus::Up)
}
