"""A hostile client's probes, kept as regressions: each test sends what the client tried and
asserts what a client now gets, on `nereid serve` and, where the probe applies, on a cluster
worker and the router. After every flood the server must still be alive and answer an
inference.

Servers (module scope, started once):
- `plain`: started as a user would (`suite_defaults=False`): client shared memory off, 10 s
  preface timeout, 1024 HTTP/2 streams, backlog 1024, 64 metrics connections; explicit mode
  with the model-repository API open (so it warns).
- `guarded`: client shared memory on, a Python model, explicit mode with model-repository
  restricted on HTTP and gRPC (so it does not warn).
- `limited`: 1 s preface timeout, 5 HTTP connections, 7 HTTP/2 streams, backlog 77, and a
  3 MB request budget over 1 MB HTTP bodies and gRPC messages.
- `cluster`: one control-plane node, one worker and the router (1 s preface timeouts), serving
  `simple` from the worker.

Probes refused before this suite, covered elsewhere and not repeated here:
- test_restricted_api.py: restricted categories without / with a wrong header (HTTP 403, gRPC
  UNAVAILABLE), header-name case, gRPC streams, open categories, bad flag values.
- test_connections.py: 2000 idle connections and a trickled body beside normal requests, a
  trickled body cut at --http-body-read-timeout-secs, a stalled head cut at
  --http-header-read-timeout-secs, connections past --http-max-connections wait.
- test_limits.py: --max-request-inputs/-outputs, --max-tensor-elements on the declared shape
  (and shapes overflowing 64 bits), a real oversized gRPC message (OUT_OF_RANGE).
- test_errors.py: malformed JSON, binary sizes that do not add up, unknown routes (404) and
  methods (405), a body over --http-max-input-size (400).
- test_repository.py: traversal in load file overrides (`file:../model.onnx`).
- test_shared_memory.py, test_protocol.py: a missing shm key (400), offsets past the region,
  a region shrunk or unlinked behind the server's back.
- test_router.py: the router refuses system shared memory registration, saying why.
"""

import base64
import contextlib
import gzip
import importlib.util
import os
import shutil
import socket
import stat
import subprocess
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

import h2_raw
from hostile_util import (SIMPLE_BODY, binary_identity_request, closed_by_server, connect,
                          grpc_identity, http_head, peak_rss, read_until_closed, rss, serves,
                          wait_all_read)
from cluster_util import RouterProcess, WorkerProcess, leader_of
from nereid_util import (NEREID_BIN, ROOT, Server, assert_http_error, free_port, gen_models,
                         http_json, http_raw, loopback_listen_args, wait_until)
from test_cluster import start_control_plane, stop_all

_spec = importlib.util.spec_from_file_location("gen_python_models",
                                               ROOT / "scripts/gen_python_models.py")
gen_python_models = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen_python_models)

SHM_OFF = ("Client shared memory is disabled. Start the server with '--allow-client-shm=true' "
           "to enable.")
BUDGET_FLAG = "--max-buffered-request-bytes"
KEY, SECRET = "repo-key", "s3cret"
EXPLICIT = ["--model-control-mode", "explicit", "--load-model", "*"]
BUDGET, MAX_REQUEST = 3_000_000, 1_000_000
LIMITED = ["--preface-timeout-secs", "1", "--http-max-connections", "5",
           "--max-concurrent-streams", "7", "--listen-backlog", "77",
           BUDGET_FLAG, str(BUDGET), "--http-max-input-size", str(MAX_REQUEST),
           "--grpc-max-message-size", str(MAX_REQUEST)]
MB = 1 << 20
# "A few seconds": the 1 s preface timeout plus a loaded 2-core machine.
CUT_WITHIN_S = 8


# ---------------------------------------------------------------------------------------------
# Servers


@pytest.fixture(scope="module")
def onnx_repo(tmp_path_factory):
    return gen_models.write_repository(tmp_path_factory.mktemp("hostile_repo"), "example")


@pytest.fixture(scope="module")
def py_repo(tmp_path_factory):
    repo = gen_models.write_repository(tmp_path_factory.mktemp("hostile_py_repo"), "example")
    return gen_python_models.write_repository(repo, ["add_sub"])


def _started(repo, workdir, args, name, suite_defaults):
    server = Server(repo, workdir, args, name=name, suite_defaults=suite_defaults).start()
    try:
        wait_until(lambda: http_raw(server.http_url, "GET", "/v2/models/simple/ready",
                                    timeout=5)[0] == 200, 60, f"{name}: simple ready")
        yield server
    finally:
        rc = server.stop()
        assert rc == 0, f"{name} exited with {rc} after SIGTERM\n{server.log_tail()}"


