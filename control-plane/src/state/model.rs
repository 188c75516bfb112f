//! Models in the registry: what an operator deploys, and the commands that change them.
//!
//! A [`ModelSpec`] says where the Triton-layout model directory lives, which versions to
//! serve and how many replicas to keep. Placement reads it to decide where replicas go;
//! deleting a model only marks its replicas `Unloading`, the workers report when they are
//! gone and `RemoveReplica` drops them.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::ClusterState;
use super::error::{EntityKind, StateError};
use super::name::{validate_name, validate_source_uri};
use super::replica::ReplicaState;

/// A model an operator wants served.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelSpec {
    /// The name clients use in `/v2/models/{name}`; unique in the cluster.
    pub name: String,
    /// Where the Triton-layout model directory lives, e.g. `file:///models/resnet50`.
    pub source: String,
    /// Which numbered version folders to serve.
    pub version_policy: VersionPolicy,
    /// A JSON `ModelConfig` object merged over the directory's `config.pbtxt`, if any.
    pub config_override: Option<String>,
    /// Placement keeps at least this many replicas of each served version.
    pub min_replicas: u32,
    /// Placement never runs more than this many replicas of each served version.
    pub max_replicas: u32,
    /// What one replica needs; an estimate until a worker reports measured memory.
    pub resources: Resources,
    /// Free-form labels, e.g. for placement constraints.
    pub labels: BTreeMap<String, String>,
    /// Version folders found in the source when the model was registered (sorted, distinct);
    /// empty when the registry could not list the source.
    #[serde(default)]
    pub available_versions: Vec<i64>,
    /// Traffic split for requests that name no version: version -> relative weight. Empty
    /// means the highest served version with a ready replica takes them all.
    #[serde(default)]
    pub traffic: BTreeMap<i64, u32>,
}

/// The largest weight one version may have in a traffic split (so sums never overflow and
/// percentages stay readable).
pub const MAX_TRAFFIC_WEIGHT: u32 = 1_000_000;

/// Triton's version policy: which numbered version folders are served.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum VersionPolicy {
    /// The `n` highest version numbers present.
    Latest { n: u32 },
    /// Every version present.
    All,
    /// Exactly these versions.
    Specific { versions: Vec<i64> },
}

impl VersionPolicy {
    /// Whether `version` may be served under this policy, as far as the registry can tell
    /// without listing the model directory (only `Specific` names versions).
    pub fn admits(&self, version: i64) -> bool {
        match self {
            VersionPolicy::Latest { .. } | VersionPolicy::All => true,
            VersionPolicy::Specific { versions } => versions.contains(&version),
        }
    }
}

impl ModelSpec {
    /// The versions placement serves: the policy applied to the available version folders.
    /// `Specific` names its versions even when the source could not be listed.
    pub fn served_versions(&self) -> Vec<i64> {
        let mut available = self.available_versions.clone();
        available.sort_unstable();
        available.dedup();
        match &self.version_policy {
            VersionPolicy::Latest { n } => {
                let skip = available.len().saturating_sub(*n as usize);
                available.split_off(skip)
            }
            VersionPolicy::All => available,
            VersionPolicy::Specific { versions } => {
                let mut v: Vec<i64> = versions
                    .iter()
                    .copied()
                    .filter(|v| available.is_empty() || available.contains(v))
                    .collect();
                v.sort_unstable();
                v
            }
        }
    }
}

/// What one replica of a model needs from its node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resources {
    pub cpu_millis: u64,
    pub memory_bytes: u64,
    pub gpus: u32,
    /// Per GPU.
    pub gpu_memory_bytes: u64,
}

impl ModelSpec {
    /// Checks everything about the spec that does not depend on the cluster state.
    pub fn validate(&self) -> Result<(), StateError> {
        validate_name("model", "name", &self.name)?;
        let subject = format!("model '{}'", self.name);
        validate_source_uri(&subject, &self.source)?;
        match &self.version_policy {
            VersionPolicy::Latest { n: 0 } => {
                return Err(StateError::invalid(
                    &subject,
                    "version_policy",
                    "latest 0 serves nothing; use at least 1",
                ));
            }
            VersionPolicy::Latest { .. } | VersionPolicy::All => {}
            VersionPolicy::Specific { versions } => {
                if versions.is_empty() {
                    return Err(StateError::invalid(
                        &subject,
                        "version_policy",
                        "specific lists no versions",
                    ));
                }
                if let Some(v) = versions.iter().find(|v| **v < 1) {
                    return Err(StateError::invalid(
                        &subject,
                        "version_policy",
                        format!("version {v} is not a positive version folder number"),
                    ));
                }
                let distinct: BTreeSet<_> = versions.iter().collect();
                if distinct.len() != versions.len() {
                    return Err(StateError::invalid(
                        &subject,
                        "version_policy",
                        "specific lists a version twice",
                    ));
                }
            }
        }
        if let Some(json) = &self.config_override {
            match serde_json::from_str::<serde_json::Value>(json) {
                Ok(serde_json::Value::Object(_)) => {}
                Ok(_) => {
                    return Err(StateError::invalid(
                        &subject,
                        "config_override",
                        "must be a JSON object",
                    ));
                }
                Err(e) => {
                    return Err(StateError::invalid(
                        &subject,
                        "config_override",
                        format!("is not valid JSON: {e}"),
                    ));
                }
            }
        }
        validate_scale(&self.name, self.min_replicas, self.max_replicas)?;
        self.validate_traffic(&self.traffic)
    }

