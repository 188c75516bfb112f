//! The decision rule: from a model's recent load samples, its current replica count and its
//! policy, the replica count it should have and why.
//!
//! ```text
//!  load per ready replica ── above target·(1+tol) for the whole up window   ─► up:   ⌈total/target⌉
//!                          ├ below target·(1−tol) for the whole down window ─► down: ⌈peak total/target⌉
//!                          └ otherwise (inside the band, or not sustained)  ─► hold
//!  then: at most max_step away from the current count, clamped to [min, max]
//! ```
//!
//! A scale up takes the lowest load of its window and a scale down the highest of its (longer)
//! window, so a brief spike or dip never moves the count, and the count a scale down picks
//! keeps the peak load at or under the target (it cannot trigger the next scale up). Pure: no
//! clock; times are milliseconds on the caller's monotonic clock.

use std::fmt::Write;

use crate::state::AutoscalePolicy;

/// One observation: requests in flight per ready replica at `at_ms`, and the total.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    pub at_ms: u64,
    pub per_replica: f64,
    pub total: f64,
}

/// What the rule sees about a model this round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Situation {
    pub now_ms: u64,
    /// The count placement keeps now (per served version).
    pub current: u32,
    /// Of those, how many are ready (serving).
    pub ready: u32,
    pub min: u32,
    pub max: u32,
    /// When the observation window began: the first sample after the last change, or the
    /// leader's start. A window is sustained only once it reaches back this far.
    pub observed_since_ms: u64,
}

/// The direction of a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Up,
    Down,
    Hold,
}

/// The rule's answer: the count to keep and the reason, in words.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub replicas: u32,
    pub direction: Direction,
    pub reason: String,
}

impl Decision {
    fn hold(current: u32, reason: String) -> Self {
        Decision {
            replicas: current,
            direction: Direction::Hold,
            reason,
        }
    }
}

/// The load band inside which nothing changes: target·(1 ± tolerance).
pub fn band(policy: &AutoscalePolicy) -> (f64, f64, f64) {
    let target = f64::from(policy.target_in_flight_milli) / 1000.0;
    let tol = f64::from(policy.tolerance_percent) / 100.0;
    (target * (1.0 - tol), target, target * (1.0 + tol))
}

