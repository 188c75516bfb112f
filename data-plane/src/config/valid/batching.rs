//! The typed batching policies of a config: `dynamic_batching` (preferred sizes, queue delay,
//! priority levels and their queue policies) and `sequence_batching` (strategy, idle timeout,
//! control tensors with their encoded values, implicit states), each read once from the wire
//! config by [`super::ValidModelConfig`]'s conversion. The scheduler builds its policies from
//! these; nothing here decides anything at run time except [`QueuePolicy::timeout_for`].

use std::time::Duration;

use nereid_proto::DataType;
use nereid_proto::pb::inference::model_queue_policy::TimeoutAction as ConfigTimeoutAction;
use nereid_proto::pb::inference::model_sequence_batching::control::Kind;
use nereid_proto::pb::inference::model_sequence_batching::initial_state::StateData;
use nereid_proto::pb::inference::model_sequence_batching::{Control, StrategyChoice};
use nereid_proto::pb::inference::{ModelDynamicBatching, ModelQueuePolicy, ModelSequenceBatching};

/// Triton's default `max_sequence_idle_microseconds`.
const DEFAULT_IDLE: Duration = Duration::from_secs(1);

/// `dynamic_batching`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DynamicBatching {
    /// Sizes to aim for; positive, sorted ascending, each once.
    pub preferred_batch_sizes: Vec<usize>,
    /// How long the oldest queued request may wait for a batch to fill (`max_queue_delay_microseconds`;
    /// zero: a batch runs as soon as an instance is free).
    pub max_queue_delay: Duration,
    /// Responses leave in the order the requests arrived, even when batches finish out of order.
    pub preserve_ordering: bool,
    /// Number of priority levels (at least 1; level 1 is the highest).
    pub priority_levels: usize,
    /// Level (1-based) of requests without a priority, or with one out of range.
    pub default_priority_level: usize,
    /// Queue policy per level, index 0 = level 1 (the default queue policy where a level has
    /// none of its own).
    pub queue_policies: Vec<QueuePolicy>,
}

impl Default for DynamicBatching {
    /// Triton's default scheduler's queue: one priority level with the default queue policy,
    /// no delay, no preferred sizes.
    fn default() -> Self {
        DynamicBatching {
            preferred_batch_sizes: Vec::new(),
            max_queue_delay: Duration::ZERO,
            preserve_ordering: false,
            priority_levels: 1,
            default_priority_level: 1,
            queue_policies: vec![QueuePolicy::default()],
        }
    }
}

/// What happens to a request whose queue timeout expires.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeoutAction {
    /// Fail it with "Request timeout expired".
    Reject,
    /// Keep it, behind every request that has not timed out.
    Delay,
}

/// One priority level's queue policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueuePolicy {
    /// How long a request may wait in the queue (`default_timeout_microseconds`; `None`: no limit).
    pub default_timeout: Option<Duration>,
    /// A request's own timeout may shorten the default (see [`QueuePolicy::timeout_for`]).
    pub allow_timeout_override: bool,
    /// What happens to a request whose queue timeout expires.
    pub timeout_action: TimeoutAction,
    /// 0 = unbounded.
    pub max_queue_size: usize,
}

impl Default for QueuePolicy {
    fn default() -> Self {
        QueuePolicy {
            default_timeout: None,
            allow_timeout_override: false,
            timeout_action: TimeoutAction::Reject,
            max_queue_size: 0,
        }
    }
}

impl QueuePolicy {
    fn from_wire(p: &ModelQueuePolicy) -> QueuePolicy {
        QueuePolicy {
            default_timeout: (p.default_timeout_microseconds > 0)
                .then(|| Duration::from_micros(p.default_timeout_microseconds)),
            allow_timeout_override: p.allow_timeout_override,
            timeout_action: if p.timeout_action == ConfigTimeoutAction::Delay as i32 {
                TimeoutAction::Delay
            } else {
                TimeoutAction::Reject
            },
            max_queue_size: usize::try_from(p.max_queue_size).unwrap_or(usize::MAX),
        }
    }

    /// The queue timeout of a request that asked for `requested_us` (0 = none): the default,
    /// or the request's own when overriding is allowed and it is shorter than the default.
    pub fn timeout_for(&self, requested_us: u64) -> Option<Duration> {
        let requested = (requested_us > 0).then(|| Duration::from_micros(requested_us));
        match (self.allow_timeout_override, requested, self.default_timeout) {
            (true, Some(r), None) => Some(r),
            (true, Some(r), Some(d)) => Some(r.min(d)),
            (_, _, d) => d,
        }
    }
}

