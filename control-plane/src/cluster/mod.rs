//! What workers and routers talk to: the `Cluster` gRPC service ([`service`]) and the channels a
//! follower uses to pass leader-only calls on ([`forward`]).

pub mod forward;
pub mod service;

#[cfg(test)]
mod tests;
