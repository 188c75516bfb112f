"""Helpers shared by the end-to-end suite: a managed `nereid serve` process, raw HTTP calls,
reference results from in-process onnxruntime, and test data per datatype."""

import http.client
import importlib.util
import json
import os
import sys
import signal
import socket
import subprocess
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
NEREID_BIN = os.environ.get("NEREID_BIN", str(ROOT / "target/release/nereid"))
START_DEADLINE_S = 60.0
STOP_DEADLINE_S = 40.0

_spec = importlib.util.spec_from_file_location("gen_models", ROOT / "scripts/gen_models.py")
gen_models = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen_models)

# A Python model answering its FP32 input `x` as its output `y` (Python-backend repositories
# that the reference Triton serves too).
PYTHON_IDENTITY_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy())]) for r in requests]
"""

# Every server started by the suite, so failure reports can show their logs.
SERVERS = []


# Ports free_port has handed out in this run. The kernel may offer a port again once the probe
# socket is closed, and two servers of one test (a node's Raft port and another's HTTP port)
# must never share one: HTTP/1 sent to a gRPC listener is reset.
_GIVEN_PORTS = set()


def free_port():
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _GIVEN_PORTS:
            _GIVEN_PORTS.add(port)
            return port


def wait_until(predicate, deadline_s, what, interval_s=0.2):
    """Polls `predicate` until it returns a truthy value or the deadline passes."""
    end = time.monotonic() + deadline_s
    last = None
    while time.monotonic() < end:
        try:
            last = predicate()
            if last:
                return last
        except Exception as e:  # noqa: BLE001 - keep polling; report the last error
            last = e
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {deadline_s}s waiting for {what}; last: {last!r}")


def _die_with_parent():
    """In the child: get SIGTERM if pytest dies, so no server outlives a killed run (Linux)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def loopback_listen_args(http_port, grpc_port, metrics_port):
    """The flags (Nereid's and Triton's alike) that put the three listeners on 127.0.0.1."""
    return [
        "--http-port", str(http_port),
        "--grpc-port", str(grpc_port),
        "--metrics-port", str(metrics_port),
        "--http-address", "127.0.0.1",
        "--grpc-address", "127.0.0.1",
        "--metrics-address", "127.0.0.1",
    ]


class Server:
    """One `nereid serve` process on free localhost ports, logging to a file."""

    def __init__(self, repo, workdir, extra_args=(), name="server", suite_defaults=True):
        """`suite_defaults`: the suite's own flags (lenient readiness, serving on when a model
        fails at startup, as the test repository's broken models do, debug logs, client shared
        memory on for the shared-memory tests); off for a server started exactly as a user would,
        with only `extra_args`."""
        self.repo = Path(repo)
        self.name = name
        self.http_port, self.grpc_port, self.metrics_port = free_port(), free_port(), free_port()
        self.log_path = Path(workdir) / f"{name}.log"
        self.args = [
            NEREID_BIN, "serve",
            "--model-repository", str(self.repo),
            *loopback_listen_args(self.http_port, self.grpc_port, self.metrics_port),
            *(("--strict-readiness", "false", "--exit-on-error=false", "--log-verbose", "1",
               "--allow-client-shm=true")
              if suite_defaults else ()),
            *extra_args,
        ]
        self.proc = None
        # Set once the suite stops or kills it, or once a failure report has shown its death.
        self.stopped = False

    @property
    def http_url(self):
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self):
        return f"127.0.0.1:{self.grpc_port}"

    def environment(self):
        """The child's environment: Python models run on the interpreter of the test run (the
        venv: it has numpy)."""
        env = dict(os.environ)
        env.setdefault("NEREID_PYTHON", sys.executable)
        return env

    def start(self):
        if not os.access(self.args[0], os.X_OK):
            raise AssertionError(f"server binary {self.args[0]} missing (set NEREID_BIN or build it)")
        self._log = open(self.log_path, "wb")
        env = self.environment()
        self.proc = subprocess.Popen(self.args, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent,
                                     env=env)
        SERVERS.append(self)
        end = time.monotonic() + START_DEADLINE_S
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"{self.name} exited early with {self.proc.returncode}; "
                    f"command: {' '.join(self.args)}\n--- log ---\n{self.log_tail()}")
            try:
                if http_raw(self.http_url, "GET", "/v2/health/live", timeout=2)[0] == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.1)
        self.kill()
        raise AssertionError(f"{self.name} not live within {START_DEADLINE_S}s\n{self.log_tail()}")

    def stop(self, deadline_s=STOP_DEADLINE_S):
        """SIGTERM, then wait; returns the exit code (kills and raises on timeout)."""
        self.stopped = True
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=deadline_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.name} did not exit within {deadline_s}s of SIGTERM\n"
                                 f"{self.log_tail()}")
        finally:
            self._log.close()

    def kill(self):
        self.stopped = True
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def log_tail(self, limit=6000):
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return "(no log)"
        return data[-limit:].decode("utf-8", "replace")


def managed_server(repo, workdir, extra_args, name):
    """Generator for fixtures: a started server, stopped with SIGTERM (exit code 0 asserted)."""
    server = Server(repo, workdir, extra_args, name=name).start()
    try:
        yield server
    finally:
        rc = server.stop()
        assert rc == 0, f"{name} exited with {rc} after SIGTERM\n{server.log_tail()}"


