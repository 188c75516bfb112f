//! The execution engine both schedulers share: the instance threads, the timer thread, the
//! hand-off of batches, running them, answering, preserve_ordering and shutdown. What goes in
//! a batch is not its business: a [`Batcher`] decides that (the dynamic batcher's queue, or the
//! sequence batcher's slots), and its [`Feed`] shapes the batch for the model.
//!
//! ```text
//! submit() ─► Feed::ticket (no lock: classify, or refuse at once) ─┐
//!                                                                  ▼
//!        ┌────────────────────── lock: bookkeeping only ──────────────────────┐
//!        │ Batcher::admit                                                     │
//!        │ Batcher::sweep                (cancelled, expired, idle sequences) │
//!        │ Batcher::form_batch(i, now)   for each idle instance i ────────────┼─► hand-off
//!        └────────────────────────────────────────────────────────────────────┘   (one hop)
//! timer thread: wake-up passed ─► the same sweep and form_batch under the lock
//!
//! instance thread (no lock):
//!   rate limiter (when on): wait until the instance's resources are granted
//!   Feed::executions ─► run_joined (join + execute) | execute_requests (Python)
//!   ─► split ─► Feed::produced ─► reply per request (preserve_ordering: arrival order)
//!      (a request the model rescheduled: Feed::reschedule ─► back with its tag, unanswered)
//!   ─► lock: Batcher::finished (queues rescheduled requests again), sweep, form_batch(self)
//!                                        ─► run it (no hop under load)
//!                                        └► none: park as idle
//! ```
//!
//! The batching decision plugs in as a [`Batcher`] and its [`Feed`]:
//! [`super::dynamic::DynamicBatcher`] (over the pure `queue.rs`) and
//! [`super::sequence::SequenceBatcher`] (over the pure `sequence/slots.rs`).
//!
//! Batches form only when an instance is free, so under load they grow by themselves. The
//! lock is held only for bookkeeping, never while a model runs. A caller that goes away drops
//! its reply receiver (a streamed request's client, its stream); its request is skipped, before
//! it is batched and again before its batch runs, and a request the model rescheduled is not
//! queued again. Dropping the [`Engine`] stops the timer and lets the instance threads exit
//! once idle.
//!
//! Request rescheduling (Triton's `TRITONSERVER_REQUEST_RELEASE_RESCHEDULE`, a Python model's
//! `request.set_release_flags(...)`): a request-level backend may hand a request back instead of
//! answering it. If the feed takes it ([`Feed::reschedule`]: the `iterative_sequence` batcher),
//! the job goes back to the batcher with its tag and runs again, keeping its key, its reply and
//! its stream; otherwise it is answered with Triton's error.

mod run;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};
use nereid_proto::{ServiceError, Tensor};
use parking_lot::{Condvar, Mutex};
use tokio::sync::oneshot;

use super::queue::Decision;
use super::{JobResult, timer};
use crate::backend::{BackendError, BackendInstance};
use crate::config::RaggedBatching;
use crate::rate_limit::{Grant, InstanceLimit};
use crate::request_check::ValidRequest;
use crate::stats::{PendingMark, VersionStats};

pub(super) type Reply = oneshot::Sender<Result<JobResult, ServiceError>>;

/// A submitted request and where its answer goes.
pub(super) struct Job {
    /// Counts the request as pending until its batch starts executing. First, so that a job
    /// dropped unanswered stops counting before its caller sees the closed reply.
    pub(super) pending: PendingMark,
    pub(super) request: ValidRequest,
    pub(super) reply: Reply,
    pub(super) arrived: Instant,
    /// Arrival order, for `preserve_ordering`.
    seq: u64,
    /// Names the request to a request-level backend (streaming, cancellation); the same in
    /// every run of a rescheduled request.
    pub(super) key: u64,
}

impl Job {
    /// Whether the caller went away: it dropped its reply, or a streamed request's client
    /// dropped the stream.
    pub(super) fn gone(&self) -> bool {
        self.reply.is_closed()
            || self
                .request
                .stream
                .as_ref()
                .is_some_and(|stream| stream.is_closed())
    }
}

