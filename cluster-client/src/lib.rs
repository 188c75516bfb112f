//! Nereid's one client of the control plane, shared by `nereid ctl`, the worker agent and the
//! router. It owns what they have in common; each caller keeps only its retry policy.
//!
//! ```text
//! ClientConfig{addresses, token, timeouts}
//!   ─► ControlPlaneClient::new: parse + normalize addresses, check the token (no I/O)
//!   ─► with_dial(ClusterDial)    TLS with the cluster identity (default: plaintext)
//!   ─► attempt(node, rpc)        one call at one node: Ok | Unreachable | Refused(status)
//!   ─► call_each(msg, moves_on)  one pass over the nodes, a named leader first
//!   ─► fail_over(hint)           the node in use moves on: listed leader, else next
//!   ─► Backoff                   waits between attempts for callers that retry forever
//! ```
//!
//! **Leader hints.** Any control-plane node serves every call (followers forward writes to the
//! leader). When one cannot, it answers UNAVAILABLE with the leader's `host:port` in the
//! `x-nereid-leader` metadata ([`LEADER_HINT`]); the client tries that node next. It follows a
//! hint only to a node in the configured list: the list is where the operator agreed to send
//! the bearer token, and a hint comes from a response. An unlisted leader is still reported
//! ([`PassError::Exhausted`]'s `leader`), so the operator can add it.
//!
//! **Policies of the callers** (not here):
//!
//! | caller | shape | moves on | gives up |
//! |--------|-------|----------|----------|
//! | `nereid ctl` | `call_each` | UNAVAILABLE | after one pass |
//! | router activations, load/unload | `call_each` | UNAVAILABLE, UNKNOWN | after one pass |
//! | router watch | `attempt` + `fail_over` + `Backoff` | any failure | at shutdown |
//! | agent register, report | `attempt` + `fail_over` + `Backoff` | transient codes | at shutdown |
//! | agent heartbeat | `attempt` + `fail_over` | transient codes | next tick |

#![warn(missing_docs)]

mod address;
mod backoff;
mod client;
mod error;
mod failover;

pub use address::{Address, parse_list, position_of};
pub use backoff::Backoff;
pub use client::{ClientConfig, ControlPlaneClient, FromChannel, error_chain};
pub use error::{ClientError, Failure, PassError};
pub use failover::{LEADER_HINT, Pass, leader_hint, next_after};
