//! The model manager: which models exist, their state, and loading, unloading and polling.
//!
//! ```text
//!  startup / poll tick / repository API
//!        │ per-model async lock (one load or unload of a model at a time)
//!        ▼
//!  mark LOADING ─► build::build on a blocking thread ─► swap in new versions (READY)
//!                                                  └─► or keep old versions, record reason
//! ```
//!
//! Requests take an `Arc<LoadedVersion>` out of the map under a short read lock, so a reload or
//! unload never interrupts them: old instance pools drain and stop when the last request
//! holding them finishes. An unload takes the versions out of the map at once and then waits
//! for the requests they accepted, queued or running, bounded by a drain timeout ([`drain`]);
//! meanwhile new requests are refused UNAVAILABLE ("model 'x' version N is unloading"), which a
//! router retries elsewhere, rather than "unknown model".
//!
//! Ensembles are built against the models already loaded ([`dependencies::ModelsView`]):
//! startup and poll load a set of models in waves, composing models first; an explicit load of
//! an ensemble loads its composing models first. A served ensemble whose composing model is
//! gone (unloaded, removed) stays loaded but shows UNAVAILABLE with the reason, and its
//! requests fail naming that model, until the model is back.
//!
//! This file holds the model map and loading. What readers ask of the manager (the version a
//! request runs on, readiness, the repository index) is in [`views`]; `build` makes versions,
//! `unload` takes models out of service and `drain` empties their versions, `poll` is poll
//! mode's pass over the repositories.

mod build;
mod dependencies;
mod drain;
mod namespacing;
pub mod overrides;
mod poll;
mod unload;
mod views;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use nereid_proto::ServiceError;
use nereid_proto::pb::inference::ModelConfig;
use parking_lot::{Mutex, RwLock};

use crate::rate_limit::{RateLimitConfig, RateLimiter};

use crate::request::LoadedVersion;
use build::{BuildInput, build};
use dependencies::{ModelsView, load_order};
use drain::DEFAULT_DRAIN_TIMEOUT;
use overrides::OverrideDir;

use crate::backend::{Backends, CompleteOptions};
use crate::config;
use crate::repository::{self, Fingerprint};
use crate::request::cache::ResponseCache;

/// How models are loaded, like Triton's `--model-control-mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ControlMode {
    /// Load everything at startup; the repository API cannot load or unload.
    None,
    /// Load everything at startup, then follow changes on disk.
    Poll,
    /// Load only what `--load-model` names; the repository API loads and unloads.
    Explicit,
}

/// Settings of the manager.
#[derive(Clone, Debug)]
pub struct ManagerConfig {
    /// The model repository directories, searched in order (`--model-repository`).
    pub repositories: Vec<PathBuf>,
    /// How models get loaded and unloaded (`--model-control-mode`).
    pub control_mode: ControlMode,
    /// Models to load at startup in explicit mode (`*` = all).
    pub startup_models: Vec<String>,
    /// Complete missing config fields from the model file where the backend can
    /// (the opposite of Triton's `--disable-auto-complete-config`).
    pub auto_complete: bool,
    /// Bound of each model version's request queue.
    pub queue_capacity: usize,
    /// The models are assigned by a control plane (`nereid worker`): the repository API refuses
    /// client loads and unloads; only the worker's agent calls [`ModelManager::load`].
    pub cluster_managed: bool,
    /// `--rate-limit` / `--rate-limit-resource`: one limiter across every model.
    pub rate_limit: RateLimitConfig,
    /// Bytes of the response cache (`--cache-config local,size=N`); `None`: no cache, and
    /// `response_cache { enable: true }` in a config is ignored, as in Triton.
    pub response_cache_bytes: Option<usize>,
    /// `--model-config-name`: read `configs/<name>.pbtxt` where a model has it, else
    /// `config.pbtxt` ([`config::config_path`]).
    pub config_name: Option<String>,
    /// `--model-namespacing`: the same model name in several repositories is several models,
    /// each in its repository's namespace (`repository::namespace`).
    pub namespacing: bool,
}

/// A model's lifecycle state as the repository index shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelState {
    Loading,
    Ready,
    Unavailable,
}

