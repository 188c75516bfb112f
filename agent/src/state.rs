//! The worker's local mirror of the cluster state, built from the control plane's watch stream.
//!
//! ```text
//! WatchEvent{revision, snapshot} ─► replace everything
//! WatchEvent{revision, delta}    ─► upsert whole entities, delete keys (idempotent)
//! ```
//!
//! After a disconnect the agent resumes the watch from [`ClusterMirror::revision`]; a control
//! plane that cannot serve deltas from there answers with a snapshot, which replaces the mirror.

use std::collections::BTreeMap;

use nereid_proto::pb::cluster::{
    Model, Node, Replica, StateDelta, StateSnapshot, WatchEvent, watch_event,
};

/// What the worker knows of the cluster: models, nodes and replicas, at `revision`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClusterMirror {
    /// The revision of the last event applied; 0 before the first snapshot.
    pub revision: u64,
    /// Whether a snapshot was applied (deltas before one are ignored: nothing to apply them to).
    pub synced: bool,
    pub models: BTreeMap<String, Model>,
    pub nodes: BTreeMap<String, Node>,
    pub replicas: BTreeMap<u64, Replica>,
}

impl ClusterMirror {
    /// Applies one watch event. Returns whether the mirror changed its contents or revision.
    pub fn apply(&mut self, event: &WatchEvent) -> bool {
        let before_revision = self.revision;
        match &event.event {
            Some(watch_event::Event::Snapshot(s)) => {
                let changed = self.replace(s);
                self.revision = event.revision;
                self.synced = true;
                changed || before_revision != self.revision
            }
            Some(watch_event::Event::Delta(d)) => {
                if !self.synced {
                    return false;
                }
                let changed = self.apply_delta(d);
                self.revision = self.revision.max(event.revision);
                changed || before_revision != self.revision
            }
            None => {
                // A bare revision bump (keep-alive): nothing else to apply.
                if self.synced {
                    self.revision = self.revision.max(event.revision);
                }
                before_revision != self.revision
            }
        }
    }

    fn replace(&mut self, s: &StateSnapshot) -> bool {
        let models: BTreeMap<String, Model> = s
            .models
            .iter()
            .map(|m| (m.name.clone(), m.clone()))
            .collect();
        let nodes: BTreeMap<String, Node> =
            s.nodes.iter().map(|n| (n.id.clone(), n.clone())).collect();
        let replicas: BTreeMap<u64, Replica> =
            s.replicas.iter().map(|r| (r.id, r.clone())).collect();
        let changed = models != self.models || nodes != self.nodes || replicas != self.replicas;
        self.models = models;
        self.nodes = nodes;
        self.replicas = replicas;
        changed
    }

    fn apply_delta(&mut self, d: &StateDelta) -> bool {
        let mut changed = false;
        for m in &d.upserted_models {
            changed |= self.models.insert(m.name.clone(), m.clone()).as_ref() != Some(m);
        }
        for name in &d.deleted_models {
            changed |= self.models.remove(name).is_some();
        }
        for n in &d.upserted_nodes {
            changed |= self.nodes.insert(n.id.clone(), n.clone()).as_ref() != Some(n);
        }
        for id in &d.deleted_nodes {
            changed |= self.nodes.remove(id).is_some();
        }
        for r in &d.upserted_replicas {
            changed |= self.replicas.insert(r.id, r.clone()).as_ref() != Some(r);
        }
        for id in &d.deleted_replicas {
            changed |= self.replicas.remove(id).is_some();
        }
        changed
    }

    /// The replicas placed on `node`, by id.
    pub fn replicas_on<'a>(&'a self, node: &'a str) -> impl Iterator<Item = &'a Replica> + 'a {
        self.replicas.values().filter(move |r| r.node == node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replica(id: u64, model: &str, node: &str, state: i32) -> Replica {
        Replica {
            id,
            model: model.into(),
            version: 1,
            node: node.into(),
            state,
            ..Default::default()
        }
    }

    fn model(name: &str) -> Model {
        Model {
            name: name.into(),
            source: format!("file:///m/{name}"),
            ..Default::default()
        }
    }

    fn snapshot(revision: u64, models: Vec<Model>, replicas: Vec<Replica>) -> WatchEvent {
        WatchEvent {
            revision,
            event: Some(watch_event::Event::Snapshot(StateSnapshot {
                models,
                nodes: vec![],
                replicas,
            })),
        }
    }

    fn delta(revision: u64, d: StateDelta) -> WatchEvent {
        WatchEvent {
            revision,
            event: Some(watch_event::Event::Delta(d)),
        }
    }

    #[test]
    fn snapshot_replaces_everything() {
        let mut m = ClusterMirror::default();
        assert!(m.apply(&snapshot(
            3,
            vec![model("a")],
            vec![replica(1, "a", "n1", 1)]
        )));
        assert_eq!(m.revision, 3);
        assert!(m.synced);
        assert!(m.apply(&snapshot(
            7,
            vec![model("b")],
            vec![replica(2, "b", "n1", 1)]
        )));
        assert_eq!(m.revision, 7);
        assert_eq!(m.models.keys().collect::<Vec<_>>(), vec!["b"]);
        assert_eq!(m.replicas.keys().collect::<Vec<_>>(), vec![&2]);
    }

    #[test]
    fn deltas_upsert_and_delete_idempotently() {
        let mut m = ClusterMirror::default();
        m.apply(&snapshot(
            1,
            vec![model("a")],
            vec![replica(1, "a", "n1", 1)],
        ));
        let d = StateDelta {
            upserted_models: vec![model("b")],
            upserted_replicas: vec![replica(1, "a", "n1", 3), replica(2, "b", "n2", 1)],
            deleted_models: vec!["a".into()],
            ..Default::default()
        };
        assert!(m.apply(&delta(2, d.clone())));
        let once = m.clone();
        // Applying the same delta again changes nothing.
        assert!(!m.apply(&delta(2, d)));
        assert_eq!(m, once);
        assert_eq!(m.replicas[&1].state, 3);
        assert_eq!(m.models.keys().collect::<Vec<_>>(), vec!["b"]);
        assert!(m.apply(&delta(
            3,
            StateDelta {
                deleted_replicas: vec![1, 99],
                ..Default::default()
            }
        )));
        assert_eq!(m.replicas.keys().collect::<Vec<_>>(), vec![&2]);
        assert_eq!(m.revision, 3);
        assert_eq!(m.replicas_on("n2").count(), 1);
        assert_eq!(m.replicas_on("n1").count(), 0);
    }

    #[test]
    fn deltas_before_a_snapshot_are_ignored() {
        let mut m = ClusterMirror::default();
        let d = StateDelta {
            upserted_models: vec![model("a")],
            ..Default::default()
        };
        assert!(!m.apply(&delta(5, d)));
        assert_eq!(m, ClusterMirror::default());
    }

    #[test]
    fn revision_never_goes_back_on_a_stale_delta() {
        let mut m = ClusterMirror::default();
        m.apply(&snapshot(10, vec![], vec![]));
        m.apply(&delta(4, StateDelta::default()));
        assert_eq!(m.revision, 10);
    }
}
