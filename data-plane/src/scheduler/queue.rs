//! The request queue of one model version and batch formation — pure logic, no threads, no
//! clocks: every decision takes `now` as an argument, so it is tested with made-up instants.
//!
//! Order: priority level 1 first, arrival order within a level, then requests whose timeout
//! expired with `timeout_action: DELAY`. A batch starts at the head of that order and takes
//! the requests behind it while their shapes match and the batch stays within
//! `max_batch_size`; it never skips a request, so no request is overtaken by a later one of
//! the same level.
//!
//! ```text
//!            form_batch(now)
//! queue ───────────────────────► Dispatch(batch)   full, preferred size reached, blocked by
//!                                                   a shape change, no delay, or delay spent
//!                              ► WaitUntil(t)      a bigger batch may still form until t
//!                              ► Empty
//! ```

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::policy::BatchPolicy;
use crate::config::TimeoutAction;

/// What must be equal for two requests to share a batch: input names, datatypes and non-batch
/// dimensions.
pub type ShapeKey = Vec<(String, &'static str, Vec<i64>)>;

/// A queued request. `T` is the payload (the request and its reply channel).
#[derive(Debug)]
pub struct Pending<T> {
    pub payload: T,
    pub batch_size: usize,
    pub shape: ShapeKey,
    pub arrived: Instant,
    /// When the queue timeout expires, if there is one.
    pub deadline: Option<Instant>,
    pub timeout_action: TimeoutAction,
}

/// What a batcher decides for a free instance (here [`RequestQueue::form_batch`], and the
/// sequence batcher's slots): run batch `B` now, look again at an instant, or nothing to do.
#[derive(Debug)]
pub enum Decision<B> {
    Dispatch(B),
    WaitUntil(Instant),
    Empty,
}

/// Priority queues plus the queue of delayed (timed-out, DELAY) requests.
#[derive(Debug)]
pub struct RequestQueue<T> {
    levels: Vec<VecDeque<Pending<T>>>,
    delayed: VecDeque<Pending<T>>,
    max_sizes: Vec<usize>,
    capacity: usize,
}

impl<T> RequestQueue<T> {
    #[cfg(test)]
    pub fn new(policy: &BatchPolicy) -> RequestQueue<T> {
        Self::with_capacity(policy, 0)
    }

    /// A queue that also refuses requests beyond `capacity` in total (0 = no total bound),
    /// on top of the per-level `max_queue_size`.
    pub fn with_capacity(policy: &BatchPolicy, capacity: usize) -> RequestQueue<T> {
        RequestQueue {
            levels: (0..policy.batching.priority_levels)
                .map(|_| VecDeque::new())
                .collect(),
            delayed: VecDeque::new(),
            max_sizes: policy
                .batching
                .queue_policies
                .iter()
                .map(|p| p.max_queue_size)
                .collect(),
            capacity,
        }
    }

    pub fn len(&self) -> usize {
        self.levels.iter().map(VecDeque::len).sum::<usize>() + self.delayed.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Queues a request at level index `level`; gives it back if that level is full.
    pub fn push(&mut self, level: usize, pending: Pending<T>) -> Result<(), Pending<T>> {
        let level = level.min(self.levels.len().saturating_sub(1));
        let max = self.max_sizes.get(level).copied().unwrap_or(0);
        if (max > 0 && self.levels[level].len() >= max)
            || (self.capacity > 0 && self.len() >= self.capacity)
        {
            return Err(pending);
        }
        self.levels[level].push_back(pending);
        Ok(())
    }

    /// Removes requests whose timeout has passed and whose action is REJECT (returned, to be
    /// failed); moves DELAY ones behind everything else.
    pub fn expire(&mut self, now: Instant) -> Vec<Pending<T>> {
        let mut rejected = Vec::new();
        for level in &mut self.levels {
            if !level.iter().any(|p| p.deadline.is_some_and(|d| d <= now)) {
                continue;
            }
            let mut kept = VecDeque::with_capacity(level.len());
            for mut p in level.drain(..) {
                match p.deadline {
                    Some(d) if d <= now => match p.timeout_action {
                        TimeoutAction::Reject => rejected.push(p),
                        TimeoutAction::Delay => {
                            p.deadline = None;
                            self.delayed.push_back(p);
                        }
                    },
                    _ => kept.push_back(p),
                }
            }
            *level = kept;
        }
        rejected
    }

    /// Drops the requests `keep` refuses (e.g. whose client went away), returning them.
    pub fn retain(&mut self, mut keep: impl FnMut(&T) -> bool) -> Vec<Pending<T>> {
        let mut dropped = Vec::new();
        for q in self
            .levels
            .iter_mut()
            .chain(std::iter::once(&mut self.delayed))
        {
            if q.iter().all(|p| keep(&p.payload)) {
                continue;
            }
            let mut kept = VecDeque::with_capacity(q.len());
            for p in q.drain(..) {
                if keep(&p.payload) {
                    kept.push_back(p)
                } else {
                    dropped.push(p)
                }
            }
            *q = kept;
        }
        dropped
    }

    /// The earliest queue-timeout deadline, to wake up for it.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.levels
            .iter()
            .flatten()
            .filter_map(|p| p.deadline)
            .min()
    }

    fn iter(&self) -> impl Iterator<Item = &Pending<T>> {
        self.levels.iter().flatten().chain(self.delayed.iter())
    }

    /// Takes the first `n` requests in queue order.
    fn take(&mut self, mut n: usize) -> Vec<Pending<T>> {
        let mut out = Vec::with_capacity(n);
        for q in self
            .levels
            .iter_mut()
            .chain(std::iter::once(&mut self.delayed))
        {
            while n > 0 {
                let Some(p) = q.pop_front() else { break };
                out.push(p);
                n -= 1;
            }
        }
        out
    }

    /// Decides what to run next on a free instance.
    pub fn form_batch(&mut self, now: Instant, policy: &BatchPolicy) -> Decision<Vec<Pending<T>>> {
        let Some(head) = self.iter().next() else {
            return Decision::Empty;
        };
        if !policy.dynamic {
            return Decision::Dispatch(self.take(1));
        }
        let max = policy.max_batch_size.max(1);
        let head_arrived = head.arrived;
        // Walk the queue: how many requests fit, and the batch size after each one.
        let mut sizes = Vec::new();
        let mut total = 0usize;
        let mut blocked = false;
        for p in self.iter() {
            if p.shape != head.shape || total + p.batch_size > max {
                blocked = !sizes.is_empty();
                break;
            }
            total += p.batch_size;
            sizes.push(total);
        }
        if sizes.is_empty() {
            // The head alone is larger than max_batch_size (validation prevents this); run it.
            return Decision::Dispatch(self.take(1));
        }
        let largest_preferred = policy.batching.preferred_batch_sizes.last().copied();
        let ready = blocked
            || total >= max
            || largest_preferred.is_some_and(|p| total >= p)
            || policy.batching.max_queue_delay == Duration::ZERO;
        if ready {
            return Decision::Dispatch(self.take(sizes.len()));
        }
        let due = head_arrived + policy.batching.max_queue_delay;
        if now < due {
            return Decision::WaitUntil(due);
        }
        // Delay spent: the largest preferred size the queue can make, else everything.
        let count = policy
            .batching
            .preferred_batch_sizes
            .iter()
            .rev()
            .find_map(|&pref| sizes.iter().position(|&s| s == pref).map(|i| i + 1))
            .unwrap_or(sizes.len());
        Decision::Dispatch(self.take(count))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{DynamicBatching, QueuePolicy};

    fn policy(max: usize, preferred: &[usize], delay_us: u64, levels: usize) -> BatchPolicy {
        BatchPolicy {
            dynamic: true,
            max_batch_size: max,
            batching: DynamicBatching {
                preferred_batch_sizes: preferred.to_vec(),
                max_queue_delay: Duration::from_micros(delay_us),
                preserve_ordering: false,
                priority_levels: levels,
                default_priority_level: 1,
                queue_policies: vec![QueuePolicy::default(); levels],
            },
            sequence: None,
            ragged: Default::default(),
        }
    }

    fn shape(d: i64) -> ShapeKey {
        vec![("x".into(), "FP32", vec![d])]
    }

    fn req(id: u32, at: Instant, batch: usize, dim: i64) -> Pending<u32> {
        Pending {
            payload: id,
            batch_size: batch,
            shape: shape(dim),
            arrived: at,
            deadline: None,
            timeout_action: TimeoutAction::Reject,
        }
    }

    fn ids(d: Decision<Vec<Pending<u32>>>) -> Vec<u32> {
        match d {
            Decision::Dispatch(b) => b.into_iter().map(|p| p.payload).collect(),
            other => panic!("expected a dispatch, got {other:?}"),
        }
    }

    #[test]
    fn no_delay_dispatches_everything_that_fits() {
        let t = Instant::now();
        let p = policy(4, &[], 0, 1);
        let mut q = RequestQueue::new(&p);
        for i in 0..6 {
            q.push(0, req(i, t, 1, 3)).unwrap();
        }
        assert_eq!(ids(q.form_batch(t, &p)), vec![0, 1, 2, 3]);
        assert_eq!(ids(q.form_batch(t, &p)), vec![4, 5]);
        assert!(matches!(q.form_batch(t, &p), Decision::Empty));
    }

    #[test]
    fn delay_waits_for_a_bigger_batch_until_due() {
        let t = Instant::now();
        let p = policy(8, &[], 100, 1);
        let mut q = RequestQueue::new(&p);
        q.push(0, req(0, t, 1, 3)).unwrap();
        match q.form_batch(t, &p) {
            Decision::WaitUntil(due) => assert_eq!(due, t + Duration::from_micros(100)),
            other => panic!("{other:?}"),
        }
        q.push(0, req(1, t + Duration::from_micros(50), 2, 3))
            .unwrap();
        assert!(matches!(
            q.form_batch(t + Duration::from_micros(60), &p),
            Decision::WaitUntil(_)
        ));
        assert_eq!(
            ids(q.form_batch(t + Duration::from_micros(100), &p)),
            vec![0, 1]
        );
    }

    #[test]
    fn full_batch_goes_without_waiting() {
        let t = Instant::now();
        let p = policy(4, &[], 1_000_000, 1);
        let mut q = RequestQueue::new(&p);
        q.push(0, req(0, t, 2, 3)).unwrap();
        q.push(0, req(1, t, 2, 3)).unwrap();
        assert_eq!(ids(q.form_batch(t, &p)), vec![0, 1]);
    }

    #[test]
    fn preferred_sizes() {
        let t = Instant::now();
        let p = policy(16, &[2, 4], 100, 1);
        let mut q = RequestQueue::new(&p);
        for i in 0..3 {
            q.push(0, req(i, t, 1, 3)).unwrap();
        }
        // 3 < largest preferred (4): wait; once due, send the largest preferred size reachable (2).
        assert!(matches!(q.form_batch(t, &p), Decision::WaitUntil(_)));
        assert_eq!(
            ids(q.form_batch(t + Duration::from_millis(1), &p)),
            vec![0, 1]
        );
        for i in 3..7 {
            q.push(0, req(i, t, 1, 3)).unwrap();
        }
        // 5 queued >= 4: dispatch at once, everything that fits.
        assert_eq!(ids(q.form_batch(t, &p)), vec![2, 3, 4, 5, 6]);
    }

    #[test]
    fn shapes_must_match_and_order_is_kept() {
        let t = Instant::now();
        let p = policy(8, &[], 1_000, 1);
        let mut q = RequestQueue::new(&p);
        q.push(0, req(0, t, 1, 3)).unwrap();
        q.push(0, req(1, t, 1, 5)).unwrap();
        q.push(0, req(2, t, 1, 3)).unwrap();
        // The second request blocks the batch: send the first alone rather than skip ahead.
        assert_eq!(ids(q.form_batch(t, &p)), vec![0]);
        assert_eq!(ids(q.form_batch(t, &p)), vec![1]);
    }

    #[test]
    fn priorities_come_first_and_queues_are_bounded() {
        let t = Instant::now();
        let mut p = policy(8, &[], 0, 2);
        p.batching.queue_policies[1].max_queue_size = 1;
        let mut q = RequestQueue::new(&p);
        q.push(1, req(0, t, 1, 3)).unwrap();
        assert!(
            q.push(1, req(9, t, 1, 3)).is_err(),
            "level 2 holds one request"
        );
        q.push(0, req(1, t + Duration::from_micros(1), 1, 3))
            .unwrap();
        assert_eq!(ids(q.form_batch(t, &p)), vec![1, 0]);
    }

    #[test]
    fn timeouts_reject_or_delay() {
        let t = Instant::now();
        let p = policy(1, &[], 0, 1);
        let mut q = RequestQueue::new(&p);
        let mut a = req(0, t, 1, 3);
        a.deadline = Some(t + Duration::from_micros(10));
        let mut b = req(1, t, 1, 3);
        b.deadline = Some(t + Duration::from_micros(10));
        b.timeout_action = TimeoutAction::Delay;
        q.push(0, a).unwrap();
        q.push(0, b).unwrap();
        q.push(0, req(2, t, 1, 3)).unwrap();
        assert_eq!(q.next_deadline(), Some(t + Duration::from_micros(10)));
        assert!(q.expire(t).is_empty());
        let rejected = q.expire(t + Duration::from_micros(10));
        assert_eq!(
            rejected.iter().map(|p| p.payload).collect::<Vec<_>>(),
            vec![0]
        );
        // The delayed request now runs after the one that did not time out.
        assert_eq!(ids(q.form_batch(t, &p)), vec![2]);
        assert_eq!(ids(q.form_batch(t, &p)), vec![1]);
        assert_eq!(q.next_deadline(), None);
    }

    #[test]
    fn default_scheduler_runs_requests_alone_in_order() {
        let t = Instant::now();
        let mut p = policy(8, &[], 0, 1);
        p.dynamic = false;
        let mut q = RequestQueue::new(&p);
        q.push(0, req(0, t, 2, 3)).unwrap();
        q.push(0, req(1, t, 2, 3)).unwrap();
        assert_eq!(ids(q.form_batch(t, &p)), vec![0]);
        assert_eq!(ids(q.form_batch(t, &p)), vec![1]);
    }

    #[test]
    fn retain_drops_cancelled() {
        let t = Instant::now();
        let p = policy(8, &[], 0, 1);
        let mut q = RequestQueue::new(&p);
        for i in 0..4 {
            q.push(0, req(i, t, 1, 3)).unwrap();
        }
        let dropped = q.retain(|id| id % 2 == 0);
        assert_eq!(dropped.len(), 2);
        assert_eq!(ids(q.form_batch(t, &p)), vec![0, 2]);
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

    /// Property: for random arrivals, shapes, batch sizes, priorities and policies, every
    /// dispatched batch fits `max_batch_size` and has one shape, each level is served in
    /// arrival order, a batch never takes a lower level while a higher one waits, and every
    /// request is dispatched exactly once.
    #[test]
    fn randomized_queues_keep_the_batching_invariants() {
        for seed in 1..200u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let levels = 1 + rng.next(3) as usize;
            let max = 1 + rng.next(8) as usize;
            let preferred: Vec<usize> = (0..rng.next(3))
                .map(|_| 1 + rng.next(max as u64) as usize)
                .collect();
            let mut p = policy(max, &[], rng.next(3) * 50, levels);
            p.batching.preferred_batch_sizes = preferred;
            p.batching.preferred_batch_sizes.sort_unstable();
            p.batching.preferred_batch_sizes.dedup();
            let mut q = RequestQueue::new(&p);
            let t0 = Instant::now();
            let mut now = t0;
            let mut pushed: Vec<(u32, usize)> = Vec::new();
            let mut dispatched: Vec<u32> = Vec::new();
            let mut next_id = 0u32;
            for _ in 0..60 {
                now += Duration::from_micros(rng.next(40));
                if rng.next(3) > 0 {
                    let level = rng.next(levels as u64) as usize;
                    let batch = 1 + rng.next(max as u64) as usize;
                    let dim = rng.next(2) as i64;
                    q.push(level, req(next_id, now, batch, dim)).unwrap();
                    pushed.push((next_id, level));
                    next_id += 1;
                } else {
                    let head_level = (0..levels).find(|l| !q.levels[*l].is_empty());
                    if let Decision::Dispatch(batch) = q.form_batch(now, &p) {
                        let total: usize = batch.iter().map(|b| b.batch_size).sum();
                        assert!(
                            total <= max || batch.len() == 1,
                            "seed {seed}: batch of {total} > {max}"
                        );
                        assert!(
                            batch.iter().all(|b| b.shape == batch[0].shape),
                            "seed {seed}: mixed shapes"
                        );
                        let first_level = pushed
                            .iter()
                            .find(|(id, _)| *id == batch[0].payload)
                            .map(|x| x.1);
                        assert_eq!(
                            first_level, head_level,
                            "seed {seed}: a lower level went first"
                        );
                        dispatched.extend(batch.iter().map(|b| b.payload));
                    }
                }
            }
            // Drain: far enough in the future every delay is spent.
            let later = now + Duration::from_secs(1);
            while let Decision::Dispatch(batch) = q.form_batch(later, &p) {
                dispatched.extend(batch.iter().map(|b| b.payload));
            }
            assert!(q.is_empty(), "seed {seed}: requests left behind");
            let mut sorted = dispatched.clone();
            sorted.sort_unstable();
            sorted.dedup();
            assert_eq!(
                sorted.len(),
                pushed.len(),
                "seed {seed}: lost or duplicated requests"
            );
            for level in 0..levels {
                let order: Vec<u32> = dispatched
                    .iter()
                    .copied()
                    .filter(|id| pushed.iter().any(|(p, l)| p == id && *l == level))
                    .collect();
                let mut fifo = order.clone();
                fifo.sort_unstable();
                assert_eq!(
                    order, fifo,
                    "seed {seed}: level {level} served out of order"
                );
            }
        }
    }
}