@pytest.fixture(scope="module")
def plain(onnx_repo, tmp_path_factory):
    yield from _started(onnx_repo, tmp_path_factory.mktemp("logs"), EXPLICIT, "hostile_plain",
                        suite_defaults=False)


@pytest.fixture(scope="module")
def guarded(py_repo, tmp_path_factory):
    args = [*EXPLICIT, "--http-restricted-api", f"model-repository:{KEY}={SECRET}",
            "--grpc-restricted-protocol", f"model-repository:{KEY}={SECRET}"]
    # Suite defaults: --allow-client-shm=true.
    yield from _started(py_repo, tmp_path_factory.mktemp("logs"), args, "hostile_guarded",
                        suite_defaults=True)


@pytest.fixture(scope="module")
def limited(onnx_repo, tmp_path_factory):
    yield from _started(onnx_repo, tmp_path_factory.mktemp("logs"), LIMITED, "hostile_limited",
                        suite_defaults=True)


@pytest.fixture(scope="module")
def cluster(onnx_repo, tmp_path_factory):
    work = tmp_path_factory.mktemp("hostile_cluster")
    token, cps = start_control_plane(work, n=1)
    cp = cps[0]
    worker = WorkerProcess("hostile-w1", work, token, [cp.grpc_addr])
    worker.args += ["--preface-timeout-secs", "1"]
    router = RouterProcess(work, token, [cp.grpc_addr], extra=["--preface-timeout-secs", "1"])
    try:
        leader_of(cps)
        for p in (worker, router):
            p.spawn()
        for p in (worker, router):
            p.wait_live()
        out = subprocess.run(
            [NEREID_BIN, "ctl", "--control-plane", cp.grpc_addr, "--token-file", str(token),
             "models", "deploy", "simple", "--source", f"file://{onnx_repo / 'simple'}",
             "--replicas", "1", "--memory", "64Mi", "--wait", "--timeout", "60"],
            capture_output=True, text=True, timeout=90)
        assert out.returncode == 0, (out.stdout, out.stderr)
        wait_until(lambda: http_raw(router.http_url, "GET", "/v2/models/simple/ready",
                                    timeout=5)[0] == 200, 30, "the router sees simple ready")
        yield SimpleNamespace(cp=cp, worker=worker, router=router, token=token)
    finally:
        stop_all([router, worker, *cps])


# ---------------------------------------------------------------------------------------------
# Helpers


# ---------------------------------------------------------------------------------------------
# 1. Client shared memory is opt-in


def assert_client_shm_off(target):
    url = target.http_url
    handle = {"b64": base64.b64encode(bytes(64)).decode()}
    for path, body in [
        ("/v2/systemsharedmemory/region/r0/register",
         {"key": "/nereid_hostile_any", "offset": 0, "byte_size": 64}),
        ("/v2/systemsharedmemory/region/r0/unregister", b""),
        ("/v2/systemsharedmemory/unregister", b""),
        ("/v2/cudasharedmemory/region/r0/register",
         {"raw_handle": handle, "device_id": 0, "byte_size": 64}),
        ("/v2/cudasharedmemory/unregister", b""),
    ]:
        assert http_json(url, "POST", path, body) == (501, {"error": SHM_OFF}), path
    for path in ("/v2/systemsharedmemory/status", "/v2/cudasharedmemory/status"):
        assert http_json(url, "GET", path) == (200, []), path

    c = grpcclient.InferenceServerClient(target.grpc_url,
                                         channel_args=[("grpc.use_local_subchannel_pool", 1)])
    try:
        for call in (lambda: c.register_system_shared_memory("r0", "/nereid_hostile_any", 64),
                     lambda: c.unregister_system_shared_memory("r0"),
                     lambda: c.unregister_system_shared_memory(),
                     lambda: c.register_cuda_shared_memory("r0", bytes(64), 0, 64),
                     lambda: c.unregister_cuda_shared_memory()):
            with pytest.raises(InferenceServerException) as e:
                call()
            assert e.value.status() == "StatusCode.UNIMPLEMENTED", e.value
            assert e.value.message() == SHM_OFF
        assert not c.get_system_shared_memory_status(as_json=True).get("regions")
        assert not c.get_cuda_shared_memory_status(as_json=True).get("regions")
    finally:
        c.close()


def test_client_shm_is_off_by_default_on_serve(plain):
    """Register / unregister of system or CUDA shared memory on a server started without
    --allow-client-shm: HTTP 501 and gRPC UNIMPLEMENTED with Triton's message naming the flag;
    status answers an empty list."""
    assert_client_shm_off(plain)
    serves(plain)


def test_client_shm_is_off_by_default_on_a_worker(cluster):
    """The same probe on a cluster worker (same flag, same default): 501 / UNIMPLEMENTED."""
    assert_client_shm_off(cluster.worker)


