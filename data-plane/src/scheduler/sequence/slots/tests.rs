//! The sequence batcher's decisions, event by event, with made-up instants: no threads, no
//! sleeps. Payloads are `u32` request numbers, states `i64` running sums.

use super::*;

const IDLE: Duration = Duration::from_millis(200);

fn flags(id: u64, start: bool, end: bool) -> SequenceFlags {
    SequenceFlags {
        id: CorrelationId::Uint(id),
        start,
        end,
    }
}

fn direct(max_batch: usize, instances: usize) -> Slots<u32, i64> {
    Slots::new(SequenceStrategy::DIRECT, max_batch, IDLE, instances, 64)
}

fn oldest(
    max_candidates: usize,
    max_batch: usize,
    preferred: &[usize],
    delay_us: u64,
) -> Slots<u32, i64> {
    let strategy = SequenceStrategy::Oldest {
        max_candidates,
        preferred_batch_sizes: preferred.to_vec(),
        max_queue_delay: Duration::from_micros(delay_us),
        preserve_ordering: false,
    };
    Slots::new(strategy, max_batch, IDLE, 1, 64)
}

/// `direct` with `max_queue_delay_microseconds` and `minimum_slot_utilization`.
fn direct_waiting(max_batch: usize, delay_us: u64, utilization: f32) -> Slots<u32, i64> {
    let strategy = SequenceStrategy::Direct {
        max_queue_delay: Duration::from_micros(delay_us),
        minimum_slot_utilization: crate::config::Utilization(utilization),
    };
    Slots::new(strategy, max_batch, IDLE, 1, 64)
}

/// (payload, batch position) of each request of a dispatched batch.
fn positions(d: Decision<Vec<Taken<u32, i64>>>) -> Vec<(u32, usize)> {
    match d {
        Decision::Dispatch(batch) => batch.into_iter().map(|t| (t.payload, t.position)).collect(),
        other => panic!("expected a dispatch, got {other:?}"),
    }
}

/// (correlation id, payload, state) of each request of a dispatched batch.
fn taken(d: Decision<Vec<Taken<u32, i64>>>) -> Vec<(u64, u32, Option<i64>)> {
    match d {
        Decision::Dispatch(batch) => batch
            .into_iter()
            .map(|t| match t.flags.id {
                CorrelationId::Uint(id) => (id, t.payload, t.state),
                CorrelationId::String(s) => panic!("unexpected id {s}"),
            })
            .collect(),
        other => panic!("expected a dispatch, got {other:?}"),
    }
}

fn payloads(d: Decision<Vec<Taken<u32, i64>>>) -> Vec<u32> {
    taken(d).into_iter().map(|(_, p, _)| p).collect()
}

fn is_empty(d: &Decision<Vec<Taken<u32, i64>>>) -> bool {
    matches!(d, Decision::Empty)
}

fn id(v: u64) -> CorrelationId {
    CorrelationId::Uint(v)
}

#[test]
fn requests_of_a_sequence_run_in_order_one_at_a_time() {
    let t = Instant::now();
    for mut s in [direct(4, 2), oldest(4, 4, &[], 0)] {
        s.arrive(flags(7, true, false), 1, t).unwrap();
        s.arrive(flags(7, false, false), 2, t).unwrap();
        s.arrive(flags(7, false, true), 3, t).unwrap();
        assert_eq!(s.queued(), 3);
        // One request per sequence per batch; the next waits until this one finished.
        assert_eq!(taken(s.form_batch(0, t)), vec![(7, 1, None)]);
        assert!(is_empty(&s.form_batch(0, t)));
        assert!(is_empty(&s.form_batch(1, t)), "no other instance runs it");
        assert!(!s.finish(&id(7), false, Some(1), t));
        assert_eq!(taken(s.form_batch(0, t)), vec![(7, 2, Some(1))]);
        assert!(!s.finish(&id(7), false, Some(3), t));
        assert_eq!(taken(s.form_batch(0, t)), vec![(7, 3, Some(3))]);
        assert!(s.finish(&id(7), true, Some(6), t), "END releases it");
        assert_eq!(s.queued(), 0);
        assert!(is_empty(&s.form_batch(0, t)));
    }
}

