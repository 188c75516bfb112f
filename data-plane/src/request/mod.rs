//! The one request path of a model version: every inference, a client's or an ensemble step's,
//! unary or streamed, goes through here once the data plane has found the version.
//!
//! ```text
//! LoadedVersion::infer(InferRequest)            LoadedVersion::infer_stream (decoupled only)
//!   Outcome::start (in flight; one outcome)       Outcome::start
//!   request_check::check ─► ValidRequest          request_check::check ─► ValidRequest
//!   response cache lookup (hit: answer now)       stream::run (responses as they come), or
//!                                                 stream::run_ensemble for a decoupled
//!                                                 ensemble (ensemble::execute_stream)
//!   ┄┄ cross-cutting steps go here ┄┄
//!   LoadedVersion::run(ValidRequest) ─ match runner:
//!     Batched(scheduler)  ─► submit ─► queue, batch, instance ─► outputs
//!     Decoupled(_)        ─► refused (UNSUPPORTED): only the streaming path serves it
//!                            (so is an ensemble with a decoupled step)
//!     Ensemble(plan)      ─► ensemble::execute, each step back through `RunContext::step`
//!   ─► classification::apply ─► response cache insert (on a miss) ─► InferResponse
//!      (outputs + the response parameters the model set; an ensemble's carry none)
//! ```
//!
//! The outcome (statistics, failure class) is recorded in one place, [`outcome::Outcome`].
//! A step that every request needs before it runs (the response cache lookup, reading inputs
//! from shared memory) goes between the check and [`LoadedVersion::run`], where the request is
//! already valid and no runner has seen it. After `run`, the classification extension
//! ([`crate::classification`]) turns outputs asked for with `classification: k` into their top k
//! classes, and a cache miss stores the final answer ([`cache`]).
//!
//! [`LoadedVersion`] and its [`Runner`] are defined here too (`version.rs`), beside the path
//! that runs them: the manager builds versions and hands them out, this module serves them, and
//! it needs nothing from the manager (an ensemble asks [`RunContext::unavailable`]).

pub(crate) mod cache;
pub(crate) mod outcome;
mod stream;
mod version;

pub(crate) use stream::single;
pub use version::{LoadedVersion, Runner, next_generation};

use std::sync::Arc;
use std::time::Instant;

use futures::future::BoxFuture;
use nereid_proto::{
    InferRequest, InferResponse, ParamValue, ResponseStream, ServiceError, ServiceResult,
};
use nereid_telemetry::RequestTrace;

use self::cache::CacheKey;
use self::outcome::{Outcome, backend_error, record_phases};
use crate::backend::{ModelResponse, TRACE_PARAMETER};
use crate::classification;
use crate::ensemble::{self, EnsembleRequest};
use crate::request_check::{self, ValidRequest};
use crate::stats::FailureReason;

/// How an ensemble step reaches its composing model: the data plane's own infer path, so a
/// step is found, checked, queued and batched like any client request of that model.
pub(crate) type StepFn<'a> =
    dyn Fn(InferRequest) -> BoxFuture<'a, ServiceResult<InferResponse>> + Send + Sync + 'a;

/// What a request needs from the server around it.
pub(crate) struct RunContext<'a> {
    /// For an ensemble: why it cannot run now (a composing model that is not loaded), as the
    /// manager, which knows the other models, says (`ModelManager::unavailable`).
    pub unavailable: &'a (dyn Fn(&LoadedVersion) -> Option<String> + Sync + 'a),
    /// For an ensemble: how its steps run.
    pub step: &'a StepFn<'a>,
    /// The request's trace, when it is sampled.
    pub trace: Option<&'a mut RequestTrace>,
}

/// What a streamed request needs from the server around it (a decoupled ensemble's steps).
pub(crate) struct StreamContext<'a> {
    /// As [`RunContext::unavailable`].
    pub unavailable: &'a (dyn Fn(&LoadedVersion) -> Option<String> + Sync + 'a),
    /// How a decoupled ensemble's steps run: each a response stream, owned by the ensemble's
    /// own stream.
    pub step: ensemble::StepStream,
    /// The request's trace, when it is sampled (a decoupled model's or decoupled ensemble's).
    pub trace: Option<RequestTrace>,
}

