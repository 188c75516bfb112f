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
//! registry and bumps one global revision; `placement` computes the desired placement from
//! views of nodes, models, the current placement and load. Networking, consensus and storage
//! wrap around them.
//!
//! The modules are private; what other crates use is re-exported here:
//!
//! - [`NodeConfig`], [`run`] (and [`serve`] on listeners already bound, [`Listeners`]):
//!   `nereid control-plane`'s life; [`NodeError`] when it cannot start.
//! - [`AuthToken`]: the management API's bearer token, part of [`NodeConfig`].
//! - [`Store`], [`EtcdConfig`]: where the state of record lives (Nereid's Raft, or etcd).
//! - [`plan`] over [`NodeView`], [`ModelView`], [`CurrentReplica`] and [`Load`], giving a
//!   [`Plan`]: the pure placement core, which `nereid-loadtest placement-sim` times.
//! - [`parse_bytes`]: byte sizes as the flags write them (`512Mi`, `16Gi`).

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
mod placement;
mod raft;
mod source;
mod state;
#[cfg(test)]
mod testing;
mod units;
mod views;
mod watch;

pub use api::AuthToken;
pub use etcd::{EtcdConfig, EtcdTls};
pub use node::{Listeners, NodeConfig, NodeError, Store, run, serve};
pub use placement::{CurrentReplica, Load, ModelView, NodeView, Plan, plan};
pub use units::parse_bytes;
