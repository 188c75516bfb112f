//! The agent's decision core, pure: from the watched cluster state and what this node has
//! loaded, what to load, unload and report next. No I/O; the agent runs the [`Plan`].
//!
//! ```text
//! replicas on this node ─┬─ live (Pending, Loading, Ready) ─► per model: the union of versions
//!                        │      ─► differs from the last load of the model? ─► Load{model, versions}
//!                        │      ─► settled: version served ─► report Ready, else Failed{reason}
//!                        └─ Unloading ─► version no longer served ─► report unloaded
//! models loaded here with no live replica ─► Unload{model}
//! ```
//!
//! One data-plane model per model name; its versions are those of its live replicas here, loaded
//! with a `specific` version policy. A model is never loaded unless a replica of it is placed on
//! this node. Loads and unloads run one at a time ([`Local::busy`]); reports are deduplicated
//! against what was sent while the watch has not caught up yet ([`Local::sent`]).
//!
//! GPUs: a replica placed on GPU indices of this node ([`Replica::gpus`], decided by the control
//! plane's placement) adds them to its model's [`LoadSpec::gpus`]; a change of assignment is a
//! change of the load, so the model is loaded again. The load places the model's `KIND_GPU`
//! instance groups on exactly those indices (`source::load_config`).
//!
//! [`Replica::gpus`]: nereid_proto::pb::cluster::Replica::gpus

use std::collections::{BTreeMap, BTreeSet};

use nereid_proto::pb::cluster::ReplicaState;

use super::state::ClusterMirror;

/// What a model is loaded from: the model spec's source and config override.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadSpec {
    pub versions: BTreeSet<i64>,
    /// `file:///abs/path` of a Triton-layout model directory.
    pub source: String,
    /// JSON object merged over the model's config.pbtxt, or empty.
    pub config_override: String,
    /// The GPU indices of this node assigned to the model's live replicas here (the union over
    /// its versions); empty for a model that needs no GPU. Where its instances should run.
    pub gpus: BTreeSet<u32>,
}

/// A model as this node last loaded it (successfully or not).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LocalModel {
    /// The load that was attempted last.
    pub request: Option<LoadSpec>,
    /// Versions the data plane serves now.
    pub served: BTreeSet<i64>,
    /// Requested versions that did not load, with why.
    pub failures: BTreeMap<i64, String>,
    /// Measured memory per served version (the data plane's figure for its load).
    pub memory: BTreeMap<i64, u64>,
    /// Measured GPU memory per served version, per GPU (growth of device memory used on the
    /// load's GPUs around the load that brought it); 0 without GPUs.
    pub gpu_memory: BTreeMap<i64, u64>,
}

/// A report the agent sends for a replica.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Report {
    Loading,
    Ready {
        memory_bytes: u64,
        /// Per GPU; 0 without GPUs.
        gpu_memory_bytes: u64,
    },
    Failed {
        reason: String,
    },
    /// An UNLOADING replica's version is no longer served.
    Unloaded,
}

impl Report {
    /// Reports of the same kind replace each other (a Ready with another memory figure is not
    /// sent again).
    pub fn same_kind(&self, other: &Report) -> bool {
        std::mem::discriminant(self) == std::mem::discriminant(other)
    }
}

impl Report {
    /// The replica state the control plane records for this report.
    fn resulting_state(&self) -> Option<ReplicaState> {
        match self {
            Report::Loading => Some(ReplicaState::Loading),
            Report::Ready { .. } => Some(ReplicaState::Ready),
            Report::Failed { .. } => Some(ReplicaState::Failed),
            Report::Unloaded => None,
        }
    }
}

/// The last report queued for a replica, and the watched states that our own reports explain
/// (the state seen when the chain of reports began, and the states they lead to): while the
/// watch shows one of those, the control plane has not moved the replica on its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sent {
    pub report: Report,
    pub explained: Vec<ReplicaState>,
}

/// Records that `report` was queued for `replica` while the watch showed `observed`.
pub fn record_sent(local: &mut Local, replica: u64, report: Report, observed: ReplicaState) {
    let mut explained = match local.sent.get(&replica) {
        Some(prev) if prev.explained.contains(&observed) => prev.explained.clone(),
        _ => vec![observed],
    };
    if let Some(s) = report.resulting_state()
        && !explained.contains(&s)
    {
        explained.push(s);
    }
    local.sent.insert(replica, Sent { report, explained });
}

