"""Nereid Python stub: runs one instance of a Triton Python-backend model (`model.py`), or
several instances of one model in a shared stub process (model parameter SHARED_STUB_PROCESS).

Started by the server (the *parent*) as `python3 -u nereid_stub.py SOCKET_PATH [INSTANCES]`; the wire
protocol is docs/internals/python-stub-protocol.md. The per-message work is compiled: the
`nereid_stub_core` extension (crate stub-core, the same protocol types as the server) reads and
writes the frames, maps and writes the shared-memory segments, and is the `pb_utils` Tensor,
InferenceRequest and InferenceResponse; this file orchestrates (threads, model calls, errors).

Threads and flow
----------------

    parent ══ three connections, each one way: commands (parent -> stub), answers (init_done,
              execute_done, ...) and events (logs, decoupled responses, BLS calls, metrics,
              releases the release thread sends). One way each: a reader blocked on a socket is
              never woken by the other side reading what it wrote there.

    parent ──frames──> main thread: reads frames itself (Channel.recv, GIL released while
                        │          blocked; cancel and release are answered inside it); runs
                        │          init, auto_complete, execute, finalize (model code) where it
                        │          read them; answers bls_response, model_control_done, ...
                        └─ while model code needs frames (a BLS call, an awaitable, a look at
                           is_cancelled()), the helper thread reads instead, then hands the next
                           main-thread frame (and the reading) back to the main thread
    parent <──frames── any thread, one frame at a time (write lock): execute_done, ...
                         ^ release thread (compiled): sends `release` for parent segments whose
                           tensors and arrays are gone, and the deletions of garbage custom
                           metrics, when no other frame takes them along

* A plain request costs one wake-up of the stub: the main thread reads the `execute`, runs the
  model and answers, with no hand-off between threads. Model code always runs on the main
  thread (initialize and execute see the same thread, as in Triton).
* The helper reads while a model blocked in a BLS `exec()` waits for its `bls_response`, and so
  that `cancel` reaches `request.is_cancelled()`.
* `async def` model methods run on one event loop in a background thread that lives as long as
  the stub, so tasks a model starts keep running between calls.
* The stub exits on EOF from the parent, after `finalize`, and after answering `auto_complete`;
  it unlinks every file under its shared-memory prefix before exiting, and the directory too
  when the prefix is one (`<dir>/`: the server's private segment directory, mode 0700, which
  clients of the server's shared-memory API cannot name).
* SIGINT is ignored: the parent decides when the stub stops (a terminal's Ctrl-C reaches the
  whole process group).

A shared stub process (`nereid_stub.py SOCKET_PATH INSTANCES`)
--------------------------------------------------------------

    parent ══ three connections per member (INSTANCES members, connected in order)
              member 0: a Stub on the process's main thread   ─┐ each exactly as above: its
              member 1: a Stub on thread nereid-instance-1    ─┤ own channel, helper, asyncio
              ...                                              ─┘ loop, segment directory

* Each member is one model instance: the parent sends it its own `init` (its own
  `model_instance_name`, kind and device id), and it imports `model.py` anew, so every
  instance has its own `TritonPythonModel` and module globals, as in separate processes.
  Executions of different members run on their own threads and overlap wherever the model
  releases the GIL (NumPy, torch, I/O).
* `pb_utils._channel` is a router: every call goes to the member the calling thread belongs
  to. A thread belongs to the member whose code started it (`threading.Thread.start` records
  the starter), so threads a model starts in `initialize` or `execute` log, send decoupled
  responses and make BLS calls as that instance.
* A member ends after its `finalize`, or when its commands connection ends (its instance is
  unloaded); the process exits when the last member has ended. A crash, `sys.exit`, or a
  protocol error ends the whole process: every member's instance fails its requests and the
  parent restarts them together.

Choices where the protocol document leaves room
-----------------------------------------------
* Parent segments are mapped shared and writable when the file allows it, so input arrays are
  writable like Triton's; a model that writes into an input changes only the parent's copy of a
  message it has already sent.
* A stub message carries `segment` only when its tensors hold at least one byte; the stub writes
  empty tensors as `offset` 0, `nbytes` 0. From the parent it accepts a message without a segment
  when no tensor has data, and releases at once a parent segment that no tensor data uses (or
  that comes with references it cannot decode).
* Outputs are filtered by the request's `requested_output_names` unless that list is empty.
* An `execute_done` error message is the complete text for the client, in Triton's form:
  "Failed to process the request(s) for model '<instance>', message: <Type>: <text>"
  followed by "At:" and the model's frames; with an error, `responses` is `[]` and there is no
  segment.
* A request whose release flags say RESCHEDULE when `execute` returns is listed in
  `execute_done`'s `rescheduled` (the server runs it again), unless `execute` failed: then, as
  in Triton, every request is released. A decoupled one's response sender stays open; in
  default mode `execute` must return None for it (Triton's error otherwise).
"""

