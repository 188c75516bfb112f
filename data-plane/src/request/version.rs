//! [`LoadedVersion`]: one loaded, servable model version, what the manager builds and the
//! request path (the rest of this module) runs requests on; and its [`Runner`].

use std::sync::Arc;

use super::cache::ResponseCache;
use crate::backend::Health;
use crate::classification::Labels;
use crate::config::ValidModelConfig;
use crate::ensemble::EnsemblePlan;
use crate::repository::Fingerprint;
use crate::scheduler::Scheduler;
use crate::stats::VersionStats;

/// One loaded, servable model version.
pub struct LoadedVersion {
    pub name: String,
    pub version: i64,
    pub config: Arc<ValidModelConfig>,
    pub runner: Runner,
    pub stats: Arc<VersionStats>,
    /// Fingerprint of the version directory when it was loaded.
    pub fingerprint: Fingerprint,
    /// Instances that lost their worker process (Python stubs) and are recovering.
    pub health: Arc<Health>,
    /// The outputs' class labels (`label_filename`), for the classification extension.
    pub labels: Arc<Labels>,
    /// The server's response cache, when the server runs one and the config enables it.
    pub cache: Option<Arc<ResponseCache>>,
    /// Unique to this build of the version: part of its response-cache keys, so answers of an
    /// earlier load are never reused.
    pub generation: u64,
}

impl Drop for LoadedVersion {
    /// The version is gone (unloaded or replaced, its last request answered): its cached
    /// answers can never be asked for again.
    fn drop(&mut self) {
        if let Some(cache) = &self.cache {
            cache.purge(self.generation);
        }
    }
}

/// The next [`LoadedVersion::generation`].
pub fn next_generation() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// What runs a version's requests (the request path, `LoadedVersion::run`, matches on it).
pub enum Runner {
    /// The version's instances, behind its scheduler: one answer per request.
    Batched(Scheduler),
    /// A decoupled model's instances (`model_transaction_policy { decoupled: true }`): any
    /// number of answers per request, streamed; unary calls are refused.
    Decoupled(Scheduler),
    /// An ensemble: no instances of its own; its steps run on the composing models.
    Ensemble(Arc<EnsemblePlan>),
}

impl LoadedVersion {
    /// Version 1 of `name` as a unit test needs it: no directory, healthy, no labels, no cache.
    #[cfg(test)]
    pub(crate) fn for_test(
        name: &str,
        config: Arc<ValidModelConfig>,
        runner: Runner,
        stats: Arc<VersionStats>,
    ) -> Arc<Self> {
        Arc::new(LoadedVersion {
            name: name.into(),
            version: 1,
            config,
            runner,
            stats,
            fingerprint: Fingerprint::of(std::path::Path::new("/nonexistent")),
            health: Arc::new(Health::default()),
            labels: Default::default(),
            cache: None,
            generation: 0,
        })
    }

    /// The plan of an ensemble version.
    pub fn plan(&self) -> Option<&Arc<EnsemblePlan>> {
        match &self.runner {
            Runner::Ensemble(plan) => Some(plan),
            Runner::Batched(_) | Runner::Decoupled(_) => None,
        }
    }

    /// Requests waiting in the version's queue; 0 for an ensemble (its steps queue on the
    /// composing models).
    pub fn queue_depth(&self) -> usize {
        match &self.runner {
            Runner::Batched(scheduler) | Runner::Decoupled(scheduler) => scheduler.queue_depth(),
            Runner::Ensemble(_) => 0,
        }
    }
}
