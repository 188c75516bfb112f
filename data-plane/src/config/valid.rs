//! [`ValidModelConfig`]: a complete model config, checked once and held in typed form.
//!
//! ```text
//! ModelConfig (wire, after complete/defaults) ──TryFrom──► validate::validate (every problem)
//!                                                        ──► typed I/O, batching policies
//!                                                            (batching.rs), warm-up
//!                                                            (warmup.rs), instance groups,
//!                                                            parameters, optimization
//! ```
//!
//! The request path, the manager, the scheduler, the backends and the ensemble planner read the
//! typed fields; nothing after a load re-matches the wire config's scheduling choice or converts
//! its data types. The wire form stays available through [`ValidModelConfig::wire`] for the
//! places that speak the wire: the model-config API (JSON rendering) and the Python backend,
//! which hands Triton's JSON form of the config to the model's `initialize`.

use std::collections::BTreeMap;
use std::sync::Arc;

use nereid_proto::DataType;
use nereid_proto::pb::inference::ModelConfig;
use nereid_proto::pb::inference::model_config::SchedulingChoice;
use nereid_proto::pb::inference::model_instance_group::Kind;

use super::ConfigError;
use super::batch_io::RaggedBatching;
use super::model_metrics::ModelMetrics;
use super::validate;

mod batching;
mod warmup;

pub use self::batching::{
    ControlKind, DynamicBatching, QueuePolicy, SequenceBatching, SequenceControl, SequenceStrategy,
    StateIo, TimeoutAction, Utilization,
};
pub use self::warmup::{WarmupData, WarmupInput, WarmupSetting};

/// A model config that passed every load-time check.
#[derive(Clone, Debug, PartialEq)]
pub struct ValidModelConfig {
    /// The model's name (the config's `name`, which must match its directory).
    pub name: String,
    /// Triton's platform (`onnxruntime_onnx`, `ensemble`, ...); may be empty when only a
    /// backend is named.
    pub platform: String,
    /// Triton's backend (`onnxruntime`, `python`, ...); empty for ensembles.
    pub backend: String,
    /// The largest batch a request may carry; 0: the model does not batch, and its tensors
    /// have no batch dimension.
    pub max_batch_size: u32,
    /// The declared inputs, in config order.
    pub inputs: Vec<InputSpec>,
    /// The declared outputs, in config order.
    pub outputs: Vec<OutputSpec>,
    /// Which scheduler serves the model's requests.
    pub scheduling: Scheduling,
    /// Empty for ensembles (they run no instances).
    pub instance_groups: Vec<InstanceGroup>,
    /// `parameters { key: ... value: { string_value: ... } }`, by key.
    pub parameters: BTreeMap<String, String>,
    /// `model_transaction_policy { decoupled: true }`: any number of responses per request.
    pub decoupled: bool,
    /// The model file or directory inside a version directory.
    pub default_model_filename: String,
    /// `model_warmup`: the samples every instance runs before the version is READY.
    pub warmup: Vec<WarmupSetting>,
    /// `optimization.graph.level` (0 when absent); backends map it to their own levels.
    pub graph_level: i32,
    /// `optimization.execution_accelerators.gpu_execution_accelerator`, in config order: what a
    /// backend adds for its GPU instances (ONNX Runtime: `tensorrt`, `cuda`).
    pub gpu_accelerators: Vec<Accelerator>,
    /// `allow_ragged_batch` inputs, `batch_input` (the inputs the server computes; clients do
    /// not send them) and `batch_output` (the outputs scattered back by input shape).
    pub ragged: RaggedBatching,
    /// `response_cache { enable: true }`: answers may come from the server's response cache
    /// (only when the server runs one, `--cache-config`).
    pub response_cache: bool,
    /// `model_metrics`: the model's histogram bucket overrides.
    pub metrics: ModelMetrics,
    wire: Arc<ModelConfig>,
}

/// One declared input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InputSpec {
    /// The tensor's name as requests send it.
    pub name: String,
    /// The element type a request must send.
    pub datatype: DataType,
    /// Without the batch dimension; -1 is any size.
    pub dims: Vec<i64>,
    /// The shape the model sees (`reshape`), when it differs from `dims`.
    pub reshape: Option<Vec<i64>>,
    /// A request may leave it out.
    pub optional: bool,
    /// `allow_ragged_batch`: requests of a batch may differ in shape.
    pub allow_ragged_batch: bool,
}

