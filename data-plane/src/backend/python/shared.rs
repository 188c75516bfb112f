//! A shared stub process: several instances of one Python model in one process, one
//! `TritonPythonModel` per instance on its own thread (model parameter `SHARED_STUB_PROCESS`, a
//! Nereid extension). On a GPU its instances share one CUDA context instead of time-slicing
//! the GPU between processes.
//!
//! ```text
//!  load_instance(m_k) ─► placement: group, device, process, member (pure)
//!      first member: SharedHost::launch ─► one process, N members (Stub each: connections,
//!                    segment directory, reader) ─► the backend keeps it while instances use it
//!      every member: initialize(member, its own init args) ─► death hook armed
//!  execute on m_k ─► current(k) ─► that member's Stub (as a stub of its own)
//!  process dies ─► every member's hook: Health unhealthy (Triton's reason), Died(generation)
//!      supervisor: first Died of this generation ─► drop the generation ─► launch a new process
//!      ─► initialize every loaded member again ─► healthy; fail ─► retry after 1 s ... 30 s
//!  instance unloaded ─► finalize_member(k) (finalize, then disconnect; the member ends)
//!  last instance gone ─► SharedHost dropped: supervisor stopped, members disconnected,
//!      the process exits by itself (bounded by the start timeout) or is killed
//! ```
//!
//! The process is one crash domain: whatever kills it fails the requests in flight of all its
//! instances, each with its own `Stub process '<instance>' is not healthy.` reason, and they are
//! restarted together.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use parking_lot::Mutex;

use super::children::Registration;
use super::process::StubProcess;
use super::reader::unhealthy_reason;
use super::stub::{StartGuard, Stub, StubError, StubSpec};
use crate::backend::{BackendError, Health};
use crate::config::{GroupKind, InstanceGroup};
use nereid_stub_protocol::message::InitArgs;

const FIRST_RETRY: Duration = Duration::from_secs(1);
const LAST_RETRY: Duration = Duration::from_secs(30);
/// How long a dead process's replacement waits for it to be reaped (SIGKILL cannot be
/// ignored; this only bounds a process stuck in the kernel).
const EXIT_WAIT: Duration = Duration::from_secs(5);

/// Which shared process hosts an instance: processes are per instance group and device, each
/// with at most the configured number of members.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HostKey {
    /// The instance group's name.
    pub group: String,
    /// Which of the group's devices (0 for `KIND_CPU`; the position in `gpus` for `KIND_GPU`).
    pub device_slot: usize,
    /// Which process of that group and device.
    pub process: usize,
}

/// Where one instance goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub key: HostKey,
    /// The instance's position in its process.
    pub member: usize,
    /// The instance names of every member of that process, in order.
    pub names: Vec<String>,
}

/// Places instance `instance` (named `<group>_<index>`, the index counting across the
/// group's devices) in a process of at most `per_process` members; `None` if no group has it.
pub fn placement(
    groups: &[InstanceGroup],
    instance: &str,
    per_process: usize,
) -> Option<Placement> {
    groups.iter().find_map(|group| {
        let index: usize = instance
            .strip_prefix(group.name.as_str())?
            .strip_prefix('_')?
            .parse()
            .ok()?;
        let count = usize::try_from(group.count).ok()?;
        let devices = match &group.kind {
            GroupKind::Gpu { gpus } => gpus.len(),
            GroupKind::Cpu | GroupKind::Model => 1,
        };
        if count == 0 || index >= count.saturating_mul(devices) {
            return None;
        }
        let (device_slot, position) = (index / count, index % count);
        let per_process = per_process.max(1);
        let process = position / per_process;
        let first = process * per_process;
        let members = per_process.min(count - first);
        let base = device_slot * count + first;
        Some(Placement {
            key: HostKey {
                group: group.name.clone(),
                device_slot,
                process,
            },
            member: position - first,
            names: (base..base + members)
                .map(|i| format!("{}_{i}", group.name))
                .collect(),
        })
    })
}

enum Event {
    Died(u64),
    Shutdown,
}

/// What starts the process's members and initializes them again after a crash.
pub struct HostSpec {
    /// The spec of the process (its `instance` is the first member's name).
    pub spec: StubSpec,
    pub names: Vec<String>,
    pub model_file: String,
    pub decoupled: bool,
    pub health: Arc<Health>,
}

