//! The scheduler end to end with mock backend instances, on its engine's real threads: the
//! dynamic batcher ([`dynamic`]), ragged batching through it ([`ragged`]), the sequence
//! batcher ([`sequence`]) and request rescheduling ([`reschedule`]). The pure decisions under
//! them are tested beside their code (`queue.rs`, `ragged.rs`, `sequence/slots/tests.rs`).

mod dynamic;
mod ragged;
mod reschedule;
mod sequence;
