//! The state of one request through a decoupled ensemble: tensors by iteration, which step runs
//! on which iteration, and when an ensemble response is complete. Pure: the driver
//! ([`super::stream`]) feeds it step answers and starts what it says is ready.
//!
//! ```text
//! Flow::new(request inputs = iteration 0) ─► start_ready: (step, iteration, inputs) whose
//!   inputs all have a value for that iteration, each once
//! a step answers ─► record: outputs at the invocation's iteration, or, for a decoupled step,
//!   at its next own iteration (each response is one more) ─► the readers of those tensors
//!   become candidates ─► every requested output has a value for one iteration: a response
//! ```
//!
//! Every value counts the uses left (reader step inputs, plus the ensemble response when it is
//! a requested output) and is dropped after its last, so a long stream keeps only what is still
//! to be read.

use std::collections::{HashMap, HashSet};

use nereid_proto::Tensor;

use super::plan::EnsemblePlan;

/// A value of one tensor for one iteration, with the uses it still has.
#[derive(Debug)]
struct Held {
    tensor: Tensor,
    uses: usize,
}

/// One invocation of a step: its iteration and its inputs, named as the composing model's.
#[derive(Debug)]
pub struct Invocation {
    /// The step (index in the plan).
    pub step: usize,
    /// The iteration of its inputs: its outputs' iteration, unless the step is decoupled.
    pub iteration: usize,
    /// Its inputs, named as the composing model's.
    pub inputs: Vec<Tensor>,
}

/// The tensors and progress of one streaming ensemble request.
#[derive(Debug)]
pub struct Flow {
    values: HashMap<(String, usize), Held>,
    /// Tensors no step produces: the ensemble's inputs (iteration 0 only; a left-out optional
    /// one simply has no value).
    ensemble_inputs: HashSet<String>,
    /// Per tensor: the reader step of each input that maps it (a step twice if it reads it
    /// twice).
    readers: HashMap<String, Vec<usize>>,
    /// Requested ensemble outputs, in response order.
    requested: Vec<String>,
    /// (step, iteration) invocations already started.
    started: HashSet<(usize, usize)>,
    /// (step, iteration) to look at after the last record.
    candidates: Vec<(usize, usize)>,
    /// Per step: responses a decoupled step gave so far (its next iteration).
    made: Vec<usize>,
}

impl Flow {
    /// A request with `inputs` (named as the ensemble's) asking for `requested` outputs.
    pub fn new(plan: &EnsemblePlan, inputs: Vec<Tensor>, requested: Vec<String>) -> Flow {
        let produced: HashSet<&str> = plan
            .steps
            .iter()
            .flat_map(|s| s.outputs.iter().map(|(_, t)| t.as_str()))
            .collect();
        let mut readers: HashMap<String, Vec<usize>> = HashMap::new();
        let mut ensemble_inputs = HashSet::new();
        for (i, step) in plan.steps.iter().enumerate() {
            for (_, tensor) in &step.inputs {
                readers.entry(tensor.clone()).or_default().push(i);
                if !produced.contains(tensor.as_str()) {
                    ensemble_inputs.insert(tensor.clone());
                }
            }
        }
        let mut flow = Flow {
            values: HashMap::new(),
            ensemble_inputs,
            readers,
            requested,
            started: HashSet::new(),
            candidates: plan.order.iter().map(|&i| (i, 0)).collect(),
            made: vec![0; plan.steps.len()],
        };
        for tensor in inputs {
            let name = tensor.name().to_string();
            flow.store(name, 0, tensor);
        }
        flow
    }

    fn uses(&self, tensor: &str) -> usize {
        self.readers.get(tensor).map_or(0, Vec::len)
            + usize::from(self.requested.iter().any(|r| r == tensor))
    }

    fn store(&mut self, tensor: String, iteration: usize, value: Tensor) {
        let uses = self.uses(&tensor);
        if uses > 0 {
            self.values.insert(
                (tensor, iteration),
                Held {
                    tensor: value,
                    uses,
                },
            );
        }
    }