/// Everything the agent knows locally.
#[derive(Clone, Debug, Default)]
pub struct Local {
    pub models: BTreeMap<String, LocalModel>,
    /// A load or unload is running.
    pub busy: bool,
    pub sent: BTreeMap<u64, Sent>,
}

/// A data-plane operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Load { model: String, spec: LoadSpec },
    Unload { model: String },
}

/// What to do now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Reports to queue, in order.
    pub reports: Vec<(u64, Report)>,
    /// The next operation, when none is running.
    pub op: Option<Op>,
}

/// Whether a replica in this state should be served by its node.
pub fn is_live(state: ReplicaState) -> bool {
    matches!(
        state,
        ReplicaState::Pending | ReplicaState::Loading | ReplicaState::Ready
    )
}

/// The load each model assigned to `node` needs: the union of its live replicas' versions (and
/// of their GPUs) and the model's spec. Models whose spec is not known (yet) are left out.
pub fn desired(mirror: &ClusterMirror, node: &str) -> BTreeMap<String, LoadSpec> {
    let mut out: BTreeMap<String, LoadSpec> = BTreeMap::new();
    for r in mirror.replicas_on(node) {
        if !is_live(r.state()) {
            continue;
        }
        let Some(model) = mirror.models.get(&r.model) else {
            continue;
        };
        let entry = out.entry(r.model.clone()).or_insert_with(|| LoadSpec {
            versions: BTreeSet::new(),
            source: model.source.clone(),
            config_override: model.config_override.clone(),
            gpus: BTreeSet::new(),
        });
        entry.versions.insert(r.version);
        entry.gpus.extend(r.gpus.iter().copied());
    }
    out
}

/// The next steps for `node`.
pub fn plan(mirror: &ClusterMirror, node: &str, local: &Local) -> Plan {
    let desired = desired(mirror, node);
    let mut plan = Plan::default();

    if !local.busy {
        // Unloads first: they free memory the loads may need.
        plan.op = local
            .models
            .iter()
            .find(|(name, m)| !desired.contains_key(*name) && m.request.is_some())
            .map(|(name, _)| Op::Unload {
                model: name.clone(),
            })
            .or_else(|| {
                desired
                    .iter()
                    .find(|(name, spec)| {
                        local.models.get(*name).and_then(|m| m.request.as_ref()) != Some(spec)
                    })
                    .map(|(name, spec)| Op::Load {
                        model: name.clone(),
                        spec: spec.clone(),
                    })
            });
    }

    let empty = LocalModel::default();
    for r in mirror.replicas_on(node) {
        let state = r.state();
        let here = local.models.get(&r.model).unwrap_or(&empty);
        let served = here.served.contains(&r.version);
        let wanted = if is_live(state) {
            let Some(spec) = desired.get(&r.model) else {
                continue;
            };
            if here.request.as_ref() != Some(spec) {
                // A load of this model is due: the replica is loading unless its version is
                // already served (a reload for another version keeps it serving).
                (!served).then_some(Report::Loading)
            } else if served {
                Some(Report::Ready {
                    memory_bytes: here.memory.get(&r.version).copied().unwrap_or(0),
                    gpu_memory_bytes: here.gpu_memory.get(&r.version).copied().unwrap_or(0),
                })
            } else {
                Some(Report::Failed {
                    reason: here.failures.get(&r.version).cloned().unwrap_or_else(|| {
                        format!("version {} of model '{}' did not load", r.version, r.model)
                    }),
                })
            }
        } else if state == ReplicaState::Unloading {
            (!served).then_some(Report::Unloaded)
        } else {
            None
        };
        let Some(wanted) = wanted else { continue };
        // While the watch shows a state our own reports explain, the last report decides;
        // otherwise the watched state does.
        let skip = match local.sent.get(&r.id) {
            Some(sent) if sent.explained.contains(&state) => sent.report.same_kind(&wanted),
            _ => matches!(
                (&wanted, state),
                (Report::Loading, ReplicaState::Loading)
                    | (Report::Ready { .. }, ReplicaState::Ready)
            ),
        };
        if !skip {
            plan.reports.push((r.id, wanted));
        }
    }
    plan
}

