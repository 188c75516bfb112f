//! The stub's operating-system process: spawning it, waiting (bounded) for its connection or its
//! exit, killing it, and describing how it ended.
//!
//! ```text
//!  spawn: <python> -u <runtime>/nereid_stub.py <socket> [<members>]   cwd = version dir, stdin = /dev/null,
//!         stdout inherited, stderr piped ─► forwarder thread ─► server stderr + last lines kept
//!  accept(listener, timeout): poll(listener, pidfd) ─► connection | exited first | timed out
//!  wait_exit(timeout):        poll(pidfd)           ─► exit status | still running
//! ```
//!
//! A pidfd (Linux ≥ 5.3) makes "the child exited" a file descriptor event, so every wait is a
//! `poll` with a deadline: no sleeping, no polling loops, and no risk of signalling a reused
//! pid (the child is reaped only through `Child`, after the pidfd reported its exit).

use std::collections::VecDeque;
use std::ffi::OsString;
use std::io::{self, BufRead, BufReader, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::process::{Pid, PidfdFlags, pidfd_open};

/// Lines of the stub's stderr kept for error messages (a traceback's worth).
const TAIL_LINES: usize = 40;
/// Longest line kept in the tail.
const TAIL_LINE_CHARS: usize = 2000;

/// How to start one stub.
pub struct StubCommand<'a> {
    pub python: &'a Path,
    /// `nereid_stub.py` in the runtime directory.
    pub script: &'a Path,
    /// Put first on `PYTHONPATH` (holds `triton_python_backend_utils.py`).
    pub runtime_dir: &'a Path,
    pub socket: &'a Path,
    /// The model's version directory.
    pub cwd: &'a Path,
    /// A shared stub process: how many instances (members) it hosts.
    pub members: Option<usize>,
}

/// Why no connection came.
#[derive(Debug)]
pub enum AcceptError {
    /// The stub exited before connecting.
    Exited(ExitStatus),
    TimedOut,
    Io(io::Error),
}

/// How long [`StubProcess::drop`] waits for a killed process before giving up on reaping it.
const REAP_GRACE: Duration = Duration::from_secs(5);

/// A running (or exited, not yet dropped) stub process.
pub struct StubProcess {
    child: Mutex<Child>,
    pidfd: OwnedFd,
    stderr: Arc<StderrTail>,
}

/// The last lines of the stub's stderr, and whether the pipe has closed.
#[derive(Default)]
struct StderrTail {
    state: Mutex<TailState>,
    closed: Condvar,
}

#[derive(Default)]
struct TailState {
    lines: VecDeque<String>,
    closed: bool,
}

impl StubProcess {
    /// Spawns the stub. The error names the interpreter and says what to fix.
    pub fn spawn(command: &StubCommand<'_>) -> Result<Self, String> {
        let python = command.python;
        let mut child = Command::new(python);
        child.arg("-u").arg(command.script).arg(command.socket);
        if let Some(members) = command.members {
            child.arg(members.to_string());
        }
        let mut child = child
            .current_dir(command.cwd)
            .env("PYTHONPATH", python_path(command.runtime_dir))
            .stdin(Stdio::null())
            .stdout(Stdio::inherit())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| spawn_error(python, &e))?;
        let pidfd = match pidfd_open(Pid::from_child(&child), PidfdFlags::empty()) {
            Ok(fd) => fd,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "cannot watch the Python stub process (pidfd_open needs Linux 5.3 or newer): {e}"
                ));
            }
        };
        let stderr = Arc::new(StderrTail::default());
        if let Some(pipe) = child.stderr.take() {
            let tail = stderr.clone();
            let spawned = std::thread::Builder::new()
                .name("python-stderr".into())
                .spawn(move || forward_stderr(pipe, &tail));
            if let Err(e) = spawned {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("cannot start a thread for the stub's stderr: {e}"));
            }
        }
        Ok(StubProcess {
            child: Mutex::new(child),
            pidfd,
            stderr,
        })
    }

    /// Waits up to `timeout` for the stub to connect to `listener`, returning early if the
    /// stub exits first.
    pub fn accept(
        &self,
        listener: &UnixListener,
        timeout: Duration,
    ) -> Result<UnixStream, AcceptError> {
        listener.set_nonblocking(true).map_err(AcceptError::Io)?;
        let deadline = Instant::now() + timeout;
        loop {
            match listener.accept() {
                Ok((stream, _)) => {
                    stream.set_nonblocking(false).map_err(AcceptError::Io)?;
                    return Ok(stream);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(AcceptError::Io(e)),
            }
            if let Some(status) = self.try_status() {
                return Err(AcceptError::Exited(status));
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(AcceptError::TimedOut);
            }
            let mut fds = [
                PollFd::new(listener, PollFlags::IN),
                PollFd::new(&self.pidfd, PollFlags::IN),
            ];
            poll(&mut fds, remaining).map_err(AcceptError::Io)?;
        }
    }

    /// Waits up to `timeout` for the process to exit; its status if it did.
    pub fn wait_exit(&self, timeout: Duration) -> Option<ExitStatus> {
        if let Some(status) = self.try_status() {
            return Some(status);
        }
        let mut fds = [PollFd::new(&self.pidfd, PollFlags::IN)];
        if let Err(e) = poll(&mut fds, timeout) {
            tracing::warn!(error = %e, "waiting for a Python stub to exit failed");
        }
        self.try_status()
    }

    /// The process id (for reading its memory in `/proc`).
    pub fn pid(&self) -> u32 {
        self.child.lock().id()
    }

    /// Sends SIGKILL unless the process has already been reaped.
    pub fn kill(&self) {
        if let Err(e) = self.child.lock().kill() {
            tracing::debug!(error = %e, "killing a Python stub failed");
        }
    }

    /// Waits up to `grace` for a clean exit, then kills; the exit status if one was seen.
    pub fn stop(&self, grace: Duration) -> Option<ExitStatus> {
        self.wait_exit(grace).or_else(|| {
            self.kill();
            self.wait_exit(grace)
        })
    }

    /// The last lines the stub wrote to stderr. Waits up to `timeout` for the pipe to close
    /// (all of it read) — call after the process exited to get everything it wrote.
    pub fn stderr_tail(&self, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        let mut state = self.stderr.state.lock();
        while !state.closed {
            if self
                .stderr
                .closed
                .wait_until(&mut state, deadline)
                .timed_out()
            {
                break;
            }
        }
        let lines: Vec<&str> = state.lines.iter().map(String::as_str).collect();
        lines.join("\n")
    }

    fn try_status(&self) -> Option<ExitStatus> {
        self.child.lock().try_wait().ok().flatten()
    }
}