    /// One use of a value: the value itself at its last use, else a copy.
    fn take(&mut self, tensor: &str, iteration: usize) -> Option<Tensor> {
        let key = (tensor.to_string(), iteration);
        let held = self.values.get_mut(&key)?;
        held.uses -= 1;
        if held.uses == 0 {
            self.values.remove(&key).map(|h| h.tensor)
        } else {
            Some(held.tensor.clone())
        }
    }

    fn has_input(&self, tensor: &str, iteration: usize) -> bool {
        if self.ensemble_inputs.contains(tensor) {
            iteration == 0
        } else {
            self.values.contains_key(&(tensor.to_string(), iteration))
        }
    }

    /// The invocations that can start now (every input has its value for the iteration), each
    /// once; their inputs are taken (renamed to the composing model's input names).
    pub fn start_ready(&mut self, plan: &EnsemblePlan) -> Vec<Invocation> {
        let mut ready = Vec::new();
        for (step, iteration) in std::mem::take(&mut self.candidates) {
            let node = &plan.steps[step];
            if self.started.contains(&(step, iteration))
                || !node
                    .inputs
                    .iter()
                    .all(|(_, tensor)| self.has_input(tensor, iteration))
            {
                continue;
            }
            self.started.insert((step, iteration));
            let inputs = node
                .inputs
                .iter()
                .filter_map(|(input, tensor)| {
                    self.take(tensor, iteration)
                        .map(|t| t.renamed(input.as_str()))
                })
                .collect();
            ready.push(Invocation {
                step,
                iteration,
                inputs,
            });
        }
        ready
    }

    /// Records one answer of `step` invoked on `iteration`: its outputs (as ensemble tensors).
    /// Returns the ensemble responses that became complete (the requested outputs, in order).
    pub fn record(
        &mut self,
        plan: &EnsemblePlan,
        step: usize,
        iteration: usize,
        outputs: Vec<(String, Tensor)>,
    ) -> Vec<Vec<Tensor>> {
        let at = if plan.origins.decoupled_steps[step] {
            let next = self.made[step];
            self.made[step] += 1;
            next
        } else {
            iteration
        };
        let mut touches_response = false;
        for (tensor, value) in outputs {
            for &reader in self.readers.get(&tensor).into_iter().flatten() {
                self.candidates.push((reader, at));
            }
            touches_response |= self.requested.contains(&tensor);
            self.store(tensor, at, value);
        }
        self.candidates.dedup();
        let complete = touches_response
            && self
                .requested
                .iter()
                .all(|r| self.values.contains_key(&(r.clone(), at)));
        if !complete {
            return Vec::new();
        }
        let requested = self.requested.clone();
        let response = requested.iter().filter_map(|r| self.take(r, at)).collect();
        vec![response]
    }

    /// Values still held (what a finished request leaves behind).
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.values.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ensemble::limit::StepLimits;
    use crate::ensemble::origin::{Origin, Origins};
    use crate::ensemble::plan::PlanStep;

    fn int(name: &str, v: i32) -> Tensor {
        nereid_test_support::int32_1d(name, &[v])
    }

    fn value(t: &Tensor) -> i32 {
        nereid_test_support::ints(t)[0]
    }

    fn step(model: &str, inputs: &[(&str, &str)], outputs: &[(&str, &str)]) -> PlanStep {
        PlanStep::wired(model, inputs, outputs, &[])
    }

    /// IN -> repeat (decoupled) -> R -> double -> OUT; repeat also -> IDX (an output).
    fn repeat_double() -> EnsemblePlan {
        EnsemblePlan {
            name: "e".into(),
            steps: vec![
                step("repeat", &[("IN", "IN")], &[("OUT", "R"), ("IDX", "IDX")]),
                step("double", &[("x", "R")], &[("y", "OUT")]),
            ],
            order: vec![0, 1],
            limits: StepLimits::unlimited(),
            origins: Origins {
                steps: vec![Origin::Request, Origin::Step(0)],
                decoupled_steps: vec![true, false],
            },
        }
    }