def test_router_refuses_client_shm(cluster):
    """`router --allow-client-shm=true` exits at start naming the flag; the running router
    refuses CUDA shared memory registration too (system: test_router.py)."""
    ports = [free_port() for _ in range(3)]
    out = subprocess.run(
        [NEREID_BIN, "router", "--control-plane", cluster.cp.grpc_addr,
         "--auth-token-file", str(cluster.token), *loopback_listen_args(*ports),
         "--allow-client-shm=true"],
        capture_output=True, text=True, timeout=60)
    output = out.stdout + out.stderr
    assert out.returncode != 0, output[-2000:]
    assert "--allow-client-shm" in output, output[-2000:]
    assert "listening" not in output.lower(), output[-2000:]
    status, body = http_json(cluster.router.http_url, "POST",
                             "/v2/cudasharedmemory/region/r0/register",
                             {"raw_handle": {"b64": base64.b64encode(bytes(64)).decode()},
                              "device_id": 0, "byte_size": 64})
    assert status == 501 and "error" in body, (status, body)


# ---------------------------------------------------------------------------------------------
# 2. Shared-memory keys are one name under /dev/shm, never a link


def register_http(server, region, key, size=64):
    return http_json(server.http_url, "POST", f"/v2/systemsharedmemory/region/{region}/register",
                     {"key": key, "offset": 0, "byte_size": size})


def unable(key):
    return (400, {"error": f"Unable to open shared memory region: '{key}'"})


@pytest.fixture
def shm_names():
    """Paths under /dev/shm a test creates; removed whatever happens."""
    made = []

    def make(what):
        name = f"nereid_hostile_{what}_{uuid.uuid4().hex[:10]}"
        made.append(Path("/dev/shm") / name)
        return name, made[-1]

    yield make
    for path in made:
        with contextlib.suppress(FileNotFoundError):
            if path.is_dir() and not path.is_symlink():
                path.rmdir()
            else:
                path.unlink()


def test_a_shm_key_that_is_a_symlink_is_refused(guarded, tmp_path, shm_names):
    """/dev/shm/x -> a file with a secret: registering '/x' answers 400 'Unable to open shared
    memory region' over HTTP and gRPC, nothing is registered, and an inference naming the
    region finds none (the secret never comes back)."""
    secret = tmp_path / "secret"
    secret.write_bytes(b"TOP-SECRET-DATA!" * 4)
    name, link = shm_names("link")
    os.symlink(secret, link)
    key = "/" + name
    assert register_http(guarded, "leak", key) == unable(key)
    c = grpcclient.InferenceServerClient(guarded.grpc_url)
    try:
        with pytest.raises(InferenceServerException) as e:
            c.register_system_shared_memory("leak", key, 64)
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT", e.value
        assert e.value.message() == unable(key)[1]["error"]
    finally:
        c.close()
    assert http_json(guarded.http_url, "GET", "/v2/systemsharedmemory/status") == (200, [])
    infer = {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32",
                         "parameters": {"shared_memory_region": "leak",
                                        "shared_memory_byte_size": 64}}]}
    status, _, data = http_raw(guarded.http_url, "POST",
                               "/v2/models/identity_fp32_autocomplete/infer", infer)
    assert b"TOP-SECRET" not in data
    assert_http_error((status, data), 404, "Unable to find shared memory region: 'leak'")
    serves(guarded)


def test_shm_keys_that_are_not_regular_files_are_refused(guarded, shm_names):
    """A directory or a FIFO under /dev/shm: 400 at once (a FIFO must not block the server)."""
    name, path = shm_names("dir")
    path.mkdir()
    assert register_http(guarded, "d", "/" + name) == unable("/" + name)
    name, path = shm_names("fifo")
    os.mkfifo(path)
    start = time.monotonic()
    assert register_http(guarded, "f", "/" + name) == unable("/" + name)
    assert time.monotonic() - start < 5
    assert http_json(guarded.http_url, "GET", "/v2/systemsharedmemory/status") == (200, [])


@pytest.mark.parametrize("key", ["/a/b", "a/b", "//x", "/nereid_x/", "../etc/passwd",
                                 "/../etc/passwd", "..", "/..", ".", "/", "", "/dev/shm/x",
                                 "/etc/passwd", "/nereid_x\u0000y"])
def test_shm_keys_with_a_path_are_refused(guarded, key):
    """Keys that are not a single name (a slash inside, `..`, `.`, empty, NUL): 400."""
    assert register_http(guarded, "k", key) == unable(key)


# ---------------------------------------------------------------------------------------------
# 3. The Python backend's segments are out of clients' reach


