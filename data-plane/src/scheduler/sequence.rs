//! Triton's sequence batcher (`sequence_batching`): requests that share a correlation id run
//! one at a time, in order, with server-generated control inputs and implicit state.
//!
//! ```text
//! submit() ─lock─► sequence known? START? ─► its queue ─► a slot free? bind : backlog
//!                                                         └► dispatch to idle instances
//! instance thread: execute ─lock─► store state outputs, END/idle releases the slot
//!                                  (the backlog's oldest sequence takes it) ─► form next batch
//! timer thread:    releases sequences idle for max_sequence_idle, oldest-strategy queue delays
//! ```
//!
//! Sequences hold *slots*: with `direct` a slot is one batch position of one instance
//! (`max(1, max_batch_size)` per instance), so a sequence always runs on the same instance;
//! with `oldest` there are `max_candidate_sequences` slots on no particular instance (0: as many
//! as `direct` would have). A live sequence without a slot waits in the backlog, in order.
//! A batch holds at most one request per sequence, and a sequence's next request is formed only
//! after the previous one finished, so its state is always the previous request's output.
//!
//! Differences from Triton, by choice: a batch holds only requests that are present (no
//! padding of empty slots, so READY is always true and the model sees a compact batch);
//! `direct`'s `max_queue_delay_microseconds` / `minimum_slot_utilization` and `oldest`'s
//! `preserve_ordering` are not used (requests of one sequence are always answered in order);
//! requests whose inputs differ in names or shapes run as separate executions.

mod controls;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};
use nereid_proto::ServiceError;
use nereid_proto::types::{CorrelationId, Tensor};
use parking_lot::{Condvar, Mutex};
use tokio::sync::oneshot;

use self::controls::id_text;
pub use self::controls::{SequencePolicy, Strategy};
use super::queue::ShapeKey;
use super::{ExecTimings, JobResult, batch, timer};
use crate::backend::{BackendError, BackendInstance, BatchInputs, RequestView};
use crate::request_check::{SequenceFlags, ValidRequest};
use crate::stats::{PendingMark, VersionStats};

type Reply = oneshot::Sender<Result<JobResult, ServiceError>>;

/// What an execution leaves for a sequence: its flags and new state (`None`: keep the old one).
type Done = (SequenceFlags, Option<Vec<Tensor>>);

/// Requests with the same input signature, each with its full input list: one execution.
type Group = (ShapeKey, Vec<(Item, Vec<Tensor>)>);

struct Job {
    /// Counts the request as pending until it starts executing. First, so that a job dropped
    /// unanswered stops counting before its caller sees the closed reply.
    pending: PendingMark,
    request: ValidRequest,
    flags: SequenceFlags,
    reply: Reply,
    arrived: Instant,
}

/// A request taken for execution, with the state inputs it runs on.
struct Item {
    job: Job,
    state: Vec<Tensor>,
}

struct Sequence {
    jobs: VecDeque<Job>,
    /// One of its requests is executing.
    running: bool,
    slot: Option<usize>,
    /// The state inputs for its next request (empty until the first one ran).
    state: Vec<Tensor>,
    /// Last arrival or completion, for the idle timeout.
    last_active: Instant,
    /// An END request is queued or running: what follows must START anew.
    ending: bool,
}

struct State {
    sequences: HashMap<CorrelationId, Sequence>,
    /// Free slots, lowest last so they are reused first.
    free_slots: Vec<usize>,
    /// Live sequences waiting for a slot, oldest first.
    backlog: VecDeque<CorrelationId>,
    /// Requests queued across all sequences (bounded by the queue capacity).
    queued: usize,
    idle: Vec<usize>,
    closed: bool,
    wake: Option<Instant>,
}

enum Decision {
    Dispatch(Vec<Item>),
    WaitUntil(Instant),
    Empty,
}

struct Shared {
    model: String,
    policy: SequencePolicy,
    max_batch: usize,
    /// Direct strategy: the instance of each slot.
    slot_instance: Option<Vec<usize>>,
    capacity: usize,
    state: Mutex<State>,
    timer: Condvar,
    workers: Vec<Sender<Option<Vec<Item>>>>,
    /// The version's statistics (pending requests are counted from submission).
    stats: Arc<VersionStats>,
}

/// Handle to a sequence model version's scheduler.
pub struct SequenceScheduler {
    shared: Arc<Shared>,
}