struct State {
    /// The current process's member stubs; `None` for a finalized member or while restarting.
    stubs: Vec<Option<Arc<Stub>>>,
    /// The init args of each loaded member: what a restart initializes again.
    args: Vec<Option<InitArgs>>,
    /// Members whose instance was unloaded: a restart leaves them out.
    unloaded: Vec<bool>,
    /// Bumped when the process is replaced: deaths of an older process are stale. Mirrored in
    /// [`Inner::generation`] for death hooks, which must not wait for this lock.
    generation: u64,
    /// The current process, reaped and unregistered when its `Registration` goes (last).
    process: Option<(Arc<StubProcess>, Arc<Registration>)>,
}

struct Inner {
    host: HostSpec,
    state: Mutex<State>,
    generation: AtomicU64,
}

/// One shared stub process of a model version, and the supervisor that restarts it.
pub struct SharedHost {
    inner: Arc<Inner>,
    events: Sender<Event>,
    guard: Arc<StartGuard>,
    thread: Option<JoinHandle<()>>,
}

impl SharedHost {
    /// Starts the process with every member connected (none initialized yet).
    pub fn launch(host: HostSpec) -> Result<Self, BackendError> {
        let stubs = Stub::launch_shared(&host.spec, &host.names, None)
            .map_err(|e| BackendError::Load(e.to_string()))?;
        let process = process_of(&stubs);
        let members = stubs.len();
        let inner = Arc::new(Inner {
            host,
            state: Mutex::new(State {
                stubs: stubs.into_iter().map(|s| Some(Arc::new(s))).collect(),
                args: vec![None; members],
                unloaded: vec![false; members],
                generation: 0,
                process,
            }),
            generation: AtomicU64::new(0),
        });
        let (events, rx) = crossbeam_channel::unbounded();
        let guard = Arc::new(StartGuard::default());
        let thread = {
            let (inner, guard, events) = (inner.clone(), guard.clone(), events.clone());
            std::thread::Builder::new()
                .name("python-shared-supervisor".into())
                .spawn(move || supervise(&inner, &guard, &events, &rx))
                .map_err(|e| {
                    BackendError::Load(format!(
                        "cannot start the shared stub process's supervisor thread: {e}"
                    ))
                })?
        };
        Ok(SharedHost {
            inner,
            events,
            guard,
            thread: Some(thread),
        })
    }

    /// Runs member `member`'s `initialize` with `args` (its own instance name, kind, device).
    pub fn initialize(&self, member: usize, args: InitArgs) -> Result<(), BackendError> {
        let host = &self.inner.host;
        let (stub, generation) = {
            let state = self.inner.state.lock();
            let stub = state.stubs.get(member).cloned().flatten();
            (stub, state.generation)
        };
        let Some(stub) = stub else {
            return Err(BackendError::Load(format!(
                "model '{}' instance '{}': its shared stub process is not running",
                host.spec.model,
                host.names.get(member).map_or("?", String::as_str)
            )));
        };
        stub.initialize(host.model_file.clone(), args.clone(), host.decoupled)
            .map_err(|e| BackendError::Load(e.to_string()))?;
        let mut state = self.inner.state.lock();
        if state.generation == generation {
            state.args[member] = Some(args);
            arm(&self.inner, &stub, member, generation, &self.events);
        }
        Ok(())
    }

    /// The live stub of `member`, or the reason there is none.
    pub fn current(&self, member: usize) -> Result<Arc<Stub>, String> {
        let name = &self.inner.host.names[member];
        match self.inner.state.lock().stubs.get(member).cloned().flatten() {
            Some(stub) if stub.link().death_reason().is_none() => Ok(stub),
            _ => Err(self
                .inner
                .host
                .health
                .unavailable_reason()
                .unwrap_or_else(|| format!("Stub process '{name}' is not healthy."))),
        }
    }

    /// The process id (`None` while it is being replaced).
    pub fn pid(&self) -> Option<u32> {
        let state = self.inner.state.lock();
        state.process.as_ref().map(|(process, _)| process.pid())
    }

