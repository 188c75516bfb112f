//! Building a model from its directory: the blocking half of a load.
//!
//! ```text
//! config (file or override) ─► version policy ─► served version dirs ─► complete config
//!   ─► per version: reuse the running version if config and files are unchanged,
//!                   else load its instances and start its scheduler
//!   ─► ensembles instead: plan against the composing models (ModelsView); no instances
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nereid_proto::pb::inference::ModelConfig;

use super::dependencies::ModelsView;
use crate::backend::{
    Backend, BackendError, BackendInstance, Backends, BatchInputs, CompleteOptions, DeviceKind,
    Health, InstanceContext, Phases, RequestView, ServerHandle, complete,
};
use crate::classification::Labels;
use crate::config::{self, GroupKind, InstanceGroup, RaggedBatching, ValidModelConfig};
use crate::ensemble;
use crate::rate_limit::{InstanceNeeds, RateLimiter, ResourceKey};
use crate::repository::{self, Fingerprint};
use crate::request::cache::ResponseCache;
use crate::request::{LoadedVersion, Runner, next_generation};
use crate::scheduler::policy::BatchPolicy;
use crate::scheduler::{self, Scheduler};
use crate::stats::{LoadReport, VersionStats};
use crate::warmup::{WarmupSample, warmup_samples};

