//! Nereid's control plane: the replicated source of truth for which models exist, which nodes
//! serve, and where each model's replicas run.
//!
//! ```text
//!  management API ─► command ─► (replicated log, later: openraft) ─► state::apply (pure)
//!                                                                       │
//!  heartbeats (soft state: liveness, load) ──► placement::plan (pure) ◄─┘ models, nodes, replicas
//!                                                  │
//!                                                  └► commands that move replicas + explanations
//! ```
//!
//! The two decision cores are pure and tested without sockets: `state` applies commands to the
//! registry and bumps one global revision; `placement` (the crate `nereid-placement`, which the
//! load generator's simulator runs too) computes the desired placement from
//! views of nodes, models, the current placement and load. Networking, consensus and storage
//! wrap around them.
//!
//! The modules are private; what other crates use is re-exported here:
//!
//! - [`NodeConfig`], [`run`] (and [`serve`] on listeners already bound, [`Listeners`]):
//!   `nereid control-plane`'s life; [`NodeError`] when it cannot start.
//! - [`AuthToken`]: the management API's bearer token, part of [`NodeConfig`].
//! - [`Store`], [`EtcdConfig`]: where the state of record lives (Nereid's Raft, or etcd).
//! - [`parse_bytes`]: byte sizes as the flags write them (`512Mi`, `16Gi`).

#![warn(missing_docs)]

mod api;
mod autoscale;
mod cluster;
mod consensus;
mod convert;
mod etcd;
mod forward;
#[doc(hidden)]
pub mod fuzzing;
mod leader;
mod metrics;
mod node;
mod raft;
mod source;
mod state;
#[cfg(test)]
mod testing;
mod views;
mod watch;

pub use api::AuthToken;
pub use etcd::{EtcdConfig, EtcdTls};
pub use nereid_placement::parse_bytes;
pub use node::{Listeners, NodeConfig, NodeError, Store, run, serve};
