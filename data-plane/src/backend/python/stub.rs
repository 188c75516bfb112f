//! [`Stub`]: one running stub process and its connection, from spawn to teardown.
//!
//! ```text
//!  launch:     private socket dir ─► bind ─► spawn ─► accept three connections (≤ start
//!              timeout each, or the stub's exit): commands, answers, events
//!              ─► Link (writes commands) + reader thread (events)
//!  handshake:  init ─► init_done            (≤ initialize timeout)  = a model instance
//!              auto_complete ─► auto_complete_done                   = a throw-away stub
//!  finalize:   finalize ─► finalize_done ─► exit (≤ start timeout each)
//!  drop:       kill if still running ─► join reader ─► remove the stub's segment directory
//!              ─► reap the process and leave the server's [`Children`]
//! ```
//!
//! Each connection goes one way. The stub answers `init`, `auto_complete`, `execute` and
//! `finalize` on the answers connection, which the thread waiting for the answer reads itself
//! ([`Stub::wait_reply`]): a request costs no hand-over between server threads. Everything else
//! the stub sends (logs, decoupled responses, BLS calls, metrics, releases its release thread
//! sends) comes on the events connection, read by the reader thread. One way each, because a
//! thread blocked reading a Unix socket is woken whenever the peer consumes what was written on
//! that same socket: with one socket both ways, every request would wake both sides twice.
//!
//! The socket and its directory are removed as soon as the stub has connected. Then the stub
//! gets its own segment directory (see [`shm`]): `/dev/shm/nereid-py-<server pid>-<instance>-
//! <random>/`, mode 0700, so only this server and its stubs can open the tensors inside; client
//! shared-memory keys name single files under `/dev/shm` and cannot reach into it. A restarted
//! stub gets a new directory; the dead one's goes when its `Stub` is dropped.

use std::io::{self, BufReader};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use parking_lot::Mutex;
use serde_json::Value;

use super::children::{Children, Registration};
use super::link::{DeathHook, Link};
use super::process::{self, AcceptError, StubCommand, StubProcess, describe_exit};
use super::reader;
use super::runtime::RuntimeDir;
use super::shm;
use crate::backend::ServerHandle;
use nereid_stub_protocol::frame::{self, FrameError};
use nereid_stub_protocol::message::{ErrorObject, FromStub, InitArgs, ToStub};

/// How long the waiting thread waits, once the answers connection ended, for the reader
/// thread's account of the death (it gives the stub a few seconds to exit first).
const DEATH_NOTICE_WAIT: Duration = Duration::from_secs(10);

/// Everything needed to start a stub for one model instance.
#[derive(Clone)]
pub struct StubSpec {
    pub model: String,
    /// The instance name (Triton's `<group>_<index>`), or a name for a throw-away stub.
    pub instance: String,
    /// A throw-away stub (auto-complete): messages leave naming the model to the caller.
    pub throwaway: bool,
    pub python: PathBuf,
    pub runtime: Arc<RuntimeDir>,
    /// The model's version directory: the stub's working directory.
    pub cwd: PathBuf,
    pub start_timeout: Duration,
    pub initialize_timeout: Duration,
    pub server: Arc<ServerHandle>,
    /// The server's stub processes: shutdown waits for them and kills those left.
    pub children: Arc<Children>,
}

impl StubSpec {
    /// What messages start with: `model 'm' instance 'i': `, or nothing for a throw-away
    /// stub.
    fn label(&self) -> String {
        if self.throwaway {
            String::new()
        } else {
            format!("model '{}' instance '{}': ", self.model, self.instance)
        }
    }
}

/// What went wrong with a stub, by meaning.
#[derive(Debug, thiserror::Error)]
pub enum StubError {
    /// The stub could not be started or did not connect.
    #[error("{0}")]
    Start(String),
    /// The stub died; Triton's "not healthy" reason.
    #[error("{0}")]
    Dead(String),
    /// The stub did not answer in time (and was killed).
    #[error("{0}")]
    TimedOut(String),
    /// The model's code failed (the Python traceback).
    #[error("{0}")]
    Model(String),
}

/// One connected stub process.
pub struct Stub {
    spec: StubSpec,
    link: Arc<Link>,
    /// The stub's answers, read by the thread that waits for one.
    answers: Mutex<Answers>,
    /// The reader thread's death notice.
    deaths: Receiver<String>,
    process: Arc<StubProcess>,
    reader: Option<JoinHandle<()>>,
    /// Both sides' segments; removed when the stub is dropped (after the process is gone).
    segments: shm::SegmentDir,
    next_execute: AtomicU64,
    /// A member of a shared stub process: its end is not the process's end.
    shared: bool,
    /// The events connection, shut down on drop so the reader ends even while a shared
    /// process lives on.
    events: Option<UnixStream>,
    /// Dropped last: the process is reaped and its directory gone before shutdown stops
    /// waiting for it. Shared by the members of a shared stub process.
    registration: Arc<Registration>,
}

