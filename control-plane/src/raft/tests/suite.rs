//! openraft's `testing::log::Suite` against the redb store: each case gets a fresh tempdir.

use openraft::StorageError;
use openraft::testing::log::{StoreBuilder, Suite};
use openraft::type_config::TypeConfigExt;
use tempfile::TempDir;

use super::super::log_store::LogStore;
use super::super::state_machine::StateMachineStore;
use super::super::store::Store;
use super::super::types::TypeConfig;

struct RedbBuilder;

fn sto(e: &std::io::Error) -> StorageError<TypeConfig> {
    StorageError::read(TypeConfig::err_from_error(e))
}

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, TempDir> for RedbBuilder {
    async fn build(
        &self,
    ) -> Result<(TempDir, LogStore, StateMachineStore), StorageError<TypeConfig>> {
        let dir = TempDir::new().map_err(|e| sto(&e))?;
        let (store, _closed) = Store::open(dir.path()).map_err(|e| sto(&e))?;
        let (sm, _rx) = StateMachineStore::open(store.clone())
            .await
            .map_err(|e| sto(&e))?;
        Ok((dir, LogStore::new(store), sm))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redb_store_passes_openraft_storage_suite() {
    Suite::test_all(RedbBuilder).await.expect("storage suite");
}