def test_python_backend_segments_are_out_of_clients_reach(guarded):
    """After an inference on a Python model, the server's segments live in private 0700
    directories `/dev/shm/nereid-py-<pid>-...`, no segment file sits at the top of /dev/shm,
    and registering a directory's name, or a path into it, answers 400."""
    a = [1, 2, 3, 4]
    body = {"inputs": [{"name": n, "shape": [4], "datatype": "INT32", "data": a}
                       for n in ("INPUT0", "INPUT1")]}
    status, answer = http_json(guarded.http_url, "POST", "/v2/models/add_sub/infer", body)
    assert status == 200, answer
    outputs = {o["name"]: o["data"] for o in answer["outputs"]}
    assert outputs["OUTPUT0"] == [2, 4, 6, 8]

    shm = Path("/dev/shm")
    ours = sorted(e for e in os.listdir(shm) if e.startswith(f"nereid-py-{guarded.proc.pid}-"))
    assert ours, f"no segment directory of server {guarded.proc.pid}: {os.listdir(shm)}"
    for entry in os.listdir(shm):
        if not entry.startswith("nereid-py"):
            continue
        mode = os.lstat(shm / entry).st_mode
        if entry in ours:
            assert stat.S_ISDIR(mode), f"{entry} is not a directory ({oct(mode)})"
        if stat.S_ISDIR(mode):
            assert stat.S_IMODE(mode) == 0o700, f"{entry}: mode {oct(stat.S_IMODE(mode))}"
    segments = [f"{d}/{f}" for d in ours for f in os.listdir(shm / d)]
    assert segments, f"no segment in {ours}"
    for key in [*ours, *(f"/{d}" for d in ours), *segments, *(f"/{s}" for s in segments),
                "nereid-py-x/p0"]:
        assert register_http(guarded, "seg", key) == unable(key), key
    assert http_json(guarded.http_url, "GET", "/v2/systemsharedmemory/status") == (200, [])
    serves(guarded)


# ---------------------------------------------------------------------------------------------
# 4. gRPC does not reserve declared message sizes; SETTINGS_MAX_CONCURRENT_STREAMS


@pytest.fixture(params=["serve", "worker", "router"])
def kserve_target(request):
    """Each process that serves KServe v2 to clients."""
    if request.param == "serve":
        return request.getfixturevalue("plain")
    return getattr(request.getfixturevalue("cluster"), request.param)


def test_declared_grpc_message_sizes_are_not_reserved(kserve_target):
    """600 ModelInfer streams on one connection, each declaring a 256 MiB - 1 message and sending
    4 bytes of it: the server holds the bytes that came (RSS grows < 100 MB; it was +1.2 GB),
    answers none of them, and keeps serving, on that connection too. A declared 2^31 - 1 is
    refused at once with OUT_OF_RANGE."""
    target, port = kserve_target, kserve_target.grpc_port
    pid = target.proc.pid
    streams = range(1, 1201, 2)
    with h2_raw.H2Connection(port) as h2:
        assert h2.settings()[h2_raw.SETTINGS_MAX_CONCURRENT_STREAMS] == 1024
        before = rss(pid)
        h2.send(b"".join(h2_raw.grpc_headers(sid, port)
                         + h2_raw.data_frame(sid, h2_raw.grpc_prefix((256 << 20) - 1) + b"\0" * 4)
                         for sid in streams))
        live = streams[-1] + 2
        h2.send(h2_raw.grpc_headers(live, port, h2_raw.SERVER_LIVE)
                + h2_raw.data_frame(live, h2_raw.grpc_prefix(0), end_stream=True))
        h2.wait_for(lambda: h2.grpc_status(live) is not None, 30, "ServerLive's answer")
        assert h2.grpc_status(live)[0] == 0, h2.grpc_status(live)
        wait_all_read(port, target.name)
        grown = peak_rss(pid) - before
        answered = [s for s in streams if s in h2.ended or s in h2.resets or s in h2.headers]
        assert not answered, f"streams answered before their message: {answered[:10]}"
        assert grown < 100 * MB, f"{target.name}: RSS grew {grown / MB:.0f} MB"

    with h2_raw.H2Connection(port) as h2:
        h2.settings()
        h2.send(h2_raw.grpc_headers(1, port)
                + h2_raw.data_frame(1, h2_raw.grpc_prefix((1 << 31) - 1) + b"\0" * 4))
        h2.wait_for(lambda: h2.grpc_status(1) is not None, 10, "the refusal")
        code, message = h2.grpc_status(1)
        assert code == 11, (code, message)  # OUT_OF_RANGE
        assert "2147483647" in message, message
    serves(target)


