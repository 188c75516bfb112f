//! Waiting for a condition instead of sleeping before an assertion: poll it, yielding between
//! looks, and fail with what was awaited once `deadline` (wall clock) has passed.
//!
//! The deadline is only a guard against a test that would otherwise hang: a passing test
//! returns as soon as the condition holds. It is measured on the wall clock, so it means the
//! same under `#[tokio::test(start_paused = true)]`, where the paused clock jumps ahead.

use std::fmt::Display;
use std::future::Future;
use std::time::{Duration, Instant};

/// How many looks are only separated by a yield to the scheduler before the waits start.
const YIELDS: u32 = 16;
/// The longest wait between two looks once yielding did not do.
const MAX_PAUSE: Duration = Duration::from_millis(10);

/// Returns once `done()` is true; panics naming `what` if it is still false after `deadline`.
pub async fn eventually(what: &str, deadline: Duration, mut done: impl FnMut() -> bool) {
    eventually_some(what, deadline, || done().then_some(())).await;
}

/// Returns the first `Some` that `look()` gives; panics naming `what` if it still gives `None`
/// after `deadline`.
pub async fn eventually_some<T>(
    what: &str,
    deadline: Duration,
    mut look: impl FnMut() -> Option<T>,
) -> T {
    let mut poller = Poller::new(what, deadline);
    loop {
        if let Some(v) = look() {
            return v;
        }
        poller.pause(None).await;
    }
}

/// [`eventually`] for a condition that must itself be awaited (a readiness call, a scrape).
pub async fn eventually_async<F, Fut>(what: &str, deadline: Duration, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let mut poller = Poller::new(what, deadline);
    while !done().await {
        poller.pause(None).await;
    }
}

/// Awaits `attempt()` until it gives `Ok` and returns that value (a server that must come up,
/// a scrape that must show a leader); panics naming `what` and the last error if it still
/// fails after `deadline`.
pub async fn eventually_ok<T, E, F, Fut>(what: &str, deadline: Duration, mut attempt: F) -> T
where
    E: Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut poller = Poller::new(what, deadline);
    loop {
        // Only the message lives on: `E` need not be `Send` for the future to be.
        let last = match attempt().await {
            Ok(v) => return v,
            Err(e) => e.to_string(),
        };
        poller.pause(Some(last.as_str())).await;
    }
}

/// The pacing between looks: a few bare yields (what another task needs to make progress),
/// then waits doubling from 1 ms up to [`MAX_PAUSE`], for progress made by threads, processes
/// or sockets that a yield does not drive.
struct Poller<'a> {
    what: &'a str,
    started: Instant,
    deadline: Duration,
    looks: u32,
    pause: Duration,
}

impl<'a> Poller<'a> {
    fn new(what: &'a str, deadline: Duration) -> Self {
        Poller {
            what,
            started: Instant::now(),
            deadline,
            looks: 0,
            pause: Duration::from_millis(1),
        }
    }

    /// Fails the test if the deadline has passed (showing `last`, what the last look saw),
    /// else waits before the next look.
    async fn pause(&mut self, last: Option<&str>) {
        let waited = self.started.elapsed();
        if waited >= self.deadline {
            match last {
                Some(last) => panic!(
                    "timed out after {waited:?} waiting until {}; last: {last}",
                    self.what
                ),
                None => panic!("timed out after {waited:?} waiting until {}", self.what),
            }
        }
        self.looks += 1;
        if self.looks <= YIELDS {
            tokio::task::yield_now().await;
        } else {
            // The one bounded wait between looks (see the type's doc); never before an assertion.
            tokio::time::sleep(self.pause).await;
            self.pause = (self.pause * 2).min(MAX_PAUSE);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    #[tokio::test]
    async fn returns_once_another_task_makes_it_true() {
        let flag = Arc::new(AtomicBool::new(false));
        tokio::spawn({
            let flag = flag.clone();
            async move { flag.store(true, Ordering::SeqCst) }
        });
        eventually("the task ran", Duration::from_secs(10), || {
            flag.load(Ordering::SeqCst)
        })
        .await;
    }

    #[tokio::test]
    async fn waits_for_another_thread() {
        let flag = Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn({
            let flag = flag.clone();
            move || {
                // Blocks until the test has started looking.
                rx.recv().unwrap();
                flag.store(true, Ordering::SeqCst);
            }
        });
        let mut sent = false;
        let value = eventually_some("the thread ran", Duration::from_secs(10), || {
            if !sent {
                tx.send(()).unwrap();
                sent = true;
            }
            flag.load(Ordering::SeqCst).then_some(5)
        })
        .await;
        assert_eq!(value, 5);
        thread.join().unwrap();
    }

    #[tokio::test(start_paused = true)]
    #[should_panic(expected = "timed out after")]
    async fn a_condition_that_stays_false_fails_naming_it() {
        // The wall-clock deadline, 0: the first look that fails is past it.
        eventually("never", Duration::ZERO, || false).await;
    }

    #[tokio::test]
    #[should_panic(expected = "waiting until up; last: refused 2")]
    async fn a_failing_attempt_fails_with_its_last_error() {
        let mut n = 0;
        eventually_ok("up", Duration::from_millis(20), || {
            n += 1;
            let n = n;
            async move { Err::<(), _>(format!("refused {}", n.min(2))) }
        })
        .await;
    }

    #[tokio::test]
    async fn an_async_condition_is_awaited() {
        let mut calls = 0;
        eventually_async("three calls", Duration::from_secs(10), || {
            calls += 1;
            let n = calls;
            async move { n >= 3 }
        })
        .await;
        assert_eq!(calls, 3);
    }
}
