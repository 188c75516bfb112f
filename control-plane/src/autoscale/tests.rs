//! The decision rule and one model's scaler, case by case.

use super::policy::{Direction, Sample, Situation, decide};
use super::{Autoscaler, Input, ModelScaler};
use crate::state::AutoscalePolicy;

/// Target 2 in flight per replica ±10 %, 10 s up, 30 s down, 5 s cooldown, steps of 2.
pub(super) fn policy() -> AutoscalePolicy {
    AutoscalePolicy {
        target_in_flight_milli: 2000,
        tolerance_percent: 10,
        up_window_ms: 10_000,
        down_window_ms: 30_000,
        cooldown_ms: 5_000,
        max_step: 2,
    }
}

fn at(now_ms: u64, current: u32) -> Situation {
    Situation {
        now_ms,
        current,
        ready: current,
        min: 1,
        max: 8,
        observed_since_ms: 0,
    }
}

/// Samples every second from `from` to `to` (inclusive) at `per_replica` with `ready` replicas.
fn flat(from: u64, to: u64, per_replica: f64, ready: u32) -> Vec<Sample> {
    (from..=to)
        .step_by(1000)
        .map(|t| Sample {
            at_ms: t,
            per_replica,
            total: per_replica * f64::from(ready),
        })
        .collect()
}

#[test]
fn sustained_overload_scales_up_to_the_count_that_meets_the_target() {
    // 2 replicas at 3.5 each: 7 in flight needs 4 replicas of 2.
    let d = decide(&policy(), &at(10_000, 2), &flat(0, 10_000, 3.5, 2));
    assert_eq!(d.direction, Direction::Up);
    assert_eq!(d.replicas, 4, "{}", d.reason);
    assert!(d.reason.starts_with("scale up 2 -> 4"), "{}", d.reason);
}

#[test]
fn overload_shorter_than_the_up_window_holds_and_says_how_long_so_far() {
    let mut samples = flat(0, 5000, 2.0, 2);
    samples.extend(flat(6000, 10_000, 3.5, 2));
    let d = decide(&policy(), &at(10_000, 2), &samples);
    assert_eq!(d.direction, Direction::Hold);
    assert_eq!(d.replicas, 2);
    assert!(
        d.reason.contains("for 4 s of the 10 s up window"),
        "{}",
        d.reason
    );
}

#[test]
fn a_window_not_observed_in_full_yet_holds() {
    let mut situation = at(10_000, 2);
    situation.observed_since_ms = 4000;
    let d = decide(&policy(), &situation, &flat(4000, 10_000, 5.0, 2));
    assert_eq!(d.direction, Direction::Hold, "{}", d.reason);
}

#[test]
fn load_inside_the_band_holds() {
    let d = decide(&policy(), &at(40_000, 3), &flat(0, 40_000, 2.15, 3));
    assert_eq!(d.direction, Direction::Hold);
    assert!(d.reason.contains("within 1.80..=2.20"), "{}", d.reason);
}

#[test]
fn scale_down_keeps_the_peak_of_the_window_at_or_under_the_target() {
    // 6 replicas; load 0.5 each except one sample at 1.5: peak total 9 needs 5 of 2.
    let mut samples = flat(0, 30_000, 0.5, 6);
    samples[10].per_replica = 1.5;
    samples[10].total = 9.0;
    let d = decide(&policy(), &at(30_000, 6), &samples);
    assert_eq!(d.direction, Direction::Down, "{}", d.reason);
    assert_eq!(d.replicas, 5, "{}", d.reason);
}

#[test]
fn steps_are_limited_and_clamped_to_the_range() {
    // 1 replica at 20 in flight wants 10, max_step 2 allows 3.
    let d = decide(&policy(), &at(10_000, 1), &flat(0, 10_000, 20.0, 1));
    assert_eq!(d.replicas, 3);
    assert!(
        d.reason.contains("10 wanted, limited by max_step 2"),
        "{}",
        d.reason
    );
    // At max: hold, and say so.
    let mut full = at(10_000, 8);
    full.max = 8;
    let d = decide(&policy(), &full, &flat(0, 10_000, 20.0, 8));
    assert_eq!(d.direction, Direction::Hold);
    assert!(d.reason.contains("at max_replicas 8"), "{}", d.reason);
    // Idle at 3 with min 2: down to 2 only.
    let mut idle = at(30_000, 3);
    idle.min = 2;
    let d = decide(&policy(), &idle, &flat(0, 30_000, 0.0, 3));
    assert_eq!(d.replicas, 2, "{}", d.reason);
}

#[test]
fn no_scale_up_while_added_replicas_are_still_loading() {
    let mut situation = at(10_000, 4);
    situation.ready = 2;
    let d = decide(&policy(), &situation, &flat(0, 10_000, 5.0, 2));
    assert_eq!(d.direction, Direction::Hold);
    assert!(
        d.reason.contains("waiting for 2 more replica(s)"),
        "{}",
        d.reason
    );
}

#[test]
fn no_samples_or_no_ready_replica_holds() {
    let d = decide(&policy(), &at(0, 1), &[]);
    assert_eq!((d.direction, d.replicas), (Direction::Hold, 1));
    let mut none_ready = at(10_000, 1);
    none_ready.ready = 0;
    let d = decide(&policy(), &none_ready, &flat(0, 10_000, 5.0, 1));
    assert_eq!(d.direction, Direction::Hold);
    assert!(d.reason.contains("no ready replica"), "{}", d.reason);
}

fn input(now_ms: u64, total: f64, current: u32) -> Input {
    Input {
        now_ms,
        total_in_flight: total,
        current,
        ready: current,
        min: 1,
        max: 8,
    }
}

#[test]
fn after_a_change_the_scaler_cools_down_then_needs_a_fresh_window() {
    let p = policy();
    let mut s = ModelScaler::default();
    let mut now = 0;
    let mut d = s.step(&p, input(now, 8.0, 2));
    while d.direction == Direction::Hold {
        now += 1000;
        d = s.step(&p, input(now, 8.0, 2));
    }
    assert_eq!((now, d.replicas), (10_000, 4), "{}", d.reason);
    // Cooldown: even a huge load changes nothing for 5 s.
    let d = s.step(&p, input(now + 4000, 100.0, 4));
    assert!(d.reason.starts_with("cooling down"), "{}", d.reason);
    // Then a whole up window must pass again.
    for t in (now + 5000..now + 15_000).step_by(1000) {
        let d = s.step(&p, input(t, 100.0, 4));
        assert_eq!(d.direction, Direction::Hold, "at {t}: {}", d.reason);
    }
    let d = s.step(&p, input(now + 15_000, 100.0, 4));
    assert_eq!(
        (d.direction, d.replicas),
        (Direction::Up, 6),
        "{}",
        d.reason
    );
}

#[test]
fn a_new_policy_starts_a_fresh_window() {
    let mut s = ModelScaler::default();
    for t in (0..=9000).step_by(1000) {
        s.step(&policy(), input(t, 8.0, 2));
    }
    let mut tighter = policy();
    tighter.target_in_flight_milli = 1000;
    let d = s.step(&tighter, input(10_000, 8.0, 2));
    assert_eq!(d.direction, Direction::Hold, "{}", d.reason);
}

#[test]
fn the_autoscaler_remembers_holds_and_forgets_models_that_stop_autoscaling() {
    let mut a = Autoscaler::new();
    a.step("m", &policy(), input(0, 4.0, 2));
    assert!(a.latest("m").is_some_and(|d| d.reason.contains("within")));
    a.retain(&Default::default());
    assert!(a.latest("m").is_none());
}