impl SequenceScheduler {
    /// Requests queued across all sequences.
    pub fn queue_depth(&self) -> usize {
        self.shared.state.lock().queued
    }

    /// Starts one thread per instance and the timer thread.
    pub fn start(
        model: &str,
        policy: SequencePolicy,
        max_batch_size: usize,
        instances: Vec<(String, Box<dyn BackendInstance>)>,
        stats: Arc<VersionStats>,
        queue_capacity: usize,
    ) -> Result<SequenceScheduler, BackendError> {
        let count = instances.len();
        let per_instance = max_batch_size.max(1);
        let (slots, slot_instance) = match &policy.strategy {
            Strategy::Direct => (
                count * per_instance,
                Some(
                    (0..count * per_instance)
                        .map(|s| s / per_instance)
                        .collect(),
                ),
            ),
            Strategy::Oldest {
                max_candidates: 0, ..
            } => (count * per_instance, None),
            Strategy::Oldest { max_candidates, .. } => (*max_candidates, None),
        };
        let (workers, receivers) = super::hand_offs::<Vec<Item>>(count);
        let shared = Arc::new(Shared {
            model: model.to_string(),
            policy,
            max_batch: per_instance,
            slot_instance,
            capacity: queue_capacity,
            state: Mutex::new(State {
                sequences: HashMap::new(),
                free_slots: (0..slots).rev().collect(),
                backlog: VecDeque::new(),
                queued: 0,
                idle: (0..count).rev().collect(),
                closed: false,
                wake: None,
            }),
            timer: Condvar::new(),
            workers,
            stats: stats.clone(),
        });
        super::start_threads(
            model,
            "seqtimer",
            instances,
            receivers,
            &shared,
            move |index, instance, batches, shared: &Shared| {
                instance_loop(index, instance, batches, shared, &stats)
            },
            |shared: &Shared| {
                timer::timer_loop(&shared.state, &shared.timer, |state, now| {
                    shared.dispatch(state, now)
                })
            },
        )?;
        Ok(SequenceScheduler { shared })
    }

    /// Queues a request behind the earlier ones of its sequence and waits for its result.
    pub async fn submit(&self, request: ValidRequest) -> Result<JobResult, ServiceError> {
        let (reply, result) = oneshot::channel();
        self.shared.enqueue(request, reply)?;
        result.await.map_err(|_| {
            ServiceError::internal(format!(
                "model '{}': the scheduler stopped before answering",
                self.shared.model
            ))
        })?
    }
}

impl Drop for SequenceScheduler {
    /// Stops the timer and the idle instances; busy ones stop when they finish.
    fn drop(&mut self) {
        let mut state = self.shared.state.lock();
        state.closed = true;
        for &worker in &state.idle {
            let _ = self.shared.workers[worker].try_send(None);
        }
        state.idle.clear();
        self.shared.timer.notify_one();
    }
}

impl Shared {
    fn enqueue(&self, request: ValidRequest, reply: Reply) -> Result<(), ServiceError> {
        let m = &self.model;
        let Some(flags) = request.sequence.clone() else {
            return Err(ServiceError::invalid(format!(
                "inference request to model '{m}' must specify a non-zero or non-empty correlation ID"
            )));
        };
        self.policy.check_id(m, &flags.id)?;
        let now = Instant::now();
        let mut state = self.state.lock();
        if state.queued >= self.capacity {
            return Err(ServiceError::Overloaded(format!(
                "Exceeds maximum queue size: model '{m}' is full"
            )));
        }
        let missing_start = || {
            ServiceError::invalid(format!(
                "inference request for sequence {} to model '{m}' must specify the START flag on the first request of the sequence",
                id_text(&flags.id)
            ))
        };
        let state = &mut *state;
        match state.sequences.get(&flags.id) {
            None if !flags.start => return Err(missing_start()),
            None => {
                let slot = state.free_slots.pop();
                if slot.is_none() {
                    state.backlog.push_back(flags.id.clone());
                }
                let sequence = Sequence {
                    jobs: VecDeque::new(),
                    running: false,
                    slot,
                    state: Vec::new(),
                    last_active: now,
                    ending: false,
                };
                state.sequences.insert(flags.id.clone(), sequence);
            }
            Some(s) if s.ending && !flags.start => return Err(missing_start()),
            Some(s) if flags.start && !s.ending => tracing::warn!(
                "sequence {} for model '{m}' has a conflict. The previous sequence did not end before this sequence start. Previous sequence will be terminated early.",
                id_text(&flags.id)
            ),
            Some(_) => {}
        }
        let Some(sequence) = state.sequences.get_mut(&flags.id) else {
            return Err(ServiceError::internal(format!(
                "model '{m}': sequence bookkeeping lost a sequence"
            )));
        };
        sequence.ending = flags.end;
        sequence.last_active = now;
        sequence.jobs.push_back(Job {
            request,
            flags,
            reply,
            arrived: now,
            pending: self.stats.pending(),
        });
        state.queued += 1;
        self.dispatch(state, now);
        Ok(())
    }

