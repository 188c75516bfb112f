//! An ensemble checked against its composing models: the [`EnsemblePlan`] a loaded ensemble
//! version runs, or every reason it cannot load.
//!
//! ```text
//! graph::analyze(declared steps) ─► per step: circular dependency through other ensembles?
//!   ─► composing config (lookup: loaded? that version served?) ─► batch size?
//!   ─► input_map / output_map keys are the model's tensors, every required input mapped
//! ─► per tensor: producer (ensemble input or step output) and each reader agree on data type
//!    and full shape (batch dimension included, -1 matches any size)
//! ─► decoupled origins ([`super::origin`]): no step mixes them; decoupled step ⇒ the
//!    ensemble is decoupled
//! ```
//!
//! Pure: the composing models' configs come from a lookup function, so the manager decides
//! what "available" means and tests need no repository.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use nereid_proto::pb::inference::ModelTransactionPolicy;
use nereid_proto::pb::inference::model_config::SchedulingChoice;
use nereid_proto::{DataType, format_shape};

use super::limit::StepLimits;
use super::origin::{self, Origins};
use super::step_label;
use crate::config::ValidModelConfig;
use crate::config::ensemble_graph::{self as graph, StepNode};

/// A step of a plan: the composing model (version), and how its tensors map to the ensemble's.
pub type PlanStep = StepNode;

/// What a loaded ensemble version runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnsemblePlan {
    /// The ensemble's name.
    pub name: String,
    /// In config order (step indices in messages are positions in this list).
    pub steps: Vec<PlanStep>,
    /// Every step once, each after the steps it reads from.
    pub order: Vec<usize>,
    /// `ensemble_scheduling.max_inflight_requests`: how many requests each step may have in
    /// flight at once, across the ensemble's requests.
    pub limits: StepLimits,
    /// Which steps are decoupled and where every step's inputs come from; a plan with a
    /// decoupled step streams ([`EnsemblePlan::decoupled`]).
    pub origins: Origins,
}

impl EnsemblePlan {
    /// Whether the ensemble is decoupled (some step is): it answers through a response
    /// stream, and its config says `model_transaction_policy { decoupled: true }`.
    pub fn decoupled(&self) -> bool {
        self.origins.decoupled()
    }
}

/// Builds the plan of the ensemble `config` (complete and validated). `lookup(model, version)`
/// gives a composing model's config (`None` = its latest served version), or why there is
/// none. Errors: every problem found, each a sentence naming the ensemble, the step and the
/// tensor, joined with "; ".
pub fn plan(
    config: &ValidModelConfig,
    lookup: impl Fn(&str, Option<i64>) -> Result<Arc<ValidModelConfig>, String>,
) -> Result<EnsemblePlan, String> {
    let e = &config.name;
    let inputs: Vec<&str> = config.inputs.iter().map(|i| i.name.as_str()).collect();
    let outputs: Vec<&str> = config.outputs.iter().map(|o| o.name.as_str()).collect();
    let declared = graph::Declared {
        name: e,
        inputs: &inputs,
        outputs: &outputs,
        steps: config.ensemble_steps(),
    };
    let graph = graph::analyze(declared).map_err(|errors| errors.join("; "))?;
    let mut errors = Vec::new();
    let mut composing: Vec<Option<Arc<ValidModelConfig>>> = Vec::with_capacity(graph.steps.len());
    for (i, step) in graph.steps.iter().enumerate() {
        let label = step_label(i, &step.model);
        if let Some(path) = cycle_back_to(e, &step.model, &lookup) {
            errors.push(format!(
                "ensemble '{e}' {label}: circular dependency between ensembles: {e} -> {}",
                path.join(" -> ")
            ));
            composing.push(None);
            continue;
        }
        match lookup(&step.model, step.version) {
            Ok(model) => {
                check_step(&mut errors, config, i, step, &model);
                composing.push(Some(model));
            }
            Err(why) => {
                let version = step
                    .version
                    .map_or(String::new(), |v| format!(" version {v}"));
                errors.push(format!(
                    "ensemble '{e}' step {i}: composing model '{}'{version} is not available: {why}",
                    step.model
                ));
                composing.push(None);
            }
        }
    }
    check_tensors(&mut errors, config, &graph.steps, &composing);
    if !errors.is_empty() {
        return Err(errors.join("; "));
    }
    let decoupled: Vec<bool> = composing
        .iter()
        .map(|c| c.as_ref().is_some_and(|m| m.decoupled))
        .collect();
    match origin::analyze(e, &graph.steps, &graph.order, &decoupled) {
        Ok(origins) => Ok(EnsemblePlan {
            name: e.clone(),
            limits: StepLimits::new(max_inflight_requests(config), graph.steps.len()),
            steps: graph.steps,
            order: graph.order,
            origins,
        }),
        Err(errors) => Err(errors.join("; ")),
    }
}

