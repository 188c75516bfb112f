//! Autoscaling on load: the leader's pure decision core. Each placement round the leader
//! hands it, per model with an autoscale policy, the requests in flight on the model's
//! replicas (summed from the workers' last heartbeats) and its replica counts; it answers
//! the replica count the model should have and why.
//!
//! ```text
//!  heartbeats (in_flight per model, per node) ─► observe::inputs ─► Input per model
//!                                                                      │
//!  Autoscaler ─► ModelScaler::step ─ cooldown? ─► hold                 ▼
//!                                  └ sample ─► window of samples ─► policy::decide
//!                                                                      │
//!  leader writes SetAutoscaledReplicas when the count changes ◄────────┘ (reason kept for
//!  placement explanations; holds are shown there too, never written)
//! ```
//!
//! The target metric is requests in flight (queued or executing) per ready replica, the load
//! a worker already reports for every model version in each heartbeat. After a change the
//! window starts over and nothing changes for the policy's cooldown, so replicas that are
//! still loading are not counted twice. Nothing here reads a clock or does I/O: times are
//! milliseconds on the caller's monotonic clock, and the tests drive whole load traces.

pub mod observe;
pub mod policy;

#[cfg(test)]
mod simulation;
#[cfg(test)]
mod tests;

use std::collections::{BTreeSet, HashMap, VecDeque};

pub use policy::{Decision, Direction, Sample, Situation};

use crate::state::AutoscalePolicy;

/// What the leader observed about one model this round.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Input {
    pub now_ms: u64,
    /// Requests in flight over all the model's replicas.
    pub total_in_flight: f64,
    /// The replica count placement keeps now (per served version).
    pub current: u32,
    /// Ready replicas of the model (over its served versions, as the in-flight total is).
    pub ready: u32,
    pub min: u32,
    pub max: u32,
}

/// One model's memory between rounds: its recent samples and its cooldown.
#[derive(Debug, Clone, Default)]
pub struct ModelScaler {
    policy: Option<AutoscalePolicy>,
    samples: VecDeque<Sample>,
    observed_since_ms: Option<u64>,
    cooldown_until_ms: u64,
}

impl ModelScaler {
    /// Records this round's load and decides. A decision that changes the count starts the
    /// cooldown and a fresh window.
    pub fn step(&mut self, policy: &AutoscalePolicy, input: Input) -> Decision {
        if self.policy.as_ref() != Some(policy) {
            *self = ModelScaler {
                policy: Some(policy.clone()),
                ..ModelScaler::default()
            };
        }
        let now = input.now_ms;
        if now < self.cooldown_until_ms && (input.min..=input.max).contains(&input.current) {
            return Decision {
                replicas: input.current,
                direction: Direction::Hold,
                reason: format!(
                    "cooling down after the last change ({} ms left of {} ms)",
                    self.cooldown_until_ms - now,
                    policy.cooldown_ms
                ),
            };
        }
        if input.ready > 0 && input.total_in_flight.is_finite() && input.total_in_flight >= 0.0 {
            self.samples.push_back(Sample {
                at_ms: now,
                per_replica: input.total_in_flight / f64::from(input.ready),
                total: input.total_in_flight,
            });
            self.observed_since_ms.get_or_insert(now);
        }
        let keep_from = now.saturating_sub(policy.up_window_ms.max(policy.down_window_ms));
        while self.samples.front().is_some_and(|s| s.at_ms < keep_from) {
            self.samples.pop_front();
        }
        let situation = Situation {
            now_ms: now,
            current: input.current,
            ready: input.ready,
            min: input.min,
            max: input.max,
            observed_since_ms: self.observed_since_ms.unwrap_or(now),
        };
        let samples: Vec<Sample> = self.samples.iter().copied().collect();
        let decision = policy::decide(policy, &situation, &samples);
        if decision.replicas != input.current {
            self.samples.clear();
            self.observed_since_ms = None;
            self.cooldown_until_ms = now.saturating_add(policy.cooldown_ms);
        }
        decision
    }
}

/// Every autoscaled model's [`ModelScaler`] and its latest decision.
#[derive(Debug, Default)]
pub struct Autoscaler {
    models: HashMap<String, (ModelScaler, Decision)>,
}

impl Autoscaler {
    pub fn new() -> Self {
        Self::default()
    }

    /// Decides for `model` and remembers the decision for [`Autoscaler::latest`].
    pub fn step(&mut self, model: &str, policy: &AutoscalePolicy, input: Input) -> Decision {
        let entry = self.models.entry(model.to_string()).or_insert_with(|| {
            (
                ModelScaler::default(),
                Decision {
                    replicas: input.current,
                    direction: Direction::Hold,
                    reason: String::new(),
                },
            )
        });
        let decision = entry.0.step(policy, input);
        entry.1 = decision.clone();
        decision
    }

    /// Forgets models that no longer autoscale.
    pub fn retain(&mut self, autoscaled: &BTreeSet<String>) {
        self.models.retain(|m, _| autoscaled.contains(m));
    }

    /// The latest decision for `model`, holds included.
    pub fn latest(&self, model: &str) -> Option<&Decision> {
        self.models.get(model).map(|(_, d)| d)
    }
}