    /// Releases idle sequences, then hands batches to idle instances. Called with the lock held.
    fn dispatch(&self, state: &mut State, now: Instant) {
        self.release_idle(state, now);
        let before = state.wake;
        state.wake = self.next_idle_deadline(state);
        let mut i = 0;
        while i < state.idle.len() {
            let worker = state.idle[i];
            match self.form_batch(state, worker, now) {
                Decision::Dispatch(items) => {
                    state.idle.remove(i);
                    if let Err(e) = self.workers[worker].send(Some(items)) {
                        for item in e.into_inner().unwrap_or_default() {
                            let error = ServiceError::internal(format!(
                                "model '{}': an instance stopped unexpectedly",
                                self.model
                            ));
                            let _ = item.job.reply.send(Err(error));
                        }
                    }
                }
                Decision::WaitUntil(t) => {
                    state.wake = Some(state.wake.map_or(t, |w| w.min(t)));
                    i += 1;
                }
                Decision::Empty => i += 1,
            }
        }
        if state.wake.is_some() && state.wake != before {
            self.timer.notify_one();
        }
    }

    /// The next request of every sequence `worker` may run that is ready, oldest first.
    fn form_batch(&self, state: &mut State, worker: usize, now: Instant) -> Decision {
        // Requests whose callers left are answered and skipped.
        for sequence in state.sequences.values_mut() {
            let before = sequence.jobs.len();
            sequence.jobs.retain(|job| !job.reply.is_closed());
            state.queued -= before - sequence.jobs.len();
        }
        let mut ready: Vec<(Instant, CorrelationId)> = state
            .sequences
            .iter()
            .filter(|(_, s)| !s.running)
            .filter(|(_, s)| match (s.slot, &self.slot_instance) {
                (None, _) => false,
                (Some(slot), Some(owner)) => owner[slot] == worker,
                (Some(_), None) => true,
            })
            .filter_map(|(id, s)| s.jobs.front().map(|j| (j.arrived, id.clone())))
            .collect();
        if ready.is_empty() {
            return Decision::Empty;
        }
        ready.sort_by_key(|(arrived, _)| *arrived);
        let take = match &self.policy.strategy {
            Strategy::Direct => ready.len(),
            Strategy::Oldest {
                preferred_batch_sizes,
                max_queue_delay,
                ..
            } => {
                let oldest = ready[0].0;
                if ready.len() >= self.max_batch || oldest + *max_queue_delay <= now {
                    ready.len().min(self.max_batch)
                } else if let Some(&p) = preferred_batch_sizes
                    .iter()
                    .rev()
                    .find(|&&p| p <= ready.len())
                {
                    p
                } else {
                    return Decision::WaitUntil(oldest + *max_queue_delay);
                }
            }
        };
        let mut items = Vec::with_capacity(take);
        for (_, id) in ready.into_iter().take(take) {
            let Some(sequence) = state.sequences.get_mut(&id) else {
                continue;
            };
            let Some(job) = sequence.jobs.pop_front() else {
                continue;
            };
            state.queued -= 1;
            sequence.running = true;
            // A sequence whose START failed or was cancelled begins from the initial state too.
            let inputs = if job.flags.start || sequence.state.is_empty() {
                self.policy.initial_states()
            } else {
                sequence.state.clone()
            };
            items.push(Item { job, state: inputs });
        }
        Decision::Dispatch(items)
    }

    /// Records what a batch left behind: new state, finished and ended sequences.
    fn finish(&self, state: &mut State, done: &[Done], now: Instant) {
        for (flags, new_state) in done {
            let Some(sequence) = state.sequences.get_mut(&flags.id) else {
                continue;
            };
            sequence.running = false;
            sequence.last_active = now;
            if let Some(new_state) = new_state {
                sequence.state = new_state.clone();
            }
            if flags.end && sequence.jobs.is_empty() {
                self.release(state, &flags.id);
            }
        }
    }

