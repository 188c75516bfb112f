//! openraft's state machine: the [`ClusterState`] in memory, snapshots in [`Store`].
//!
//! ```text
//!  committed entries ─► apply: Arc::make_mut(state).apply(cmd) ─► responder (leader's caller)
//!                               └► after the batch: watch::send(Arc<ClusterState>)
//!  build_snapshot ─► JSON(state) + meta ─► meta["snapshot"] (fsync) ─► openraft purges the log
//!  install_snapshot ─► replace state, last_applied, membership ─► persist ─► publish
//! ```
//!
//! Only the snapshot is durable: on restart the state is the stored snapshot's, and openraft
//! re-applies the committed entries after it (it knows them from `save_committed`).

use std::io;
use std::io::Cursor;
use std::sync::Arc;

use futures::{Stream, TryStreamExt};
use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::store::{KEY_SNAPSHOT, Store};
use super::types::{LogId, Snapshot, SnapshotData, SnapshotMeta, StoredMembership, TypeConfig};
use crate::state::{Applied, ClusterState};

/// The snapshot as stored: its meta and the serialized state.
#[derive(Serialize, Deserialize)]
pub(crate) struct StoredSnapshot {
    pub(crate) meta: SnapshotMeta,
    pub(crate) data: Vec<u8>,
}

/// The state machine half of the node's storage.
pub struct StateMachineStore {
    store: Store,
    state: Arc<ClusterState>,
    last_applied: Option<LogId>,
    membership: StoredMembership,
    published: watch::Sender<Arc<ClusterState>>,
}

impl StateMachineStore {
    /// Restores the state from the stored snapshot, if any.
    pub(crate) async fn open(
        store: Store,
    ) -> io::Result<(Self, watch::Receiver<Arc<ClusterState>>)> {
        let snapshot: Option<StoredSnapshot> = store.get_meta(KEY_SNAPSHOT).await?;
        let (state, last_applied, membership) = match snapshot {
            Some(snap) => (
                Arc::new(super::store::from_json::<ClusterState>(&snap.data)?),
                snap.meta.last_log_id,
                snap.meta.last_membership,
            ),
            None => (
                Arc::new(ClusterState::new()),
                None,
                StoredMembership::default(),
            ),
        };
        let (published, rx) = watch::channel(state.clone());
        Ok((
            StateMachineStore {
                store,
                state,
                last_applied,
                membership,
                published,
            },
            rx,
        ))
    }
}

/// Builds a snapshot from a frozen copy of the state, off the apply path.
pub struct SnapshotBuilder {
    store: Store,
    state: Arc<ClusterState>,
    last_applied: Option<LogId>,
    membership: StoredMembership,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    type SnapshotData = SnapshotData;

    async fn build_snapshot(&mut self) -> Result<Snapshot, io::Error> {
        let data = super::store::to_json(&*self.state)?;
        let meta = SnapshotMeta {
            last_log_id: self.last_applied,
            last_membership: self.membership.clone(),
        };
        let stored = StoredSnapshot {
            meta: meta.clone(),
            data: data.clone(),
        };
        self.store.put_meta(KEY_SNAPSHOT, &stored).await?;
        Ok(Snapshot {
            meta,
            snapshot: Cursor::new(data),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotData = SnapshotData;
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), io::Error> {
        Ok((self.last_applied, self.membership.clone()))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> Result<(), io::Error>
    where
        Strm: Stream<Item = Result<EntryResponder<TypeConfig>, io::Error>> + Unpin + OptionalSend,
    {
        let mut changed = false;
        while let Some((entry, responder)) = entries.try_next().await? {
            self.last_applied = Some(entry.log_id);
            let unchanged = Ok(Applied {
                revision: self.state.revision(),
                changed: false,
                replica_id: None,
            });
            let response = match entry.payload {
                EntryPayload::Blank => unchanged,
                EntryPayload::Normal(cmd) => {
                    let result = Arc::make_mut(&mut self.state).apply(cmd.0);
                    changed |= matches!(result, Ok(Applied { changed: true, .. }));
                    result
                }
                EntryPayload::Membership(membership) => {
                    self.membership = StoredMembership::new(Some(entry.log_id), membership);
                    unchanged
                }
            };
            if let Some(responder) = responder {
                responder.send(response);
            }
        }
        if changed {
            self.published.send_replace(self.state.clone());
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SnapshotBuilder {
            store: self.store.clone(),
            state: self.state.clone(),
            last_applied: self.last_applied,
            membership: self.membership.clone(),
        }
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: SnapshotData,
    ) -> Result<(), io::Error> {
        let data = snapshot.into_inner();
        let state: ClusterState = super::store::from_json(&data)?;
        let stored = StoredSnapshot {
            meta: meta.clone(),
            data,
        };
        self.store.put_meta(KEY_SNAPSHOT, &stored).await?;
        self.state = Arc::new(state);
        self.last_applied = meta.last_log_id;
        self.membership = meta.last_membership.clone();
        self.published.send_replace(self.state.clone());
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, io::Error> {
        let stored: Option<StoredSnapshot> = self.store.get_meta(KEY_SNAPSHOT).await?;
        Ok(stored.map(|s| Snapshot {
            meta: s.meta,
            snapshot: Cursor::new(s.data),
        }))
    }
}