/// Decides from `samples` (oldest first, none older than the longer window needs).
pub fn decide(policy: &AutoscalePolicy, at: &Situation, samples: &[Sample]) -> Decision {
    let (lower, target, upper) = band(policy);
    let current = at.current;
    if current < at.min || current > at.max {
        let to = current.clamp(at.min, at.max);
        return Decision {
            replicas: to,
            direction: if to > current {
                Direction::Up
            } else {
                Direction::Down
            },
            reason: format!(
                "{current} replicas is outside min..=max ({}..={})",
                at.min, at.max
            ),
        };
    }
    let Some(last) = samples.last() else {
        return Decision::hold(current, "no load sample yet".into());
    };
    if at.ready == 0 {
        return Decision::hold(current, "no ready replica to measure load on".into());
    }
    let now_load = format!(
        "{} in flight per ready replica ({} ready)",
        num(last.per_replica),
        at.ready
    );
    let up = sustained(samples, at, policy.up_window_ms, |s| s.per_replica > upper);
    let down = sustained(samples, at, policy.down_window_ms, |s| {
        s.per_replica < lower
    });
    match (up, down) {
        (Window::Sustained, _) => {
            let lowest = samples_since(samples, at.now_ms, policy.up_window_ms)
                .map(|s| s.per_replica)
                .fold(f64::INFINITY, f64::min);
            let floor = samples_since(samples, at.now_ms, policy.up_window_ms)
                .map(|s| s.total)
                .fold(f64::INFINITY, f64::min);
            if current >= at.max {
                return Decision::hold(
                    current,
                    format!(
                        "{now_load} is above {} but the model is at max_replicas {}",
                        num(upper),
                        at.max
                    ),
                );
            }
            if at.ready < current {
                return Decision::hold(
                    current,
                    format!(
                        "{now_load} is above {}; waiting for {} more replica(s) to become ready before scaling up again",
                        num(upper),
                        current - at.ready
                    ),
                );
            }
            let wanted = replicas_for(floor, target).max(current.saturating_add(1));
            let to = wanted
                .min(current.saturating_add(policy.max_step))
                .clamp(at.min, at.max);
            let mut reason = format!(
                "scale up {current} -> {to}: load stayed above {} (target {} +{}%) for {} s, at least {} per replica",
                num(upper),
                num(target),
                policy.tolerance_percent,
                secs(policy.up_window_ms),
                num(lowest)
            );
            if to < wanted {
                let _ = write!(
                    reason,
                    "; {wanted} wanted, limited by max_step {} / max_replicas {}",
                    policy.max_step, at.max
                );
            }
            Decision {
                replicas: to,
                direction: Direction::Up,
                reason,
            }
        }
        (_, Window::Sustained) => {
            let highest = samples_since(samples, at.now_ms, policy.down_window_ms)
                .map(|s| s.per_replica)
                .fold(0.0, f64::max);
            let peak = samples_since(samples, at.now_ms, policy.down_window_ms)
                .map(|s| s.total)
                .fold(0.0, f64::max);
            if current <= at.min {
                return Decision::hold(
                    current,
                    format!(
                        "{now_load} is below {} but the model is at min_replicas {}",
                        num(lower),
                        at.min
                    ),
                );
            }
            let wanted = replicas_for(peak, target).min(current - 1);
            let to = wanted
                .max(current.saturating_sub(policy.max_step))
                .clamp(at.min, at.max);
            let mut reason = format!(
                "scale down {current} -> {to}: load stayed below {} (target {} -{}%) for {} s, at most {} per replica",
                num(lower),
                num(target),
                policy.tolerance_percent,
                secs(policy.down_window_ms),
                num(highest)
            );
            if to > wanted {
                let _ = write!(
                    reason,
                    "; {wanted} wanted, limited by max_step {} / min_replicas {}",
                    policy.max_step, at.min
                );
            }
            Decision {
                replicas: to,
                direction: Direction::Down,
                reason,
            }
        }
        (Window::Building(for_ms), _) if last.per_replica > upper => Decision::hold(
            current,
            format!(
                "{now_load} is above {} for {} s of the {} s up window",
                num(upper),
                secs(for_ms),
                secs(policy.up_window_ms)
            ),
        ),
        (_, Window::Building(for_ms)) if last.per_replica < lower => Decision::hold(
            current,
            format!(
                "{now_load} is below {} for {} s of the {} s down window",
                num(lower),
                secs(for_ms),
                secs(policy.down_window_ms)
            ),
        ),
        _ => Decision::hold(
            current,
            format!(
                "{now_load} is within {}..={} (target {} ±{}%)",
                num(lower),
                num(upper),
                num(target),
                policy.tolerance_percent
            ),
        ),
    }
}

/// Whether a condition held over a whole window.
enum Window {
    /// It held for every sample of the window, and the observation covers the window.
    Sustained,
    /// It holds for the latest samples, this many ms so far (0: not for the latest).
    Building(u64),
}

fn sustained(
    samples: &[Sample],
    at: &Situation,
    window_ms: u64,
    holds: impl Fn(&Sample) -> bool,
) -> Window {
    // The oldest sample of the newest run for which the condition holds.
    let mut run_start = None;
    for s in samples.iter().rev() {
        if !holds(s) {
            break;
        }
        run_start = Some(s.at_ms);
    }
    let Some(start) = run_start else {
        return Window::Building(0);
    };
    let covered = at.now_ms.saturating_sub(at.observed_since_ms) >= window_ms
        && samples_since(samples, at.now_ms, window_ms)
            .next()
            .is_some();
    let all_hold = samples_since(samples, at.now_ms, window_ms).all(&holds);
    if covered && all_hold {
        Window::Sustained
    } else {
        Window::Building(at.now_ms.saturating_sub(start.max(at.observed_since_ms)))
    }
}

fn samples_since(samples: &[Sample], now_ms: u64, window_ms: u64) -> impl Iterator<Item = &Sample> {
    let from = now_ms.saturating_sub(window_ms);
    samples.iter().filter(move |s| s.at_ms >= from)
}

/// Replicas that bring `total` in-flight requests to `target` per replica.
fn replicas_for(total: f64, target: f64) -> u32 {
    if !total.is_finite() || total <= 0.0 {
        return 0;
    }
    let n = (total / target - 1e-9).ceil();
    if n >= f64::from(u32::MAX) {
        u32::MAX
    } else {
        n as u32
    }
}

fn num(v: f64) -> String {
    if (v - v.round()).abs() < 0.005 {
        format!("{}", v.round())
    } else {
        format!("{v:.2}")
    }
}

fn secs(ms: u64) -> String {
    num(ms as f64 / 1000.0)
}
