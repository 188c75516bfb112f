//! Decoupled origins: which decoupled step (if any) every tensor of an ensemble descends from,
//! checked at load, and whether the ensemble is decoupled itself (as Triton 2.51 decides).
//!
//! ```text
//! ensemble inputs ─► origin Request
//! per step, in plan order: origin of its inputs (all the same, or the load fails)
//!   ─► its outputs: Step(itself) when its model is decoupled, else its inputs' origin
//! ensemble decoupled ⇔ some step is decoupled (every step feeds an ensemble output)
//! ```
//!
//! An origin numbers the "iterations" of the tensors it reaches: the request is iteration 0,
//! and every response of a decoupled step is one more iteration of its outputs. A step whose
//! inputs came from different origins could never line its inputs up by iteration, so Triton
//! refuses it at load. Its message is kept word for word (Triton 2.51 names the ensemble where
//! the step's model belongs: `step of model 'E'`), followed by what the step reads.

use std::collections::HashMap;

use super::plan::PlanStep;
use super::step_label;

/// Where a tensor's iterations come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Origin {
    /// The ensemble's request: its inputs and what non-decoupled steps make of them (one
    /// iteration).
    Request,
    /// The responses of the decoupled step with this index (one iteration per response).
    Step(usize),
}

/// The decoupled analysis of a planned ensemble.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Origins {
    /// Per step (config order): the origin of every tensor it reads.
    pub steps: Vec<Origin>,
    /// Per step: whether its composing model is decoupled (one invocation, many responses).
    pub decoupled_steps: Vec<bool>,
}

impl Origins {
    /// Whether the ensemble streams (some step is decoupled): its config answers
    /// `model_transaction_policy { decoupled: true }` and unary requests are refused.
    pub fn decoupled(&self) -> bool {
        self.decoupled_steps.iter().any(|&d| d)
    }

    /// No decoupled step: every tensor comes from the request.
    pub fn none(steps: usize) -> Origins {
        Origins {
            steps: vec![Origin::Request; steps],
            decoupled_steps: vec![false; steps],
        }
    }
}

