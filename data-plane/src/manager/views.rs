//! The read side of the [`ModelManager`]: the version a request runs on, readiness, every
//! served version (statistics, metrics) and the repository index. Each answer is taken under
//! the models map's short read lock and never holds it across an await.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use nereid_proto::{ModelIndexEntry, ServiceError};

use super::dependencies::unavailable_reason;
use super::{ModelManager, ModelState, UNLOADED, UNLOADING, drain};
use crate::repository::namespace;
use crate::request::LoadedVersion;

impl ModelManager {
    /// The version a request runs on: `version`, or the highest ready one.
    pub fn get(
        &self,
        name: &str,
        version: Option<i64>,
    ) -> Result<Arc<LoadedVersion>, ServiceError> {
        let models = self.models.read();
        let key = self.resolve(&models, name)?;
        let Some(entry) = models.get(&key) else {
            return Err(ServiceError::not_found(format!(
                "Request for unknown model: '{name}' is not found"
            )));
        };
        // A version being unloaded still finishes what it accepted; a new request is refused
        // retryably (a router tries another replica), not as an unknown model.
        let unloading = |v: i64| ServiceError::unavailable(drain::unloading(name, v));
        match version {
            Some(v) => entry.versions.get(&v).cloned().ok_or_else(|| {
                if entry.unloading.contains(&v) {
                    return unloading(v);
                }
                ServiceError::not_found(format!(
                    "Request for unknown model: '{name}' version {v} is not found"
                ))
            }),
            None => entry.versions.values().next_back().cloned().ok_or_else(|| {
                if let Some(&v) = entry.unloading.last() {
                    return unloading(v);
                }
                ServiceError::not_found(format!(
                    "Request for unknown model: '{name}' has no available versions"
                ))
            }),
        }
    }

    /// Whether the model (version) is known at all, and whether it is ready.
    pub fn readiness(&self, name: &str, version: Option<i64>) -> Result<bool, ServiceError> {
        let models = self.models.read();
        let key = self.resolve(&models, name)?;
        let Some(entry) = models.get(&key) else {
            return Err(ServiceError::not_found(format!(
                "Request for unknown model: '{name}' is not found"
            )));
        };
        match version {
            Some(v) if !entry.versions.contains_key(&v) && entry.state == ModelState::Ready => {
                Err(ServiceError::not_found(format!(
                    "Request for unknown model: '{name}' version {v} is not found"
                )))
            }
            Some(v) => Ok(entry
                .versions
                .get(&v)
                .is_some_and(|lv| unavailable_reason(&models, lv).is_none())),
            None => Ok(entry
                .versions
                .values()
                .any(|lv| unavailable_reason(&models, lv).is_none())),
        }
    }

    /// Why a served version cannot take requests right now (an instance recovering from a
    /// crash, an ensemble's composing model that is not loaded), if it cannot.
    pub fn unavailable(&self, loaded: &LoadedVersion) -> Option<String> {
        unavailable_reason(&self.models.read(), loaded)
    }

    /// All served versions of a model, ascending.
    pub fn versions(&self, name: &str) -> Vec<i64> {
        let models = self.models.read();
        let Ok(key) = self.resolve(&models, name) else {
            return Vec::new();
        };
        models
            .get(&key)
            .map(|e| e.versions.keys().copied().collect())
            .unwrap_or_default()
    }

    /// Every served version of every model (for statistics).
    pub fn all_versions(&self) -> Vec<Arc<LoadedVersion>> {
        self.models
            .read()
            .values()
            .flat_map(|e| e.versions.values().cloned())
            .collect()
    }

    /// Every served version of every model with its namespace (`None` without
    /// `--model-namespacing`), for the metrics' `namespace` label.
    pub fn all_versions_by_namespace(&self) -> Vec<(Option<String>, Arc<LoadedVersion>)> {
        let namespacing = self.config.namespacing;
        self.models
            .read()
            .iter()
            .flat_map(|(key, e)| {
                let namespace = namespace::namespace_of(key)
                    .filter(|_| namespacing)
                    .map(str::to_string);
                e.versions
                    .values()
                    .map(move |v| (namespace.clone(), v.clone()))
            })
            .collect()
    }

    /// Startup finished and every model that was asked for is ready.
    pub fn all_ready(&self) -> bool {
        self.startup_done.load(Ordering::SeqCst)
            && self.models.read().values().all(|e| {
                e.state == ModelState::Ready || e.reason == UNLOADED || e.reason == UNLOADING
            })
    }

    /// Whether the startup loads have all finished (successfully or not).
    pub fn startup_done(&self) -> bool {
        self.startup_done.load(Ordering::SeqCst)
    }

    /// The repository index: every model on disk or loaded, one row per version where known.
    pub fn index(&self, ready_only: bool) -> Result<Vec<ModelIndexEntry>, ServiceError> {
        let scan = self.scan()?;
        let models = self.models.read();
        let mut rows = Vec::new();
        let mut names: Vec<&String> = scan.models.keys().chain(scan.duplicates.keys()).collect();
        names.extend(
            models
                .keys()
                .filter(|n| !scan.models.contains_key(*n) && !scan.duplicates.contains_key(*n)),
        );
        names.sort();
        names.dedup();
        for name in names {
            let row = |version: String, state: &str, reason: &str| ModelIndexEntry {
                name: namespace::name_of(name).to_string(),
                version,
                state: state.to_string(),
                reason: reason.to_string(),
            };
            match models.get(name) {
                None => {
                    if !ready_only {
                        rows.push(row(String::new(), "", ""));
                    }
                }
                Some(entry) => {
                    for (v, loaded) in &entry.versions {
                        match unavailable_reason(&models, loaded) {
                            Some(reason) if entry.state == ModelState::Ready => {
                                if !ready_only {
                                    let state = ModelState::Unavailable.as_str();
                                    rows.push(row(v.to_string(), state, &reason));
                                }
                            }
                            _ => rows.push(row(v.to_string(), entry.state.as_str(), "")),
                        }
                    }
                    if ready_only || !entry.versions.is_empty() {
                        continue;
                    }
                    if entry.failed_versions.is_empty() {
                        rows.push(row(String::new(), entry.state.as_str(), &entry.reason));
                    }
                    for v in &entry.failed_versions {
                        rows.push(row(v.to_string(), entry.state.as_str(), &entry.reason));
                    }
                }
            }
        }
        Ok(rows)
    }
}
