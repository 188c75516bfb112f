//! Running one ensemble request over its plan.
//!
//! ```text
//! tensors = the request's inputs
//! loop: Progress::start_ready (pure) ─► one InferRequest per ready step: its mapped tensors
//!       renamed to the model's input names, its mapped outputs requested, the request's id,
//!       options and custom parameters ─► a place among the step's in-flight requests
//!       (`max_inflight_requests`, [`super::limit`]) ─► infer(...) (all running steps awaited
//!       together; the place is freed when the step answers)
//!     ─► a step answers: outputs renamed to ensemble tensors ─► Progress::finish
//!     ─► a step fails: the ensemble request fails with it (the other steps are dropped,
//!        which cancels them)
//! ─► the requested ensemble outputs, in the order asked
//! ```
//!
//! `infer` is how a step reaches its composing model; the data plane passes its own infer
//! path, so a step is queued and batched like any client request of that model.

use std::collections::HashMap;
use std::future::Future;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use nereid_proto::{
    InferRequest, InferResponse, Parameters, RequestOptions, RequestedOutput, ServiceError,
    ServiceResult, Tensor,
};

use super::plan::{EnsemblePlan, PlanStep};
use super::step_label;

/// An ensemble request that passed the ensemble's own input checks.
#[derive(Clone, Debug, Default)]
pub struct EnsembleRequest {
    /// The client's request id, given to every step.
    pub id: String,
    /// Priority, timeout and sequence options, given to every step.
    pub options: RequestOptions,
    /// Custom parameters, given to every step.
    pub parameters: Parameters,
    /// Named as the ensemble's inputs.
    pub inputs: Vec<Tensor>,
    /// Ensemble outputs to return, in response order.
    pub outputs: Vec<String>,
}

/// Which steps have started and which have finished. Holds the executor's one decision, which
/// step may start, as a pure function of that state.
#[derive(Clone, Debug)]
pub struct Progress {
    started: Vec<bool>,
    done: Vec<bool>,
}

impl Progress {
    pub fn new(plan: &EnsemblePlan) -> Progress {
        Progress {
            started: vec![false; plan.steps.len()],
            done: vec![false; plan.steps.len()],
        }
    }

    /// The steps that can start now (not started; every step they read from finished), in
    /// plan order; they are marked started.
    pub fn start_ready(&mut self, plan: &EnsemblePlan) -> Vec<usize> {
        let ready: Vec<usize> = plan
            .order
            .iter()
            .copied()
            .filter(|&i| !self.started[i] && plan.steps[i].after.iter().all(|&j| self.done[j]))
            .collect();
        for &i in &ready {
            self.started[i] = true;
        }
        ready
    }

    pub fn finish(&mut self, step: usize) {
        self.done[step] = true;
    }

    pub fn all_done(&self) -> bool {
        self.done.iter().all(|&d| d)
    }
}

/// Runs `request` through `plan`, each step through `infer`. Returns the requested outputs.
pub async fn execute<F, Fut>(
    plan: &EnsemblePlan,
    request: EnsembleRequest,
    infer: F,
) -> ServiceResult<Vec<Tensor>>
where
    F: Fn(InferRequest) -> Fut,
    Fut: Future<Output = ServiceResult<InferResponse>>,
{
    let EnsembleRequest {
        id,
        options,
        parameters,
        inputs,
        outputs,
    } = request;
    let base = InferRequest {
        id,
        options,
        parameters,
        ..Default::default()
    };
    let mut tensors: HashMap<String, Tensor> = inputs
        .into_iter()
        .map(|t| (t.name().to_string(), t))
        .collect();
    let mut progress = Progress::new(plan);
    let mut running = FuturesUnordered::new();
    loop {
        for index in progress.start_ready(plan) {
            let step = &plan.steps[index];
            // An optional ensemble input the client left out stays out.
            let inputs = step
                .inputs
                .iter()
                .filter_map(|(input, tensor)| {
                    tensors
                        .get(tensor)
                        .map(|t| t.clone().renamed(input.as_str()))
                })
                .collect();
            let request = step_request(step, &base, inputs);
            let call = infer(request);
            let limits = &plan.limits;
            running.push(async move {
                let _place = limits.acquire(index).await;
                (index, call.await)
            });
        }
        let Some((index, result)) = running.next().await else {
            break;
        };
        let response = result.map_err(|e| step_error(plan, index, e))?;
        for (tensor, value) in step_outputs(plan, index, response)? {
            tensors.insert(tensor, value);
        }
        progress.finish(index);
    }
    if !progress.all_done() {
        return Err(ServiceError::internal(format!(
            "ensemble '{}': some steps never had their inputs (the plan is inconsistent)",
            plan.name
        )));
    }
    outputs
        .iter()
        .map(|name| {
            tensors.remove(name).ok_or_else(|| {
                ServiceError::internal(format!(
                    "ensemble '{}': no step produced output '{name}'",
                    plan.name
                ))
            })
        })
        .collect()
}