import importlib.util
import inspect
import itertools
import os
import queue
import signal
import _socket
import sys
import threading
import traceback

try:
    import nereid_stub_core as _core
except ImportError as _error:  # the server copies it next to this file; say what is missing
    sys.stderr.write("nereid stub: cannot import the compiled stub core nereid_stub_core "
                     "(nereid_stub_core.abi3.so next to this file, built by `make build`): "
                     "{}\n".format(_error))
    sys.exit(1)

import triton_python_backend_utils as pb_utils

_RESCHEDULE = pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE

_STUB_FILE = os.path.abspath(__file__)
# asyncio is imported only when a model's code returns an awaitable (about 3.5 MB a stub
# otherwise), so its frames are found by where the module would load from.
_INTERNAL_DIRS = tuple(
    os.path.dirname(os.path.abspath(importlib.util.find_spec(name).origin)) + os.sep
    for name in ("asyncio", "concurrent.futures")
)


class ProtocolError(Exception):
    """The parent sent something the protocol does not allow."""


def _warn(text):
    sys.stderr.write("nereid stub: {}\n".format(text))


# ---------------------------------------------------------------------------------------------
# Error text
# ---------------------------------------------------------------------------------------------

def _is_internal_frame(filename):
    return (filename == _STUB_FILE or filename.startswith("<frozen importlib")
            or filename.startswith(_INTERNAL_DIRS))


def _strip_internal_frames(exc_info, seen):
    if exc_info is None or id(exc_info) in seen:
        return
    seen.add(id(exc_info))
    exc_info.stack = traceback.StackSummary.from_list(
        [f for f in exc_info.stack if not _is_internal_frame(f.filename)])
    _strip_internal_frames(exc_info.__cause__, seen)
    _strip_internal_frames(exc_info.__context__, seen)


def traceback_text(exc):
    """Python's traceback of `exc` without the stub's own frames (init/finalize errors)."""
    info = traceback.TracebackException(type(exc), exc, exc.__traceback__)
    _strip_internal_frames(info, set())
    return "".join(info.format()).rstrip("\n")


def exception_summary(exc):
    """`<Type>: <text>` then the model's frames innermost first, as Triton reports them."""
    text = str(exc)
    head = "{}: {}".format(type(exc).__name__, text) if text else type(exc).__name__
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not _is_internal_frame(f.filename)]
    if not frames:
        return head
    lines = "".join("  {}({}): {}\n".format(f.filename, f.lineno, f.name) for f in reversed(frames))
    return "{}\n\nAt:\n{}".format(head, lines)


def _error_object(message, code="INTERNAL"):
    return {"message": message, "code": code}


class InvalidExecute(Exception):
    """`execute` returned something the protocol cannot carry; the text goes out verbatim."""


def _load_model_class(model_file):
    """Imports `model_file` as module `model` and returns its TritonPythonModel class."""
    if not isinstance(model_file, str) or not model_file:
        raise ProtocolError("message lacks a string 'model_file'")
    model_dir = os.path.dirname(os.path.abspath(model_file))
    if model_dir not in sys.path:
        sys.path.insert(0, model_dir)
    spec = importlib.util.spec_from_file_location("model", model_file)
    if spec is None or spec.loader is None:
        raise ImportError("cannot import model file '{}'".format(model_file))
    module = importlib.util.module_from_spec(spec)
    sys.modules["model"] = module
    spec.loader.exec_module(module)
    model_class = getattr(module, "TritonPythonModel", None)
    if model_class is None:
        raise AttributeError("model file '{}' does not define class 'TritonPythonModel'".format(model_file))
    return model_class


async def _await(awaitable):
    return await awaitable


class _ExecuteJob:
    """An `execute` message decoded by the channel, for the main thread."""

    def __init__(self, job_id, requests, error):
        self.id = job_id
        self.requests = requests
        self.states = [request._state for request in requests]
        self.error = error


