//! The sequence batcher's decisions — pure logic, no threads, no clocks: which sequences hold
//! slots, which requests form the next batch of an instance, which sequences are released.
//! Every event takes `now` as an argument, so the decisions are tested with made-up instants.
//!
//! ```text
//! event                                   decision
//! arrive(flags, request, now)         ─► queued behind its sequence (a free slot, else the backlog)
//!                                        | refused: Full, MissingStart
//! requeue(flags, request, now)        ─► a rescheduled request queued behind its sequence again
//! form_batch(instance, now)           ─► Dispatch(the next request of each ready sequence the
//!                                        instance may run, with its slot position)
//!                                        | WaitUntil(oldest + delay) | Empty
//! finish(id, end, new state, now)     ─► the sequence is ready again; END with nothing queued
//!                                        releases it, and the backlog's oldest takes its slot
//! release_idle(now)                   ─► the sequences idle for max_sequence_idle, released
//! next_wake()                         ─► when the next idle sequence must be released
//! ```
//!
//! Sequences hold *slots*: with `direct` a slot is one batch position of one instance
//! (`max(1, max_batch_size)` per instance), so a sequence always runs on the same instance;
//! with `oldest` there are `max_candidate_sequences` slots on no particular instance (0: as many
//! as `direct` would have). A live sequence without a slot waits in the backlog, in order.
//!
//! `direct` waits, as Triton does, when both its `max_queue_delay_microseconds` and its
//! `minimum_slot_utilization` are set: an instance's batch runs once the fraction of its slots
//! with a ready request reaches the utilization, or once its oldest ready request has waited
//! the delay. Each request taken carries its slot's position in the instance's batch, so the
//! engine can pad the positions between with dummy requests (READY false).
//! A batch holds at most one request per sequence, and a sequence's next request is formed only
//! after the previous one finished, so its state is always the previous request's output.
//!
//! `T` is the queued request (the engine's job), `S` a sequence's state (its state tensors).

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use nereid_proto::CorrelationId;

use crate::config::SequenceStrategy;
use crate::request_check::SequenceFlags;
use crate::scheduler::queue::Decision;

/// Why [`Slots::arrive`] refused a request.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The queue holds `capacity` requests already.
    Full,
    /// The sequence is not live (never started, ended or released) and the request is no START.
    MissingStart,
}

/// What [`Slots::arrive`] did with an accepted request.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Arrival {
    Queued,
    /// A START for a live sequence that did not end: it begins anew from the initial state.
    Restarted,
}

/// A request taken into a batch.
#[derive(Debug)]
pub(crate) struct Taken<T, S> {
    pub(crate) flags: SequenceFlags,
    pub(crate) payload: T,
    /// The state it runs on; `None`: the initial state (a START, or no request ran before).
    pub(crate) state: Option<S>,
    /// Its position in the batch: `direct`, its slot among the instance's slots (the batch is
    /// in position order, and positions without a request are left out); `oldest`, its index.
    pub(crate) position: usize,
}

#[derive(Debug)]
struct Queued<T> {
    flags: SequenceFlags,
    payload: T,
    arrived: Instant,
    /// Arrival order, to break ties between equal instants.
    order: u64,
}

#[derive(Debug)]
struct Sequence<T, S> {
    queued: VecDeque<Queued<T>>,
    /// One of its requests is executing.
    running: bool,
    slot: Option<usize>,
    /// The state its next request runs on (`None` until one ran).
    state: Option<S>,
    /// Last arrival or completion, for the idle timeout.
    last_active: Instant,
    /// An END request is queued or running: what follows must START anew.
    ending: bool,
}

/// The live sequences of a model version, their slots and their queued requests.
#[derive(Debug)]
pub(crate) struct Slots<T, S> {
    strategy: SequenceStrategy,
    /// Largest batch: `max(1, max_batch_size)`.
    max_batch: usize,
    max_idle: Duration,
    /// Direct strategy: the instance of each slot.
    slot_instance: Option<Vec<usize>>,
    /// Requests queued across all sequences refused beyond this.
    capacity: usize,
    sequences: HashMap<CorrelationId, Sequence<T, S>>,
    /// Free slots, lowest last so they are reused first.
    free_slots: Vec<usize>,
    /// Live sequences waiting for a slot, oldest first.
    backlog: VecDeque<CorrelationId>,
    queued: usize,
    /// Arrivals so far.
    arrivals: u64,
    /// `iterative_sequence`: every request ends its sequence once it finished, unless it was
    /// rescheduled ([`Slots::requeue`]).
    iterative: bool,
}