/// The request for one step: `base`'s id, options and custom parameters, `inputs` (already
/// named as the step's model calls them) and the step's mapped outputs asked for by name.
pub(super) fn step_request(
    step: &PlanStep,
    base: &InferRequest,
    inputs: Vec<Tensor>,
) -> InferRequest {
    InferRequest {
        model_name: step.model.clone(),
        model_version: step.version,
        id: base.id.clone(),
        options: base.options.clone(),
        parameters: base.parameters.clone(),
        inputs,
        outputs: step
            .outputs
            .iter()
            .map(|(output, _)| RequestedOutput {
                name: output.clone(),
                parameters: Parameters::new(),
            })
            .collect(),
        ..Default::default()
    }
}

/// A step's failure as the ensemble's: the same class (a composing model's 400 stays a 400),
/// the message prefixed with the ensemble and the step. A composing model that is not there
/// (any more) makes the ensemble unavailable rather than "not found".
pub(super) fn step_error(plan: &EnsemblePlan, index: usize, error: ServiceError) -> ServiceError {
    let step = &plan.steps[index];
    let prefix = format!(
        "ensemble '{}' {}: ",
        plan.name,
        step_label(index, &step.model)
    );
    match error {
        ServiceError::NotFound(message) => ServiceError::Unavailable(format!(
            "{prefix}composing model '{}' is not available: {message}",
            step.model
        )),
        other => other.prefixed(&prefix),
    }
}

