//! A gate between the code under test and the test: a test backend (on its own thread) or a
//! fake server (a task) announces that work `key` started and waits there until the test
//! releases `key`. The test waits for the announcement instead of sleeping "long enough" for
//! the work to have started, and decides when it ends.
//!
//! ```text
//!   backend thread / fake handler          test
//!   gate.pass(key) ── arrived(key) ──────► gate.arrival().await == key
//!        │ blocked                          ... assert what holds while it runs ...
//!        ◄──────────────────────────────── gate.release(key)   (or gate.open())
//!   returns, the work finishes
//! ```
//!
//! Every wait has a wall-clock guard ([`WAIT`]) so a broken test fails naming what it waited
//! for instead of hanging.

use std::collections::VecDeque;
use std::fmt::Debug;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// How long either side waits before it fails the test.
pub const WAIT: Duration = Duration::from_secs(30);
/// How often an async waiter looks at the wall clock while nothing happens.
const TICK: Duration = Duration::from_millis(100);

/// Cheap to clone: clones share one gate.
pub struct Gate<K = ()> {
    shared: Arc<Shared<K>>,
}

impl<K> Clone for Gate<K> {
    fn clone(&self) -> Self {
        Gate {
            shared: self.shared.clone(),
        }
    }
}

struct Shared<K> {
    state: Mutex<State<K>>,
    /// Wakes threads blocked in [`Gate::pass`].
    threads: Condvar,
    /// Wakes tasks in [`Gate::pass_async`] and [`Gate::arrival`].
    tasks: Notify,
}

struct State<K> {
    /// Keys that arrived and that [`Gate::arrival`] has not returned yet, in arrival order.
    arrivals: VecDeque<K>,
    /// Every key that ever arrived, in order.
    history: Vec<K>,
    /// Releases not used yet: one lets one passage of its key through.
    released: Vec<K>,
    /// Everything passes.
    open: bool,
}

impl<K: Clone + PartialEq + Debug + Send> Default for Gate<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Clone + PartialEq + Debug + Send> Gate<K> {
    /// A closed gate: every passage waits for its release.
    pub fn new() -> Self {
        Gate {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    arrivals: VecDeque::new(),
                    history: Vec::new(),
                    released: Vec::new(),
                    open: false,
                }),
                threads: Condvar::new(),
                tasks: Notify::new(),
            }),
        }
    }

    /// An open gate: passages only record their keys (for [`Gate::history`]).
    pub fn opened() -> Self {
        let gate = Self::new();
        gate.open();
        gate
    }

    fn state(&self) -> MutexGuard<'_, State<K>> {
        self.shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn changed(&self) {
        self.shared.threads.notify_all();
        self.shared.tasks.notify_waiters();
    }

    /// Announces `key` and blocks this thread until the test releases it: for backends and
    /// other code that runs on threads of its own. Panics after `WAIT`.
    pub fn pass(&self, key: K) {
        let mut state = self.arrive(key.clone());
        let started = Instant::now();
        while !take_release(&mut state, &key) {
            let left = WAIT.saturating_sub(started.elapsed());
            assert!(!left.is_zero(), "gate: {key:?} was never released");
            state = self
                .shared
                .threads
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// [`Gate::pass`] for code running on the tokio runtime (a fake server's handler).
    pub async fn pass_async(&self, key: K) {
        drop(self.arrive(key.clone()));
        self.wait_for(&format!("{key:?} to be released"), |state| {
            take_release(state, &key).then_some(())
        })
        .await;
    }

    fn arrive(&self, key: K) -> MutexGuard<'_, State<K>> {
        let mut state = self.state();
        state.arrivals.push_back(key.clone());
        state.history.push(key);
        self.changed();
        state
    }

    /// Waits for the next key to arrive (in arrival order) and returns it. Panics after
    /// `WAIT`.
    pub async fn arrival(&self) -> K {
        self.wait_for("an arrival at the gate", |state| state.arrivals.pop_front())
            .await
    }

    /// Waits until `key` has arrived (skipping, and keeping for [`Gate::arrival`], the keys
    /// that arrived before it).
    pub async fn arrived(&self, key: &K) {
        self.wait_for(&format!("{key:?} to arrive"), |state| {
            let at = state.arrivals.iter().position(|k| k == key)?;
            state.arrivals.remove(at).map(drop)
        })
        .await;
    }

    /// Lets one passage of `key` through: one that waits now, or the next to arrive.
    pub fn release(&self, key: K) {
        self.state().released.push(key);
        self.changed();
    }

    /// Lets everything through, now and from now on.
    pub fn open(&self) {
        self.state().open = true;
        self.changed();
    }

    /// Every key that arrived so far, in order (returned by [`Gate::arrival`] or not).
    pub fn history(&self) -> Vec<K> {
        self.state().history.clone()
    }

    /// Keys that arrived and that [`Gate::arrival`] has not returned yet.
    pub fn pending_arrivals(&self) -> Vec<K> {
        self.state().arrivals.iter().cloned().collect()
    }

    /// Runs `look` on the state each time it changes until it gives `Some`. The [`TICK`] bound
    /// on each wait is only there to look at the wall clock: on tokio's paused clock it ends
    /// at once whenever the runtime idles, which keeps the guard on real time.
    async fn wait_for<T>(&self, what: &str, mut look: impl FnMut(&mut State<K>) -> Option<T>) -> T {
        let started = Instant::now();
        loop {
            let notified = self.shared.tasks.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(v) = look(&mut self.state()) {
                self.changed();
                return v;
            }
            assert!(
                started.elapsed() < WAIT,
                "gate: timed out after {WAIT:?} waiting for {what}"
            );
            let _ = tokio::time::timeout(TICK, notified).await;
        }
    }
}

/// Uses one release of `key` (or the open gate).
fn take_release<K: PartialEq>(state: &mut State<K>, key: &K) -> bool {
    if state.open {
        return true;
    }
    match state.released.iter().position(|k| k == key) {
        Some(at) => {
            state.released.swap_remove(at);
            true
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_thread_waits_at_the_gate_until_released() {
        let gate = Gate::<u32>::new();
        let thread = std::thread::spawn({
            let gate = gate.clone();
            move || {
                gate.pass(1);
                gate.pass(2);
            }
        });
        assert_eq!(gate.arrival().await, 1);
        assert!(!thread.is_finished());
        // Released ahead of its arrival: passes straight through.
        gate.release(2);
        gate.release(1);
        assert_eq!(gate.arrival().await, 2);
        tokio::task::spawn_blocking(move || thread.join().unwrap())
            .await
            .unwrap();
        assert_eq!(gate.history(), [1, 2]);
    }

    #[tokio::test(start_paused = true)]
    async fn tasks_pass_in_the_order_they_are_released() {
        let gate = Gate::<&str>::new();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        for key in ["a", "b"] {
            let (gate, tx) = (gate.clone(), tx.clone());
            tokio::spawn(async move {
                gate.pass_async(key).await;
                tx.send(key).unwrap();
            });
        }
        gate.arrived(&"b").await;
        gate.arrived(&"a").await;
        gate.release("b");
        assert_eq!(rx.recv().await, Some("b"));
        gate.open();
        assert_eq!(rx.recv().await, Some("a"));
        assert!(gate.pending_arrivals().is_empty());
    }
}
