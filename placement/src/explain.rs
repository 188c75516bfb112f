//! Explanations: each [`Reason`] as one sentence, and a plan narrowed to one model, as shown by
//! `GET /api/v1/models/{name}/placement`.

use std::fmt;

use super::{Addition, Plan, Reason};
use crate::units::format_bytes;

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::NewModel => write!(f, "new model version: placing its first replicas"),
            Reason::ScaleUp => write!(f, "fewer replicas than wanted: adding one"),
            Reason::NodeDown => write!(
                f,
                "node is down or unknown: its replica is dropped and replaced on a live node"
            ),
            Reason::Drain => write!(
                f,
                "node is drained: a replacement is placed first, the drained replica unloads \
                 once enough replicas are ready elsewhere"
            ),
            Reason::ScaleDown => write!(
                f,
                "more replicas than wanted: removing from the most loaded, least free node first"
            ),
            Reason::ModelRemoved => write!(f, "model version is no longer registered"),
            Reason::SpreadConflict => write!(
                f,
                "two replicas of one model version on the same node: the extra one is replaced \
                 on another node"
            ),
            Reason::Rebalance { from, to, why } => write!(
                f,
                "rebalancing: a replica moves from {from} to {to} ({why}); the new replica \
                 loads first, the one on {from} unloads once enough replicas are ready elsewhere"
            ),
            Reason::NoCapacity { needed, best_free } => write!(
                f,
                "no capacity: a replica needs {needed} bytes but the best eligible node has \
                 only {best_free} bytes free"
            ),
            Reason::NotEnoughNodes { eligible_nodes } => write!(
                f,
                "not enough nodes: all {eligible_nodes} up, undrained nodes already hold a \
                 replica of this model version"
            ),
            Reason::Evicted {
                for_model,
                version,
                idle_ms,
            } => {
                write!(
                    f,
                    "evicted to make room for {for_model} v{version}: the least recently used \
                     idle replica on its node"
                )?;
                match idle_ms {
                    Some(ms) => write!(f, " (its model last used {:.1} s ago)", *ms as f64 / 1e3),
                    None => write!(f, " (its model not used since this leader started)"),
                }
            }
            Reason::CacheFull { cause, held } => {
                write!(f, "{cause}; nothing can be evicted to make room: {held}")
            }
            Reason::NoGpuCapacity {
                gpus,
                needed_per_gpu,
                skipped,
            } => write!(
                f,
                "no GPU capacity: a replica needs {gpus} GPU(s) with {} free each; {}",
                format_bytes(*needed_per_gpu),
                skipped.join("; ")
            ),
        }
    }
}

impl Reason {
    /// The rule's name, as the API and `ctl` show it (`NoCapacity`, `Drain`...).
    pub fn rule(&self) -> &'static str {
        match self {
            Reason::NewModel => "NewModel",
            Reason::ScaleUp => "ScaleUp",
            Reason::NodeDown => "NodeDown",
            Reason::Drain => "Drain",
            Reason::ScaleDown => "ScaleDown",
            Reason::ModelRemoved => "ModelRemoved",
            Reason::SpreadConflict => "SpreadConflict",
            Reason::Rebalance { .. } => "Rebalance",
            Reason::NoCapacity { .. } => "NoCapacity",
            Reason::NotEnoughNodes { .. } => "NotEnoughNodes",
            Reason::NoGpuCapacity { .. } => "NoGpuCapacity",
            Reason::Evicted { .. } => "Evicted",
            Reason::CacheFull { .. } => "CacheFull",
        }
    }
}

impl Addition {
    /// For a GPU replica: which GPUs it gets and why the nodes tried before were skipped, as
    /// `GPU(s) 0, 1 (most free GPU memory); skipped node a: no GPU`. Empty for a CPU replica.
    pub fn gpu_note(&self) -> String {
        if self.gpus.is_empty() {
            return String::new();
        }
        let list: Vec<String> = self.gpus.iter().map(u32::to_string).collect();
        let mut note = format!(
            "GPU(s) {} (most free GPU memory on the node)",
            list.join(", ")
        );
        if !self.skipped.is_empty() {
            note.push_str("; skipped ");
            note.push_str(&self.skipped.join("; "));
        }
        note
    }

    /// The reason in words, with the GPU note and the replicas evicted for it, when there are.
    pub fn explanation(&self) -> String {
        let mut out = self.reason.to_string();
        let note = self.gpu_note();
        if !note.is_empty() {
            out.push_str("; ");
            out.push_str(&note);
        }
        if !self.evicted.is_empty() {
            let names: Vec<String> = self
                .evicted
                .iter()
                .map(|e| format!("{} v{} (replica {})", e.model, e.version, e.replica))
                .collect();
            out.push_str(&format!(
                "; placed after evicting {} (least recently used, idle)",
                names.join(", ")
            ));
        }
        out
    }
}

impl Plan {
    /// The part of the plan that concerns one model (all versions). Removals are kept when the
    /// caller's `replica_model` maps their replica id to this model.
    pub fn for_model(&self, model: &str, replica_model: impl Fn(u64) -> Option<String>) -> Plan {
        Plan {
            add: self
                .add
                .iter()
                .filter(|a| a.model == model)
                .cloned()
                .collect(),
            remove: self
                .remove
                .iter()
                .filter(|r| replica_model(r.replica).as_deref() == Some(model))
                .cloned()
                .collect(),
            unplaced: self
                .unplaced
                .iter()
                .filter(|u| u.model == model)
                .cloned()
                .collect(),
        }
    }

    /// One line per decision, e.g. `add resnet50 v1 on node-b: new model version: ...` (a GPU
    /// replica's line ends with its GPUs and the nodes skipped: [`Addition::gpu_note`]).
    pub fn explain(&self) -> Vec<String> {
        let adds = self.add.iter().map(|a| {
            format!(
                "add {} v{} on {}: {}",
                a.model,
                a.version,
                a.node,
                a.explanation()
            )
        });
        let removes = self
            .remove
            .iter()
            .map(|r| format!("remove replica {}: {}", r.replica, r.reason));
        let unplaced = self.unplaced.iter().map(|u| {
            format!(
                "unplaced {} replica(s) of {} v{}: {}",
                u.missing, u.model, u.version, u.reason
            )
        });
        adds.chain(removes).chain(unplaced).collect()
    }
}