/// The origin of every step's inputs. `decoupled[i]`: step `i`'s composing model is decoupled;
/// `order`: every step after the steps it reads from. Errors: one sentence per step whose
/// inputs have different origins, in Triton's words.
pub fn analyze(
    ensemble: &str,
    steps: &[PlanStep],
    order: &[usize],
    decoupled: &[bool],
) -> Result<Origins, Vec<String>> {
    // Tensors no step produces are ensemble inputs (the graph checked every other name).
    let mut tensors: HashMap<&str, Origin> = HashMap::new();
    let mut origins = vec![Origin::Request; steps.len()];
    let mut errors = Vec::new();
    for &i in order {
        let step = &steps[i];
        let mut seen: Option<Origin> = None;
        let mut mixed = false;
        for (_, tensor) in &step.inputs {
            let origin = tensors
                .get(tensor.as_str())
                .copied()
                .unwrap_or(Origin::Request);
            match seen {
                None => seen = Some(origin),
                Some(o) if o != origin => mixed = true,
                Some(_) => {}
            }
        }
        if mixed {
            let sources: Vec<String> = step
                .inputs
                .iter()
                .map(|(_, tensor)| {
                    let from = match tensors.get(tensor.as_str()) {
                        Some(Origin::Step(d)) => {
                            format!("the responses of {}", step_label(*d, &steps[*d].model))
                        }
                        Some(Origin::Request) | None => "the request".to_string(),
                    };
                    format!("'{tensor}' from {from}")
                })
                .collect();
            errors.push(format!(
                "in ensemble {ensemble}, step of model '{ensemble}' receives inputs originated from different decoupled models ({} reads {})",
                step_label(i, &step.model),
                sources.join(", ")
            ));
        }
        let origin = seen.unwrap_or(Origin::Request);
        origins[i] = origin;
        let produced = if decoupled.get(i).copied().unwrap_or(false) {
            Origin::Step(i)
        } else {
            origin
        };
        for (_, tensor) in &step.outputs {
            tensors.insert(tensor, produced);
        }
    }
    if errors.is_empty() {
        Ok(Origins {
            steps: origins,
            decoupled_steps: decoupled.to_vec(),
        })
    } else {
        Err(errors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(model: &str, inputs: &[&str], outputs: &[&str], after: &[usize]) -> PlanStep {
        PlanStep {
            model: model.into(),
            version: None,
            inputs: inputs
                .iter()
                .enumerate()
                .map(|(n, t)| (format!("in{n}"), t.to_string()))
                .collect(),
            outputs: outputs
                .iter()
                .enumerate()
                .map(|(n, t)| (format!("out{n}"), t.to_string()))
                .collect(),
            after: after.to_vec(),
        }
    }

    #[test]
    fn a_plain_pipeline_has_one_origin_and_is_not_decoupled() {
        let steps = [
            step("a", &["IN"], &["T"], &[]),
            step("b", &["T", "IN"], &["OUT"], &[0]),
        ];
        let o = analyze("e", &steps, &[0, 1], &[false, false]).unwrap();
        assert_eq!(o.steps, vec![Origin::Request, Origin::Request]);
        assert!(!o.decoupled());
        assert_eq!(o, Origins::none(2));
    }

    #[test]
    fn a_decoupled_step_starts_an_origin_that_flows_downstream() {
        // IN -> repeat (decoupled) -> R -> double -> D -> plus_one -> OUT
        let steps = [
            step("plus_one", &["D"], &["OUT"], &[2]),
            step("repeat", &["IN"], &["R"], &[]),
            step("double", &["R"], &["D"], &[1]),
        ];
        let o = analyze("e", &steps, &[1, 2, 0], &[false, true, false]).unwrap();
        assert_eq!(
            o.steps,
            vec![Origin::Step(1), Origin::Request, Origin::Step(1)]
        );
        assert!(o.decoupled());
    }

    #[test]
    fn a_decoupled_step_downstream_of_another_starts_its_own_origin() {
        let steps = [
            step("outer", &["IN"], &["A"], &[]),
            step("inner", &["A"], &["B"], &[0]),
            step("plain", &["B"], &["OUT"], &[1]),
        ];
        let o = analyze("e", &steps, &[0, 1, 2], &[true, true, false]).unwrap();
        assert_eq!(
            o.steps,
            vec![Origin::Request, Origin::Step(0), Origin::Step(1)]
        );
    }

    #[test]
    fn mixing_origins_is_refused_in_tritons_words() {
        // join reads the request's IN beside the decoupled step's R; fork reads two decoupled
        // steps' outputs.
        let steps = [
            step("dec_a", &["IN"], &["R"], &[]),
            step("join", &["R", "IN"], &["OUT"], &[0]),
            step("dec_b", &["IN"], &["S"], &[]),
            step("fork", &["R", "S"], &["OUT2"], &[0, 2]),
        ];
        let e = analyze("ens", &steps, &[0, 2, 1, 3], &[true, false, true, false]).unwrap_err();
        assert_eq!(
            e,
            vec![
                "in ensemble ens, step of model 'ens' receives inputs originated from different decoupled models (step 1 (model 'join') reads 'R' from the responses of step 0 (model 'dec_a'), 'IN' from the request)",
                "in ensemble ens, step of model 'ens' receives inputs originated from different decoupled models (step 3 (model 'fork') reads 'R' from the responses of step 0 (model 'dec_a'), 'S' from the responses of step 2 (model 'dec_b'))",
            ]
        );
    }

    #[test]
    fn two_outputs_of_one_decoupled_step_share_its_origin() {
        let steps = [
            step("dec", &["IN"], &["X", "Y"], &[]),
            step("add", &["X", "Y"], &["OUT"], &[0]),
        ];
        let o = analyze("e", &steps, &[0, 1], &[true, false]).unwrap();
        assert_eq!(o.steps[1], Origin::Step(0));
    }
}