impl Stub {
    /// Spawns a stub and waits for it to connect. While `guard` tracks it, another thread can
    /// stop it with [`StartGuard::abort`].
    pub fn launch(spec: &StubSpec, guard: Option<&StartGuard>) -> Result<Stub, StubError> {
        let mut stubs = Self::spawn(spec, None, guard)?;
        stubs
            .pop()
            .ok_or_else(|| StubError::Start(format!("{}no stub connected", spec.label())))
    }

    /// Spawns one shared stub process for the instances `members` (in order) and waits for
    /// every member to connect: one [`Stub`] per member, each with its own connections,
    /// segment directory and reader thread, all in the one process.
    pub fn launch_shared(
        spec: &StubSpec,
        members: &[String],
        guard: Option<&StartGuard>,
    ) -> Result<Vec<Stub>, StubError> {
        Self::spawn(spec, Some(members), guard)
    }

    fn spawn(
        spec: &StubSpec,
        members: Option<&[String]>,
        guard: Option<&StartGuard>,
    ) -> Result<Vec<Stub>, StubError> {
        let label = spec.label();
        let start =
            |what: &str, e: &dyn std::fmt::Display| StubError::Start(format!("{label}{what}: {e}"));
        let socket_dir = process::private_dir("nereid-stub-")
            .map_err(|e| start("cannot create the stub's socket directory", &e))?;
        let socket = process::socket_path(socket_dir.path());
        let listener =
            UnixListener::bind(&socket).map_err(|e| start("cannot bind the stub socket", &e))?;
        let process = StubProcess::spawn(&StubCommand {
            python: &spec.python,
            script: &spec.runtime.stub_script(),
            runtime_dir: spec.runtime.path(),
            socket: &socket,
            cwd: &spec.cwd,
            members: members.map(<[String]>::len),
        })
        .map_err(|e| StubError::Start(format!("{label}{e}")))?;
        let process = Arc::new(process);
        let who = match members {
            None => format!("model '{}' instance '{}'", spec.model, spec.instance),
            Some(names) => format!(
                "model '{}' instances '{}' (a shared stub process)",
                spec.model,
                names.join("', '")
            ),
        };
        let Some(registration) = spec.children.register(who, &process) else {
            process.kill();
            return Err(StubError::Start(format!(
                "{label}the server is shutting down"
            )));
        };
        let registration = Arc::new(registration);
        if let Some(guard) = guard {
            guard.track(&process);
        }
        let single = [spec.instance.clone()];
        let names = members.unwrap_or(&single);
        let mut stubs = Vec::with_capacity(names.len());
        for name in names {
            let spec = StubSpec {
                instance: name.clone(),
                ..spec.clone()
            };
            let shared = members.is_some();
            stubs.push(Self::connect(
                &spec,
                &listener,
                &process,
                &registration,
                shared,
            )?);
        }
        // Connected: the socket's directory is not needed any more (nothing is left behind in
        // the temp directory even if the server never gets to drop this stub).
        drop(listener);
        drop(socket_dir);
        Ok(stubs)
    }

    /// Accepts one member's three connections and starts its reader.
    fn connect(
        spec: &StubSpec,
        listener: &UnixListener,
        process: &Arc<StubProcess>,
        registration: &Arc<Registration>,
        shared: bool,
    ) -> Result<Stub, StubError> {
        let label = spec.label();
        let start =
            |what: &str, e: &dyn std::fmt::Display| StubError::Start(format!("{label}{what}: {e}"));
        let accept = || match process.accept(listener, spec.start_timeout) {
            Ok(stream) => Ok(stream),
            Err(e) => Err(accept_error(spec, process, e)),
        };
        let commands = accept()?;
        let answers = accept()?;
        let events = accept()?;
        let segments = segment_dir(&spec.instance)
            .map_err(|e| start("cannot create the stub's shared-memory directory", &e))?;
        registration.add_segments(segments.path().to_path_buf());
        let link = Arc::new(Link::new(
            spec.model.clone(),
            spec.instance.clone(),
            spec.server.clone(),
            commands,
            &segments.prefix(),
        ));
        let events_handle = events.try_clone().ok();
        let (tx, deaths) = crossbeam_channel::bounded(1);
        let reader = reader::spawn(link.clone(), events, tx, process.clone(), shared)
            .map_err(|e| start("cannot start the stub's reader thread", &e))?;
        tracing::debug!(model = %spec.model, instance = %spec.instance, "Python stub connected");
        Ok(Stub {
            spec: spec.clone(),
            link,
            answers: Mutex::new(Answers::new(answers)),
            deaths,
            process: process.clone(),
            reader: Some(reader),
            segments,
            next_execute: AtomicU64::new(0),
            shared,
            events: events_handle,
            registration: registration.clone(),
        })
    }