    fn release(&self, state: &mut State, id: &CorrelationId) {
        let Some(sequence) = state.sequences.remove(id) else {
            return;
        };
        state.queued -= sequence.jobs.len();
        match sequence.slot {
            None => state.backlog.retain(|b| b != id),
            Some(slot) => {
                // The backlog's oldest live sequence takes the slot.
                while let Some(next) = state.backlog.pop_front() {
                    if let Some(s) = state.sequences.get_mut(&next) {
                        s.slot = Some(slot);
                        return;
                    }
                }
                state.free_slots.push(slot);
            }
        }
    }

    fn release_idle(&self, state: &mut State, now: Instant) {
        let max_idle = self.policy.max_idle;
        let expired: Vec<CorrelationId> = state
            .sequences
            .iter()
            .filter(|(_, s)| !s.running && s.jobs.is_empty() && s.last_active + max_idle <= now)
            .map(|(id, _)| id.clone())
            .collect();
        for id in expired {
            tracing::info!(
                "sequence {} for model '{}' released after {} µs without a request",
                id_text(&id),
                self.model,
                max_idle.as_micros()
            );
            self.release(state, &id);
        }
    }

    fn next_idle_deadline(&self, state: &State) -> Option<Instant> {
        state
            .sequences
            .values()
            .filter(|s| !s.running && s.jobs.is_empty())
            .map(|s| s.last_active + self.policy.max_idle)
            .min()
    }

    /// After instance `worker` ran a batch: record it, then run its next batch, park or stop.
    fn next_for(&self, worker: usize, done: &[Done]) -> Next {
        let mut state = self.state.lock();
        let now = Instant::now();
        self.finish(&mut state, done, now);
        let next = match self.form_batch(&mut state, worker, now) {
            Decision::Dispatch(items) => Next::Run(items),
            Decision::Empty if state.closed => return Next::Stop,
            Decision::WaitUntil(_) | Decision::Empty => {
                state.idle.push(worker);
                Next::Park
            }
        };
        // Finishing may have freed a slot or a sequence for another instance.
        self.dispatch(&mut state, now);
        next
    }
}

enum Next {
    Run(Vec<Item>),
    Park,
    Stop,
}

fn instance_loop(
    index: usize,
    mut instance: Box<dyn BackendInstance>,
    batches: Receiver<Option<Vec<Item>>>,
    shared: &Shared,
    stats: &VersionStats,
) {
    while let Ok(Some(mut items)) = batches.recv() {
        loop {
            let done = run_items(instance.as_mut(), items, shared, stats);
            match shared.next_for(index, &done) {
                Next::Run(next) => items = next,
                Next::Park => break,
                Next::Stop => return,
            }
        }
    }
}

/// Executes the items (one execution per group of requests with the same input signature),
/// answers them, and returns each sequence's new state (`None`: keep the old one).
fn run_items(
    instance: &mut dyn BackendInstance,
    items: Vec<Item>,
    shared: &Shared,
    stats: &VersionStats,
) -> Vec<Done> {
    let policy = &shared.policy;
    let mut groups: Vec<Group> = Vec::new();
    for mut item in items {
        item.job.pending.release();
        let mut inputs = std::mem::take(&mut item.job.request.inputs);
        inputs.extend(policy.control_inputs(&item.job.flags));
        inputs.append(&mut item.state);
        inputs.sort_by(|a, b| a.name().cmp(b.name()));
        let key: Vec<_> = inputs
            .iter()
            .map(|t| {
                (
                    t.name().to_string(),
                    t.datatype().as_wire(),
                    t.shape().get(1..).unwrap_or(&[]).to_vec(),
                )
            })
            .collect();
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, members)) => members.push((item, inputs)),
            None => groups.push((key, vec![(item, inputs)])),
        }
    }
    let mut done = Vec::new();
    for (_, members) in groups {
        done.extend(run_group(instance, members, shared, stats));
    }
    done
}

