"""A shared stub process: several instances of one Python model in one process.

Imported by `nereid_stub.py` only when the server starts it as
`nereid_stub.py SOCKET_PATH INSTANCES` (model parameter SHARED_STUB_PROCESS): the process opens
three connections per member, member after member, and serves each member (one model
instance) with its own `Stub` on its own thread, so that instances share one interpreter and,
on a GPU, one CUDA context.

    main thread ─────── member 0's Stub (init, execute, finalize of instance 0)
    nereid-instance-1 ─ member 1's Stub                      each with its own channel,
    ...                                                        helper thread, asyncio loop
    any thread ─► pb_utils._channel = Router ─► the member the thread belongs to

* Executions of different members overlap wherever the model releases the GIL (NumPy, torch,
  I/O); pure-Python work of all members takes turns on the one GIL.
* A thread belongs to the member whose thread started it (`threading.Thread.start` records the
  starter, the new thread binds it before running), so threads a model starts in `initialize`
  or `execute` log, send decoupled responses, call BLS and use metrics as that instance.
* A member ends after its `finalize` or when its commands connection ends (its instance was
  unloaded): `Stub.exit(0)` removes its segments and unwinds its threads with `MemberEnded`.
  The process exits when the last member has ended.
* Everything else that ends a stub (a crash, `sys.exit` in model code, a protocol error, a bug
  in the stub) ends the process, every member with it: the server fails the requests in
  flight of all of them and restarts them together.
"""

import sys
import threading
import traceback

import triton_python_backend_utils as pb_utils


class MemberEnded(BaseException):
    """Unwinds a thread of a member whose instance has ended; other members keep running. Not
    an Exception, so model code that catches Exception does not stop it."""


class Host:
    """The members of the process: which member each thread belongs to, and the process's end
    once no member is left."""

    MemberEnded = MemberEnded

    def __init__(self, count, exit_now, exit_code):
        # The stub's own process exit and `SystemExit` reading, so both kinds of stub end alike.
        self._exit_now = exit_now
        self.exit_code = exit_code
        self._lock = threading.Lock()
        self._live = count
        self._local = threading.local()
        self.stubs = []

    def bind(self, stub):
        self._local.stub = stub

    def bound(self):
        return getattr(self._local, "stub", None)

    def current(self):
        stub = self.bound()
        if stub is None:
            raise pb_utils.TritonModelException(
                "this thread belongs to no model instance of the shared stub process "
                "(SHARED_STUB_PROCESS): call pb_utils from threads the model started in "
                "initialize or execute")
        return stub

    def member_ended(self):
        """A member has ended (once each); the last one ends the process."""
        with self._lock:
            self._live -= 1
            last = self._live == 0
        if last:
            self._exit_now(0)

    def exit_process(self, code):
        """Ends the process, every member with it (their segments removed first)."""
        for stub in self.stubs:
            try:
                stub.unlink_prefix()
            except Exception:  # one member's cleanup must not keep the others' files
                pass
        self._exit_now(code)


class Router:
    """pb_utils' `_channel`: each call goes to the member (Stub) the calling thread belongs
    to."""

    def __init__(self, host):
        self._host = host

    def current(self):
        return self._host.current()

    def log(self, level, message):
        stub = self._host.bound()
        if stub is None:  # a thread of no instance: the line still reaches the server's log
            sys.stderr.write("[{}] {}\n".format(level, message))
        else:
            stub.log(level, message)

    def need_reader(self):
        stub = self._host.bound()
        if stub is not None:
            stub.need_reader()

    def __getattr__(self, name):
        return getattr(self._host.current(), name)


def threads_inherit_their_member(host):
    """A thread started by a member's thread belongs to that member. (`Thread._bootstrap_inner`
    is where every CPython 3 thread starts running; were it gone, threads would stay unbound
    and their pb_utils calls raise, saying so.)"""
    start = threading.Thread.start
    bootstrap = getattr(threading.Thread, "_bootstrap_inner", None)
    if bootstrap is None:
        return

    def start_in_member(thread):
        thread._nereid_member = host.bound()
        return start(thread)

    def bootstrap_in_member(thread):
        stub = getattr(thread, "_nereid_member", None)
        if stub is not None:
            host.bind(stub)
        return bootstrap(thread)

    threading.Thread.start = start_in_member
    threading.Thread._bootstrap_inner = bootstrap_in_member


def run_member(host, stub):
    """Serves one member until its instance ends; `sys.exit` in model code or a failure ends
    the process, as it ends a stub of its own."""
    try:
        stub.serve()
    except MemberEnded:
        pass
    except SystemExit as e:
        host.exit_process(host.exit_code(e))
    except BaseException:
        sys.stderr.write("nereid stub: stub failed:\n" + traceback.format_exc())
        host.exit_process(1)


def serve(fds, count, make_stub, exit_now, exit_code):
    """Serves `count` members over `fds` (three per member, in order); `make_stub(fds, host)`
    makes a member's Stub; `exit_now(code)` ends the process and `exit_code(SystemExit)` reads a
    model's `sys.exit`, the single stub's own. Never returns: the last member to end exits the
    process."""
    host = Host(count, exit_now, exit_code)
    pb_utils._channel = Router(host)
    threads_inherit_their_member(host)
    host.stubs = [make_stub(fds[3 * i:3 * i + 3], host) for i in range(count)]
    for index, stub in enumerate(host.stubs[1:], 1):
        threading.Thread(target=run_member, args=(host, stub),
                         name="nereid-instance-{}".format(index), daemon=True).start()
    run_member(host, host.stubs[0])
    threading.Event().wait()
