//! The scheduler of one model version: a queue shared by the callers, the instance threads
//! and a timer thread.
//!
//! ```text
//! submit() ─lock─► RequestQueue.push ─► an instance idle? form_batch (pure) ─► hand it the batch
//!                                                                              (one thread hop)
//! instance thread: execute ─► split ─► reply per request ─► lock ─► form its own next batch
//!                  (no hop under load)                            └► none: park until handed one
//! timer thread:    wakes for queue delays and queue timeouts, then dispatches like submit()
//! ```
//!
//! Batches form only when an instance is free, so under load they grow by themselves; the
//! queue delay is spent only while some instance is idle. A full queue or an expired timeout
//! is answered at once (`Overloaded`: HTTP 503 / gRPC UNAVAILABLE). A caller that goes away
//! drops its reply receiver; the request is skipped before it is batched. The lock is held
//! only for queue bookkeeping, never while a model runs. Dropping the [`Scheduler`] stops the
//! timer and lets the instance threads exit once idle.

mod batch;
pub mod policy;
pub mod queue;
pub mod sequence;
mod timer;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use nereid_proto::ServiceError;
use nereid_proto::types::Tensor;
use parking_lot::{Condvar, Mutex};
use tokio::sync::oneshot;

use self::policy::BatchPolicy;
use self::queue::{Decision, Pending, RequestQueue, ShapeKey};
use crate::backend::{BackendError, BackendInstance, BatchInputs, RequestView};
use crate::request_check::ValidRequest;
use crate::stats::{PendingMark, VersionStats};

/// What a request gets back from its execution.
#[derive(Debug)]
pub struct JobResult {
    pub outputs: Result<Vec<Tensor>, BackendError>,
    pub timings: ExecTimings,
}

/// Where a request spent its time between submission and answer.
#[derive(Clone, Copy, Debug, Default)]
pub struct ExecTimings {
    pub queue: Duration,
    pub compute_input: Duration,
    pub compute_infer: Duration,
    pub compute_output: Duration,
}

type Reply = oneshot::Sender<Result<JobResult, ServiceError>>;

struct Job {
    /// Counts the request as pending until its batch starts executing. First, so that a job
    /// dropped unanswered stops counting before its caller sees the closed reply.
    pending: PendingMark,
    request: ValidRequest,
    reply: Reply,
    /// Arrival order, for `preserve_ordering`.
    seq: u64,
}

/// Holds answers back until every earlier request has been answered (`preserve_ordering`).
#[derive(Default)]
struct Reorder {
    next: u64,
    ready: std::collections::BTreeMap<u64, (Reply, Result<JobResult, ServiceError>)>,
}

type Batch = Vec<Pending<Job>>;

/// What the callers, the instances and the timer share.
struct State {
    queue: RequestQueue<Job>,
    /// Instances waiting for work.
    idle: Vec<usize>,
    /// Set when the scheduler handle is dropped.
    closed: bool,
    /// Sequence number of the next queued request.
    next_seq: u64,
    /// When the timer must next look at the queue (a delay ending or a timeout).
    wake: Option<Instant>,
}

struct Shared {
    model: String,
    policy: BatchPolicy,
    batching: bool,
    state: Mutex<State>,
    /// Wakes the timer thread when `wake` moves earlier or the scheduler closes.
    timer: Condvar,
    /// One slot per instance: the batch handed to an idle instance (`None`: stop).
    workers: Vec<Sender<Option<Batch>>>,
    /// Present when the config asks for `preserve_ordering`.
    reorder: Option<Mutex<Reorder>>,
    /// The version's statistics (pending requests are counted from submission).
    stats: Arc<VersionStats>,
}