impl Drop for StubProcess {
    /// Never leaves a stub behind, nor a zombie.
    fn drop(&mut self) {
        if self.stop(Duration::ZERO).is_none() && self.wait_exit(REAP_GRACE).is_none() {
            tracing::warn!(
                pid = self.child.lock().id(),
                "a killed Python stub did not exit; it is left behind"
            );
        }
    }
}

/// How a process ended, as a clause: `exited with status 1`, `was killed by signal 11 (SIGSEGV)`.
pub fn describe_exit(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(signal)) => {
            let core = if status.core_dumped() {
                ", core dumped"
            } else {
                ""
            };
            match signal_name(signal) {
                Some(name) => format!("was killed by signal {signal} ({name}{core})"),
                None => format!("was killed by signal {signal}{core}"),
            }
        }
        (None, None) => format!("ended ({status})"),
    }
}

fn signal_name(signal: i32) -> Option<&'static str> {
    Some(match signal {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        4 => "SIGILL",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        13 => "SIGPIPE",
        15 => "SIGTERM",
        _ => return None,
    })
}

/// `poll` until an event or `timeout`, retrying interrupted calls with the time left.
fn poll(fds: &mut [PollFd<'_>], timeout: Duration) -> io::Result<usize> {
    let deadline = Instant::now() + timeout;
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        let spec = Timespec::try_from(remaining).unwrap_or(Timespec {
            tv_sec: i64::MAX,
            tv_nsec: 0,
        });
        match rustix::event::poll(fds, Some(&spec)) {
            Ok(n) => return Ok(n),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// `runtime_dir` first, then whatever `PYTHONPATH` the server was started with.
fn python_path(runtime_dir: &Path) -> OsString {
    let mut paths = vec![runtime_dir.to_path_buf()];
    if let Some(existing) = std::env::var_os("PYTHONPATH") {
        paths.extend(std::env::split_paths(&existing));
    }
    std::env::join_paths(paths).unwrap_or_else(|_| runtime_dir.as_os_str().to_os_string())
}

fn spawn_error(python: &Path, e: &io::Error) -> String {
    let hint =
        "set the model parameter EXECUTION_ENV_PATH or the environment variable NEREID_PYTHON";
    match e.kind() {
        io::ErrorKind::NotFound if python.components().count() == 1 => format!(
            "Python interpreter '{}' was not found on PATH; {hint}",
            python.display()
        ),
        io::ErrorKind::NotFound => format!(
            "Python interpreter '{}' does not exist; {hint}",
            python.display()
        ),
        io::ErrorKind::PermissionDenied => format!(
            "Python interpreter '{}' is not executable; {hint}",
            python.display()
        ),
        _ => format!(
            "cannot start the Python interpreter '{}': {e}",
            python.display()
        ),
    }
}

/// Copies the stub's stderr to the server's stderr line by line, keeping the last lines.
fn forward_stderr(pipe: ChildStderr, tail: &StderrTail) {
    let mut reader = BufReader::new(pipe);
    let mut line = Vec::new();
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                let _ = io::stderr().write_all(&line);
                let text = String::from_utf8_lossy(&line);
                let text: String = text.trim_end().chars().take(TAIL_LINE_CHARS).collect();
                let mut state = tail.state.lock();
                if state.lines.len() == TAIL_LINES {
                    state.lines.pop_front();
                }
                state.lines.push_back(text);
            }
        }
    }
    tail.state.lock().closed = true;
    tail.closed.notify_all();
}