fn run_group(
    instance: &mut dyn BackendInstance,
    members: Vec<(Item, Vec<Tensor>)>,
    shared: &Shared,
    stats: &VersionStats,
) -> Vec<Done> {
    let started = Instant::now();
    let mut names: Vec<String> = Vec::new();
    for (item, _) in &members {
        for o in &item.job.request.outputs {
            if !names.contains(o) {
                names.push(o.clone());
            }
        }
    }
    for s in &shared.policy.states {
        if !names.contains(&s.output) {
            names.push(s.output.clone());
        }
    }
    let (input_done, infer_done, per_member) = if instance.request_level() {
        execute_each(instance, &members, &names)
    } else {
        execute_joined(instance, &members, &names)
    };
    let done_at = Instant::now();
    if per_member.iter().any(Result::is_ok) {
        stats.record_execution(
            members.len(),
            input_done - started,
            infer_done - input_done,
            done_at - infer_done,
        );
    }
    let mut done = Vec::with_capacity(members.len());
    for ((item, _), result) in members.into_iter().zip(per_member) {
        let job = item.job;
        let timings = ExecTimings {
            queue: started.saturating_duration_since(job.arrived),
            compute_input: input_done - started,
            compute_infer: infer_done - input_done,
            compute_output: done_at - infer_done,
        };
        let (outputs, new_state) = match result {
            Ok(produced) => {
                let of = |name: &str| {
                    names
                        .iter()
                        .position(|n| n == name)
                        .and_then(|k| produced.get(k).cloned())
                };
                let outputs = job
                    .request
                    .outputs
                    .iter()
                    .filter_map(|want| of(want))
                    .collect();
                let new_state: Option<Vec<Tensor>> = shared
                    .policy
                    .states
                    .iter()
                    .map(|s| of(&s.output).map(|t| t.renamed(s.input.clone())))
                    .collect();
                (Ok(outputs), new_state)
            }
            Err(e) => (Err(e), None),
        };
        let _ = job.reply.send(Ok(JobResult { outputs, timings }));
        done.push((job.flags, new_state));
    }
    done
}

/// Per member, its outputs in `names` order, or its error.
type MemberResults = Vec<Result<Vec<Tensor>, BackendError>>;

/// One joined batch through `execute`, split back per member (tensor backends).
fn execute_joined(
    instance: &mut dyn BackendInstance,
    members: &[(Item, Vec<Tensor>)],
    names: &[String],
) -> (Instant, Instant, MemberResults) {
    let sizes = vec![1usize; members.len()];
    let inputs: Vec<&[Tensor]> = members
        .iter()
        .map(|(_, inputs)| inputs.as_slice())
        .collect();
    let result = BatchInputs::new(&inputs).and_then(|batch_inputs| {
        let started = Instant::now();
        let outputs = instance.execute(&batch_inputs, names)?;
        let finished = Instant::now();
        let split = outputs
            .iter()
            .map(|o| batch::split_output(o, &sizes))
            .collect::<Result<Vec<Vec<Tensor>>, BackendError>>()?;
        Ok((started, finished, split))
    });
    match result {
        Ok((input_done, finished, split)) => {
            let per_member = (0..members.len())
                .map(|i| {
                    Ok(split
                        .iter()
                        .map(|per_output| per_output[i].clone())
                        .collect())
                })
                .collect();
            (input_done, finished, per_member)
        }
        Err(e) => {
            let now = Instant::now();
            (now, now, vec![Err(e); members.len()])
        }
    }
}

/// Each member as its own request (request-level backends: Python), controls and state
/// included among its inputs.
fn execute_each(
    instance: &mut dyn BackendInstance,
    members: &[(Item, Vec<Tensor>)],
    names: &[String],
) -> (Instant, Instant, MemberResults) {
    let started = Instant::now();
    let views: Vec<RequestView<'_>> = members
        .iter()
        .map(|(item, inputs)| RequestView {
            inputs,
            outputs: names,
            ..super::request_view(&item.job.request)
        })
        .collect();
    let per_member = match instance.execute_requests(&views) {
        Ok(results) if results.len() == members.len() => results,
        Ok(results) => vec![
            Err(BackendError::Execution(format!(
                "the backend answered {} of {} requests",
                results.len(),
                members.len()
            )));
            members.len()
        ],
        Err(e) => vec![Err(e); members.len()],
    };
    (started, Instant::now(), per_member)
}

impl timer::Timed for State {
    fn closed(&self) -> bool {
        self.closed
    }

    fn wake(&self) -> Option<Instant> {
        self.wake
    }
}