impl<T, S: Clone> Slots<T, S> {
    /// Slots for `instances` instances of a model with `max_batch_size`.
    pub(crate) fn new(
        strategy: SequenceStrategy,
        max_batch_size: usize,
        max_idle: Duration,
        instances: usize,
        capacity: usize,
    ) -> Slots<T, S> {
        let per_instance = max_batch_size.max(1);
        let (slots, slot_instance) = match &strategy {
            SequenceStrategy::Direct { .. } => (
                instances * per_instance,
                Some(
                    (0..instances * per_instance)
                        .map(|s| s / per_instance)
                        .collect(),
                ),
            ),
            SequenceStrategy::Oldest {
                max_candidates: 0, ..
            } => (instances * per_instance, None),
            SequenceStrategy::Oldest { max_candidates, .. } => (*max_candidates, None),
        };
        Slots {
            strategy,
            max_batch: per_instance,
            max_idle,
            slot_instance,
            capacity,
            sequences: HashMap::new(),
            free_slots: (0..slots).rev().collect(),
            backlog: VecDeque::new(),
            queued: 0,
            arrivals: 0,
            iterative: false,
        }
    }

    /// `iterative_sequence` (Triton's iterative sequencer): a sequence ends with each request
    /// that finishes with nothing queued behind it, as if every request carried END; a
    /// rescheduled request is queued again first ([`Slots::requeue`]), so its sequence goes on.
    pub(crate) fn iterative(mut self, iterative: bool) -> Slots<T, S> {
        self.iterative = iterative;
        self
    }

    /// Requests queued across all sequences.
    pub(crate) fn queued(&self) -> usize {
        self.queued
    }

    /// How long a sequence may go without a request before it is released.
    pub(crate) fn max_idle(&self) -> Duration {
        self.max_idle
    }

    /// Whether batches depend on the instance asking (`direct`: sequences stay on one).
    pub(crate) fn per_instance(&self) -> bool {
        self.slot_instance.is_some()
    }

    /// A request arrives: queued behind the earlier ones of its sequence, or refused.
    pub(crate) fn arrive(
        &mut self,
        flags: SequenceFlags,
        payload: T,
        now: Instant,
    ) -> Result<Arrival, (T, Refusal)> {
        if self.queued >= self.capacity {
            return Err((payload, Refusal::Full));
        }
        let mut arrival = Arrival::Queued;
        match self.sequences.get(&flags.id) {
            None if !flags.start => return Err((payload, Refusal::MissingStart)),
            None => {}
            Some(s) if s.ending && !flags.start => return Err((payload, Refusal::MissingStart)),
            Some(s) if flags.start && !s.ending => arrival = Arrival::Restarted,
            Some(_) => {}
        }
        let ending = flags.end || self.iterative;
        self.queue(flags, payload, now).ending = ending;
        Ok(arrival)
    }

    /// A request of sequence `flags.id` the model rescheduled (`iterative_sequence`; `flags`
    /// neither START nor END), queued again behind the sequence's requests, as Triton's
    /// iterative sequencer does. Never refused: it was admitted already, so the queue's bound
    /// does not apply. Its sequence cannot be released while its request runs; were it gone,
    /// it would start anew from the initial state.
    pub(crate) fn requeue(&mut self, flags: SequenceFlags, payload: T, now: Instant) {
        self.queue(flags, payload, now);
    }

    /// Queues a request behind its sequence, opening the sequence (a free slot, else the
    /// backlog) when it is not live; returns the sequence.
    fn queue(&mut self, flags: SequenceFlags, payload: T, now: Instant) -> &mut Sequence<T, S> {
        let order = self.arrivals;
        self.queued += 1;
        self.arrivals += 1;
        let sequence = match self.sequences.entry(flags.id.clone()) {
            std::collections::hash_map::Entry::Occupied(live) => live.into_mut(),
            std::collections::hash_map::Entry::Vacant(new) => {
                let slot = self.free_slots.pop();
                if slot.is_none() {
                    self.backlog.push_back(flags.id.clone());
                }
                new.insert(Sequence {
                    queued: VecDeque::new(),
                    running: false,
                    slot,
                    state: None,
                    last_active: now,
                    ending: false,
                })
            }
        };
        sequence.last_active = now;
        sequence.queued.push_back(Queued {
            flags,
            payload,
            arrived: now,
            order,
        });
        sequence
    }