# ---------------------------------------------------------------------------------------------
# The stub
# ---------------------------------------------------------------------------------------------

class Stub:
    """Serves one model instance over one channel; also pb_utils' `_channel` (through a
    `nereid_stub_shared.Router` in a shared process, whose `Host` is `host`)."""

    def __init__(self, channel, host=None):
        self._chan = channel
        self._host = host
        self._ended = False  # a shared process's member whose instance has ended
        # Main-thread frames the helper read, handed over with the reading role (see
        # `_helper_loop`).
        self._jobs = queue.SimpleQueue()
        self._role_lock = threading.Lock()
        self._main_busy = False  # the main thread runs a frame's work (model code)
        self._helper_reading = False  # the helper reads on the main thread's behalf
        self._helper_wake = queue.SimpleQueue()
        self._bls_calls = {}
        self._bls_lock = threading.Lock()
        self._bls_ids = itertools.count()
        # Calls waiting for the parent's answer (`model_control_done`, `metric_done`), by id.
        self._calls = {}
        self._call_ids = itertools.count()
        self._model = None
        self._decoupled = False
        self._instance_name = ""
        self._loop = None
        self._loop_lock = threading.Lock()

    def serve(self):
        if self._host is None:
            pb_utils._channel = self
            helper = self._helper_loop
        else:
            self._host.bind(self)
            helper = self._member_helper
        threading.Thread(target=helper, name="nereid-reader", daemon=True).start()
        self._main_loop()

    def current(self):
        """The stub a pb_utils call from this thread goes to: this one."""
        return self

    def exit(self, code):
        """Unlinks every file under the stub's prefix (its own segments and the parent's: the
        parent may be gone, or exiting right after `finalize`) and ends the process at once,
        from any thread. Nothing reads a segment of a stub that is exiting.

        In a shared process, `exit(0)` (finalized, or the connection ended) ends only this
        member (see `_end_member`); any other code ends the process, every member with it."""
        if self._host is None:
            self._chan.unlink_prefix()
            _exit_now(code)
        if code == 0:
            self._end_member()
        self._host.exit_process(code)

    def unlink_prefix(self):
        self._chan.unlink_prefix()

    def _end_member(self):
        """Ends this member of a shared process: removes its segments, wakes its main thread
        if it waits for a hand-over, and unwinds the calling thread. The last member to end
        ends the process."""
        with self._role_lock:
            first, self._ended = not self._ended, True
        if first:
            self._chan.unlink_prefix()
            self._jobs.put(None)
            self._host.member_ended()
        raise self._host.MemberEnded()

    def _member_helper(self):
        try:
            self._helper_loop()
        except self._host.MemberEnded:
            pass

    # -- channel interface used by triton_python_backend_utils ----------------------------------

    def log(self, level, message):
        self._send({"op": "log", "level": level, "message": message})

    def send_response(self, state, response, flags):
        """A decoupled sender's send (called with `state.lock` held, so sends stay in order)."""
        self._write(self._chan.send_response, state, response, flags)

    def need_reader(self):
        """Model code is about to wait for (or look at) what frames bring: if the main thread
        is busy with it, the helper starts reading. Any thread; cheap when nothing changes."""
        with self._role_lock:
            if self._main_busy and not self._helper_reading:
                self._helper_reading = True
                self._helper_wake.put(None)

    def submit_bls(self, request, decoupled, sink):
        self.need_reader()
        call_id = next(self._bls_ids)
        with self._bls_lock:
            self._bls_calls[call_id] = sink
        try:
            self._write(self._chan.send_bls_request, call_id, request, decoupled)
        except BaseException:
            with self._bls_lock:
                self._bls_calls.pop(call_id, None)
            raise
        return call_id

    def cancel_bls(self, call_id):
        """ResponseIterator.cancel(): asks the parent to stop the decoupled call `call_id`; its
        iterator then ends with a final response. Nothing to do once the call has ended."""
        with self._bls_lock:
            running = call_id in self._bls_calls
        if running:
            self._send({"op": "bls_cancel", "id": call_id})

    def model_control(self, action, fields):
        """pb_utils.load_model / unload_model / is_model_ready: asks the server and blocks for
        its answer; returns `ready`, raises TritonModelException with the server's error."""
        message = self._call({"op": "model_control", "action": action, **fields})
        error = message.get("error")
        if error is not None:
            raise pb_utils.TritonModelException(str(error.get("message", "")))
        return bool(message.get("ready"))

    def metric_call(self, fields):
        """A custom-metric call the server answers (`family_new`, `value`): sends it and blocks
        for its `metric_done`, which it returns."""
        return self._call({"op": "metric", **fields})

    def _call(self, message):
        """Sends `message` with a fresh `id` and blocks for the parent's answer with that id."""
        self.need_reader()
        call_id = next(self._call_ids)
        answer = queue.SimpleQueue()
        with self._bls_lock:
            self._calls[call_id] = answer
        self._send({**message, "id": call_id})
        return answer.get()

    def metric_send(self, fields):
        """A custom-metric change; nothing is answered."""
        self._send({"op": "metric", **fields})

    def metric_release(self, fields):
        """A custom-metric deletion from a `__del__`: that may run inside the garbage collector,
        on a thread that is sending, so it is queued like a segment release and goes out ahead
        of the next frame (or from the release thread)."""
        self._chan.queue({"op": "metric", **fields})

    # -- sending --------------------------------------------------------------------------------

    def _send(self, message):
        self._write(self._chan.send, message)

    def _write(self, send, *args):
        """Calls a channel send; a parent that is gone ends the stub."""
        try:
            send(*args)
        except ConnectionError:
            self.exit(0)

    # -- reading (main thread, or the helper on its behalf) -----------------------------------------

    _MAIN_OPS = ("execute", "init", "auto_complete", "finalize")

    def _receive_or_exit(self):
        """The next (op, payload); exits the stub at EOF (0) or on a protocol error (2)."""
        try:
            message = self._chan.recv()
        except ValueError as e:
            _warn("protocol error, exiting: {}".format(e))
            self.exit(2)
        if message is None:
            self.exit(0)
        return message

    def _main_job(self, message):
        """A main-thread frame as (op, payload); an execute's as an _ExecuteJob."""
        op, payload = message
        if op == "execute":
            return op, _ExecuteJob(*payload)
        return op, payload

    def _helper_loop(self):
        """Reads while the main thread is busy with model code that needs frames; hands the
        next main-thread frame back with the reading role."""
        try:
            while True:
                self._helper_wake.get()
                while True:
                    message = self._receive_or_exit()
                    if message[0] in self._MAIN_OPS:
                        job, message = self._main_job(message), None
                        # Under the lock, so the main thread sees the hand-over whole: either
                        # still reading here, or done with the job already queued.
                        with self._role_lock:
                            self._helper_reading = False
                            self._jobs.put(job)
                        break
                    self._dispatch(message)
                    message = None
        except Exception:  # a bug in the stub: say so and stop rather than hang the parent
            _warn("reader thread failed:\n" + traceback.format_exc())
            self.exit(1)

    def _dispatch(self, message):
        op, payload = message
        if op == "bls_response":
            self._on_bls_response(*payload)
        elif op in ("model_control_done", "metric_done"):
            with self._bls_lock:
                answer = self._calls.pop(payload.get("id"), None)
            if answer is None:
                _warn("ignoring {} for unknown call id {!r}".format(op, payload.get("id")))
            else:
                answer.put(payload)
        else:
            _warn("ignoring message with unexpected op {!r}".format(op))

    def _on_bls_response(self, call_id, final, response, error):
        with self._bls_lock:
            sink = self._bls_calls.pop(call_id, None) if final else self._bls_calls.get(call_id)
        if sink is None:
            _warn("ignoring bls_response for unknown call id {!r}".format(call_id))
            return
        if error is not None:
            response = pb_utils.InferenceResponse(error=pb_utils.TritonError(error))
        sink.deliver(response, final)

    # -- main thread ------------------------------------------------------------------------------

    def _main_loop(self):
        job = None
        while True:
            if self._ended:
                raise self._host.MemberEnded()
            if job is None:
                message = self._receive_or_exit()
                if message[0] not in self._MAIN_OPS:
                    self._dispatch(message)
                    message = None  # a BLS response's segment is released once the model is done
                    continue
                # The message holds the requests too: drop it with the job's, so the inputs'
                # segments are released when the job is done with them.
                job, message = self._main_job(message), None
            with self._role_lock:
                self._main_busy = True
            self._run_main_job(*job)
            with self._role_lock:
                self._main_busy = False
                helper_reading = self._helper_reading
                handed = None if helper_reading or self._jobs.empty() else self._jobs.get()
            # The helper reads until it hands the next main-thread frame over with the reading
            # role; it may have done so while this job ran.
            job = self._jobs.get() if helper_reading else handed

    def _run_main_job(self, op, payload):
        if op == "init":
            self._handle_init(payload)
        elif op == "auto_complete":
            self._handle_auto_complete(payload)
            self.exit(0)
        elif op == "execute":
            self._handle_execute(payload)
        elif op == "finalize":
            self._handle_finalize()
            self.exit(0)

    def _await_if_needed(self, value):
        """Runs an awaitable returned by model code on the stub's event loop and waits for it."""
        if not inspect.isawaitable(value):
            return value
        self.need_reader()  # the coroutine may make BLS calls
        import asyncio

        return asyncio.run_coroutine_threadsafe(_await(value), self._event_loop()).result()

    def _event_loop(self):
        with self._loop_lock:
            if self._loop is None:
                import asyncio

                loop = asyncio.new_event_loop()
                threading.Thread(target=_run_loop_forever, args=(loop,), name="nereid-asyncio",
                                 daemon=True).start()
                self._loop = loop
            return self._loop

    def _handle_init(self, message):
        error = None
        try:
            _check_protocol(message)
            self._decoupled = self._chan.decoupled
            args = message.get("args") or {}
            if not isinstance(args, dict):
                raise ProtocolError("init 'args' is not an object")
            self._instance_name = str(args.get("model_instance_name", ""))
            model = _load_model_class(message.get("model_file"))()
            initialize = getattr(model, "initialize", None)
            if initialize is not None:
                self._await_if_needed(initialize(dict(args)))
            self._model = model
        except Exception as e:
            error = _error_object(traceback_text(e))
        _return_freed_heap()
        self._send({"op": "init_done", "error": error})

    def _handle_auto_complete(self, message):
        config, error = message.get("config") or {}, None
        try:
            _check_protocol(message)
            hook = getattr(_load_model_class(message.get("model_file")), "auto_complete_config", None)
            if hook is not None:
                result = hook(pb_utils.ModelConfig(config))
                if not isinstance(result, pb_utils.ModelConfig):
                    raise TypeError("auto_complete_config() must return the pb_utils.ModelConfig it "
                                    "was given, got {}".format(type(result).__name__))
                config = result.as_dict()
        except Exception as e:
            error = _error_object(traceback_text(e))
        self._send({"op": "auto_complete_done", "config": config, "error": error})

    def _handle_finalize(self):
        error = None
        finalize = getattr(self._model, "finalize", None) if self._model is not None else None
        if finalize is not None:
            try:
                self._await_if_needed(finalize())
            except Exception as e:
                error = _error_object(traceback_text(e))
        self._send({"op": "finalize_done", "error": error})

    def _handle_execute(self, job):
        try:
            responses = self._run_execute(job)
            failure = None
        except Exception as e:
            responses, failure = None, self._execute_failure(e)
        # A decoupled request the model rescheduled keeps its sender open for its next run.
        if failure is not None or not self._decoupled:
            for state in job.states:
                _close(state)
        # Dropping the requests usually frees their inputs: their segments' releases go out
        # with the reply, in one write, without waking the release thread.
        self._chan.set_replying(True)
        try:
            job.requests = None
            self._reply(job, responses, failure)
        finally:
            self._chan.set_replying(False)

    def _reply(self, job, responses, failure):
        if responses is not None:
            try:
                self._write(self._chan.send_execute_done, job.id, job.states, responses)
                return
            except Exception as e:  # an output the protocol cannot carry
                failure = self._execute_failure(e)
        # Decoupled, done: the states say which requests the model rescheduled.
        self._write(self._chan.send_execute_end, job.id, failure,
                    job.states if failure is None else None)

    def _run_execute(self, job):
        """The responses of a default-mode execute; None for a decoupled one."""
        if job.error is not None:
            raise InvalidExecute(job.error)
        if self._model is None:
            raise InvalidExecute("the model instance is not initialized")
        result = self._await_if_needed(self._model.execute(job.requests))
        if self._decoupled:
            if result is not None:
                raise InvalidExecute("Python model '{}' is using the decoupled mode and the execute "
                                     "function must return None.".format(self._instance_name))
            return None
        return self._default_responses(job, result)

    def _execute_failure(self, exc):
        text = str(exc) if isinstance(exc, InvalidExecute) else exception_summary(exc)
        return "Failed to process the request(s) for model '{}', message: {}".format(
            self._instance_name, text)

    def _default_responses(self, job, result):
        """One InferenceResponse per request from execute's return value and response senders
        (None for a request the model rescheduled)."""
        count = len(job.requests)
        if result is None:
            result = [None] * count
        elif not isinstance(result, (list, tuple)):
            raise InvalidExecute("Expected a list in the execute return")
        elif len(result) != count:
            raise InvalidExecute(
                "Number of InferenceResponse objects do not match the number of InferenceRequest "
                "objects. InferenceRequest(s) size is:{}, and InferenceResponse(s) size is:{}".format(
                    count, len(result)))
        return [_response_for(i, state, returned)
                for i, (state, returned) in enumerate(zip(job.states, result))]


