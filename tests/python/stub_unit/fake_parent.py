"""A pure-Python stand-in for Nereid's Rust parent, to drive the real nereid_stub.py.

`FakeParent(workdir)` listens on a Unix socket in `workdir`, starts the stub with the repository's
virtualenv Python, accepts its connection and then speaks the protocol of
docs/internals/python-stub-protocol.md: frames, parent-written segments (`p<k>`, reused after the
stub's `release`) and reading the stub's segments. Every read is bounded by READ_TIMEOUT_S.
"""

import atexit
import importlib.util
import json
import os
import select
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
STUB_DIR = ROOT / "data-plane" / "python"
STUB = STUB_DIR / "nereid_stub.py"
# NEREID_STUB_PYTHON runs the stub with another interpreter (e.g. one with NumPy 2).
_VENV_PYTHON = ROOT / ".venv" / "bin" / "python"
PYTHON = os.environ.get("NEREID_STUB_PYTHON") or (
    str(_VENV_PYTHON) if _VENV_PYTHON.exists() else sys.executable)
READ_TIMEOUT_S = 10.0
ALIGNMENT = 64
_CORE_LIBRARY = "libnereid_stub_core.so"


def _stub_core_dir():
    """A directory holding the compiled stub core under its import name, as the server's runtime
    directory does: the library next to NEREID_BIN, else the one in target/release."""
    candidates = [ROOT / "target" / "release" / _CORE_LIBRARY]
    if os.environ.get("NEREID_BIN"):
        candidates.insert(0, Path(os.environ["NEREID_BIN"]).resolve().parent / _CORE_LIBRARY)
    library = next((c for c in candidates if c.is_file()), None)
    if library is None:
        raise RuntimeError("no {} at {}: run `make build`".format(
            _CORE_LIBRARY, ", ".join(str(c) for c in candidates)))
    directory = tempfile.mkdtemp(prefix="nereid-stub-core-")
    atexit.register(shutil.rmtree, directory, True)
    shutil.copy(library, os.path.join(directory, "nereid_stub_core.abi3.so"))
    return directory


STUB_CORE_DIR = _stub_core_dir()

# Loaded under a private name so suites that put a placeholder `triton_python_backend_utils`
# into sys.modules and these tests never see each other's module.
# The utils import nereid_dlpack from their own directory, as in the stub's runtime directory.
if str(STUB_DIR) not in sys.path:
    sys.path.insert(0, str(STUB_DIR))
sys.path.insert(0, STUB_CORE_DIR)
import nereid_stub_core  # noqa: E402  (after the path it is found on)

PROTOCOL_VERSION = nereid_stub_core.PROTOCOL_VERSION
_spec = importlib.util.spec_from_file_location("nereid_pb_utils_under_test",
                                               STUB_DIR / "triton_python_backend_utils.py")
pb_utils = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = pb_utils
_spec.loader.exec_module(pb_utils)

_HEADER = struct.Struct("<I")


def wire_datatype(array):
    return pb_utils._wire_from_dtype(array.dtype)


def tensor_bytes(array):
    if wire_datatype(array) == "BYTES":
        return pb_utils._serialize_bytes(array)
    return np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<"), copy=False).tobytes()