#[test]
fn oldest_batches_ready_requests_of_different_sequences() {
    let t = Instant::now();
    let mut s = oldest(8, 4, &[], 0);
    s.arrive(flags(1, true, false), 1, t).unwrap();
    assert_eq!(payloads(s.form_batch(0, t)), vec![1]);
    // Three sequences queue while the first one runs, then run as one batch, oldest first.
    for (n, at) in [(4u32, 3u64), (2, 1), (3, 2)] {
        s.arrive(
            flags(u64::from(n), true, false),
            n,
            t + Duration::from_micros(at),
        )
        .unwrap();
    }
    s.finish(&id(1), false, Some(1), t);
    let later = t + Duration::from_millis(1);
    assert_eq!(payloads(s.form_batch(0, later)), vec![2, 3, 4]);
}

#[test]
fn oldest_waits_for_a_batch_until_its_delay_or_a_preferred_size() {
    let t = Instant::now();
    let mut s = oldest(8, 4, &[2], 100);
    s.arrive(flags(1, true, false), 1, t).unwrap();
    match s.form_batch(0, t) {
        Decision::WaitUntil(due) => assert_eq!(due, t + Duration::from_micros(100)),
        other => panic!("{other:?}"),
    }
    s.arrive(flags(2, true, false), 2, t).unwrap();
    s.arrive(flags(3, true, false), 3, t).unwrap();
    // Three ready: the largest preferred size that fits goes at once.
    assert_eq!(payloads(s.form_batch(0, t)), vec![1, 2]);
    // One left: it waits, then goes alone once its delay is spent.
    assert!(matches!(s.form_batch(0, t), Decision::WaitUntil(_)));
    assert_eq!(
        payloads(s.form_batch(0, t + Duration::from_micros(100))),
        vec![3]
    );
    // A full batch goes without waiting.
    let mut s = oldest(8, 2, &[], 1_000_000);
    s.arrive(flags(1, true, false), 1, t).unwrap();
    s.arrive(flags(2, true, false), 2, t).unwrap();
    s.arrive(flags(3, true, false), 3, t).unwrap();
    assert_eq!(payloads(s.form_batch(0, t)), vec![1, 2]);
}

#[test]
fn oldest_runs_at_most_max_candidate_sequences() {
    let t = Instant::now();
    let mut s = oldest(2, 4, &[], 0);
    for n in 1..=3u32 {
        s.arrive(flags(u64::from(n), true, true), n, t).unwrap();
    }
    assert_eq!(payloads(s.form_batch(0, t)), vec![1, 2]);
    assert!(s.finish(&id(1), true, None, t));
    // The released slot goes to the sequence waiting in the backlog.
    assert_eq!(payloads(s.form_batch(0, t)), vec![3]);
}

#[test]
fn direct_sequences_beyond_the_slots_wait_in_the_backlog() {
    let t = Instant::now();
    // One instance, max_batch_size 1: one slot.
    let mut s = direct(1, 1);
    s.arrive(flags(1, true, false), 1, t).unwrap();
    assert_eq!(payloads(s.form_batch(0, t)), vec![1]);
    s.finish(&id(1), false, Some(1), t);
    s.arrive(flags(2, true, true), 5, t).unwrap();
    assert!(
        is_empty(&s.form_batch(0, t)),
        "sequence 2 ran while sequence 1 held the only slot"
    );
    s.arrive(flags(1, false, true), 2, t).unwrap();
    assert_eq!(taken(s.form_batch(0, t)), vec![(1, 2, Some(1))]);
    assert!(s.finish(&id(1), true, Some(2), t));
    assert_eq!(taken(s.form_batch(0, t)), vec![(2, 5, None)]);
}

