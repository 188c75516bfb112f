//! Keeping an instance's stub alive: the current stub, and the thread that replaces it when it
//! dies.
//!
//! ```text
//!  reader sees the stub die ─► death hook: Health unhealthy (Triton's reason), Died event
//!  supervisor thread: Died ─► drop the dead stub ─► start + initialize a new one
//!      ok   ─► Health healthy, it becomes current (its own death hook installed)
//!      fail ─► Health unhealthy with why, retry after 1 s, 2 s, 4 s ... 30 s
//!  Shutdown (the instance is dropped) ─► the thread ends
//! ```
//!
//! While no live stub is current, `execute` fails at once with the unhealthy reason.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use parking_lot::Mutex;

use super::stub::{StartGuard, Stub, StubError, StubSpec};
use crate::backend::Health;
use nereid_stub_protocol::message::InitArgs;

const FIRST_RETRY: Duration = Duration::from_secs(1);
const LAST_RETRY: Duration = Duration::from_secs(30);
/// Events queued for the supervisor: at most one death per stub, and one shutdown.
const EVENT_CAPACITY: usize = 4;

/// How to start and initialize a stub for one instance.
pub struct Launcher {
    pub spec: StubSpec,
    pub model_file: String,
    pub args: InitArgs,
    pub decoupled: bool,
}

impl Launcher {
    /// Starts and initializes a stub; `guard` can stop it meanwhile.
    pub fn start(&self, guard: Option<&StartGuard>) -> Result<Stub, StubError> {
        let started = Stub::launch(&self.spec, guard).and_then(|stub| {
            stub.initialize(self.model_file.clone(), self.args.clone(), self.decoupled)?;
            Ok(stub)
        });
        if let Some(guard) = guard {
            guard.untrack();
        }
        started
    }
}

enum Event {
    Died(String),
    Shutdown,
}

/// The instance's current stub and the supervisor that replaces it.
pub struct Supervised {
    current: Arc<Mutex<Option<Arc<Stub>>>>,
    health: Arc<Health>,
    instance: String,
    events: Sender<Event>,
    /// Stops a restart in progress when the instance is dropped.
    guard: Arc<StartGuard>,
    thread: Option<JoinHandle<()>>,
}

impl Supervised {
    /// Takes over a started stub and starts the supervisor thread.
    pub fn start(stub: Stub, launcher: Launcher, health: Arc<Health>) -> Result<Self, String> {
        let (events, rx) = crossbeam_channel::bounded(EVENT_CAPACITY);
        let current = Arc::new(Mutex::new(None));
        let instance = launcher.spec.instance.clone();
        install(&current, stub, &health, &instance, &events);
        let guard = Arc::new(StartGuard::default());
        let thread = {
            let (current, health, events) = (current.clone(), health.clone(), events.clone());
            let guard = guard.clone();
            std::thread::Builder::new()
                .name(format!("python-supervisor-{instance}"))
                .spawn(move || {
                    supervisor_task(&launcher, &guard, &current, &health, &events, &rx);
                })
                .map_err(|e| format!("cannot start the stub supervisor thread: {e}"))?
        };
        Ok(Supervised {
            current,
            health,
            instance,
            events,
            guard,
            thread: Some(thread),
        })
    }

    /// The process id of the current stub (`None` while it is being replaced).
    pub fn pid(&self) -> Option<u32> {
        self.current.lock().as_ref().map(|stub| stub.pid())
    }

    /// The live stub, or the reason there is none.
    pub fn current(&self) -> Result<Arc<Stub>, String> {
        let reason = || {
            self.health
                .unavailable_reason()
                .unwrap_or_else(|| format!("Stub process '{}' is not healthy.", self.instance))
        };
        match &*self.current.lock() {
            Some(stub) if stub.link().death_reason().is_none() => Ok(stub.clone()),
            _ => Err(reason()),
        }
    }
}

impl Drop for Supervised {
    /// Stops the supervisor (killing a stub it is starting), then finalizes the current stub.
    fn drop(&mut self) {
        let _ = self.events.send(Event::Shutdown);
        self.guard.abort();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        if let Some(stub) = self.current.lock().take() {
            stub.finalize();
        }
        self.health.set_healthy(&self.instance);
    }
}

/// Makes `stub` current and healthy, then arms its death hook (which runs at once if the stub
/// already died, so no death is missed).
fn install(
    current: &Mutex<Option<Arc<Stub>>>,
    stub: Stub,
    health: &Arc<Health>,
    instance: &str,
    events: &Sender<Event>,
) {
    let stub = Arc::new(stub);
    *current.lock() = Some(stub.clone());
    health.set_healthy(instance);
    let (health, instance, events) = (health.clone(), instance.to_string(), events.clone());
    stub.on_death(Box::new(move |reason: &str| {
        health.set_unhealthy(&instance, reason);
        let _ = events.send(Event::Died(reason.to_string()));
    }));
}

fn supervisor_task(
    launcher: &Launcher,
    guard: &StartGuard,
    current: &Mutex<Option<Arc<Stub>>>,
    health: &Arc<Health>,
    events: &Sender<Event>,
    rx: &Receiver<Event>,
) {
    let spec = &launcher.spec;
    while let Ok(Event::Died(reason)) = rx.recv() {
        tracing::warn!(model = %spec.model, instance = %spec.instance, "{reason} Restarting it.");
        drop(current.lock().take());
        let mut retry = FIRST_RETRY;
        loop {
            match launcher.start(Some(guard)) {
                Ok(stub) => {
                    install(current, stub, health, &spec.instance, events);
                    tracing::info!(model = %spec.model, instance = %spec.instance, "Python stub restarted");
                    break;
                }
                Err(e) => {
                    tracing::error!(model = %spec.model, instance = %spec.instance, "restarting the Python stub failed: {e}");
                    health.set_unhealthy(
                        &spec.instance,
                        format!("{reason} Restarting it failed: {e}"),
                    );
                }
            }
            // Wait before the next attempt, unless told to stop.
            match rx.recv_timeout(retry) {
                Err(RecvTimeoutError::Timeout) | Ok(Event::Died(_)) => {}
                Ok(Event::Shutdown) | Err(RecvTimeoutError::Disconnected) => return,
            }
            retry = (retry * 2).min(LAST_RETRY);
        }
    }
}
