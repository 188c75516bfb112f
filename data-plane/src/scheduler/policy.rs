//! The scheduling policy of a model version, read once from its config: how batches form
//! (`dynamic_batching`, or Triton's default scheduler when absent; `sequence_batching` hands the
//! version to the sequence batcher) and each priority level's queue policy (timeouts, timeout
//! action, maximum queue size).

use std::time::Duration;

use nereid_proto::pb::inference::model_config::SchedulingChoice;
use nereid_proto::pb::inference::model_queue_policy::TimeoutAction as ConfigTimeoutAction;
use nereid_proto::pb::inference::{ModelConfig, ModelQueuePolicy};

use super::sequence::SequencePolicy;

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
    pub default_timeout: Option<Duration>,
    pub allow_timeout_override: bool,
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
    fn from_config(p: &ModelQueuePolicy) -> QueuePolicy {
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

/// How a model version's requests are queued and batched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchPolicy {
    /// `false`: Triton's default scheduler, each request runs alone, in arrival order.
    pub dynamic: bool,
    /// Largest batch (sum of request batch sizes); 0 for models without batching.
    pub max_batch_size: usize,
    /// Sizes to aim for; sorted ascending.
    pub preferred_batch_sizes: Vec<usize>,
    pub max_queue_delay: Duration,
    pub preserve_ordering: bool,
    /// Number of priority levels (at least 1; level 1 is the highest).
    pub priority_levels: usize,
    /// Level (1-based) of requests without a priority, or with one out of range.
    pub default_priority_level: usize,
    /// Queue policy per level, index 0 = level 1.
    pub queue_policies: Vec<QueuePolicy>,
    /// Present when the config has `sequence_batching`: the sequence batcher replaces the queue.
    pub sequence: Option<SequencePolicy>,
}

impl BatchPolicy {
    /// Reads the policy from a validated config.
    pub fn from_config(config: &ModelConfig) -> BatchPolicy {
        let max_batch_size = usize::try_from(config.max_batch_size).unwrap_or(0);
        let Some(SchedulingChoice::DynamicBatching(db)) = &config.scheduling_choice else {
            return BatchPolicy {
                dynamic: false,
                max_batch_size,
                preferred_batch_sizes: Vec::new(),
                max_queue_delay: Duration::ZERO,
                preserve_ordering: false,
                priority_levels: 1,
                default_priority_level: 1,
                queue_policies: vec![QueuePolicy::default()],
                sequence: SequencePolicy::from_config(config),
            };
        };
        let levels = usize::try_from(db.priority_levels).unwrap_or(1).max(1);
        let default_level = usize::try_from(db.default_priority_level)
            .unwrap_or(1)
            .clamp(1, levels);
        let default_policy = db
            .default_queue_policy
            .as_ref()
            .map(QueuePolicy::from_config)
            .unwrap_or_default();
        let queue_policies = (1..=levels)
            .map(|level| {
                db.priority_queue_policy
                    .get(&(level as u64))
                    .map(QueuePolicy::from_config)
                    .unwrap_or_else(|| default_policy.clone())
            })
            .collect();
        let mut preferred: Vec<usize> = db
            .preferred_batch_size
            .iter()
            .filter_map(|&s| usize::try_from(s).ok())
            .filter(|&s| s > 0)
            .collect();
        preferred.sort_unstable();
        preferred.dedup();
        BatchPolicy {
            dynamic: max_batch_size > 0,
            max_batch_size,
            preferred_batch_sizes: preferred,
            max_queue_delay: Duration::from_micros(db.max_queue_delay_microseconds),
            preserve_ordering: db.preserve_ordering,
            priority_levels: levels,
            default_priority_level: default_level,
            queue_policies,
            sequence: None,
        }
    }

    /// The 0-based level index of a request priority (0 or out of range = the default level),
    /// as Triton assigns it.
    pub fn level_index(&self, priority: u64) -> usize {
        let level = usize::try_from(priority).unwrap_or(0);
        let level = if level == 0 || level > self.priority_levels {
            self.default_priority_level
        } else {
            level
        };
        level - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::text::parse_model_config;

    #[test]
    fn reads_dynamic_batching_and_queue_policies() {
        let c = parse_model_config(
            r#"max_batch_size: 16
               dynamic_batching {
                 preferred_batch_size: [ 8, 4 ] max_queue_delay_microseconds: 500
                 priority_levels: 3 default_priority_level: 2
                 default_queue_policy { max_queue_size: 10 default_timeout_microseconds: 1000 allow_timeout_override: true }
                 priority_queue_policy { key: 1 value: { timeout_action: DELAY } }
               }"#,
        )
        .unwrap();
        let p = BatchPolicy::from_config(&c);
        assert!(p.dynamic);
        assert_eq!(p.preferred_batch_sizes, vec![4, 8]);
        assert_eq!(p.max_queue_delay, Duration::from_micros(500));
        assert_eq!(p.queue_policies.len(), 3);
        assert_eq!(p.queue_policies[0].timeout_action, TimeoutAction::Delay);
        assert_eq!(p.queue_policies[1].max_queue_size, 10);
        assert_eq!(p.level_index(0), 1);
        assert_eq!(p.level_index(1), 0);
        assert_eq!(p.level_index(9), 1);
    }

    #[test]
    fn no_dynamic_batching_is_the_default_scheduler() {
        let c = parse_model_config("max_batch_size: 8").unwrap();
        let p = BatchPolicy::from_config(&c);
        assert!(!p.dynamic);
        assert_eq!(p.priority_levels, 1);
    }

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
}
