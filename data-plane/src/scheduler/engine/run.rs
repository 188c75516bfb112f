//! Running a formed batch on an instance thread, outside the lock: skip the requests whose
//! callers left, then per execution the batcher's feed forms, either join the inputs and call
//! `execute` once ([`run_joined`], then [`split_per_request`]) or hand request-level backends
//! (Python) the requests themselves; record statistics; answer each request.
//!
//! ```text
//! batch ─► skip closed ─► release PendingMarks ─► Feed::executions
//!   joined:        run_joined (concat + execute) ─► split_per_request ─┐
//!   request-level: execute_requests (one outcome per request) ─────────┴► answer each
//!                  (rescheduled: Feed::reschedule ─► back to the batcher, or Triton's error)
//! ```
//!
//! With ragged batching (the model's `batch_input` / `batch_output` / `allow_ragged_batch`),
//! `run_joined` adds the batch inputs `ragged::batch_inputs` computes and flattens the ragged
//! inputs, and `split_per_request` scatters batch outputs by the shapes of `ragged::scatter_plan`.
//! Request-level backends get neither, as Triton's Python backend does not.
//!
//! When the feed pads an execution ([`Feed::padding`]: the sequence batcher's `direct`
//! strategy), dummy requests fill the batch positions between the real ones; they run with the
//! batch, their outputs are dropped and they count in no statistics.

use std::time::Instant;

use nereid_proto::{ServiceError, Tensor};

use super::{Batcher, Done, Entry, Feed, Padding, Shared};
use crate::backend::{
    BackendError, BackendInstance, BatchInputs, ModelResponse, Phases, RESCHEDULE_UNSUPPORTED,
    RequestOutcome, RequestView,
};
use crate::config::RaggedBatching;
use crate::scheduler::{ExecTimings, JobResult, batch, padding_view, ragged, request_view};

/// Per request, its outputs in the order of the names it was run for (with the response
/// parameters the model set), or its error.
type Produced = Result<ModelResponse, BackendError>;

impl<B: Batcher> Shared<B> {
    /// Runs a batch and answers its requests; returns all of them for [`Batcher::finished`]
    /// (the rescheduled ones with their jobs).
    pub(super) fn run_batch(
        &self,
        instance: &mut dyn BackendInstance,
        batch: Vec<Entry<B::Tag>>,
    ) -> Vec<Done<B::Tag>> {
        let mut done = Vec::with_capacity(batch.len());
        // Requests whose callers left while the batch was formed are dropped here.
        let (gone, mut live): (Vec<_>, Vec<_>) = batch.into_iter().partition(|e| e.job.gone());
        for mut entry in gone {
            self.feed.produced(&mut entry.tag, None);
            done.push(Done::answered(entry.tag));
            self.respond(
                entry.job,
                Err(ServiceError::Cancelled("the client went away".into())),
            );
        }
        if live.is_empty() {
            return done;
        }
        for e in &mut live {
            e.job.pending.release();
        }
        for execution in self.feed.executions(live) {
            if instance.request_level() {
                self.run_requests(instance, execution, &mut done);
            } else {
                self.run_batched(instance, execution, &mut done);
            }
        }
        done
    }

