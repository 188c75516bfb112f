//! `ensemble_scheduling { max_inflight_requests: N }`: at most N requests in flight at each
//! step of an ensemble, across all the ensemble's concurrent requests (Triton's back-pressure
//! for pipelines whose early steps outrun the later ones). 0, the default, is unlimited.
//!
//! ```text
//! execute: step ready ─► StepLimits::acquire(step) (waits while N of that step run)
//!          ─► the step's request to its composing model ─► its answer consumed
//!          ─► the permit drops: the next waiting request of that step starts
//! ```
//!
//! One semaphore per step, shared by every request of the loaded ensemble version (the plan
//! owns it). Waiting never fails and never times out (as in Triton); the client's own timeout
//! and cancellation still apply, since a waiting request is dropped with its caller.

use std::fmt;
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The in-flight limit of every step of one ensemble version.
#[derive(Clone)]
pub struct StepLimits {
    /// `max_inflight_requests`; 0 = unlimited.
    max: u32,
    /// One per step while limited; empty when unlimited.
    steps: Vec<Arc<Semaphore>>,
}

/// A step's place among the in-flight requests of that step; dropping it frees the place.
pub type StepPermit = Option<OwnedSemaphorePermit>;

impl StepLimits {
    /// Limits for `steps` steps, each to `max` requests in flight (0 = unlimited).
    pub fn new(max: u32, steps: usize) -> StepLimits {
        let permits = usize::try_from(max).unwrap_or(usize::MAX);
        let steps = if max == 0 {
            Vec::new()
        } else {
            (0..steps)
                .map(|_| Arc::new(Semaphore::new(permits)))
                .collect()
        };
        StepLimits { max, steps }
    }

    /// No limit on any step.
    pub fn unlimited() -> StepLimits {
        StepLimits::new(0, 0)
    }

    /// `max_inflight_requests` (0 = unlimited).
    pub fn max(&self) -> u32 {
        self.max
    }

    /// Waits for a place for one more request of `step`; `None` when the step is unlimited.
    pub async fn acquire(&self, step: usize) -> StepPermit {
        let semaphore = self.steps.get(step)?.clone();
        // The semaphores are never closed, so acquiring only waits.
        semaphore.acquire_owned().await.ok()
    }

    /// Requests of `step` in flight now (0 when unlimited: nothing is counted).
    pub fn in_flight(&self, step: usize) -> usize {
        self.steps.get(step).map_or(0, |s| {
            usize::try_from(self.max)
                .unwrap_or(usize::MAX)
                .saturating_sub(s.available_permits())
        })
    }
}

impl fmt::Debug for StepLimits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StepLimits")
            .field("max_inflight_requests", &self.max)
            .finish()
    }
}

/// Two plans are alike when their limits are (the semaphores' state is not configuration).
impl PartialEq for StepLimits {
    fn eq(&self, other: &StepLimits) -> bool {
        self.max == other.max && self.steps.len() == other.steps.len()
    }
}

impl Eq for StepLimits {}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Poll};

    use futures::task::noop_waker_ref;

    use super::*;

    fn try_acquire(limits: &StepLimits, step: usize) -> Poll<StepPermit> {
        let mut cx = Context::from_waker(noop_waker_ref());
        pin!(limits.acquire(step)).as_mut().poll(&mut cx)
    }

    #[test]
    fn each_step_admits_at_most_max_and_a_drop_frees_a_place() {
        let limits = StepLimits::new(2, 2);
        let Poll::Ready(a) = try_acquire(&limits, 0) else {
            panic!("first place of step 0 refused")
        };
        let Poll::Ready(b) = try_acquire(&limits, 0) else {
            panic!("second place of step 0 refused")
        };
        assert!(a.is_some() && b.is_some());
        assert_eq!(limits.in_flight(0), 2);
        assert!(
            try_acquire(&limits, 0).is_pending(),
            "a third request of step 0 ran"
        );
        // Another step has places of its own.
        assert!(matches!(try_acquire(&limits, 1), Poll::Ready(Some(_))));
        drop(a);
        assert_eq!(limits.in_flight(0), 1);
        assert!(matches!(try_acquire(&limits, 0), Poll::Ready(Some(_))));
    }

    #[test]
    fn zero_is_unlimited_and_counts_nothing() {
        let limits = StepLimits::new(0, 3);
        let held: Vec<_> = (0..100).map(|_| try_acquire(&limits, 1)).collect();
        assert!(held.iter().all(|p| matches!(p, Poll::Ready(None))));
        assert_eq!(limits.in_flight(1), 0);
        assert_eq!(limits, StepLimits::unlimited());
        assert_eq!(limits.max(), 0);
    }

    #[test]
    fn clones_share_the_places() {
        let limits = StepLimits::new(1, 1);
        let other = limits.clone();
        let _held = try_acquire(&limits, 0);
        assert!(try_acquire(&other, 0).is_pending());
        assert_eq!(other.in_flight(0), 1);
    }
}