    /// Drops the queued requests `keep` refuses (e.g. whose client went away), returning them.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&T) -> bool) -> Vec<T> {
        let mut dropped = Vec::new();
        for sequence in self.sequences.values_mut() {
            if sequence.queued.iter().all(|q| keep(&q.payload)) {
                continue;
            }
            let mut kept = VecDeque::with_capacity(sequence.queued.len());
            for q in sequence.queued.drain(..) {
                if keep(&q.payload) {
                    kept.push_back(q);
                } else {
                    dropped.push(q.payload);
                }
            }
            sequence.queued = kept;
        }
        self.queued -= dropped.len();
        dropped
    }

    /// The next request of every sequence `instance` may run that is ready, oldest first.
    pub(crate) fn form_batch(
        &mut self,
        instance: usize,
        now: Instant,
    ) -> Decision<Vec<Taken<T, S>>> {
        let mut ready: Vec<((Instant, u64), CorrelationId)> = self
            .sequences
            .iter()
            .filter(|(_, s)| !s.running)
            .filter(|(_, s)| match (s.slot, &self.slot_instance) {
                (None, _) => false,
                (Some(slot), Some(owner)) => owner[slot] == instance,
                (Some(_), None) => true,
            })
            .filter_map(|(id, s)| s.queued.front().map(|q| ((q.arrived, q.order), id.clone())))
            .collect();
        if ready.is_empty() {
            return Decision::Empty;
        }
        ready.sort_by_key(|(arrived, _)| *arrived);
        let oldest = ready[0].0.0;
        let take = match &self.strategy {
            SequenceStrategy::Direct {
                max_queue_delay,
                minimum_slot_utilization,
            } => {
                let waits = !max_queue_delay.is_zero() && minimum_slot_utilization.0 > 0.0;
                // Every ready sequence of a direct instance holds one of its `max_batch` slots.
                let utilization = ready.len() as f32 / self.max_batch as f32;
                if waits
                    && utilization < minimum_slot_utilization.0
                    && now < oldest + *max_queue_delay
                {
                    return Decision::WaitUntil(oldest + *max_queue_delay);
                }
                ready.len()
            }
            SequenceStrategy::Oldest {
                preferred_batch_sizes,
                max_queue_delay,
                ..
            } => {
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
        let mut batch = Vec::with_capacity(take);
        for (index, (_, id)) in ready.into_iter().take(take).enumerate() {
            let Some(sequence) = self.sequences.get_mut(&id) else {
                continue;
            };
            let Some(q) = sequence.queued.pop_front() else {
                continue;
            };
            self.queued -= 1;
            sequence.running = true;
            // A sequence whose START failed or was cancelled begins from the initial state too.
            let state = if q.flags.start {
                None
            } else {
                sequence.state.clone()
            };
            let position = match (sequence.slot, self.slot_instance.is_some()) {
                (Some(slot), true) => slot % self.max_batch,
                _ => index,
            };
            batch.push(Taken {
                flags: q.flags,
                payload: q.payload,
                state,
                position,
            });
        }
        batch.sort_by_key(|t| t.position);
        Decision::Dispatch(batch)
    }

    /// A request of sequence `id` finished; `new_state` is what it left (`None`: keep the old
    /// one). Returns whether the sequence was released (it ended with nothing queued).
    pub(crate) fn finish(
        &mut self,
        id: &CorrelationId,
        end: bool,
        new_state: Option<S>,
        now: Instant,
    ) -> bool {
        let Some(sequence) = self.sequences.get_mut(id) else {
            return false;
        };
        sequence.running = false;
        sequence.last_active = now;
        if new_state.is_some() {
            sequence.state = new_state;
        }
        if (end || self.iterative) && sequence.queued.is_empty() {
            self.release(id);
            return true;
        }
        false
    }

    /// Releases the sequences without a request for `max_idle`, returning their ids.
    pub(crate) fn release_idle(&mut self, now: Instant) -> Vec<CorrelationId> {
        let max_idle = self.max_idle;
        let expired: Vec<CorrelationId> = self
            .sequences
            .iter()
            .filter(|(_, s)| !s.running && s.queued.is_empty() && s.last_active + max_idle <= now)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &expired {
            self.release(id);
        }
        expired
    }

    /// When the next idle sequence must be released.
    pub(crate) fn next_wake(&self) -> Option<Instant> {
        self.sequences
            .values()
            .filter(|s| !s.running && s.queued.is_empty())
            .map(|s| s.last_active + self.max_idle)
            .min()
    }

    fn release(&mut self, id: &CorrelationId) {
        let Some(sequence) = self.sequences.remove(id) else {
            return;
        };
        self.queued -= sequence.queued.len();
        match sequence.slot {
            None => self.backlog.retain(|b| b != id),
            Some(slot) => {
                // The backlog's oldest live sequence takes the slot.
                while let Some(next) = self.backlog.pop_front() {
                    if let Some(s) = self.sequences.get_mut(&next) {
                        s.slot = Some(slot);
                        return;
                    }
                }
                self.free_slots.push(slot);
            }
        }
    }
}

#[cfg(test)]
mod tests;