    /// One execution through `execute`: the requests' inputs joined, the outputs split back.
    fn run_batched(
        &self,
        instance: &mut dyn BackendInstance,
        execution: Vec<Entry<B::Tag>>,
        done: &mut Vec<Done<B::Tag>>,
    ) {
        let started = Instant::now();
        let mut names: Vec<String> = Vec::new();
        for e in &execution {
            for o in &e.job.request.outputs {
                if !names.contains(o) {
                    names.push(o.clone());
                }
            }
        }
        for o in self.feed.extra_outputs() {
            if !names.contains(o) {
                names.push(o.clone());
            }
        }
        let padding = self.feed.padding(&execution);
        let real_sizes: Vec<usize> = execution.iter().map(|e| e.job.request.batch_size).collect();
        let (inputs, sizes): (Vec<&[Tensor]>, Vec<usize>) = match &padding {
            None => execution
                .iter()
                .map(|e| (e.job.request.inputs.as_slice(), e.job.request.batch_size))
                .unzip(),
            Some(p) => p
                .layout
                .iter()
                .map(|position| match position.and_then(|k| execution.get(k)) {
                    Some(e) => (e.job.request.inputs.as_slice(), e.job.request.batch_size),
                    None => (p.dummy.as_slice(), 1),
                })
                .unzip(),
        };
        let scatter =
            ragged::scatter_plan(&self.ragged, &names, &inputs).map_err(BackendError::InvalidInput);
        let result = scatter.and_then(|scatter| {
            let ran = run_joined(instance, &inputs, &names, &self.ragged)?;
            Ok((ran, scatter))
        });
        drop(inputs);
        let infer_done = Instant::now();
        let (input_done, per_request) = match result {
            Ok(((input_done, outputs), scatter)) => {
                let split = split_per_request(outputs, &sizes, &scatter);
                let real = split.map(|all| unpad(all, padding.as_ref(), execution.len()));
                (input_done, real)
            }
            Err(e) => (infer_done, Err(e)),
        };
        let finished = Instant::now();
        let timings = |arrived: Instant| ExecTimings {
            queue: started.saturating_duration_since(arrived),
            compute_input: input_done - started,
            compute_infer: infer_done - input_done,
            compute_output: finished - infer_done,
        };
        match per_request {
            Ok(per_request) => {
                self.stats.record_execution(
                    real_sizes.iter().sum(),
                    input_done - started,
                    infer_done - input_done,
                    finished - infer_done,
                );
                for (entry, produced) in execution.into_iter().zip(per_request) {
                    let timings = timings(entry.job.arrived);
                    self.answer(entry, Some(&names), Ok(produced.into()), timings, done);
                }
            }
            Err(e) => {
                for entry in execution {
                    let timings = timings(entry.job.arrived);
                    self.answer(entry, Some(&names), Err(e.clone()), timings, done);
                }
            }
        }
    }

    /// One execution through `execute_requests` (request-level backends: Python): each
    /// request keeps its own tensors, parameters and outputs; one outcome comes back per
    /// request: its result, or rescheduled. The batcher's extra outputs (sequence state) are
    /// not asked for: as Triton's Python backend, such a model's implicit state stays at its
    /// initial value.
    fn run_requests(
        &self,
        instance: &mut dyn BackendInstance,
        execution: Vec<Entry<B::Tag>>,
        done: &mut Vec<Done<B::Tag>>,
    ) {
        let started = Instant::now();
        let mut views: Vec<RequestView<'_>> = execution
            .iter()
            .map(|e| request_view(&e.job.request, e.job.key))
            .collect();
        let padding = self.feed.padding(&execution);
        let parameters = Default::default();
        if let Some(p) = &padding {
            let mut real = views.into_iter().map(Some).collect::<Vec<_>>();
            views = p
                .layout
                .iter()
                .map(|position| {
                    position
                        .and_then(|k| real.get_mut(k).and_then(Option::take))
                        .unwrap_or_else(|| padding_view(&p.dummy, &[], &parameters))
                })
                .collect();
        }
        let mut phases = Phases::default();
        let result = instance
            .execute_requests(&views, &mut phases)
            .map(|all| match &padding {
                Some(_) if all.len() != views.len() => all,
                _ => unpad(all, padding.as_ref(), execution.len()),
            });
        drop(views);
        let finished = Instant::now();
        let (compute_input, compute_infer, compute_output) = phases.split(started, finished);
        let failed = |e: BackendError| {
            (0..execution.len())
                .map(|_| RequestOutcome::Answered(Err(e.clone())))
                .collect()
        };
        let results: Vec<RequestOutcome> = match result {
            Ok(per_request) if per_request.len() == execution.len() => per_request,
            Ok(per_request) => failed(BackendError::Execution(format!(
                "the backend answered {} of {} requests",
                per_request.len(),
                execution.len()
            ))),
            Err(e) => failed(e),
        };
        let ran = |r: &RequestOutcome| !matches!(r, RequestOutcome::Answered(Err(_)));
        if results.iter().any(ran) {
            let size = execution.iter().map(|e| e.job.request.batch_size).sum();
            self.stats
                .record_execution(size, compute_input, compute_infer, compute_output);
        }
        for (entry, produced) in execution.into_iter().zip(results) {
            let timings = ExecTimings {
                queue: started.saturating_duration_since(entry.job.arrived),
                compute_input,
                compute_infer,
                compute_output,
            };
            match produced {
                RequestOutcome::Answered(produced) => {
                    self.answer(entry, None, produced, timings, done)
                }
                RequestOutcome::Rescheduled => self.reschedule(entry, timings, done),
            }
        }
    }