def _exit_now(code):
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _return_freed_heap():
    """Gives the C heap's free pages back to the system once the model is loaded.

    Compiling the model's and this stub's modules and the model's `initialize` leave the heap
    grown and mostly free (1.3-1.8 MiB per stub, a resident cost Triton's stub does not pay
    since its utilities are compiled); glibc's malloc_trim returns those pages. Not glibc (no
    such function): nothing to do."""
    try:
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _check_protocol(message):
    """The server and this stub's compiled core must speak the same protocol revision."""
    version = message.get("protocol_version")
    if version != _core.PROTOCOL_VERSION:
        raise RuntimeError(
            "the Python stub's compiled core nereid_stub_core ({}) speaks stub protocol version {}, "
            "the server {}: the server and libnereid_stub_core.so come from different builds; "
            "rebuild both with `make build`".format(_core.__file__, _core.PROTOCOL_VERSION, version))


def _close(state):
    """Marks a request done; takes its lock only when a sender may hold it."""
    if state.has_lock:
        with state.lock:
            state.closed = True
    else:
        state.closed = True


def _response_for(index, state, returned):
    if state.release_flags == _RESCHEDULE:
        # Runs again: no response now (one its sender collected is dropped, as in Triton).
        if returned is not None:
            # Triton's words, its spelling included.
            raise InvalidExecute(
                "Expected a None object in the execute function return list for reschduled "
                "request, found type '{}'.".format(type(returned)))
        return None
    if returned is None:
        if state.collected is None:
            raise InvalidExecute("execute() returned no response for request {} and sent none through "
                                 "its response sender".format(index))
        return state.collected
    if not isinstance(returned, pb_utils.InferenceResponse):
        raise InvalidExecute("execute() must return pb_utils.InferenceResponse objects; element {} "
                             "is {}".format(index, type(returned).__name__))
    if state.collected is not None:
        raise InvalidExecute("request {} got one response from its response sender and another from "
                             "execute()'s return value".format(index))
    return returned