/// A request a batcher refused, with the error its caller gets.
pub(super) struct Refused {
    pub(super) job: Job,
    pub(super) error: ServiceError,
}

/// A request in a formed batch, with what its batcher keeps about it until it finished.
pub(super) struct Entry<T> {
    pub(super) job: Job,
    pub(super) tag: T,
}

/// A request of a run batch, back to its batcher ([`Batcher::finished`]).
pub(super) struct Done<T> {
    pub(super) tag: T,
    /// The model rescheduled the request and the feed took it ([`Feed::reschedule`]): the job,
    /// unanswered, to queue again. `None`: it was answered.
    pub(super) again: Option<Job>,
}

impl<T> Done<T> {
    /// An answered request's tag.
    pub(super) fn answered(tag: T) -> Done<T> {
        Done { tag, again: None }
    }
}

/// The batching decision the engine drives. Lives under the engine's lock: every method is
/// bookkeeping, and the pure decision behind it is tested without threads.
pub(super) trait Batcher: Send + 'static {
    /// What the batcher keeps with each batched request and gets back once it ran.
    type Tag: Send + 'static;
    /// The batcher's lock-free side.
    type Feed: Feed<Tag = Self::Tag>;
    /// Requests waiting (not yet handed to an instance).
    fn queued(&self) -> usize;
    /// Queues a request, or gives it back with the error its caller gets (a full queue...).
    fn admit(
        &mut self,
        job: Job,
        ticket: <Self::Feed as Feed>::Ticket,
        now: Instant,
    ) -> Result<(), Box<Refused>>;
    /// Removes the requests that must not run any more (their caller left, their timeout
    /// expired), each with the error it is answered with.
    fn sweep(&mut self, now: Instant) -> Vec<(Job, ServiceError)>;
    /// Removes every queued request (not yet handed to an instance): the version is unloading
    /// and its drain ran out of time.
    fn take_queued(&mut self) -> Vec<Job>;
    /// What the free instance `instance` should run.
    fn form_batch(&mut self, instance: usize, now: Instant) -> Decision<Vec<Entry<Self::Tag>>>;
    /// The requests of a batch have been answered (or skipped), or come back to queue again
    /// (rescheduled: [`Done::again`], only where the feed took them). Returns whether that may
    /// have made work ready for other instances (a sequence's next request, a freed slot).
    fn finished(&mut self, done: Vec<Done<Self::Tag>>, now: Instant) -> bool;
    /// When [`Batcher::sweep`] has something to do next (a timeout, an idle sequence).
    fn next_wake(&self) -> Option<Instant>;
    /// Whether `form_batch` may differ between instances; when not, the engine stops asking
    /// idle instances at the first that gets no batch.
    fn per_instance(&self) -> bool;
}

/// What a batcher does outside the lock: classify a request before it is queued, and shape a
/// formed batch for the model.
pub(super) trait Feed: Send + Sync + 'static {
    type Tag: Send + 'static;
    /// What [`Batcher::admit`] needs of a request, computed before taking the lock.
    type Ticket;
    /// Classifies a request, or refuses it at once.
    fn ticket(&self, request: &ValidRequest, now: Instant) -> Result<Self::Ticket, ServiceError>;
    /// Splits a batch into executions of requests whose inputs join, adding the inputs the
    /// batcher generates (sequence controls and state).
    fn executions(&self, batch: Vec<Entry<Self::Tag>>) -> Vec<Vec<Entry<Self::Tag>>>;
    /// Outputs the model must produce for the batcher, besides those the requests ask for.
    fn extra_outputs(&self) -> &[String];
    /// What a request's execution produced (`names[k]` is `outputs[k]`; `None`: it failed),
    /// shown before it is answered.
    fn produced(&self, tag: &mut Self::Tag, outputs: Option<(&[String], &[Tensor])>);
    /// Dummy requests to run an execution with, so that each request keeps a fixed position in
    /// the batch (the sequence batcher's `direct` slots); `None`: the execution as it is.
    fn padding(&self, _execution: &[Entry<Self::Tag>]) -> Option<Padding> {
        None
    }
    /// The model rescheduled `request` (Triton's request rescheduling): whether the batcher
    /// runs it again. If so, `tag` and `request` are made ready to queue again (what
    /// [`Feed::executions`] added taken out); if not, the request is answered with Triton's
    /// error. The default: never (only the `iterative_sequence` batcher reschedules).
    fn reschedule(&self, _tag: &mut Self::Tag, _request: &mut ValidRequest) -> bool {
        false
    }
}

