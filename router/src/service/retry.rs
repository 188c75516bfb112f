//! Retries and hedging of the router's calls to workers.
//!
//! ```text
//! pick (or activate) a replica ─► attempt
//!   ended with an error that says it did not run (and safe to repeat) ─► once more elsewhere
//!   stalled (replica left the ready set, or past the attempt timeout; safe to repeat only)
//!     ─► the same request on another replica too; the first answer wins, the other is dropped
//! unreachable replica ─► ejected for a while (passive outlier ejection)
//! ```

use std::collections::HashSet;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures::future::Either;

use super::{InFlight, RouterService};
use crate::choice::Ask;
use crate::error::{RouterError, RouterResult};
use crate::table::Endpoint;

/// The attempt timeout of hedging: four times the model's observed p99 through this router,
/// within `[floor, ceiling]`; `ceiling` until enough requests were seen.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HedgeConfig {
    /// The shortest attempt timeout, however fast the model is (default 1 s).
    pub floor: Duration,
    /// The longest attempt timeout, and the one used before enough requests were seen
    /// (default 30 s).
    pub ceiling: Duration,
}

impl Default for HedgeConfig {
    fn default() -> Self {
        HedgeConfig {
            floor: Duration::from_secs(1),
            ceiling: Duration::from_secs(30),
        }
    }
}

/// Requests seen before a model's observed p99 sets its attempt timeout.
const HEDGE_MIN_OBSERVATIONS: u64 = 100;
/// The attempt timeout in units of the observed p99.
const HEDGE_P99_FACTOR: u32 = 4;

impl RouterService {
    /// Runs `call` on a chosen replica; with `retry` (the request is safe to repeat), once more
    /// on another replica when the first attempt failed before running, and hedged: when the
    /// first attempt stalls ([`Self::stalled`]) the request also goes to another replica, and
    /// whichever answers first wins (the other attempt is dropped, which cancels it).
    pub(crate) async fn with_retry<T, F, Fut>(
        &self,
        ask: &Ask<'_>,
        retry: bool,
        deadline: Option<Instant>,
        call: F,
    ) -> RouterResult<T>
    where
        F: Fn(Endpoint) -> Fut,
        Fut: Future<Output = RouterResult<T>>,
    {
        let attempt = |target: Endpoint, guard: InFlight| {
            let call = call(target);
            async move {
                let result = call.await;
                drop(guard);
                result
            }
        };
        if !retry {
            return self.with_retry_guarded(ask, false, deadline, attempt).await;
        }
        let (endpoint, guard) = self.pick_or_activate(ask, deadline).await?;
        let first = attempt(endpoint.clone(), guard);
        tokio::pin!(first);
        tokio::select! {
            biased;
            result = &mut first => {
                return self
                    .retry_on_failure(ask, true, deadline, &endpoint, result, attempt)
                    .await;
            }
            () = self.stalled(ask, &endpoint, deadline) => {}
        }
        let exclude = HashSet::from([endpoint.replica]);
        let Ok((other, guard)) = self.pick(ask, &exclude) else {
            // No replica to hedge on (the stalled one was the model's only one, e.g. evicted
            // by the model cache): its answer, or the retry an error that did not run allows.
            let result = first.await;
            return self
                .retry_on_failure(ask, true, deadline, &endpoint, result, attempt)
                .await;
        };
        tracing::info!(
            model = ask.model,
            stalled = endpoint.replica,
            hedge = other.replica,
            "an attempt stalled; sending the request to another replica too"
        );
        self.counters(ask.model)
            .hedges
            .fetch_add(1, Ordering::Relaxed);
        let second = attempt(other.clone(), guard);
        tokio::pin!(second);
        let (result, from, rest, rest_from) = tokio::select! {
            r = &mut first => (r, &endpoint, Either::Left(second.as_mut()), &other),
            r = &mut second => (r, &other, Either::Right(first.as_mut()), &endpoint),
        };
        match result {
            Ok(answer) => Ok(answer),
            Err(e) => {
                self.note_failure(from, &e);
                let result = rest.await;
                if let Err(e) = &result {
                    self.note_failure(rest_from, e);
                }
                result
            }
        }
    }

