//! The routing table: the control plane's state as the router needs it, built from `Watch`
//! events.
//!
//! ```text
//! WatchEvent{revision, snapshot} ─► replace models, nodes, replicas
//! WatchEvent{revision, delta}    ─► upsert whole entities, delete keys (idempotent)
//!                                ─► rebuild the index: (model, version) ─► ready endpoints
//! ```
//!
//! An endpoint is a replica in state READY on a node that is not DOWN and advertises a data-plane
//! gRPC address (its HTTP address is kept too, when it has one). Deltas before the first snapshot are ignored (nothing to apply them to). The
//! table is a value: the service reads it through [`SharedTable`], which swaps in a new version
//! on every event, so requests never wait on the watch.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use nereid_proto::pb::cluster::{
    Model, Node, NodeStatus, Replica, ReplicaState, StateDelta, WatchEvent, watch_event,
};

/// A ready replica and where to reach it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    pub replica: u64,
    pub version: i64,
    /// Shared, not copied: replica choice hands out a copy of its endpoint per request.
    pub node: Arc<str>,
    /// The worker's KServe gRPC address (`host:port`, or a URI).
    pub addr: Arc<str>,
    /// The worker's KServe HTTP address (`host:port`), when it reports one: where an HTTP
    /// pass-through would forward.
    pub http_addr: Option<Arc<str>>,
}

/// What the router knows of the cluster at `revision`.
#[derive(Clone, Debug, Default)]
pub struct RoutingTable {
    revision: u64,
    synced: bool,
    models: BTreeMap<String, Model>,
    nodes: BTreeMap<String, Node>,
    replicas: BTreeMap<u64, Replica>,
    /// Ready endpoints per model and version, by replica id.
    ready: BTreeMap<String, BTreeMap<i64, Vec<Endpoint>>>,
}

impl RoutingTable {
    /// Why `model` cannot be routed when the table does not have it: unknown to the cluster,
    /// or (before the first snapshot) not known yet.
    pub fn missing_model(&self, model: &str) -> crate::error::RouterError {
        if self.synced {
            crate::error::RouterError::UnknownModel {
                model: model.to_string(),
            }
        } else {
            crate::error::RouterError::NoTable
        }
    }

    /// The revision of the last applied event; 0 before the first snapshot.
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// Whether a snapshot was applied.
    pub fn synced(&self) -> bool {
        self.synced
    }

    /// Applies one watch event.
    pub fn apply(&mut self, event: &WatchEvent) {
        match &event.event {
            Some(watch_event::Event::Snapshot(s)) => {
                self.models = s
                    .models
                    .iter()
                    .map(|m| (m.name.clone(), m.clone()))
                    .collect();
                self.nodes = s.nodes.iter().map(|n| (n.id.clone(), n.clone())).collect();
                self.replicas = s.replicas.iter().map(|r| (r.id, r.clone())).collect();
                self.revision = event.revision;
                self.synced = true;
            }
            Some(watch_event::Event::Delta(d)) => {
                if !self.synced {
                    return;
                }
                self.apply_delta(d);
                self.revision = self.revision.max(event.revision);
            }
            None => {
                if self.synced {
                    self.revision = self.revision.max(event.revision);
                }
                return;
            }
        }
        self.reindex();
    }

    fn apply_delta(&mut self, d: &StateDelta) {
        for m in &d.upserted_models {
            self.models.insert(m.name.clone(), m.clone());
        }
        for name in &d.deleted_models {
            self.models.remove(name);
        }
        for n in &d.upserted_nodes {
            self.nodes.insert(n.id.clone(), n.clone());
        }
        for id in &d.deleted_nodes {
            self.nodes.remove(id);
        }
        for r in &d.upserted_replicas {
            self.replicas.insert(r.id, r.clone());
        }
        for id in &d.deleted_replicas {
            self.replicas.remove(id);
        }
    }

    fn reindex(&mut self) {
        let mut ready: BTreeMap<String, BTreeMap<i64, Vec<Endpoint>>> = BTreeMap::new();
        for r in self.replicas.values() {
            if r.state != ReplicaState::Ready as i32 {
                continue;
            }
            let Some(node) = self.nodes.get(&r.node) else {
                continue;
            };
            if node.status == NodeStatus::Down as i32 {
                continue;
            }
            let Some(addresses) = node.addresses.as_ref() else {
                continue;
            };
            if addresses.data_grpc.is_empty() {
                continue;
            }
            let addr = Arc::from(addresses.data_grpc.as_str());
            let http_addr = Some(addresses.data_http.as_str())
                .filter(|a| !a.is_empty())
                .map(Arc::from);
            ready
                .entry(r.model.clone())
                .or_default()
                .entry(r.version)
                .or_default()
                .push(Endpoint {
                    replica: r.id,
                    version: r.version,
                    node: Arc::from(r.node.as_str()),
                    addr,
                    http_addr,
                });
        }
        self.ready = ready;
    }

