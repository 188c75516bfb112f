//! An ensemble's data flow from its own config alone: which step reads and which produces every
//! tensor, an order the steps can run in, and the mistakes that need no other model's config
//! (empty steps, unmapped and doubly produced tensors, unused inputs, unwritten outputs,
//! cycles). `nereid check-config` reports these through [`super::validate`]; a load repeats them
//! in the ensemble planner (`ensemble::plan`) before looking at the composing models. Here, below
//! both, so that validation needs nothing from the ensemble module.
//!
//! ```text
//! steps ─► producer of every tensor (ensemble input or one step output)
//!       ─► each step input: ensemble input, or after its producer step ("unmapped" if neither)
//!       ─► Kahn's order (lowest step first) ─► steps left over lie on a cycle
//! ```

use std::collections::{BTreeMap, BTreeSet};

use super::EnsembleStep;

/// One step, its maps sorted by the composing model's tensor name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepNode {
    pub model: String,
    /// `None` = the latest served version (`model_version: -1`).
    pub version: Option<i64>,
    /// `(composing model input, ensemble tensor)`.
    pub inputs: Vec<(String, String)>,
    /// `(composing model output, ensemble tensor)`.
    pub outputs: Vec<(String, String)>,
    /// The steps whose outputs this one reads, ascending.
    pub after: Vec<usize>,
}

#[cfg(test)]
impl StepNode {
    /// A step of `model`'s latest version wired by `(model tensor, ensemble tensor)` pairs,
    /// reading the outputs of the steps `after`: how tests write a plan by hand.
    pub(crate) fn wired(
        model: &str,
        inputs: &[(&str, &str)],
        outputs: &[(&str, &str)],
        after: &[usize],
    ) -> StepNode {
        let pairs = |p: &[(&str, &str)]| -> Vec<(String, String)> {
            p.iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect()
        };
        StepNode {
            model: model.into(),
            version: None,
            inputs: pairs(inputs),
            outputs: pairs(outputs),
            after: after.to_vec(),
        }
    }
}

/// An ensemble's checked data flow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Graph {
    /// In config order.
    pub steps: Vec<StepNode>,
    /// Every step once, each after the steps it reads from.
    pub order: Vec<usize>,
}

/// What an ensemble config declares: its name, its tensors and its steps.
#[derive(Clone, Copy, Debug)]
pub struct Declared<'a> {
    pub name: &'a str,
    pub inputs: &'a [&'a str],
    pub outputs: &'a [&'a str],
    pub steps: &'a [EnsembleStep],
}