def test_max_concurrent_streams_follows_the_flag(plain, limited):
    """The server's SETTINGS_MAX_CONCURRENT_STREAMS: 1024 by default on the HTTP and gRPC ports,
    7 with --max-concurrent-streams 7, where an 8th open stream is refused (REFUSED_STREAM)."""
    for server, expected in ((plain, 1024), (limited, 7)):
        for port in (server.http_port, server.grpc_port):
            with h2_raw.H2Connection(port) as h2:
                assert h2.settings()[h2_raw.SETTINGS_MAX_CONCURRENT_STREAMS] == expected, port
    port = limited.grpc_port
    with h2_raw.H2Connection(port) as h2:
        h2.settings()
        held = list(range(1, 17, 2))
        h2.send(b"".join(h2_raw.grpc_headers(sid, port)
                         + h2_raw.data_frame(sid, h2_raw.grpc_prefix(1000) + b"\0" * 4)
                         for sid in held))
        h2.ping()
        h2.wait_for(lambda: held[-1] in h2.resets, 10, "the 8th stream's reset")
        assert h2.resets[held[-1]] == 0x7, h2.resets  # REFUSED_STREAM
        assert not [s for s in held[:-1] if s in h2.resets], h2.resets
    serves(limited)


# ---------------------------------------------------------------------------------------------
# 5. The request budget


def test_budget_flag_must_cover_the_largest_request(onnx_repo):
    """--max-buffered-request-bytes below --http-max-input-size or --grpc-max-message-size:
    the server does not start, and says which two flags disagree."""
    for args, other in ([[BUDGET_FLAG, "1000"], "--http-max-input-size"],
                        [[BUDGET_FLAG, "100000000", "--http-max-input-size", "1000"],
                         "--grpc-max-message-size"]):
        out = subprocess.run([NEREID_BIN, "serve", "--model-repository", str(onnx_repo),
                              *loopback_listen_args(0, 0, 0), *args],
                             capture_output=True, text=True, timeout=60)
        output = out.stdout + out.stderr
        assert out.returncode != 0, output[-2000:]
        assert BUDGET_FLAG in output and other in output, output[-2000:]
        assert "listening" not in output.lower(), output[-2000:]


def http_probe(server, n=150_000):
    """A complete 600 KB HTTP inference; (status, body)."""
    body, headers = binary_identity_request(n)
    status, _, data = http_raw(server.http_url, "POST",
                               "/v2/models/identity_fp32_autocomplete/infer", body, headers)
    return status, data


def test_stalled_http_bodies_use_up_the_budget_then_free_it(limited):
    """Three connections declare 1 MB bodies, send 900 KB and stall (2.7 of the 3 MB budget): a
    further 600 KB request answers 503 naming --max-buffered-request-bytes over HTTP and
    RESOURCE_EXHAUSTED naming it over gRPC (one budget for the process). Once the stalled
    clients close, both succeed again."""
    stalled = []
    try:
        for _ in range(3):
            s = connect(limited.http_port)
            s.sendall(http_head("/v2/models/simple/infer", MAX_REQUEST) + b" " * 900_000)
            stalled.append(s)
        wait_all_read(limited.http_port, "stalled bodies")

        def http_refused():
            status, data = http_probe(limited)
            return (status, data) if status == 503 else None
        status, data = wait_until(http_refused, 30, "HTTP 503 over the budget")
        assert_http_error((status, data), 503, BUDGET_FLAG)

        def grpc_refused():
            e = grpc_identity(limited, 150_000)
            return e if e is not None and e.status() == "StatusCode.RESOURCE_EXHAUSTED" else None
        e = wait_until(grpc_refused, 30, "gRPC RESOURCE_EXHAUSTED over the budget")
        assert BUDGET_FLAG in e.message(), e.message()
        for s in stalled:
            s.settimeout(0.01)
            with pytest.raises(socket.timeout):
                s.recv(1)  # still waiting for their bodies, unanswered
    finally:
        for s in stalled:
            s.close()
    wait_until(lambda: http_probe(limited)[0] == 200, 30, "HTTP served once the budget is free")
    assert grpc_identity(limited, 150_000) is None
    serves(limited)


