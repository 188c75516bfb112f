//! How a request ends, counted once: the statistics of a model version and the mapping of
//! backend failures to the service's error classes.
//!
//! ```text
//! Outcome::start ── in flight +1
//!   ├─ refused_unchecked      ── nothing (input checks)    ┐
//!   ├─ failed(reason, error)  ── fail count, duration      │
//!   ├─ succeeded(timings)     ── success, phase durations  ├─ in flight -1 on drop
//!   ├─ cache_hit(lookup)      ── success, cache hit        │
//!   └─ dropped unresolved     ── counted as CANCELED       ┘
//! ```
//!
//! Every request that reaches a model version goes through one [`Outcome`], whichever runner
//! serves it (scheduler, ensemble, decoupled stream). Nothing else writes request outcomes.

use std::sync::Arc;
use std::time::Instant;

use nereid_proto::ServiceError;
use nereid_telemetry::RequestTrace;

use super::LoadedVersion;
use crate::backend::BackendError;
use crate::scheduler::ExecTimings;
use crate::stats::{FailureReason, RequestTimings};

/// Records exactly one outcome per request that reached a model version: an explicit failure,
/// a success, or, if dropped first, a cancellation. Counts the request as in flight meanwhile.
pub(crate) struct Outcome {
    loaded: Arc<LoadedVersion>,
    started: Instant,
    recorded: bool,
}

impl Outcome {
    /// A request for `loaded` that arrived at `started`.
    pub(crate) fn start(loaded: Arc<LoadedVersion>, started: Instant) -> Outcome {
        loaded.stats.request_started();
        Outcome {
            loaded,
            started,
            recorded: false,
        }
    }

    pub(crate) fn loaded(&self) -> &Arc<LoadedVersion> {
        &self.loaded
    }

    /// Counts a failure of class `reason` and hands `error` back.
    pub(crate) fn failed(&mut self, reason: FailureReason, error: ServiceError) -> ServiceError {
        self.recorded = true;
        self.loaded
            .stats
            .record_failure(self.started.elapsed(), reason);
        error
    }

    /// A request the input checks refused: counted nowhere (neither the statistics' `fail` nor
    /// `nv_inference_request_failure`), as Triton does; only the in-flight count saw it.
    pub(crate) fn refused_unchecked(&mut self, error: ServiceError) -> ServiceError {
        self.recorded = true;
        error
    }

    /// Counts a failure classified by its error (see [`failure_reason`]).
    pub(crate) fn refused(&mut self, error: ServiceError) -> ServiceError {
        let reason = failure_reason(&error);
        self.failed(reason, error)
    }

    /// Counts a request the model's instances ran to completion, with where its time went.
    pub(crate) fn succeeded(&mut self, t: ExecTimings) {
        self.recorded = true;
        self.loaded.stats.record_success(RequestTimings {
            total: self.started.elapsed(),
            queue: t.queue,
            compute_input: t.compute_input,
            compute_infer: t.compute_infer,
            compute_output: t.compute_output,
        });
    }

    /// Counts a request answered from the response cache (`lookup`: the time the lookup took).
    pub(crate) fn cache_hit(&mut self, lookup: std::time::Duration) {
        self.recorded = true;
        self.loaded
            .stats
            .record_cache_hit(self.started.elapsed(), lookup);
    }

    /// Counts an ensemble request that finished (its steps count on their own models).
    pub(crate) fn ensemble_succeeded(&mut self, batch_size: usize) {
        self.recorded = true;
        self.loaded
            .stats
            .record_ensemble_success(batch_size, self.started.elapsed());
    }
}

impl Drop for Outcome {
    fn drop(&mut self) {
        self.loaded.stats.request_finished();
        if !self.recorded {
            self.loaded
                .stats
                .record_failure(self.started.elapsed(), FailureReason::Canceled);
        }
    }
}

/// The statistics class of a request the scheduler refused or lost.
pub(crate) fn failure_reason(error: &ServiceError) -> FailureReason {
    match error {
        ServiceError::Overloaded(_) => FailureReason::Rejected,
        ServiceError::Cancelled(_) => FailureReason::Canceled,
        _ => FailureReason::Other,
    }
}

/// A backend's failure as the client sees it, with Triton's `[request id: ...]` prefix.
pub(crate) fn backend_error(model: &str, id: &str, e: BackendError) -> ServiceError {
    let id = if id.is_empty() { "<id_unknown>" } else { id };
    let prefix = format!("[request id: {id}] ");
    match e {
        BackendError::InvalidInput(m) => ServiceError::invalid(format!("{prefix}{m}")),
        BackendError::Unsupported(m) => ServiceError::unsupported(format!("{prefix}{m}")),
        BackendError::Execution(m) | BackendError::Load(m) => {
            ServiceError::internal(format!("{prefix}model '{model}' failed to execute: {m}"))
        }
    }
}

/// The request's phases as child spans: `receive` up to the scheduler, then the scheduler's
/// own measurements laid end to end from the submission.
pub(crate) fn record_phases(trace: &mut RequestTrace, submitted: Instant, t: &ExecTimings) {
    trace.phase("receive", trace.start_instant(), submitted);
    let mut at = submitted;
    for (name, took) in [
        ("queue", t.queue),
        ("compute_input", t.compute_input),
        ("compute_infer", t.compute_infer),
        ("compute_output", t.compute_output),
    ] {
        trace.phase(name, at, at + took);
        at += took;
    }
}