#[test]
fn direct_sequences_stay_on_the_instance_of_their_slot() {
    let t = Instant::now();
    let mut s = direct(1, 2);
    s.arrive(flags(1, true, false), 1, t).unwrap();
    s.arrive(flags(2, true, false), 2, t).unwrap();
    assert!(s.per_instance());
    assert_eq!(payloads(s.form_batch(1, t)), vec![2]);
    assert_eq!(payloads(s.form_batch(0, t)), vec![1]);
    s.finish(&id(1), false, Some(1), t);
    s.finish(&id(2), false, Some(2), t);
    s.arrive(flags(1, false, false), 3, t).unwrap();
    assert!(is_empty(&s.form_batch(1, t)));
    assert_eq!(payloads(s.form_batch(0, t)), vec![3]);
    assert!(!oldest(0, 1, &[], 0).per_instance());
}

#[test]
fn a_sequence_must_start_and_ends_with_end() {
    let t = Instant::now();
    let mut s = direct(4, 1);
    assert_eq!(
        s.arrive(flags(3, false, false), 1, t).unwrap_err(),
        (1, Refusal::MissingStart)
    );
    s.arrive(flags(3, true, true), 2, t).unwrap();
    // Queued behind an END: what follows must START anew.
    assert_eq!(
        s.arrive(flags(3, false, false), 3, t).unwrap_err().1,
        Refusal::MissingStart
    );
    assert_eq!(payloads(s.form_batch(0, t)), vec![2]);
    assert!(s.finish(&id(3), true, Some(1), t));
    assert_eq!(
        s.arrive(flags(3, false, false), 4, t).unwrap_err().1,
        Refusal::MissingStart
    );
    assert_eq!(s.queued(), 0);
}

#[test]
fn a_new_start_restarts_a_live_sequence() {
    let t = Instant::now();
    let mut s = direct(4, 1);
    assert_eq!(s.arrive(flags(4, true, false), 1, t), Ok(Arrival::Queued));
    payloads(s.form_batch(0, t));
    s.finish(&id(4), false, Some(10), t);
    assert_eq!(
        s.arrive(flags(4, true, false), 2, t),
        Ok(Arrival::Restarted)
    );
    assert_eq!(
        taken(s.form_batch(0, t)),
        vec![(4, 2, None)],
        "initial state"
    );
    s.finish(&id(4), false, Some(1), t);
    s.arrive(flags(4, false, false), 3, t).unwrap();
    assert_eq!(taken(s.form_batch(0, t)), vec![(4, 3, Some(1))]);
    // A failed request leaves the state as it was.
    s.finish(&id(4), false, None, t);
    s.arrive(flags(4, false, false), 4, t).unwrap();
    assert_eq!(taken(s.form_batch(0, t)), vec![(4, 4, Some(1))]);
}

#[test]
fn an_idle_sequence_is_released() {
    let t = Instant::now();
    let mut s = direct(1, 1);
    s.arrive(flags(5, true, false), 1, t).unwrap();
    assert_eq!(s.next_wake(), None, "a queued request is not idle");
    payloads(s.form_batch(0, t));
    assert_eq!(s.next_wake(), None, "a running request is not idle");
    let done = t + Duration::from_millis(10);
    s.finish(&id(5), false, Some(1), done);
    assert_eq!(s.next_wake(), Some(done + IDLE));
    assert!(
        s.release_idle(done + IDLE - Duration::from_micros(1))
            .is_empty()
    );
    assert_eq!(s.release_idle(done + IDLE), vec![id(5)]);
    assert_eq!(s.next_wake(), None);
    let later = done + IDLE;
    assert_eq!(
        s.arrive(flags(5, false, false), 2, later).unwrap_err().1,
        Refusal::MissingStart
    );
    // The released slot (the only one) serves a new sequence.
    s.arrive(flags(6, true, true), 3, later).unwrap();
    assert_eq!(payloads(s.form_batch(0, later)), vec![3]);
}

