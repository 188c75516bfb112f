//! A local mirror of an object-store repository: listing, staged downloads, atomic commits.
//!
//! ```text
//! <cache>/<slug>/                 the mirror: an ordinary Triton repository
//!   <model>/config.pbtxt
//!   <model>/<n>/...
//!   .nereid-mirror/<model>.json   per unit, the files (size, etag, last-modified) last synced
//!   .nereid-staging/<model>-<id>/ downloads in progress (removed when the sync ends)
//! ```
//!
//! A model's changed units are all downloaded (each file's size checked against the
//! listing) before any is renamed into place, so a scan never sees half a version and a
//! failed download leaves the model exactly as it was: its old versions keep serving.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::StreamExt;
use object_store::ObjectStore;
use object_store::path::Path as ObjectPath;
use tokio::io::AsyncWriteExt;

use crate::RemoteError;
use crate::plan::{self, FILES, FileSig, Units};
use crate::store;
use crate::url::RepositoryUrl;

const STATE_DIR: &str = ".nereid-mirror";
const STAGING_DIR: &str = ".nereid-staging";

/// Distinguishes the staging folders of syncs in one process.
static STAGING_SEQ: AtomicU64 = AtomicU64::new(0);

/// What a sync covers.
#[derive(Clone, Copy, Debug)]
pub enum Scope<'a> {
    /// Every model under the repository prefix; local models the store no longer has are
    /// removed. A model that fails to download is reported and left as it was.
    All,
    /// One model (an explicit load); its failure is the sync's error.
    Model(&'a str),
}

/// What a sync changed.
#[derive(Debug, Default)]
pub struct SyncReport {
    /// Models with a unit downloaded or deleted.
    pub updated: Vec<String>,
    /// Models removed because the store no longer has them.
    pub removed: Vec<String>,
    /// Models left as they were because a download failed (scope `All` only).
    pub failed: Vec<(String, RemoteError)>,
}

/// A remote repository and its local copy.
pub struct Mirror {
    store: Arc<dyn ObjectStore>,
    url: RepositoryUrl,
    local: PathBuf,
    /// One sync at a time per mirror.
    lock: tokio::sync::Mutex<()>,
}

impl Mirror {
    /// Opens the store `url` names (credentials from the environment); the copy lives in
    /// `<cache_root>/<slug of the URL>`.
    pub fn open(url: &str, cache_root: &Path) -> Result<Mirror, RemoteError> {
        let url = RepositoryUrl::parse(url)?;
        let store = store::open(&url)?;
        let local = cache_root.join(slug(&url.original));
        Ok(Mirror::with_store(store, url, local))
    }

    /// A mirror of `url` read through `store`, kept in `local`.
    pub fn with_store(store: Arc<dyn ObjectStore>, url: RepositoryUrl, local: PathBuf) -> Mirror {
        Mirror {
            store,
            url,
            local,
            lock: tokio::sync::Mutex::new(()),
        }
    }

    /// The local repository directory the scanner reads.
    pub fn local_dir(&self) -> &Path {
        &self.local
    }

    /// The repository URL this mirror copies from.
    pub fn url(&self) -> &RepositoryUrl {
        &self.url
    }

    /// Brings the local copy up to date with the store for `scope`. Listing failures
    /// (credentials, a missing bucket, an unreachable endpoint) are errors for every scope.
    pub async fn sync(&self, scope: Scope<'_>) -> Result<SyncReport, RemoteError> {
        let _guard = self.lock.lock().await;
        std::fs::create_dir_all(&self.local).map_err(|e| self.io(&self.local, e))?;
        let listed_prefix = match scope {
            Scope::All => self.url.prefix.clone(),
            Scope::Model(name) => self.url.join(name).prefix,
        };
        let mut models = self.list(&listed_prefix).await?;
        if let Scope::Model(name) = scope {
            models.retain(|model, _| model == name);
        }
        let mut report = SyncReport::default();
        let mut present: BTreeSet<String> = BTreeSet::new();
        for (model, files) in models {
            present.insert(model.clone());
            match self.sync_model(&model, files).await {
                Ok(true) => report.updated.push(model),
                Ok(false) => {}
                Err(e) => match scope {
                    Scope::All => report.failed.push((model, e)),
                    Scope::Model(_) => return Err(e),
                },
            }
        }
        let stale: Vec<String> = match scope {
            Scope::All => self.local_models()?,
            Scope::Model(name) => vec![name.to_string()],
        };
        for model in stale.into_iter().filter(|m| !present.contains(m)) {
            if self.remove_model(&model)? {
                report.removed.push(model);
            }
        }
        Ok(report)
    }