/// How an execution is padded with dummy requests.
pub(super) struct Padding {
    /// Per position of the padded batch: `Some(k)`, the execution's `k`-th request; `None`, a
    /// dummy.
    pub(super) layout: Vec<Option<usize>>,
    /// A dummy's inputs (one request's worth).
    pub(super) dummy: Vec<Tensor>,
}

/// Holds answers back until every earlier request has been answered (`preserve_ordering`).
#[derive(Default)]
struct Reorder {
    next: u64,
    ready: BTreeMap<u64, (Reply, Result<JobResult, ServiceError>)>,
}

/// What the callers, the instances and the timer share under the lock.
struct State<B> {
    batcher: B,
    /// Instances waiting for work.
    idle: Vec<usize>,
    /// Set when the engine handle is dropped.
    closed: bool,
    /// Sequence number of the next admitted request.
    next_seq: u64,
    /// When the timer must next look (a delay ending, a timeout, an idle sequence).
    wake: Option<Instant>,
}

type Batch<T> = Vec<Entry<T>>;

struct Shared<B: Batcher> {
    model: String,
    feed: B::Feed,
    state: Mutex<State<B>>,
    /// Wakes the timer thread when `wake` moves or the engine closes.
    timer: Condvar,
    /// One slot per instance: the batch handed to an idle instance (`None`: stop).
    workers: Vec<Sender<Option<Batch<B::Tag>>>>,
    /// Present when the config asks for `preserve_ordering`.
    reorder: Option<Mutex<Reorder>>,
    /// The version's statistics (pending requests are counted from submission).
    stats: Arc<VersionStats>,
    /// Rate-limiter registrations by instance index (see [`EngineConfig::limits`]).
    limits: Vec<Option<InstanceLimit>>,
    /// See [`EngineConfig::ragged`].
    ragged: RaggedBatching,
}

/// Handle to a running engine; dropping it stops the engine.
pub(super) struct Engine<B: Batcher> {
    shared: Arc<Shared<B>>,
}

/// How to start an engine besides its batcher and instances.
pub(super) struct EngineConfig {
    pub(super) model: String,
    /// Names the timer thread: `nereid-<timer>-<model>`.
    pub(super) timer: &'static str,
    pub(super) preserve_ordering: bool,
    pub(super) stats: Arc<VersionStats>,
    /// Per instance (by index; missing: not limited): the rate limiter's hold on it.
    pub(super) limits: Vec<Option<InstanceLimit>>,
    /// The model's ragged batching: batch inputs generated and batch outputs scattered around
    /// each joined execution.
    pub(super) ragged: RaggedBatching,
}