/// `config` as a loaded ensemble answers it: `model_transaction_policy { decoupled }` says
/// what the plan found (whatever the file said), as in Triton.
pub fn completed_config(
    config: &ValidModelConfig,
    plan: &EnsemblePlan,
) -> Result<ValidModelConfig, String> {
    let decoupled = plan.decoupled();
    let mut wire = config.wire().clone();
    let current = wire
        .model_transaction_policy
        .as_ref()
        .is_some_and(|p| p.decoupled);
    if current == decoupled {
        return Ok(config.clone());
    }
    wire.model_transaction_policy = Some(ModelTransactionPolicy { decoupled });
    ValidModelConfig::try_from(wire).map_err(|e| e.to_string())
}

/// `ensemble_scheduling.max_inflight_requests` of the ensemble (0: unlimited).
fn max_inflight_requests(config: &ValidModelConfig) -> u32 {
    match &config.wire().scheduling_choice {
        Some(SchedulingChoice::EnsembleScheduling(s)) => s.max_inflight_requests,
        Some(SchedulingChoice::DynamicBatching(_) | SchedulingChoice::SequenceBatching(_))
        | None => 0,
    }
}

/// A path of composing models from `start` back to `ensemble` through loaded ensembles, if
/// there is one (`[ensemble]` when a step names the ensemble itself).
fn cycle_back_to(
    ensemble: &str,
    start: &str,
    lookup: &impl Fn(&str, Option<i64>) -> Result<Arc<ValidModelConfig>, String>,
) -> Option<Vec<String>> {
    let mut stack = vec![vec![start.to_string()]];
    let mut seen = HashSet::new();
    while let Some(path) = stack.pop() {
        let model = &path[path.len() - 1];
        if model == ensemble {
            return Some(path);
        }
        if !seen.insert(model.clone()) {
            continue;
        }
        if let Ok(config) = lookup(model, None) {
            for next in config.composing_models().into_iter().rev() {
                let mut longer = path.clone();
                longer.push(next);
                stack.push(longer);
            }
        }
    }
    None
}

