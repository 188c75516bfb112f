//! The management API: what operators and `nereid ctl` call, over gRPC
//! (`nereid.cluster.v1.Management`) and its REST/JSON mirror (`/api/v1/...`).
//!
//! ```text
//!  gRPC Management ─┐                      ┌─ reads:  consensus.local_state() (LOCAL)
//!  (auth::Guarded:  ├─► ManagementService ─┤          consensus.linearizable_state() (LINEARIZABLE)
//!   token + role)   │   (one method per    ├─ writes: consensus.write(Command) (forwarded to the leader)
//!  REST router ─────┘    RPC, pb in/out)   └─ soft state: Observations (utilization, history, load)
//!  (require_token)            │
//!                             └─ errors: ApiError ─► tonic::Status | HTTP status + {"error"}
//! ```
//!
//! Both transports call the same [`ManagementService`] methods, so validation, defaults and
//! errors are identical; each transport maps [`ApiError`] once ([`error`]).

pub mod auth;
mod autoscale;
pub mod error;
mod models;
mod nodes;
pub mod rest;
pub mod service;
mod source;

#[cfg(test)]
mod rest_tests;
#[cfg(test)]
mod role_tests;
#[cfg(test)]
mod tests;

pub use auth::AuthToken;