class FakeParent:
    def __init__(self, workdir, extra_env=None):
        self.workdir = Path(workdir)
        self.prefix = str(self.workdir / "shm-")
        self.logs = []
        self.released = []
        self._free_segments = []
        self._segment_counter = 0
        self._bls_queue = []
        sock_path = str(self.workdir / "stub.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(sock_path)
        listener.listen(1)
        listener.settimeout(READ_TIMEOUT_S)
        self.stderr_path = self.workdir / "stub.log"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(STUB_DIR), STUB_CORE_DIR]),
                   **(extra_env or {}))
        with open(self.stderr_path, "wb") as log:
            self.proc = subprocess.Popen([PYTHON, "-u", str(STUB), sock_path], cwd=str(self.workdir),
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env)
        try:
            # The stub connects three times: commands (what it is sent), answers, events.
            self.commands, _ = listener.accept()
            self.conn, _ = listener.accept()
            self.events, _ = listener.accept()
        finally:
            listener.close()
        for sock in (self.commands, self.conn, self.events):
            sock.settimeout(READ_TIMEOUT_S)

    # -- frames -------------------------------------------------------------------------------------

    def send(self, message):
        payload = json.dumps(message).encode()
        self.commands.sendall(_HEADER.pack(len(payload)) + payload)

    def recv(self):
        """The next frame from either connection. Events first: the stub writes them before
        the answer that follows them (a decoupled model's responses, then execute_done), so
        whatever an answer waited behind is read first."""
        readable, _, _ = select.select([self.events, self.conn], [], [], READ_TIMEOUT_S)
        if not readable:
            raise AssertionError("no frame from the stub within {} s; stub log:\n{}".format(
                READ_TIMEOUT_S, self.stub_log()))
        if self.events not in readable:
            # An answer is ready: take any event written before it first.
            early_events, _, _ = select.select([self.events], [], [], 0)
            readable = early_events + [self.conn]
        # An events connection at its end (a stub that has answered and exited) is readable
        # too; the answer still waiting on the other connection comes first then.
        if self.events in readable and self._at_end(self.events) and self.conn in readable:
            sock = self.conn
        else:
            sock = self.events if self.events in readable else self.conn
        header = self._read(4, sock)
        (length,) = _HEADER.unpack(header)
        return json.loads(self._read(length, sock))

    @staticmethod
    def _at_end(sock):
        """Whether `sock` (known readable) holds no more data, only its end."""
        try:
            return sock.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _read(self, n, sock):
        data = b""
        while len(data) < n:
            try:
                chunk = sock.recv(n - len(data))
            except socket.timeout:
                raise AssertionError("no frame from the stub within {} s; stub log:\n{}".format(
                    READ_TIMEOUT_S, self.stub_log())) from None
            if not chunk:
                raise AssertionError("stub closed the socket; stub log:\n" + self.stub_log())
            data += chunk
        return data

    def recv_op(self, op):
        """The next frame with `op`, recording `log` and `release` frames on the way."""
        while True:
            message = self.recv()
            if message["op"] == op:
                return message
            if not self._record(message):
                raise AssertionError("expected '{}', got {}".format(op, message))

    def _record(self, message):
        if message["op"] == "log":
            self.logs.append((message["level"], message["message"]))
            return True
        if message["op"] == "release":
            self.released.append(message["segment"])
            self._free_segments.append(message["segment"])
            return True
        return False

    def wait_released(self, segment, times=1):
        """Reads frames until the stub has released `segment` `times` times in all."""
        while self.released.count(segment) < times:
            message = self.recv()
            if not self._record(message):
                raise AssertionError("waiting for release of {}, got {}".format(segment, message))

    def stub_log(self):
        try:
            return self.stderr_path.read_text(errors="replace")
        except OSError:
            return ""

    # -- segments -----------------------------------------------------------------------------------

    def write_segment(self, tensors):
        """Writes [(name, array)] into one parent segment; returns (segment id or None, refs)."""
        refs, blobs, end = [], [], 0
        for name, array in tensors:
            data = tensor_bytes(array)
            offset = -(-end // ALIGNMENT) * ALIGNMENT if data else 0
            refs.append({"name": name, "datatype": wire_datatype(array), "shape": list(array.shape),
                         "offset": offset, "nbytes": len(data)})
            blobs.append((offset, data))
            if data:
                end = offset + len(data)
        if end == 0:
            return None, refs
        segment = self._take_segment()
        fd = os.open(self.prefix + segment, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size < end:
                os.ftruncate(fd, end)
            for offset, data in blobs:
                os.pwrite(fd, data, offset)
        finally:
            os.close(fd)
        return segment, refs

    def _take_segment(self):
        if self._free_segments:
            return self._free_segments.pop(0)
        segment = "p{}".format(self._segment_counter)
        self._segment_counter += 1
        return segment

    def read_tensor(self, segment, ref):
        count = int(np.prod(ref["shape"], dtype=np.int64))
        data = b""
        if ref["nbytes"]:
            with open(self.prefix + segment, "rb") as f:
                f.seek(ref["offset"])
                data = f.read(ref["nbytes"])
        if ref["datatype"] == "BYTES":
            return pb_utils.deserialize_bytes_tensor(data).reshape(ref["shape"])
        dtype = np.dtype(pb_utils._NUMPY_BY_WIRE[ref["datatype"]]).newbyteorder("<")
        assert len(data) == count * dtype.itemsize
        return np.frombuffer(data, dtype=dtype).reshape(ref["shape"])

    def outputs(self, response, segment):
        return {ref["name"]: self.read_tensor(segment, ref) for ref in response["outputs"]}

    # -- conversations ------------------------------------------------------------------------------

    def write_model(self, source):
        model_dir = self.workdir / "model" / "1"
        model_dir.mkdir(parents=True, exist_ok=True)
        path = model_dir / "model.py"
        path.write_text(textwrap.dedent(source))
        return str(path)

    def init(self, source, decoupled=False, config=None):
        config = config or {"name": "m"}
        self.send({"op": "init", "protocol_version": PROTOCOL_VERSION, "shm_prefix": self.prefix, "model_file": self.write_model(source),
                   "decoupled": decoupled, "args": {
                       "model_config": json.dumps(config), "model_instance_kind": "CPU",
                       "model_instance_name": "m_0", "model_instance_device_id": "0",
                       "model_repository": str(self.workdir / "model"), "model_version": "1",
                       "model_name": "m"}})
        return self.recv_op("init_done")

    def execute(self, requests, execute_id=1):
        """Sends one execute; `requests` are dicts with `inputs` [(name, array)] and optional
        `key`, `requested_output_names`, `parameters`, `request_id`."""
        tensors = [t for r in requests for t in r.get("inputs", [])]
        segment, refs = self.write_segment(tensors)
        wire, position = [], 0
        for index, r in enumerate(requests):
            count = len(r.get("inputs", []))
            wire.append({"request_id": r.get("request_id", "r{}".format(index)), "correlation_id": 0,
                         "flags": 0, "parameters": r.get("parameters", {}),
                         "inputs": refs[position:position + count],
                         "requested_output_names": r.get("requested_output_names", []),
                         "key": r.get("key", index)})
            position += count
        message = {"op": "execute", "id": execute_id, "requests": wire}
        if segment is not None:
            message["segment"] = segment
        self.send(message)
        return segment

    def close_connections(self):
        """Closes every connection: EOF for the stub."""
        for sock in (self.commands, self.conn, self.events):
            sock.close()

    def close(self):
        """Closes the connections (EOF for the stub) and returns its exit status."""
        try:
            self.close_connections()
        finally:
            try:
                return self.proc.wait(timeout=READ_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("stub did not exit after EOF")

    def stub_files(self):
        return sorted(p.name for p in self.workdir.iterdir() if p.name.startswith("shm-s"))