impl Shared {
    /// Fails expired and cancelled requests, then hands batches to idle instances while the
    /// queue has work that is ready. Called with the lock held.
    fn dispatch(&self, state: &mut State, now: Instant) {
        self.sweep(state, now);
        state.wake = state.queue.next_deadline();
        while let Some(&worker) = state.idle.last() {
            match state.queue.form_batch(now, &self.policy) {
                Decision::Dispatch(batch) => {
                    state.idle.pop();
                    if let Err(e) = self.workers[worker].send(Some(batch)) {
                        self.fail_all(e.into_inner().unwrap_or_default(), || {
                            ServiceError::internal(format!(
                                "model '{}': an instance stopped unexpectedly",
                                self.model
                            ))
                        });
                    }
                }
                Decision::WaitUntil(t) => {
                    state.wake = Some(state.wake.map_or(t, |w| w.min(t)));
                    break;
                }
                Decision::Empty => break,
            }
        }
    }

    /// Removes requests whose callers left, and answers those whose queue timeout expired.
    fn sweep(&self, state: &mut State, now: Instant) {
        let gone = state.queue.retain(|job| !job.reply.is_closed());
        if !gone.is_empty() {
            self.fail_all(gone, || {
                ServiceError::Cancelled("the client went away".into())
            });
        }
        let expired = state.queue.expire(now);
        if !expired.is_empty() {
            self.fail_all(expired, || {
                ServiceError::Overloaded(format!(
                    "Request timeout expired: model '{}' did not start the request within its queue timeout",
                    self.model
                ))
            });
        }
    }

    /// What instance `worker` does after finishing a batch: run the next one it forms itself,
    /// park (marked idle; the timer is told if a delay is pending), or stop.
    fn next_for(&self, worker: usize) -> Next {
        let mut state = self.state.lock();
        let now = Instant::now();
        self.sweep(&mut state, now);
        match state.queue.form_batch(now, &self.policy) {
            Decision::Dispatch(batch) => Next::Run(batch),
            Decision::Empty if state.closed => Next::Stop,
            Decision::WaitUntil(t) => {
                state.idle.push(worker);
                state.wake = Some(state.wake.map_or(t, |w| w.min(t)));
                self.timer.notify_one();
                Next::Park
            }
            Decision::Empty => {
                state.idle.push(worker);
                Next::Park
            }
        }
    }
}

enum Next {
    Run(Batch),
    Park,
    Stop,
}

impl Shared {
    /// Answers a queued request: at once, or with `preserve_ordering` once every request that
    /// arrived before it has been answered.
    fn respond(&self, mut job: Job, result: Result<JobResult, ServiceError>) {
        // Before the answer, so a caller that has its answer never sees itself pending.
        job.pending.release();
        let Some(reorder) = &self.reorder else {
            let _ = job.reply.send(result);
            return;
        };
        let mut r = reorder.lock();
        r.ready.insert(job.seq, (job.reply, result));
        loop {
            let next = r.next;
            let Some((reply, result)) = r.ready.remove(&next) else {
                break;
            };
            let _ = reply.send(result);
            r.next += 1;
        }
    }

    fn fail_all(&self, batch: Batch, error: impl Fn() -> ServiceError) {
        for p in batch {
            self.respond(p.payload, Err(error()));
        }
    }
}

/// Handle to a model version's scheduler. Cheap to share behind the version's `Arc`.
pub struct Scheduler {
    kind: Kind,
    instances: usize,
}

/// The queue of the default scheduler and the dynamic batcher, or the sequence batcher.
enum Kind {
    Queue(Arc<Shared>),
    Sequence(sequence::SequenceScheduler),
}

