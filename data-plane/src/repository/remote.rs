//! Object-store repositories seen as local directories.
//!
//! ```text
//! --model-repository s3://b/p ─► mirror_repository(url, cache) ─► <cache>/<slug>/ (a local
//!                                  repository, registered here with its Mirror)
//! manager scan (startup, poll tick, explicit load) ─► sync(repositories, only)
//!     ─► for each registered mirror: list the store, download what changed ─► scan as usual
//! ```
//!
//! The manager keeps working on directories: a registered directory is brought up to date
//! from its store before each scan that needs it. Poll mode lists the whole store each tick
//! (new, changed and deleted versions change the directory, so the usual fingerprints see
//! them); an explicit load syncs the one model it loads. The registry is process-wide and
//! keyed by the cache directory, so every component handed that directory gets the same
//! mirror.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock};

use nereid_proto::ServiceError;
use nereid_remote_repository::{Mirror, RemoteError, Scope};
use parking_lot::RwLock;

static MIRRORS: LazyLock<RwLock<BTreeMap<PathBuf, Arc<Mirror>>>> =
    LazyLock::new(|| RwLock::new(BTreeMap::new()));

/// Turns an object-store repository URL into the local directory the scanner reads, kept in
/// `cache_root`. Nothing is downloaded yet: the first scan does that. The same URL and cache
/// give the same directory and mirror again.
pub fn mirror_repository(url: &str, cache_root: &Path) -> Result<PathBuf, RemoteError> {
    let mirror = Arc::new(Mirror::open(url, cache_root)?);
    let local = mirror.local_dir().to_path_buf();
    std::fs::create_dir_all(&local).map_err(|source| RemoteError::Io {
        path: local.clone(),
        source,
    })?;
    MIRRORS.write().entry(local.clone()).or_insert(mirror);
    Ok(local)
}

/// The local folder of the model a URL names (`s3://bucket/repo/model`, a deploy's source),
/// downloaded or brought up to date into `cache_root` first.
pub async fn fetch_model(url: &str, cache_root: &Path) -> Result<PathBuf, String> {
    let (repository, model) =
        nereid_remote_repository::RepositoryUrl::split_model(url).map_err(|e| e.to_string())?;
    let local = mirror_repository(&repository, cache_root).map_err(|e| e.to_string())?;
    sync(std::slice::from_ref(&local), Some(&model))
        .await
        .map_err(|e| e.into_message())?;
    let dir = local.join(&model);
    if !dir.is_dir() {
        return Err(format!("source '{url}': the store has no objects under it"));
    }
    Ok(dir)
}

fn mirror_of(dir: &Path) -> Option<Arc<Mirror>> {
    MIRRORS.read().get(dir).cloned()
}

/// Brings the mirrored ones among `repositories` up to date: every model when `only` is
/// `None` (a model that fails to download is logged and keeps its old copy), else the one
/// model (its failure is the error). A store that cannot be listed is an error either way.
pub async fn sync(repositories: &[PathBuf], only: Option<&str>) -> Result<(), ServiceError> {
    for dir in repositories {
        let Some(mirror) = mirror_of(dir) else {
            continue;
        };
        let scope = match only {
            Some(model) => Scope::Model(model),
            None => Scope::All,
        };
        let url = &mirror.url().original;
        let report = mirror
            .sync(scope)
            .await
            .map_err(|e| ServiceError::internal(format!("model repository '{url}': {e}")))?;
        for (model, error) in report.failed {
            tracing::error!(model = %model, repository = %url, error = %error,
                "model not updated from the object store; its local copy is unchanged");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mirrored_url_is_a_registered_local_directory() {
        let cache = tempfile::tempdir().unwrap();
        let dir = mirror_repository("s3://127.0.0.1:9/bucket/repo", cache.path()).unwrap();
        assert!(dir.starts_with(cache.path()) && dir.is_dir());
        assert!(mirror_of(&dir).is_some());
        assert!(mirror_of(cache.path()).is_none());
        let err = mirror_repository("s3://", cache.path()).unwrap_err();
        assert!(err.to_string().contains("no bucket"), "{err}");
    }
}
