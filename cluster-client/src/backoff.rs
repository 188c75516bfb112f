//! The wait between attempts of callers that retry until shutdown: doubling from `first` up to
//! `max`, reset when a call succeeds. Pure: the caller sleeps.

use std::time::Duration;

/// Growing waits between attempts.
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    current: Duration,
}

impl Backoff {
    /// The usual first wait: short enough that a leader change costs little.
    pub const FIRST: Duration = Duration::from_millis(50);
    /// The usual longest wait: a node that stays down is retried every two seconds.
    pub const MAX: Duration = Duration::from_secs(2);

    /// Waits that start at `first` and double up to `max` (`max` below `first` counts as `first`).
    pub fn new(first: Duration, max: Duration) -> Backoff {
        Backoff {
            first,
            max: max.max(first),
            current: Duration::ZERO,
        }
    }

    /// The next wait: `first` after a reset, then twice the last, at most `max`.
    pub fn next_wait(&mut self) -> Duration {
        self.current = (self.current * 2).clamp(self.first, self.max);
        self.current
    }

    /// Back to `first` for the next wait (after a success).
    pub fn reset(&mut self) {
        self.current = Duration::ZERO;
    }
}

impl Default for Backoff {
    /// 50 ms, doubling to 2 s.
    fn default() -> Backoff {
        Backoff::new(Backoff::FIRST, Backoff::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_to_a_bound_and_reset() {
        let mut b = Backoff::default();
        let waits: Vec<_> = (0..8).map(|_| b.next_wait().as_millis()).collect();
        assert_eq!(waits, [50, 100, 200, 400, 800, 1600, 2000, 2000]);
        b.reset();
        assert_eq!(b.next_wait(), Backoff::FIRST);
        let mut b = Backoff::new(Duration::from_secs(3), Duration::from_secs(1));
        assert_eq!(
            b.next_wait(),
            Duration::from_secs(3),
            "max below first is raised"
        );
    }
}
