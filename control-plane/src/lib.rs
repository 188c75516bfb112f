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
//! The two decision cores are pure and tested without sockets: [`state`] applies commands to the
//! registry and bumps one global revision; [`placement`] computes the desired placement from
//! views of nodes, models, the current placement and load. Networking, consensus and storage
//! wrap around them.

pub mod api;
pub mod cluster;
pub mod consensus;
pub mod convert;
pub mod forward;
pub mod leader;
pub mod metrics;
pub mod node;
pub mod placement;
pub mod raft;
pub mod source;
pub mod state;
#[cfg(test)]
pub(crate) mod testing;
pub mod units;
pub mod views;
pub mod watch;