impl ModelState {
    pub fn as_str(self) -> &'static str {
        match self {
            ModelState::Loading => "LOADING",
            ModelState::Ready => "READY",
            ModelState::Unavailable => "UNAVAILABLE",
        }
    }
}

struct ModelEntry {
    state: ModelState,
    reason: String,
    versions: BTreeMap<i64, Arc<LoadedVersion>>,
    /// Versions listed as UNAVAILABLE in the index although not served: those that failed to
    /// load, or were unloaded (Triton keeps an unloaded version's row).
    failed_versions: Vec<i64>,
    /// The model's directory fingerprint at the last load (poll mode compares it).
    fingerprint: Option<Fingerprint>,
    /// Set when the model was loaded from a repository API override.
    overridden: Option<Arc<OverrideDir>>,
    /// Versions taken out of service by an unload that still waits for their requests.
    unloading: Vec<i64>,
}

/// The reason of a model whose unload is waiting for its accepted requests.
const UNLOADING: &str = "unloading";
/// The reason of an unloaded model.
const UNLOADED: &str = "unloaded";

impl ModelEntry {
    fn new() -> ModelEntry {
        ModelEntry {
            state: ModelState::Loading,
            reason: String::new(),
            versions: BTreeMap::new(),
            failed_versions: Vec::new(),
            fingerprint: None,
            overridden: None,
            unloading: Vec::new(),
        }
    }
}

/// Where a load takes the model from.
pub enum LoadSource {
    /// The model's directory in the repositories (config.pbtxt, or an override config).
    Repository {
        /// A config to use instead of the directory's `config.pbtxt` (a load request's `config`).
        config_override: Option<ModelConfig>,
    },
    /// Files from a load request, with the config that must accompany them.
    Files {
        /// The model's config, required with uploaded files.
        config: ModelConfig,
        /// The temporary model directory holding the uploaded files.
        dir: OverrideDir,
    },
}

/// Owns every model of the node.
pub struct ModelManager {
    config: ManagerConfig,
    backends: Backends,
    models: RwLock<BTreeMap<String, ModelEntry>>,
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    startup_done: AtomicBool,
    rate_limiter: Arc<RateLimiter>,
    cache: Option<Arc<ResponseCache>>,
    /// How long an unload waits for the requests its versions accepted.
    drain_timeout: Duration,
}

impl ModelManager {
    /// `--model-config-name`, when set.
    fn config_name(&self) -> Option<&str> {
        self.config.config_name.as_deref()
    }

    /// A manager with no models yet, loading through `backends`; nothing loads until startup runs.
    pub fn new(config: ManagerConfig, backends: Backends) -> ModelManager {
        ModelManager {
            rate_limiter: RateLimiter::new(&config.rate_limit),
            cache: config
                .response_cache_bytes
                .map(|bytes| Arc::new(ResponseCache::new(bytes))),
            config,
            backends,
            models: RwLock::new(BTreeMap::new()),
            locks: Mutex::new(HashMap::new()),
            startup_done: AtomicBool::new(false),
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
        }
    }

    /// How long an unload waits for the requests it accepted before it refuses the queued
    /// ones (`DEFAULT_DRAIN_TIMEOUT` unless set).
    pub fn with_unload_drain_timeout(mut self, timeout: Duration) -> ModelManager {
        self.drain_timeout = timeout;
        self
    }

    /// The server's response cache, if it runs one.
    pub fn response_cache(&self) -> Option<&Arc<ResponseCache>> {
        self.cache.as_ref()
    }

    /// How models are loaded and unloaded on this node (`--model-control-mode`).
    pub fn control_mode(&self) -> ControlMode {
        self.config.control_mode
    }

    /// Whether a control plane decides which models this node serves.
    pub fn cluster_managed(&self) -> bool {
        self.config.cluster_managed
    }