impl DynamicBatching {
    pub(super) fn from_wire(db: &ModelDynamicBatching) -> DynamicBatching {
        let levels = usize::try_from(db.priority_levels).unwrap_or(1).max(1);
        let default_level = usize::try_from(db.default_priority_level)
            .unwrap_or(1)
            .clamp(1, levels);
        let default_policy = db
            .default_queue_policy
            .as_ref()
            .map(QueuePolicy::from_wire)
            .unwrap_or_default();
        let queue_policies = (1..=levels)
            .map(|level| {
                db.priority_queue_policy
                    .get(&(level as u64))
                    .map(QueuePolicy::from_wire)
                    .unwrap_or_else(|| default_policy.clone())
            })
            .collect();
        DynamicBatching {
            preferred_batch_sizes: preferred_sizes(&db.preferred_batch_size),
            max_queue_delay: Duration::from_micros(db.max_queue_delay_microseconds),
            preserve_ordering: db.preserve_ordering,
            priority_levels: levels,
            default_priority_level: default_level,
            queue_policies,
        }
    }
}

/// Positive sizes, sorted ascending, each once.
fn preferred_sizes(sizes: &[i32]) -> Vec<usize> {
    let mut preferred: Vec<usize> = sizes
        .iter()
        .filter_map(|&s| usize::try_from(s).ok())
        .filter(|&s| s > 0)
        .collect();
    preferred.sort_unstable();
    preferred.dedup();
    preferred
}

/// `sequence_batching`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SequenceBatching {
    /// How sequences are placed on instances and batched.
    pub strategy: SequenceStrategy,
    /// A sequence without a request for this long is released (Triton's default: 1 s).
    pub max_idle: Duration,
    /// The names of the control inputs (start, end, ready, correlation id).
    pub control_inputs: Vec<String>,
    /// The control tensors the batcher generates, one per known control kind.
    pub controls: Vec<SequenceControl>,
    /// Implicit state: the input the state is fed through, the output it is read from.
    pub states: Vec<StateIo>,
    /// `iterative_sequence`: the model may hand a request back to run again (Triton's
    /// request rescheduling).
    pub iterative: bool,
}

/// How sequences are placed on instances.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SequenceStrategy {
    /// Each live sequence holds one batch slot of one instance until it ends.
    Direct {
        /// How long a batch may wait for more slots to have work (0: never waits).
        max_queue_delay: Duration,
        /// The fraction of an instance's slots that must have work before its batch runs
        /// without waiting out `max_queue_delay` (0: never waits).
        minimum_slot_utilization: Utilization,
    },
    /// Up to `max_candidates` live sequences; each round batches the oldest ready requests.
    Oldest {
        /// The most sequences that may be live at once; further sequences wait for one to end.
        max_candidates: usize,
        /// Batch sizes to aim for; positive, sorted ascending, each once.
        preferred_batch_sizes: Vec<usize>,
        /// How long the oldest ready request may wait for a batch to fill (zero: never waits).
        max_queue_delay: Duration,
        /// Answers leave in the order the requests were accepted, across sequences.
        preserve_ordering: bool,
    },
}

impl SequenceStrategy {
    /// `direct` without a queue delay (Triton's default strategy).
    pub const DIRECT: SequenceStrategy = SequenceStrategy::Direct {
        max_queue_delay: Duration::ZERO,
        minimum_slot_utilization: Utilization(0.0),
    };
}

/// A fraction in [0, 1] (`minimum_slot_utilization`), compared by its bits so configs stay `Eq`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Utilization(pub f32);

impl PartialEq for Utilization {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}

impl Eq for Utilization {}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
/// Which sequence control signal a control tensor carries (`control_input.control.kind`).
pub enum ControlKind {
    /// `CONTROL_SEQUENCE_START`: true on a sequence's first request.
    Start,
    /// `CONTROL_SEQUENCE_READY`: true on every request that carries work for its slot.
    Ready,
    /// `CONTROL_SEQUENCE_END`: true on a sequence's last request.
    End,
    /// `CONTROL_SEQUENCE_CORRID`: the request's correlation id.
    CorrId,
}

