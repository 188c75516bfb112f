//! The scheduler of one model version: one execution [`engine`] (instance threads, timer,
//! hand-off, run, reply, shutdown) driven by the version's batching decision.
//!
//! ```text
//!                      ┌─ no sequence_batching: dynamic::DynamicBatcher ── queue::RequestQueue (pure)
//! Scheduler::start ────┤
//!                      └─ sequence_batching:    sequence::SequenceBatcher ─ sequence::slots (pure)
//!                                   │
//!                                   ▼
//!                     engine::Engine<B: Batcher> ─► instance threads ─► batch.rs (join / split)
//!                                                                      ragged.rs (batch inputs,
//!                                                                      batch output shapes)
//! ```
//!
//! Batches form only when an instance is free, so under load they grow by themselves; the
//! queue delay is spent only while some instance is idle. A full queue or an expired timeout
//! is answered at once (`Overloaded`: HTTP 503 / gRPC UNAVAILABLE). A caller that goes away
//! drops its reply receiver; the request is skipped before it is batched. The lock is held
//! only for queue bookkeeping, never while a model runs. Dropping the [`Scheduler`] stops the
//! timer and lets the instance threads exit once idle.

mod batch;
mod dynamic;
mod engine;
pub mod policy;
pub mod queue;
pub mod ragged;
pub mod sequence;
mod timer;

#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use nereid_proto::{Parameters, ServiceError, Tensor};

use self::dynamic::{DynamicBatcher, DynamicFeed};
use self::engine::{Engine, EngineConfig};
use self::policy::BatchPolicy;
use self::sequence::{SequenceBatcher, SequenceFeed};
use crate::backend::{BackendError, BackendInstance, ModelResponse, RequestView};
use crate::config::SequenceStrategy;
use crate::rate_limit::InstanceLimit;
use crate::request_check::ValidRequest;
use crate::stats::VersionStats;

/// What a request gets back from its execution.
#[derive(Debug)]
pub struct JobResult {
    /// The outputs the request asked for, with the response parameters the model set.
    pub outputs: Result<ModelResponse, BackendError>,
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

/// Handle to a model version's scheduler. Cheap to share behind the version's `Arc`.
pub struct Scheduler {
    kind: Kind,
    instances: usize,
}

/// The engine, with the default scheduler / dynamic batcher or the sequence batcher.
enum Kind {
    Queue(Engine<DynamicBatcher>),
    Sequence(Engine<SequenceBatcher>),
}

impl Scheduler {
    /// Starts one thread per instance and the timer thread. `queue_capacity` bounds the
    /// requests waiting in the queue across all priority levels, on top of any
    /// `max_queue_size` of the config. `limits[i]`, when present, is what instance `i` must
    /// acquire from the rate limiter before each execution.
    pub fn start(
        model: &str,
        policy: BatchPolicy,
        instances: Vec<(String, Box<dyn BackendInstance>)>,
        limits: Vec<Option<InstanceLimit>>,
        stats: Arc<VersionStats>,
        queue_capacity: usize,
    ) -> Result<Scheduler, BackendError> {
        let count = instances.len();
        let ragged = policy.ragged.clone();
        let config = |timer, preserve_ordering| EngineConfig {
            model: model.to_string(),
            timer,
            preserve_ordering,
            stats,
            limits,
            ragged,
        };
        let kind = match policy.sequence.clone() {
            Some(sequence_policy) => {
                let batcher = SequenceBatcher::new(
                    model,
                    &sequence_policy,
                    policy.max_batch_size,
                    count,
                    queue_capacity,
                );
                // `oldest`'s preserve_ordering: answers in acceptance order across sequences.
                let preserve_ordering = matches!(
                    sequence_policy.batching.strategy,
                    SequenceStrategy::Oldest {
                        preserve_ordering: true,
                        ..
                    }
                );
                let feed = SequenceFeed::new(model, sequence_policy);
                Kind::Sequence(Engine::start(
                    config("seqtimer", preserve_ordering),
                    batcher,
                    feed,
                    instances,
                )?)
            }
            None => {
                let preserve_ordering = policy.batching.preserve_ordering;
                let batcher = DynamicBatcher::new(model, policy.clone(), queue_capacity);
                let feed = DynamicFeed::new(policy);
                Kind::Queue(Engine::start(
                    config("timer", preserve_ordering),
                    batcher,
                    feed,
                    instances,
                )?)
            }
        };
        Ok(Scheduler {
            kind,
            instances: count,
        })
    }

    /// Requests waiting in the queue (not yet handed to an instance).
    pub fn queue_depth(&self) -> usize {
        match &self.kind {
            Kind::Queue(engine) => engine.queue_depth(),
            Kind::Sequence(engine) => engine.queue_depth(),
        }
    }

    /// Queues a request and waits for its result. Dropping the future cancels the request if
    /// it has not been batched yet.
    pub async fn submit(&self, request: ValidRequest) -> Result<JobResult, ServiceError> {
        match &self.kind {
            Kind::Queue(engine) => engine.submit(request).await,
            Kind::Sequence(engine) => engine.submit(request).await,
        }
    }

    /// Answers every queued request UNAVAILABLE with `reason` (a version whose unload drain
    /// ran out of time); requests already executing run to the end. Returns how many.
    pub fn refuse_queued(&self, reason: &str) -> usize {
        let error = || ServiceError::unavailable(reason);
        match &self.kind {
            Kind::Queue(engine) => engine.refuse_queued(error),
            Kind::Sequence(engine) => engine.refuse_queued(error),
        }
    }

    /// Number of instance threads.
    pub fn instance_count(&self) -> usize {
        self.instances
    }
}

static NEXT_KEY: AtomicU64 = AtomicU64::new(1);

/// A fresh request key: unique within the server process.
fn next_key() -> u64 {
    NEXT_KEY.fetch_add(1, Ordering::Relaxed)
}

/// What a request-level backend sees of a request; `key` names it (the same in every run of
/// a rescheduled request).
pub(crate) fn request_view(request: &ValidRequest, key: u64) -> RequestView<'_> {
    let (correlation_id, flags) = match &request.sequence {
        Some(s) => (Some(&s.id), u32::from(s.start) | (u32::from(s.end) << 1)),
        None => (None, 0),
    };
    RequestView {
        key,
        id: &request.id,
        inputs: &request.inputs,
        outputs: &request.outputs,
        parameters: &request.parameters,
        correlation_id,
        flags,
        stream: request.stream.as_ref(),
    }
}

/// What a request-level backend sees of a dummy request that pads a batch (no id, no
/// correlation id, no flags; it asks for `outputs`).
pub(crate) fn padding_view<'a>(
    inputs: &'a [Tensor],
    outputs: &'a [String],
    parameters: &'a Parameters,
) -> RequestView<'a> {
    RequestView {
        key: next_key(),
        id: "",
        inputs,
        outputs,
        parameters,
        correlation_id: None,
        flags: 0,
        stream: None,
    }
}
