//! The default scheduler and the dynamic batcher as an engine [`Batcher`]: the pure
//! [`RequestQueue`] decides, this adapter files requests into it (priority level, shape, queue
//! timeout) and names the errors of refused, expired and cancelled requests.
//!
//! ```text
//! ticket (no lock): level, shape key, deadline ─► admit: RequestQueue::push | Overloaded
//! sweep:      retain (caller left: Cancelled), expire (REJECT: Overloaded, DELAY: to the back)
//! form_batch: RequestQueue::form_batch (the same for every instance)
//! ```

use std::time::Instant;

use nereid_proto::{ServiceError, Tensor};

use super::engine::{Batcher, Done, Entry, Feed, Job, Refused};
use super::policy::BatchPolicy;
use super::queue::{Decision, Pending, RequestQueue, ShapeKey};
use crate::config::TimeoutAction;
use crate::request_check::ValidRequest;

/// The queue of a version without `sequence_batching`.
pub(super) struct DynamicBatcher {
    model: String,
    policy: BatchPolicy,
    queue: RequestQueue<Job>,
}

impl DynamicBatcher {
    /// `queue_capacity` bounds the requests waiting across all priority levels, on top of any
    /// `max_queue_size` of the config.
    pub(super) fn new(model: &str, policy: BatchPolicy, queue_capacity: usize) -> DynamicBatcher {
        DynamicBatcher {
            model: model.to_string(),
            queue: RequestQueue::with_capacity(&policy, queue_capacity),
            policy,
        }
    }
}

/// Where a request goes in the queue, worked out before the lock is taken.
pub(super) struct Filing {
    level: usize,
    shape: ShapeKey,
    deadline: Option<Instant>,
    timeout_action: TimeoutAction,
}

impl Batcher for DynamicBatcher {
    type Tag = ();
    type Feed = DynamicFeed;

    fn queued(&self) -> usize {
        self.queue.len()
    }

    fn admit(&mut self, job: Job, filing: Filing, now: Instant) -> Result<(), Box<Refused>> {
        let pending = Pending {
            batch_size: job.request.batch_size,
            shape: filing.shape,
            arrived: now,
            deadline: filing.deadline,
            timeout_action: filing.timeout_action,
            payload: job,
        };
        self.queue.push(filing.level, pending).map_err(|rejected| {
            let error = ServiceError::Overloaded(format!(
                "Exceeds maximum queue size: model '{}' priority level {} is full",
                self.model,
                filing.level + 1
            ));
            Box::new(Refused {
                job: rejected.payload,
                error,
            })
        })
    }

    fn sweep(&mut self, now: Instant) -> Vec<(Job, ServiceError)> {
        let gone = self.queue.retain(|job| !job.gone());
        let expired = self.queue.expire(now);
        let cancelled = || ServiceError::Cancelled("the client went away".into());
        let timed_out = || {
            ServiceError::Overloaded(format!(
                "Request timeout expired: model '{}' did not start the request within its queue timeout",
                self.model
            ))
        };
        gone.into_iter()
            .map(|p| (p.payload, cancelled()))
            .chain(expired.into_iter().map(|p| (p.payload, timed_out())))
            .collect()
    }

    fn take_queued(&mut self) -> Vec<Job> {
        self.queue
            .retain(|_| false)
            .into_iter()
            .map(|p| p.payload)
            .collect()
    }

    fn form_batch(&mut self, _instance: usize, now: Instant) -> Decision<Vec<Entry<()>>> {
        match self.queue.form_batch(now, &self.policy) {
            Decision::Dispatch(batch) => Decision::Dispatch(
                batch
                    .into_iter()
                    .map(|p| Entry {
                        job: p.payload,
                        tag: (),
                    })
                    .collect(),
            ),
            Decision::WaitUntil(t) => Decision::WaitUntil(t),
            Decision::Empty => Decision::Empty,
        }
    }

    /// Nothing to do: requests hold nothing here once batched, and none comes back (the
    /// feed takes no rescheduled request).
    fn finished(&mut self, _done: Vec<Done<()>>, _now: Instant) -> bool {
        false
    }

    fn next_wake(&self) -> Option<Instant> {
        self.queue.next_deadline()
    }

    fn per_instance(&self) -> bool {
        false
    }
}

/// Files requests by level, shape and timeout; batches run as the queue formed them.
pub(super) struct DynamicFeed {
    policy: BatchPolicy,
}

impl DynamicFeed {
    pub(super) fn new(policy: BatchPolicy) -> DynamicFeed {
        DynamicFeed { policy }
    }
}

impl Feed for DynamicFeed {
    type Tag = ();
    type Ticket = Filing;

    fn ticket(&self, request: &ValidRequest, now: Instant) -> Result<Filing, ServiceError> {
        let policy = &self.policy;
        let level = policy.level_index(request.options.priority);
        let policies = &policy.batching.queue_policies;
        let queue_policy = &policies[level.min(policies.len() - 1)];
        Ok(Filing {
            level,
            shape: shape_key(&request.inputs, policy.max_batch_size > 0, |name| {
                policy.ragged.is_ragged(name)
            }),
            deadline: queue_policy
                .timeout_for(request.options.timeout_us)
                .map(|t| now + t),
            timeout_action: queue_policy.timeout_action,
        })
    }

    fn executions(&self, batch: Vec<Entry<()>>) -> Vec<Vec<Entry<()>>> {
        vec![batch]
    }

    fn extra_outputs(&self) -> &[String] {
        &[]
    }

    fn produced(&self, _tag: &mut (), _outputs: Option<(&[String], &[Tensor])>) {}
}

/// What must be equal for two requests to share a batch: the inputs' names, datatypes and
/// shapes past the batch dimension, except the shapes of ragged inputs (`allow_ragged_batch`),
/// which a batch concatenates whatever they are.
fn shape_key(inputs: &[Tensor], batching: bool, ragged: impl Fn(&str) -> bool) -> ShapeKey {
    inputs
        .iter()
        .map(|t| {
            let dims = if ragged(t.name()) {
                &[]
            } else if batching {
                t.shape().get(1..).unwrap_or(&[])
            } else {
                t.shape()
            };
            (t.name().to_string(), t.datatype().as_wire(), dims.to_vec())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use nereid_test_support::fp32_zeros;

    use super::*;

    #[test]
    fn ragged_inputs_leave_their_shapes_out_of_the_key() {
        let short = [fp32_zeros("r", vec![1, 3]), fp32_zeros("x", vec![1, 2])];
        let long = [fp32_zeros("r", vec![1, 5]), fp32_zeros("x", vec![1, 2])];
        let other = [fp32_zeros("r", vec![1, 5]), fp32_zeros("x", vec![1, 4])];
        let key = |inputs: &[Tensor], ragged: bool| shape_key(inputs, true, |n| ragged && n == "r");
        assert_ne!(key(&short, false), key(&long, false));
        assert_eq!(key(&short, true), key(&long, true));
        assert_ne!(
            key(&long, true),
            key(&other, true),
            "other inputs still must agree"
        );
    }
}
