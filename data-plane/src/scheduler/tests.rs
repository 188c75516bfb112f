//! The scheduler end to end with mock backend instances, on its engine's real threads: the
//! dynamic batcher ([`dynamic`]), ragged batching through it ([`ragged`]), the sequence
//! batcher ([`sequence`]) and request rescheduling ([`reschedule`]). The pure decisions under
//! them are tested beside their code (`queue.rs`, `ragged.rs`, `sequence/slots/tests.rs`).

mod dynamic;
mod ragged;
mod reschedule;
mod sequence;

use crate::config::text::parse_model_config;
use crate::config::{ValidModelConfig, fill_defaults};

/// The valid config `text` describes, defaults filled in as a load fills them.
fn valid_config(text: &str) -> ValidModelConfig {
    let mut wire = parse_model_config(text).unwrap();
    fill_defaults(&mut wire);
    ValidModelConfig::try_from(wire).unwrap()
}