    /// After an attempt ended (not stalled): its answer, or its error, or (with `retry`, when
    /// the error says the request did not run) one more attempt on another replica.
    async fn retry_on_failure<T, A, Fut>(
        &self,
        ask: &Ask<'_>,
        retry: bool,
        deadline: Option<Instant>,
        endpoint: &Endpoint,
        result: RouterResult<T>,
        attempt: A,
    ) -> RouterResult<T>
    where
        A: Fn(Endpoint, InFlight) -> Fut,
        Fut: Future<Output = RouterResult<T>>,
    {
        let err = match result {
            Err(e) => e,
            done => return done,
        };
        self.note_failure(endpoint, &err);
        if !(retry && err.retryable()) || deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(err);
        }
        tracing::debug!(replica = endpoint.replica, addr = %endpoint.addr, error = %err, "retrying on another replica");
        let exclude = HashSet::from([endpoint.replica]);
        let picked = match self.pick(ask, &exclude) {
            Err(RouterError::NoReadyReplica { .. }) => {
                Box::pin(self.reactivate(ask, deadline, endpoint)).await
            }
            other => other,
        };
        let Ok((endpoint, guard)) = picked else {
            return Err(err);
        };
        self.counters(ask.model)
            .retries
            .fetch_add(1, Ordering::Relaxed);
        let second = attempt(endpoint.clone(), guard).await;
        if let Err(e) = &second {
            self.note_failure(&endpoint, e);
        }
        second
    }

    /// The retry of a request whose only replica went away under it (the model cache evicted
    /// it, or its node left, and the worker unloaded it before this router's table said so): a
    /// model that requests may start is activated again and waited for, as a request that
    /// found no replica is ([`Self::pick_or_activate`]), and the request goes to a replica
    /// other than `failed`. Any other model: no replica.
    async fn reactivate(
        &self,
        ask: &Ask<'_>,
        deadline: Option<Instant>,
        failed: &Endpoint,
    ) -> RouterResult<(Endpoint, InFlight)> {
        let exclude = HashSet::from([failed.replica]);
        let activator = match self.activator_for(ask.model) {
            Some(a) if ask.sequence.is_none() || ask.start => a,
            _ => return self.pick(ask, &exclude),
        };
        self.counters(ask.model)
            .scale_from_zero
            .fetch_add(1, Ordering::Relaxed);
        activator.scale_from_zero(ask.model, deadline).await?;
        // The activation may have returned on the stale entry of `failed`: wait (within the
        // activation's bound) for a ready replica other than it.
        let (model, version) = (ask.model, failed.version);
        let limit = deadline.map_or(activator.wait(), |d| {
            d.saturating_duration_since(Instant::now())
                .min(activator.wait())
        });
        self.table
            .wait_until(limit, |t| {
                t.ready(model, version)
                    .iter()
                    .any(|e| e.replica != failed.replica)
            })
            .await;
        self.pick(ask, &exclude)
    }

    /// Resolves when an attempt on `endpoint` should be hedged: its replica left the routing
    /// table's ready set (the control plane marked its node down), or the attempt has run for
    /// the model's attempt timeout. Never, once the request's deadline is too near for another
    /// attempt to help.
    async fn stalled(&self, ask: &Ask<'_>, endpoint: &Endpoint, deadline: Option<Instant>) {
        let mut limit = self.attempt_timeout(ask.model);
        if let Some(deadline) = deadline {
            limit = limit.min(deadline.saturating_duration_since(Instant::now()));
        }
        let (model, version, replica) = (ask.model, endpoint.version, endpoint.replica);
        self.table
            .wait_until(limit, |t| {
                !t.ready(model, version).iter().any(|e| e.replica == replica)
            })
            .await;
        if deadline.is_some_and(|d| Instant::now() >= d) {
            std::future::pending::<()>().await;
        }
    }

    /// How long an attempt may run before it is hedged (see [`HedgeConfig`]).
    fn attempt_timeout(&self, model: &str) -> Duration {
        let hedge = self.config.hedge;
        match self
            .counters(model)
            .duration
            .quantile_bound(0.99, HEDGE_MIN_OBSERVATIONS)
        {
            // max then min, not clamp: a floor set above the ceiling must not panic.
            Some(p99) => (p99 * HEDGE_P99_FACTOR).max(hedge.floor).min(hedge.ceiling),
            None => hedge.ceiling,
        }
    }

    /// [`Self::with_retry`] without hedging, handing `call` the in-flight guard to hold for as
    /// long as the answer lasts (a stream).
    pub(super) async fn with_retry_guarded<T, F, Fut>(
        &self,
        ask: &Ask<'_>,
        retry: bool,
        deadline: Option<Instant>,
        call: F,
    ) -> RouterResult<T>
    where
        F: Fn(Endpoint, InFlight) -> Fut,
        Fut: Future<Output = RouterResult<T>>,
    {
        let (endpoint, guard) = self.pick_or_activate(ask, deadline).await?;
        let result = call(endpoint.clone(), guard).await;
        self.retry_on_failure(ask, retry, deadline, &endpoint, result, call)
            .await
    }

    /// Ejects a replica that could not be reached.
    pub(super) fn note_failure(&self, endpoint: &Endpoint, err: &RouterError) {
        if matches!(err, RouterError::Unreachable { .. }) {
            let replica = endpoint.replica;
            self.metrics.ejected(&endpoint.node);
            tracing::info!(replica, error = %err, "ejecting an unreachable replica for a while");
            let mut r = self.routing.lock().unwrap_or_else(|p| p.into_inner());
            r.chooser
                .eject(replica, Instant::now() + self.config.ejection);
        }
    }
}