impl<B: Batcher> Engine<B> {
    /// Starts one thread per instance and the timer thread. A thread that cannot start fails
    /// the load.
    pub(super) fn start(
        config: EngineConfig,
        batcher: B,
        feed: B::Feed,
        instances: Vec<(String, Box<dyn BackendInstance>)>,
    ) -> Result<Engine<B>, BackendError> {
        let count = instances.len();
        let (workers, receivers): (Vec<_>, Vec<_>) =
            (0..count).map(|_| crossbeam_channel::bounded(1)).unzip();
        let shared = Arc::new(Shared {
            model: config.model,
            feed,
            state: Mutex::new(State {
                batcher,
                idle: (0..count).rev().collect(),
                closed: false,
                next_seq: 0,
                wake: None,
            }),
            timer: Condvar::new(),
            workers,
            reorder: config
                .preserve_ordering
                .then(|| Mutex::new(Reorder::default())),
            stats: config.stats,
            limits: config.limits,
            ragged: config.ragged,
        });
        // Built first: if a thread cannot start, dropping it stops those already started.
        let engine = Engine {
            shared: shared.clone(),
        };
        let model = &shared.model;
        let spawn_err = |e: std::io::Error| {
            BackendError::Load(format!("model '{model}': cannot start a thread: {e}"))
        };
        for (index, ((name, instance), batches)) in instances.into_iter().zip(receivers).enumerate()
        {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name(format!("nereid-{name}"))
                .spawn(move || shared.instance_loop(index, instance, batches))
                .map_err(spawn_err)?;
        }
        let timer_shared = shared.clone();
        std::thread::Builder::new()
            .name(format!("nereid-{}-{model}", config.timer))
            .spawn(move || {
                let shared = &*timer_shared;
                timer::timer_loop(&shared.state, &shared.timer, |state, now| {
                    shared.dispatch(state, now)
                })
            })
            .map_err(spawn_err)?;
        Ok(engine)
    }

    /// Requests waiting (not yet handed to an instance).
    pub(super) fn queue_depth(&self) -> usize {
        self.shared.state.lock().batcher.queued()
    }

    /// Answers every queued request with `error()` at once; requests already executing run
    /// to the end. Returns how many were refused.
    pub(super) fn refuse_queued(&self, error: impl Fn() -> ServiceError) -> usize {
        let jobs = self.shared.state.lock().batcher.take_queued();
        let refused = jobs.len();
        for job in jobs {
            self.shared.respond(job, Err(error()));
        }
        refused
    }

    /// Queues a request and waits for its result. Dropping the future cancels the request if
    /// it has not started executing.
    pub(super) async fn submit(&self, request: ValidRequest) -> Result<JobResult, ServiceError> {
        let shared = &self.shared;
        let now = Instant::now();
        let ticket = shared.feed.ticket(&request, now)?;
        let (reply, result) = oneshot::channel();
        shared.enqueue(
            Job {
                pending: shared.stats.pending(),
                request,
                reply,
                arrived: now,
                seq: 0,
                key: super::next_key(),
            },
            ticket,
        );
        result.await.map_err(|_| {
            ServiceError::internal(format!(
                "model '{}': the scheduler stopped before answering",
                shared.model
            ))
        })?
    }
}

impl<B: Batcher> Drop for Engine<B> {
    /// Stops the timer and the idle instances; busy ones stop when they finish.
    fn drop(&mut self) {
        let shared = &self.shared;
        let mut state = shared.state.lock();
        state.closed = true;
        for &worker in &state.idle {
            let _ = shared.workers[worker].try_send(None);
        }
        state.idle.clear();
        shared.timer.notify_one();
    }
}

/// What an instance does after finishing a batch.
enum Next<T> {
    Run(Batch<T>),
    Park,
    Stop,
}

impl<B: Batcher> Shared<B> {
    fn enqueue(&self, mut job: Job, ticket: <B::Feed as Feed>::Ticket) {
        let now = job.arrived;
        let mut state = self.state.lock();
        job.seq = state.next_seq;
        if let Err(refused) = state.batcher.admit(job, ticket, now) {
            drop(state);
            let Refused { mut job, error } = *refused;
            // Refused before it was numbered: never held back by preserve_ordering.
            job.pending.release();
            let _ = job.reply.send(Err(error));
            return;
        }
        state.next_seq += 1;
        self.dispatch(&mut state, now);
    }

    /// Sweeps, then hands batches to idle instances while there is work that is ready.
    /// Called with the lock held (by submissions and the timer).
    fn dispatch(&self, state: &mut State<B>, now: Instant) {
        let before = state.wake;
        self.sweep(state, now);
        state.wake = state.batcher.next_wake();
        self.hand_out(state, now);
        self.tell_timer(state, before);
    }

    /// Answers the requests the batcher swept out (cancelled, expired).
    fn sweep(&self, state: &mut State<B>, now: Instant) {
        for (job, error) in state.batcher.sweep(now) {
            self.respond(job, Err(error));
        }
    }