/// One declared output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutputSpec {
    /// The tensor's name as responses carry it.
    pub name: String,
    /// The element type the model produces.
    pub datatype: DataType,
    /// Without the batch dimension; -1 is any size.
    pub dims: Vec<i64>,
    /// The shape the model produces (`reshape`), when it differs from `dims`.
    pub reshape: Option<Vec<i64>>,
    /// `label_filename`: the file in the model directory whose lines name the classes of this
    /// output (the classification extension); read when the model loads.
    pub label_filename: Option<String>,
}

/// Which scheduler serves the model (the config's one `scheduling_choice`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scheduling {
    /// No choice: requests run as they come, one per instance execution.
    Direct,
    /// `dynamic_batching`: requests join batches.
    Dynamic(DynamicBatching),
    /// `sequence_batching`: requests of one correlation id run in order on one slot.
    Sequence(SequenceBatching),
    /// `ensemble_scheduling`: steps over composing models.
    Ensemble(Vec<EnsembleStep>),
}

/// One `ensemble_scheduling.step`, its maps sorted by the composing model's tensor name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnsembleStep {
    /// The composing model this step runs.
    pub model_name: String,
    /// -1: the latest served version.
    pub model_version: i64,
    /// `(composing model input, ensemble tensor)`.
    pub input_map: Vec<(String, String)>,
    /// `(composing model output, ensemble tensor)`.
    pub output_map: Vec<(String, String)>,
}

/// The steps of a wire config's `ensemble_scheduling` (empty without one). The manager orders
/// loads and validation checks data flow on the wire config, before it is typed.
pub fn ensemble_steps(wire: &ModelConfig) -> Vec<EnsembleStep> {
    let Some(SchedulingChoice::EnsembleScheduling(s)) = &wire.scheduling_choice else {
        return Vec::new();
    };
    let sorted = |map: &std::collections::HashMap<String, String>| {
        let mut pairs: Vec<(String, String)> =
            map.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        pairs.sort();
        pairs
    };
    s.step
        .iter()
        .map(|step| EnsembleStep {
            model_name: step.model_name.clone(),
            model_version: step.model_version,
            input_map: sorted(&step.input_map),
            output_map: sorted(&step.output_map),
        })
        .collect()
}

/// The composing models named by an ensemble config's steps, each once, in step order (empty
/// for any other model).
pub fn composing_models(wire: &ModelConfig) -> Vec<String> {
    if wire.platform != super::ENSEMBLE_PLATFORM {
        return Vec::new();
    }
    step_models(&ensemble_steps(wire))
}

fn step_models(steps: &[EnsembleStep]) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for step in steps {
        if !names.contains(&step.model_name) {
            names.push(step.model_name.clone());
        }
    }
    names
}

/// One `instance_group`, with `KIND_AUTO` already resolved by the defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceGroup {
    /// The group's name; its instances are named `<group name>_<index in group>`.
    pub name: String,
    /// Instances per device (per listed GPU for `KIND_GPU`).
    pub count: u32,
    /// Where the group's instances run.
    pub kind: GroupKind,
    /// `rate_limiter.resources`: what each instance needs to run under `--rate-limit
    /// execution_count`.
    pub resources: Vec<GroupResource>,
    /// `rate_limiter.priority` (0 when unset, which counts as 1).
    pub priority: u32,
}

/// One execution accelerator of `optimization.execution_accelerators`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Accelerator {
    /// The accelerator's name (e.g. `tensorrt`, `cuda`).
    pub name: String,
    /// The accelerator's settings, by key, passed to the backend as given.
    pub parameters: BTreeMap<String, String>,
}

/// One `rate_limiter.resources` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupResource {
    /// The resource's name, shared by every group that asks for it.
    pub name: String,
    /// One pool for the server instead of one per device.
    pub global: bool,
    /// How many units of the resource each instance needs to run one execution.
    pub count: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
/// Where an instance group's instances run (`instance_group.kind`, `KIND_AUTO` resolved).
pub enum GroupKind {
    /// `KIND_CPU`: on the host.
    Cpu,
    /// On the listed GPUs (the defaults list every visible GPU, or GPU 0 when there is none).
    Gpu {
        /// The CUDA device ordinals; `count` instances are placed on each.
        gpus: Vec<i32>,
    },
    /// `KIND_MODEL`: the model places itself.
    Model,
}