def test_partial_grpc_messages_use_up_the_budget_then_free_it(limited):
    """Three gRPC streams declare 999,000-byte messages and send 900 KB each, then stall: a
    further 600 KB message gets RESOURCE_EXHAUSTED naming --max-buffered-request-bytes, and an
    HTTP body 503. Once that connection closes, both succeed again."""
    port = limited.grpc_port
    streams = (1, 3, 5)
    with h2_raw.H2Connection(port) as h2:
        h2.settings()
        h2.wait_for(lambda: h2.send_window >= 3 * 900_005, 10, "a connection window of 3 MB")
        part = h2_raw.grpc_prefix(999_000) + bytes(900_000)
        h2.send(b"".join(h2_raw.grpc_headers(sid, port) + h2_raw.data_frames(sid, part)
                         for sid in streams))
        h2.ping()
        wait_all_read(port, "partial messages")

        def grpc_refused():
            e = grpc_identity(limited, 150_000)
            return e if e is not None and e.status() == "StatusCode.RESOURCE_EXHAUSTED" else None
        e = wait_until(grpc_refused, 30, "gRPC RESOURCE_EXHAUSTED over the budget")
        assert BUDGET_FLAG in e.message(), e.message()
        status, data = wait_until(lambda: (lambda r: r if r[0] == 503 else None)(
            http_probe(limited)), 30, "HTTP 503 over the budget")
        assert_http_error((status, data), 503, BUDGET_FLAG)
        h2.ping()
        assert not [s for s in streams if s in h2.resets or s in h2.ended], h2.resets
    wait_until(lambda: grpc_identity(limited, 150_000) is None, 30,
               "gRPC served once the budget is free")
    assert http_probe(limited)[0] == 200
    serves(limited)


# ---------------------------------------------------------------------------------------------
# 6. HTTP bodies are not reserved from Content-Length


def test_declared_http_content_length_is_not_reserved(kserve_target):
    """200 connections each declaring a 64 MiB body and sending 3 bytes: RSS grows < 60 MB (it
    was +440 MB); the server keeps serving."""
    target = kserve_target
    pid, port = target.proc.pid, target.http_port
    before = rss(pid)
    conns = []
    try:
        for _ in range(200):
            s = connect(port)
            s.sendall(http_head("/v2/models/simple/infer", 64 * MB) + b'{"i')
            conns.append(s)
        wait_all_read(port, target.name)
        serves(target)
        grown = peak_rss(pid) - before
        assert grown < 60 * MB, f"{target.name}: RSS grew {grown / MB:.0f} MB"
    finally:
        for s in conns:
            s.close()
    serves(target)


# ---------------------------------------------------------------------------------------------
# 7. Silent connections are closed; the metrics port has its own connection limit


def assert_silent_connections_cut(target):
    start = time.monotonic()
    socks = {name: connect(getattr(target, f"{name}_port"))
             for name in ("http", "grpc", "metrics")}
    try:
        for name, s in socks.items():
            left = CUT_WITHIN_S - (time.monotonic() - start)
            assert closed_by_server(s, left), f"{target.name}: silent {name} connection open"
    finally:
        for s in socks.values():
            s.close()


def test_silent_connections_are_closed(limited, cluster):
    """With --preface-timeout-secs 1, a connection that sends no byte is closed within a few
    seconds on the HTTP, gRPC and metrics ports of serve, a worker and the router."""
    for target in (limited, cluster.worker, cluster.router):
        assert_silent_connections_cut(target)
    serves(limited)
    serves(cluster.router)


def test_silent_connections_cannot_hold_every_slot(limited):
    """--http-max-connections 5 and 5 silent connections: a normal client waiting behind them is
    served once the silent ones are cut (1 s)."""
    silent = [connect(limited.http_port) for _ in range(5)]
    try:
        start = time.monotonic()
        status, body = http_json(limited.http_url, "POST", "/v2/models/simple/infer",
                                 SIMPLE_BODY)
        assert status == 200 and body["outputs"][0]["data"] == [2] * 16, (status, body)
        assert time.monotonic() - start < CUT_WITHIN_S
        for s in silent:
            assert closed_by_server(s, CUT_WITHIN_S)
    finally:
        for s in silent:
            s.close()


def metrics_answer(server, timeout):
    with connect(server.metrics_port, timeout=timeout) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        return s.recv(64)


def test_idle_metrics_connections_hold_only_the_metrics_port(plain):
    """70 idle connections to the metrics port (default --metrics-max-connections 64): /metrics
    waits, HTTP and gRPC inference do not; once they close, /metrics answers again."""
    idle = [connect(plain.metrics_port) for _ in range(70)]
    try:
        with pytest.raises(socket.timeout):
            metrics_answer(plain, timeout=1.0)
        serves(plain)
    finally:
        for s in idle:
            s.close()
    assert wait_until(lambda: metrics_answer(plain, timeout=5).startswith(b"HTTP/1.1 200"), 20,
                      "/metrics answering")


# ---------------------------------------------------------------------------------------------
# 8. Listen backlog


def listen_backlogs():
    """{port: Send-Q} of the listening TCP sockets on 127.0.0.1 (`ss -ltn`: for a listener,
    Send-Q is its backlog)."""
    out = subprocess.run(["ss", "-ltn"], capture_output=True, text=True, timeout=30).stdout
    backlogs = {}
    for line in out.splitlines():
        fields = line.split()  # State Recv-Q Send-Q Local Peer
        if len(fields) >= 4 and fields[0] == "LISTEN" and fields[3].startswith("127.0.0.1:"):
            backlogs[int(fields[3].rsplit(":", 1)[1])] = int(fields[2])
    return backlogs


