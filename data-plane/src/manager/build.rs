//! Building a model from its directory: the blocking half of a load.
//!
//! ```text
//! config (file or override) ─► version policy ─► served version dirs ─► complete config
//!   ─► per version: reuse the running version if config and files are unchanged,
//!                   else load its instances and start its scheduler
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nereid_proto::pb::inference::ModelConfig;
use nereid_proto::pb::inference::model_instance_group::Kind;

use crate::backend::{BackendError, BackendInstance, Backends, DeviceKind, InstanceContext};
use crate::config::{self, CompleteOptions};
use crate::repository::{self, Fingerprint};
use crate::scheduler::Scheduler;
use crate::scheduler::policy::BatchPolicy;
use crate::stats::VersionStats;
use crate::warmup::{WarmupSample, warmup_samples};

/// One loaded, servable model version.
pub struct LoadedVersion {
    pub name: String,
    pub version: i64,
    pub config: Arc<ModelConfig>,
    pub scheduler: Scheduler,
    pub stats: Arc<VersionStats>,
    /// Fingerprint of the version directory when it was loaded.
    pub fingerprint: Fingerprint,
}

/// What a model is built from.
#[derive(Clone, Debug)]
pub struct BuildInput {
    pub name: String,
    pub dir: PathBuf,
    /// A config that replaces `config.pbtxt` (repository load with `config`).
    pub config_override: Option<ModelConfig>,
    pub options: CompleteOptions,
    pub queue_capacity: usize,
}

/// A built model, or why it failed (with the versions that were attempted).
pub struct Built {
    pub versions: BTreeMap<i64, Arc<LoadedVersion>>,
}

#[derive(Debug, Clone)]
pub struct BuildError {
    pub reason: String,
    /// Versions the policy selected, for the repository index (may be empty).
    pub versions: Vec<i64>,
}

/// Builds (or rebuilds) a model. `running` are the currently served versions, reused when
/// their config and files have not changed. Blocking: call on a blocking thread.
pub fn build(
    input: &BuildInput,
    backends: &Backends,
    running: &BTreeMap<i64, Arc<LoadedVersion>>,
) -> Result<Built, BuildError> {
    let fail = |reason: String, versions: &[i64]| BuildError {
        reason,
        versions: versions.to_vec(),
    };
    let raw = match &input.config_override {
        Some(c) => c.clone(),
        None => config::read_config_file(&input.dir).map_err(|e| fail(e.to_string(), &[]))?,
    };
    let available = repository::version_dirs(&input.dir);
    // The policy comes from the raw config (auto-complete never changes it).
    let mut with_defaults = raw.clone();
    config::fill_defaults(&mut with_defaults);
    let keys: Vec<i64> = available.keys().copied().collect();
    let selected = repository::select_versions(with_defaults.version_policy.as_ref(), &keys);
    let dirs: Vec<PathBuf> = selected.iter().map(|v| available[v].clone()).collect();
    if selected.is_empty() {
        return Err(fail(
            format!(
                "at least one version must be available under the version policy of model '{}' (found {} version director{} in {})",
                input.name,
                keys.len(),
                if keys.len() == 1 { "y" } else { "ies" },
                input.dir.display()
            ),
            &selected,
        ));
    }
    let complete = config::complete(&input.name, raw, &dirs, backends, input.options)
        .map_err(|e| fail(e.to_string(), &selected))?;
    let config = Arc::new(complete);
    let backend = backends
        .get(&config.backend)
        .map_err(|e| fail(e, &selected))?;

    let mut versions = BTreeMap::new();
    for (&version, dir) in selected.iter().zip(&dirs) {
        let fingerprint = Fingerprint::of(dir);
        if let Some(old) = running.get(&version)
            && old.fingerprint == fingerprint
            && *old.config == *config
        {
            versions.insert(version, old.clone());
            continue;
        }
        let model_path = dir.join(&config.default_model_filename);
        let contexts = instance_contexts(&input.name, version, &input.dir, &model_path, &config);
        let load_error = |e: BackendError| {
            fail(
                format!("failed to load '{}' version {version}: {e}", input.name),
                &selected,
            )
        };
        let samples = warmup_samples(&config, &input.dir).map_err(|e| fail(e, &selected))?;
        let mut instances = Vec::with_capacity(contexts.len());
        for ctx in &contexts {
            let mut instance = backend.load_instance(ctx).map_err(load_error)?;
            warm_up(instance.as_mut(), &samples, &ctx.instance_name)
                .map_err(|e| fail(e, &selected))?;
            instances.push((ctx.instance_name.clone(), instance));
        }
        let stats = Arc::new(VersionStats::default());
        let scheduler = Scheduler::start(
            &input.name,
            BatchPolicy::from_config(&config),
            instances,
            stats.clone(),
            input.queue_capacity,
        )
        .map_err(load_error)?;
        versions.insert(
            version,
            Arc::new(LoadedVersion {
                name: input.name.clone(),
                version,
                config: config.clone(),
                scheduler,
                stats,
                fingerprint,
            }),
        );
    }
    Ok(Built { versions })
}

/// One context per instance of every instance group (`KIND_GPU` groups: `count` per listed GPU).
fn instance_contexts(
    name: &str,
    version: i64,
    model_dir: &Path,
    model_path: &Path,
    config: &Arc<ModelConfig>,
) -> Vec<InstanceContext> {
    let mut contexts = Vec::new();
    for group in &config.instance_group {
        let devices: Vec<DeviceKind> = if group.kind == Kind::Gpu as i32 {
            let gpus = if group.gpus.is_empty() {
                vec![0]
            } else {
                group.gpus.clone()
            };
            gpus.into_iter()
                .map(|device_id| DeviceKind::Gpu { device_id })
                .collect()
        } else {
            vec![DeviceKind::Cpu]
        };
        let mut index = 0;
        for device in devices {
            for _ in 0..group.count.max(1) {
                contexts.push(InstanceContext {
                    model_name: name.to_string(),
                    version,
                    model_dir: model_dir.to_path_buf(),
                    model_path: model_path.to_path_buf(),
                    config: config.clone(),
                    instance_name: format!("{}_{index}", group.name),
                    device,
                });
                index += 1;
            }
        }
    }
    contexts
}

/// Runs every warmup sample `count` times on a freshly loaded instance; the first failure
/// fails the load with its reason.
fn warm_up(
    instance: &mut dyn BackendInstance,
    samples: &[WarmupSample],
    instance_name: &str,
) -> Result<(), String> {
    for sample in samples {
        for _ in 0..sample.count.max(1) {
            instance
                .execute(&sample.inputs, &sample.outputs)
                .map_err(|e| {
                    format!(
                        "instance '{instance_name}' failed warmup sample '{}': {e}",
                        sample.name
                    )
                })?;
        }
    }
    Ok(())
}