impl ValidModelConfig {
    /// The complete config in wire form, as it was validated.
    pub fn wire(&self) -> &ModelConfig {
        &self.wire
    }

    /// Types a config without validating it: for tests of code that reads configs.
    #[cfg(test)]
    pub(crate) fn unchecked(wire: ModelConfig) -> ValidModelConfig {
        match typed(wire) {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        }
    }

    /// Whether requests carry a batch dimension.
    pub fn batching(&self) -> bool {
        self.max_batch_size > 0
    }

    /// The declared input named `name`, if there is one.
    pub fn input(&self, name: &str) -> Option<&InputSpec> {
        self.inputs.iter().find(|i| i.name == name)
    }

    /// The declared output named `name`, if there is one.
    pub fn output(&self, name: &str) -> Option<&OutputSpec> {
        self.outputs.iter().find(|o| o.name == name)
    }

    /// The sequence batching policy, for `sequence_batching` models.
    pub fn sequence(&self) -> Option<&SequenceBatching> {
        match &self.scheduling {
            Scheduling::Sequence(sb) => Some(sb),
            Scheduling::Direct | Scheduling::Dynamic(_) | Scheduling::Ensemble(_) => None,
        }
    }

    /// The dynamic batching policy, for `dynamic_batching` models.
    pub fn dynamic(&self) -> Option<&DynamicBatching> {
        match &self.scheduling {
            Scheduling::Dynamic(db) => Some(db),
            Scheduling::Direct | Scheduling::Sequence(_) | Scheduling::Ensemble(_) => None,
        }
    }

    /// An ensemble's steps (empty for any other model).
    pub fn ensemble_steps(&self) -> &[EnsembleStep] {
        match &self.scheduling {
            Scheduling::Ensemble(steps) => steps,
            Scheduling::Direct | Scheduling::Dynamic(_) | Scheduling::Sequence(_) => &[],
        }
    }

    /// The composing models an ensemble's steps name, each once, in step order (empty for any
    /// other model).
    pub fn composing_models(&self) -> Vec<String> {
        if self.platform != super::ENSEMBLE_PLATFORM {
            return Vec::new();
        }
        step_models(self.ensemble_steps())
    }
}

impl TryFrom<ModelConfig> for ValidModelConfig {
    type Error = ConfigError;

    /// Checks `wire` (a complete config: defaults filled) and types it.
    fn try_from(wire: ModelConfig) -> Result<ValidModelConfig, ConfigError> {
        let errors = validate::validate(&wire);
        if !errors.is_empty() {
            return Err(ConfigError::Invalid(errors));
        }
        typed(wire).map_err(|e| ConfigError::Invalid(vec![e]))
    }
}

/// A wire config's `parameters` by key, with their string values (what Triton's backends
/// read). Also used on the wire config before validation, by backends that auto-complete.
pub fn parameters(wire: &ModelConfig) -> BTreeMap<String, String> {
    wire.parameters
        .iter()
        .map(|(k, v)| (k.clone(), v.string_value.clone()))
        .collect()
}