impl Scheduler {
    /// Starts one thread per instance and the timer thread. `queue_capacity` bounds the
    /// requests waiting in the queue across all priority levels, on top of any
    /// `max_queue_size` of the config.
    pub fn start(
        model: &str,
        policy: BatchPolicy,
        instances: Vec<(String, Box<dyn BackendInstance>)>,
        stats: Arc<VersionStats>,
        queue_capacity: usize,
    ) -> Result<Scheduler, BackendError> {
        let count = instances.len();
        if let Some(sequence_policy) = policy.sequence.clone() {
            let s = sequence::SequenceScheduler::start(
                model,
                sequence_policy,
                policy.max_batch_size,
                instances,
                stats,
                queue_capacity,
            )?;
            return Ok(Scheduler {
                kind: Kind::Sequence(s),
                instances: count,
            });
        }
        let (workers, receivers) = hand_offs::<Batch>(count);
        let shared = Arc::new(Shared {
            model: model.to_string(),
            batching: policy.max_batch_size > 0,
            state: Mutex::new(State {
                queue: RequestQueue::with_capacity(&policy, queue_capacity),
                idle: (0..count).rev().collect(),
                closed: false,
                next_seq: 0,
                wake: None,
            }),
            reorder: policy
                .preserve_ordering
                .then(|| Mutex::new(Reorder::default())),
            policy,
            timer: Condvar::new(),
            workers,
            stats: stats.clone(),
        });
        start_threads(
            model,
            "timer",
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
        Ok(Scheduler {
            kind: Kind::Queue(shared),
            instances: count,
        })
    }

    /// Requests waiting in the queue (not yet handed to an instance).
    pub fn queue_depth(&self) -> usize {
        match &self.kind {
            Kind::Queue(shared) => shared.state.lock().queue.len(),
            Kind::Sequence(s) => s.queue_depth(),
        }
    }

    /// Queues a request and waits for its result. Dropping the future cancels the request if
    /// it has not been batched yet.
    pub async fn submit(&self, request: ValidRequest) -> Result<JobResult, ServiceError> {
        let shared = match &self.kind {
            Kind::Queue(shared) => shared,
            Kind::Sequence(s) => return s.submit(request).await,
        };
        let (reply, result) = oneshot::channel();
        enqueue(
            shared,
            Job {
                request,
                reply,
                seq: 0,
                pending: shared.stats.pending(),
            },
        );
        result.await.map_err(|_| {
            ServiceError::internal(format!(
                "model '{}': the scheduler stopped before answering",
                shared.model
            ))
        })?
    }

    /// Number of instance threads.
    pub fn instance_count(&self) -> usize {
        self.instances
    }
}

/// The hand-off channels of a scheduler's instances: the senders for the dispatcher, the
/// receivers for the instance threads. `None` tells an idle instance to stop.
type HandOffs<B> = (Vec<Sender<Option<B>>>, Vec<Receiver<Option<B>>>);

/// One hand-off channel per instance.
pub(super) fn hand_offs<B>(count: usize) -> HandOffs<B> {
    (0..count).map(|_| crossbeam_channel::bounded(1)).unzip()
}

/// Starts a scheduler's threads: `nereid-<instance>` running `run` per instance with its own
/// receiver, then `nereid-<timer>-<model>` running `timer`. A thread that cannot start fails
/// the load.
pub(super) fn start_threads<S, B>(
    model: &str,
    timer_kind: &str,
    instances: Vec<(String, Box<dyn BackendInstance>)>,
    receivers: Vec<Receiver<Option<B>>>,
    shared: &Arc<S>,
    run: impl Fn(usize, Box<dyn BackendInstance>, Receiver<Option<B>>, &S) + Clone + Send + 'static,
    timer: impl FnOnce(&S) + Send + 'static,
) -> Result<(), BackendError>
where
    S: Send + Sync + 'static,
    B: Send + 'static,
{
    let spawn_err = |e: std::io::Error| {
        BackendError::Load(format!("model '{model}': cannot start a thread: {e}"))
    };
    for (index, ((name, instance), batches)) in instances.into_iter().zip(receivers).enumerate() {
        let shared = shared.clone();
        let run = run.clone();
        std::thread::Builder::new()
            .name(format!("nereid-{name}"))
            .spawn(move || run(index, instance, batches, &shared))
            .map_err(spawn_err)?;
    }
    let shared = shared.clone();
    std::thread::Builder::new()
        .name(format!("nereid-{timer_kind}-{model}"))
        .spawn(move || timer(&shared))
        .map_err(spawn_err)?;
    Ok(())
}

fn enqueue(shared: &Shared, job: Job) {
    let policy = &shared.policy;
    let arrived = Instant::now();
    let level = policy.level_index(job.request.priority);
    let queue_policy = &policy.queue_policies[level.min(policy.queue_policies.len() - 1)];
    let pending = Pending {
        batch_size: job.request.batch_size,
        shape: shape_key(&job.request.inputs, shared.batching),
        arrived,
        deadline: queue_policy
            .timeout_for(job.request.timeout_us)
            .map(|t| arrived + t),
        timeout_action: queue_policy.timeout_action,
        payload: job,
    };
    let mut state = shared.state.lock();
    let mut pending = pending;
    pending.payload.seq = state.next_seq;
    if let Err(rejected) = state.queue.push(level, pending) {
        drop(state);
        let _ = rejected
            .payload
            .reply
            .send(Err(ServiceError::Overloaded(format!(
                "Exceeds maximum queue size: model '{}' priority level {} is full",
                shared.model,
                level + 1
            ))));
        return;
    }
    state.next_seq += 1;
    let before = state.wake;
    shared.dispatch(&mut state, arrived);
    if state.wake.is_some() && state.wake != before {
        shared.timer.notify_one();
    }
}

impl Drop for Scheduler {
    /// Stops the timer and the idle instances; busy ones stop when they finish. (The sequence
    /// batcher stops itself when dropped.)
    fn drop(&mut self) {
        let Kind::Queue(shared) = &self.kind else {
            return;
        };
        let mut state = shared.state.lock();
        state.closed = true;
        for &worker in &state.idle {
            let _ = shared.workers[worker].try_send(None);
        }
        state.idle.clear();
        shared.timer.notify_one();
    }
}

fn shape_key(inputs: &[Tensor], batching: bool) -> ShapeKey {
    inputs
        .iter()
        .map(|t| {
            let dims = if batching {
                t.shape().get(1..).unwrap_or(&[])
            } else {
                t.shape()
            };
            (t.name().to_string(), t.datatype().as_wire(), dims.to_vec())
        })
        .collect()
}

fn instance_loop(
    index: usize,
    mut instance: Box<dyn BackendInstance>,
    batches: Receiver<Option<Batch>>,
    shared: &Shared,
    stats: &VersionStats,
) {
    while let Ok(Some(mut batch)) = batches.recv() {
        loop {
            run_batch(instance.as_mut(), batch, shared, stats);
            match shared.next_for(index) {
                Next::Run(next) => batch = next,
                Next::Park => break,
                Next::Stop => return,
            }
        }
    }
}

fn run_batch(
    instance: &mut dyn BackendInstance,
    batch: Batch,
    shared: &Shared,
    stats: &VersionStats,
) {
    let started = Instant::now();
    // Requests whose callers left while the batch was formed are dropped here.
    let (gone, mut batch): (Batch, Batch) =
        batch.into_iter().partition(|p| p.payload.reply.is_closed());
    shared.fail_all(gone, || {
        ServiceError::Cancelled("the client went away".into())
    });
    if batch.is_empty() {
        return;
    }
    for p in &mut batch {
        p.payload.pending.release();
    }
    if instance.request_level() {
        run_requests(instance, batch, shared, stats, started);
        return;
    }
    let sizes: Vec<usize> = batch.iter().map(|p| p.batch_size).collect();
    let mut names: Vec<String> = Vec::new();
    for p in &batch {
        for o in &p.payload.request.outputs {
            if !names.contains(o) {
                names.push(o.clone());
            }
        }
    }
    let inputs: Vec<&[Tensor]> = batch
        .iter()
        .map(|p| p.payload.request.inputs.as_slice())
        .collect();
    let result = BatchInputs::new(&inputs).and_then(|batch_inputs| {
        let input_done = Instant::now();
        let outputs = instance.execute(&batch_inputs, &names)?;
        Ok((input_done, Instant::now(), outputs))
    });
    let (input_done, infer_done, split) = match result {
        Ok((input_done, infer_done, outputs)) => {
            let split: Result<Vec<Vec<Tensor>>, BackendError> = outputs
                .iter()
                .map(|o| batch::split_output(o, &sizes))
                .collect();
            (input_done, infer_done, split)
        }
        Err(e) => {
            let now = Instant::now();
            (now, now, Err(e))
        }
    };
    let done = Instant::now();
    let timings = |arrived: Instant| ExecTimings {
        queue: started.saturating_duration_since(arrived),
        compute_input: input_done - started,
        compute_infer: infer_done - input_done,
        compute_output: done - infer_done,
    };
    if split.is_ok() {
        stats.record_execution(
            sizes.iter().sum(),
            input_done - started,
            infer_done - input_done,
            done - infer_done,
        );
    }
    for (i, p) in batch.into_iter().enumerate() {
        let outputs = match &split {
            Ok(per_output) => Ok(p
                .payload
                .request
                .outputs
                .iter()
                .filter_map(|want| {
                    names
                        .iter()
                        .position(|n| n == want)
                        .map(|k| per_output[k][i].clone())
                })
                .collect()),
            Err(e) => Err(e.clone()),
        };
        let timings = timings(p.arrived);
        shared.respond(p.payload, Ok(JobResult { outputs, timings }));
    }
}

/// Hands a batch to a request-level backend (Python): each request keeps its own tensors,
/// parameters and outputs; one result comes back per request.
fn run_requests(
    instance: &mut dyn BackendInstance,
    batch: Batch,
    shared: &Shared,
    stats: &VersionStats,
    started: Instant,
) {
    let views: Vec<RequestView<'_>> = batch
        .iter()
        .map(|p| request_view(&p.payload.request))
        .collect();
    let result = instance.execute_requests(&views);
    drop(views);
    let done = Instant::now();
    let results: Vec<Result<Vec<Tensor>, BackendError>> = match result {
        Ok(per_request) if per_request.len() == batch.len() => per_request,
        Ok(per_request) => {
            let e = BackendError::Execution(format!(
                "the backend answered {} of {} requests",
                per_request.len(),
                batch.len()
            ));
            vec![Err(e); batch.len()]
        }
        Err(e) => vec![Err(e); batch.len()],
    };
    if results.iter().any(Result::is_ok) {
        let size = batch.iter().map(|p| p.batch_size).sum();
        stats.record_execution(size, Duration::ZERO, done - started, Duration::ZERO);
    }
    for (p, outputs) in batch.into_iter().zip(results) {
        let timings = ExecTimings {
            queue: started.saturating_duration_since(p.arrived),
            compute_input: Duration::ZERO,
            compute_infer: done - started,
            compute_output: Duration::ZERO,
        };
        shared.respond(p.payload, Ok(JobResult { outputs, timings }));
    }
}

/// What a request-level backend sees of a request.
pub(crate) fn request_view(request: &ValidRequest) -> RequestView<'_> {
    static NEXT_KEY: AtomicU64 = AtomicU64::new(1);
    let (correlation_id, flags) = match &request.sequence {
        Some(s) => (Some(&s.id), u32::from(s.start) | (u32::from(s.end) << 1)),
        None => (None, 0),
    };
    RequestView {
        key: NEXT_KEY.fetch_add(1, Ordering::Relaxed),
        id: &request.id,
        inputs: &request.inputs,
        outputs: &request.outputs,
        parameters: &request.parameters,
        correlation_id,
        flags,
        stream: request.stream.as_ref(),
    }
}

impl timer::Timed for State {
    fn closed(&self) -> bool {
        self.closed
    }

    fn wake(&self) -> Option<Instant> {
        self.wake
    }
}
