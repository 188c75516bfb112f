//! openraft's log storage over [`Store`]: entries, vote, committed and purged log ids.
//!
//! `append` commits its transaction (fsync) and only then reports the IO complete, so an entry
//! openraft counts as durable is on disk. `purge` records the last purged id and deletes the
//! entries up to it in the same transaction.

use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};

use openraft::entry::RaftEntry;
use openraft::storage::{IOFlushed, LogState, RaftLogStorage};
use openraft::{OptionalSend, RaftLogReader};

use super::store::{
    self, KEY_COMMITTED, KEY_LAST_PURGED, KEY_VOTE, LOG, META, Store, from_json, to_json,
};
use super::types::{Entry, LogId, TypeConfig, Vote};

/// The log half of the node's storage; clones share the database.
#[derive(Clone)]
pub struct LogStore {
    store: Store,
}

impl LogStore {
    pub(crate) fn new(store: Store) -> Self {
        LogStore { store }
    }
}

fn owned_bound(b: Bound<&u64>) -> Bound<u64> {
    match b {
        Bound::Included(i) => Bound::Included(*i),
        Bound::Excluded(i) => Bound::Excluded(*i),
        Bound::Unbounded => Bound::Unbounded,
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, io::Error> {
        let range = (
            owned_bound(range.start_bound()),
            owned_bound(range.end_bound()),
        );
        self.store
            .blocking(move |db| {
                let txn = db.begin_read().map_err(io::Error::other)?;
                let table = txn.open_table(LOG).map_err(io::Error::other)?;
                let mut entries = Vec::new();
                for item in table.range::<u64>(range).map_err(io::Error::other)? {
                    let (_, v) = item.map_err(io::Error::other)?;
                    entries.push(from_json::<Entry>(v.value())?);
                }
                Ok(entries)
            })
            .await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        self.store.get_meta(KEY_VOTE).await
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, io::Error> {
        self.store
            .blocking(|db| {
                let last_purged: Option<LogId> = store::read_meta(db, KEY_LAST_PURGED)?;
                let last: Option<Entry> = store::last_log_entry(db)?;
                let last_log_id = last.map(|e| e.log_id()).or(last_purged);
                Ok(LogState {
                    last_purged_log_id: last_purged,
                    last_log_id,
                })
            })
            .await
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), io::Error> {
        self.store.put_meta(KEY_VOTE, vote).await
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), io::Error> {
        self.store.put_meta(KEY_COMMITTED, &committed).await
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, io::Error> {
        Ok(self
            .store
            .get_meta::<Option<LogId>>(KEY_COMMITTED)
            .await?
            .flatten())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: IOFlushed<TypeConfig>,
    ) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut rows = Vec::new();
        for entry in entries {
            rows.push((entry.log_id().index, to_json(&entry)?));
        }
        let result = self
            .store
            .blocking(move |db| {
                let txn = db.begin_write().map_err(io::Error::other)?;
                {
                    let mut table = txn.open_table(LOG).map_err(io::Error::other)?;
                    for (index, bytes) in &rows {
                        table
                            .insert(*index, bytes.as_slice())
                            .map_err(io::Error::other)?;
                    }
                }
                txn.commit().map_err(io::Error::other)
            })
            .await;
        match result {
            Ok(()) => {
                callback.io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.io_completed(Err(io::Error::new(e.kind(), e.to_string())));
                Err(e)
            }
        }
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> Result<(), io::Error> {
        let from = last_log_id.map_or(0, |id| id.index + 1);
        self.store
            .blocking(move |db| {
                let txn = db.begin_write().map_err(io::Error::other)?;
                {
                    let mut table = txn.open_table(LOG).map_err(io::Error::other)?;
                    table
                        .retain_in(from.., |_, _| false)
                        .map_err(io::Error::other)?;
                }
                txn.commit().map_err(io::Error::other)
            })
            .await
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), io::Error> {
        let bytes = to_json(&log_id)?;
        let upto = log_id.index;
        self.store
            .blocking(move |db| {
                let txn = db.begin_write().map_err(io::Error::other)?;
                {
                    let mut meta = txn.open_table(META).map_err(io::Error::other)?;
                    meta.insert(KEY_LAST_PURGED, bytes.as_slice())
                        .map_err(io::Error::other)?;
                    let mut table = txn.open_table(LOG).map_err(io::Error::other)?;
                    table
                        .retain_in(..=upto, |_, _| false)
                        .map_err(io::Error::other)?;
                }
                txn.commit().map_err(io::Error::other)
            })
            .await
    }
}
