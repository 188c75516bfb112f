"""Nereid Python stub: runs one instance of a Triton Python-backend model (`model.py`).

Started by the server (the *parent*) as `python3 -u nereid_stub.py SOCKET_PATH`; the wire
protocol is docs/internals/python-stub-protocol.md. Frames are a 4-byte little-endian length
plus one JSON object; tensor data lives in shared-memory segment files.

Threads and flow
----------------

    parent ──frames──> main thread: reads frames itself; runs init, auto_complete, execute,
                        │          finalize (model code) where it read them; answers
                        │          bls_response / cancel / release; decodes execute inputs
                        │          (zero-copy NumPy views)
                        └─ while model code needs frames (a BLS call, an awaitable, a look at
                           is_cancelled()), the helper thread reads instead, then hands the next
                           main-thread frame (and the reading) back to the main thread
    parent <──frames── any thread, one frame at a time (write lock): execute_done, ...
                         ^ release thread: sends `release` for parent segments whose NumPy
                           arrays were garbage-collected (weakref.finalize), and the deletions of
                           garbage custom metrics, when no other frame takes them along

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
  "Failed to process the request(s) for model instance '<instance>', message: <Type>: <text>"
  followed by "At:" and the model's frames; with an error, `responses` is `[]` and there is no
  segment.
"""

import asyncio
import collections
import concurrent.futures
import importlib.util
import inspect
import itertools
import json
import mmap
import os
import queue
import signal
import socket
import struct
import sys
import threading
import traceback
import weakref

import numpy as np

import triton_python_backend_utils as pb_utils

_HEADER = struct.Struct("<I")
MAX_FRAME_BYTES = 256 << 20
ALIGNMENT = 64
SEGMENT_GRANULE = 64 << 10
# Segment files are never opened through a symlink, nor inherited by processes a model starts.
_OPEN_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC
_FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
_RESCHEDULE = pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE

_STUB_FILE = os.path.abspath(__file__)
_INTERNAL_DIRS = tuple(
    os.path.dirname(os.path.abspath(module.__file__)) + os.sep
    for module in (asyncio, concurrent.futures)
)

# Little-endian NumPy dtypes of the fixed-size wire datatypes; BF16 is kept as raw uint16.
_WIRE_DTYPES = {
    wire: np.dtype(numpy_type).newbyteorder("<")
    for wire, numpy_type in pb_utils._NUMPY_BY_WIRE.items() if wire != "BYTES"
}
_WIRE_DTYPES["BF16"] = np.dtype("<u2")


class ProtocolError(Exception):
    """The parent sent something the protocol does not allow."""


class ParentGone(Exception):
    """The socket to the parent is closed or broken."""


def _warn(text):
    sys.stderr.write("nereid stub: {}\n".format(text))


# ---------------------------------------------------------------------------------------------
# Frames
# ---------------------------------------------------------------------------------------------

class Connection:
    """Length-prefixed JSON frames over the Unix socket; `send` is safe from any thread."""

    def __init__(self, sock):
        self._sock = sock
        self._reader = sock.makefile("rb")
        self._write_lock = threading.Lock()

    def send(self, message, before=()):
        """Sends `message`, preceded by the messages in `before`, in one write."""
        frames = []
        for m in (*before, message):
            payload = json.dumps(m, separators=(",", ":")).encode("utf-8")
            frames.append(_HEADER.pack(len(payload)))
            frames.append(payload)
        with self._write_lock:
            try:
                self._sock.sendall(b"".join(frames))
            except OSError as e:
                raise ParentGone(str(e)) from None

    def receive(self):
        """The next message, or None at EOF."""
        header = self._read_exactly(_HEADER.size)
        if header is None:
            return None
        (length,) = _HEADER.unpack(header)
        if length > MAX_FRAME_BYTES:
            raise ProtocolError("frame of {} bytes exceeds the {} byte limit".format(length, MAX_FRAME_BYTES))
        payload = self._read_exactly(length)
        if payload is None:
            return None
        try:
            message = json.loads(payload.decode("utf-8"))
        except ValueError as e:
            raise ProtocolError("frame is not UTF-8 JSON: {}".format(e)) from None
        if not isinstance(message, dict) or not isinstance(message.get("op"), str):
            raise ProtocolError("frame is not a JSON object with a string 'op'")
        return message

    def _read_exactly(self, n):
        try:
            data = self._reader.read(n)
        except OSError:
            return None
        return data if data is not None and len(data) == n else None