    /// Member `member`'s instance is unloaded: runs its `finalize` and disconnects it (the
    /// member ends; the process lives on while other members do).
    pub fn finalize_member(&self, member: usize) {
        let stub = {
            let mut state = self.inner.state.lock();
            state.args[member] = None;
            state.unloaded[member] = true;
            state.stubs[member].take()
        };
        if let Some(stub) = stub {
            stub.finalize();
        }
        self.inner
            .host
            .health
            .set_healthy(&self.inner.host.names[member]);
    }
}

impl Drop for SharedHost {
    /// Stops the supervisor (killing a process it is starting), disconnects the members left
    /// and gives the process the start timeout to exit before it is killed.
    fn drop(&mut self) {
        let _ = self.events.send(Event::Shutdown);
        self.guard.abort();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        let (stubs, process) = {
            let mut state = self.inner.state.lock();
            let stubs: Vec<Arc<Stub>> = state.stubs.iter_mut().filter_map(Option::take).collect();
            (stubs, state.process.take())
        };
        drop(stubs);
        if let Some((process, registration)) = process
            && process
                .wait_exit(self.inner.host.spec.start_timeout)
                .is_none()
        {
            tracing::warn!(model = %self.inner.host.spec.model, "the shared Python stub process did not exit within {:?} of its last instance; killing it", self.inner.host.spec.start_timeout);
            drop(registration);
        }
    }
}

/// The process (and its registration) the members of one launch share.
fn process_of(stubs: &[Stub]) -> Option<(Arc<StubProcess>, Arc<Registration>)> {
    stubs
        .first()
        .map(|s| (s.process().clone(), s.registration().clone()))
}

/// Makes `member` healthy and installs its death hook for `generation` (it runs at once if the
/// stub already died). Called with the state locked.
fn arm(inner: &Arc<Inner>, stub: &Stub, member: usize, generation: u64, events: &Sender<Event>) {
    let name = inner.host.names[member].clone();
    inner.host.health.set_healthy(&name);
    let (weak, events) = (Arc::downgrade(inner), events.clone());
    stub.on_death(Box::new(move |reason: &str| {
        let Some(inner) = weak.upgrade() else { return };
        // A death of a replaced process changes nothing.
        if inner.generation.load(Ordering::Acquire) == generation {
            inner.host.health.set_unhealthy(&name, reason);
            let _ = events.send(Event::Died(generation));
        }
    }));
}

fn supervise(inner: &Arc<Inner>, guard: &StartGuard, events: &Sender<Event>, rx: &Receiver<Event>) {
    let host = &inner.host;
    while let Ok(Event::Died(generation)) = rx.recv() {
        let old = {
            let mut state = inner.state.lock();
            if state.generation != generation {
                continue;
            }
            state.generation += 1;
            inner.generation.store(state.generation, Ordering::Release);
            for (member, stub) in state.stubs.iter().enumerate() {
                if let Some(stub) = stub
                    && state.args[member].is_some()
                {
                    let name = &host.names[member];
                    let reason = stub
                        .link()
                        .death_reason()
                        .unwrap_or_else(|| unhealthy_reason(name, "Its shared stub process died."));
                    host.health.set_unhealthy(name, reason);
                }
            }
            let stubs: Vec<Arc<Stub>> = state.stubs.iter_mut().filter_map(Option::take).collect();
            (stubs, state.process.take())
        };
        tracing::warn!(model = %host.spec.model, instances = %host.names.join(", "), "the shared Python stub process died; restarting it with its instances");
        // Reaped before the members are dropped, so that every member's reader, however
        // late, reports how the process ended (not that its member was shut down).
        if let Some((process, _)) = &old.1 {
            process.kill();
            process.wait_exit(EXIT_WAIT);
        }
        drop(old);
        let mut retry = FIRST_RETRY;
        loop {
            match restart(inner, guard, events) {
                Ok(()) => {
                    tracing::info!(model = %host.spec.model, instances = %host.names.join(", "), "shared Python stub process restarted");
                    break;
                }
                Err(e) => {
                    tracing::error!(model = %host.spec.model, instances = %host.names.join(", "), "restarting the shared Python stub process failed: {e}");
                    let state = inner.state.lock();
                    for (member, args) in state.args.iter().enumerate() {
                        if args.is_some() {
                            let name = &host.names[member];
                            host.health.set_unhealthy(
                                name,
                                unhealthy_reason(
                                    name,
                                    &format!("Restarting its shared stub process failed: {e}"),
                                ),
                            );
                        }
                    }
                }
            }
            match rx.recv_timeout(retry) {
                Err(RecvTimeoutError::Timeout) | Ok(Event::Died(_)) => {}
                Ok(Event::Shutdown) | Err(RecvTimeoutError::Disconnected) => return,
            }
            retry = (retry * 2).min(LAST_RETRY);
        }
    }
}

