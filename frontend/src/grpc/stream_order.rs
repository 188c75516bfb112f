//! The two orders one `ModelStreamInfer` stream keeps while its requests run concurrently.
//!
//! - **Start order** (sequences): a request with a `sequence_id` starts once the request before
//!   it in the same sequence (model, version, id) on this stream has finished, so the sequence
//!   batcher sees a sequence's requests in the order they were sent.
//! - **Send order** (non-decoupled models): such a request's messages go out after those of the
//!   non-decoupled request before it, as Triton's stream handler writes them in request order.
//!   Decoupled models' responses go out as they are produced.
//!
//! ```text
//! requests in arrival order:   r1 ──► r2 ──► r3        each request holds its link's sender
//!   r2.after = r1's receiver; dropping r1's sender (r1 done) lets r2 go on
//! ```
//!
//! Every wait points at an earlier request, so the chains cannot deadlock. Plain bookkeeping
//! over oneshot channels: [`StreamOrder::admit`] runs on the stream's task as each request is
//! read, the waiting happens in the request tasks.

use std::collections::HashMap;

use tokio::sync::oneshot;
use tokio::sync::oneshot::error::TryRecvError;

use nereid_proto::{CorrelationId, InferRequest};

/// A sequence on one stream: model, version, correlation id.
pub type SequenceKey = (String, Option<i64>, CorrelationId);

/// The sequence a request belongs to, if it names one.
pub(crate) fn sequence_key(request: &InferRequest) -> Option<SequenceKey> {
    let id = request.options.sequence_id.clone()?;
    Some((request.model_name.clone(), request.model_version, id))
}

/// A request's place in one chain.
#[derive(Debug, Default)]
pub struct Turn {
    /// Resolves (sent or dropped) when the request before this one in the chain is done.
    after: Option<oneshot::Receiver<()>>,
    /// Held (never read) until this request is done in the chain; dropping it lets the next
    /// one go on.
    _done: Option<oneshot::Sender<()>>,
}

impl Turn {
    /// A place behind `after`, and the receiver the next place waits on.
    fn behind(after: Option<oneshot::Receiver<()>>) -> (Turn, oneshot::Receiver<()>) {
        let (done, finished) = oneshot::channel();
        let turn = Turn {
            after,
            _done: Some(done),
        };
        (turn, finished)
    }

    /// Waits until the request before this one is done; returns at once after the first call.
    pub async fn wait(&mut self) {
        if let Some(after) = self.after.take() {
            // Sent or dropped: either way the earlier request is done.
            let _ = after.await;
        }
    }
}

/// A request's places in both chains.
#[derive(Debug, Default)]
pub(crate) struct Turns {
    /// Wait on it before starting; hold it until the request has finished.
    pub start: Turn,
    /// Wait on it before sending; hold it until the request's last message is sent.
    pub send: Turn,
}

/// The chains of one stream.
#[derive(Debug, Default)]
pub(crate) struct StreamOrder {
    /// The link of the last request of each sequence that may still be running.
    sequences: HashMap<SequenceKey, oneshot::Receiver<()>>,
    /// The link of the last request whose messages keep request order.
    last_ordered: Option<oneshot::Receiver<()>>,
}

impl StreamOrder {
    /// Places the next request read from the stream: behind the previous request of `sequence`
    /// (if any) to start, and behind the previous ordered request to send when `ordered`.
    pub(crate) fn admit(&mut self, sequence: Option<SequenceKey>, ordered: bool) -> Turns {
        let start = match sequence {
            None => Turn::default(),
            Some(key) => {
                // Forget sequences whose last request has finished; only running ones stay.
                self.sequences
                    .retain(|_, done| matches!(done.try_recv(), Err(TryRecvError::Empty)));
                let after = self.sequences.remove(&key);
                let (turn, finished) = Turn::behind(after);
                self.sequences.insert(key, finished);
                turn
            }
        };
        let send = if ordered {
            let (turn, finished) = Turn::behind(self.last_ordered.take());
            self.last_ordered = Some(finished);
            turn
        } else {
            Turn::default()
        };
        Turns { start, send }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(model: &str, id: u64) -> Option<SequenceKey> {
        Some((model.to_string(), None, CorrelationId::Uint(id)))
    }

    /// Whether the request before `turn` is done, without waiting.
    fn released(turn: &mut Turn) -> bool {
        match &mut turn.after {
            None => true,
            Some(after) => !matches!(after.try_recv(), Err(TryRecvError::Empty)),
        }
    }

    #[test]
    fn a_sequence_starts_its_requests_one_after_another() {
        let mut order = StreamOrder::default();
        let mut free = order.admit(None, false);
        assert!(released(&mut free.start) && free.start._done.is_none());
        let first = order.admit(key("m", 1), false);
        let mut other_model = order.admit(key("other", 1), false);
        assert!(
            released(&mut other_model.start),
            "another model's sequence 1 is another"
        );
        let mut second = order.admit(key("m", 1), false);
        assert!(!released(&mut second.start));
        drop(first);
        assert!(released(&mut second.start));
        drop(second);
        // Both finished: the sequence's next request goes at once, and nothing else is kept.
        assert!(released(&mut order.admit(key("m", 1), false).start));
        assert_eq!(order.sequences.len(), 2, "'m' 1 (running) and 'other' 1");
    }

    #[test]
    fn ordered_requests_send_in_turn_and_others_do_not_wait() {
        let mut order = StreamOrder::default();
        let first = order.admit(None, true);
        let mut decoupled = order.admit(None, false);
        let mut second = order.admit(None, true);
        assert!(released(&mut decoupled.send) && decoupled.send._done.is_none());
        assert!(!released(&mut second.send));
        drop(first);
        assert!(released(&mut second.send));
    }
}