/// One control tensor the sequence batcher generates for every request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SequenceControl {
    /// The model input the control tensor is fed through.
    pub name: String,
    /// The control signal the tensor carries.
    pub kind: ControlKind,
    /// The tensor's element type (the config's `data_type`, or the type of its `int32_false_true`,
    /// `fp32_false_true` or `bool_false_true` values).
    pub datatype: DataType,
    /// Encoded `false` and `true` values (boolean kinds only; empty for CORRID).
    pub values: [Vec<u8>; 2],
}

/// One implicit state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateIo {
    /// The model input a request's state is fed through (`state.input_name`).
    pub input_name: String,
    /// The model output the next state is read from (`state.output_name`).
    pub output_name: String,
    /// The type of the state a sequence starts with (the first `initial_state`'s, else the
    /// state's).
    pub datatype: DataType,
    /// The shape a sequence's state starts with, without the batch dimension; a variable
    /// dimension starts at 1.
    pub initial_dims: Vec<i64>,
    /// `initial_state { data_file }`: the file under the model directory's `initial_state/`
    /// folder that holds the initial value (`None`: zeros).
    pub initial_file: Option<String>,
}

impl SequenceBatching {
    pub(super) fn from_wire(sb: &ModelSequenceBatching) -> SequenceBatching {
        let strategy = match &sb.strategy_choice {
            None => SequenceStrategy::DIRECT,
            Some(StrategyChoice::Direct(d)) => SequenceStrategy::Direct {
                max_queue_delay: Duration::from_micros(d.max_queue_delay_microseconds),
                minimum_slot_utilization: Utilization(d.minimum_slot_utilization.clamp(0.0, 1.0)),
            },
            Some(StrategyChoice::Oldest(o)) => SequenceStrategy::Oldest {
                max_candidates: usize::try_from(o.max_candidate_sequences).unwrap_or(0),
                preferred_batch_sizes: preferred_sizes(&o.preferred_batch_size),
                max_queue_delay: Duration::from_micros(o.max_queue_delay_microseconds),
                preserve_ordering: o.preserve_ordering,
            },
        };
        let controls = sb
            .control_input
            .iter()
            .flat_map(|input| input.control.iter().filter_map(|c| control(&input.name, c)))
            .collect();
        let states = sb
            .state
            .iter()
            .map(|s| {
                let (datatype, dims) = match s.initial_state.first() {
                    Some(init) => (init.data_type, &init.dims),
                    None => (s.data_type, &s.dims),
                };
                let initial_file = s.initial_state.first().and_then(|i| match &i.state_data {
                    Some(StateData::DataFile(file)) => Some(file.clone()),
                    Some(StateData::ZeroData(_)) | None => None,
                });
                StateIo {
                    input_name: s.input_name.clone(),
                    output_name: s.output_name.clone(),
                    datatype: DataType::from_config_i32(datatype).unwrap_or(DataType::Fp32),
                    initial_dims: dims.iter().map(|&d| if d < 0 { 1 } else { d }).collect(),
                    initial_file,
                }
            })
            .collect();
        SequenceBatching {
            strategy,
            max_idle: match sb.max_sequence_idle_microseconds {
                0 => DEFAULT_IDLE,
                us => Duration::from_micros(us),
            },
            control_inputs: sb.control_input.iter().map(|c| c.name.clone()).collect(),
            controls,
            states,
            iterative: sb.iterative_sequence,
        }
    }
}

fn control(name: &str, c: &Control) -> Option<SequenceControl> {
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
    Some(SequenceControl {
        name: name.to_string(),
        kind,
        datatype,
        values,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeout_override_may_only_shorten() {
        let p = QueuePolicy {
            default_timeout: Some(Duration::from_micros(100)),
            allow_timeout_override: true,
            ..Default::default()
        };
        assert_eq!(p.timeout_for(50), Some(Duration::from_micros(50)));
        assert_eq!(p.timeout_for(500), Some(Duration::from_micros(100)));
        assert_eq!(p.timeout_for(0), Some(Duration::from_micros(100)));
        let strict = QueuePolicy {
            allow_timeout_override: false,
            ..p.clone()
        };
        assert_eq!(strict.timeout_for(50), Some(Duration::from_micros(100)));
        let none = QueuePolicy {
            allow_timeout_override: true,
            ..Default::default()
        };
        assert_eq!(none.timeout_for(70), Some(Duration::from_micros(70)));
        assert_eq!(QueuePolicy::default().timeout_for(70), None);
    }

    #[test]
    fn preferred_sizes_are_positive_sorted_and_unique() {
        assert_eq!(preferred_sizes(&[8, 0, 4, -2, 8]), vec![4, 8]);
    }
}
