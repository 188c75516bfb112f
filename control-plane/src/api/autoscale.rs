//! The `SetAutoscale` RPC and the autoscale part of placement explanations: the wire policy
//! (a decimal target, 0 meaning "default" for the other fields) turned into the registry's
//! validated [`AutoscalePolicy`] and back.

use nereid_proto::pb::cluster as pb;

use super::error::ApiError;
use super::service::{ManagementService, required};
use crate::leader::Observations;
use crate::state::{AutoscalePolicy, ClusterState, Command, EntityKind, StateError};

/// Load within this percentage of the target changes nothing, unless the policy says.
pub const DEFAULT_TOLERANCE_PERCENT: u32 = 10;
/// How long load must stay above the band before a scale up, unless the policy says.
pub const DEFAULT_UP_WINDOW_MS: u64 = 30_000;
/// How long load must stay below the band before a scale down, unless the policy says.
pub const DEFAULT_DOWN_WINDOW_MS: u64 = 300_000;
/// How long nothing changes after a change, unless the policy says.
pub const DEFAULT_COOLDOWN_MS: u64 = 30_000;
/// How many replicas one decision adds or removes at most, unless the policy says.
pub const DEFAULT_MAX_STEP: u32 = 4;

/// A policy as a client sent it, defaults filled in; the registry validates the rest.
pub fn policy_from_pb(p: &pb::AutoscalePolicy) -> Result<AutoscalePolicy, ApiError> {
    let target = p.target_in_flight;
    if !target.is_finite() || target <= 0.0 {
        return Err(ApiError::invalid(
            "policy.target_in_flight",
            format!("{target} must be a number above 0 (requests in flight per replica)"),
        ));
    }
    let milli = (target * 1000.0).round();
    if milli < 1.0 || milli > f64::from(crate::state::autoscale::MAX_TARGET_MILLI) {
        return Err(ApiError::invalid(
            "policy.target_in_flight",
            format!("{target} is outside 0.001..=1000000"),
        ));
    }
    let or = |v: u64, d: u64| if v == 0 { d } else { v };
    Ok(AutoscalePolicy {
        target_in_flight_milli: milli as u32,
        tolerance_percent: if p.tolerance_percent == 0 {
            DEFAULT_TOLERANCE_PERCENT
        } else {
            p.tolerance_percent
        },
        up_window_ms: or(p.up_window_ms, DEFAULT_UP_WINDOW_MS),
        down_window_ms: or(p.down_window_ms, DEFAULT_DOWN_WINDOW_MS),
        cooldown_ms: or(p.cooldown_ms, DEFAULT_COOLDOWN_MS),
        max_step: if p.max_step == 0 {
            DEFAULT_MAX_STEP
        } else {
            p.max_step
        },
    })
}

pub fn policy_to_pb(p: &AutoscalePolicy) -> pb::AutoscalePolicy {
    pb::AutoscalePolicy {
        target_in_flight: f64::from(p.target_in_flight_milli) / 1000.0,
        tolerance_percent: p.tolerance_percent,
        up_window_ms: p.up_window_ms,
        down_window_ms: p.down_window_ms,
        cooldown_ms: p.cooldown_ms,
        max_step: p.max_step,
    }
}

/// The model's autoscaling as `state` has it, with the leader's latest evaluation; `None`
/// for a model that is not registered.
pub fn autoscale_status(
    state: &ClusterState,
    observations: &dyn Observations,
    name: &str,
) -> Option<pb::AutoscaleStatus> {
    let spec = state.model(name)?;
    let autoscale = state.autoscale(name);
    Some(pb::AutoscaleStatus {
        model: name.to_string(),
        min_replicas: spec.min_replicas,
        max_replicas: spec.max_replicas,
        policy: autoscale.map(|a| policy_to_pb(&a.policy)),
        replicas: state.wanted_replicas(spec),
        last_change: autoscale.map(|a| a.reason.clone()).unwrap_or_default(),
        latest: autoscale
            .and_then(|_| observations.autoscale_latest(name))
            .unwrap_or_default(),
        revision: state.revision(),
    })
}

impl ManagementService {
    /// Sets the replica range and policy (no policy: autoscaling off).
    pub async fn set_autoscale(
        &self,
        req: pb::SetAutoscaleRequest,
    ) -> Result<pb::AutoscaleStatus, ApiError> {
        required("name", &req.name)?;
        let policy = req.policy.as_ref().map(policy_from_pb).transpose()?;
        let applied = self
            .consensus
            .write(Command::SetAutoscale {
                name: req.name.clone(),
                min: req.min_replicas,
                max: req.max_replicas,
                policy,
            })
            .await?;
        let state = self.state_at_least(applied.revision).await?;
        autoscale_status(&state, &*self.observations, &req.name)
            .ok_or_else(|| StateError::not_found(EntityKind::Model, &req.name).into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_fields_take_the_defaults_and_the_target_keeps_thousandths() {
        let p = policy_from_pb(&pb::AutoscalePolicy {
            target_in_flight: 1.5,
            ..Default::default()
        })
        .unwrap();
        assert_eq!(p.target_in_flight_milli, 1500);
        assert_eq!(p.tolerance_percent, DEFAULT_TOLERANCE_PERCENT);
        assert_eq!(p.up_window_ms, DEFAULT_UP_WINDOW_MS);
        assert_eq!(p.down_window_ms, DEFAULT_DOWN_WINDOW_MS);
        assert_eq!(p.cooldown_ms, DEFAULT_COOLDOWN_MS);
        assert_eq!(p.max_step, DEFAULT_MAX_STEP);
        assert_eq!(policy_to_pb(&p).target_in_flight, 1.5);
    }

    #[test]
    fn a_target_that_is_not_a_positive_number_is_refused_naming_the_field() {
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e12, 0.0001] {
            let e = policy_from_pb(&pb::AutoscalePolicy {
                target_in_flight: bad,
                ..Default::default()
            })
            .unwrap_err();
            assert!(
                e.to_string().contains("policy.target_in_flight"),
                "{bad}: {e}"
            );
        }
    }
}