    /// The registered model, if any.
    pub fn model(&self, name: &str) -> Option<&Model> {
        self.models.get(name)
    }

    /// Registered models, by name.
    pub fn models(&self) -> impl Iterator<Item = &Model> {
        self.models.values()
    }

    /// Whether `version` is one of the model's versions: registered as available, or served by
    /// some replica.
    pub fn has_version(&self, model: &str, version: i64) -> bool {
        self.models
            .get(model)
            .is_some_and(|m| m.available_versions.contains(&version))
            || self
                .replicas
                .values()
                .any(|r| r.model == model && r.version == version)
    }

    /// Every replica, in any state, by id.
    pub fn replicas(&self) -> impl Iterator<Item = &Replica> {
        self.replicas.values()
    }

    /// Every replica of `model`, in any state.
    pub fn replicas_of<'a>(&'a self, model: &'a str) -> impl Iterator<Item = &'a Replica> + 'a {
        self.replicas.values().filter(move |r| r.model == model)
    }

    /// Ready endpoints of one model version (empty when none).
    pub fn ready(&self, model: &str, version: i64) -> &[Endpoint] {
        self.ready
            .get(model)
            .and_then(|v| v.get(&version))
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    /// Versions of `model` with at least one ready endpoint, ascending.
    pub fn ready_versions(&self, model: &str) -> Vec<i64> {
        self.ready
            .get(model)
            .map(|v| v.keys().copied().collect())
            .unwrap_or_default()
    }

    /// The ready endpoint of replica `id`, if it is still ready.
    pub fn endpoint(&self, model: &str, id: u64) -> Option<&Endpoint> {
        self.ready
            .get(model)?
            .values()
            .flatten()
            .find(|e| e.replica == id)
    }

    /// Every distinct worker address with a ready replica.
    pub fn worker_addrs(&self) -> Vec<String> {
        let mut addrs: Vec<String> = self
            .ready
            .values()
            .flat_map(|v| v.values().flatten().map(|e| e.addr.to_string()))
            .collect();
        addrs.sort();
        addrs.dedup();
        addrs
    }
}

/// The table the service reads and the watch task replaces; readers get a consistent version
/// without waiting on writers for longer than a pointer swap. Waiters ([`Self::wait_until`])
/// are woken on every applied event.
#[derive(Debug)]
pub struct SharedTable {
    current: RwLock<Arc<RoutingTable>>,
    changes: tokio::sync::watch::Sender<u64>,
}

impl Default for SharedTable {
    fn default() -> Self {
        SharedTable::new(RoutingTable::default())
    }
}

impl SharedTable {
    /// A shared table that starts with `table`; watchers see its revision as the first value.
    pub fn new(table: RoutingTable) -> SharedTable {
        SharedTable {
            changes: tokio::sync::watch::Sender::new(table.revision()),
            current: RwLock::new(Arc::new(table)),
        }
    }

    /// Waits until `done` holds for the table, at most `limit`; whether it does.
    pub async fn wait_until(&self, limit: Duration, done: impl Fn(&RoutingTable) -> bool) -> bool {
        let mut changes = self.changes.subscribe();
        let wait = async {
            loop {
                if done(&self.load()) {
                    return true;
                }
                if changes.changed().await.is_err() {
                    return false;
                }
            }
        };
        tokio::time::timeout(limit, wait).await.unwrap_or(false)
    }

