//! Triton's sequence batcher (`sequence_batching`) as an engine [`Batcher`]: requests that
//! share a correlation id run one at a time, in order, with server-generated control inputs
//! and implicit state. The pure [`slots::Slots`] decides (slots, backlog, batches, idle
//! release); this adapter names its refusals and feeds the model controls and state.
//!
//! ```text
//! ticket (no lock): a correlation id the CORRID control can carry ─► admit: Slots::arrive
//! sweep:      Slots::release_idle (logged), Slots::retain (caller left)
//! form_batch: Slots::form_batch(instance) ─► each request with the state it runs on
//! instance:   Feed::executions: inputs + controls(flags) + state, grouped by signature
//!             ─► run (state outputs asked for too) ─► Feed::produced keeps the new state
//! finished:   rescheduled (iterative): Slots::requeue, then Slots::finish (END, or with
//!             `iterative_sequence` any request, with nothing queued releases the sequence)
//! ```
//!
//! `direct` batches are padded to their slots' positions with dummy requests (READY false:
//! [`Feed::padding`]); `oldest`'s `preserve_ordering` is the engine's.
//!
//! `iterative_sequence` is Triton's iterative sequencer: a request without a correlation id
//! gets one (and START) here, and a request ends its sequence when the model is done with it.
//! The model may instead reschedule it ([`Feed::reschedule`]): it is queued again behind its
//! sequence, in the same slot, with its id and neither START nor END, and runs again with the
//! sequence's state; the sequence ends once the model releases the request. A caller that
//! leaves ends the loop (the engine skips it). Differences from Triton: requests whose inputs
//! differ in names or shapes run as separate executions (Triton defers them to a later batch).

mod controls;
mod slots;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use nereid_proto::{CorrelationId, ServiceError, Tensor};

pub use self::controls::SequencePolicy;
use self::controls::id_text;
use self::slots::{Arrival, Refusal, Slots};
use super::engine::{Batcher, Done, Entry, Feed, Job, Padding, Refused};
use super::queue::{Decision, ShapeKey};
use crate::request_check::{SequenceFlags, ValidRequest};

/// What the sequence batcher keeps with a batched request.
pub(super) struct SequenceTag {
    flags: SequenceFlags,
    /// The state it runs on (`None`: the initial state), until its inputs are formed.
    state: Option<Vec<Tensor>>,
    /// The state it left (`None`: keep the old one).
    new_state: Option<Vec<Tensor>>,
    /// Its position in the batch (`direct`: its slot's).
    position: usize,
}

/// The live sequences of a `sequence_batching` version.
pub(super) struct SequenceBatcher {
    model: String,
    slots: Slots<Job, Vec<Tensor>>,
}

impl SequenceBatcher {
    /// Slots for `instances` instances; `queue_capacity` bounds the queued requests.
    pub(super) fn new(
        model: &str,
        policy: &SequencePolicy,
        max_batch_size: usize,
        instances: usize,
        queue_capacity: usize,
    ) -> SequenceBatcher {
        SequenceBatcher {
            model: model.to_string(),
            slots: Slots::new(
                policy.batching.strategy.clone(),
                max_batch_size,
                policy.batching.max_idle,
                instances,
                queue_capacity,
            )
            .iterative(policy.batching.iterative),
        }
    }
}

impl Batcher for SequenceBatcher {
    type Tag = SequenceTag;
    type Feed = SequenceFeed;

    fn queued(&self) -> usize {
        self.slots.queued()
    }

    fn admit(
        &mut self,
        mut job: Job,
        flags: SequenceFlags,
        now: Instant,
    ) -> Result<(), Box<Refused>> {
        // `iterative_sequence`: a request without an id runs as the sequence its ticket made.
        if job.request.sequence.is_none() {
            job.request.sequence = Some(flags.clone());
        }
        let m = &self.model;
        let id = id_text(&flags.id);
        match self.slots.arrive(flags, job, now) {
            Ok(Arrival::Queued) => Ok(()),
            Ok(Arrival::Restarted) => {
                tracing::warn!(
                    "sequence {id} for model '{m}' has a conflict. The previous sequence did not end before this sequence start. Previous sequence will be terminated early."
                );
                Ok(())
            }
            Err((job, Refusal::Full)) => Err(Box::new(Refused {
                job,
                error: ServiceError::Overloaded(format!(
                    "Exceeds maximum queue size: model '{m}' is full"
                )),
            })),
            Err((job, Refusal::MissingStart)) => Err(Box::new(Refused {
                job,
                error: ServiceError::invalid(format!(
                    "inference request for sequence {id} to model '{m}' must specify the START flag on the first request of the sequence"
                )),
            })),
        }
    }

    fn sweep(&mut self, now: Instant) -> Vec<(Job, ServiceError)> {
        for id in self.slots.release_idle(now) {
            tracing::info!(
                "sequence {} for model '{}' released after {} µs without a request",
                id_text(&id),
                self.model,
                self.slots.max_idle().as_micros()
            );
        }
        self.slots
            .retain(|job| !job.gone())
            .into_iter()
            .map(|job| (job, ServiceError::Cancelled("the client went away".into())))
            .collect()
    }

    fn take_queued(&mut self) -> Vec<Job> {
        self.slots.retain(|_| false)
    }

    fn form_batch(&mut self, instance: usize, now: Instant) -> Decision<Vec<Entry<SequenceTag>>> {
        match self.slots.form_batch(instance, now) {
            Decision::Dispatch(batch) => Decision::Dispatch(
                batch
                    .into_iter()
                    .map(|t| Entry {
                        job: t.payload,
                        tag: SequenceTag {
                            flags: t.flags,
                            state: t.state,
                            new_state: None,
                            position: t.position,
                        },
                    })
                    .collect(),
            ),
            Decision::WaitUntil(t) => Decision::WaitUntil(t),
            Decision::Empty => Decision::Empty,
        }
    }

