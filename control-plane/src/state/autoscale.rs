//! Autoscaling in the registry: a model's load target and windows (operator-set) and the
//! replica count the leader's autoscaler last decided, with its reason.
//!
//! ```text
//!  ctl models autoscale ─► SetAutoscale { min, max, policy }      (min/max are the model's)
//!  leader autoscaler    ─► SetAutoscaledReplicas { replicas, reason }
//!  placement            ◄─ ClusterState::wanted_replicas = autoscaled count clamped to [min, max]
//! ```
//!
//! The autoscale entries live beside the models (not in [`super::ModelSpec`]) so a deploy that
//! replaces a model's spec keeps its policy and its current count; deleting the model drops
//! them. Older snapshots have no entries and read as "no model autoscales".

use serde::{Deserialize, Serialize};

use super::ClusterState;
use super::error::{EntityKind, StateError};

/// The longest window or cooldown a policy may ask for (one day).
pub const MAX_WINDOW_MS: u64 = 24 * 60 * 60 * 1000;

/// The largest target: a million requests in flight per replica (in thousandths).
pub const MAX_TARGET_MILLI: u32 = 1_000_000_000;

/// What the autoscaler aims for and how patiently.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AutoscalePolicy {
    /// Requests in flight (queued or executing) per ready replica to aim for, in
    /// thousandths of a request (so 1.5 is 1500).
    pub target_in_flight_milli: u32,
    /// Load within this percentage of the target on either side changes nothing.
    pub tolerance_percent: u32,
    /// Load must stay above the band this long before a scale up.
    pub up_window_ms: u64,
    /// Load must stay below the band this long before a scale down.
    pub down_window_ms: u64,
    /// No decision for this long after a change (new replicas load, load settles).
    pub cooldown_ms: u64,
    /// At most this many replicas added or removed by one decision.
    pub max_step: u32,
}

impl AutoscalePolicy {
    /// Checks the policy on its own; `subject` names the model in errors.
    pub fn validate(&self, subject: &str) -> Result<(), StateError> {
        if self.target_in_flight_milli == 0 || self.target_in_flight_milli > MAX_TARGET_MILLI {
            return Err(StateError::invalid(
                subject,
                "target_in_flight",
                format!(
                    "{} is outside 0.001..={} requests per replica",
                    self.target_in_flight_milli as f64 / 1000.0,
                    MAX_TARGET_MILLI / 1000
                ),
            ));
        }
        if self.tolerance_percent >= 100 {
            return Err(StateError::invalid(
                subject,
                "tolerance_percent",
                format!("{} must be below 100", self.tolerance_percent),
            ));
        }
        for (field, ms) in [
            ("up_window_ms", self.up_window_ms),
            ("down_window_ms", self.down_window_ms),
            ("cooldown_ms", self.cooldown_ms),
        ] {
            if ms > MAX_WINDOW_MS {
                return Err(StateError::invalid(
                    subject,
                    field,
                    format!("{ms} is above one day ({MAX_WINDOW_MS} ms)"),
                ));
            }
        }
        if self.max_step == 0 {
            return Err(StateError::invalid(
                subject,
                "max_step",
                "0 would never change the replica count; use at least 1",
            ));
        }
        Ok(())
    }
}

/// A model's autoscaling: its policy and the leader's latest decision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Autoscale {
    pub policy: AutoscalePolicy,
    /// The replica count per served version the autoscaler set; `None` until its first
    /// decision (placement keeps `min_replicas` meanwhile).
    pub replicas: Option<u32>,
    /// Why the autoscaler set `replicas`, in words.
    pub reason: String,
}

impl ClusterState {
    /// The model's autoscaling, if it has a policy.
    pub fn autoscale(&self, model: &str) -> Option<&Autoscale> {
        self.autoscale.get(model)
    }

