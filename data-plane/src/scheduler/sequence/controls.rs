//! What the sequence batcher feeds a model besides the client's inputs, from the typed
//! `sequence_batching` of the model's [`ValidModelConfig`]: the control tensors (START / READY /
//! END / CORRID) and the implicit state inputs, with their initial values.
//!
//! ```text
//!  request inputs ─┐
//!  controls(flags) ├─► one request's full input list (sorted by name, so requests batch)
//!  state (START: initial, else the previous state output) ─┘
//! ```
//!
//! A state's initial value is zeros (empty strings for `STRING`), or with `initial_state {
//! data_file }` the raw little-endian bytes of `<model_dir>/initial_state/<data_file>`, read once
//! when the version loads ([`SequencePolicy::load`]), as Triton reads them.

use std::path::Path;

use bytes::Bytes;
use nereid_proto::{CorrelationId, DataType, ServiceError, Tensor, element_count};

use crate::config::{ControlKind, SequenceBatching, SequenceStrategy, ValidModelConfig};
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
    /// Per state (in `batching.states` order), the bytes of its initial value without the
    /// batch dimension: zeros, or its `data_file`'s contents.
    initial: Vec<Bytes>,
}

/// The folder under the model directory that holds `initial_state` data files (Triton's).
pub const INITIAL_STATE_FOLDER: &str = "initial_state";

impl SequencePolicy {
    /// `None` unless the config has `sequence_batching`.
    pub fn from_config(config: &ValidModelConfig) -> Option<SequencePolicy> {
        let sb = config.sequence()?;
        let initial = sb
            .states
            .iter()
            .map(|s| Bytes::from(vec![0u8; item_bytes(s.datatype, &s.initial_dims)]))
            .collect();
        Some(SequencePolicy {
            batching: sb.clone(),
            batch_dim: config.batching(),
            ragged_inputs: config.ragged.ragged_inputs.clone(),
            initial,
        })
    }

