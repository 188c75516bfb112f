//! The scheduling policy of a model version, from the typed batching policies of its
//! [`ValidModelConfig`]: how batches form (`dynamic_batching`, or Triton's default scheduler
//! when absent; `sequence_batching` hands the version to the sequence batcher) and each priority
//! level's queue policy (timeouts, timeout action, maximum queue size).

use std::path::Path;

use crate::config::{DynamicBatching, RaggedBatching, ValidModelConfig};

use super::sequence::SequencePolicy;

/// How a model version's requests are queued and batched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchPolicy {
    /// `false`: Triton's default scheduler, each request runs alone, in arrival order.
    pub dynamic: bool,
    /// Largest batch (sum of request batch sizes); 0 for models without batching.
    pub max_batch_size: usize,
    /// The config's `dynamic_batching`; without one, Triton's default scheduler's queue: one
    /// priority level, no delay, no preferred sizes.
    pub batching: DynamicBatching,
    /// Present when the config has `sequence_batching`: the sequence batcher replaces the queue.
    pub sequence: Option<SequencePolicy>,
    /// Ragged inputs, batch inputs and batch outputs (empty for most models): which inputs
    /// stay out of the shape key, and what the engine generates and scatters per batch.
    pub ragged: RaggedBatching,
}

impl BatchPolicy {
    /// The policy of a version of the model in `model_dir`: [`BatchPolicy::from_config`], with
    /// the sequence batcher's `initial_state` data files read. `Err` is the load failure reason.
    pub fn load(config: &ValidModelConfig, model_dir: &Path) -> Result<BatchPolicy, String> {
        let mut policy = BatchPolicy::from_config(config);
        if policy.sequence.is_some() {
            policy.sequence = SequencePolicy::load(config, model_dir)?;
        }
        Ok(policy)
    }

    /// The policy of a validated config; sequence states start from zeros even where they
    /// name a `data_file` (see [`BatchPolicy::load`]).
    pub fn from_config(config: &ValidModelConfig) -> BatchPolicy {
        let max_batch_size = config.max_batch_size as usize;
        match config.dynamic() {
            Some(db) => BatchPolicy {
                dynamic: max_batch_size > 0,
                max_batch_size,
                batching: db.clone(),
                sequence: None,
                ragged: config.ragged.clone(),
            },
            None => BatchPolicy {
                dynamic: false,
                max_batch_size,
                batching: DynamicBatching::default(),
                sequence: SequencePolicy::from_config(config),
                ragged: config.ragged.clone(),
            },
        }
    }

    /// The 0-based level index of a request priority (0 or out of range = the default level),
    /// as Triton assigns it.
    pub fn level_index(&self, priority: u64) -> usize {
        let level = usize::try_from(priority).unwrap_or(0);
        let level = if level == 0 || level > self.batching.priority_levels {
            self.batching.default_priority_level
        } else {
            level
        };
        level - 1
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::TimeoutAction;
    use crate::config::text::parse_model_config;

    fn policy(text: &str) -> BatchPolicy {
        BatchPolicy::from_config(&ValidModelConfig::unchecked(
            parse_model_config(text).unwrap(),
        ))
    }

    #[test]
    fn reads_dynamic_batching_and_queue_policies() {
        let p = policy(
            r#"max_batch_size: 16
               dynamic_batching {
                 preferred_batch_size: [ 8, 4 ] max_queue_delay_microseconds: 500
                 priority_levels: 3 default_priority_level: 2
                 default_queue_policy { max_queue_size: 10 default_timeout_microseconds: 1000 allow_timeout_override: true }
                 priority_queue_policy { key: 1 value: { timeout_action: DELAY } }
               }"#,
        );
        assert!(p.dynamic);
        assert_eq!(p.batching.preferred_batch_sizes, vec![4, 8]);
        assert_eq!(p.batching.max_queue_delay, Duration::from_micros(500));
        assert_eq!(p.batching.queue_policies.len(), 3);
        assert_eq!(
            p.batching.queue_policies[0].timeout_action,
            TimeoutAction::Delay
        );
        assert_eq!(p.batching.queue_policies[1].max_queue_size, 10);
        assert_eq!(p.level_index(0), 1);
        assert_eq!(p.level_index(1), 0);
        assert_eq!(p.level_index(9), 1);
    }

    #[test]
    fn no_dynamic_batching_is_the_default_scheduler() {
        let p = policy("max_batch_size: 8");
        assert!(!p.dynamic);
        assert_eq!(p.batching.priority_levels, 1);
    }
}