impl LoadedVersion {
    /// Runs `request` (which arrived at `started`) on this version and answers it.
    pub(crate) async fn infer(
        self: &Arc<Self>,
        request: InferRequest,
        started: Instant,
        ctx: RunContext<'_>,
    ) -> ServiceResult<InferResponse> {
        let mut outcome = Outcome::start(self.clone(), started);
        if self.streams() {
            // Counted nowhere: Triton refuses these in its frontends, before the model.
            let frontend = request.context.frontend;
            return Err(outcome.refused_unchecked(stream::refuse_unary(self, frontend)));
        }
        let mut valid = request_check::check(&self.config, request)
            .map_err(|e| outcome.refused_unchecked(e))?;
        let id = valid.id.clone();
        let classify = std::mem::take(&mut valid.classify);
        // The response cache: a hit skips the queue and the backend.
        let miss = match &self.cache {
            Some(cache) => {
                let lookup_started = Instant::now();
                let key =
                    CacheKey::of(&self.name, self.version, self.generation, &valid, &classify);
                let found = cache.lookup(&key);
                let lookup = lookup_started.elapsed();
                cache.record_lookup_time(lookup);
                if let Some(answer) = found {
                    outcome.cache_hit(lookup);
                    return Ok(self.response(id, answer.as_ref().clone()));
                }
                Some((cache, key, lookup))
            }
            None => None,
        };
        let answer = self.run(valid, &id, &mut outcome, ctx).await?;
        let answer = ModelResponse {
            tensors: classification::apply(
                answer.tensors,
                &classify,
                &self.labels,
                self.config.batching(),
            )?,
            parameters: answer.parameters,
        };
        if let Some((cache, key, lookup)) = miss {
            let insert_started = Instant::now();
            cache.insert(key, answer.clone());
            let insertion = insert_started.elapsed();
            cache.record_insertion_time(insertion);
            self.stats.record_cache_miss(lookup + insertion);
        }
        Ok(self.response(id, answer))
    }

    /// Whether this version answers through a response stream (a decoupled model, or an
    /// ensemble with a decoupled step); every other version answers once, through
    /// [`LoadedVersion::infer`].
    pub(crate) fn streams(&self) -> bool {
        match &self.runner {
            Runner::Decoupled(_) => true,
            Runner::Ensemble(plan) => plan.decoupled(),
            Runner::Batched(_) => false,
        }
    }

    /// Runs `request` on a decoupled version and streams its responses as the model (or the
    /// decoupled ensemble) sends them. Any other version is refused: its callers take
    /// [`LoadedVersion::infer`].
    pub(crate) fn infer_stream(
        self: &Arc<Self>,
        request: InferRequest,
        started: Instant,
        ctx: StreamContext<'_>,
    ) -> ServiceResult<ResponseStream> {
        match &self.runner {
            Runner::Ensemble(plan) if plan.decoupled() => {
                stream::run_ensemble(self.clone(), plan.clone(), request, started, ctx)
            }
            Runner::Ensemble(_) | Runner::Batched(_) | Runner::Decoupled(_) => {
                stream::run(self.clone(), request, started, ctx.trace)
            }
        }
    }

    /// Runs a checked request (whose id is `id`) on whatever serves this version; failures are
    /// counted on `outcome`, success too. An ensemble's answer carries no response parameters
    /// (its composing models' are not passed on).
    async fn run(
        &self,
        request: ValidRequest,
        id: &str,
        outcome: &mut Outcome,
        ctx: RunContext<'_>,
    ) -> ServiceResult<ModelResponse> {
        match &self.runner {
            Runner::Batched(scheduler) => {
                let mut request = request;
                if let Some(trace) = ctx.trace.as_deref() {
                    let traceparent = trace.context().traceparent().to_string();
                    request
                        .parameters
                        .insert(TRACE_PARAMETER.into(), ParamValue::String(traceparent));
                }
                let submitted = Instant::now();
                let result = scheduler
                    .submit(request)
                    .await
                    .map_err(|e| outcome.refused(e))?;
                if let Some(trace) = ctx.trace {
                    record_phases(trace, submitted, &result.timings);
                }
                let outputs = result.outputs.map_err(|e| {
                    outcome.failed(FailureReason::Backend, backend_error(&self.name, id, e))
                })?;
                outcome.succeeded(result.timings);
                Ok(outputs)
            }
            Runner::Decoupled(_) => {
                Err(outcome.failed(FailureReason::Other, stream::refuse_unary(self, None)))
            }
            Runner::Ensemble(plan) => {
                if let Some(reason) = (ctx.unavailable)(self) {
                    let e = ServiceError::unavailable(format!(
                        "ensemble '{}' is not available: {reason}",
                        self.name
                    ));
                    return Err(outcome.failed(FailureReason::Other, e));
                }
                let batch_size = request.batch_size;
                let request = EnsembleRequest {
                    id: request.id,
                    options: request.options,
                    parameters: request.parameters,
                    inputs: request.inputs,
                    outputs: request.outputs,
                };
                let mut trace = ctx.trace;
                if let Some(trace) = trace.as_deref_mut() {
                    trace.phase("receive", trace.start_instant(), Instant::now());
                }
                // Each step is a child trace of the ensemble's span.
                let parent = trace.as_deref().map(|t| t.context());
                let step = |mut r: InferRequest| {
                    if let Some(parent) = &parent {
                        r.context.trace = Some(parent.clone());
                    }
                    (ctx.step)(r)
                };
                let outputs = ensemble::execute(plan, request, step)
                    .await
                    .map_err(|e| outcome.refused(e))?;
                outcome.ensemble_succeeded(batch_size);
                Ok(outputs.into())
            }
        }
    }

    /// This version's answer carrying `answer`'s outputs and response parameters.
    pub(crate) fn response(&self, id: String, answer: ModelResponse) -> InferResponse {
        InferResponse {
            model_name: self.name.clone(),
            model_version: self.version.to_string(),
            id,
            parameters: answer.parameters,
            outputs: answer.tensors,
        }
    }
}