# ---------------------------------------------------------------------------------------------
# Shared memory: segments the parent wrote (read here) and segments the stub writes
# ---------------------------------------------------------------------------------------------

def _align(n):
    return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


def _valid_segment_id(segment, writer):
    return isinstance(segment, str) and segment[:1] == writer and segment[1:].isdigit()


def _element_count(shape):
    count = 1
    for dim in shape:
        count *= dim
    return count


class _TensorRef:
    """A validated tensor reference from the parent."""

    __slots__ = ("name", "datatype", "shape", "offset", "nbytes")

    def __init__(self, obj):
        if not isinstance(obj, dict):
            raise ProtocolError("tensor reference is not an object: {!r}".format(obj))
        self.name = obj.get("name")
        self.datatype = obj.get("datatype")
        self.shape = obj.get("shape")
        self.offset = obj.get("offset", 0)
        self.nbytes = obj.get("nbytes", 0)
        if not isinstance(self.name, str):
            raise ProtocolError("tensor reference lacks a string 'name': {!r}".format(obj))
        if self.datatype != "BYTES" and self.datatype not in _WIRE_DTYPES:
            raise ProtocolError("tensor '{}' has unknown datatype {!r}".format(self.name, self.datatype))
        if not isinstance(self.shape, list) or not all(_is_count(d) for d in self.shape):
            raise ProtocolError("tensor '{}' has invalid shape {!r}".format(self.name, self.shape))
        if not _is_count(self.offset) or not _is_count(self.nbytes):
            raise ProtocolError("tensor '{}' has invalid offset/nbytes {!r}/{!r}".format(
                self.name, self.offset, self.nbytes))


def _is_count(value):
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _decode_tensor(base, ref):
    """A pb_utils.Tensor for `ref`; fixed-size data is a view on `base` (None when no data)."""
    count = _element_count(ref.shape)
    data = base[ref.offset:ref.offset + ref.nbytes] if ref.nbytes else np.empty(0, np.uint8)
    if ref.datatype == "BYTES":
        array = pb_utils.deserialize_bytes_tensor(data)
        if array.size != count:
            raise ProtocolError("BYTES tensor '{}' of shape {} holds {} elements".format(
                ref.name, ref.shape, array.size))
        return pb_utils.Tensor._from_wire(ref.name, "BYTES", array.reshape(ref.shape))
    dtype = _WIRE_DTYPES[ref.datatype]
    expected = count * dtype.itemsize
    if ref.nbytes != expected:
        raise ProtocolError("tensor '{}' ({} {}) needs {} bytes, the reference says {}".format(
            ref.name, ref.datatype, ref.shape, expected, ref.nbytes))
    if expected == 0:
        array = np.empty(ref.shape, dtype)
    else:
        array = np.ndarray(ref.shape, dtype=dtype, buffer=base, offset=ref.offset)
    return pb_utils.Tensor._from_wire(ref.name, ref.datatype, array)


def _map_parent_file(path, segment, end):
    """Maps the whole segment file (shared; writable when the file allows it)."""
    try:
        fd, access = os.open(path, os.O_RDWR | _OPEN_FLAGS), mmap.ACCESS_WRITE
    except PermissionError:
        fd, access = os.open(path, os.O_RDONLY | _OPEN_FLAGS), mmap.ACCESS_READ
    except FileNotFoundError:
        raise ProtocolError("segment '{}' does not exist ({})".format(segment, path)) from None
    try:
        size = os.fstat(fd).st_size
        if size < end:
            raise ProtocolError("segment '{}' is {} bytes, but its tensors end at byte {}".format(
                segment, size, end))
        return mmap.mmap(fd, size, access=access)
    finally:
        os.close(fd)