    /// The version folders (positive, no leading zero) under the model folder `model`,
    /// sorted: what a deploy of `<url>/<model>` can serve. Listing failures are classified as
    /// for [`Mirror::sync`].
    pub async fn versions(&self, model: &str) -> Result<Vec<i64>, RemoteError> {
        let prefix = ObjectPath::from(self.url.join(model).prefix.as_str());
        let listed = self
            .store
            .list_with_delimiter(Some(&prefix))
            .await
            .map_err(|e| store::classify_list_error(&self.url, e))?;
        let mut versions: Vec<i64> = listed
            .common_prefixes
            .iter()
            .filter_map(|p| p.filename())
            .filter(|name| !name.starts_with('0'))
            .filter_map(|name| name.parse::<i64>().ok())
            .filter(|v| *v > 0)
            .collect();
        versions.sort_unstable();
        Ok(versions)
    }

    /// Lists `prefix` and groups its objects by model (the first path segment under the
    /// repository prefix).
    async fn list(&self, prefix: &str) -> Result<BTreeMap<String, Vec<FileSig>>, RemoteError> {
        let base = ObjectPath::from(self.url.prefix.as_str());
        let listed = ObjectPath::from(prefix);
        let mut stream = self.store.list((!prefix.is_empty()).then_some(&listed));
        let mut models: BTreeMap<String, Vec<FileSig>> = BTreeMap::new();
        while let Some(meta) = stream.next().await {
            let meta = meta.map_err(|e| store::classify_list_error(&self.url, e))?;
            let Some(parts) = meta.location.prefix_match(&base) else {
                continue;
            };
            let parts: Vec<String> = parts.map(|p| p.as_ref().to_string()).collect();
            let [model, rest @ ..] = parts.as_slice() else {
                continue;
            };
            if rest.is_empty() || model.starts_with('.') || !valid_segments(&parts) {
                continue;
            }
            let tag = format!(
                "{}|{}",
                meta.e_tag.as_deref().unwrap_or(""),
                meta.last_modified.timestamp_millis()
            );
            models.entry(model.clone()).or_default().push(FileSig {
                path: rest.join("/"),
                size: meta.size,
                tag,
            });
        }
        Ok(models)
    }