/// The step's outputs renamed to the ensemble tensors they become.
pub(super) fn step_outputs(
    plan: &EnsemblePlan,
    index: usize,
    response: InferResponse,
) -> ServiceResult<Vec<(String, Tensor)>> {
    let step = &plan.steps[index];
    let mut returned = response.outputs;
    step.outputs
        .iter()
        .map(|(output, tensor)| {
            let position = returned
                .iter()
                .position(|t| t.name() == output)
                .ok_or_else(|| {
                    ServiceError::internal(format!(
                        "ensemble '{}' {}: the model returned no output '{output}'",
                        plan.name,
                        step_label(index, &step.model)
                    ))
                })?;
            let value = returned.swap_remove(position).renamed(tensor.as_str());
            Ok((tensor.clone(), value))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use nereid_proto::ParamValue;

    use super::*;
    use crate::ensemble::limit::StepLimits;
    use crate::ensemble::origin::Origins;
    use crate::ensemble::plan::PlanStep;

    fn step(
        model: &str,
        inputs: &[(&str, &str)],
        outputs: &[(&str, &str)],
        after: &[usize],
    ) -> PlanStep {
        PlanStep::wired(model, inputs, outputs, after)
    }

    /// IN ─► left (y = 2x) ─► L ─┐
    ///   └─► right (y = x + 1) ─► R ─┴► join (a + b) ─► OUT;  left also ─► SIDE
    fn diamond() -> EnsemblePlan {
        EnsemblePlan {
            name: "e".into(),
            steps: vec![
                step("join", &[("a", "L"), ("b", "R")], &[("y", "OUT")], &[1, 2]),
                step("left", &[("x", "IN")], &[("y", "L"), ("z", "SIDE")], &[]),
                step(
                    "right",
                    &[("x", "IN"), ("opt", "MAYBE")],
                    &[("y", "R")],
                    &[],
                ),
            ],
            order: vec![1, 2, 0],
            limits: StepLimits::unlimited(),
            origins: Origins::none(3),
        }
    }

    fn fp32(name: &str, values: &[f32]) -> Tensor {
        nereid_test_support::fp32(name, vec![1, values.len() as i64], values)
    }

    use nereid_test_support::floats;

    fn input(r: &InferRequest, name: &str) -> Vec<f32> {
        floats(r.inputs.iter().find(|t| t.name() == name).unwrap())
    }

    /// The composing models of [`diamond`], answering only the outputs asked for.
    fn run_model(r: &InferRequest) -> ServiceResult<InferResponse> {
        let values: Vec<(String, Vec<f32>)> = match r.model_name.as_str() {
            "left" => {
                let x = input(r, "x");
                vec![
                    ("y".into(), x.iter().map(|v| v * 2.0).collect()),
                    ("z".into(), vec![-1.0; x.len()]),
                ]
            }
            "right" => vec![("y".into(), input(r, "x").iter().map(|v| v + 1.0).collect())],
            "join" => {
                let (a, b) = (input(r, "a"), input(r, "b"));
                vec![("y".into(), a.iter().zip(&b).map(|(x, y)| x + y).collect())]
            }
            other => {
                return Err(ServiceError::not_found(format!(
                    "Request for unknown model: '{other}' is not found"
                )));
            }
        };
        let outputs = r
            .outputs
            .iter()
            .map(|o| {
                let (_, v) = values.iter().find(|(n, _)| *n == o.name).unwrap();
                fp32(&o.name, v)
            })
            .collect();
        Ok(InferResponse {
            model_name: r.model_name.clone(),
            outputs,
            ..Default::default()
        })
    }

    fn request(outputs: &[&str]) -> EnsembleRequest {
        let mut parameters = Parameters::new();
        parameters.insert("tag".into(), ParamValue::String("blue".into()));
        EnsembleRequest {
            id: "req-7".into(),
            options: RequestOptions {
                priority: 2,
                ..Default::default()
            },
            parameters,
            inputs: vec![fp32("IN", &[1.0, 2.0])],
            outputs: outputs.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn a_step_is_ready_once_every_step_it_reads_from_finished() {
        let plan = diamond();
        let mut p = Progress::new(&plan);
        assert_eq!(p.start_ready(&plan), vec![1, 2]);
        assert!(
            p.start_ready(&plan).is_empty(),
            "started steps are not started again"
        );
        p.finish(2);
        assert!(p.start_ready(&plan).is_empty(), "join still waits for left");
        p.finish(1);
        assert_eq!(p.start_ready(&plan), vec![0]);
        assert!(!p.all_done());
        p.finish(0);
        assert!(p.all_done());
    }

    #[tokio::test]
    async fn runs_the_dag_and_returns_the_requested_outputs_in_order() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let outputs = execute(&diamond(), request(&["SIDE", "OUT"]), move |r| {
            log.lock().unwrap().push(r.clone());
            std::future::ready(run_model(&r))
        })
        .await
        .unwrap();
        assert_eq!(outputs.len(), 2);
        assert_eq!(
            (outputs[0].name(), floats(&outputs[0])),
            ("SIDE", vec![-1.0, -1.0])
        );
        // OUT = 2x + (x + 1)
        assert_eq!(
            (outputs[1].name(), floats(&outputs[1])),
            ("OUT", vec![4.0, 7.0])
        );

        let seen = seen.lock().unwrap();
        let models: Vec<&str> = seen.iter().map(|r| r.model_name.as_str()).collect();
        assert_eq!(models, ["left", "right", "join"]);
        for r in seen.iter() {
            assert_eq!(r.id, "req-7");
            assert_eq!(r.options.priority, 2);
            assert_eq!(
                r.parameters.get("tag"),
                Some(&ParamValue::String("blue".into()))
            );
        }
        // Inputs carry the model's names; the left-out optional input is not sent; every
        // mapped output is requested.
        let right = &seen[1];
        assert_eq!(
            right.inputs.iter().map(|t| t.name()).collect::<Vec<_>>(),
            ["x"]
        );
        let left = &seen[0];
        assert_eq!(
            left.outputs
                .iter()
                .map(|o| o.name.as_str())
                .collect::<Vec<_>>(),
            ["y", "z"]
        );
    }

    #[tokio::test]
    async fn independent_steps_run_at_the_same_time() {
        // left and right each wait at a barrier for the other: run one after the other, they
        // would never get past it.
        let barrier = Arc::new(tokio::sync::Barrier::new(2));
        let plan = diamond();
        let run = execute(&plan, request(&["OUT"]), move |r| {
            let barrier = barrier.clone();
            async move {
                if r.model_name != "join" {
                    barrier.wait().await;
                }
                run_model(&r)
            }
        });
        let outputs = tokio::time::timeout(Duration::from_secs(10), run)
            .await
            .expect("left and right did not run concurrently")
            .unwrap();
        assert_eq!(floats(&outputs[0]), vec![4.0, 7.0]);
    }

    #[tokio::test]
    async fn a_failing_step_fails_the_request_with_its_class_and_model() {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let log = calls.clone();
        let e = execute(&diamond(), request(&["OUT"]), move |r| {
            log.lock().unwrap().push(r.model_name.clone());
            std::future::ready(if r.model_name == "right" {
                Err(ServiceError::invalid(
                    "[request id: req-7] unexpected shape for input 'x' for model 'right'",
                ))
            } else {
                run_model(&r)
            })
        })
        .await
        .unwrap_err();
        assert_eq!(
            e,
            ServiceError::InvalidArgument(
                "ensemble 'e' step 2 (model 'right'): [request id: req-7] unexpected shape for input 'x' for model 'right'".into()
            )
        );
        assert!(
            !calls.lock().unwrap().contains(&"join".to_string()),
            "join ran after a failed input"
        );

        let missing = EnsemblePlan {
            name: "e".into(),
            steps: vec![step("gone", &[("x", "IN")], &[("y", "OUT")], &[])],
            order: vec![0],
            limits: StepLimits::unlimited(),
            origins: Origins::none(1),
        };
        let e = execute(&missing, request(&["OUT"]), |r| {
            std::future::ready(run_model(&r))
        })
        .await
        .unwrap_err();
        assert_eq!(
            e,
            ServiceError::Unavailable(
                "ensemble 'e' step 0 (model 'gone'): composing model 'gone' is not available: Request for unknown model: 'gone' is not found".into()
            )
        );
    }

    #[tokio::test]
    async fn a_model_that_leaves_out_a_mapped_output_is_an_internal_error() {
        let e = execute(&diamond(), request(&["OUT"]), |r| {
            std::future::ready(run_model(&r).map(|mut resp| {
                resp.outputs.retain(|t| t.name() != "z");
                resp
            }))
        })
        .await
        .unwrap_err();
        assert!(
            matches!(&e, ServiceError::Internal(m) if m == "ensemble 'e' step 1 (model 'left'): the model returned no output 'z'"),
            "{e:?}"
        );
    }

    /// `requests` concurrent requests through a one-step ensemble limited to `max` in flight;
    /// the step holds every request until the test saw how many run at once. Returns the most
    /// seen at once.
    async fn most_at_once(max: u32, requests: usize) -> usize {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let plan = EnsemblePlan {
            name: "e".into(),
            steps: vec![step("slow", &[("x", "IN")], &[("y", "OUT")], &[])],
            order: vec![0],
            limits: StepLimits::new(max, 1),
            origins: Origins::none(1),
        };
        let now = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let (open, gate) = tokio::sync::watch::channel(false);
        let expected = if max == 0 {
            requests
        } else {
            (max as usize).min(requests)
        };
        let infer = |_r: InferRequest| {
            let (now, most, mut gate) = (now.clone(), most.clone(), gate.clone());
            async move {
                let running = now.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(running, Ordering::SeqCst);
                let _ = gate.wait_for(|open| *open).await;
                now.fetch_sub(1, Ordering::SeqCst);
                Ok(InferResponse {
                    outputs: vec![fp32("y", &[1.0])],
                    ..Default::default()
                })
            }
        };
        let runs = futures::future::join_all(
            (0..requests).map(|_| execute(&plan, request(&["OUT"]), infer)),
        );
        let watcher = async {
            while now.load(Ordering::SeqCst) < expected {
                tokio::task::yield_now().await;
            }
            // Every request had its chance to start before the gate opens.
            for _ in 0..50 {
                tokio::task::yield_now().await;
            }
            assert_eq!(
                plan.limits.in_flight(0),
                if max == 0 { 0 } else { expected }
            );
            let _ = open.send(true);
        };
        let (results, ()) = tokio::join!(runs, watcher);
        assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
        assert_eq!(plan.limits.in_flight(0), 0, "every place is given back");
        most.load(Ordering::SeqCst)
    }

    #[tokio::test]
    async fn max_inflight_requests_bounds_a_step_across_requests() {
        assert_eq!(most_at_once(2, 6).await, 2);
        assert_eq!(most_at_once(1, 3).await, 1);
        assert_eq!(most_at_once(0, 6).await, 6, "0 is unlimited");
    }
}