    /// Sends `init` and waits for the model's `initialize` to finish.
    pub fn initialize(
        &self,
        model_file: String,
        args: InitArgs,
        decoupled: bool,
    ) -> Result<(), StubError> {
        let message = ToStub::Init {
            protocol_version: nereid_stub_protocol::PROTOCOL_VERSION,
            shm_prefix: self.segments.prefix(),
            model_file,
            args,
            decoupled,
        };
        let reply = self.request(&message, "initialize")?;
        match reply {
            FromStub::InitDone { error: None } => Ok(()),
            FromStub::InitDone { error: Some(e) } => Err(self.model_error("initialize", e)),
            other => Err(self.unexpected("init_done", &other)),
        }
    }

    /// Sends `auto_complete` and returns the completed config JSON.
    pub fn auto_complete(&self, model_file: String, config: Value) -> Result<Value, StubError> {
        let message = ToStub::AutoComplete {
            protocol_version: nereid_stub_protocol::PROTOCOL_VERSION,
            shm_prefix: self.segments.prefix(),
            model_file,
            config,
        };
        match self.request(&message, "auto_complete_config")? {
            FromStub::AutoCompleteDone { error: Some(e), .. } => {
                Err(self.model_error("auto_complete_config", e))
            }
            FromStub::AutoCompleteDone {
                config: Some(config),
                error: None,
            } => Ok(config),
            other => Err(self.unexpected("auto_complete_done with a config", &other)),
        }
    }