    /// A request the model rescheduled: back to the batcher to run again when the feed takes
    /// it, answered with Triton's error when not, cancelled when its caller left.
    fn reschedule(&self, entry: Entry<B::Tag>, timings: ExecTimings, done: &mut Vec<Done<B::Tag>>) {
        let Entry { mut job, mut tag } = entry;
        if job.gone() {
            self.feed.produced(&mut tag, None);
            done.push(Done::answered(tag));
            self.respond(
                job,
                Err(ServiceError::Cancelled("the client went away".into())),
            );
        } else if self.feed.reschedule(&mut tag, &mut job.request) {
            self.feed.produced(&mut tag, None);
            done.push(Done {
                tag,
                again: Some(job),
            });
        } else {
            let error = BackendError::InvalidInput(RESCHEDULE_UNSUPPORTED.into());
            self.answer(Entry { job, tag }, None, Err(error), timings, done);
        }
    }

    /// Shows the feed what a request produced, then answers it with the outputs it asked for.
    /// `names`: the outputs it was run for (`None`: exactly those it asked for).
    fn answer(
        &self,
        entry: Entry<B::Tag>,
        names: Option<&[String]>,
        produced: Produced,
        timings: ExecTimings,
        done: &mut Vec<Done<B::Tag>>,
    ) {
        let Entry { job, mut tag } = entry;
        let wanted = &job.request.outputs;
        let names = names.unwrap_or(wanted);
        let outputs = match produced {
            Ok(ModelResponse {
                tensors,
                parameters,
            }) => {
                self.feed.produced(&mut tag, Some((names, &tensors)));
                Ok(ModelResponse {
                    tensors: pick(wanted, names, tensors),
                    parameters,
                })
            }
            Err(e) => {
                self.feed.produced(&mut tag, None);
                Err(e)
            }
        };
        done.push(Done::answered(tag));
        self.respond(job, Ok(JobResult { outputs, timings }));
    }
}

/// Hands the requests' inputs to the instance as one batch ([`BatchInputs`]: the backend
/// copies each request's part straight into its own buffers) and runs it: the one place the
/// engine calls [`BackendInstance::execute`]. Returns when the inputs were checked, and the
/// outputs named `outputs`, in that order.
fn run_joined(
    instance: &mut dyn BackendInstance,
    requests: &[&[Tensor]],
    outputs: &[String],
    ragged: &RaggedBatching,
) -> Result<(Instant, Vec<Tensor>), BackendError> {
    let generated;
    let batch_inputs = if ragged.is_empty() {
        BatchInputs::new(requests)?
    } else {
        generated = ragged::batch_inputs(ragged, requests).map_err(BackendError::InvalidInput)?;
        BatchInputs::ragged(requests, &ragged.ragged_inputs, &generated)?
    };
    let input_done = Instant::now();
    let outputs = instance.execute(&batch_inputs, outputs)?;
    Ok((input_done, outputs))
}

/// Splits each batch output back per request (`sizes` in batch order): per request, its part
/// of every output, in output order; `scatter[k]`, when present, gives the shapes output `k` is
/// scattered into instead. The one place the engine splits outputs.
fn split_per_request(
    outputs: Vec<Tensor>,
    sizes: &[usize],
    scatter: &[Option<Vec<Vec<i64>>>],
) -> Result<Vec<Vec<Tensor>>, BackendError> {
    let mut per_request: Vec<Vec<Tensor>> = sizes
        .iter()
        .map(|_| Vec::with_capacity(outputs.len()))
        .collect();
    for (k, output) in outputs.iter().enumerate() {
        let parts = match scatter.get(k) {
            Some(Some(shapes)) => batch::scatter_output(output, shapes)?,
            _ => batch::split_output(output, sizes)?,
        };
        for (mine, part) in per_request.iter_mut().zip(parts) {
            mine.push(part);
        }
    }
    Ok(per_request)
}

/// The results of an execution's own requests, in execution order, out of those of its padded
/// batch (`all` in batch order; unchanged without padding).
fn unpad<T>(all: Vec<T>, padding: Option<&Padding>, requests: usize) -> Vec<T> {
    let Some(padding) = padding else {
        return all;
    };
    let mut real: Vec<Option<T>> = (0..requests).map(|_| None).collect();
    for (position, result) in padding.layout.iter().zip(all) {
        if let Some(slot) = position.and_then(|k| real.get_mut(k)) {
            *slot = Some(result);
        }
    }
    real.into_iter().flatten().collect()
}

/// The outputs `wanted`, in its order, out of `produced` (`produced[k]` is output `names[k]`).
fn pick(wanted: &[String], names: &[String], produced: Vec<Tensor>) -> Vec<Tensor> {
    if wanted == names {
        return produced;
    }
    wanted
        .iter()
        .filter_map(|want| {
            names
                .iter()
                .position(|n| n == want)
                .and_then(|k| produced.get(k).cloned())
        })
        .collect()
}