def _run_loop_forever(loop):
    import asyncio

    asyncio.set_event_loop(loop)
    loop.run_forever()


def _exit_code(system_exit):
    code = system_exit.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    _warn(str(code))
    return 1


def main(argv):
    count = None
    if len(argv) == 3 and argv[2].isdigit() and int(argv[2]) > 0:
        count = int(argv[2])
    elif len(argv) != 2:
        _warn("usage: nereid_stub.py SOCKET_PATH [INSTANCES]")
        return 2
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Three connections, in this order: commands (what the server sends), answers, events;
    # a shared process opens them member after member.
    fds = []
    for _ in range(3 * (count or 1)):
        # _socket, not socket: the wrapper module and what it imports cost 0.3 MiB per stub.
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            sock.connect(argv[1])
        except OSError as e:
            _warn("cannot connect to {}: {}".format(argv[1], e))
            return 1
        fds.append(sock.detach())
    if count is not None:
        import nereid_stub_shared

        nereid_stub_shared.serve(fds, count, lambda fds, host: Stub(_core.Channel(*fds), host),
                                 _exit_now, _exit_code)
        return 0
    stub = Stub(_core.Channel(*fds))
    try:
        stub.serve()
    except SystemExit as e:  # sys.exit() in model code ends the stub, as in Triton
        stub.exit(_exit_code(e))
    except BaseException:
        _warn("stub failed:\n" + traceback.format_exc())
        stub.exit(1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
