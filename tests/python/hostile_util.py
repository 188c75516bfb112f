"""Socket, /proc and request helpers of the hostile-client suite (test_hostile_clients.py)."""

import json
import socket
import time

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from nereid_util import http_json, wait_until

SIMPLE_BODY = {"inputs": [
    {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16},
    {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16},
]}


def serves(target):
    """The target is alive and answers `simple` over HTTP and gRPC."""
    proc = target.proc
    assert proc.poll() is None, f"{target.name} exited with {proc.returncode}"
    status, body = http_json(target.http_url, "POST", "/v2/models/simple/infer", SIMPLE_BODY)
    assert status == 200 and body["outputs"][0]["data"] == [2] * 16, (status, body)
    c = grpcclient.InferenceServerClient(target.grpc_url,
                                         channel_args=[("grpc.use_local_subchannel_pool", 1)])
    try:
        inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        for i in inputs:
            i.set_data_from_numpy(np.ones((1, 16), np.int32))
        result = c.infer("simple", inputs, client_timeout=30)
        assert (result.as_numpy("OUTPUT0") == 2).all()
    finally:
        c.close()


def connect(port, timeout=10):
    return socket.create_connection(("127.0.0.1", port), timeout=timeout)


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def peak_rss(pid, window_s=1.0):
    """The largest RSS seen over a short window (memory a flood makes the server take shows up
    as its handlers run)."""
    peak, end = rss(pid), time.monotonic() + window_s
    while time.monotonic() < end:
        peak = max(peak, rss(pid))
        time.sleep(0.05)
    return peak


def in_flight(server_port):
    """Bytes sent to `server_port` that its process has not read yet: the receive queues of its
    sockets and the send queues of their clients (/proc/net/tcp, 127.0.0.1 only)."""
    total = 0
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            fields = line.split()
            local, remote, state, queues = fields[1], fields[2], fields[3], fields[4]
            if state != "01":  # ESTABLISHED
                continue
            tx, rx = (int(q, 16) for q in queues.split(":"))
            if int(local.rsplit(":", 1)[1], 16) == server_port:
                total += rx
            elif int(remote.rsplit(":", 1)[1], 16) == server_port:
                total += tx
    return total


def wait_all_read(server_port, what):
    wait_until(lambda: in_flight(server_port) == 0, 30, f"{what}: every byte read", 0.05)


def read_until_closed(sock, deadline_s=10):
    """What the server sends until it closes (EOF or reset); raises if it keeps the connection
    open past the deadline."""
    data, end = b"", time.monotonic() + deadline_s
    while time.monotonic() < end:
        sock.settimeout(max(0.05, end - time.monotonic()))
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            continue
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk
    raise AssertionError(f"connection still open after {deadline_s}s; got {data[:300]!r}")


def closed_by_server(sock, deadline_s):
    """True once the server closes a connection we keep silent, within the deadline."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        sock.settimeout(max(0.05, end - time.monotonic()))
        try:
            if sock.recv(1024) == b"":
                return True
        except socket.timeout:
            continue
        except ConnectionResetError:
            return True
    return False


def http_head(path, length):
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n\r\n").encode()


def binary_identity_request(n):
    """An identity_fp32_autocomplete request of `n` FP32 values as a binary tensor."""
    header = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, n], "datatype": "FP32",
                                     "parameters": {"binary_data_size": 4 * n}}]}).encode()
    return header + bytes(4 * n), {"Inference-Header-Content-Length": str(len(header))}


def grpc_identity(target, n):
    """identity_fp32_autocomplete over gRPC with an `n`-value tensor; None or the error."""
    c = grpcclient.InferenceServerClient(target.grpc_url,
                                         channel_args=[("grpc.use_local_subchannel_pool", 1)])
    try:
        x = grpcclient.InferInput("INPUT0", [1, n], "FP32")
        x.set_data_from_numpy(np.zeros((1, n), np.float32))
        c.infer("identity_fp32_autocomplete", [x], client_timeout=30)
        return None
    except InferenceServerException as e:
        return e
    finally:
        c.close()