    /// Asks the model to finalize and the stub to exit, each bounded by the start timeout;
    /// a stub that does not comply is killed on drop.
    pub fn finalize(&self) {
        self.link.set_closing();
        if self.link.death_reason().is_some() {
            return;
        }
        let timeout = self.spec.start_timeout;
        let deadline = Instant::now() + timeout;
        if self.link.send(&ToStub::Finalize).is_ok() {
            loop {
                match self.wait_reply(Some(deadline)) {
                    Ok(FromStub::FinalizeDone { error: None }) => break,
                    Ok(FromStub::FinalizeDone { error: Some(e) }) => {
                        tracing::warn!(model = %self.spec.model, instance = %self.spec.instance, "the model's finalize failed: {}", e.message);
                        break;
                    }
                    // A stale answer (e.g. of an execute that failed): keep waiting.
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(model = %self.spec.model, instance = %self.spec.instance, "finalize: {e}");
                        break;
                    }
                }
            }
        }
        // A member of a shared process ends by itself; the process exits with the last one.
        if !self.shared
            && self
                .process
                .wait_exit(deadline.saturating_duration_since(Instant::now()))
                .is_none()
        {
            tracing::warn!(model = %self.spec.model, instance = %self.spec.instance, "the Python stub did not exit within {timeout:?} of finalize; killing it");
        }
    }

    /// Waits up to the start timeout for a throw-away stub to exit by itself.
    pub fn wait_exit(&self) {
        self.link.set_closing();
        self.process.wait_exit(self.spec.start_timeout);
    }

    /// Installs the hook run if this stub dies (not when it is finalized).
    pub fn on_death(&self, hook: DeathHook) {
        self.link.on_death(hook);
    }

    /// The stub's process id.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// The stub's process (shared by the members of a shared stub process).
    pub fn process(&self) -> &Arc<StubProcess> {
        &self.process
    }

    /// The process's entry among the server's stubs (shared like the process).
    pub fn registration(&self) -> &Arc<Registration> {
        &self.registration
    }

    pub fn link(&self) -> &Arc<Link> {
        &self.link
    }

    pub fn spec(&self) -> &StubSpec {
        &self.spec
    }

    /// A fresh id for an `execute`.
    pub fn next_execute_id(&self) -> u64 {
        self.next_execute.fetch_add(1, Ordering::Relaxed)
    }

    /// The stub could not be written to: make sure it is gone and return why it died.
    pub fn lost(&self, error: &dyn std::fmt::Display) -> StubError {
        self.process.kill();
        match self.wait_reply(Some(Instant::now() + self.spec.start_timeout)) {
            Err(e) => e,
            Ok(_) => StubError::Dead(reader::unhealthy_reason(
                &self.spec.instance,
                &format!("Sending to it failed: {error}."),
            )),
        }
    }

    /// The next answer (not a log, release, response or BLS call), the stub's death, or a
    /// timeout at `deadline` (`None`: wait as long as the stub lives). Reads the answers
    /// connection on this thread; other frames found there are handled on the way.
    pub fn wait_reply(&self, deadline: Option<Instant>) -> Result<FromStub, StubError> {
        let mut answers = self.answers.lock();
        loop {
            let timeout = match deadline {
                None => None,
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => Some(left),
                    _ => return Err(self.timed_out()),
                },
            };
            let body = match answers.read(timeout) {
                Ok(Some(body)) => body,
                Err(FrameError::Io(e))
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(self.timed_out());
                }
                Ok(None) | Err(FrameError::Io(_)) => return Err(self.death()),
                Err(e) => return Err(self.broke_protocol(&e.to_string())),
            };
            match reader::handle(&self.link, &body) {
                Ok(Some(answer)) => return Ok(answer),
                Ok(None) => {}
                Err(e) => return Err(self.broke_protocol(&e)),
            }
        }
    }

    fn timed_out(&self) -> StubError {
        StubError::TimedOut(format!(
            "{}the Python stub did not answer in time",
            self.spec.label()
        ))
    }

    /// The stub broke the protocol on the answers connection: stop it and say so.
    fn broke_protocol(&self, error: &str) -> StubError {
        self.process.kill();
        StubError::Dead(reader::unhealthy_reason(
            &self.spec.instance,
            &format!("It broke the stub protocol ({error}) and was stopped."),
        ))
    }

    /// The answers connection ended: the reader thread's account of the death.
    fn death(&self) -> StubError {
        let reason = self
            .deaths
            .recv_timeout(DEATH_NOTICE_WAIT)
            .ok()
            .or_else(|| self.link.death_reason())
            .unwrap_or_else(|| {
                reader::unhealthy_reason(&self.spec.instance, "It closed its connection.")
            });
        StubError::Dead(reason)
    }

    /// Sends a handshake message and waits for its answer within the initialize timeout.
    fn request(&self, message: &ToStub, what: &str) -> Result<FromStub, StubError> {
        let label = self.spec.label();
        if let Err(e) = self.link.send(message) {
            return Err(self.with_stderr(self.lost(&e)));
        }
        let timeout = self.spec.initialize_timeout;
        match self.wait_reply(Some(Instant::now() + timeout)) {
            Ok(reply) => Ok(reply),
            Err(StubError::TimedOut(_)) => {
                self.link.set_closing();
                self.process.kill();
                Err(StubError::TimedOut(format!(
                    "{label}the model's {what} did not finish within {timeout:?} (model parameter INITIALIZE_TIMEOUT_SECONDS); the stub was killed"
                )))
            }
            Err(e) => Err(self.with_stderr(e)),
        }
    }

    /// A stub that died during a handshake: add what it printed (a crash in an extension
    /// module, a missing package).
    fn with_stderr(&self, e: StubError) -> StubError {
        let tail = self.process.stderr_tail(Duration::from_secs(1));
        match e {
            StubError::Dead(reason) if !tail.is_empty() => {
                StubError::Dead(format!("{reason} Its last output:\n{tail}"))
            }
            other => other,
        }
    }

    fn model_error(&self, what: &str, error: ErrorObject) -> StubError {
        StubError::Model(format!(
            "{}the model's {what} failed: {}",
            self.spec.label(),
            error.message
        ))
    }

    fn unexpected(&self, wanted: &str, got: &FromStub) -> StubError {
        self.process.kill();
        StubError::Start(format!(
            "{}the stub answered {got:?} where {wanted} was expected",
            self.spec.label()
        ))
    }
}

impl Drop for Stub {
    /// Kills a stub of its own; a member of a shared process is only disconnected (the member
    /// ends, the process lives on while other members do).
    fn drop(&mut self) {
        self.link.set_closing();
        if !self.shared {
            self.process.stop(Duration::ZERO);
        }
        self.link.shutdown();
        if let Some(events) = &self.events {
            let _ = events.shutdown(std::net::Shutdown::Both);
        }
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        // `segments` is dropped after this: the directory goes once the stub cannot use it.
    }
}

/// Lets another thread stop a stub that is still starting: an instance unloaded while its
/// supervisor restarts the stub should not wait for a slow `initialize`.
#[derive(Default)]
pub struct StartGuard {
    state: Mutex<GuardState>,
}