/// Forgets queued reports of replicas the cluster no longer has.
pub fn forget_gone(local: &mut Local, mirror: &ClusterMirror) {
    local.sent.retain(|id, _| mirror.replicas.contains_key(id));
}

#[cfg(test)]
mod tests {
    use nereid_proto::pb::cluster::{Model, Replica};

    use super::*;

    const NODE: &str = "n1";

    struct World {
        mirror: ClusterMirror,
        local: Local,
    }

    impl World {
        fn new() -> World {
            let mut mirror = ClusterMirror {
                synced: true,
                ..Default::default()
            };
            for name in ["a", "b"] {
                mirror.models.insert(
                    name.into(),
                    Model {
                        name: name.into(),
                        source: format!("file:///models/{name}"),
                        ..Default::default()
                    },
                );
            }
            World {
                mirror,
                local: Local::default(),
            }
        }

        fn replica(&mut self, id: u64, model: &str, version: i64, node: &str, s: ReplicaState) {
            self.mirror.replicas.insert(
                id,
                Replica {
                    id,
                    model: model.into(),
                    version,
                    node: node.into(),
                    state: s as i32,
                    ..Default::default()
                },
            );
        }

        fn set_state(&mut self, id: u64, s: ReplicaState) {
            self.mirror.replicas.get_mut(&id).unwrap().state = s as i32;
        }

        fn plan(&self) -> Plan {
            plan(&self.mirror, NODE, &self.local)
        }

        /// Records the reports of `p` as queued, like the agent does.
        fn send(&mut self, p: &Plan) {
            for (id, report) in &p.reports {
                let observed = self.mirror.replicas[id].state();
                record_sent(&mut self.local, *id, report.clone(), observed);
            }
        }

        /// Runs `op` as if the data plane served `ok` of the requested versions.
        fn finish(&mut self, op: &Op, ok: &[i64], reason: &str) {
            match op {
                Op::Load { model, spec } => {
                    let m = self.local.models.entry(model.clone()).or_default();
                    m.request = Some(spec.clone());
                    m.served = ok.iter().copied().collect();
                    m.memory = ok.iter().map(|v| (*v, 100)).collect();
                    m.failures = spec
                        .versions
                        .iter()
                        .filter(|v| !ok.contains(v))
                        .map(|v| (*v, reason.to_string()))
                        .collect();
                }
                Op::Unload { model } => {
                    self.local.models.remove(model);
                }
            }
        }
    }

    fn load_of(p: &Plan) -> (String, Vec<i64>) {
        match p.op.as_ref().expect("an op") {
            Op::Load { model, spec } => (model.clone(), spec.versions.iter().copied().collect()),
            other => panic!("expected a load, got {other:?}"),
        }
    }

    #[test]
    fn pending_replicas_load_as_one_model_and_become_ready() {
        let mut w = World::new();
        w.replica(1, "a", 1, NODE, ReplicaState::Pending);
        w.replica(2, "a", 2, NODE, ReplicaState::Pending);
        let p = w.plan();
        assert_eq!(load_of(&p), ("a".into(), vec![1, 2]));
        assert_eq!(p.reports, vec![(1, Report::Loading), (2, Report::Loading)]);
        w.send(&p);
        // The watch has not caught up: nothing is reported twice.
        w.local.busy = true;
        assert_eq!(w.plan(), Plan::default());
        w.set_state(1, ReplicaState::Loading);
        w.set_state(2, ReplicaState::Loading);
        assert_eq!(w.plan(), Plan::default());
        let op = p.op.unwrap();
        w.local.busy = false;
        w.finish(&op, &[1, 2], "");
        let p = w.plan();
        assert_eq!(p.op, None);
        let ready = Report::Ready {
            memory_bytes: 100,
            gpu_memory_bytes: 0,
        };
        assert_eq!(p.reports, vec![(1, ready.clone()), (2, ready)]);
        w.send(&p);
        assert!(w.plan().reports.is_empty());
        w.set_state(1, ReplicaState::Ready);
        w.set_state(2, ReplicaState::Ready);
        assert_eq!(w.plan(), Plan::default());
    }