    fn finished(&mut self, done: Vec<Done<SequenceTag>>, now: Instant) -> bool {
        let freed = !done.is_empty();
        for Done { tag, again } in done {
            // Queued first, so that finishing does not end the sequence.
            if let Some(job) = again {
                self.slots.requeue(tag.flags.clone(), job, now);
            }
            self.slots
                .finish(&tag.flags.id, tag.flags.end, tag.new_state, now);
        }
        freed
    }

    fn next_wake(&self) -> Option<Instant> {
        self.slots.next_wake()
    }

    fn per_instance(&self) -> bool {
        self.slots.per_instance()
    }
}

/// Feeds a sequence model its control inputs and state, and keeps the state it leaves.
pub(super) struct SequenceFeed {
    model: String,
    policy: SequencePolicy,
    /// The state outputs, asked of the model besides the requested outputs.
    state_outputs: Vec<String>,
    /// `iterative_sequence`: the id of the next request that comes without one.
    next_id: AtomicU64,
}

impl SequenceFeed {
    pub(super) fn new(model: &str, policy: SequencePolicy) -> SequenceFeed {
        SequenceFeed {
            model: model.to_string(),
            state_outputs: policy
                .batching
                .states
                .iter()
                .map(|s| s.output_name.clone())
                .collect(),
            policy,
            next_id: AtomicU64::new(1),
        }
    }
}

impl Feed for SequenceFeed {
    type Tag = SequenceTag;
    type Ticket = SequenceFlags;

    fn ticket(&self, request: &ValidRequest, _now: Instant) -> Result<SequenceFlags, ServiceError> {
        let m = &self.model;
        let Some(flags) = request.sequence.clone() else {
            if self.policy.batching.iterative {
                // Triton's iterative sequencer: a sequence of its own, started by this request.
                return Ok(SequenceFlags {
                    id: CorrelationId::Uint(self.next_id.fetch_add(1, Ordering::Relaxed)),
                    start: true,
                    end: false,
                });
            }
            return Err(ServiceError::invalid(format!(
                "inference request to model '{m}' must specify a non-zero or non-empty correlation ID"
            )));
        };
        self.policy.check_id(m, &flags.id)?;
        Ok(flags)
    }

    /// Each request's full input list (its inputs, controls and state, sorted by name so
    /// requests batch); requests with the same signature (ragged inputs' shapes left out) form
    /// one execution.
    fn executions(&self, batch: Vec<Entry<SequenceTag>>) -> Vec<Vec<Entry<SequenceTag>>> {
        let mut groups: Vec<(ShapeKey, Vec<Entry<SequenceTag>>)> = Vec::new();
        for mut entry in batch {
            let request = &mut entry.job.request;
            let mut inputs = std::mem::take(&mut request.inputs);
            inputs.extend(self.policy.control_inputs(&entry.tag.flags));
            match entry.tag.state.take() {
                Some(mut state) if !state.is_empty() => inputs.append(&mut state),
                _ => inputs.extend(self.policy.initial_states()),
            }
            inputs.sort_by(|a, b| a.name().cmp(b.name()));
            let key: ShapeKey = inputs
                .iter()
                .map(|t| {
                    let ragged = self.policy.ragged_inputs.iter().any(|r| r == t.name());
                    let dims = if ragged {
                        &[]
                    } else {
                        t.shape().get(1..).unwrap_or(&[])
                    };
                    (t.name().to_string(), t.datatype().as_wire(), dims.to_vec())
                })
                .collect();
            request.inputs = inputs;
            match groups.iter_mut().find(|(k, _)| *k == key) {
                Some((_, members)) => members.push(entry),
                None => groups.push((key, vec![entry])),
            }
        }
        groups.into_iter().map(|(_, members)| members).collect()
    }

    /// `direct` with batching: the batch spans the instance's slots up to the highest one in
    /// it, and the slots between without a request get a dummy (READY false), as in Triton.
    fn padding(&self, execution: &[Entry<SequenceTag>]) -> Option<Padding> {
        if !self.policy.pads() {
            return None;
        }
        let width = execution.iter().map(|e| e.tag.position + 1).max()?;
        if width == execution.len() {
            return None;
        }
        let mut layout = vec![None; width];
        for (k, e) in execution.iter().enumerate() {
            layout[e.tag.position] = Some(k);
        }
        let dummy = self.policy.padding_inputs(&execution[0].job.request.inputs);
        Some(Padding { layout, dummy })
    }

    fn extra_outputs(&self) -> &[String] {
        &self.state_outputs
    }

    /// `iterative_sequence` only: the request continues its sequence, as Triton's iterative
    /// sequencer queues it again (neither START nor END); the controls and state `executions`
    /// added are taken out, to be made anew for its next run.
    fn reschedule(&self, tag: &mut SequenceTag, request: &mut ValidRequest) -> bool {
        if !self.policy.batching.iterative {
            return false;
        }
        tag.flags.start = false;
        tag.flags.end = false;
        tag.state = None;
        request.inputs.retain(|t| !self.policy.generates(t.name()));
        request.sequence = Some(tag.flags.clone());
        true
    }

    fn produced(&self, tag: &mut SequenceTag, outputs: Option<(&[String], &[Tensor])>) {
        tag.new_state = outputs.and_then(|(names, produced)| {
            self.policy
                .batching
                .states
                .iter()
                .map(|s| {
                    let k = names.iter().position(|n| *n == s.output_name)?;
                    produced
                        .get(k)
                        .map(|t| t.clone().renamed(s.input_name.clone()))
                })
                .collect()
        });
    }
}