/// The checks of one step against its composing model's config.
fn check_step(
    errors: &mut Vec<String>,
    ensemble: &ValidModelConfig,
    index: usize,
    step: &PlanStep,
    model: &ValidModelConfig,
) {
    let e = &ensemble.name;
    let m = &step.model;
    let label = step_label(index, m);
    if ensemble.max_batch_size > 0
        && model.max_batch_size > 0
        && model.max_batch_size < ensemble.max_batch_size
    {
        errors.push(format!(
            "ensemble '{e}' allows max_batch_size {}, but {label} allows only {}: a batching ensemble needs composing models that batch at least as much (or do not batch at all)",
            ensemble.max_batch_size, model.max_batch_size
        ));
    }
    let server_fed = |name: &str| {
        model.sequence().is_some_and(|io| {
            io.control_inputs.iter().any(|c| c == name)
                || io.states.iter().any(|s| s.input_name == name)
        })
    };
    let names = |tensors: Vec<&str>| {
        let quoted: Vec<String> = tensors.iter().map(|n| format!("'{n}'")).collect();
        quoted.join(", ")
    };
    for (input, _) in &step.inputs {
        if model.input(input).is_none() {
            errors.push(format!(
                "ensemble '{e}' {label}: input_map key '{input}' is not an input of model '{m}' (its inputs: {})",
                names(model.inputs.iter().map(|i| i.name.as_str()).collect())
            ));
        }
    }
    for input in &model.inputs {
        if !input.optional
            && !server_fed(&input.name)
            && !step.inputs.iter().any(|(k, _)| *k == input.name)
        {
            errors.push(format!(
                "ensemble '{e}' {label}: input '{}' of model '{m}' is not mapped to any ensemble tensor (add it to the step's input_map)",
                input.name
            ));
        }
    }
    for (output, _) in &step.outputs {
        if model.output(output).is_none() {
            errors.push(format!(
                "ensemble '{e}' {label}: output_map key '{output}' is not an output of model '{m}' (its outputs: {})",
                names(model.outputs.iter().map(|o| o.name.as_str()).collect())
            ));
        }
    }
}

/// A tensor as its producer or a reader declares it.
struct Spec {
    data_type: DataType,
    /// Batch dimension (-1) included when the declaring model batches.
    shape: Vec<i64>,
    /// "ensemble input 'x'", "step 1 (model 'm') output 'y'", ...
    who: String,
}

impl Spec {
    fn new(batching: bool, data_type: DataType, dims: &[i64], who: String) -> Spec {
        let mut shape = Vec::with_capacity(dims.len() + 1);
        if batching {
            shape.push(-1);
        }
        shape.extend_from_slice(dims);
        Spec {
            data_type,
            shape,
            who,
        }
    }
}

/// Producer and readers of every tensor agree on data type and shape.
fn check_tensors(
    errors: &mut Vec<String>,
    ensemble: &ValidModelConfig,
    steps: &[PlanStep],
    composing: &[Option<Arc<ValidModelConfig>>],
) {
    let e = &ensemble.name;
    let batching = ensemble.batching();
    let mut sources: BTreeMap<&str, Spec> = BTreeMap::new();
    for input in &ensemble.inputs {
        let who = format!("ensemble input '{}'", input.name);
        sources.insert(
            &input.name,
            Spec::new(batching, input.datatype, &input.dims, who),
        );
    }
    for (i, (step, model)) in steps.iter().zip(composing).enumerate() {
        let Some(model) = model else { continue };
        for (output, tensor) in &step.outputs {
            if let Some(o) = model.output(output) {
                let who = format!("{} output '{output}'", step_label(i, &step.model));
                let spec = Spec::new(model.batching(), o.datatype, &o.dims, who);
                sources.insert(tensor, spec);
            }
        }
    }
    let mut compare = |tensor: &str, reader: Spec| {
        let Some(source) = sources.get(tensor) else {
            return;
        };
        if source.data_type != reader.data_type {
            errors.push(format!(
                "ensemble '{e}' tensor '{tensor}': data type mismatch: {} expects {}, but {} is {}",
                reader.who,
                type_name(reader.data_type),
                source.who,
                type_name(source.data_type)
            ));
        } else if !shapes_match(&source.shape, &reader.shape) {
            errors.push(format!(
                "ensemble '{e}' tensor '{tensor}': shape mismatch: {} expects {}, but {} has {}",
                reader.who,
                format_shape(&reader.shape),
                source.who,
                format_shape(&source.shape)
            ));
        }
    };
    for (i, (step, model)) in steps.iter().zip(composing).enumerate() {
        let Some(model) = model else { continue };
        for (input, tensor) in &step.inputs {
            if let Some(spec) = model.input(input) {
                let who = format!("{} input '{input}'", step_label(i, &step.model));
                let reader = Spec::new(model.batching(), spec.datatype, &spec.dims, who);
                compare(tensor, reader);
            }
        }
    }
    for output in &ensemble.outputs {
        let who = format!("ensemble output '{}'", output.name);
        compare(
            &output.name,
            Spec::new(batching, output.datatype, &output.dims, who),
        );
    }
}

