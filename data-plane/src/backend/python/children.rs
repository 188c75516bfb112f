//! Every stub process of the server, from spawn until it has been reaped, so that shutdown can
//! wait for them and leave none behind.
//!
//! ```text
//!  Stub::launch ─► register(process) ─► Registration (segments added once connected)
//!  Registration dropped (the Stub is gone) ─► process reaped ─► entry removed
//!  shutdown (models unloaded: their stubs run finalize) ─► stop_all(deadline):
//!      wait until no entry is left, at most until the deadline
//!      ─► close: later registrations are refused
//!      ─► SIGKILL each process left, reap it, remove its shared-memory directory
//!      ─► the instances that had to be killed
//! ```

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::process::StubProcess;

/// How long a killed stub gets to be reaped (SIGKILL cannot be ignored; this only bounds a
/// process stuck in the kernel).
const REAP_WAIT: Duration = Duration::from_secs(5);

/// The server's live stub processes.
#[derive(Default)]
pub struct Children {
    state: Mutex<State>,
    /// Notified whenever an entry is removed.
    removed: Condvar,
}

#[derive(Default)]
struct State {
    next: u64,
    /// Set when shutdown starts killing: no stub starts after it.
    closed: bool,
    live: BTreeMap<u64, Entry>,
}

struct Entry {
    /// `model 'm' instance 'i'`, for the log.
    label: String,
    process: Arc<StubProcess>,
    /// The shared-memory directories of the process's stubs (one per member of a shared
    /// stub process).
    segments: Vec<PathBuf>,
}

/// One registered stub process; dropping it reaps the process and removes the entry.
pub struct Registration {
    children: Arc<Children>,
    id: u64,
    process: Arc<StubProcess>,
}

impl Children {
    /// Registers a spawned stub; `None` once shutdown has begun killing (the caller kills it).
    pub fn register(
        self: &Arc<Self>,
        label: String,
        process: &Arc<StubProcess>,
    ) -> Option<Registration> {
        let mut state = self.state.lock();
        if state.closed {
            return None;
        }
        let id = state.next;
        state.next += 1;
        state.live.insert(
            id,
            Entry {
                label,
                process: process.clone(),
                segments: Vec::new(),
            },
        );
        Some(Registration {
            children: self.clone(),
            id,
            process: process.clone(),
        })
    }

    /// Waits until every stub has exited and been reaped, at most until `deadline`; then
    /// kills (SIGKILL) and reaps those left and removes their shared-memory directories.
    /// Returns the stubs it had to kill. Later registrations are refused.
    pub fn stop_all(&self, deadline: Instant) -> Vec<String> {
        let mut state = self.state.lock();
        while !state.live.is_empty() {
            if self.removed.wait_until(&mut state, deadline).timed_out() {
                break;
            }
        }
        state.closed = true;
        let left: Vec<(String, Arc<StubProcess>, Vec<PathBuf>)> = state
            .live
            .values()
            .map(|e| (e.label.clone(), e.process.clone(), e.segments.clone()))
            .collect();
        drop(state);
        let mut killed = Vec::new();
        for (label, process, segments) in left {
            let pid = process.pid();
            process.kill();
            match process.wait_exit(REAP_WAIT) {
                Some(_) => {
                    tracing::error!(
                        pid,
                        "{label}: the Python stub did not finish finalize within the exit timeout; killed it"
                    );
                }
                None => {
                    tracing::error!(
                        pid,
                        "{label}: the Python stub did not finish finalize within the exit timeout and did not exit when killed"
                    );
                }
            }
            for dir in segments {
                if let Err(e) = std::fs::remove_dir_all(&dir)
                    && e.kind() != std::io::ErrorKind::NotFound
                {
                    tracing::warn!(path = %dir.display(), error = %e, "cannot remove a killed Python stub's shared-memory directory");
                }
            }
            killed.push(format!("{label} (pid {pid})"));
        }
        killed
    }

    fn add_segments(&self, id: u64, dir: PathBuf) {
        if let Some(entry) = self.state.lock().live.get_mut(&id) {
            entry.segments.push(dir);
        }
    }
}

impl Registration {
    /// A shared-memory directory of the process's stubs, removed by [`Children::stop_all`] if
    /// it kills the process.
    pub fn add_segments(&self, dir: PathBuf) {
        self.children.add_segments(self.id, dir);
    }
}

impl Drop for Registration {
    /// The stub is being torn down: make sure its process is gone and reaped, then forget it.
    fn drop(&mut self) {
        if self.process.stop(Duration::ZERO).is_none() {
            self.process.wait_exit(REAP_WAIT);
        }
        self.children.state.lock().live.remove(&self.id);
        self.children.removed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::python::process::{describe_exit, private_dir, shell_process, socket_path};

    #[test]
    fn stop_all_waits_for_exits_then_kills_and_reaps_the_rest() {
        // One directory per process: each writes its script there.
        let sh = |script: &str| {
            let dir = private_dir("nereid-test-").unwrap();
            let process = shell_process(script, &socket_path(dir.path()), dir.path());
            (Arc::new(process), dir)
        };
        let children = Arc::new(Children::default());
        let (quick, _quick_dir) = sh("exit 0");
        let (hung, _hung_dir) = sh("exec sleep 30");
        let quick_reg = children.register("quick".into(), &quick).unwrap();
        let hung_reg = children.register("hung".into(), &hung).unwrap();
        // A shared stub process has a directory per member.
        let segments = tempfile::tempdir().unwrap().keep();
        let member_segments = tempfile::tempdir().unwrap().keep();
        hung_reg.add_segments(segments.clone());
        hung_reg.add_segments(member_segments.clone());
        // The quick one's owner tears it down while stop_all waits.
        let dropper = std::thread::spawn(move || {
            quick.wait_exit(Duration::from_secs(10));
            drop(quick_reg);
        });
        let started = Instant::now();
        let killed = children.stop_all(Instant::now() + Duration::from_millis(500));
        dropper.join().unwrap();
        assert!(started.elapsed() < Duration::from_secs(8));
        assert_eq!(killed.len(), 1, "{killed:?}");
        assert!(killed[0].starts_with("hung (pid "), "{killed:?}");
        let status = hung.wait_exit(Duration::ZERO).expect("reaped");
        assert_eq!(describe_exit(status), "was killed by signal 9 (SIGKILL)");
        assert!(!segments.exists(), "its shared-memory directory is removed");
        assert!(
            !member_segments.exists(),
            "every member's directory is removed"
        );
        // Closed: a stub started now is refused.
        let (late, _late_dir) = sh("exec sleep 30");
        assert!(children.register("late".into(), &late).is_none());
        drop(hung_reg);
        assert!(children.state.lock().live.is_empty());
    }

    #[test]
    fn stop_all_returns_at_once_when_every_stub_is_gone() {
        let children = Arc::new(Children::default());
        let started = Instant::now();
        assert!(
            children
                .stop_all(Instant::now() + Duration::from_secs(30))
                .is_empty()
        );
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
