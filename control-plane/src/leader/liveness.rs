//! Node liveness from heartbeats: a pure tracker the leader feeds with heartbeat times and asks
//! which nodes changed between up and down.
//!
//! ```text
//!  heartbeat(node, now) ──► last_seen[node] = now
//!  transitions(nodes in the state, now):
//!     up   and silent for > timeout ─► Down     (never before the leader held office for one
//!     down and heard within timeout ─► Up        timeout: a new leader has heard nobody yet)
//! ```
//!
//! Time is an argument, never read here, so the rules are tested without clocks.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::state::NodeStatus;

/// Last heartbeat per node, as seen by the current leader.
#[derive(Debug)]
pub struct Liveness {
    timeout: Duration,
    leader_since: Instant,
    last_seen: HashMap<String, Instant>,
}

impl Liveness {
    /// A tracker for a leader that took office at `leader_since`.
    pub fn new(timeout: Duration, leader_since: Instant) -> Self {
        Liveness {
            timeout,
            leader_since,
            last_seen: HashMap::new(),
        }
    }

    pub fn heartbeat(&mut self, node: &str, now: Instant) {
        match self.last_seen.get_mut(node) {
            Some(seen) => *seen = (*seen).max(now),
            None => {
                self.last_seen.insert(node.to_string(), now);
            }
        }
    }

    /// The node said it leaves: it counts as unheard-of (so down) until its next heartbeat.
    pub fn forget(&mut self, node: &str) {
        self.last_seen.remove(node);
    }

    /// Time since the node's last heartbeat, if this leader heard one.
    pub fn silence(&self, node: &str, now: Instant) -> Option<Duration> {
        self.last_seen
            .get(node)
            .map(|seen| now.saturating_duration_since(*seen))
    }

    /// The status changes to write for `nodes` (id, status in the state), in input order.
    pub fn transitions<'a>(
        &self,
        nodes: impl IntoIterator<Item = (&'a str, NodeStatus)>,
        now: Instant,
    ) -> Vec<(String, NodeStatus)> {
        let in_office = now.saturating_duration_since(self.leader_since);
        let mut out = Vec::new();
        for (node, status) in nodes {
            let alive = match self.silence(node, now) {
                Some(silence) => silence <= self.timeout,
                None => false,
            };
            match status {
                NodeStatus::Up if !alive && in_office > self.timeout => {
                    out.push((node.to_string(), NodeStatus::Down));
                }
                NodeStatus::Down if alive => out.push((node.to_string(), NodeStatus::Up)),
                _ => {}
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(2);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_new_leader_declares_nobody_down_for_one_timeout() {
        let start = Instant::now();
        let live = Liveness::new(T, start);
        let nodes = [("a", NodeStatus::Up)];
        assert!(live.transitions(nodes, start + ms(1999)).is_empty());
        assert!(live.transitions(nodes, start + T).is_empty());
        assert_eq!(
            live.transitions(nodes, start + T + ms(1)),
            vec![("a".to_string(), NodeStatus::Down)]
        );
    }

    #[test]
    fn a_silent_node_goes_down_and_comes_back_with_a_heartbeat() {
        let start = Instant::now();
        let mut live = Liveness::new(T, start);
        live.heartbeat("a", start + ms(2500));
        live.heartbeat("b", start + ms(100));
        let now = start + ms(3000);
        let got = live.transitions([("a", NodeStatus::Up), ("b", NodeStatus::Up)], now);
        assert_eq!(got, vec![("b".to_string(), NodeStatus::Down)]);
        live.heartbeat("b", now);
        let got = live.transitions([("a", NodeStatus::Up), ("b", NodeStatus::Down)], now);
        assert_eq!(got, vec![("b".to_string(), NodeStatus::Up)]);
    }

    #[test]
    fn a_node_that_left_stays_down_until_it_is_heard_again() {
        let start = Instant::now();
        let mut live = Liveness::new(T, start);
        live.heartbeat("a", start + ms(2500));
        live.forget("a");
        let now = start + ms(3000);
        assert!(live.transitions([("a", NodeStatus::Down)], now).is_empty());
        live.heartbeat("a", now);
        let got = live.transitions([("a", NodeStatus::Down)], now);
        assert_eq!(got, vec![("a".to_string(), NodeStatus::Up)]);
    }

    #[test]
    fn an_old_heartbeat_does_not_move_last_seen_back() {
        let start = Instant::now();
        let mut live = Liveness::new(T, start);
        live.heartbeat("a", start + ms(5000));
        live.heartbeat("a", start + ms(1000));
        assert_eq!(live.silence("a", start + ms(5500)), Some(ms(500)));
    }

    #[test]
    fn a_down_node_that_stays_silent_stays_down() {
        let start = Instant::now();
        let live = Liveness::new(T, start);
        assert!(
            live.transitions([("a", NodeStatus::Down)], start + ms(10_000))
                .is_empty()
        );
    }
}