    /// [`SequencePolicy::from_config`], with the initial states that name a `data_file` read
    /// from `<model_dir>/initial_state/`. `Err` is the version's load failure reason, in
    /// Triton's words: the file cannot be read, or is shorter than the state's byte size.
    pub fn load(
        config: &ValidModelConfig,
        model_dir: &Path,
    ) -> Result<Option<SequencePolicy>, String> {
        let Some(mut policy) = SequencePolicy::from_config(config) else {
            return Ok(None);
        };
        for (state, initial) in policy.batching.states.iter().zip(&mut policy.initial) {
            let Some(file) = &state.initial_file else {
                continue;
            };
            // Triton zeroes a STRING state whatever its initial value: empty strings.
            if state.datatype == DataType::Bytes {
                continue;
            }
            let path = model_dir.join(INITIAL_STATE_FOLDER).join(file);
            let data = std::fs::read(&path).map_err(|e| {
                format!(
                    "failed to open text file for read {}: {}",
                    path.display(),
                    os_error_text(&e)
                )
            })?;
            let expected = initial.len();
            if data.len() < expected {
                return Err(format!(
                    "initial_state setting expects {expected} bytes, but the data provided from {file} only has {} bytes.",
                    data.len()
                ));
            }
            *initial = Bytes::from(data).slice(..expected);
        }
        Ok(Some(policy))
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

    /// The state inputs a START request begins with: zeros (empty strings for STRING), or
    /// the contents of the state's `data_file`.
    pub fn initial_states(&self) -> Vec<Tensor> {
        self.batching
            .states
            .iter()
            .zip(&self.initial)
            .filter_map(|(s, data)| {
                let shape = self.with_batch(s.initial_dims.clone());
                Tensor::new(s.input_name.clone(), s.datatype, shape, data.clone()).ok()
            })
            .collect()
    }

    /// The inputs of a dummy request that pads a `direct` batch, shaped as `representative`
    /// (a request of the batch, with its controls and state): its controls say not READY (and
    /// not START or END, CORRID 0), every other input and the state are zeros (empty strings).
    pub fn padding_inputs(&self, representative: &[Tensor]) -> Vec<Tensor> {
        representative
            .iter()
            .filter_map(|t| {
                let control = self.batching.controls.iter().find(|c| c.name == t.name());
                let data = match control {
                    Some(c) if c.kind == ControlKind::CorrId => {
                        corrid_bytes(c.datatype, &CorrelationId::Uint(0))
                    }
                    Some(c) => c.values[0].clone(),
                    None => vec![0u8; t.element_count() * t.datatype().element_size().unwrap_or(4)],
                };
                Tensor::new(
                    t.name(),
                    t.datatype(),
                    t.shape().to_vec(),
                    Bytes::from(data),
                )
                .ok()
            })
            .collect()
    }

    /// Whether input `name` is one the batcher generates (a control or a state input), not
    /// the client's.
    pub fn generates(&self, name: &str) -> bool {
        self.batching.controls.iter().any(|c| c.name == name)
            || self.batching.states.iter().any(|s| s.input_name == name)
    }

    /// Whether batches are padded to fixed slot positions: `direct` with batching.
    pub fn pads(&self) -> bool {
        self.batch_dim && matches!(self.batching.strategy, SequenceStrategy::Direct { .. })
    }

    fn with_batch(&self, mut dims: Vec<i64>) -> Vec<i64> {
        if self.batch_dim {
            dims.insert(0, 1);
        }
        dims
    }
}

/// The byte size of one item of a state (a zero length prefix is an empty BYTES element, so
/// zeros work for every type).
fn item_bytes(datatype: DataType, dims: &[i64]) -> usize {
    element_count(dims).unwrap_or(0) * datatype.element_size().unwrap_or(4)
}

/// An I/O error as the C library words it ("No such file or directory"), as in Triton's message.
fn os_error_text(e: &std::io::Error) -> String {
    let text = e.to_string();
    match text.find(" (os error") {
        Some(cut) => text[..cut].to_string(),
        None => text,
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
        assert_eq!(p.batching.strategy, SequenceStrategy::DIRECT);
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

    /// A batching model with one INT32 state `si` [2] whose initial value is `initial`.
    fn with_initial(initial: &str) -> ValidModelConfig {
        ValidModelConfig::unchecked(
            parse_model_config(&format!(
                r#"max_batch_size: 2
                   sequence_batching {{
                     control_input [{{name: "R" control [{{kind: CONTROL_SEQUENCE_READY int32_false_true: [0, 1]}}]}},
                                    {{name: "C" control [{{kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64}}]}}]
                     state [{{input_name: "si" output_name: "so" data_type: TYPE_INT32 dims: [2]
                             initial_state {{ name: "i" data_type: TYPE_INT32 dims: [2] {initial} }} }}]
                   }}"#
            ))
            .unwrap(),
        )
    }

    #[test]
    fn initial_state_comes_from_the_data_file_under_initial_state() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join(INITIAL_STATE_FOLDER);
        std::fs::create_dir(&folder).unwrap();
        let values: Vec<u8> = [7i32, -3, 99]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        // Longer than needed: the first bytes are used, as in Triton.
        std::fs::write(folder.join("init.bin"), &values).unwrap();
        let c = with_initial(r#"data_file: "init.bin""#);
        let p = SequencePolicy::load(&c, dir.path()).unwrap().unwrap();
        let s = p.initial_states();
        assert_eq!((s[0].name(), s[0].shape()), ("si", &[1i64, 2][..]));
        assert_eq!(s[0].data().as_ref(), &values[..8]);
        // zero_data (and from_config, which reads no file) start from zeros.
        let z = SequencePolicy::load(&with_initial("zero_data: true"), dir.path());
        assert_eq!(
            z.unwrap().unwrap().initial_states()[0].data().as_ref(),
            &[0u8; 8]
        );
    }

    #[test]
    fn a_missing_or_short_initial_state_file_fails_the_load() {
        let dir = tempfile::tempdir().unwrap();
        let c = with_initial(r#"data_file: "init.bin""#);
        let e = SequencePolicy::load(&c, dir.path()).unwrap_err();
        let path = dir.path().join("initial_state").join("init.bin");
        assert_eq!(
            e,
            format!(
                "failed to open text file for read {}: No such file or directory",
                path.display()
            )
        );
        std::fs::create_dir(dir.path().join("initial_state")).unwrap();
        std::fs::write(&path, [1u8, 2, 3]).unwrap();
        let e = SequencePolicy::load(&c, dir.path()).unwrap_err();
        assert_eq!(
            e,
            "initial_state setting expects 8 bytes, but the data provided from init.bin only has 3 bytes."
        );
    }

    #[test]
    fn padding_requests_are_not_ready_zeros_shaped_as_the_batch() {
        let p = SequencePolicy::from_config(&with_initial("zero_data: true")).unwrap();
        let flags = SequenceFlags {
            id: CorrelationId::Uint(5),
            start: false,
            end: false,
        };
        let mut real = p.control_inputs(&flags);
        let input = Tensor::new("x", DataType::Int32, vec![1, 3], Bytes::from(vec![9u8; 12]));
        real.push(input.unwrap());
        let dummy = p.padding_inputs(&real);
        let view: Vec<(&str, &[i64], &[u8])> = dummy
            .iter()
            .map(|t| (t.name(), t.shape(), t.data().as_ref()))
            .collect();
        assert_eq!(
            view,
            vec![
                ("R", &[1i64, 1][..], &0i32.to_le_bytes()[..]),
                ("C", &[1, 1][..], &0u64.to_le_bytes()[..]),
                ("x", &[1, 3][..], &[0u8; 12][..]),
            ]
        );
        assert!(p.pads(), "direct with batching pads");
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