class ParentSegments:
    """Segments written by the parent. Used from the reader thread only.

    Every message gets one base array over its segment; its tensors are views on it, and a
    `weakref.finalize` on the base queues the segment's release once all of them are garbage.
    """

    def __init__(self, prefix, release):
        self._prefix = prefix
        self._release = release  # must be reentrant-safe: finalizers run inside the GC
        self._maps = {}

    def tensors(self, segment, refs):
        try:
            refs = [_TensorRef(r) for r in refs]
            end = max((r.offset + r.nbytes for r in refs if r.nbytes), default=0)
            mapped = self._mapping(segment, end) if end else None
        except ProtocolError:
            if segment is not None:
                self._release(segment)  # nothing will ever use it
            raise
        if mapped is None:
            if segment is not None:
                self._release(segment)
            return [_decode_tensor(None, r) for r in refs]
        base = np.frombuffer(mapped, dtype=np.uint8, count=end)
        weakref.finalize(base, self._release, segment).atexit = False
        return [_decode_tensor(base, r) for r in refs]

    def _mapping(self, segment, end):
        if segment is None:
            raise ProtocolError("message has tensor data but no 'segment'")
        if not _valid_segment_id(segment, "p"):
            raise ProtocolError("invalid parent segment id {!r}".format(segment))
        mapped = self._maps.get(segment)
        if mapped is None or len(mapped) < end:
            mapped = _map_parent_file(self._prefix + segment, segment, end)
            self._maps[segment] = mapped
        return mapped


class _Payload:
    """One tensor's bytes as they go into a segment."""

    __slots__ = ("tensor", "data", "nbytes")

    def __init__(self, tensor):
        self.tensor = tensor
        if tensor._datatype == "BYTES":
            self.data = pb_utils._serialize_bytes(tensor._array)
            self.nbytes = len(self.data)
        else:
            self.data = None
            # A GPU tensor (Tensor.from_dlpack of CUDA memory) is copied to the host here, once.
            self.nbytes = tensor._host_array().nbytes

    def write_into(self, mapped, offset):
        if self.data is not None:
            mapped[offset:offset + self.nbytes] = self.data
            return
        array = self.tensor._host_array()
        target = np.ndarray(array.shape, dtype=array.dtype.newbyteorder("<"), buffer=mapped, offset=offset)
        np.copyto(target, array, casting="equiv")


class _Segment:
    def __init__(self, segment_id, path, fd):
        self.id = segment_id
        self.path = path
        self.fd = fd
        self.mapped = None
        self.size = 0
        self.busy = False

    def ensure_size(self, size):
        """Grows the file (never shrinks) and maps it again."""
        if size <= self.size:
            return
        new_size = -(-size // SEGMENT_GRANULE) * SEGMENT_GRANULE
        try:
            os.ftruncate(self.fd, new_size)
        except OSError as e:
            raise pb_utils.TritonModelException(
                "cannot grow shared-memory segment {} to {} bytes: {}".format(self.path, new_size, e)
            ) from None
        if self.mapped is not None:
            self.mapped.close()
        self.mapped = mmap.mmap(self.fd, new_size, access=mmap.ACCESS_WRITE)
        self.size = new_size


class StubSegments:
    """Segments the stub writes (outputs, BLS inputs); safe to use from any thread."""

    def __init__(self, prefix):
        self._prefix = prefix
        self._lock = threading.Lock()
        self._segments = {}
        self._counter = itertools.count()

    def write(self, tensors):
        """Writes `tensors` into one segment at 64-byte aligned offsets.

        Returns (segment id or None when there is no data, tensor references).
        """
        payloads = [_Payload(t) for t in tensors]
        refs, end = [], 0
        for payload in payloads:
            offset = _align(end) if payload.nbytes else 0
            refs.append({"name": payload.tensor._name, "datatype": payload.tensor._datatype,
                         "shape": payload.tensor.shape(), "offset": offset, "nbytes": payload.nbytes})
            if payload.nbytes:
                end = offset + payload.nbytes
        if end == 0:
            return None, refs
        segment = self._acquire(end)
        try:
            for payload, ref in zip(payloads, refs):
                if payload.nbytes:
                    payload.write_into(segment.mapped, ref["offset"])
        except BaseException:
            self.release(segment.id)
            raise
        return segment.id, refs

    def _acquire(self, size):
        with self._lock:
            free = [s for s in self._segments.values() if not s.busy]
            fitting = [s for s in free if s.size >= size]
            if fitting:
                segment = min(fitting, key=lambda s: s.size)
            elif free:
                segment = max(free, key=lambda s: s.size)
            else:
                segment = self._create()
            segment.ensure_size(size)
            segment.busy = True
            return segment

    def _create(self):
        segment_id = "s{}".format(next(self._counter))
        path = self._prefix + segment_id
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | _OPEN_FLAGS, 0o600)
        except OSError as e:
            raise pb_utils.TritonModelException(
                "cannot create shared-memory segment {}: {}".format(path, e)) from None
        segment = _Segment(segment_id, path, fd)
        self._segments[segment_id] = segment
        return segment

    def release(self, segment_id):
        """Marks a segment free for reuse; False when it is not a busy segment of ours."""
        with self._lock:
            segment = self._segments.get(segment_id)
            if segment is None or not segment.busy:
                return False
            segment.busy = False
            return True

    def unlink_prefix(self):
        """Removes every file under this stub's prefix, the parent's segments included: used
        when the parent is gone (EOF without finalize) and cannot clean up after itself."""
        directory, stem = os.path.split(self._prefix)
        try:
            names = os.listdir(directory)
        except OSError:
            return
        for name in names:
            if name.startswith(stem):
                try:
                    os.unlink(os.path.join(directory, name))
                except OSError:
                    pass
        if not stem:  # the prefix is the segment directory itself
            try:
                os.rmdir(directory)
            except OSError:
                pass


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