/// What a model is built from.
#[derive(Clone, Debug)]
pub struct BuildInput {
    pub name: String,
    /// With `--model-namespacing`, the key each composing model of an ensemble means (its
    /// steps run on those models); empty otherwise.
    pub composing: BTreeMap<String, String>,
    pub dir: PathBuf,
    /// A config that replaces `config.pbtxt` (repository load with `config`).
    pub config_override: Option<ModelConfig>,
    pub options: CompleteOptions,
    pub queue_capacity: usize,
    /// The server's rate limiter, which every instance registers with.
    pub rate_limiter: Arc<RateLimiter>,
    /// The server's response cache (`--cache-config`), for versions whose config enables it.
    pub cache: Option<Arc<ResponseCache>>,
    /// `--model-config-name` ([`config::config_path`]).
    pub config_name: Option<String>,
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
/// their config and files have not changed; `models` is what an ensemble is built against.
/// Blocking: call on a blocking thread.
pub fn build(
    input: &BuildInput,
    backends: &Backends,
    running: &BTreeMap<i64, Arc<LoadedVersion>>,
    models: &ModelsView,
) -> Result<Built, BuildError> {
    let fail = |reason: String, versions: &[i64]| BuildError {
        reason,
        versions: versions.to_vec(),
    };
    let raw = match &input.config_override {
        Some(c) => c.clone(),
        None => config::read_config_file(&input.dir, input.config_name.as_deref())
            .map_err(|e| fail(e.to_string(), &[]))?,
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
    let complete = complete(&input.name, raw, &dirs, backends, input.options)
        .map_err(|e| fail(e.to_string(), &selected))?;
    let mut config = Arc::new(steps_on(complete, &input.composing));
    let mut plan = None;
    if config.platform == ensemble::PLATFORM {
        let planned = ensemble::plan(&config, |model, version| models.config(model, version))
            .map_err(|e| fail(e, &selected))?;
        // Its config says whether it is decoupled, as the plan found.
        config = Arc::new(steps_on(
            ensemble::completed_config(&config, &planned).map_err(|e| fail(e, &selected))?,
            &input.composing,
        ));
        plan = Some(Arc::new(planned));
    }
    let labels = Arc::new(Labels::load(&config, &input.dir).map_err(|e| fail(e, &selected))?);
    let versions = VersionsInput {
        config: &config,
        labels: &labels,
        selected: &selected,
        dirs: &dirs,
    };
    if let Some(plan) = plan {
        // No instances of its own: a running version is kept while its plan is unchanged too.
        return build_versions(
            input,
            versions,
            running,
            |old| old.plan().is_some_and(|p| **p == *plan),
            |_, _| Ok(VersionParts::new(Runner::Ensemble(plan.clone()))),
        );
    }
    let backend = backends
        .get(&config.backend)
        .map_err(|e| fail(e, &selected))?;
    build_versions(
        input,
        versions,
        running,
        |_| true,
        |version, dir| {
            load_version(
                input,
                backend.as_ref(),
                &config,
                (version, dir),
                backends.server(),
            )
            .map_err(|e| fail(e, &selected))
        },
    )
}

/// `config` with its ensemble steps on the models `composing` maps their names to
/// (namespacing); the wire config keeps the names as written.
fn steps_on(
    mut config: ValidModelConfig,
    composing: &BTreeMap<String, String>,
) -> ValidModelConfig {
    if let config::Scheduling::Ensemble(steps) = &mut config.scheduling {
        for step in steps {
            if let Some(key) = composing.get(&step.model_name) {
                step.model_name = key.clone();
            }
        }
    }
    config
}

/// What a built version runs on: its runner, and the statistics and health board the runner
/// shares with the version.
struct VersionParts {
    runner: Runner,
    stats: Arc<VersionStats>,
    health: Arc<Health>,
}

impl VersionParts {
    /// A runner that shares nothing with the version yet.
    fn new(runner: Runner) -> VersionParts {
        VersionParts {
            runner,
            stats: Arc::new(VersionStats::default()),
            health: Arc::new(Health::default()),
        }
    }
}

/// What every version of a model shares: its config, its labels, and the versions to serve
/// (`selected`, in `dirs`).
#[derive(Clone, Copy)]
struct VersionsInput<'a> {
    config: &'a Arc<ValidModelConfig>,
    labels: &'a Arc<Labels>,
    selected: &'a [i64],
    dirs: &'a [PathBuf],
}

/// The served versions of a model. A running version whose directory, config and labels are
/// unchanged, and that `still_fits`, is kept (with its statistics); every other is built by
/// `build_version`.
fn build_versions(
    input: &BuildInput,
    VersionsInput {
        config,
        labels,
        selected,
        dirs,
    }: VersionsInput<'_>,
    running: &BTreeMap<i64, Arc<LoadedVersion>>,
    still_fits: impl Fn(&LoadedVersion) -> bool,
    mut build_version: impl FnMut(i64, &Path) -> Result<VersionParts, BuildError>,
) -> Result<Built, BuildError> {
    let mut versions = BTreeMap::new();
    for (&version, dir) in selected.iter().zip(dirs) {
        let fingerprint = Fingerprint::of(dir);
        if let Some(old) = running.get(&version)
            && old.fingerprint == fingerprint
            && old.config == *config
            && old.labels == *labels
            && still_fits(old)
        {
            versions.insert(version, old.clone());
            continue;
        }
        let VersionParts {
            runner,
            stats,
            health,
        } = build_version(version, dir)?;
        versions.insert(
            version,
            Arc::new(LoadedVersion {
                name: input.name.clone(),
                version,
                config: config.clone(),
                runner,
                stats,
                fingerprint,
                health,
                labels: labels.clone(),
                cache: input.cache.clone().filter(|_| config.response_cache),
                generation: next_generation(),
            }),
        );
    }
    Ok(Built { versions })
}

/// Loads the instances of one version from `dir`, warms each up and starts the scheduler.
/// `Err` is the version's load failure reason.
fn load_version(
    input: &BuildInput,
    backend: &dyn Backend,
    config: &Arc<ValidModelConfig>,
    (version, dir): (i64, &Path),
    server: &Arc<ServerHandle>,
) -> Result<VersionParts, String> {
    let model_path = dir.join(&config.default_model_filename);
    let health = Arc::new(Health::default());
    let contexts = instance_contexts(
        &input.name,
        version,
        &input.dir,
        &model_path,
        config,
        (&health, server),
    );
    let load_error =
        |e: BackendError| format!("failed to load '{}' version {version}: {e}", input.name);
    let samples = warmup_samples(config, &input.dir)?;
    let load_started = std::time::Instant::now();
    let load_instances = || {
        let mut instances = Vec::with_capacity(contexts.len());
        let mut limits = Vec::with_capacity(contexts.len());
        for (ctx, needs) in &contexts {
            let limit = input.rate_limiter.register(needs.clone()).map_err(|e| {
                format!(
                    "failed to load '{}' version {version}: instance '{}' {e}",
                    input.name, ctx.instance_name
                )
            })?;
            let mut instance = backend.load_instance(ctx).map_err(load_error)?;
            warm_up(
                instance.as_mut(),
                &samples,
                &config.ragged,
                &ctx.instance_name,
            )?;
            instances.push((ctx.instance_name.clone(), instance));
            limits.push(limit);
        }
        Ok::<_, String>((instances, limits))
    };
    // Memory of the version: its instances' own processes, or what the load kept of this
    // process's C heap (loads measured one at a time).
    let (loaded, memory_bytes) = if backend.out_of_process() {
        let loaded = load_instances()?;
        let memory = processes_memory(&loaded.0);
        (loaded, memory)
    } else {
        let (loaded, growth) = crate::probe::heap::measure(load_instances);
        (loaded?, growth.unwrap_or(0))
    };
    let (instances, limits) = loaded;
    let stats = Arc::new(VersionStats::with_first_response_buckets(
        config.metrics.first_response_buckets.as_deref(),
    ));
    let policy = BatchPolicy::load(config, &input.dir)?;
    let scheduler = Scheduler::start(
        &input.name,
        policy,
        instances,
        limits,
        stats.clone(),
        input.queue_capacity,
    )
    .map_err(load_error)?;
    stats.set_load(LoadReport {
        duration: load_started.elapsed(),
        memory_bytes,
    });
    Ok(VersionParts {
        runner: if config.decoupled {
            Runner::Decoupled(scheduler)
        } else {
            Runner::Batched(scheduler)
        },
        stats,
        health,
    })
}

/// The anonymous memory of the processes `instances` run in (Python stubs), together; a
/// process that several instances share counts once.
fn processes_memory(instances: &[(String, Box<dyn BackendInstance>)]) -> u64 {
    instances
        .iter()
        .filter_map(|(_, instance)| instance.process_id())
        .collect::<std::collections::BTreeSet<u32>>()
        .into_iter()
        .filter_map(crate::probe::host::process_anon_memory)
        .sum()
}

/// One context per instance of every instance group (`KIND_GPU` groups: `count` per listed GPU),
/// with what the instance needs from the rate limiter.
fn instance_contexts(
    name: &str,
    version: i64,
    model_dir: &Path,
    model_path: &Path,
    config: &Arc<ValidModelConfig>,
    (health, server): (&Arc<Health>, &Arc<ServerHandle>),
) -> Vec<(InstanceContext, InstanceNeeds)> {
    let mut contexts = Vec::new();
    for group in &config.instance_groups {
        let devices: Vec<DeviceKind> = match &group.kind {
            GroupKind::Gpu { gpus } => gpus
                .iter()
                .map(|&device_id| DeviceKind::Gpu { device_id })
                .collect(),
            GroupKind::Cpu | GroupKind::Model => vec![DeviceKind::Cpu],
        };
        let mut index = 0;
        for device in devices {
            for _ in 0..group.count {
                let context = InstanceContext {
                    model_name: name.to_string(),
                    version,
                    model_dir: model_dir.to_path_buf(),
                    model_path: model_path.to_path_buf(),
                    config: config.clone(),
                    instance_name: format!("{}_{index}", group.name),
                    device,
                    health: health.clone(),
                    server: server.clone(),
                };
                contexts.push((context, rate_limit_needs(group, device)));
                index += 1;
            }
        }
    }
    contexts
}

/// What an instance of `group` on `device` needs from the rate limiter: per-device resources
/// on its GPU (CPU instances: device 0), global ones once for the server.
fn rate_limit_needs(group: &InstanceGroup, device: DeviceKind) -> InstanceNeeds {
    let device_id = match device {
        DeviceKind::Gpu { device_id } => device_id,
        DeviceKind::Cpu => 0,
    };
    InstanceNeeds {
        resources: group
            .resources
            .iter()
            .map(|r| {
                let key = ResourceKey {
                    name: r.name.clone(),
                    device: (!r.global).then_some(device_id),
                };
                (key, r.count)
            })
            .collect(),
        priority: group.priority,
    }
}

/// Runs every warmup sample `count` times on a freshly loaded instance; the first failure
/// fails the load with its reason. `ragged`: the model's ragged batching, which a sample gets
/// as a batch of one does (its batch inputs generated, its ragged inputs flattened).
fn warm_up(
    instance: &mut dyn BackendInstance,
    samples: &[WarmupSample],
    ragged: &RaggedBatching,
    instance_name: &str,
) -> Result<(), String> {
    for sample in samples {
        for _ in 0..sample.count.max(1) {
            run_sample(instance, sample, ragged).map_err(|e| {
                format!(
                    "instance '{instance_name}' failed warmup sample '{}': {e}",
                    sample.name
                )
            })?;
        }
    }
    Ok(())
}

/// One warmup execution, as a joined batch or (request-level backends) as one request.
fn run_sample(
    instance: &mut dyn BackendInstance,
    sample: &WarmupSample,
    ragged: &RaggedBatching,
) -> Result<(), BackendError> {
    if !instance.request_level() {
        if ragged.is_empty() {
            return instance
                .execute(&BatchInputs::single(&sample.inputs), &sample.outputs)
                .map(drop);
        }
        let requests = [sample.inputs.as_slice()];
        let generated = scheduler::ragged::batch_inputs(ragged, &requests)
            .map_err(BackendError::InvalidInput)?;
        let inputs = BatchInputs::ragged(&requests, &ragged.ragged_inputs, &generated)?;
        return instance.execute(&inputs, &sample.outputs).map(drop);
    }
    let parameters = Default::default();
    let view = RequestView {
        key: 0,
        id: "",
        inputs: &sample.inputs,
        outputs: &sample.outputs,
        parameters: &parameters,
        correlation_id: None,
        flags: 0,
        stream: None,
    };
    match instance
        .execute_requests(&[view], &mut Phases::default())?
        .pop()
    {
        Some(outcome) => outcome.into_answer().map(drop),
        None => Err(BackendError::Execution(
            "the warmup request got no answer".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With two GPUs (injected), a `KIND_AUTO` Python group of count 2 has two instances on
    /// each GPU, named across the group as Triton names them; without GPUs, two CPU instances.
    #[test]
    fn kind_auto_groups_get_count_instances_per_visible_gpu() {
        let dir = tempfile::tempdir().unwrap();
        let version = dir.path().join("1");
        std::fs::create_dir_all(&version).unwrap();
        std::fs::write(version.join("model.py"), "").unwrap();
        let devices = |gpus: u32| {
            let raw = config::text::parse_model_config(
                r#"backend: "python"
                   input [{ name: "IN" data_type: TYPE_FP32 dims: [1] }]
                   output [{ name: "OUT" data_type: TYPE_FP32 dims: [1] }]
                   instance_group [{ count: 2 }]"#,
            )
            .unwrap();
            let backends = Backends::new(None).with_gpu_count(gpus);
            let options = CompleteOptions {
                auto_complete: false,
            };
            let valid = crate::backend::complete(
                "m",
                raw,
                std::slice::from_ref(&version),
                &backends,
                options,
            )
            .unwrap();
            let handles = (&Arc::new(Health::default()), backends.server());
            instance_contexts("m", 1, dir.path(), &version, &Arc::new(valid), handles)
                .into_iter()
                .map(|(c, _)| (c.instance_name, c.device))
                .collect::<Vec<_>>()
        };
        let gpu = |device_id| DeviceKind::Gpu { device_id };
        assert_eq!(
            devices(2),
            vec![
                ("m_0_0".to_string(), gpu(0)),
                ("m_0_1".to_string(), gpu(0)),
                ("m_0_2".to_string(), gpu(1)),
                ("m_0_3".to_string(), gpu(1)),
            ]
        );
        assert_eq!(
            devices(0),
            vec![
                ("m_0_0".to_string(), DeviceKind::Cpu),
                ("m_0_1".to_string(), DeviceKind::Cpu),
            ]
        );
    }
}