    /// The table now.
    pub fn load(&self) -> Arc<RoutingTable> {
        match self.current.read() {
            Ok(t) => t.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Applies one event to a copy and publishes it.
    pub fn apply(&self, event: &WatchEvent) {
        let mut next = (*self.load()).clone();
        next.apply(event);
        let revision = next.revision();
        let next = Arc::new(next);
        match self.current.write() {
            Ok(mut t) => *t = next,
            Err(poisoned) => *poisoned.into_inner() = next,
        }
        self.changes.send_replace(revision);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use nereid_proto::pb::cluster::{NodeAddresses, StateSnapshot};

    use super::*;

    pub(crate) fn node(id: &str, addr: &str) -> Node {
        Node {
            id: id.into(),
            addresses: Some(NodeAddresses {
                data_grpc: addr.into(),
                ..Default::default()
            }),
            status: NodeStatus::Up as i32,
            ..Default::default()
        }
    }

    pub(crate) fn replica(id: u64, model: &str, version: i64, node: &str, ready: bool) -> Replica {
        Replica {
            id,
            model: model.into(),
            version,
            node: node.into(),
            state: if ready {
                ReplicaState::Ready as i32
            } else {
                ReplicaState::Loading as i32
            },
            ..Default::default()
        }
    }

    pub(crate) fn model(name: &str, versions: &[i64]) -> Model {
        Model {
            name: name.into(),
            available_versions: versions.to_vec(),
            ..Default::default()
        }
    }

    pub(crate) fn snapshot(
        revision: u64,
        models: Vec<Model>,
        nodes: Vec<Node>,
        replicas: Vec<Replica>,
    ) -> WatchEvent {
        WatchEvent {
            revision,
            event: Some(watch_event::Event::Snapshot(StateSnapshot {
                models,
                nodes,
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

    fn two_node_table() -> RoutingTable {
        let mut t = RoutingTable::default();
        t.apply(&snapshot(
            5,
            vec![model("m", &[1, 2])],
            vec![node("a", "10.0.0.1:8001"), node("b", "10.0.0.2:8001")],
            vec![
                replica(1, "m", 1, "a", true),
                replica(2, "m", 2, "a", true),
                replica(3, "m", 2, "b", true),
                replica(4, "m", 2, "b", false),
            ],
        ));
        t
    }

    #[test]
    fn snapshot_indexes_ready_replicas_with_addresses() {
        let t = two_node_table();
        assert!(t.synced());
        assert_eq!(t.revision(), 5);
        assert_eq!(t.ready_versions("m"), vec![1, 2]);
        let v2: Vec<(u64, &str)> = t
            .ready("m", 2)
            .iter()
            .map(|e| (e.replica, &*e.addr))
            .collect();
        assert_eq!(v2, vec![(2, "10.0.0.1:8001"), (3, "10.0.0.2:8001")]);
        assert!(t.ready("m", 3).is_empty());
        assert!(t.has_version("m", 1) && !t.has_version("m", 7));
        assert_eq!(t.endpoint("m", 3).map(|e| &*e.node), Some("b"));
        assert_eq!(t.worker_addrs(), vec!["10.0.0.1:8001", "10.0.0.2:8001"]);
    }

    #[test]
    fn endpoints_carry_the_http_address_when_the_worker_reports_one() {
        let mut with_http = node("a", "10.0.0.1:8001");
        if let Some(a) = with_http.addresses.as_mut() {
            a.data_http = "10.0.0.1:8000".into();
        }
        let mut t = RoutingTable::default();
        t.apply(&snapshot(
            1,
            vec![model("m", &[1])],
            vec![with_http, node("b", "10.0.0.2:8001")],
            vec![replica(1, "m", 1, "a", true), replica(2, "m", 1, "b", true)],
        ));
        let http: Vec<(u64, Option<&str>)> = t
            .ready("m", 1)
            .iter()
            .map(|e| (e.replica, e.http_addr.as_deref()))
            .collect();
        assert_eq!(http, vec![(1, Some("10.0.0.1:8000")), (2, None)]);
    }

    #[test]
    fn deltas_upsert_and_delete_and_are_idempotent() {
        let mut t = two_node_table();
        let d = StateDelta {
            upserted_replicas: vec![replica(4, "m", 2, "b", true)],
            deleted_replicas: vec![2],
            ..Default::default()
        };
        t.apply(&delta(6, d.clone()));
        t.apply(&delta(6, d));
        assert_eq!(t.revision(), 6);
        let ids: Vec<u64> = t.ready("m", 2).iter().map(|e| e.replica).collect();
        assert_eq!(ids, vec![3, 4]);
        t.apply(&delta(
            7,
            StateDelta {
                deleted_models: vec!["m".into()],
                ..Default::default()
            },
        ));
        assert!(t.model("m").is_none());
    }

    #[test]
    fn down_or_unknown_nodes_and_missing_addresses_are_not_routable() {
        let mut t = two_node_table();
        let mut down = node("b", "10.0.0.2:8001");
        down.status = NodeStatus::Down as i32;
        t.apply(&delta(
            6,
            StateDelta {
                upserted_nodes: vec![down],
                ..Default::default()
            },
        ));
        assert_eq!(t.ready("m", 2).len(), 1);
        t.apply(&delta(
            7,
            StateDelta {
                upserted_nodes: vec![node("b", "")],
                deleted_nodes: vec!["a".into()],
                ..Default::default()
            },
        ));
        assert!(t.ready_versions("m").is_empty());
    }

    #[test]
    fn deltas_before_a_snapshot_are_ignored_and_a_snapshot_replaces() {
        let mut t = RoutingTable::default();
        t.apply(&delta(
            3,
            StateDelta {
                upserted_models: vec![model("x", &[1])],
                ..Default::default()
            },
        ));
        assert!(!t.synced() && t.model("x").is_none() && t.revision() == 0);
        let mut t = two_node_table();
        t.apply(&snapshot(9, vec![], vec![], vec![]));
        assert_eq!(t.revision(), 9);
        assert!(t.model("m").is_none() && t.ready_versions("m").is_empty());
    }

    #[test]
    fn shared_table_publishes_new_versions() {
        let shared = SharedTable::default();
        let before = shared.load();
        shared.apply(&snapshot(2, vec![model("m", &[1])], vec![], vec![]));
        assert!(!before.synced());
        assert_eq!(shared.load().revision(), 2);
    }
}
