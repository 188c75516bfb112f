//! The server-wide budget of request bytes being received: every HTTP body and every gRPC
//! message charges its bytes here as they arrive, and gives them back once it is complete
//! (handed to the decoder) or abandoned. A client can no longer make the server hold memory it
//! only *declared* (a `Content-Length`, a gRPC length prefix): memory follows bytes that came
//! in, and all clients together cannot hold more than `--max-buffered-request-bytes` of
//! unfinished requests.
//!
//! ```text
//!  frame of n bytes arrives ─► lease.grow(n) ─ used + n ≤ limit ─► buffered
//!                                            └ over the limit ───► BudgetExceeded
//!                                               (HTTP 503 / gRPC RESOURCE_EXHAUSTED)
//!  request complete or dropped ─► lease dropped ─► its bytes return to the budget
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Default of `--max-buffered-request-bytes`: 1 GiB.
pub const DEFAULT_MAX_BUFFERED_REQUEST_BYTES: usize = 1 << 30;

/// The flag that sets the budget, for messages.
pub const BUDGET_FLAG: &str = "--max-buffered-request-bytes";

/// A shared budget of request bytes (clones share it).
#[derive(Clone, Debug)]
pub struct RequestBudget(Arc<Budget>);

#[derive(Debug)]
struct Budget {
    limit: usize,
    used: AtomicUsize,
}

impl Default for RequestBudget {
    fn default() -> Self {
        RequestBudget::new(DEFAULT_MAX_BUFFERED_REQUEST_BYTES)
    }
}

/// Two handles are equal when they share the same budget.
impl PartialEq for RequestBudget {
    fn eq(&self, other: &RequestBudget) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for RequestBudget {}

/// A request that would take the budget past its limit.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "the server is receiving {used} bytes of unfinished requests and this one would take it past {limit} ({BUDGET_FLAG}); retry later"
)]
pub struct BudgetExceeded {
    /// Bytes of unfinished requests already held against the budget when this one was refused.
    pub used: usize,
    /// The budget's limit in bytes (`--max-buffered-request-bytes`).
    pub limit: usize,
}

impl RequestBudget {
    /// A new budget of `limit` bytes, none of them in use.
    pub fn new(limit: usize) -> RequestBudget {
        RequestBudget(Arc::new(Budget {
            limit,
            used: AtomicUsize::new(0),
        }))
    }

    /// The most request bytes the budget lets the server hold at once.
    pub fn limit(&self) -> usize {
        self.0.limit
    }

    /// Bytes charged now, by every open lease.
    pub fn used(&self) -> usize {
        self.0.used.load(Ordering::Relaxed)
    }

    /// An empty lease on this budget.
    pub fn lease(&self) -> Lease {
        Lease {
            budget: self.clone(),
            bytes: 0,
        }
    }
}

/// Bytes one request holds of the budget; returned when dropped or [`Lease::release`]d.
#[derive(Debug)]
pub struct Lease {
    budget: RequestBudget,
    bytes: usize,
}

impl Lease {
    /// Charges `n` more bytes, or refuses (charging nothing) when they do not fit.
    pub fn grow(&mut self, n: usize) -> Result<(), BudgetExceeded> {
        let budget = &self.budget.0;
        let mut used = budget.used.load(Ordering::Relaxed);
        loop {
            let next = match used.checked_add(n) {
                Some(next) if next <= budget.limit => next,
                _ => {
                    return Err(BudgetExceeded {
                        used,
                        limit: budget.limit,
                    });
                }
            };
            match budget
                .used
                .compare_exchange_weak(used, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => {
                    self.bytes += n;
                    return Ok(());
                }
                Err(now) => used = now,
            }
        }
    }

    /// Bytes this lease holds.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Returns everything this lease holds; it can grow again afterwards.
    pub fn release(&mut self) {
        if self.bytes > 0 {
            self.budget.0.used.fetch_sub(self.bytes, Ordering::AcqRel);
            self.bytes = 0;
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_share_the_limit_and_return_bytes_on_drop() {
        let budget = RequestBudget::new(100);
        let mut a = budget.lease();
        let mut b = budget.lease();
        a.grow(60).unwrap();
        assert_eq!(
            b.grow(41).unwrap_err(),
            BudgetExceeded {
                used: 60,
                limit: 100
            }
        );
        assert_eq!(b.bytes(), 0, "a refused grow charges nothing");
        b.grow(40).unwrap();
        assert_eq!(budget.used(), 100);
        drop(a);
        assert_eq!(budget.used(), 40);
        b.release();
        assert_eq!(budget.used(), 0);
        b.grow(100).unwrap();
        drop(b);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn overflowing_sizes_are_refused() {
        let budget = RequestBudget::new(usize::MAX);
        let mut a = budget.lease();
        a.grow(usize::MAX).unwrap();
        assert!(budget.lease().grow(1).is_err());
    }

    #[test]
    fn the_message_names_the_flag() {
        let err = RequestBudget::new(10).lease().grow(11).unwrap_err();
        assert!(err.to_string().contains(BUDGET_FLAG), "{err}");
    }
}