    /// Syncs one model; `Ok(true)` when something changed on disk.
    async fn sync_model(&self, model: &str, files: Vec<FileSig>) -> Result<bool, RemoteError> {
        let remote = plan::units(files);
        let model_dir = self.local.join(model);
        let recorded = self.read_state(model);
        let local_versions = version_folders(&model_dir);
        let plan = plan::plan(&remote, &recorded, &local_versions, |unit| {
            remote[unit]
                .iter()
                .all(|f| model_dir.join(&f.path).is_file())
        });
        if plan.is_empty() {
            return Ok(false);
        }
        let staging = self.local.join(STAGING_DIR).join(format!(
            "{model}-{}-{}",
            std::process::id(),
            STAGING_SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let result = self
            .stage_and_commit(model, &model_dir, &staging, &remote, &recorded, &plan)
            .await;
        let _ = std::fs::remove_dir_all(&staging);
        result?;
        tracing::info!(model, url = %self.url.original, downloaded = ?plan.download,
            deleted = ?plan.delete, "model mirrored from the object store");
        Ok(true)
    }

    async fn stage_and_commit(
        &self,
        model: &str,
        model_dir: &Path,
        staging: &Path,
        remote: &Units,
        recorded: &Units,
        plan: &plan::ModelPlan,
    ) -> Result<(), RemoteError> {
        // Stage everything first: a failure here leaves the model untouched.
        for unit in &plan.download {
            for file in &remote[unit] {
                let target = staged_unit(staging, unit).join(unit_path(unit, file));
                self.download(model, file, &target).await?;
            }
        }
        std::fs::create_dir_all(model_dir).map_err(|e| self.io(model_dir, e))?;
        for unit in &plan.download {
            if unit == FILES {
                let staged = staged_unit(staging, unit);
                self.commit_files(model_dir, &staged, &remote[unit], recorded)?;
            } else {
                let target = model_dir.join(unit);
                let old = staging.join("replaced");
                std::fs::create_dir_all(&old).map_err(|e| self.io(&old, e))?;
                if target.exists() {
                    let old = old.join(unit);
                    std::fs::rename(&target, &old).map_err(|e| self.io(&target, e))?;
                }
                let staged = staged_unit(staging, unit);
                std::fs::rename(&staged, &target).map_err(|e| self.io(&target, e))?;
            }
        }
        for unit in &plan.delete {
            if unit == FILES {
                self.commit_files(model_dir, &staged_unit(staging, unit), &[], recorded)?;
            } else {
                let dir = model_dir.join(unit);
                if dir.exists() {
                    std::fs::remove_dir_all(&dir).map_err(|e| self.io(&dir, e))?;
                }
            }
        }
        self.write_state(model, remote)
    }

    /// Moves a model's staged non-version files into place and removes the ones the store
    /// no longer has.
    fn commit_files(
        &self,
        model_dir: &Path,
        staged: &Path,
        files: &[FileSig],
        recorded: &Units,
    ) -> Result<(), RemoteError> {
        for file in files {
            let target = model_dir.join(&file.path);
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent).map_err(|e| self.io(parent, e))?;
            }
            std::fs::rename(staged.join(&file.path), &target).map_err(|e| self.io(&target, e))?;
        }
        let kept: BTreeSet<&str> = files.iter().map(|f| f.path.as_str()).collect();
        for old in recorded.get(FILES).into_iter().flatten() {
            if !kept.contains(old.path.as_str()) {
                let _ = std::fs::remove_file(model_dir.join(&old.path));
            }
        }
        Ok(())
    }

