//! What the sequence batcher feeds a model besides the client's inputs, read once from the
//! config's `sequence_batching`: the control tensors (START / READY / END / CORRID) and the
//! implicit state inputs, with their initial values.
//!
//! ```text
//!  request inputs ─┐
//!  controls(flags) ├─► one request's full input list (sorted by name, so requests batch)
//!  state (START: initial, else the previous state output) ─┘
//! ```

use std::time::Duration;

use bytes::Bytes;
use nereid_proto::pb::inference::ModelConfig;
use nereid_proto::pb::inference::model_config::SchedulingChoice;
use nereid_proto::pb::inference::model_sequence_batching::control::Kind;
use nereid_proto::pb::inference::model_sequence_batching::{Control, StrategyChoice};
use nereid_proto::{CorrelationId, DataType, ServiceError, Tensor, element_count};

use crate::request_check::SequenceFlags;

/// Triton's default `max_sequence_idle_microseconds`.
const DEFAULT_IDLE: Duration = Duration::from_secs(1);

/// How sequences are placed on instances.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Strategy {
    /// Each live sequence holds one batch slot of one instance until it ends.
    Direct,
    /// Up to `max_candidates` live sequences; each round batches the oldest ready requests.
    Oldest {
        max_candidates: usize,
        preferred_batch_sizes: Vec<usize>,
        max_queue_delay: Duration,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ControlKind {
    Start,
    Ready,
    End,
    CorrId,
}

/// One control tensor the server generates for every request.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ControlTensor {
    name: String,
    kind: ControlKind,
    datatype: DataType,
    /// Encoded `false` and `true` values (boolean kinds only).
    values: [Vec<u8>; 2],
}

/// One implicit state: fed as `input`, read back from `output`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateSpec {
    pub input: String,
    pub output: String,
    datatype: DataType,
    /// Shape of the initial value, without the batch dimension.
    dims: Vec<i64>,
}

/// The config's `sequence_batching`, ready for the scheduler.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SequencePolicy {
    pub strategy: Strategy,
    /// A sequence without a request for this long is released.
    pub max_idle: Duration,
    controls: Vec<ControlTensor>,
    pub states: Vec<StateSpec>,
    /// `max_batch_size > 0`: generated tensors carry a batch dimension of 1.
    batching: bool,
}

impl SequencePolicy {
    /// `None` unless the (validated) config has `sequence_batching`.
    pub fn from_config(config: &ModelConfig) -> Option<SequencePolicy> {
        let Some(SchedulingChoice::SequenceBatching(sb)) = &config.scheduling_choice else {
            return None;
        };
        let max_batch = usize::try_from(config.max_batch_size).unwrap_or(0);
        let strategy = match &sb.strategy_choice {
            None | Some(StrategyChoice::Direct(_)) => Strategy::Direct,
            Some(StrategyChoice::Oldest(o)) => {
                let mut preferred: Vec<usize> = o
                    .preferred_batch_size
                    .iter()
                    .filter_map(|&s| usize::try_from(s).ok())
                    .filter(|&s| s > 0)
                    .collect();
                preferred.sort_unstable();
                preferred.dedup();
                Strategy::Oldest {
                    max_candidates: usize::try_from(o.max_candidate_sequences).unwrap_or(0),
                    preferred_batch_sizes: preferred,
                    max_queue_delay: Duration::from_micros(o.max_queue_delay_microseconds),
                }
            }
        };
        let controls = sb
            .control_input
            .iter()
            .flat_map(|input| {
                input
                    .control
                    .iter()
                    .filter_map(|c| control_tensor(&input.name, c))
            })
            .collect();
        let states = sb
            .state
            .iter()
            .map(|s| {
                let (datatype, dims) = match s.initial_state.first() {
                    Some(init) => (init.data_type, init.dims.clone()),
                    None => (s.data_type, s.dims.clone()),
                };
                StateSpec {
                    input: s.input_name.clone(),
                    output: s.output_name.clone(),
                    datatype: DataType::from_config_i32(datatype).unwrap_or(DataType::Fp32),
                    // A variable dimension starts at 1.
                    dims: dims.iter().map(|&d| if d < 0 { 1 } else { d }).collect(),
                }
            })
            .collect();
        Some(SequencePolicy {
            strategy,
            max_idle: match sb.max_sequence_idle_microseconds {
                0 => DEFAULT_IDLE,
                us => Duration::from_micros(us),
            },
            controls,
            states,
            batching: max_batch > 0,
        })
    }

    /// Refuses a correlation id the model's CORRID control cannot carry.
    pub fn check_id(&self, model: &str, id: &CorrelationId) -> Result<(), ServiceError> {
        for c in self
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
        self.controls
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
        self.states
            .iter()
            .filter_map(|s| {
                let shape = self.with_batch(s.dims.clone());
                let count = element_count(&shape)?;
                // A zero length prefix is an empty BYTES element, so zeros work for every type.
                let bytes = count * s.datatype.element_size().unwrap_or(4);
                Tensor::new(
                    s.input.clone(),
                    s.datatype,
                    shape,
                    Bytes::from(vec![0u8; bytes]),
                )
                .ok()
            })
            .collect()
    }

    fn with_batch(&self, mut dims: Vec<i64>) -> Vec<i64> {
        if self.batching {
            dims.insert(0, 1);
        }
        dims
    }
}

fn control_tensor(name: &str, c: &Control) -> Option<ControlTensor> {
    let kind = match Kind::try_from(c.kind).ok()? {
        Kind::ControlSequenceStart => ControlKind::Start,
        Kind::ControlSequenceReady => ControlKind::Ready,
        Kind::ControlSequenceEnd => ControlKind::End,
        Kind::ControlSequenceCorrid => ControlKind::CorrId,
    };
    let (datatype, values) = if kind == ControlKind::CorrId {
        (
            DataType::from_config_i32(c.data_type)?,
            [Vec::new(), Vec::new()],
        )
    } else if let [f, t] = c.int32_false_true[..] {
        (
            DataType::Int32,
            [f.to_le_bytes().to_vec(), t.to_le_bytes().to_vec()],
        )
    } else if let [f, t] = c.fp32_false_true[..] {
        (
            DataType::Fp32,
            [f.to_le_bytes().to_vec(), t.to_le_bytes().to_vec()],
        )
    } else if let [f, t] = c.bool_false_true[..] {
        (DataType::Bool, [vec![u8::from(f)], vec![u8::from(t)]])
    } else {
        return None;
    };
    Some(ControlTensor {
        name: name.to_string(),
        kind,
        datatype,
        values,
    })
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
    use super::*;
    use crate::config::text::parse_model_config;

    fn policy(batch: i32) -> SequencePolicy {
        let c = parse_model_config(&format!(
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
        .unwrap();
        SequencePolicy::from_config(&c).unwrap()
    }

    #[test]
    fn builds_controls_with_the_configured_values() {
        let p = policy(4);
        assert_eq!(p.max_idle, Duration::from_micros(5000));
        assert_eq!(p.strategy, Strategy::Direct);
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
