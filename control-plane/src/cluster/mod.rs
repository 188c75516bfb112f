//! What workers and routers talk to: the `Cluster` gRPC service ([`service`]). A follower passes
//! leader-only calls on through [`crate::forward`].

pub mod service;

#[cfg(test)]
mod tests;