def http_raw(host_port, method, path, body=None, headers=None, timeout=30):
    """One HTTP request with the stdlib; returns (status, headers dict lower-cased, body bytes)."""
    host, port = host_port.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        conn.putrequest(method, path, skip_accept_encoding=True)
        hdrs = dict(headers or {})
        if body is not None:
            hdrs.setdefault("Content-Length", str(len(body)))
        for k, v in hdrs.items():
            conn.putheader(k, v)
        conn.endheaders()
        if body:
            try:
                conn.send(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the server may answer (e.g. too large) before reading everything
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
    finally:
        conn.close()


def http_json(host_port, method, path, body=None, headers=None):
    status, hdrs, data = http_raw(host_port, method, path, body, headers)
    try:
        parsed = json.loads(data) if data else None
    except ValueError:
        parsed = data
    return status, parsed


def assert_http_error(status_body, status, *needles):
    """Asserts an HTTP error answer: `status`, JSON `{"error": msg}`, msg contains each needle."""
    got_status, body = status_body[0], status_body[-1]
    if isinstance(body, bytes):
        body = json.loads(body)
    assert got_status == status, f"expected HTTP {status}, got {got_status}: {body!r}"
    assert isinstance(body, dict) and isinstance(body.get("error"), str), body
    for n in needles:
        assert n.lower() in body["error"].lower(), f"{n!r} not in error {body['error']!r}"
    return body["error"]


# ---------------------------------------------------------------------------------------------
# Reference results from onnxruntime


_SESSIONS = {}


def ort_session(path):
    import onnxruntime as ort

    path = str(path)
    if path not in _SESSIONS:
        _SESSIONS[path] = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return _SESSIONS[path]


def ort_run(model_path, feeds, bf16=False):
    """Runs the model file in-process. For BF16 models, inputs/outputs are uint16 bit patterns
    (numpy has no bfloat16) and outputs are assumed to have the shape of the first input."""
    import onnxruntime as ort

    sess = ort_session(model_path)
    if not bf16:
        names = [o.name for o in sess.get_outputs()]
        return dict(zip(names, sess.run(names, feeds)))
    binding = sess.io_binding()
    first = next(iter(feeds.values()))
    outs = {}
    for name, arr in feeds.items():
        binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
            np.ascontiguousarray(arr), 16))
    for o in sess.get_outputs():
        outs[o.name] = np.zeros(first.shape, dtype=np.uint16)
        binding.bind_ortvalue_output(o.name, ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
            outs[o.name], 16))
    sess.run_with_iobinding(binding)
    return outs


def f32_to_bf16_bits(a):
    return (np.asarray(a, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)


def bf16_bits_to_f32(bits):
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


# ---------------------------------------------------------------------------------------------
# Test data

NP_DTYPES = {
    "BOOL": np.bool_, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
    "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
    "FP16": np.float16, "FP32": np.float32, "FP64": np.float64, "BF16": np.float32,
    "BYTES": np.object_,
}

# UTF-8 without NUL: what every server and onnxruntime's Python binding carry unchanged.
# (Non-UTF-8 and NUL cases have their own tests in test_infer.py.)
BYTES_SAMPLES = [b"", b"hello", "héllo wörld".encode(), "日本語テキスト".encode(), b"tab\tnl\n",
                 b" ", b"x" * 300, "😀".encode()]


def make_data(dtype, shape, seed=0, json_safe=False):
    """Deterministic data covering each type's range. json_safe: finite numbers and
    |int| <= 2**53, values JSON and JSON-decoding clients carry unchanged."""
    rng = np.random.RandomState(seed)
    n = int(np.prod(shape))
    if dtype == "BOOL":
        flat = rng.randint(0, 2, n).astype(np.bool_)
    elif dtype == "BYTES":
        flat = np.array([BYTES_SAMPLES[i % len(BYTES_SAMPLES)] for i in range(n)], dtype=np.object_)
    elif dtype.startswith(("INT", "UINT")):
        info = np.iinfo(NP_DTYPES[dtype])
        lo, hi = int(info.min), int(info.max)
        if json_safe:
            lo, hi = max(lo, -(2**53)), min(hi, 2**53)
        flat = np.array([min(hi, lo + int(x * (hi - lo))) for x in rng.random_sample(n)],
                        dtype=object)
        flat[: min(n, 2)] = [lo, hi][: min(n, 2)]
        flat = flat.astype(NP_DTYPES[dtype])
    elif dtype == "BF16":
        flat = bf16_bits_to_f32(f32_to_bf16_bits(rng.randn(n).astype(np.float32) * 100))
    else:
        flat = (rng.randn(n) * 1000).astype(NP_DTYPES[dtype])
        if not json_safe and n >= 4:
            flat[:4] = [np.inf, -np.inf, -0.0, np.finfo(NP_DTYPES[dtype]).max]
    return flat.reshape(shape)


def assert_same(actual, expected, what=""):
    """Exact equality including dtype and shape; NaN == NaN; BYTES compared as bytes."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    if expected.dtype == np.object_:
        norm = lambda a: [x.encode() if isinstance(x, str) else bytes(x) for x in a.flatten()]  # noqa: E731
        assert norm(actual) == norm(expected), f"{what}: {actual!r} != {expected!r}"
        return
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    np.testing.assert_array_equal(actual, expected, err_msg=what)