/// A private directory (mode 0700) in the temp directory, for sockets and runtime files.
pub fn private_dir(prefix: &str) -> io::Result<tempfile::TempDir> {
    private_dir_in(&std::env::temp_dir(), prefix)
}

/// A private directory in `parent`, named `<prefix><random>`: made by one `mkdir` with mode
/// 0700, which fails rather than reuse a path that exists (a directory or symlink someone else
/// put there first; the random part is retried), then checked to be a real directory owned by
/// this process's user. Removed with its contents when the `TempDir` is dropped.
pub fn private_dir_in(parent: &Path, prefix: &str) -> io::Result<tempfile::TempDir> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let owner_only = || std::fs::Permissions::from_mode(0o700);
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .rand_bytes(12)
        .permissions(owner_only())
        .tempdir_in(parent)?;
    let meta = std::fs::symlink_metadata(dir.path())?;
    if !meta.file_type().is_dir() || meta.uid() != rustix::process::geteuid().as_raw() {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "'{}' is not a directory owned by this process's user",
                dir.path().display()
            ),
        ));
    }
    // The umask can only have removed bits; set exactly 0700 (the owner needs all three).
    if meta.mode() & 0o777 != 0o700 {
        std::fs::set_permissions(dir.path(), owner_only())?;
    }
    Ok(dir)
}

/// The socket path inside a private directory.
pub fn socket_path(dir: &Path) -> PathBuf {
    dir.join("stub.sock")
}

/// A "stub" that runs `script` with `sh` (`$1` is the socket path), for tests.
#[cfg(test)]
pub fn shell_process(script: &str, socket: &Path, dir: &Path) -> StubProcess {
    let file = dir.join("script.sh");
    std::fs::write(&file, script).unwrap();
    // `sh -u <file> <socket>`: `-u` only makes unset variables errors.
    StubProcess::spawn(&StubCommand {
        python: Path::new("sh"),
        script: &file,
        runtime_dir: dir,
        socket,
        cwd: dir,
        members: None,
    })
    .unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str, socket: &Path, cwd: &Path) -> StubProcess {
        shell_process(script, socket, cwd)
    }

    #[test]
    fn a_process_that_exits_before_connecting_is_reported_at_once() {
        let dir = private_dir("nereid-test-").unwrap();
        let socket = socket_path(dir.path());
        let listener = UnixListener::bind(&socket).unwrap();
        let process = sh("echo 'no numpy here' >&2; exit 3", &socket, dir.path());
        let started = Instant::now();
        let err = process
            .accept(&listener, Duration::from_secs(20))
            .unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(10));
        let AcceptError::Exited(status) = err else {
            panic!("expected an exit, got {err:?}");
        };
        assert_eq!(describe_exit(status), "exited with status 3");
        assert_eq!(process.stderr_tail(Duration::from_secs(5)), "no numpy here");
    }

    #[test]
    fn accept_times_out_and_stop_kills() {
        let dir = private_dir("nereid-test-").unwrap();
        let socket = socket_path(dir.path());
        let listener = UnixListener::bind(&socket).unwrap();
        let process = sh("exec sleep 30", &socket, dir.path());
        let err = process
            .accept(&listener, Duration::from_millis(200))
            .unwrap_err();
        assert!(matches!(err, AcceptError::TimedOut), "{err:?}");
        let status = process.stop(Duration::from_millis(100)).unwrap();
        assert_eq!(describe_exit(status), "was killed by signal 9 (SIGKILL)");
    }

    #[test]
    fn missing_interpreters_are_named() {
        let dir = private_dir("nereid-test-").unwrap();
        let spawn = |python: &str| {
            StubProcess::spawn(&StubCommand {
                python: Path::new(python),
                script: Path::new("x.py"),
                runtime_dir: dir.path(),
                socket: Path::new("s"),
                cwd: dir.path(),
                members: None,
            })
            .err()
            .unwrap()
        };
        let err = spawn("/no/such/python3");
        assert!(err.contains("'/no/such/python3' does not exist"), "{err}");
        let err = spawn("no-such-python-on-path");
        assert!(err.contains("was not found on PATH"), "{err}");
    }

    #[test]
    fn private_dirs_are_owner_only() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let dir = private_dir("nereid-test-").unwrap();
        let meta = std::fs::symlink_metadata(dir.path()).unwrap();
        assert!(meta.file_type().is_dir());
        assert_eq!(meta.permissions().mode() & 0o777, 0o700);
        assert_eq!(meta.uid(), rustix::process::geteuid().as_raw());
        assert_eq!(dir.path().parent(), Some(std::env::temp_dir().as_path()));
    }

    #[test]
    fn private_dirs_never_reuse_an_existing_path() {
        let parent = tempfile::tempdir().unwrap();
        let a = private_dir_in(parent.path(), "x-").unwrap();
        let b = private_dir_in(parent.path(), "x-").unwrap();
        assert_ne!(a.path(), b.path());
        let name = a.path().file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            name.starts_with("x-") && name.len() == "x-".len() + 12,
            "a random suffix: {name}"
        );
        let err = private_dir_in(Path::new("/no/such/parent"), "x-").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }
}
