//! Which node to try next: plain functions of (position, failure, hint), no sockets.
//!
//! Two shapes, one per kind of caller:
//!
//! - **Rotation** ([`next_after`]) for long-lived callers (the agent, the router's watch): one
//!   node is in use; when it fails the caller moves to the leader the node named, if that
//!   leader is listed, else to the next listed node, wrapping around.
//! - **Pass** ([`Pass`]) for one-off calls (`nereid ctl`, the router's activations): every
//!   listed node at most once, in list order, except that a named leader goes next.
//!
//! ```text
//! list [a, b, c]   a: UNAVAILABLE, x-nereid-leader = c   ─► c
//!                  c: unreachable                         ─► b (first untried)
//!                  b: UNAVAILABLE                         ─► pass exhausted
//! ```

use tonic::Status;

/// Metadata key a control-plane node sets to the leader's `host:port` when it refuses a call
/// as a follower (the control plane's `api::error::LEADER_HEADER`).
pub const LEADER_HINT: &str = "x-nereid-leader";

/// The leader a refusal names, if any.
pub fn leader_hint(status: &Status) -> Option<&str> {
    status
        .metadata()
        .get(LEADER_HINT)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
}

/// The node to use after the one at `current` (of `len`) failed. `hint`: the position of the
/// leader the failed node named, when listed.
pub fn next_after(current: usize, len: usize, hint: Option<usize>) -> usize {
    match hint {
        Some(h) if h < len && h != current => h,
        _ if len == 0 => 0,
        _ => (current + 1) % len,
    }
}

/// One pass over `len` nodes: each at most once.
#[derive(Debug, Clone)]
pub struct Pass {
    tried: Vec<bool>,
}

impl Pass {
    /// A pass over `len` nodes, none tried yet.
    pub fn new(len: usize) -> Pass {
        Pass {
            tried: vec![false; len],
        }
    }

    /// The node to try now, marked tried: the hinted one (from the last failure) when listed
    /// and untried, else the first untried in list order; `None` when all were tried.
    pub fn next(&mut self, hint: Option<usize>) -> Option<usize> {
        let chosen = hint
            .filter(|&h| self.tried.get(h) == Some(&false))
            .or_else(|| self.tried.iter().position(|t| !t))?;
        self.tried[chosen] = true;
        Some(chosen)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_follows_a_listed_hint_else_moves_to_the_next() {
        assert_eq!(next_after(0, 3, None), 1);
        assert_eq!(next_after(2, 3, None), 0, "wraps around");
        assert_eq!(next_after(0, 3, Some(2)), 2, "straight to the leader");
        assert_eq!(
            next_after(1, 3, Some(1)),
            2,
            "a node naming itself is skipped"
        );
        assert_eq!(next_after(1, 3, Some(7)), 2, "out of range is ignored");
        assert_eq!(next_after(0, 1, None), 0, "one node: stay");
        assert_eq!(next_after(0, 0, None), 0);
    }

    #[test]
    fn a_pass_tries_each_node_once_with_the_leader_first() {
        let mut pass = Pass::new(3);
        assert_eq!(pass.next(None), Some(0));
        assert_eq!(pass.next(Some(2)), Some(2), "the leader node 0 named");
        assert_eq!(pass.next(Some(0)), Some(1), "a tried hint is not retried");
        assert_eq!(pass.next(None), None);

        let mut pass = Pass::new(2);
        assert_eq!(pass.next(None), Some(0));
        assert_eq!(pass.next(None), Some(1));
        assert_eq!(pass.next(Some(0)), None);
        assert_eq!(Pass::new(0).next(None), None);
    }

    #[test]
    fn the_hint_is_read_from_metadata() {
        let mut status = Status::unavailable("this node is not the leader");
        assert_eq!(leader_hint(&status), None);
        status
            .metadata_mut()
            .insert(LEADER_HINT, "cp-2:7000".parse().unwrap());
        assert_eq!(leader_hint(&status), Some("cp-2:7000"));
        status
            .metadata_mut()
            .insert(LEADER_HINT, "".parse().unwrap());
        assert_eq!(leader_hint(&status), None, "empty means no leader known");
    }
}