/// Analyzes an ensemble's steps. Errors are full sentences naming the ensemble, the step and
/// the tensor; all that are found, in config order.
pub fn analyze(declared: Declared<'_>) -> Result<Graph, Vec<String>> {
    let e = declared.name;
    let steps_config = declared.steps;
    if steps_config.is_empty() {
        return Err(vec![format!(
            "ensemble '{e}' must specify 'ensemble_scheduling' with one or more 'step's"
        )]);
    }
    let mut errors = Vec::new();
    let mut steps = Vec::with_capacity(steps_config.len());
    for (i, step) in steps_config.iter().enumerate() {
        let label = step_label(i, &step.model_name);
        if step.model_name.is_empty() {
            errors.push(format!("ensemble '{e}' step {i}: 'model_name' must be set"));
        }
        if step.input_map.is_empty() {
            errors.push(format!(
                "ensemble '{e}' {label}: 'input_map' must map at least one input of the model"
            ));
        }
        if step.output_map.is_empty() {
            errors.push(format!(
                "ensemble '{e}' {label}: 'output_map' must map at least one output of the model"
            ));
        }
        let version = match step.model_version {
            -1 => None,
            v if v > 0 => Some(v),
            v => {
                errors.push(format!(
                    "ensemble '{e}' {label}: 'model_version' must be -1 (the latest version) or a version number, got {v}"
                ));
                None
            }
        };
        steps.push(StepNode {
            model: step.model_name.clone(),
            version,
            inputs: step.input_map.clone(),
            outputs: step.output_map.clone(),
            after: Vec::new(),
        });
    }

    let inputs: BTreeSet<&str> = declared.inputs.iter().copied().collect();
    let outputs: BTreeSet<&str> = declared.outputs.iter().copied().collect();
    // tensor -> (producing step, its output name)
    let mut producers: BTreeMap<String, (usize, String)> = BTreeMap::new();
    for (i, step) in steps.iter().enumerate() {
        let label = step_label(i, &step.model);
        for (output, tensor) in &step.outputs {
            if inputs.contains(tensor.as_str()) {
                errors.push(format!(
                    "ensemble '{e}': tensor '{tensor}' is an ensemble input and is also produced by {label} output '{output}'; every tensor needs exactly one producer"
                ));
            } else if let Some((j, first)) = producers.get(tensor) {
                errors.push(format!(
                    "ensemble '{e}': tensor '{tensor}' is produced twice, by {} output '{first}' and by {label} output '{output}'; every tensor needs exactly one producer",
                    step_label(*j, &steps[*j].model)
                ));
            } else {
                producers.insert(tensor.clone(), (i, output.clone()));
            }
        }
    }

    let mut read = BTreeSet::new();
    for (i, step) in steps.iter_mut().enumerate() {
        let mut after = Vec::new();
        for (input, tensor) in &step.inputs {
            read.insert(tensor.clone());
            if inputs.contains(tensor.as_str()) {
                continue;
            }
            match producers.get(tensor) {
                Some((j, _)) => after.push(*j),
                None => errors.push(format!(
                    "ensemble '{e}' {}: input '{input}' reads tensor '{tensor}', which is neither an ensemble input nor produced by any step",
                    step_label(i, &step.model)
                )),
            }
        }
        after.sort_unstable();
        after.dedup();
        step.after = after;
    }
    for &input in declared.inputs {
        if !read.contains(input) {
            errors.push(format!(
                "ensemble '{e}': ensemble input '{input}' is not read by any step"
            ));
        }
    }
    for &output in declared.outputs {
        if !producers.contains_key(output) {
            errors.push(format!(
                "ensemble '{e}': ensemble output '{output}' is not produced by any step"
            ));
        }
    }
    for (tensor, (j, output)) in &producers {
        if !read.contains(tensor) && !outputs.contains(tensor.as_str()) {
            errors.push(format!(
                "ensemble '{e}': tensor '{tensor}' produced by {} output '{output}' is neither read by a step nor an ensemble output",
                step_label(*j, &steps[*j].model)
            ));
        }
    }

    let order = match topological_order(&steps) {
        Ok(order) => order,
        Err(cycle) => {
            let path: Vec<String> = cycle
                .iter()
                .map(|&i| step_label(i, &steps[i].model))
                .collect();
            errors.push(format!(
                "ensemble '{e}': its steps form a cycle: {} (each feeds the next)",
                path.join(" -> ")
            ));
            Vec::new()
        }
    };
    if errors.is_empty() {
        Ok(Graph { steps, order })
    } else {
        Err(errors)
    }
}

/// Kahn's algorithm, lowest ready step first. On a cycle: one cycle, in data-flow order, its
/// first step repeated at the end.
pub fn topological_order(steps: &[StepNode]) -> Result<Vec<usize>, Vec<usize>> {
    let mut waiting: Vec<usize> = steps.iter().map(|s| s.after.len()).collect();
    let mut readers: Vec<Vec<usize>> = vec![Vec::new(); steps.len()];
    for (i, step) in steps.iter().enumerate() {
        for &j in &step.after {
            readers[j].push(i);
        }
    }
    let mut ready: BTreeSet<usize> = (0..steps.len()).filter(|&i| waiting[i] == 0).collect();
    let mut order = Vec::with_capacity(steps.len());
    while let Some(i) = ready.pop_first() {
        order.push(i);
        for &r in &readers[i] {
            waiting[r] -= 1;
            if waiting[r] == 0 {
                ready.insert(r);
            }
        }
    }
    if order.len() == steps.len() {
        return Ok(order);
    }
    // Every step left waits on another step left: walking "reads from" edges from the lowest
    // one must come back to a step already seen.
    let left = |i: usize| waiting[i] > 0;
    let mut walk = vec![(0..steps.len()).find(|&i| left(i)).unwrap_or(0)];
    loop {
        let current = walk[walk.len() - 1];
        let Some(&next) = steps[current].after.iter().find(|&&j| left(j)) else {
            return Err(walk);
        };
        if let Some(start) = walk.iter().position(|&s| s == next) {
            let mut cycle: Vec<usize> = walk[start..].to_vec();
            cycle.reverse();
            let lowest = (0..cycle.len()).min_by_key(|&k| cycle[k]).unwrap_or(0);
            cycle.rotate_left(lowest);
            cycle.push(cycle[0]);
            return Err(cycle);
        }
        walk.push(next);
    }
}