/// Same rank, and every dimension equal or -1 (variable) on either side.
fn shapes_match(a: &[i64], b: &[i64]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(&x, &y)| x == y || x == -1 || y == -1)
}

fn type_name(data_type: DataType) -> &'static str {
    data_type.to_config().as_str_name()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::text::parse_model_config;

    fn config(name: &str, text: &str) -> Arc<ValidModelConfig> {
        let mut c = parse_model_config(text).unwrap();
        c.name = name.into();
        Arc::new(ValidModelConfig::unchecked(c))
    }

    /// `scale`: x FP32 [4] -> y, max_batch_size 8. `addsub`: a, b -> sum, diff.
    /// `nobatch`: x FP32 [-1, 4] -> y, no batching. `dec`: decoupled. `seq`: a sequence model
    /// with a server-fed control input.
    fn models() -> BTreeMap<String, Arc<ValidModelConfig>> {
        let mut m = BTreeMap::new();
        let io = r#"input [{ name: "x" data_type: TYPE_FP32 dims: [4] }]
                    output [{ name: "y" data_type: TYPE_FP32 dims: [4] }]"#;
        m.insert(
            "scale".into(),
            config("scale", &format!("max_batch_size: 8 {io}")),
        );
        m.insert(
            "addsub".into(),
            config(
                "addsub",
                r#"max_batch_size: 8
                input [{ name: "a" data_type: TYPE_FP32 dims: [4] }, { name: "b" data_type: TYPE_FP32 dims: [4] }, { name: "opt" data_type: TYPE_FP32 dims: [4] optional: true }]
                output [{ name: "sum" data_type: TYPE_FP32 dims: [4] }, { name: "diff" data_type: TYPE_FP32 dims: [4] }]"#,
            ),
        );
        m.insert(
            "nobatch".into(),
            config(
                "nobatch",
                r#"input [{ name: "x" data_type: TYPE_FP32 dims: [-1, 4] }]
                   output [{ name: "y" data_type: TYPE_FP32 dims: [-1, 4] }]"#,
            ),
        );
        m.insert(
            "dec".into(),
            config(
                "dec",
                &format!("max_batch_size: 8 model_transaction_policy {{ decoupled: true }} {io}"),
            ),
        );
        m.insert(
            "seq".into(),
            config(
                "seq",
                r#"max_batch_size: 8
                   input [{ name: "x" data_type: TYPE_FP32 dims: [4] }, { name: "START" data_type: TYPE_INT32 dims: [1] }]
                   output [{ name: "y" data_type: TYPE_FP32 dims: [4] }]
                   sequence_batching { control_input [{ name: "START" control [{ kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1] }] }] }"#,
            ),
        );
        m
    }

    fn lookup_in(
        models: &BTreeMap<String, Arc<ValidModelConfig>>,
    ) -> impl Fn(&str, Option<i64>) -> Result<Arc<ValidModelConfig>, String> + '_ {
        |name, version| match (models.get(name), version) {
            (Some(c), None | Some(1)) => Ok(c.clone()),
            (Some(_), Some(v)) => Err(format!("version {v} is not served")),
            (None, _) => Err("it is not in the model repository".into()),
        }
    }

    fn ensemble(name: &str, mbs: i32, io: &str, steps: &str) -> Arc<ValidModelConfig> {
        config(
            name,
            &format!(
                r#"platform: "ensemble" max_batch_size: {mbs} {io}
                   ensemble_scheduling {{ step [ {steps} ] }}"#
            ),
        )
    }

    const IO: &str = r#"input [{ name: "IN" data_type: TYPE_FP32 dims: [4] }]
                        output [{ name: "OUT" data_type: TYPE_FP32 dims: [4] }]"#;

    fn step(model: &str, inputs: &[(&str, &str)], outputs: &[(&str, &str)]) -> String {
        let map = |kind: &str, pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| format!(r#"{kind} {{ key: "{k}" value: "{v}" }} "#))
                .collect::<String>()
        };
        format!(
            r#"{{ model_name: "{model}" model_version: -1 {} {} }}"#,
            map("input_map", inputs),
            map("output_map", outputs)
        )
    }

    fn plan_of(e: &ValidModelConfig) -> Result<EnsemblePlan, String> {
        let models = models();
        plan(e, lookup_in(&models))
    }

    #[test]
    fn plans_a_pipeline() {
        let steps = [
            step("scale", &[("x", "IN")], &[("y", "scaled")]),
            step("addsub", &[("a", "scaled"), ("b", "IN")], &[("sum", "OUT")]),
        ]
        .join(", ");
        let p = plan_of(&ensemble("e", 8, IO, &steps)).unwrap();
        assert_eq!(p.name, "e");
        assert_eq!(p.order, vec![0, 1]);
        assert_eq!(p.steps[1].after, vec![0]);
        assert_eq!(p.limits, StepLimits::unlimited());
        assert_eq!(
            p.steps[1].outputs,
            vec![("sum".to_string(), "OUT".to_string())]
        );
    }

    #[test]
    fn max_inflight_requests_limits_every_step() {
        let steps = [
            step("scale", &[("x", "IN")], &[("y", "scaled")]),
            step("addsub", &[("a", "scaled"), ("b", "IN")], &[("sum", "OUT")]),
        ]
        .join(", ");
        let e = config(
            "e",
            &format!(
                r#"platform: "ensemble" max_batch_size: 8 {IO}
                   ensemble_scheduling {{ max_inflight_requests: 3 step [ {steps} ] }}"#
            ),
        );
        let p = plan_of(&e).unwrap();
        assert_eq!(p.limits, StepLimits::new(3, 2));
        assert_eq!(p.limits.max(), 3);
    }

    #[test]
    fn a_non_batching_model_fits_when_full_shapes_agree() {
        let steps = step("nobatch", &[("x", "IN")], &[("y", "OUT")]);
        assert!(plan_of(&ensemble("e", 4, IO, &steps)).is_ok());
        // A non-batching ensemble must spell the batch dimension out for a batching model.
        let e = plan_of(&ensemble(
            "e",
            0,
            IO,
            &step("scale", &[("x", "IN")], &[("y", "OUT")]),
        ))
        .unwrap_err();
        assert!(e.starts_with(
            "ensemble 'e' tensor 'IN': shape mismatch: step 0 (model 'scale') input 'x' expects [-1,4], but ensemble input 'IN' has [4]"
        ), "{e}");
    }

    #[test]
    fn unknown_or_unavailable_composing_models() {
        let e = plan_of(&ensemble(
            "e",
            8,
            IO,
            &step("ghost", &[("x", "IN")], &[("y", "OUT")]),
        ))
        .unwrap_err();
        assert_eq!(
            e,
            "ensemble 'e' step 0: composing model 'ghost' is not available: it is not in the model repository"
        );
        let versioned = r#"{ model_name: "scale" model_version: 3 input_map { key: "x" value: "IN" } output_map { key: "y" value: "OUT" } }"#;
        let e = plan_of(&ensemble("e", 8, IO, versioned)).unwrap_err();
        assert_eq!(
            e,
            "ensemble 'e' step 0: composing model 'scale' version 3 is not available: version 3 is not served"
        );
    }

    #[test]
    fn a_decoupled_step_makes_the_ensemble_decoupled() {
        let steps = [
            step("dec", &[("x", "IN")], &[("y", "MID")]),
            step("scale", &[("x", "MID")], &[("y", "OUT")]),
        ]
        .join(", ");
        let e = ensemble("e", 8, IO, &steps);
        let p = plan_of(&e).unwrap();
        assert!(p.decoupled());
        assert_eq!(p.origins.decoupled_steps, vec![true, false]);
        let completed = completed_config(&e, &p).unwrap();
        assert!(completed.decoupled);
        assert_eq!(
            completed.wire().model_transaction_policy,
            Some(ModelTransactionPolicy { decoupled: true })
        );
        // A file that says decoupled over plain steps is corrected too.
        let plain = config(
            "e",
            &format!(
                r#"platform: "ensemble" max_batch_size: 8 {IO}
                   model_transaction_policy {{ decoupled: true }}
                   ensemble_scheduling {{ step [ {} ] }}"#,
                step("scale", &[("x", "IN")], &[("y", "OUT")])
            ),
        );
        let p = plan_of(&plain).unwrap();
        assert!(!p.decoupled());
        assert!(!completed_config(&plain, &p).unwrap().decoupled);
    }

    #[test]
    fn a_step_may_not_mix_decoupled_origins() {
        let steps = [
            step("dec", &[("x", "IN")], &[("y", "MID")]),
            step("addsub", &[("a", "MID"), ("b", "IN")], &[("sum", "OUT")]),
        ]
        .join(", ");
        assert_eq!(
            plan_of(&ensemble("e", 8, IO, &steps)).unwrap_err(),
            "in ensemble e, step of model 'e' receives inputs originated from different decoupled models (step 1 (model 'addsub') reads 'MID' from the responses of step 0 (model 'dec'), 'IN' from the request)"
        );
    }

    #[test]
    fn batch_size_must_fit() {
        let e = plan_of(&ensemble(
            "e",
            16,
            IO,
            &step("scale", &[("x", "IN")], &[("y", "OUT")]),
        ))
        .unwrap_err();
        assert_eq!(
            e,
            "ensemble 'e' allows max_batch_size 16, but step 0 (model 'scale') allows only 8: a batching ensemble needs composing models that batch at least as much (or do not batch at all)"
        );
    }

    #[test]
    fn maps_must_name_the_models_tensors() {
        let steps = [
            step(
                "addsub",
                &[("a", "IN"), ("c", "IN")],
                &[("sum", "OUT"), ("prod", "P")],
            ),
            step("scale", &[("x", "P")], &[("y", "Q")]),
            step("scale", &[("x", "Q")], &[("zz", "R")]),
        ]
        .join(", ");
        let io = r#"input [{ name: "IN" data_type: TYPE_FP32 dims: [4] }]
                    output [{ name: "OUT" data_type: TYPE_FP32 dims: [4] }, { name: "R" data_type: TYPE_FP32 dims: [4] }]"#;
        let e = plan_of(&ensemble("e", 8, io, &steps)).unwrap_err();
        assert_eq!(
            e.split("; ").collect::<Vec<_>>(),
            vec![
                "ensemble 'e' step 0 (model 'addsub'): input_map key 'c' is not an input of model 'addsub' (its inputs: 'a', 'b', 'opt')",
                "ensemble 'e' step 0 (model 'addsub'): input 'b' of model 'addsub' is not mapped to any ensemble tensor (add it to the step's input_map)",
                "ensemble 'e' step 0 (model 'addsub'): output_map key 'prod' is not an output of model 'addsub' (its outputs: 'sum', 'diff')",
                "ensemble 'e' step 2 (model 'scale'): output_map key 'zz' is not an output of model 'scale' (its outputs: 'y')",
            ]
        );
    }

    #[test]
    fn server_fed_inputs_need_no_mapping() {
        let steps = step("seq", &[("x", "IN")], &[("y", "OUT")]);
        assert!(plan_of(&ensemble("e", 8, IO, &steps)).is_ok());
    }

    #[test]
    fn data_types_and_shapes_must_agree() {
        let int_in = r#"input [{ name: "IN" data_type: TYPE_INT32 dims: [4] }]
                        output [{ name: "OUT" data_type: TYPE_FP32 dims: [4] }]"#;
        let e = plan_of(&ensemble(
            "e",
            8,
            int_in,
            &step("scale", &[("x", "IN")], &[("y", "OUT")]),
        ))
        .unwrap_err();
        assert_eq!(
            e,
            "ensemble 'e' tensor 'IN': data type mismatch: step 0 (model 'scale') input 'x' expects TYPE_FP32, but ensemble input 'IN' is TYPE_INT32"
        );
        let wide_out = r#"input [{ name: "IN" data_type: TYPE_FP32 dims: [4] }]
                          output [{ name: "OUT" data_type: TYPE_FP32 dims: [3] }]"#;
        let e = plan_of(&ensemble(
            "e",
            8,
            wide_out,
            &step("scale", &[("x", "IN")], &[("y", "OUT")]),
        ))
        .unwrap_err();
        assert_eq!(
            e,
            "ensemble 'e' tensor 'OUT': shape mismatch: ensemble output 'OUT' expects [-1,3], but step 0 (model 'scale') output 'y' has [-1,4]"
        );
        // -1 on either side matches any size.
        let variable = r#"input [{ name: "IN" data_type: TYPE_FP32 dims: [-1] }]
                          output [{ name: "OUT" data_type: TYPE_FP32 dims: [-1] }]"#;
        assert!(
            plan_of(&ensemble(
                "e",
                8,
                variable,
                &step("scale", &[("x", "IN")], &[("y", "OUT")])
            ))
            .is_ok()
        );
    }

    #[test]
    fn graph_errors_come_first_and_alone() {
        let steps = step("ghost", &[("x", "nowhere")], &[("y", "OUT")]);
        let e = plan_of(&ensemble("e", 8, IO, &steps)).unwrap_err();
        assert_eq!(
            e,
            "ensemble 'e' step 0 (model 'ghost'): input 'x' reads tensor 'nowhere', which is neither an ensemble input nor produced by any step; ensemble 'e': ensemble input 'IN' is not read by any step"
        );
    }

    #[test]
    fn circular_dependencies_between_ensembles() {
        let mut models = models();
        // outer -> inner -> outer: loading `outer` again must see the loop through `inner`.
        models.insert(
            "inner".into(),
            ensemble(
                "inner",
                8,
                IO,
                &step("outer", &[("IN", "IN")], &[("OUT", "OUT")]),
            ),
        );
        let outer = ensemble(
            "outer",
            8,
            IO,
            &step("inner", &[("IN", "IN")], &[("OUT", "OUT")]),
        );
        let e = plan(&outer, lookup_in(&models)).unwrap_err();
        assert_eq!(
            e,
            "ensemble 'outer' step 0 (model 'inner'): circular dependency between ensembles: outer -> inner -> outer"
        );
        let selfish = ensemble("me", 8, IO, &step("me", &[("IN", "IN")], &[("OUT", "OUT")]));
        assert_eq!(
            plan(&selfish, lookup_in(&models)).unwrap_err(),
            "ensemble 'me' step 0 (model 'me'): circular dependency between ensembles: me -> me"
        );
    }

    #[test]
    fn nested_ensembles_plan_like_models() {
        let mut models = models();
        models.insert(
            "inner".into(),
            ensemble(
                "inner",
                8,
                IO,
                &step("scale", &[("x", "IN")], &[("y", "OUT")]),
            ),
        );
        let outer = ensemble(
            "outer",
            4,
            IO,
            &step("inner", &[("IN", "IN")], &[("OUT", "OUT")]),
        );
        assert!(plan(&outer, lookup_in(&models)).is_ok());
        assert_eq!(outer.composing_models(), vec!["inner"]);
        assert!(models["scale"].composing_models().is_empty());
    }
}
