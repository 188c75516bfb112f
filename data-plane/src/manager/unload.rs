//! Taking models out of service: one model (its versions leave the map at once, then the
//! requests they accepted drain, see the drain module), an ensemble with the composing models
//! no other ensemble uses, and every model at shutdown.
//!
//! ```text
//! unload(name) ─► keys_for (every model of that name) ─► per key, under the model's lock:
//!     versions out of the map (UNAVAILABLE, "unloading") ─► drain::drain ─► "unloaded"
//! unload_with_composing ─► unload ─► each composing model no loaded ensemble still reads
//! unload_all (shutdown) ─► unload of every served model, at once
//! ```

use std::sync::Arc;

use nereid_proto::ServiceError;

use super::dependencies::ensemble_plans;
use super::{ModelManager, ModelState, UNLOADED, UNLOADING, drain};
use crate::request::LoadedVersion;

impl ModelManager {
    /// Unloads a model: it stops taking requests at once (they get UNAVAILABLE while it
    /// drains), then waits for the requests it accepted, queued or running, to be answered, at
    /// most the drain timeout; queued ones still waiting then are refused UNAVAILABLE
    /// (`drain`). Unloading a model that was never loaded succeeds and changes nothing, as in
    /// Triton.
    pub async fn unload(&self, name: &str) -> Result<(), ServiceError> {
        let keys = self.keys_for(name, self.models.read().keys());
        for key in keys {
            self.unload_key(&key).await?;
        }
        Ok(())
    }

    /// [`Self::unload`] of one model, by its key.
    async fn unload_key(&self, name: &str) -> Result<(), ServiceError> {
        let lock = self.model_lock(name);
        let _guard = lock.lock().await;
        let (versions, overridden) = {
            let mut models = self.models.write();
            let Some(entry) = models.get_mut(name) else {
                tracing::debug!(model = %name, "unload of a model that is not loaded: nothing to do");
                return Ok(());
            };
            let versions = std::mem::take(&mut entry.versions);
            if !versions.is_empty() {
                entry.failed_versions = versions.keys().copied().collect();
            }
            entry.unloading = versions.keys().copied().collect();
            entry.state = ModelState::Unavailable;
            entry.reason = UNLOADING.to_string();
            entry.fingerprint = None;
            (versions, entry.overridden.take())
        };
        let versions: Vec<Arc<LoadedVersion>> = versions.into_values().collect();
        let started = std::time::Instant::now();
        let refused = drain::drain(name, &versions, self.drain_timeout).await;
        if let Some(entry) = self.models.write().get_mut(name) {
            entry.unloading.clear();
            entry.reason = UNLOADED.to_string();
        }
        drop(overridden);
        tracing::info!(
            model = %name,
            drain_ms = started.elapsed().as_millis() as u64,
            refused,
            "model unloaded"
        );
        Ok(())
    }

    /// Unloads an ensemble and then its composing models, through nested ensembles (Triton's
    /// `unload_dependents`); a composing model that another loaded ensemble still uses stays.
    /// For any other model this is [`Self::unload`].
    pub async fn unload_with_composing(&self, name: &str) -> Result<(), ServiceError> {
        let keys = self.keys_for(name, self.models.read().keys());
        for key in keys {
            self.unload_key_with_composing(&key).await?;
        }
        Ok(())
    }

    /// [`Self::unload_with_composing`] of one model, by its key.
    async fn unload_key_with_composing(&self, name: &str) -> Result<(), ServiceError> {
        let mut composing: Vec<String> = Vec::new();
        {
            let models = self.models.read();
            let mut next = vec![name.to_string()];
            while let Some(model) = next.pop() {
                for plan in models.get(&model).into_iter().flat_map(ensemble_plans) {
                    for step in &plan.steps {
                        if step.model != name && !composing.contains(&step.model) {
                            composing.push(step.model.clone());
                            next.insert(0, step.model.clone());
                        }
                    }
                }
            }
        }
        self.unload(name).await?;
        // Outer ensembles come first, so a nested ensemble no longer holds its own models.
        for model in composing {
            let still_used = self.models.read().iter().any(|(other, entry)| {
                *other != model
                    && ensemble_plans(entry).any(|p| p.steps.iter().any(|s| s.model == model))
            });
            if still_used {
                tracing::info!(model = %model, ensemble = %name, "composing model kept: another loaded ensemble uses it");
                continue;
            }
            if self.is_served(&model) {
                self.unload(&model).await?;
            }
        }
        Ok(())
    }

    /// Server shutdown: unloads every model at once (each as [`Self::unload`]), so the
    /// instances stop and out-of-process ones (Python stubs) run their `finalize`. Returns when
    /// every model is out of service; instances finish stopping on their own threads.
    pub async fn unload_all(&self) {
        let names: Vec<String> = self
            .models
            .read()
            .iter()
            .filter(|(_, entry)| !entry.versions.is_empty())
            .map(|(name, _)| name.clone())
            .collect();
        let unloads = names.iter().map(|name| self.unload(name));
        for (name, result) in names.iter().zip(futures::future::join_all(unloads).await) {
            if let Err(e) = result {
                tracing::warn!(model = %name, error = %e, "unloading at shutdown failed");
            }
        }
    }
}