    /// Loads the startup models (all of them, or `--load-model` in explicit mode), concurrently
    /// except that ensembles wait for their composing models. Failures are recorded per model;
    /// they never stop the others.
    pub async fn load_startup_models(self: &Arc<Self>) -> Result<(), ServiceError> {
        // Explicit mode with named models fetches each from an object store on its load.
        let named = self.config.control_mode == ControlMode::Explicit
            && !self.config.startup_models.iter().any(|m| m == "*");
        let scan = if named {
            self.scan()?
        } else {
            self.synced_scan(None).await?
        };
        let names: Vec<String> = match self.config.control_mode {
            ControlMode::Explicit if !self.config.startup_models.iter().any(|m| m == "*") => self
                .config
                .startup_models
                .iter()
                .flat_map(|name| self.keys_for(name, scan.models.keys()))
                .collect(),
            _ => scan
                .models
                .keys()
                .chain(scan.duplicates.keys())
                .cloned()
                .collect(),
        };
        self.load_in_order(&scan, names).await;
        self.startup_done.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Loads `names` from the repository, wave by wave so that every ensemble is built after
    /// the composing models of the set; ensembles on a dependency cycle fail without a build.
    /// Failures are logged and recorded per model.
    async fn load_in_order(&self, scan: &repository::ScanResult, names: Vec<String>) {
        let composing: BTreeMap<String, Vec<String>> = names
            .into_iter()
            .map(|name| {
                let steps = scan
                    .models
                    .get(&name)
                    .and_then(|dir| config::read_config_file(&dir.path, self.config_name()).ok())
                    .map(|c| self.composing_of(&name, &c, scan))
                    .unwrap_or_default();
                (name, steps)
            })
            .collect();
        let order = load_order(&composing);
        for (name, cycle) in order.cyclic {
            let reason = format!("circular dependency between ensembles: {cycle}");
            self.record_failure(&name, reason, Vec::new());
            if let Some(dir) = scan.models.get(&name)
                && let Some(entry) = self.models.write().get_mut(&name)
            {
                entry.fingerprint = Some(Fingerprint::of(&dir.path));
            }
        }
        for wave in order.waves {
            let loads = wave.iter().map(|name| async move {
                let source = LoadSource::Repository {
                    config_override: None,
                };
                if let Err(e) = self.load(name, source).await {
                    tracing::error!(model = %name, error = %e, "model failed to load");
                }
            });
            futures::future::join_all(loads).await;
        }
    }

    /// [`Self::scan`] after bringing object-store repositories up to date: every model, or
    /// only `model` (an explicit load downloads what it loads).
    async fn synced_scan(
        &self,
        model: Option<&str>,
    ) -> Result<repository::ScanResult, ServiceError> {
        let model = model.map(repository::namespace::name_of);
        repository::remote::sync(&self.config.repositories, model).await?;
        self.scan()
    }

    fn scan(&self) -> Result<repository::ScanResult, ServiceError> {
        repository::scan_namespaced(&self.config.repositories, self.config.namespacing).map_err(
            |e| ServiceError::internal(format!("failed to read the model repository: {e}")),
        )
    }

    fn model_lock(&self, name: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.locks
            .lock()
            .entry(name.to_string())
            .or_default()
            .clone()
    }

    /// Loads or reloads a model. Running versions keep serving until the new ones are ready;
    /// unchanged versions are kept as they are. In explicit mode an ensemble's composing
    /// models that are not loaded are loaded first. With namespacing, a repository load of a
    /// name loads every model of that name.
    pub async fn load(&self, name: &str, source: LoadSource) -> Result<(), ServiceError> {
        let keys = match &source {
            LoadSource::Repository { config_override } if self.config.namespacing => {
                let scan = self.synced_scan(Some(name)).await?;
                let keys = self.keys_for(name, scan.models.keys());
                keys.into_iter()
                    .map(|key| {
                        let config_override = config_override.clone();
                        (key, LoadSource::Repository { config_override })
                    })
                    .collect()
            }
            _ => Vec::new(),
        };
        if keys.is_empty() {
            return self.load_with_chain(name, source, Vec::new()).await;
        }
        let mut result = Ok(());
        for (key, source) in keys {
            let loaded = self.load_with_chain(&key, source, Vec::new()).await;
            result = result.and(loaded);
        }
        result
    }

    /// [`Self::load`] of a model that the explicit loads of the ensembles in `chain` (outermost
    /// first) asked for.
    async fn load_with_chain(
        &self,
        name: &str,
        source: LoadSource,
        chain: Vec<String>,
    ) -> Result<(), ServiceError> {
        let mut chain = chain;
        chain.push(name.to_string());
        if self.config.control_mode == ControlMode::Explicit {
            self.load_composing(name, &source, &chain).await;
        }
        let lock = self.model_lock(name);
        let _guard = lock.lock().await;

        let (dir, config_override, overridden) = match source {
            LoadSource::Files { config, dir } => {
                let dir = Arc::new(dir);
                (dir.path().to_path_buf(), Some(config), Some(dir))
            }
            LoadSource::Repository { config_override } => {
                let scan = match self.synced_scan(Some(name)).await {
                    Ok(scan) => scan,
                    Err(e) => {
                        let reason = e.into_message();
                        self.record_failure(name, reason.clone(), Vec::new());
                        return Err(ServiceError::internal(format!(
                            "failed to load '{name}': {reason}"
                        )));
                    }
                };
                if let Some(paths) = scan.duplicates.get(name) {
                    let paths: Vec<String> =
                        paths.iter().map(|p| p.display().to_string()).collect();
                    let reason = format!(
                        "model '{name}' appears in more than one model repository ({}); rename one",
                        paths.join(", ")
                    );
                    self.record_failure(name, reason.clone(), Vec::new());
                    return Err(ServiceError::invalid(format!(
                        "failed to load '{name}': {reason}"
                    )));
                }
                let Some(model_dir) = scan.models.get(name) else {
                    // Triton answers a load of a model no repository has with HTTP 500 / gRPC
                    // INTERNAL.
                    return Err(ServiceError::internal(format!(
                        "failed to load '{name}', failed to poll from model repository"
                    )));
                };
                (model_dir.path.clone(), config_override, None)
            }
        };

        let running = {
            let mut models = self.models.write();
            let entry = models
                .entry(name.to_string())
                .or_insert_with(ModelEntry::new);
            entry.state = if entry.versions.is_empty() {
                ModelState::Loading
            } else {
                entry.state
            };
            // Override files are fresh content whatever their names, sizes and mtimes say, so
            // a load from files never reuses a running version.
            if overridden.is_some() {
                BTreeMap::new()
            } else {
                entry.versions.clone()
            }
        };
        let composing = if self.config.namespacing {
            let scan = self.scan().unwrap_or_default();
            let names = config::read_config_file(&dir, self.config_name())
                .map(|c| config::composing_models(&c))
                .unwrap_or_default();
            self.composing_keys(name, &names, &scan)
        } else {
            BTreeMap::new()
        };
        let input = BuildInput {
            name: repository::namespace::name_of(name).to_string(),
            composing,
            dir: dir.clone(),
            config_override,
            options: CompleteOptions {
                auto_complete: self.config.auto_complete,
            },
            queue_capacity: self.config.queue_capacity,
            rate_limiter: self.rate_limiter.clone(),
            cache: self.cache.clone(),
            config_name: self.config.config_name.clone(),
        };
        let backends = self.backends.clone();
        let view = self.models_view(chain);
        let fingerprint = Fingerprint::of(&dir);
        let started = std::time::Instant::now();
        let result = tokio::task::spawn_blocking(move || build(&input, &backends, &running, &view))
            .await
            .map_err(|e| {
                ServiceError::internal(format!("failed to load '{name}': loader panicked: {e}"))
            })?;
        match result {
            Ok(built) => {
                let mut models = self.models.write();
                let entry = models
                    .entry(name.to_string())
                    .or_insert_with(ModelEntry::new);
                entry.state = ModelState::Ready;
                entry.reason.clear();
                entry.failed_versions.clear();
                entry.versions = built.versions;
                entry.fingerprint = Some(fingerprint);
                entry.overridden = overridden;
                tracing::info!(
                    model = %name,
                    versions = ?entry.versions.keys().collect::<Vec<_>>(),
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "model ready"
                );
                Ok(())
            }
            Err(e) => {
                {
                    let mut models = self.models.write();
                    if let Some(entry) = models.get_mut(name) {
                        entry.fingerprint = Some(fingerprint);
                    }
                }
                self.record_failure(name, e.reason.clone(), e.versions);
                Err(ServiceError::invalid(load_failure(name, &e.reason)))
            }
        }
    }

    /// Explicit mode: loads the composing models of the ensemble `name` that are not served, one
    /// after the other, before the ensemble is built. A model already in `chain` is skipped: it
    /// is a circular dependency, which the ensemble's build reports. Their failures are left
    /// for the ensemble's build to report.
    async fn load_composing(&self, name: &str, source: &LoadSource, chain: &[String]) {
        let config = match source {
            LoadSource::Files { config, .. } => Some(config.clone()),
            LoadSource::Repository {
                config_override: Some(config),
            } => Some(config.clone()),
            LoadSource::Repository {
                config_override: None,
            } => self.synced_scan(Some(name)).await.ok().and_then(|scan| {
                let dir = scan.models.get(name)?;
                config::read_config_file(&dir.path, self.config_name()).ok()
            }),
        };
        let Some(config) = config else { return };
        let names = config::composing_models(&config);
        let keys = if self.config.namespacing {
            self.composing_keys(name, &names, &self.scan().unwrap_or_default())
        } else {
            BTreeMap::new()
        };
        for model in names {
            let model = keys.get(&model).cloned().unwrap_or(model);
            if chain.contains(&model) || self.is_served(&model) {
                continue;
            }
            let source = LoadSource::Repository {
                config_override: None,
            };
            if let Err(e) = self.load_boxed(&model, source, chain.to_vec()).await {
                tracing::warn!(ensemble = %name, model = %model, error = %e, "composing model failed to load");
            }
        }
    }

    /// [`Self::load_with_chain`] behind a box: loads recurse through ensembles.
    fn load_boxed<'a>(
        &'a self,
        name: &'a str,
        source: LoadSource,
        chain: Vec<String>,
    ) -> BoxFuture<'a, Result<(), ServiceError>> {
        Box::pin(self.load_with_chain(name, source, chain))
    }

    fn is_served(&self, name: &str) -> bool {
        self.models
            .read()
            .get(name)
            .is_some_and(|e| !e.versions.is_empty())
    }

    /// What an ensemble built now can use: every known model's served configs, or why it has
    /// none.
    fn models_view(&self, chain: Vec<String>) -> ModelsView {
        let models = self
            .models
            .read()
            .iter()
            .map(|(name, entry)| {
                let served = if entry.versions.is_empty() {
                    Err(match entry.state {
                        ModelState::Loading => "it is still loading".to_string(),
                        _ if entry.reason == UNLOADED || entry.reason == UNLOADING => {
                            "it is not loaded (it was unloaded)".to_string()
                        }
                        _ => format!("it failed to load: {}", entry.reason),
                    })
                } else {
                    Ok(entry
                        .versions
                        .iter()
                        .map(|(v, lv)| (*v, lv.config.clone()))
                        .collect())
                };
                (name.clone(), served)
            })
            .collect();
        ModelsView::new(models, chain)
    }

    /// Records a failed load. A model that still has running versions keeps serving them.
    fn record_failure(&self, name: &str, reason: String, versions: Vec<i64>) {
        tracing::error!(model = %name, %reason, "model load failed");
        let mut models = self.models.write();
        let entry = models
            .entry(name.to_string())
            .or_insert_with(ModelEntry::new);
        if entry.versions.is_empty() {
            entry.state = ModelState::Unavailable;
            entry.failed_versions = versions;
        } else {
            entry.state = ModelState::Ready;
        }
        entry.reason = reason;
    }
}

/// The load API's message for a failed build: the reason, prefixed with the model unless the
/// reason already names it the same way (version failures do: `failed to load 'm' version 1`).
fn load_failure(name: &str, reason: &str) -> String {
    let prefix = format!("failed to load '{name}'");
    if reason.starts_with(&prefix) {
        reason.to_string()
    } else {
        format!("{prefix}: {reason}")
    }
}