    /// The replicas per served version placement keeps for `model` before scale from zero:
    /// the autoscaler's count clamped to `[min_replicas, max_replicas]`, else `min_replicas`.
    pub fn wanted_replicas(&self, model: &super::ModelSpec) -> u32 {
        match self.autoscale.get(&model.name).and_then(|a| a.replicas) {
            Some(n) => n.clamp(
                model.min_replicas,
                model.max_replicas.max(model.min_replicas),
            ),
            None => model.min_replicas,
        }
    }

    /// Sets a model's replica range and autoscale policy; `None` turns autoscaling off (the
    /// model goes back to `min_replicas`). A changed policy keeps the current count.
    pub(super) fn set_autoscale(
        &mut self,
        name: &str,
        min: u32,
        max: u32,
        policy: Option<AutoscalePolicy>,
    ) -> Result<bool, StateError> {
        let subject = format!("model '{name}'");
        let Some(model) = self.models.get(name) else {
            return Err(StateError::not_found(EntityKind::Model, name));
        };
        super::model::validate_scale(name, min, max)?;
        if let Some(policy) = &policy {
            policy.validate(&subject)?;
            if max == 0 {
                return Err(StateError::invalid(
                    &subject,
                    "max_replicas",
                    "0 leaves nothing to autoscale; use at least 1",
                ));
            }
        }
        let range_same = (model.min_replicas, model.max_replicas) == (min, max);
        let current = self.autoscale.get(name);
        let next = policy.map(|policy| Autoscale {
            policy,
            replicas: current.and_then(|a| a.replicas),
            reason: current.map(|a| a.reason.clone()).unwrap_or_default(),
        });
        if range_same && current == next.as_ref() {
            return Ok(false);
        }
        if let Some(model) = self.models.get_mut(name) {
            model.min_replicas = min;
            model.max_replicas = max;
        }
        match next {
            Some(a) => self.autoscale.insert(name.to_string(), a),
            None => self.autoscale.remove(name),
        };
        Ok(true)
    }

