//! The manager's side of `--model-namespacing` ([`crate::repository::namespace`]): its map is
//! keyed by `<repository>/<name>` when namespacing is on, so the names that requests, loads and
//! ensembles use are turned into keys here.
//!
//! ```text
//! request (infer, metadata, ready, stats) ─► resolve: one key, or Triton's ambiguity error
//! load / unload of a name ─► keys_for: every model of that name (as Triton)
//! ensemble ─► composing_keys: each step's model in the ensemble's own namespace first
//! ```

use std::collections::BTreeMap;

use nereid_proto::ServiceError;
use nereid_proto::pb::inference::ModelConfig;

use super::{ModelEntry, ModelManager};
use crate::config;
use crate::repository::{ScanResult, namespace};

impl ModelManager {
    /// Whether `--model-namespacing` is on.
    pub fn namespacing(&self) -> bool {
        self.config.namespacing
    }

    /// The key of the model a request names: the name itself without namespacing; with it the
    /// one model of that name (a name in several namespaces is INVALID_ARG with Triton's
    /// message). A name no model has is returned as it is, for the caller's "unknown model".
    pub(super) fn resolve(
        &self,
        models: &BTreeMap<String, ModelEntry>,
        name: &str,
    ) -> Result<String, ServiceError> {
        if !self.config.namespacing {
            return Ok(name.to_string());
        }
        match namespace::matching(name, models.keys()).as_slice() {
            [] => Ok(name.to_string()),
            [one] => Ok(one.clone()),
            many => Err(ServiceError::invalid(namespace::ambiguity(
                name,
                many.len(),
            ))),
        }
    }

    /// The models a load or unload of `name` acts on: with namespacing every model of that
    /// name among `keys` (Triton loads and unloads them all); else, or when none has it,
    /// `name` itself.
    pub(super) fn keys_for<'a>(
        &self,
        name: &str,
        keys: impl Iterator<Item = &'a String>,
    ) -> Vec<String> {
        if !self.config.namespacing {
            return vec![name.to_string()];
        }
        let found = namespace::matching(name, keys);
        if found.is_empty() {
            vec![name.to_string()]
        } else {
            found
        }
    }

    /// The composing models of `config` (the model `key`'s), as keys ([`Self::composing_keys`]).
    pub(super) fn composing_of(
        &self,
        key: &str,
        config: &ModelConfig,
        scan: &ScanResult,
    ) -> Vec<String> {
        let names = config::composing_models(config);
        let keys = self.composing_keys(key, &names, scan);
        names
            .into_iter()
            .map(|name| keys.get(&name).cloned().unwrap_or(name))
            .collect()
    }

    /// The keys the composing models `names` of the model `key` mean among the models on
    /// disk (`scan`) and loaded: in its own namespace first, else the only model of that name;
    /// empty without namespacing.
    pub(super) fn composing_keys(
        &self,
        key: &str,
        names: &[String],
        scan: &ScanResult,
    ) -> BTreeMap<String, String> {
        if !self.config.namespacing {
            return BTreeMap::new();
        }
        let mut keys: Vec<String> = scan.models.keys().cloned().collect();
        keys.extend(self.models.read().keys().cloned());
        keys.sort();
        keys.dedup();
        let from = namespace::namespace_of(key);
        names
            .iter()
            .map(|name| {
                let resolved = namespace::resolve_from(from, name, keys.iter());
                (name.clone(), resolved)
            })
            .collect()
    }
}