/// `step N (model 'm')`: how messages name a step (N is its position in the config).
pub(crate) fn step_label(index: usize, model: &str) -> String {
    format!("step {index} (model '{model}')")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::text::parse_model_config;
    use nereid_proto::pb::inference::ModelConfig;

    /// Analyzes a wire config the way validation does.
    fn analyze(c: &ModelConfig) -> Result<Graph, Vec<String>> {
        let inputs: Vec<&str> = c.input.iter().map(|i| i.name.as_str()).collect();
        let outputs: Vec<&str> = c.output.iter().map(|o| o.name.as_str()).collect();
        super::analyze(Declared {
            name: &c.name,
            inputs: &inputs,
            outputs: &outputs,
            steps: &crate::config::ensemble_steps(c),
        })
    }

    fn ensemble(text: &str) -> ModelConfig {
        let mut c = parse_model_config(text).unwrap();
        c.name = "e".into();
        c.platform = "ensemble".into();
        c
    }

    const IO: &str = r#"
        input [{ name: "IN" data_type: TYPE_FP32 dims: [4] }]
        output [{ name: "OUT" data_type: TYPE_FP32 dims: [4] }]"#;

    fn with_steps(steps: &str) -> ModelConfig {
        ensemble(&format!("{IO} ensemble_scheduling {{ step [ {steps} ] }}"))
    }

    #[test]
    fn orders_a_diamond_and_records_dependencies() {
        // Config order puts the join first: the order must still run it last.
        let g = analyze(&with_steps(
            r#"{ model_name: "join" model_version: -1 input_map { key: "a" value: "L" } input_map { key: "b" value: "R" } output_map { key: "y" value: "OUT" } },
               { model_name: "left" model_version: -1 input_map { key: "x" value: "IN" } output_map { key: "y" value: "L" } },
               { model_name: "right" model_version: 2 input_map { key: "x" value: "IN" } output_map { key: "y" value: "R" } }"#,
        ))
        .unwrap();
        assert_eq!(g.order, vec![1, 2, 0]);
        assert_eq!(g.steps[0].after, vec![1, 2]);
        assert!(g.steps[1].after.is_empty());
        assert_eq!(g.steps[2].version, Some(2));
        assert_eq!(g.steps[1].version, None);
        assert_eq!(
            g.steps[0].inputs,
            vec![("a".into(), "L".into()), ("b".into(), "R".into())]
        );
    }

    #[test]
    fn needs_steps() {
        let e = analyze(&ensemble(IO)).unwrap_err();
        assert_eq!(
            e,
            vec!["ensemble 'e' must specify 'ensemble_scheduling' with one or more 'step's"]
        );
        let e = analyze(&with_steps(
            r#"{ model_name: "" model_version: 0 input_map { key: "x" value: "IN" } output_map { key: "y" value: "OUT" } },
               { model_name: "m" model_version: -1 }"#,
        ))
        .unwrap_err();
        assert_eq!(
            e[..4],
            [
                "ensemble 'e' step 0: 'model_name' must be set",
                "ensemble 'e' step 0 (model ''): 'model_version' must be -1 (the latest version) or a version number, got 0",
                "ensemble 'e' step 1 (model 'm'): 'input_map' must map at least one input of the model",
                "ensemble 'e' step 1 (model 'm'): 'output_map' must map at least one output of the model",
            ]
        );
    }

    #[test]
    fn reports_unmapped_step_inputs() {
        let e = analyze(&with_steps(
            r#"{ model_name: "m" model_version: -1 input_map { key: "x" value: "IN" } input_map { key: "z" value: "nowhere" } output_map { key: "y" value: "OUT" } }"#,
        ))
        .unwrap_err();
        assert_eq!(
            e,
            vec![
                "ensemble 'e' step 0 (model 'm'): input 'z' reads tensor 'nowhere', which is neither an ensemble input nor produced by any step"
            ]
        );
    }

    #[test]
    fn reports_doubly_produced_tensors() {
        let e = analyze(&with_steps(
            r#"{ model_name: "a" model_version: -1 input_map { key: "x" value: "IN" } output_map { key: "y" value: "OUT" } },
               { model_name: "b" model_version: -1 input_map { key: "x" value: "IN" } output_map { key: "y" value: "OUT" } output_map { key: "w" value: "IN" } }"#,
        ))
        .unwrap_err();
        assert_eq!(
            e,
            vec![
                "ensemble 'e': tensor 'IN' is an ensemble input and is also produced by step 1 (model 'b') output 'w'; every tensor needs exactly one producer",
                "ensemble 'e': tensor 'OUT' is produced twice, by step 0 (model 'a') output 'y' and by step 1 (model 'b') output 'y'; every tensor needs exactly one producer",
            ]
        );
    }

    #[test]
    fn reports_unused_inputs_unwritten_outputs_and_dead_tensors() {
        let c = ensemble(
            r#"input [{ name: "IN" data_type: TYPE_FP32 dims: [4] }, { name: "EXTRA" data_type: TYPE_FP32 dims: [4] }]
               output [{ name: "OUT" data_type: TYPE_FP32 dims: [4] }, { name: "OUT2" data_type: TYPE_FP32 dims: [4] }]
               ensemble_scheduling { step [
                 { model_name: "m" model_version: -1 input_map { key: "x" value: "IN" } output_map { key: "y" value: "OUT" } output_map { key: "z" value: "dead" } } ] }"#,
        );
        assert_eq!(
            analyze(&c).unwrap_err(),
            vec![
                "ensemble 'e': ensemble input 'EXTRA' is not read by any step",
                "ensemble 'e': ensemble output 'OUT2' is not produced by any step",
                "ensemble 'e': tensor 'dead' produced by step 0 (model 'm') output 'z' is neither read by a step nor an ensemble output",
            ]
        );
    }

    #[test]
    fn reports_a_cycle_in_data_flow_order() {
        let e = analyze(&with_steps(
            r#"{ model_name: "a" model_version: -1 input_map { key: "x" value: "IN" } input_map { key: "w" value: "t2" } output_map { key: "y" value: "t1" } output_map { key: "o" value: "OUT" } },
               { model_name: "b" model_version: -1 input_map { key: "x" value: "t1" } output_map { key: "y" value: "t2" } }"#,
        ))
        .unwrap_err();
        assert_eq!(
            e,
            vec![
                "ensemble 'e': its steps form a cycle: step 0 (model 'a') -> step 1 (model 'b') -> step 0 (model 'a') (each feeds the next)"
            ]
        );
        let e = analyze(&with_steps(
            r#"{ model_name: "self" model_version: -1 input_map { key: "x" value: "IN" } input_map { key: "w" value: "loop" } output_map { key: "y" value: "loop" } output_map { key: "o" value: "OUT" } }"#,
        ))
        .unwrap_err();
        assert_eq!(
            e,
            vec![
                "ensemble 'e': its steps form a cycle: step 0 (model 'self') -> step 0 (model 'self') (each feeds the next)"
            ]
        );
    }

    #[test]
    fn topological_order_of_a_chain_and_a_cycle_behind_a_good_step() {
        let node = |after: Vec<usize>| StepNode {
            model: "m".into(),
            version: None,
            inputs: Vec::new(),
            outputs: Vec::new(),
            after,
        };
        assert_eq!(
            topological_order(&[node(vec![2]), node(vec![]), node(vec![1])]),
            Ok(vec![1, 2, 0])
        );
        // 0 is fine; 3 reads from the 1 <-> 2 cycle but is not on it.
        assert_eq!(
            topological_order(&[node(vec![]), node(vec![0, 2]), node(vec![1]), node(vec![2])]),
            Err(vec![1, 2, 1])
        );
    }
}