#[test]
fn the_queue_is_bounded_and_cancelled_requests_leave_it() {
    let t = Instant::now();
    let mut s: Slots<u32, i64> = Slots::new(SequenceStrategy::DIRECT, 4, IDLE, 1, 2);
    s.arrive(flags(1, true, false), 1, t).unwrap();
    s.arrive(flags(2, true, false), 2, t).unwrap();
    assert_eq!(
        s.arrive(flags(3, true, false), 3, t).unwrap_err(),
        (3, Refusal::Full)
    );
    assert_eq!(s.retain(|p| *p != 1), vec![1]);
    assert_eq!(s.queued(), 1);
    s.arrive(flags(3, true, false), 3, t).unwrap();
    assert_eq!(payloads(s.form_batch(0, t)), vec![2, 3]);
}

/// Deterministic xorshift, so the randomized test below needs no extra crate and replays.
struct Rng(u64);

impl Rng {
    fn next(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Property: for random arrivals, completions and idle releases under both strategies, a
/// batch never exceeds `max_batch_size` nor holds two requests of one sequence, a sequence
/// never runs two requests at once, its requests run in arrival order on the state its
/// previous request left, and `direct` sequences stay on one instance.
#[test]
fn randomized_events_keep_the_sequence_invariants() {
    for seed in 1..200u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let instances = 1 + rng.next(2) as usize;
        let max_batch = 1 + rng.next(3) as usize;
        let strategy = if rng.next(2) == 0 {
            SequenceStrategy::DIRECT
        } else {
            SequenceStrategy::Oldest {
                max_candidates: rng.next(4) as usize,
                preferred_batch_sizes: vec![],
                max_queue_delay: Duration::from_micros(rng.next(3) * 50),
                preserve_ordering: false,
            }
        };
        let direct = strategy == SequenceStrategy::DIRECT;
        let mut s: Slots<u32, i64> = Slots::new(strategy, max_batch, IDLE, instances, 1_000);
        let t0 = Instant::now();
        let mut now = t0;
        // Per sequence: requests sent, requests run, running on which instance, home instance.
        let mut sent: HashMap<u64, Vec<u32>> = HashMap::new();
        let mut ran: HashMap<u64, Vec<u32>> = HashMap::new();
        let mut running: Vec<(usize, u64, u32)> = Vec::new();
        let mut home: HashMap<u64, usize> = HashMap::new();
        let mut next = 0u32;
        for _ in 0..200 {
            now += Duration::from_micros(rng.next(100));
            match rng.next(4) {
                0 | 1 => {
                    let seq = 1 + rng.next(5);
                    let start = !sent.contains_key(&seq) || rng.next(8) == 0;
                    if s.arrive(flags(seq, start, false), next, now).is_ok() {
                        sent.entry(seq).or_default().push(next);
                    }
                    next += 1;
                }
                2 => {
                    let instance = rng.next(instances as u64) as usize;
                    if running.iter().any(|r| r.0 == instance) {
                        continue;
                    }
                    if let Decision::Dispatch(batch) = s.form_batch(instance, now) {
                        assert!(batch.len() <= max_batch, "seed {seed}: batch too large");
                        for t in batch {
                            let CorrelationId::Uint(seq) = t.flags.id else {
                                unreachable!()
                            };
                            assert!(
                                !running.iter().any(|r| r.1 == seq),
                                "seed {seed}: sequence {seq} runs twice"
                            );
                            let done = ran.entry(seq).or_default();
                            if !t.flags.start {
                                assert_eq!(
                                    t.state,
                                    done.last().map(|&p| i64::from(p)),
                                    "seed {seed}: sequence {seq} lost its state"
                                );
                            }
                            done.push(t.payload);
                            if direct {
                                let h = *home.entry(seq).or_insert(instance);
                                assert_eq!(h, instance, "seed {seed}: sequence {seq} moved");
                            }
                            running.push((instance, seq, t.payload));
                        }
                    }
                }
                _ => {
                    let instance = rng.next(instances as u64) as usize;
                    for (_, seq, payload) in running.iter().filter(|r| r.0 == instance) {
                        s.finish(&id(*seq), false, Some(i64::from(*payload)), now);
                    }
                    running.retain(|r| r.0 != instance);
                    for released in s.release_idle(now) {
                        let CorrelationId::Uint(seq) = released else {
                            unreachable!()
                        };
                        // A released sequence must START anew: a new life.
                        sent.remove(&seq);
                        ran.remove(&seq);
                        home.remove(&seq);
                    }
                }
            }
        }
        for (seq, order) in &ran {
            let mut sorted = order.clone();
            sorted.sort_unstable();
            assert_eq!(
                order, &sorted,
                "seed {seed}: sequence {seq} ran out of order"
            );
        }
    }
}

#[test]
fn direct_waits_for_slot_utilization_until_the_queue_delay() {
    let t = Instant::now();
    let us = Duration::from_micros;
    // 4 slots, half must have work: one ready sequence waits for the oldest's delay.
    let mut s = direct_waiting(4, 100, 0.5);
    s.arrive(flags(1, true, false), 1, t).unwrap();
    match s.form_batch(0, t + us(10)) {
        Decision::WaitUntil(due) => assert_eq!(due, t + us(100)),
        other => panic!("{other:?}"),
    }
    // A second sequence brings utilization to 2/4: both go at once.
    s.arrive(flags(2, true, false), 2, t + us(20)).unwrap();
    assert_eq!(payloads(s.form_batch(0, t + us(20))), vec![1, 2]);
    s.finish(&id(1), false, Some(1), t + us(30));
    s.finish(&id(2), false, Some(2), t + us(30));
    // Alone again: it waits out the delay from its own arrival, then goes alone.
    s.arrive(flags(2, false, false), 3, t + us(40)).unwrap();
    assert!(matches!(s.form_batch(0, t + us(139)), Decision::WaitUntil(d) if d == t + us(140)));
    assert_eq!(payloads(s.form_batch(0, t + us(140))), vec![3]);
}

#[test]
fn direct_without_both_settings_never_waits() {
    let t = Instant::now();
    // A delay without a utilization, or a utilization without a delay, is no wait (Triton).
    for mut s in [
        direct_waiting(4, 100, 0.0),
        direct_waiting(4, 0, 1.0),
        direct(4, 1),
    ] {
        s.arrive(flags(1, true, false), 1, t).unwrap();
        assert_eq!(payloads(s.form_batch(0, t)), vec![1]);
    }
    // Full utilization reached goes at once whatever the delay.
    let mut s = direct_waiting(2, 1_000_000, 1.0);
    s.arrive(flags(1, true, false), 1, t).unwrap();
    assert!(matches!(s.form_batch(0, t), Decision::WaitUntil(_)));
    s.arrive(flags(2, true, false), 2, t).unwrap();
    assert_eq!(payloads(s.form_batch(0, t)), vec![1, 2]);
}

#[test]
fn direct_requests_keep_their_slot_positions() {
    let t = Instant::now();
    let mut s = direct(3, 2);
    // Sequences 1, 2, 3 take instance 0's slots 0, 1, 2; sequence 4 instance 1's slot 0.
    for n in 1..=4u32 {
        s.arrive(flags(u64::from(n), true, false), n, t).unwrap();
    }
    assert_eq!(positions(s.form_batch(0, t)), vec![(1, 0), (2, 1), (3, 2)]);
    assert_eq!(positions(s.form_batch(1, t)), vec![(4, 0)]);
    for n in 1..=3u64 {
        s.finish(&id(n), false, Some(0), t);
    }
    // Only sequence 3 has work: it keeps position 2 (the engine pads 0 and 1).
    s.arrive(flags(3, false, false), 5, t).unwrap();
    assert_eq!(positions(s.form_batch(0, t)), vec![(5, 2)]);
    // Oldest has no fixed positions: a batch's requests are numbered in order.
    let mut s = oldest(4, 4, &[], 0);
    s.arrive(flags(8, true, false), 1, t).unwrap();
    s.arrive(flags(9, true, false), 2, t).unwrap();
    assert_eq!(positions(s.form_batch(0, t)), vec![(1, 0), (2, 1)]);
}

#[test]
fn iterative_sequences_end_with_each_request() {
    let t = Instant::now();
    let mut s = direct(2, 1).iterative(true);
    s.arrive(flags(1, true, false), 1, t).unwrap();
    assert_eq!(payloads(s.form_batch(0, t)), vec![1]);
    assert!(s.finish(&id(1), false, Some(5), t), "released without END");
    // What follows must START again, and starts from the initial state.
    assert_eq!(
        s.arrive(flags(1, false, false), 2, t).unwrap_err().1,
        Refusal::MissingStart
    );
    s.arrive(flags(1, true, false), 3, t).unwrap();
    assert_eq!(taken(s.form_batch(0, t)), vec![(1, 3, None)]);
}

#[test]
fn a_rescheduled_request_runs_again_in_its_slot_until_released() {
    let t = Instant::now();
    // One slot, a queue bound of one request: sequence 2 waits in the backlog.
    let mut s: Slots<u32, i64> =
        Slots::new(SequenceStrategy::DIRECT, 1, IDLE, 1, 1).iterative(true);
    s.arrive(flags(1, true, false), 1, t).unwrap();
    assert_eq!(taken(s.form_batch(0, t)), vec![(1, 1, None)]);
    s.arrive(flags(2, true, false), 2, t).unwrap();
    // The model reschedules request 1: queued again (past the bound: it was admitted), so
    // finishing does not release its sequence, and it runs again on the state it left.
    s.requeue(flags(1, false, false), 1, t);
    assert_eq!(s.queued(), 2);
    assert!(
        !s.finish(&id(1), false, Some(5), t),
        "rescheduled: still live"
    );
    assert_eq!(taken(s.form_batch(0, t)), vec![(1, 1, Some(5))]);
    assert!(
        s.release_idle(t + IDLE * 2).is_empty(),
        "running, it is not idle"
    );
    // Released once the model is done with it: sequence 2 takes the slot.
    assert!(s.finish(&id(1), false, Some(6), t), "released without END");
    assert_eq!(taken(s.form_batch(0, t)), vec![(2, 2, None)]);
    assert_eq!(
        s.arrive(flags(1, false, false), 3, t).unwrap_err().1,
        Refusal::MissingStart,
        "the ended sequence must START again"
    );
}

#[test]
fn a_rescheduled_request_queues_behind_its_sequence_and_is_not_idle() {
    let t = Instant::now();
    let mut s = oldest(4, 4, &[], 0).iterative(true);
    s.arrive(flags(1, true, false), 1, t).unwrap();
    assert_eq!(payloads(s.form_batch(0, t)), vec![1]);
    // A new START of the same id arrives while 1 runs; the rescheduled 1 goes behind it, as
    // Triton's iterative sequencer enqueues it.
    s.arrive(flags(1, true, false), 2, t).unwrap();
    s.requeue(flags(1, false, false), 1, t);
    assert!(!s.finish(&id(1), false, Some(7), t));
    assert_eq!(taken(s.form_batch(0, t)), vec![(1, 2, None)]);
    assert!(!s.finish(&id(1), false, Some(1), t));
    // Waiting to run again is not idleness.
    assert!(s.release_idle(t + IDLE * 2).is_empty());
    assert_eq!(taken(s.form_batch(0, t + IDLE * 2)), vec![(1, 1, Some(1))]);
    assert!(s.finish(&id(1), false, None, t + IDLE * 2));
    assert_eq!(s.queued(), 0);
}
