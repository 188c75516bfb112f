//! Ensembles (`platform: "ensemble"`): a DAG of composing models wired by tensor names.
//!
//! ```text
//! load:    config ─► config::ensemble_graph::analyze (steps, producers, order; no other model
//!               needed; also run by validation)
//!               ─► plan::plan (with the composing models' configs: names, types, shapes,
//!                  batch sizes, decoupled) ─► EnsemblePlan, kept in the LoadedVersion
//! request: request_check (ensemble inputs) ─► execute::execute:
//!            start every step whose inputs exist ─► step = one InferRequest to the composing
//!            model through the data plane's own infer (its scheduler batches it with other
//!            traffic) ─► its outputs become ensemble tensors ─► start what is now ready
//!          ─► the requested ensemble outputs
//! decoupled ensemble (a decoupled step; origin::analyze at load): stream::execute_stream:
//!            flow::Flow numbers iterations (each response of a decoupled step is one more),
//!            runs each step once per iteration, streams each complete response
//! ```
//!
//! An ensemble has no instances and no scheduler of its own. A step's `input_map` maps the
//! composing model's input name (key) to an ensemble tensor (value); `output_map` maps the
//! composing model's output (key) to the ensemble tensor it becomes (value). Every tensor has
//! exactly one producer: an ensemble input or one step.

pub mod execute;
pub mod flow;
pub mod limit;
pub mod origin;
pub mod plan;
pub mod stream;

pub use execute::{EnsembleRequest, execute};
pub use plan::{EnsemblePlan, completed_config, plan};
pub use stream::{EnsembleStreamed, StepStream, execute_stream};

/// The `platform` of ensemble configs (defined in `config`, which validates them).
pub use crate::config::ENSEMBLE_PLATFORM as PLATFORM;
pub(crate) use crate::config::ensemble_graph::step_label;