    #[test]
    fn replicas_of_other_nodes_are_never_loaded() {
        let mut w = World::new();
        w.replica(1, "a", 1, "n2", ReplicaState::Pending);
        w.replica(2, "b", 1, "n2", ReplicaState::Ready);
        assert_eq!(w.plan(), Plan::default());
        assert!(desired(&w.mirror, NODE).is_empty());
    }

    #[test]
    fn a_replica_without_a_model_spec_waits() {
        let mut w = World::new();
        w.replica(1, "zzz", 1, NODE, ReplicaState::Pending);
        assert_eq!(w.plan(), Plan::default());
    }

    #[test]
    fn failed_versions_are_reported_with_the_reason_and_not_retried() {
        let mut w = World::new();
        w.replica(1, "a", 1, NODE, ReplicaState::Loading);
        w.replica(2, "a", 2, NODE, ReplicaState::Loading);
        let op = w.plan().op.unwrap();
        w.finish(&op, &[1], "no such version");
        let p = w.plan();
        assert_eq!(p.op, None);
        assert_eq!(
            p.reports,
            vec![
                (
                    1,
                    Report::Ready {
                        memory_bytes: 100,
                        gpu_memory_bytes: 0,
                    }
                ),
                (
                    2,
                    Report::Failed {
                        reason: "no such version".into()
                    }
                )
            ]
        );
        // Once the control plane marks it failed, the model is reloaded without it.
        w.set_state(1, ReplicaState::Ready);
        w.set_state(2, ReplicaState::Failed);
        let p = w.plan();
        assert_eq!(load_of(&p), ("a".into(), vec![1]));
        // Version 1 keeps serving through the reload: no Loading report for it.
        assert!(p.reports.is_empty());
    }

    #[test]
    fn unloading_the_last_replica_unloads_the_model_then_reports_unloaded() {
        let mut w = World::new();
        w.replica(1, "a", 1, NODE, ReplicaState::Ready);
        w.local.models.insert(
            "a".into(),
            LocalModel {
                request: Some(desired(&w.mirror, NODE)["a"].clone()),
                served: [1].into(),
                ..Default::default()
            },
        );
        assert_eq!(w.plan(), Plan::default());
        w.set_state(1, ReplicaState::Unloading);
        let p = w.plan();
        assert_eq!(p.op, Some(Op::Unload { model: "a".into() }));
        assert!(p.reports.is_empty(), "still served: not unloaded yet");
        w.finish(&p.op.unwrap(), &[], "");
        let p = w.plan();
        assert_eq!(
            p,
            Plan {
                reports: vec![(1, Report::Unloaded)],
                op: None
            }
        );
        w.send(&p);
        assert_eq!(w.plan(), Plan::default());
        w.mirror.replicas.remove(&1);
        forget_gone(&mut w.local, &w.mirror);
        assert!(w.local.sent.is_empty());
    }

    #[test]
    fn unloading_one_version_reloads_with_the_rest() {
        let mut w = World::new();
        w.replica(1, "a", 1, NODE, ReplicaState::Ready);
        w.replica(2, "a", 2, NODE, ReplicaState::Unloading);
        w.local.models.insert(
            "a".into(),
            LocalModel {
                request: Some(LoadSpec {
                    versions: [1, 2].into(),
                    source: "file:///models/a".into(),
                    config_override: String::new(),
                    gpus: BTreeSet::new(),
                }),
                served: [1, 2].into(),
                ..Default::default()
            },
        );
        let p = w.plan();
        assert_eq!(load_of(&p), ("a".into(), vec![1]));
        assert!(p.reports.is_empty());
        w.finish(&p.op.unwrap(), &[1], "");
        assert_eq!(w.plan().reports, vec![(2, Report::Unloaded)]);
    }