    /// The leader's decision: `replicas` per served version, within the model's range.
    pub(super) fn set_autoscaled_replicas(
        &mut self,
        name: &str,
        replicas: u32,
        reason: String,
    ) -> Result<bool, StateError> {
        let subject = format!("model '{name}'");
        let Some(model) = self.models.get(name) else {
            return Err(StateError::not_found(EntityKind::Model, name));
        };
        let (min, max) = (model.min_replicas, model.max_replicas);
        let Some(entry) = self.autoscale.get_mut(name) else {
            return Err(StateError::Conflict(format!(
                "{subject} has no autoscale policy (autoscaling was turned off)"
            )));
        };
        if replicas < min || replicas > max {
            return Err(StateError::invalid(
                &subject,
                "replicas",
                format!("{replicas} is outside min_replicas..=max_replicas ({min}..={max})"),
            ));
        }
        if entry.replicas == Some(replicas) && entry.reason == reason {
            return Ok(false);
        }
        entry.replicas = Some(replicas);
        entry.reason = reason;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Command;
    use crate::testing;

    fn policy() -> AutoscalePolicy {
        AutoscalePolicy {
            target_in_flight_milli: 2000,
            tolerance_percent: 10,
            up_window_ms: 1000,
            down_window_ms: 2000,
            cooldown_ms: 500,
            max_step: 1,
        }
    }

    fn set(name: &str, min: u32, max: u32, policy: Option<AutoscalePolicy>) -> Command {
        Command::SetAutoscale {
            name: name.into(),
            min,
            max,
            policy,
        }
    }

    fn scaled(replicas: u32) -> Command {
        Command::SetAutoscaledReplicas {
            name: "m".into(),
            replicas,
            reason: format!("to {replicas}"),
        }
    }

    #[test]
    fn the_autoscaled_count_is_what_placement_keeps_within_the_range() {
        let mut s = ClusterState::new();
        s.apply(Command::UpsertModel(testing::model("m"))).unwrap();
        s.apply(set("m", 1, 3, Some(policy()))).unwrap();
        let wanted = |s: &ClusterState| s.wanted_replicas(s.model("m").unwrap());
        assert_eq!(wanted(&s), 1, "min until the first decision");
        s.apply(scaled(3)).unwrap();
        assert_eq!(wanted(&s), 3);
        assert_eq!(s.autoscale("m").unwrap().reason, "to 3");
        // A narrower range clamps the count; a redeploy keeps the policy.
        s.apply(set("m", 1, 2, Some(policy()))).unwrap();
        assert_eq!(wanted(&s), 2);
        s.apply(Command::UpsertModel(testing::model("m"))).unwrap();
        assert!(s.autoscale("m").is_some());
        // Off: back to min, and the leader's next write is refused.
        s.apply(set("m", 1, 2, None)).unwrap();
        assert_eq!(wanted(&s), 1);
        assert!(matches!(s.apply(scaled(2)), Err(StateError::Conflict(_))));
    }

    #[test]
    fn bad_policies_and_counts_are_refused_naming_the_field() {
        let mut s = ClusterState::new();
        assert!(matches!(
            s.apply(set("m", 1, 2, Some(policy()))),
            Err(StateError::NotFound { .. })
        ));
        s.apply(Command::UpsertModel(testing::model("m"))).unwrap();
        let cases: [(u32, u32, AutoscalePolicy, &str); 5] = [
            (2, 1, policy(), "max_replicas"),
            (0, 0, policy(), "max_replicas 0 leaves nothing"),
            (
                1,
                2,
                AutoscalePolicy {
                    target_in_flight_milli: 0,
                    ..policy()
                },
                "target_in_flight",
            ),
            (
                1,
                2,
                AutoscalePolicy {
                    tolerance_percent: 100,
                    ..policy()
                },
                "tolerance_percent",
            ),
            (
                1,
                2,
                AutoscalePolicy {
                    max_step: 0,
                    ..policy()
                },
                "max_step",
            ),
        ];
        let before = s.revision();
        for (min, max, p, field) in cases {
            let e = s
                .apply(set("m", min, max, Some(p)))
                .unwrap_err()
                .to_string();
            assert!(e.contains(field), "{e}");
        }
        let e = s
            .apply(set(
                "m",
                1,
                2,
                Some(AutoscalePolicy {
                    up_window_ms: MAX_WINDOW_MS + 1,
                    ..policy()
                }),
            ))
            .unwrap_err();
        assert!(e.to_string().contains("up_window_ms"), "{e}");
        assert_eq!(s.revision(), before, "refusals change nothing");
        s.apply(set("m", 1, 2, Some(policy()))).unwrap();
        let e = s.apply(scaled(5)).unwrap_err().to_string();
        assert!(
            e.contains("5 is outside min_replicas..=max_replicas (1..=2)"),
            "{e}"
        );
    }

    #[test]
    fn repeats_change_nothing_and_delete_forgets_the_policy() {
        let mut s = ClusterState::new();
        s.apply(Command::UpsertModel(testing::model("m"))).unwrap();
        assert!(s.apply(set("m", 1, 2, Some(policy()))).unwrap().changed);
        assert!(!s.apply(set("m", 1, 2, Some(policy()))).unwrap().changed);
        assert!(s.apply(scaled(2)).unwrap().changed);
        assert!(!s.apply(scaled(2)).unwrap().changed);
        s.apply(Command::DeleteModel { name: "m".into() }).unwrap();
        s.apply(Command::UpsertModel(testing::model("m"))).unwrap();
        assert!(s.autoscale("m").is_none());
    }

    #[test]
    fn a_snapshot_from_before_autoscaling_reads_with_no_policies() {
        let mut s = ClusterState::new();
        s.apply(Command::UpsertModel(testing::model("m"))).unwrap();
        let mut json = serde_json::to_value(&s).unwrap();
        json.as_object_mut().unwrap().remove("autoscale");
        let old: ClusterState = serde_json::from_value(json).unwrap();
        assert_eq!(old, s);
    }
}