    /// Asks idle instances, the most recently parked first, for batches.
    fn hand_out(&self, state: &mut State<B>, now: Instant) {
        let mut i = state.idle.len();
        while i > 0 {
            i -= 1;
            let worker = state.idle[i];
            match state.batcher.form_batch(worker, now) {
                Decision::Dispatch(batch) => {
                    state.idle.remove(i);
                    if let Err(e) = self.workers[worker].send(Some(batch)) {
                        let batch = e.into_inner().unwrap_or_default();
                        let mut done = Vec::with_capacity(batch.len());
                        for entry in batch {
                            done.push(Done::answered(entry.tag));
                            self.respond(
                                entry.job,
                                Err(ServiceError::internal(format!(
                                    "model '{}': an instance stopped unexpectedly",
                                    self.model
                                ))),
                            );
                        }
                        state.batcher.finished(done, now);
                    }
                }
                Decision::WaitUntil(t) => {
                    wake_by(state, Some(t));
                    if !state.batcher.per_instance() {
                        break;
                    }
                }
                Decision::Empty if !state.batcher.per_instance() => break,
                Decision::Empty => {}
            }
        }
    }

    /// Wakes the timer when the wake-up time moved to a new instant.
    fn tell_timer(&self, state: &State<B>, before: Option<Instant>) {
        if state.wake.is_some() && state.wake != before {
            self.timer.notify_one();
        }
    }

    /// What instance `worker` does after answering a batch: run the next one it forms
    /// itself, park (marked idle), or stop.
    fn next_for(&self, worker: usize, done: Vec<Done<B::Tag>>) -> Next<B::Tag> {
        let mut state = self.state.lock();
        let now = Instant::now();
        let freed = state.batcher.finished(done, now);
        let before = state.wake;
        self.sweep(&mut state, now);
        // Only earlier: a wake-up planned for another idle instance still stands.
        let sweep_due = state.batcher.next_wake();
        wake_by(&mut state, sweep_due);
        let next = match state.batcher.form_batch(worker, now) {
            Decision::Dispatch(batch) => Next::Run(batch),
            Decision::Empty if state.closed => return Next::Stop,
            Decision::WaitUntil(t) => {
                wake_by(&mut state, Some(t));
                Next::Park
            }
            Decision::Empty => Next::Park,
        };
        if freed {
            self.hand_out(&mut state, now);
        }
        if matches!(next, Next::Park) {
            state.idle.push(worker);
        }
        self.tell_timer(&state, before);
        next
    }

    fn instance_loop(
        &self,
        index: usize,
        mut instance: Box<dyn BackendInstance>,
        batches: Receiver<Option<Batch<B::Tag>>>,
    ) {
        let limit = self.limits.get(index).and_then(Option::as_ref);
        while let Ok(Some(mut batch)) = batches.recv() {
            // Under `--rate-limit execution_count` the formed batch waits here, with its
            // instance, until the instance's resources are granted; they are given back when
            // the instance parks, or renewed (competing with the other waiters) before each
            // batch it forms itself.
            let mut grant = limit.map(InstanceLimit::acquire);
            loop {
                let done = self.run_batch(instance.as_mut(), batch);
                match self.next_for(index, done) {
                    Next::Run(next) => {
                        batch = next;
                        grant = grant.map(Grant::renew);
                    }
                    Next::Park => break,
                    Next::Stop => return,
                }
            }
        }
    }

    /// Answers a request: at once, or with `preserve_ordering` once every request admitted
    /// before it has been answered.
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
}

/// Moves the timer's wake-up to `at` if that is earlier.
fn wake_by<B>(state: &mut State<B>, at: Option<Instant>) {
    if let Some(t) = at {
        state.wake = Some(state.wake.map_or(t, |w| w.min(t)));
    }
}

impl<B> timer::Timed for State<B> {
    fn closed(&self) -> bool {
        self.closed
    }

    fn wake(&self) -> Option<Instant> {
        self.wake
    }
}
