//! The scheduler end to end with mock backend instances, on its engine's real threads: the
//! dynamic batcher ([`dynamic`]), ragged batching through it ([`ragged`]) and the sequence
//! batcher ([`sequence`]). The pure decisions under them are tested beside their code
//! (`queue.rs`, `ragged.rs`, `sequence/slots/tests.rs`).

mod dynamic;
mod ragged;
mod sequence;