def _encode_error(error):
    if error is None:
        return None
    return _error_object(error.message(), pb_utils._ERROR_CODE_NAMES.get(error.code(), "UNKNOWN"))


def _decode_error(obj):
    if obj is None:
        return None
    if not isinstance(obj, dict):
        raise ProtocolError("error is not an object: {!r}".format(obj))
    code = pb_utils._ERROR_CODES_BY_NAME.get(obj.get("code"), pb_utils.TritonError.UNKNOWN)
    return pb_utils.TritonError(str(obj.get("message", "")), code)


class InvalidExecute(Exception):
    """`execute` returned something the protocol cannot carry; the text goes out verbatim."""


def _selected_outputs(response, requested_names):
    if not requested_names:
        return response.output_tensors()
    wanted = set(requested_names)
    return [t for t in response.output_tensors() if t.name() in wanted]


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
    """An `execute` message decoded by the reader thread, for the main thread."""

    def __init__(self, job_id):
        self.id = job_id
        self.requests = []
        self.states = []
        self.error = None


# ---------------------------------------------------------------------------------------------
# The stub
# ---------------------------------------------------------------------------------------------

class Stub:
    """Serves one model instance over one connection; also pb_utils' `_channel`."""

    def __init__(self, connection):
        self._conn = connection
        # Main-thread frames the helper read, handed over with the reading role (see
        # `_helper_loop`).
        self._jobs = queue.SimpleQueue()
        self._role_lock = threading.Lock()
        self._main_busy = False  # the main thread runs a frame's work (model code)
        self._helper_reading = False  # the helper reads on the main thread's behalf
        self._helper_wake = queue.SimpleQueue()
        # Parent segments whose arrays are garbage, not yet released. Finalizers append (deque
        # appends are atomic and safe inside the GC); every frame the stub sends takes them
        # along. While an execute reply is being sent (`_replying`) no wake-up is signalled:
        # the reply carries them. Otherwise `_release_wake` wakes the release thread.
        self._released = collections.deque()
        self._release_wake = queue.SimpleQueue()
        self._replying = False
        self._requests = weakref.WeakValueDictionary()
        self._bls_calls = {}
        self._bls_lock = threading.Lock()
        self._bls_ids = itertools.count()
        # Calls waiting for the parent's answer (`model_control_done`, `metric_done`), by id.
        self._calls = {}
        self._call_ids = itertools.count()
        self._parent_segments = None
        self._stub_segments = None
        self._model = None
        self._decoupled = False
        self._instance_name = ""
        self._loop = None
        self._loop_lock = threading.Lock()

    def serve(self):
        pb_utils._channel = self
        threading.Thread(target=self._helper_loop, name="nereid-reader", daemon=True).start()
        threading.Thread(target=self._release_loop, name="nereid-release", daemon=True).start()
        self._main_loop()

    def exit(self, code):
        """Unlinks every file under the stub's prefix (its own segments and the parent's: the
        parent may be gone, or exiting right after `finalize`) and ends the process at once,
        from any thread. Nothing reads a segment of a stub that is exiting."""
        if self._stub_segments is not None:
            self._stub_segments.unlink_prefix()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)

    # -- channel interface used by triton_python_backend_utils ----------------------------------

    def log(self, level, message):
        self._send({"op": "log", "level": level, "message": message})

    def send_response(self, state, response, flags):
        """A decoupled sender's send (called with `state.lock` held, so sends stay in order)."""
        message = {"op": "response", "key": state.key, "response": None, "flags": flags}
        if response is not None:
            wire, segment = self._encode_responses([response], [state.requested_output_names])
            message["response"] = wire[0]
            if segment is not None:
                message["segment"] = segment
        self._send(message)

    def need_reader(self):
        """Model code is about to wait for (or look at) what frames bring: if the main thread
        is busy with it, the helper starts reading. Any thread; cheap when nothing changes."""
        with self._role_lock:
            if self._main_busy and not self._helper_reading:
                self._helper_reading = True
                self._helper_wake.put(None)

    def submit_bls(self, request, decoupled, sink):
        self.need_reader()
        segment, refs = self._segments_for_writing().write(request.inputs())
        call_id = next(self._bls_ids)
        with self._bls_lock:
            self._bls_calls[call_id] = sink
        message = {"op": "bls_request", "id": call_id, "decoupled": decoupled, "request": {
            "request_id": request._request_id, "correlation_id": request._correlation_id,
            "flags": request._flags, "parameters": request._parameters, "inputs": refs,
            "requested_output_names": list(request._requested_output_names),
            "model_name": request._model_name, "model_version": request._model_version,
            "timeout_us": request._timeout,
        }}
        if segment is not None:
            message["segment"] = segment
        self._send(message)
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
            raise pb_utils.TritonModelException(_decode_error(error).message())
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
        on a thread that holds the write lock, so it is queued like a segment release and goes
        out ahead of the next frame (or from the release thread)."""
        self._queue_release({"op": "metric", **fields})

    # -- sending --------------------------------------------------------------------------------

    def _send(self, message):
        try:
            self._conn.send(message, self._take_releases())
        except ParentGone:
            self.exit(0)

    def _take_releases(self):
        releases = []
        while True:
            try:
                item = self._released.popleft()
                # A parent segment id, or a queued message (`metric_release`).
                releases.append(item if isinstance(item, dict) else {"op": "release", "segment": item})
            except IndexError:
                return releases

    def _release(self, segment):
        """Queues the release of parent segment `segment` (any thread, also inside the GC)."""
        self._queue_release(segment)

    def _queue_release(self, item):
        """Queues a segment id or a message to go out ahead of the next frame (or from the
        release thread); safe inside the garbage collector."""
        self._released.append(item)
        if not self._replying:
            self._release_wake.put(None)

    def _release_loop(self):
        while True:
            self._release_wake.get()
            releases = self._take_releases()
            if releases:
                try:
                    self._conn.send(releases[-1], releases[:-1])
                except ParentGone:
                    self.exit(0)

    def _segments_for_writing(self):
        if self._stub_segments is None:
            raise pb_utils.TritonModelException(
                "no shared-memory prefix: no init message with a valid 'shm_prefix' was received")
        return self._stub_segments

    def _encode_responses(self, responses, requested_names):
        """Wire response objects for `responses`, their outputs in one stub segment."""
        tensors, counts = [], []
        for response, names in zip(responses, requested_names):
            outputs = [] if response.has_error() else _selected_outputs(response, names)
            tensors.extend(outputs)
            counts.append(len(outputs))
        segment, refs = self._segments_for_writing().write(tensors)
        wire, position = [], 0
        for response, count in zip(responses, counts):
            wire.append({"outputs": refs[position:position + count],
                         "error": _encode_error(response.error()),
                         "parameters": response._parameters})
            position += count
        return wire, segment

    # -- reading (main thread, or the helper on its behalf) -----------------------------------------

    _MAIN_OPS = ("execute", "init", "auto_complete", "finalize")

    def _receive_or_exit(self):
        """The next frame; exits the stub at EOF (0) or on a protocol error (2)."""
        try:
            message = self._conn.receive()
        except ProtocolError as e:
            _warn("protocol error, exiting: {}".format(e))
            self.exit(2)
        if message is None:
            self.exit(0)
        return message

    def _main_job(self, message):
        """A main-thread frame as (op, payload), its inputs decoded."""
        op = message["op"]
        if op == "execute":
            return op, self._prepare_execute(message)
        self._configure(message)
        return op, message

    def _helper_loop(self):
        """Reads while the main thread is busy with model code that needs frames; hands the
        next main-thread frame back with the reading role."""
        try:
            while True:
                self._helper_wake.get()
                while True:
                    message = self._receive_or_exit()
                    if message["op"] in self._MAIN_OPS:
                        job = self._main_job(message)
                        # Under the lock, so the main thread sees the hand-over whole: either
                        # still reading here, or done with the job already queued.
                        with self._role_lock:
                            self._helper_reading = False
                            self._jobs.put(job)
                        break
                    self._dispatch(message)
        except Exception:  # a bug in the stub: say so and stop rather than hang the parent
            _warn("reader thread failed:\n" + traceback.format_exc())
            self.exit(1)

    def _dispatch(self, message):
        op = message["op"]
        if op == "bls_response":
            self._on_bls_response(message)
        elif op == "cancel":
            state = self._requests.get(message.get("key"))
            if state is not None:
                state.cancelled = True
        elif op in ("model_control_done", "metric_done"):
            with self._bls_lock:
                answer = self._calls.pop(message.get("id"), None)
            if answer is None:
                _warn("ignoring {} for unknown call id {!r}".format(op, message.get("id")))
            else:
                answer.put(message)
        elif op == "release":
            if self._stub_segments is None or not self._stub_segments.release(message.get("segment")):
                _warn("ignoring release of unknown or free segment {!r}".format(message.get("segment")))
        else:
            _warn("ignoring message with unknown op {!r}".format(op))

    def _configure(self, message):
        """Takes the segment prefix and mode before later frames (execute) need them."""
        prefix = message.get("shm_prefix")
        if isinstance(prefix, str) and prefix and self._stub_segments is None:
            self._stub_segments = StubSegments(prefix)
            self._parent_segments = ParentSegments(prefix, self._release)
        if message["op"] == "init":
            self._decoupled = bool(message.get("decoupled", False))

    def _prepare_execute(self, message):
        job = _ExecuteJob(message.get("id"))
        try:
            wire_requests = message.get("requests")
            if not isinstance(wire_requests, list) or not all(isinstance(r, dict) for r in wire_requests):
                raise ProtocolError("'requests' is not an array of request objects")
            if self._parent_segments is None:
                raise ProtocolError("execute received before init")
            all_refs = [ref for r in wire_requests for ref in (r.get("inputs") or [])]
            tensors = self._parent_segments.tensors(message.get("segment"), all_refs)
            position = 0
            for fields in wire_requests:
                count = len(fields.get("inputs") or [])
                state = pb_utils._RequestState(
                    fields["key"], self._decoupled, list(fields.get("requested_output_names") or []))
                self._requests[state.key] = state
                job.states.append(state)
                job.requests.append(pb_utils.InferenceRequest._from_server(
                    fields, tensors[position:position + count], state))
                position += count
        except (ProtocolError, pb_utils.TritonModelException, KeyError, TypeError, ValueError, OSError) as e:
            job.error = "invalid execute message from the server: {}".format(e)
            job.requests = []
        return job

    def _on_bls_response(self, message):
        call_id, final, segment = message.get("id"), bool(message.get("final")), message.get("segment")
        with self._bls_lock:
            sink = self._bls_calls.pop(call_id, None) if final else self._bls_calls.get(call_id)
        if sink is None:
            _warn("ignoring bls_response for unknown call id {!r}".format(call_id))
            if segment is not None:
                self._release(segment)
            return
        try:
            response = self._decode_response(message.get("response"), segment)
        except (ProtocolError, pb_utils.TritonModelException, TypeError, ValueError, OSError) as e:
            response = pb_utils.InferenceResponse(
                error=pb_utils.TritonError("invalid BLS response from the server: {}".format(e)))
        sink.deliver(response, final)

    def _decode_response(self, obj, segment):
        if obj is None:
            if segment is not None:
                self._release(segment)
            return None
        if not isinstance(obj, dict):
            raise ProtocolError("response is not an object: {!r}".format(obj))
        outputs = self._parent_segments.tensors(segment, obj.get("outputs") or [])
        parameters = obj.get("parameters") or {}
        if not isinstance(parameters, dict):
            raise ProtocolError("response parameters are not an object: {!r}".format(parameters))
        return pb_utils.InferenceResponse._from_wire(outputs, _decode_error(obj.get("error")), parameters)

    # -- main thread ------------------------------------------------------------------------------

    def _main_loop(self):
        job = None
        while True:
            if job is None:
                message = self._receive_or_exit()
                if message["op"] not in self._MAIN_OPS:
                    self._dispatch(message)
                    continue
                job = self._main_job(message)
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
        return asyncio.run_coroutine_threadsafe(_await(value), self._event_loop()).result()

    def _event_loop(self):
        with self._loop_lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=_run_loop_forever, args=(loop,), name="nereid-asyncio",
                                 daemon=True).start()
                self._loop = loop
            return self._loop

    def _handle_init(self, message):
        error = None
        try:
            self._segments_for_writing()
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
        self._send({"op": "init_done", "error": error})

    def _handle_auto_complete(self, message):
        config, error = message.get("config") or {}, None
        try:
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
            reply = self._run_execute(job)
            failed = False
        except Exception as e:
            reply = self._execute_failure(job, e)
            failed = True
        if failed or not self._decoupled:
            for state in job.states:
                with state.lock:
                    state.closed = True
        # Dropping the requests usually frees their input arrays: their segments' releases go
        # out with the reply, in one write, without waking the release thread.
        self._replying = True
        try:
            job.requests = None
            self._send(reply)
        finally:
            self._replying = False
            if self._released:  # freed by another thread meanwhile: nobody was woken for it
                self._release_wake.put(None)

    def _run_execute(self, job):
        if job.error is not None:
            raise InvalidExecute(job.error)
        if self._model is None:
            raise InvalidExecute("the model instance is not initialized")
        result = self._await_if_needed(self._model.execute(job.requests))
        if self._decoupled:
            if result is not None:
                raise InvalidExecute("Python model '{}' is using the decoupled mode and the execute "
                                     "function must return None.".format(self._instance_name))
            self._refuse_rescheduled(job)
            return {"op": "execute_done", "id": job.id, "error": None}
        wire, segment = self._encode_responses(
            self._default_responses(job, result), [s.requested_output_names for s in job.states])
        reply = {"op": "execute_done", "id": job.id, "responses": wire, "error": None}
        if segment is not None:
            reply["segment"] = segment
        return reply

    def _execute_failure(self, job, exc):
        text = str(exc) if isinstance(exc, InvalidExecute) else exception_summary(exc)
        message = "Failed to process the request(s) for model instance '{}', message: {}".format(
            self._instance_name, text)
        reply = {"op": "execute_done", "id": job.id, "error": _error_object(message)}
        if not self._decoupled:
            reply["responses"] = []
        return reply

    def _default_responses(self, job, result):
        """One InferenceResponse per request from execute's return value and response senders."""
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

    def _refuse_rescheduled(self, job):
        for state in job.states:
            with state.lock:
                if state.release_flags == _RESCHEDULE and not state.closed:
                    self.send_response(state, _rescheduling_error(), _FINAL)
                    state.closed = True


def _rescheduling_error():
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(
        "request rescheduling (TRITONSERVER_REQUEST_RELEASE_RESCHEDULE) is not supported by Nereid yet",
        pb_utils.TritonError.UNSUPPORTED))


def _response_for(index, state, returned):
    if state.release_flags == _RESCHEDULE:
        return _rescheduling_error()
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
    if len(argv) != 2:
        _warn("usage: nereid_stub.py SOCKET_PATH")
        return 2
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(argv[1])
    except OSError as e:
        _warn("cannot connect to {}: {}".format(argv[1], e))
        return 1
    stub = Stub(Connection(sock))
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