    #[test]
    fn each_decoupled_response_is_one_more_iteration_downstream() {
        let plan = repeat_double();
        let mut flow = Flow::new(&plan, vec![int("IN", 3)], vec!["OUT".into()]);
        let first = flow.start_ready(&plan);
        assert_eq!(first.len(), 1);
        assert_eq!((first[0].step, first[0].iteration), (0, 0));
        assert_eq!(first[0].inputs[0].name(), "IN");
        assert!(flow.start_ready(&plan).is_empty(), "nothing runs twice");

        // Three responses of repeat: double runs on iterations 0, 1, 2.
        for n in 0..3 {
            let none = flow.record(&plan, 0, 0, vec![("R".into(), int("R", 10 + n))]);
            assert!(none.is_empty(), "OUT is not there yet");
            let next = flow.start_ready(&plan);
            assert_eq!(next.len(), 1);
            let Invocation {
                step,
                iteration,
                inputs,
            } = &next[0];
            assert_eq!((*step, *iteration as i32), (1, n));
            assert_eq!((inputs[0].name(), value(&inputs[0])), ("x", 10 + n));
        }
        // double answers out of order: each answer completes its own iteration's response.
        let r2 = flow.record(&plan, 1, 2, vec![("OUT".into(), int("OUT", 24))]);
        let r0 = flow.record(&plan, 1, 0, vec![("OUT".into(), int("OUT", 20))]);
        assert_eq!(value(&r2[0][0]), 24);
        assert_eq!(value(&r0[0][0]), 20);
        assert_eq!(r0[0][0].name(), "OUT");
        assert_eq!(flow.held(), 0, "IN, every R and the sent OUTs are gone");
    }

    #[test]
    fn a_response_waits_for_every_requested_output_of_its_iteration() {
        let plan = repeat_double();
        let mut flow = Flow::new(&plan, vec![int("IN", 1)], vec!["IDX".into(), "OUT".into()]);
        flow.start_ready(&plan);
        let none = flow.record(
            &plan,
            0,
            0,
            vec![("R".into(), int("R", 7)), ("IDX".into(), int("IDX", 0))],
        );
        assert!(none.is_empty());
        flow.start_ready(&plan);
        let done = flow.record(&plan, 1, 0, vec![("OUT".into(), int("OUT", 14))]);
        let names: Vec<&str> = done[0].iter().map(|t| t.name()).collect();
        assert_eq!(names, ["IDX", "OUT"], "in the order asked");
    }

    #[test]
    fn unrequested_outputs_and_unread_tensors_are_not_kept() {
        let plan = repeat_double();
        let mut flow = Flow::new(&plan, vec![int("IN", 1)], vec!["OUT".into()]);
        flow.start_ready(&plan);
        flow.record(&plan, 0, 0, vec![("IDX".into(), int("IDX", 0))]);
        assert_eq!(flow.held(), 0);
        assert!(flow.start_ready(&plan).is_empty(), "no R, no double");
    }

    #[test]
    fn a_plain_step_keeps_its_invocations_iteration() {
        // IN -> plain -> P -> dec (decoupled) -> OUT: plain's output is iteration 0.
        let plan = EnsemblePlan {
            name: "e".into(),
            steps: vec![
                step("plain", &[("x", "IN"), ("opt", "MAYBE")], &[("y", "P")]),
                step("dec", &[("x", "P")], &[("y", "OUT")]),
            ],
            order: vec![0, 1],
            limits: StepLimits::unlimited(),
            origins: Origins {
                steps: vec![Origin::Request, Origin::Request],
                decoupled_steps: vec![false, true],
            },
        };
        let mut flow = Flow::new(&plan, vec![int("IN", 1)], vec!["OUT".into()]);
        let first = flow.start_ready(&plan);
        assert_eq!(
            first.len(),
            1,
            "the left-out optional MAYBE does not block plain"
        );
        assert_eq!(first[0].inputs.len(), 1);
        flow.record(&plan, 0, 0, vec![("P".into(), int("P", 5))]);
        assert_eq!(flow.start_ready(&plan)[0].iteration, 0);
        assert_eq!(
            flow.record(&plan, 1, 0, vec![("OUT".into(), int("OUT", 1))])
                .len(),
            1
        );
        assert_eq!(
            flow.record(&plan, 1, 0, vec![("OUT".into(), int("OUT", 2))])
                .len(),
            1
        );
    }
}