    /// Downloads one object into `target`, checking its size against the listing.
    async fn download(
        &self,
        model: &str,
        file: &FileSig,
        target: &Path,
    ) -> Result<(), RemoteError> {
        let key = self.url.join(model).join(&file.path);
        let failed = |message: String| RemoteError::Download {
            object: key.original.clone(),
            message,
        };
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(|e| self.io(parent, e))?;
        }
        let location = ObjectPath::from(key.prefix.as_str());
        let got = self
            .store
            .get(&location)
            .await
            .map_err(|e| failed(e.to_string()))?;
        let mut out = tokio::fs::File::create(target)
            .await
            .map_err(|e| self.io(target, e))?;
        let mut stream = got.into_stream();
        let mut written: u64 = 0;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| failed(format!("interrupted: {e}")))?;
            written += chunk.len() as u64;
            out.write_all(&chunk)
                .await
                .map_err(|e| self.io(target, e))?;
        }
        out.flush().await.map_err(|e| self.io(target, e))?;
        if written != file.size {
            return Err(failed(format!(
                "got {written} bytes, the listing said {}; the object changed or the \
                 transfer was cut",
                file.size
            )));
        }
        Ok(())
    }

    fn state_path(&self, model: &str) -> PathBuf {
        self.local.join(STATE_DIR).join(format!("{model}.json"))
    }

    /// The units the last sync of `model` recorded; empty when none (or unreadable: the
    /// next sync downloads everything again).
    fn read_state(&self, model: &str) -> Units {
        std::fs::read(self.state_path(model))
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default()
    }

    fn write_state(&self, model: &str, units: &Units) -> Result<(), RemoteError> {
        let path = self.state_path(model);
        let dir = self.local.join(STATE_DIR);
        std::fs::create_dir_all(&dir).map_err(|e| self.io(&dir, e))?;
        let tmp = path.with_extension("json.tmp");
        let bytes = serde_json::to_vec(units).map_err(|e| RemoteError::Io {
            path: path.clone(),
            source: std::io::Error::other(e),
        })?;
        std::fs::write(&tmp, bytes).map_err(|e| self.io(&tmp, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| self.io(&path, e))
    }

    /// The model folders of the local copy.
    fn local_models(&self) -> Result<Vec<String>, RemoteError> {
        let entries = std::fs::read_dir(&self.local).map_err(|e| self.io(&self.local, e))?;
        Ok(entries
            .flatten()
            .filter(|e| e.path().is_dir())
            .filter_map(|e| e.file_name().to_str().map(str::to_string))
            .filter(|name| !name.starts_with('.'))
            .collect())
    }

    /// Removes a model's local copy; `Ok(true)` when there was one.
    fn remove_model(&self, model: &str) -> Result<bool, RemoteError> {
        let _ = std::fs::remove_file(self.state_path(model));
        let dir = self.local.join(model);
        if !dir.exists() {
            return Ok(false);
        }
        std::fs::remove_dir_all(&dir).map_err(|e| self.io(&dir, e))?;
        tracing::info!(model, url = %self.url.original, "model removed from the object store");
        Ok(true)
    }

    fn io(&self, path: &Path, source: std::io::Error) -> RemoteError {
        RemoteError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// The version folders of the model folder `url` names (`s3://bucket/repo/model`), listed
/// without downloading anything: what a control plane records for a deploy.
pub async fn model_versions(url: &str) -> Result<Vec<i64>, RemoteError> {
    let (repository, model) = RepositoryUrl::split_model(url)?;
    let repository = RepositoryUrl::parse(&repository)?;
    let store = store::open(&repository)?;
    Mirror::with_store(store, repository, PathBuf::new())
        .versions(&model)
        .await
}

/// Where a unit is downloaded to inside a sync's staging folder.
fn staged_unit(staging: &Path, unit: &str) -> PathBuf {
    if unit == FILES {
        staging.join("files")
    } else {
        staging.join("versions").join(unit)
    }
}

/// A file's path under its unit's folder (version files drop the `<n>/`).
fn unit_path<'a>(unit: &str, file: &'a FileSig) -> &'a str {
    if unit == FILES {
        &file.path
    } else {
        file.path
            .strip_prefix(unit)
            .and_then(|p| p.strip_prefix('/'))
            .unwrap_or(&file.path)
    }
}

/// Whether every segment can be a local file name (no empty, `.` or `..` segment).
fn valid_segments(parts: &[String]) -> bool {
    parts
        .iter()
        .all(|p| !p.is_empty() && p != "." && p != ".." && !p.contains('\\'))
}

/// The numeric folders of a local model folder.
fn version_folders(model_dir: &Path) -> BTreeSet<String> {
    let Ok(entries) = std::fs::read_dir(model_dir) else {
        return BTreeSet::new();
    };
    entries
        .flatten()
        .filter(|e| e.path().is_dir())
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        .collect()
}

/// A folder name for a URL: its readable characters and a stable hash (FNV-1a), so two URLs
/// never share a folder.
pub fn slug(url: &str) -> String {
    let readable: String = url
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .take(80)
        .collect();
    let hash = url.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("{readable}-{hash:016x}")
}

#[cfg(test)]
#[path = "mirror_tests.rs"]
mod tests;