def test_listen_backlog_follows_the_flag(plain, limited, cluster):
    """Each listening port's backlog is --listen-backlog (77 here), 1024 by default, capped by
    net.core.somaxconn; the same on a worker and the router."""
    if shutil.which("ss") is None:
        pytest.skip("ss (iproute2) missing")
    somaxconn = int(Path("/proc/sys/net/core/somaxconn").read_text())
    backlogs = listen_backlogs()
    for target, flag in ((plain, 1024), (limited, 77), (cluster.worker, 1024),
                         (cluster.router, 1024)):
        for port in (target.http_port, target.grpc_port, target.metrics_port):
            assert backlogs.get(port) == min(flag, somaxconn), (target.name, port, backlogs)


# ---------------------------------------------------------------------------------------------
# 9. Explicit mode warns when any client can load models


WARNING = "model-repository API unrestricted"


def test_explicit_mode_with_an_open_repository_api_warns(plain, guarded, cluster):
    """`serve --model-control-mode explicit` without a model-repository restriction logs a WARN
    naming the open API; restricted on HTTP and gRPC, and on a cluster worker, it does not."""
    wait_until(lambda: any("WARN" in line and WARNING in line
                           for line in plain.log_path.read_text().splitlines()), 20,
               "the warning in the plain server's log")
    for quiet in (guarded, cluster.worker):
        wait_until(lambda q=quiet: "server started" in q.log_path.read_text(), 20,
                   f"{quiet.name} started")
        assert WARNING not in quiet.log_path.read_text(), quiet.name


# ---------------------------------------------------------------------------------------------
# 10. Probes that were already refused, kept refused