/// Launches a new process and initializes every loaded member in it; all or nothing.
fn restart(
    inner: &Arc<Inner>,
    guard: &StartGuard,
    events: &Sender<Event>,
) -> Result<(), StubError> {
    let host = &inner.host;
    let started = Stub::launch_shared(&host.spec, &host.names, Some(guard));
    let initialized = started.and_then(|stubs| {
        let wanted = inner.state.lock().args.clone();
        for (stub, args) in stubs.iter().zip(wanted) {
            if let Some(args) = args {
                stub.initialize(host.model_file.clone(), args, host.decoupled)?;
            }
        }
        Ok(stubs)
    });
    guard.untrack();
    let stubs = initialized?;
    let mut state = inner.state.lock();
    state.process = process_of(&stubs);
    let generation = state.generation;
    for (member, stub) in stubs.into_iter().enumerate() {
        // A member unloaded meanwhile is only disconnected (its stub dropped here); one not
        // loaded yet waits for its `initialize`.
        if state.unloaded[member] {
            continue;
        }
        let stub = Arc::new(stub);
        if state.args[member].is_some() {
            arm(inner, &stub, member, generation, events);
        }
        state.stubs[member] = Some(stub);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(name: &str, count: u32, kind: GroupKind) -> InstanceGroup {
        InstanceGroup {
            name: name.into(),
            count,
            kind,
            resources: Vec::new(),
            priority: 0,
        }
    }

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_instances_of_a_group_on_one_device_share_one_process() {
        let groups = [group("m_0", 3, GroupKind::Cpu)];
        for (i, instance) in ["m_0_0", "m_0_1", "m_0_2"].iter().enumerate() {
            let p = placement(&groups, instance, usize::MAX).unwrap();
            assert_eq!(p.member, i);
            assert_eq!(p.names, names(&["m_0_0", "m_0_1", "m_0_2"]));
            assert_eq!(
                p.key,
                HostKey {
                    group: "m_0".into(),
                    device_slot: 0,
                    process: 0
                }
            );
        }
        assert_eq!(placement(&groups, "m_0_3", usize::MAX), None);
        assert_eq!(placement(&groups, "other_0", usize::MAX), None);
    }

    #[test]
    fn gpus_get_processes_of_their_own() {
        let groups = [group("g", 2, GroupKind::Gpu { gpus: vec![0, 3] })];
        let p = placement(&groups, "g_3", usize::MAX).unwrap();
        assert_eq!((p.key.device_slot, p.key.process, p.member), (1, 0, 1));
        assert_eq!(p.names, names(&["g_2", "g_3"]));
        let p = placement(&groups, "g_1", usize::MAX).unwrap();
        assert_eq!((p.key.device_slot, p.member), (0, 1));
        assert_eq!(p.names, names(&["g_0", "g_1"]));
    }

    #[test]
    fn a_count_splits_a_device_into_processes() {
        let groups = [
            group("a", 1, GroupKind::Cpu),
            group("a_1", 5, GroupKind::Model),
        ];
        let at = |instance: &str| placement(&groups, instance, 2).unwrap();
        assert_eq!(at("a_0").names, names(&["a_0"]));
        let p = at("a_1_3");
        assert_eq!(
            (p.key.group.as_str(), p.key.process, p.member),
            ("a_1", 1, 1)
        );
        assert_eq!(p.names, names(&["a_1_2", "a_1_3"]));
        let last = at("a_1_4");
        assert_eq!((last.key.process, last.member), (2, 0));
        assert_eq!(last.names, names(&["a_1_4"]), "the remainder");
    }
}