    #[test]
    fn a_restart_reloads_ready_replicas_and_reports_loading_then_ready() {
        let mut w = World::new();
        w.replica(1, "a", 1, NODE, ReplicaState::Ready);
        w.replica(2, "b", 1, NODE, ReplicaState::Failed);
        let p = w.plan();
        assert_eq!(load_of(&p), ("a".into(), vec![1]));
        assert_eq!(p.reports, vec![(1, Report::Loading)]);
        w.send(&p);
        w.finish(&p.op.unwrap(), &[1], "");
        // The watch still says Ready (the Loading report is not reflected yet): the Ready
        // report follows it at once, and once only.
        let p = w.plan();
        assert_eq!(
            p.reports,
            vec![(
                1,
                Report::Ready {
                    memory_bytes: 100,
                    gpu_memory_bytes: 0,
                }
            )]
        );
        assert_eq!(p.op, None, "a failed replica is not loaded again");
        w.send(&p);
        assert!(w.plan().reports.is_empty());
        w.set_state(1, ReplicaState::Loading);
        assert!(w.plan().reports.is_empty());
        w.set_state(1, ReplicaState::Ready);
        assert!(w.plan().reports.is_empty());
    }

    #[test]
    fn a_changed_spec_reloads() {
        let mut w = World::new();
        w.replica(1, "a", 1, NODE, ReplicaState::Ready);
        let spec = desired(&w.mirror, NODE)["a"].clone();
        w.local.models.insert(
            "a".into(),
            LocalModel {
                request: Some(spec),
                served: [1].into(),
                ..Default::default()
            },
        );
        assert_eq!(w.plan(), Plan::default());
        w.mirror.models.get_mut("a").unwrap().config_override = r#"{"max_batch_size":4}"#.into();
        let p = w.plan();
        assert_eq!(load_of(&p), ("a".into(), vec![1]));
        assert!(p.reports.is_empty());
    }

    #[test]
    fn nothing_runs_while_busy_and_unloads_go_first() {
        let mut w = World::new();
        w.replica(1, "b", 1, NODE, ReplicaState::Pending);
        w.local.models.insert(
            "a".into(),
            LocalModel {
                request: Some(LoadSpec {
                    versions: [1].into(),
                    source: "file:///models/a".into(),
                    config_override: String::new(),
                    gpus: BTreeSet::new(),
                }),
                served: [1].into(),
                ..Default::default()
            },
        );
        assert_eq!(w.plan().op, Some(Op::Unload { model: "a".into() }));
        w.local.busy = true;
        let p = w.plan();
        assert_eq!(p.op, None);
        assert_eq!(p.reports, vec![(1, Report::Loading)]);
    }

    #[test]
    fn a_reset_replica_is_reported_again() {
        let mut w = World::new();
        w.replica(1, "a", 1, NODE, ReplicaState::Loading);
        let op = w.plan().op.unwrap();
        w.finish(&op, &[1], "");
        let p = w.plan();
        w.send(&p);
        assert!(w.plan().reports.is_empty());
        // The control plane put it back to Pending (e.g. after re-registration).
        w.set_state(1, ReplicaState::Pending);
        assert_eq!(
            w.plan().reports,
            vec![(
                1,
                Report::Ready {
                    memory_bytes: 100,
                    gpu_memory_bytes: 0,
                }
            )]
        );
    }

    #[test]
    fn assigned_gpus_reach_the_load_and_a_new_assignment_reloads() {
        let mut w = World::new();
        w.replica(1, "a", 1, NODE, ReplicaState::Pending);
        w.replica(2, "a", 2, NODE, ReplicaState::Pending);
        w.replica(3, "a", 1, "n2", ReplicaState::Pending);
        w.mirror.replicas.get_mut(&1).unwrap().gpus = vec![1];
        w.mirror.replicas.get_mut(&2).unwrap().gpus = vec![0, 1];
        w.mirror.replicas.get_mut(&3).unwrap().gpus = vec![3];
        let p = w.plan();
        let Some(Op::Load { spec, .. }) = &p.op else {
            panic!("{p:?}")
        };
        assert_eq!(spec.gpus, [0, 1].into(), "this node's replicas only");
        let op = p.op.clone().unwrap();
        w.finish(&op, &[1, 2], "");
        assert_eq!(w.plan().op, None, "settled");

        // The control plane re-placed version 2 on GPU 2: the model loads again.
        w.mirror.replicas.get_mut(&2).unwrap().gpus = vec![2];
        let Some(Op::Load { spec, .. }) = w.plan().op else {
            panic!("expected a reload")
        };
        assert_eq!(spec.gpus, [1, 2].into());
    }
}