def test_restricted_api_bypass_attempts_never_reach_the_handler(guarded):
    """model-repository restricted: spelling the unload path differently (case, `//`, `%2F`,
    `%72`, dot segments, a trailing slash) or using another method gets 403, 404 or 405, and
    `simple` stays loaded."""
    url = guarded.http_url
    paths = ["/v2/repository/models/simple/unload", "/v2/Repository/models/simple/unload",
             "/V2/repository/models/simple/unload", "/v2/REPOSITORY/index",
             "//v2/repository/models/simple/unload", "/v2//repository/models/simple/unload",
             "/v2/repository//models/simple/unload", "/v2/repository%2Fmodels%2Fsimple%2Funload",
             "/v2/repository/models/simple%2Funload", "/v2/%72epository/models/simple/unload",
             "/v2/./repository/models/simple/unload", "/v2/x/../repository/models/simple/unload",
             "/v2/repository/models/simple/unload/", "/v2/repository/models/simple/unload?a=1",
             "/v2/repository/models/./simple/unload"]
    for path in paths:
        status, _, data = http_raw(url, "POST", path, b"{}")
        assert status in (403, 404, 405), (path, status, data)
    for method in ("GET", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"):
        body = None if method in ("GET", "HEAD") else b"{}"
        status, _, data = http_raw(url, method, "/v2/repository/models/simple/unload", body)
        assert status in (403, 404, 405), (method, status, data)
    assert http_raw(url, "GET", "/v2/models/simple/ready")[0] == 200
    status, index = http_json(url, "POST", "/v2/repository/index", {}, {KEY: SECRET})
    assert status == 200 and {"name": "simple", "version": "1", "state": "READY"} in index


SMUGGLED = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"


@pytest.mark.parametrize("head", [
    b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
    b"Transfer-Encoding: chunked\r\nContent-Length: 40\r\n",
    b"Content-Length: 3\r\nContent-Length: 40\r\n",
    b"Content-Length: 3, 40\r\n",
    b"Transfer-Encoding : chunked\r\n",
    b"Transfer-Encoding: xchunked\r\n",
], ids=["cl-te", "te-cl", "two-cl", "cl-list", "te-space", "te-unknown"])
def test_request_smuggling_gets_one_400_and_a_close(plain, head):
    """Ambiguous framing with a second request behind it: one 400, then the server closes the
    connection; the smuggled request is never answered."""
    with connect(plain.http_port) as s:
        s.sendall(b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\n" + head
                  + b"\r\n0\r\n\r\n" + SMUGGLED)
        data = read_until_closed(s)
    assert data.startswith(b"HTTP/1.1 400 "), data[:300]
    assert data.count(b"HTTP/1.1 ") == 1, data
    serves(plain)


def test_bad_chunked_encoding_is_refused(plain):
    """A chunk size that is not hex: 400 and the connection closed."""
    with connect(plain.http_port) as s:
        s.sendall(b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n" + SMUGGLED)
        data = read_until_closed(s)
    assert data.startswith(b"HTTP/1.1 400 ") and data.count(b"HTTP/1.1 ") == 1, data[:300]
    serves(plain)


def test_gzip_bomb_is_refused(limited):
    """A 3 KB gzip body inflating to 3 MB past --http-max-input-size 1000000: 400 naming the
    flag."""
    bomb = gzip.compress(b" " * 3_000_000)
    assert len(bomb) < 10_000
    status, _, data = http_raw(limited.http_url, "POST", "/v2/models/simple/infer", bomb,
                               {"Content-Encoding": "gzip", "Content-Type": "application/json"})
    assert_http_error((status, data), 400, "--http-max-input-size")
    serves(limited)


@pytest.mark.parametrize("headers", [
    b"".join(b"X-Flood-%d: v\r\n" % i for i in range(5000)),
    b"X-Big: " + b"a" * MB + b"\r\n",
], ids=["5000-headers", "1MB-header"])
def test_header_flood_is_refused(plain, headers):
    """Thousands of headers or a 1 MB header: 431 (or the connection closed), never served."""
    with connect(plain.http_port) as s:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")
        data = read_until_closed(s)
    assert data == b"" or data.startswith(b"HTTP/1.1 431 "), data[:300]
    serves(plain)


def test_traversal_in_model_names_is_refused(plain, guarded, onnx_repo):
    """Model names with `..` or encoded slashes: 400/404 on the model routes; loading
    `../<model beside the repository>` (a real model planted there) over HTTP or gRPC loads
    nothing: the answer is the one for a model the repository does not have (500 / INTERNAL
    'failed to poll from model repository', as Triton)."""
    outside = f"hostile_outside_{uuid.uuid4().hex[:8]}"
    planted = onnx_repo.parent / outside
    shutil.copytree(onnx_repo / "simple", planted)
    config = planted / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "simple"', f'name: "{outside}"'))
    try:
        for path in ["/v2/models/../simple/ready", "/v2/models/..%2Fsimple/ready",
                     "/v2/models/..%2F..%2Fetc%2Fpasswd/config", "/v2/models/%2E%2E/config",
                     "/v2/models/simple%2F..%2Fmlp/ready", f"/v2/models/..%2F{outside}/ready"]:
            status, _, data = http_raw(plain.http_url, "GET", path)
            assert status in (400, 404), (path, status, data)
        unknown = (400, 404)
        for name in (f"../{outside}", f"..%2F{outside}", f"%2E%2E%2F{outside}", "..",
                     f"simple%2F..%2F..%2F{outside}"):
            for server, headers in ((plain, None), (guarded, {KEY: SECRET})):
                status, _, data = http_raw(server.http_url, "POST",
                                           f"/v2/repository/models/{name}/load", b"{}", headers)
                assert status in unknown or (status == 500 and b"failed to poll" in data), \
                    (server.name, name, status, data)
        c = grpcclient.InferenceServerClient(plain.grpc_url)
        try:
            for name in (f"../{outside}", f"simple/../../{outside}", f"./../{outside}",
                         str(planted), "../../etc"):
                with pytest.raises(InferenceServerException) as e:
                    c.load_model(name)
                assert e.value.status() in ("StatusCode.INVALID_ARGUMENT",
                                            "StatusCode.NOT_FOUND") or (
                    e.value.status() == "StatusCode.INTERNAL"
                    and "failed to poll" in e.value.message()), (name, e.value)
        finally:
            c.close()
    finally:
        shutil.rmtree(planted)
    names = [m["name"] for m in http_json(plain.http_url, "POST", "/v2/repository/index", {})[1]]
    assert sorted(names) == ["identity_fp32_autocomplete", "mlp", "simple"], names
    serves(plain)


@pytest.mark.parametrize("port_name", ["http", "grpc"])
def test_http2_rapid_reset_leaves_the_server_serving(plain, port_name):
    """3000 HEADERS + RST_STREAM pairs on one HTTP/2 connection: the server cuts that
    connection (GOAWAY) and keeps serving everyone else."""
    port = getattr(plain, f"{port_name}_port")
    if port_name == "http":
        opening = lambda sid: h2_raw.http_get_headers(sid, port, "/v2/health/live",  # noqa: E731
                                                      end_stream=False)
    else:
        opening = lambda sid: h2_raw.grpc_headers(sid, port)  # noqa: E731
    with h2_raw.H2Connection(port) as h2:
        h2.settings()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            h2.send(b"".join(opening(sid) + h2_raw.rst_stream(sid) for sid in range(1, 6001, 2)))
        assert h2.read_until_closed(10), "the connection stayed open"
    serves(plain)