    /// Checks a traffic split against this model: every version is one the policy serves
    /// (as far as the available versions are known), weights are at most
    /// [`MAX_TRAFFIC_WEIGHT`] and add up to more than zero. An empty split is valid.
    pub fn validate_traffic(&self, traffic: &BTreeMap<i64, u32>) -> Result<(), StateError> {
        if traffic.is_empty() {
            return Ok(());
        }
        let subject = format!("model '{}'", self.name);
        let served = self.served_versions();
        for (&version, &weight) in traffic {
            let known = if self.available_versions.is_empty() {
                version >= 1 && self.version_policy.admits(version)
            } else {
                served.contains(&version)
            };
            if !known {
                return Err(StateError::invalid(
                    &subject,
                    "traffic",
                    format!(
                        "version {version} is not served by the model's version policy (served: {})",
                        list_versions(&served)
                    ),
                ));
            }
            if weight > MAX_TRAFFIC_WEIGHT {
                return Err(StateError::invalid(
                    &subject,
                    "traffic",
                    format!("weight {weight} of version {version} is above {MAX_TRAFFIC_WEIGHT}"),
                ));
            }
        }
        if traffic.values().all(|w| *w == 0) {
            return Err(StateError::invalid(
                &subject,
                "traffic",
                "every weight is 0; give at least one version a positive weight, or clear the split",
            ));
        }
        Ok(())
    }
}

fn list_versions(versions: &[i64]) -> String {
    if versions.is_empty() {
        return "unknown until the source lists its version folders".into();
    }
    versions
        .iter()
        .map(|v| v.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

pub(super) fn validate_scale(name: &str, min: u32, max: u32) -> Result<(), StateError> {
    if max < min {
        return Err(StateError::invalid(
            format!("model '{name}'"),
            "max_replicas",
            format!("{max} is below min_replicas {min}"),
        ));
    }
    Ok(())
}

impl ClusterState {
    /// Creates or replaces a model. Replacing leaves its replicas alone; placement moves
    /// them if the new spec asks for that.
    pub(super) fn upsert_model(&mut self, spec: ModelSpec) -> Result<bool, StateError> {
        spec.validate()?;
        if self.models.get(&spec.name) == Some(&spec) {
            return Ok(false);
        }
        self.models.insert(spec.name.clone(), spec);
        Ok(true)
    }

    /// Removes a model and marks every replica of it `Unloading`.
    pub(super) fn delete_model(&mut self, name: &str) -> Result<bool, StateError> {
        if self.models.remove(name).is_none() {
            return Err(StateError::not_found(EntityKind::Model, name));
        }
        self.autoscale.remove(name);
        for replica in self.replicas.values_mut().filter(|r| r.model == name) {
            replica.state = ReplicaState::Unloading;
        }
        Ok(true)
    }

    pub(super) fn scale_model(
        &mut self,
        name: &str,
        min: u32,
        max: u32,
    ) -> Result<bool, StateError> {
        let Some(model) = self.models.get_mut(name) else {
            return Err(StateError::not_found(EntityKind::Model, name));
        };
        validate_scale(name, min, max)?;
        if (model.min_replicas, model.max_replicas) == (min, max) {
            return Ok(false);
        }
        model.min_replicas = min;
        model.max_replicas = max;
        Ok(true)
    }

    /// Replaces a model's traffic split (empty clears it).
    pub(super) fn set_traffic(
        &mut self,
        name: &str,
        weights: BTreeMap<i64, u32>,
    ) -> Result<bool, StateError> {
        let Some(model) = self.models.get_mut(name) else {
            return Err(StateError::not_found(EntityKind::Model, name));
        };
        model.validate_traffic(&weights)?;
        if model.traffic == weights {
            return Ok(false);
        }
        model.traffic = weights;
        Ok(true)
    }
}