#[derive(Default)]
struct GuardState {
    aborted: bool,
    starting: Option<Arc<StubProcess>>,
}

impl StartGuard {
    /// Tracks a process that is starting; kills it at once if the guard was aborted.
    fn track(&self, process: &Arc<StubProcess>) {
        let mut state = self.state.lock();
        if state.aborted {
            process.kill();
        } else {
            state.starting = Some(process.clone());
        }
    }

    /// The tracked stub is up (or gone): nothing to abort any more.
    pub fn untrack(&self) {
        self.state.lock().starting = None;
    }

    /// Kills the stub that is starting, and any started later through this guard.
    pub fn abort(&self) {
        let mut state = self.state.lock();
        state.aborted = true;
        if let Some(process) = state.starting.take() {
            process.kill();
        }
    }
}

/// A new segment directory for a stub of `instance`:
/// `<shm dir>/nereid-py-<server pid>-<instance, path-safe>-<random>`.
/// The answers connection, with the read timeout it has now (set only when it changes, as
/// it costs a system call).
struct Answers {
    input: BufReader<UnixStream>,
    timeout: Option<Duration>,
}

impl Answers {
    fn new(stream: UnixStream) -> Self {
        Answers {
            input: BufReader::new(stream),
            timeout: None,
        }
    }

    /// The next frame; a timeout reads as `WouldBlock` / `TimedOut`.
    fn read(&mut self, timeout: Option<Duration>) -> Result<Option<Vec<u8>>, FrameError> {
        if timeout != self.timeout {
            self.input.get_ref().set_read_timeout(timeout)?;
            self.timeout = timeout;
        }
        frame::read_frame(&mut self.input)
    }
}

fn segment_dir(instance: &str) -> io::Result<shm::SegmentDir> {
    let safe: String = instance
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    shm::SegmentDir::create(&format!("nereid-py-{}-{safe}-", std::process::id()))
}

fn accept_error(spec: &StubSpec, process: &StubProcess, error: AcceptError) -> StubError {
    let label = spec.label();
    match error {
        AcceptError::Exited(status) => {
            let tail = process.stderr_tail(Duration::from_secs(1));
            StubError::Start(format!(
                "{label}the Python stub {} before connecting; its last output:\n{tail}",
                describe_exit(status)
            ))
        }
        AcceptError::TimedOut => {
            process.kill();
            StubError::Start(format!(
                "{label}the Python stub did not connect within {:?} (model parameter STUB_TIMEOUT_SECONDS)",
                spec.start_timeout
            ))
        }
        AcceptError::Io(e) => {
            process.kill();
            StubError::Start(format!("{label}waiting for the Python stub failed: {e}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::python::process::shell_process;

    #[test]
    fn an_aborted_guard_kills_the_starting_stub_and_later_ones() {
        let dir = process::private_dir("nereid-test-").unwrap();
        let socket = process::socket_path(dir.path());
        let guard = StartGuard::default();
        let first = Arc::new(shell_process("exec sleep 30", &socket, dir.path()));
        guard.track(&first);
        guard.abort();
        let status = first.wait_exit(Duration::from_secs(10)).unwrap();
        assert_eq!(describe_exit(status), "was killed by signal 9 (SIGKILL)");
        let later = Arc::new(shell_process("exec sleep 30", &socket, dir.path()));
        guard.track(&later);
        assert!(later.wait_exit(Duration::from_secs(10)).is_some());
    }

    #[test]
    fn segment_dirs_are_private_unique_and_path_safe() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let a = segment_dir("my model/../x").unwrap();
        let b = segment_dir("my model/../x").unwrap();
        assert_ne!(a.path(), b.path());
        let name = a.path().file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            name.starts_with(&format!("nereid-py-{}-my_model____x-", std::process::id())),
            "{name}"
        );
        assert_eq!(a.path().parent(), Some(shm::shm_dir().as_path()));
        assert_eq!(a.prefix(), format!("{}/", a.path().display()));
        let meta = std::fs::symlink_metadata(a.path()).unwrap();
        assert!(meta.file_type().is_dir());
        assert_eq!(meta.permissions().mode() & 0o777, 0o700);
        assert_eq!(meta.uid(), rustix::process::geteuid().as_raw());
        let path = a.path().to_path_buf();
        std::fs::write(format!("{}p0", a.prefix()), b"x").unwrap();
        drop(a);
        assert!(!path.exists(), "removed with its segments");
        assert!(b.path().exists());
    }
}
