//! The timer thread both schedulers run: it sleeps until the next queue delay or timeout,
//! dispatches, and exits when the scheduler is dropped.

use std::time::Instant;

use parking_lot::{Condvar, Mutex};

/// What the timer reads from a scheduler's shared state.
pub(super) trait Timed {
    /// The scheduler handle was dropped.
    fn closed(&self) -> bool;
    /// When the queue must next be looked at.
    fn wake(&self) -> Option<Instant>;
}

/// Runs until `closed`; calls `dispatch` (with the lock held) whenever `wake` has passed.
/// Schedulers notify `timer` when `wake` moves earlier or they close.
pub(super) fn timer_loop<S: Timed>(
    state: &Mutex<S>,
    timer: &Condvar,
    mut dispatch: impl FnMut(&mut S, Instant),
) {
    let mut state = state.lock();
    while !state.closed() {
        match state.wake() {
            Some(at) if at <= Instant::now() => dispatch(&mut state, Instant::now()),
            Some(at) => {
                timer.wait_until(&mut state, at);
            }
            None => timer.wait(&mut state),
        }
    }
}
