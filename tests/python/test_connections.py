"""Connection limits and slow clients on `nereid serve`'s ports: thousands of idle connections
and a client trickling its body do not keep a normal request waiting; a stalled request head
or body is cut off after its read timeout; past `--http-max-connections` a new connection
waits until one closes.

Every socket is closed by the test; every wait is bounded.
"""

import contextlib
import os
import resource
import socket
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from nereid_util import gen_models, managed_server, wait_until

IDLE_CONNECTIONS = 2000
HEADER_TIMEOUT_S = 3
BODY_TIMEOUT_S = 4
# "Promptly": a request on a loaded 2-core machine, far below the read timeouts.
PROMPT_S = 3.0


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return gen_models.write_repository(tmp_path_factory.mktemp("repo_conns"), "example")


@pytest.fixture(scope="module")
def server(repo, tmp_path_factory):
    args = ["--http-header-read-timeout-secs", str(HEADER_TIMEOUT_S),
            "--http-body-read-timeout-secs", str(BODY_TIMEOUT_S)]
    yield from managed_server(repo, tmp_path_factory.mktemp("logs"), args, "conns")


@pytest.fixture
def fd_room():
    """Room for the idle connections in this process's open-file limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = IDLE_CONNECTIONS + 512
    if soft < want:
        if hard != resource.RLIM_INFINITY and hard < want:
            pytest.skip(f"open-file hard limit {hard} < {want}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def connect(port, timeout=10):
    return socket.create_connection(("127.0.0.1", port), timeout=timeout)


def simple_infer_http(server):
    c = httpclient.InferenceServerClient(server.http_url, network_timeout=30,
                                         connection_timeout=10)
    try:
        inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"),
                  httpclient.InferInput("INPUT1", [1, 16], "INT32")]
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(a)
        np.testing.assert_array_equal(c.infer("simple", inputs).as_numpy("OUTPUT0"), a + a)
    finally:
        c.close()


def simple_infer_grpc(server):
    c = grpcclient.InferenceServerClient(server.grpc_url,
                                         channel_args=[("grpc.use_local_subchannel_pool", 1)])
    try:
        inputs = [grpcclient.InferInput("INPUT0", [1, 16], "INT32"),
                  grpcclient.InferInput("INPUT1", [1, 16], "INT32")]
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(a)
        result = c.infer("simple", inputs, client_timeout=30)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)
    finally:
        c.close()


def timed(fn, *args):
    start = time.monotonic()
    fn(*args)
    return time.monotonic() - start


def slow_body_head(port, length):
    s = connect(port, timeout=BODY_TIMEOUT_S + 10)
    s.sendall((f"POST /v2/models/simple/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
               f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n").encode())
    return s


def read_response(s):
    """Everything the server sends until it closes (or the socket's timeout)."""
    data = b""
    with contextlib.suppress(socket.timeout, ConnectionResetError):
        while chunk := s.recv(65536):
            data += chunk
    return data


def test_idle_connections_and_a_slow_body_do_not_delay_requests(server, fd_room):
    stop = threading.Event()

    def trickle():
        with slow_body_head(server.http_port, 1000) as s:
            while not stop.wait(1.0):
                with contextlib.suppress(OSError):
                    s.sendall(b" ")

    trickler = threading.Thread(target=trickle, daemon=True)
    idle = []
    try:
        trickler.start()
        for i in range(IDLE_CONNECTIONS):
            idle.append(connect(server.http_port if i % 2 == 0 else server.grpc_port))
        # The server accepted them all and holds them open (one file descriptor each).
        fds = f"/proc/{server.proc.pid}/fd"
        wait_until(lambda: len(os.listdir(fds)) >= IDLE_CONNECTIONS, 30,
                   f"{IDLE_CONNECTIONS} connections accepted")
        for infer in (simple_infer_http, simple_infer_grpc):
            took = timed(infer, server)
            assert took < PROMPT_S, f"{infer.__name__} took {took:.1f}s beside idle clients"
    finally:
        stop.set()
        for s in idle:
            s.close()
        trickler.join(timeout=10)


def test_a_trickled_body_is_cut_off_after_the_body_timeout(server):
    start = time.monotonic()
    with slow_body_head(server.http_port, 1000) as s:
        response = b""
        # One byte a second, as long as the server reads; a response or a close ends it.
        s.settimeout(1.0)
        while time.monotonic() - start < BODY_TIMEOUT_S + 10:
            try:
                s.sendall(b" ")
                chunk = s.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                break
            response += chunk
            if not chunk or b"\r\n\r\n" in response:
                break
    took = time.monotonic() - start
    assert BODY_TIMEOUT_S - 1 <= took < BODY_TIMEOUT_S + 8, took
    assert response.startswith(b"HTTP/1.1 4"), response[:200]
    simple_infer_http(server)


def test_a_stalled_request_head_is_closed_after_the_header_timeout(server):
    start = time.monotonic()
    with connect(server.http_port, timeout=HEADER_TIMEOUT_S + 10) as s:
        s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        read_response(s)
    took = time.monotonic() - start
    assert HEADER_TIMEOUT_S - 1 <= took < HEADER_TIMEOUT_S + 8, took


def test_connections_past_the_limit_wait_for_a_free_slot(repo, tmp_path):
    limit = 3
    args = ["--http-max-connections", str(limit)]
    for srv in managed_server(repo, tmp_path, args, "limited"):
        held = [connect(srv.http_port) for _ in range(limit)]
        try:
            # Connected (the kernel's backlog) but not accepted: no answer while all slots are held.
            with connect(srv.http_port, timeout=1.5) as waiting:
                waiting.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
                with pytest.raises(socket.timeout):
                    waiting.recv(1024)
                held.pop().close()
                waiting.settimeout(10)
                assert waiting.recv(1024).startswith(b"HTTP/1.1 200")
        finally:
            for s in held:
                s.close()