/// The typed view of a config that passed validation. The checks here are the ones the
/// conversion itself needs (data types the server knows).
fn typed(wire: ModelConfig) -> Result<ValidModelConfig, String> {
    let m = &wire.name;
    let datatype = |kind: &str, name: &str, t: i32| {
        DataType::from_config_i32(t).ok_or_else(|| {
            format!(
                "model {kind} '{name}' of model '{m}' has a data type this server does not support"
            )
        })
    };
    let reshape =
        |r: Option<&nereid_proto::pb::inference::ModelTensorReshape>| r.map(|r| r.shape.clone());
    let inputs = wire
        .input
        .iter()
        .map(|i| {
            Ok(InputSpec {
                name: i.name.clone(),
                datatype: datatype("input", &i.name, i.data_type)?,
                dims: i.dims.clone(),
                reshape: reshape(i.reshape.as_ref()),
                optional: i.optional,
                allow_ragged_batch: i.allow_ragged_batch,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    let outputs = wire
        .output
        .iter()
        .map(|o| {
            Ok(OutputSpec {
                name: o.name.clone(),
                datatype: datatype("output", &o.name, o.data_type)?,
                dims: o.dims.clone(),
                reshape: reshape(o.reshape.as_ref()),
                label_filename: Some(o.label_filename.clone()).filter(|f| !f.is_empty()),
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    let scheduling = match &wire.scheduling_choice {
        None => Scheduling::Direct,
        Some(SchedulingChoice::DynamicBatching(db)) => {
            Scheduling::Dynamic(DynamicBatching::from_wire(db))
        }
        Some(SchedulingChoice::EnsembleScheduling(_)) => {
            Scheduling::Ensemble(ensemble_steps(&wire))
        }
        Some(SchedulingChoice::SequenceBatching(sb)) => {
            Scheduling::Sequence(SequenceBatching::from_wire(sb))
        }
    };
    let instance_groups = wire
        .instance_group
        .iter()
        .map(|g| InstanceGroup {
            name: g.name.clone(),
            count: g.count.max(1) as u32,
            kind: match Kind::try_from(g.kind).unwrap_or(Kind::Cpu) {
                Kind::Gpu => GroupKind::Gpu {
                    gpus: if g.gpus.is_empty() {
                        vec![0]
                    } else {
                        g.gpus.clone()
                    },
                },
                Kind::Model => GroupKind::Model,
                Kind::Cpu | Kind::Auto => GroupKind::Cpu,
            },
            resources: g
                .rate_limiter
                .iter()
                .flat_map(|r| &r.resources)
                .map(|r| GroupResource {
                    name: r.name.clone(),
                    global: r.global,
                    count: r.count,
                })
                .collect(),
            priority: g.rate_limiter.as_ref().map_or(0, |r| r.priority),
        })
        .collect();
    Ok(ValidModelConfig {
        name: wire.name.clone(),
        platform: wire.platform.clone(),
        backend: wire.backend.clone(),
        max_batch_size: wire.max_batch_size.max(0) as u32,
        inputs,
        outputs,
        scheduling,
        instance_groups,
        parameters: parameters(&wire),
        decoupled: wire
            .model_transaction_policy
            .as_ref()
            .is_some_and(|p| p.decoupled),
        default_model_filename: wire.default_model_filename.clone(),
        warmup: wire
            .model_warmup
            .iter()
            .map(WarmupSetting::from_wire)
            .collect(),
        graph_level: wire
            .optimization
            .as_ref()
            .and_then(|o| o.graph.as_ref())
            .map_or(0, |g| g.level),
        gpu_accelerators: wire
            .optimization
            .iter()
            .flat_map(|o| &o.execution_accelerators)
            .flat_map(|a| &a.gpu_execution_accelerator)
            .map(|a| Accelerator {
                name: a.name.clone(),
                parameters: a
                    .parameters
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            })
            .collect(),
        ragged: RaggedBatching::from_wire(&wire),
        response_cache: wire.response_cache.as_ref().is_some_and(|c| c.enable),
        metrics: ModelMetrics::from_wire(&wire).map_err(|e| e.join("; "))?,
        wire: Arc::new(wire),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> ModelConfig {
        let mut c = super::super::text::parse_model_config(text).unwrap();
        super::super::fill_defaults(&mut c);
        c
    }

    #[test]
    fn types_io_scheduling_and_groups() {
        let c = ValidModelConfig::try_from(parse(
            r#"name: "s" backend: "onnxruntime" max_batch_size: 4
               input [{name: "a" data_type: TYPE_FP32 dims: [2] reshape: {shape: [1, 2]}},
                      {name: "b" data_type: TYPE_STRING dims: [-1] optional: true}]
               output [{name: "y" data_type: TYPE_INT64 dims: [2]}]
               instance_group [{kind: KIND_GPU count: 2}, {kind: KIND_CPU}]
               parameters { key: "k" value: { string_value: "v" } }
               sequence_batching {
                 control_input [{name: "START" control [{kind: CONTROL_SEQUENCE_START fp32_false_true: [0, 1]}]}]
                 state [{input_name: "si" output_name: "so" data_type: TYPE_FP32 dims: [1]}]
               }"#,
        ))
        .unwrap();
        assert!(c.batching());
        assert_eq!(c.max_batch_size, 4);
        let a = c.input("a").unwrap();
        assert_eq!(
            (a.datatype, a.reshape.clone()),
            (DataType::Fp32, Some(vec![1, 2]))
        );
        let b = c.input("b").unwrap();
        assert_eq!((b.datatype, b.optional), (DataType::Bytes, true));
        assert_eq!(c.output("y").unwrap().datatype, DataType::Int64);
        let io = c.sequence().unwrap();
        assert_eq!(io.control_inputs, vec!["START"]);
        assert_eq!(io.states[0].output_name, "so");
        assert_eq!(
            (io.states[0].datatype, io.states[0].initial_dims.clone()),
            (DataType::Fp32, vec![1])
        );
        assert_eq!(io.controls[0].kind, ControlKind::Start);
        assert_eq!(io.controls[0].values[1], 1f32.to_le_bytes().to_vec());
        assert_eq!(c.instance_groups[0].kind, GroupKind::Gpu { gpus: vec![0] });
        assert_eq!(c.instance_groups[0].count, 2);
        assert_eq!(c.instance_groups[1].kind, GroupKind::Cpu);
        assert_eq!(c.parameters["k"], "v");
        assert!(!c.decoupled);
        assert_eq!(c.wire().name, "s");
    }

    #[test]
    fn types_dynamic_batching_optimization_and_batch_tensors() {
        let c = ValidModelConfig::try_from(parse(
            r#"name: "b" backend: "onnxruntime" max_batch_size: 8
               input [{name: "a" data_type: TYPE_FP32 dims: [-1] allow_ragged_batch: true}]
               output [{name: "y" data_type: TYPE_FP32 dims: [1]}]
               batch_input [{kind: BATCH_ELEMENT_COUNT target_name: ["n"] data_type: TYPE_FP32 source_input: ["a"]}]
               batch_output [{kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: ["y"] source_input: ["a"]}]
               optimization { graph { level: 1 } }
               dynamic_batching { preferred_batch_size: [4, 2, 4] priority_levels: 2 default_priority_level: 2 }"#,
        ))
        .unwrap();
        let db = c.dynamic().unwrap();
        assert_eq!(db.preferred_batch_sizes, vec![2, 4]);
        assert_eq!((db.priority_levels, db.default_priority_level), (2, 2));
        assert_eq!(db.queue_policies, vec![QueuePolicy::default(); 2]);
        assert!(c.sequence().is_none());
        assert_eq!(c.graph_level, 1);
        assert!(c.input("a").unwrap().allow_ragged_batch);
        assert_eq!(c.ragged.inputs[0].targets, vec!["n"]);
        assert_eq!(c.ragged.scatter[0].output, "y");
    }

    #[test]
    fn types_warmup_samples() {
        let c = ValidModelConfig::unchecked(parse(
            r#"name: "w" backend: "identity"
               model_warmup [{ name: "s" batch_size: 1 count: 2 inputs [
                 { key: "b" value: { data_type: TYPE_INT32 dims: [1] input_data_file: "f" } },
                 { key: "a" value: { dims: [2] random_data: true } }
               ] }]"#,
        ));
        let w = &c.warmup[0];
        assert_eq!((w.name.as_str(), w.batch_size, w.count), ("s", 1, 2));
        let names: Vec<&str> = w.inputs.keys().map(String::as_str).collect();
        assert_eq!(names, ["a", "b"], "sorted by name");
        assert_eq!(
            w.inputs["a"],
            WarmupInput {
                datatype: None,
                dims: vec![2],
                data: Some(WarmupData::Random)
            }
        );
        assert_eq!(w.inputs["b"].datatype, Some(DataType::Int32));
        assert_eq!(w.inputs["b"].data, Some(WarmupData::File("f".into())));
    }

    #[test]
    fn refuses_what_validation_refuses_with_its_messages() {
        let e = ValidModelConfig::try_from(parse(
            r#"name: "m" backend: "onnxruntime" max_batch_size: 2
               dynamic_batching { preferred_batch_size: [4] }"#,
        ))
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "dynamic batching preferred size must be <= max batch size for m"
        );
    }

    #[test]
    fn decoupled_and_direct() {
        let c = ValidModelConfig::try_from(parse(
            r#"name: "d" backend: "python"
               model_transaction_policy { decoupled: true }"#,
        ))
        .unwrap();
        assert!(c.decoupled);
        assert_eq!(c.scheduling, Scheduling::Direct);
        assert!(!c.batching());
    }
}
