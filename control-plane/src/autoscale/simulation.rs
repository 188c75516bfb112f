//! Load traces driven through the autoscaler against a simulated model: the leader's round
//! every second, replicas ready 3 s after being added and gone at once when removed, and a
//! closed-loop client population whose requests in flight are the trace's demand (spread
//! over the ready replicas). Each trace checks what an operator would watch: the count
//! reaches what the target asks for within a bounded time, changes a bounded number of times
//! (no flapping) and never leaves `[min, max]`.

use super::tests::policy;
use super::{Direction, Input, ModelScaler};
use crate::state::AutoscalePolicy;

const ROUND_MS: u64 = 1000;
const LOAD_DELAY_MS: u64 = 3000;

struct Run {
    /// (time ms, replica count) after every round.
    counts: Vec<(u64, u32)>,
    changes: usize,
}

/// Runs `demand(t)` (requests in flight at `t` ms) for `duration_ms`, starting at `start`
/// replicas, all ready.
fn simulate(
    p: &AutoscalePolicy,
    (min, max): (u32, u32),
    start: u32,
    duration_ms: u64,
    demand: impl Fn(u64) -> f64,
) -> Run {
    let mut scaler = ModelScaler::default();
    let mut wanted = start;
    // Ready-at times of the replicas that exist.
    let mut replicas: Vec<u64> = vec![0; start as usize];
    let mut run = Run {
        counts: Vec::new(),
        changes: 0,
    };
    for now in (0..=duration_ms).step_by(ROUND_MS as usize) {
        let ready = replicas.iter().filter(|t| **t <= now).count() as u32;
        let d = scaler.step(
            p,
            Input {
                now_ms: now,
                total_in_flight: if ready == 0 { 0.0 } else { demand(now) },
                current: wanted,
                ready,
                min,
                max,
            },
        );
        if d.direction != Direction::Hold {
            assert_ne!(
                d.replicas, wanted,
                "a change that changes nothing: {}",
                d.reason
            );
            run.changes += 1;
        }
        assert!(
            (min..=max).contains(&d.replicas),
            "at {now} ms: {} outside {min}..={max}",
            d.replicas
        );
        wanted = d.replicas;
        // Placement follows: new replicas load, surplus ones go (the newest first).
        while (replicas.len() as u32) < wanted {
            replicas.push(now + LOAD_DELAY_MS);
        }
        replicas.truncate(wanted as usize);
        run.counts.push((now, wanted));
    }
    run
}

/// The first time the count reached `n` at or after `from` ms.
fn reached(run: &Run, from: u64, n: u32) -> Option<u64> {
    run.counts
        .iter()
        .find(|(t, c)| *t >= from && *c == n)
        .map(|(t, _)| *t - from)
}

fn count_at(run: &Run, t: u64) -> u32 {
    run.counts
        .iter()
        .rev()
        .find(|(at, _)| *at <= t)
        .map_or(0, |(_, c)| *c)
}

/// A deterministic noise in -1..1 (a linear congruential generator).
fn noise(seed: u64) -> f64 {
    let x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407)
        >> 33;
    (x % 2001) as f64 / 1000.0 - 1.0
}

#[test]
fn a_step_up_in_load_reaches_the_target_count_within_bounded_time() {
    // 2 in flight, then 12 from 60 s: target 2 per replica wants 6.
    let run = simulate(&policy(), (1, 8), 1, 180_000, |t| {
        if t < 60_000 { 2.0 } else { 12.0 }
    });
    assert_eq!(count_at(&run, 59_000), 1);
    let took = reached(&run, 60_000, 6).expect("never reached 6 replicas");
    // Up window 10 s, +2 per step, 5 s cooldown and 3 s loading between steps:
    // 1 -> 3 -> 5 -> 6 within three windows, loads and cooldowns.
    assert!(
        took <= 3 * (10_000 + 5000 + LOAD_DELAY_MS),
        "took {took} ms"
    );
    assert_eq!(count_at(&run, 180_000), 6, "stays at the target");
    assert!(run.changes <= 3, "{} changes", run.changes);
}

#[test]
fn a_step_down_in_load_returns_to_min_after_the_down_window() {
    let run = simulate(&policy(), (1, 8), 6, 200_000, |t| {
        if t < 20_000 { 12.0 } else { 1.0 }
    });
    assert_eq!(
        count_at(&run, 45_000),
        6,
        "the down window (30 s) has not passed"
    );
    let took = reached(&run, 20_000, 1).expect("never came down to min");
    // 6 -> 4 -> 2 -> 1: one down window each, plus cooldowns.
    assert!(took <= 3 * (30_000 + 5000 + ROUND_MS), "took {took} ms");
    assert_eq!(count_at(&run, 200_000), 1);
    assert!(run.changes <= 3, "{} changes", run.changes);
}

#[test]
fn a_noisy_plateau_at_the_target_never_changes_the_count() {
    // 4 replicas, demand 8 ±15 %: per replica 1.7..2.3 crosses the ±10 % band now and
    // then, never for a whole window.
    let run = simulate(&policy(), (1, 8), 4, 600_000, |t| {
        8.0 * (1.0 + 0.15 * noise(t / ROUND_MS))
    });
    assert_eq!(
        run.changes,
        0,
        "flapped: {:?}",
        run.counts
            .iter()
            .filter(|(_, c)| *c != 4)
            .take(5)
            .collect::<Vec<_>>()
    );
}

#[test]
fn a_spike_shorter_than_the_up_window_changes_nothing() {
    let run = simulate(&policy(), (1, 8), 2, 120_000, |t| {
        if (50_000..57_000).contains(&t) {
            40.0
        } else {
            4.0
        }
    });
    assert_eq!(run.changes, 0);
}

#[test]
fn oscillating_load_changes_the_count_a_bounded_number_of_times() {
    // Load alternates between 2 and 14 every 20 s for 10 minutes: the up window follows
    // some rises, but the 30 s down window is never met, so the count only climbs and the
    // changes stay few.
    let run = simulate(&policy(), (1, 8), 1, 600_000, |t| {
        if (t / 20_000) % 2 == 0 { 2.0 } else { 14.0 }
    });
    assert!(run.changes <= 4, "{} changes", run.changes);
    let downs = run.counts.windows(2).filter(|w| w[1].1 < w[0].1).count();
    assert_eq!(downs, 0, "scaled down in the middle of a burst pattern");
}

#[test]
fn zero_load_to_a_floor_of_zero_and_a_ceiling_it_cannot_exceed() {
    // min 0: idle replicas all go; max 3: a heavy load never asks for more.
    let idle = simulate(&policy(), (0, 3), 2, 120_000, |_| 0.0);
    assert_eq!(count_at(&idle, 120_000), 0);
    let heavy = simulate(&policy(), (0, 3), 1, 120_000, |_| 100.0);
    assert_eq!(count_at(&heavy, 120_000), 3);
    assert!(heavy.changes <= 1, "{} changes", heavy.changes);
}
