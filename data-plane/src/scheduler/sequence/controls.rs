//! What the sequence batcher feeds a model besides the client's inputs, from the typed
//! `sequence_batching` of the model's [`ValidModelConfig`]: the control tensors (START / READY /
//! END / CORRID) and the implicit state inputs, with their initial values.
//!
//! ```text
//!  request inputs ─┐
//!  controls(flags) ├─► one request's full input list (sorted by name, so requests batch)
//!  state (START: initial, else the previous state output) ─┘
//! ```

use bytes::Bytes;
use nereid_proto::{CorrelationId, DataType, ServiceError, Tensor, element_count};

use crate::config::{ControlKind, SequenceBatching, ValidModelConfig};
use crate::request_check::SequenceFlags;

/// The config's `sequence_batching`, ready for the scheduler.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SequencePolicy {
    /// The config's `sequence_batching`: strategy, idle release, controls and states.
    pub batching: SequenceBatching,
    /// `max_batch_size > 0`: generated tensors carry a batch dimension of 1.
    batch_dim: bool,
    /// Inputs with `allow_ragged_batch`: requests whose shapes of them differ still batch.
    pub ragged_inputs: Vec<String>,
}

impl SequencePolicy {
    /// `None` unless the config has `sequence_batching`.
    pub fn from_config(config: &ValidModelConfig) -> Option<SequencePolicy> {
        let sb = config.sequence()?;
        Some(SequencePolicy {
            batching: sb.clone(),
            batch_dim: config.batching(),
            ragged_inputs: config.ragged.ragged_inputs.clone(),
        })
    }

    /// Refuses a correlation id the model's CORRID control cannot carry.
    pub fn check_id(&self, model: &str, id: &CorrelationId) -> Result<(), ServiceError> {
        for c in self
            .batching
            .controls
            .iter()
            .filter(|c| c.kind == ControlKind::CorrId)
        {
            if matches!(id, CorrelationId::String(_)) && c.datatype != DataType::Bytes {
                return Err(ServiceError::invalid(format!(
                    "inference request to model '{model}' must specify an integer correlation ID: its control '{}' is {}",
                    c.name, c.datatype
                )));
            }
        }
        Ok(())
    }

    /// The control tensors of one request (READY is always true: only present requests run).
    pub fn control_inputs(&self, flags: &SequenceFlags) -> Vec<Tensor> {
        self.batching
            .controls
            .iter()
            .filter_map(|c| {
                let data = match c.kind {
                    ControlKind::Start => c.values[usize::from(flags.start)].clone(),
                    ControlKind::Ready => c.values[1].clone(),
                    ControlKind::End => c.values[usize::from(flags.end)].clone(),
                    ControlKind::CorrId => corrid_bytes(c.datatype, &flags.id),
                };
                Tensor::new(
                    c.name.clone(),
                    c.datatype,
                    self.with_batch(vec![1]),
                    Bytes::from(data),
                )
                .ok()
            })
            .collect()
    }

    /// The state inputs a START request begins with: zeros (empty strings for STRING).
    pub fn initial_states(&self) -> Vec<Tensor> {
        self.batching
            .states
            .iter()
            .filter_map(|s| {
                let shape = self.with_batch(s.initial_dims.clone());
                let count = element_count(&shape)?;
                // A zero length prefix is an empty BYTES element, so zeros work for every type.
                let bytes = count * s.datatype.element_size().unwrap_or(4);
                Tensor::new(
                    s.input_name.clone(),
                    s.datatype,
                    shape,
                    Bytes::from(vec![0u8; bytes]),
                )
                .ok()
            })
            .collect()
    }

    fn with_batch(&self, mut dims: Vec<i64>) -> Vec<i64> {
        if self.batch_dim {
            dims.insert(0, 1);
        }
        dims
    }
}

fn corrid_bytes(datatype: DataType, id: &CorrelationId) -> Vec<u8> {
    match id {
        CorrelationId::Uint(v) => match datatype {
            DataType::Int64 => (*v as i64).to_le_bytes().to_vec(),
            DataType::Uint32 => (*v as u32).to_le_bytes().to_vec(),
            DataType::Int32 => (*v as i32).to_le_bytes().to_vec(),
            DataType::Bytes => bytes_element(v.to_string().as_bytes()),
            _ => v.to_le_bytes().to_vec(),
        },
        // `check_id` let a string id through only for a STRING control.
        CorrelationId::String(s) => bytes_element(s.as_bytes()),
    }
}

fn bytes_element(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + s.len());
    nereid_proto::push_bytes_element(&mut out, s);
    out
}

/// Triton's spelling of a correlation id in messages.
pub fn id_text(id: &CorrelationId) -> String {
    match id {
        CorrelationId::Uint(v) => v.to_string(),
        CorrelationId::String(s) => s.clone(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::SequenceStrategy;
    use crate::config::text::parse_model_config;

    fn policy(batch: i32) -> SequencePolicy {
        let c = ValidModelConfig::unchecked(parse_model_config(&format!(
            r#"max_batch_size: {batch}
               sequence_batching {{
                 max_sequence_idle_microseconds: 5000
                 control_input [
                   {{name: "S" control [{{kind: CONTROL_SEQUENCE_START fp32_false_true: [0, 1]}}]}},
                   {{name: "E" control [{{kind: CONTROL_SEQUENCE_END bool_false_true: [false, true]}}]}},
                   {{name: "C" control [{{kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_INT32}}]}}
                 ]
                 state [{{input_name: "si" output_name: "so" data_type: TYPE_INT32 dims: [2, -1]}}]
               }}"#
        ))
        .unwrap());
        SequencePolicy::from_config(&c).unwrap()
    }

    #[test]
    fn builds_controls_with_the_configured_values() {
        let p = policy(4);
        assert_eq!(p.batching.max_idle, Duration::from_micros(5000));
        assert_eq!(p.batching.strategy, SequenceStrategy::Direct);
        let flags = SequenceFlags {
            id: CorrelationId::Uint(9),
            start: true,
            end: false,
        };
        let t = p.control_inputs(&flags);
        assert_eq!(t.len(), 3);
        assert_eq!(
            (t[0].name(), t[0].shape(), t[0].data().as_ref()),
            ("S", &[1i64, 1][..], &1f32.to_le_bytes()[..])
        );
        assert_eq!(
            (t[1].name(), t[1].datatype(), t[1].data().as_ref()),
            ("E", DataType::Bool, &[0u8][..])
        );
        assert_eq!(t[2].data().as_ref(), &9i32.to_le_bytes()[..]);
        let s = p.initial_states();
        assert_eq!((s[0].name(), s[0].shape()), ("si", &[1i64, 2, 1][..]));
        assert_eq!(policy(0).control_inputs(&flags)[0].shape(), &[1]);
    }

    #[test]
    fn a_string_id_needs_a_string_corrid() {
        let p = policy(0);
        assert!(p.check_id("m", &CorrelationId::Uint(3)).is_ok());
        let e = p
            .check_id("m", &CorrelationId::String("a".into()))
            .unwrap_err();
        assert!(
            e.message().contains("integer correlation ID"),
            "{}",
            e.message()
        );
    }
}
