//! The one redb database a node keeps at `<data_dir>/raft.redb`, shared by the log store and
//! the state machine.
//!
//! ```text
//!  raft.redb
//!   ├─ log   : u64 index ─► JSON entry
//!   └─ meta  : "vote" | "committed" | "last_purged" | "snapshot" ─► JSON value
//! ```
//!
//! Every write is one transaction committed with redb's default (immediate, fsync) durability
//! before the caller is told it happened. redb calls block, so they run on tokio's blocking
//! pool.

use std::io;
use std::path::Path;
use std::sync::Arc;

use redb::{Database, ReadableTable, TableDefinition};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::oneshot;

pub(crate) const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");
pub(crate) const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");

pub(crate) const KEY_VOTE: &str = "vote";
pub(crate) const KEY_COMMITTED: &str = "committed";
pub(crate) const KEY_LAST_PURGED: &str = "last_purged";
pub(crate) const KEY_SNAPSHOT: &str = "snapshot";

/// A handle on the database; cheap to clone. The file closes when the last clone is dropped.
#[derive(Clone)]
pub(crate) struct Store {
    db: Arc<OpenDb>,
}

struct OpenDb {
    db: Database,
    /// Dropped with the database: wakes whoever waits for the file to be closed.
    _closed: oneshot::Sender<()>,
}

/// Resolves once every [`Store`] clone is gone and `raft.redb` is closed.
pub(crate) type Closed = oneshot::Receiver<()>;

impl Store {
    /// Opens (or creates) `<dir>/raft.redb` and makes sure both tables exist.
    pub(crate) fn open(dir: &Path) -> io::Result<(Self, Closed)> {
        std::fs::create_dir_all(dir)?;
        let db = Database::create(dir.join("raft.redb")).map_err(io::Error::other)?;
        let txn = db.begin_write().map_err(io::Error::other)?;
        {
            txn.open_table(LOG).map_err(io::Error::other)?;
            txn.open_table(META).map_err(io::Error::other)?;
        }
        txn.commit().map_err(io::Error::other)?;
        let (tx, closed) = oneshot::channel();
        let store = Store {
            db: Arc::new(OpenDb { db, _closed: tx }),
        };
        Ok((store, closed))
    }

    /// Runs `f` on tokio's blocking pool with the database.
    pub(crate) async fn blocking<T, F>(&self, f: F) -> io::Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Database) -> io::Result<T> + Send + 'static,
    {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || f(&db.db))
            .await
            .map_err(io::Error::other)?
    }

    /// Reads one JSON value of the meta table.
    pub(crate) async fn get_meta<T>(&self, key: &'static str) -> io::Result<Option<T>>
    where
        T: DeserializeOwned + Send + 'static,
    {
        self.blocking(move |db| read_meta(db, key)).await
    }

    /// Writes one JSON value of the meta table, durably.
    pub(crate) async fn put_meta<T: Serialize>(
        &self,
        key: &'static str,
        value: &T,
    ) -> io::Result<()> {
        let bytes = to_json(value)?;
        self.blocking(move |db| {
            let txn = db.begin_write().map_err(io::Error::other)?;
            {
                let mut table = txn.open_table(META).map_err(io::Error::other)?;
                table
                    .insert(key, bytes.as_slice())
                    .map_err(io::Error::other)?;
            }
            txn.commit().map_err(io::Error::other)
        })
        .await
    }
}

pub(crate) fn read_meta<T: DeserializeOwned>(db: &Database, key: &str) -> io::Result<Option<T>> {
    let txn = db.begin_read().map_err(io::Error::other)?;
    let table = txn.open_table(META).map_err(io::Error::other)?;
    match table.get(key).map_err(io::Error::other)? {
        Some(v) => Ok(Some(from_json(v.value())?)),
        None => Ok(None),
    }
}

pub(crate) fn to_json<T: Serialize>(value: &T) -> io::Result<Vec<u8>> {
    serde_json::to_vec(value).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

pub(crate) fn from_json<T: DeserializeOwned>(bytes: &[u8]) -> io::Result<T> {
    serde_json::from_slice(bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Last index in the log table, if any.
pub(crate) fn last_log_entry<T: DeserializeOwned>(db: &Database) -> io::Result<Option<T>> {
    let txn = db.begin_read().map_err(io::Error::other)?;
    let table = txn.open_table(LOG).map_err(io::Error::other)?;
    match table.last().map_err(io::Error::other)? {
        Some((_, v)) => Ok(Some(from_json(v.value())?)),
        None => Ok(None),
    }
}
