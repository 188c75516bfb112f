"""Mutual TLS inside a cluster (`--cluster-tls-cert/key/ca`): one control-plane node, one worker
and one router, each with its own certificate signed by a cluster CA made for this run.

`ctl` deploys a model over TLS, tritonclient infers through the router (whose public port stays
plaintext here), and the cluster's ports refuse what is not a cluster peer: a plaintext gRPC
client, a certificate from another CA, no certificate, and `ctl` without --tls-ca (told what
to pass). Every wait is bounded.
"""

import http.client
import json
import socket
import ssl
import subprocess

import numpy as np
import pytest
import tritonclient.http as httpclient

from cluster_util import ControlPlaneNode, RouterProcess, WorkerProcess, write_token
from nereid_util import NEREID_BIN, free_port, gen_models, wait_until
from test_tls import make_ca, make_leaf, simple_inputs

# The HTTP/2 client preface: a plaintext gRPC client's first bytes.
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("cluster_pki")
    ca = make_ca(d, "cluster_ca")
    other_ca = make_ca(d, "other_ca")
    certs = {role: make_leaf(d, role, ca) for role in ("cp", "worker", "router", "admin")}
    certs["stranger"] = make_leaf(d, "stranger", other_ca)
    return {"ca": ca[0], **certs}


def tls_flags(pki, role):
    pem, key = pki[role]
    return ["--cluster-tls-cert", str(pem), "--cluster-tls-key", str(key),
            "--cluster-tls-ca", str(pki["ca"])]


def rest(port, path, ca, client=None, timeout=5):
    """GET over HTTPS with an optional client certificate; returns (status, parsed JSON)."""
    ctx = ssl.create_default_context(cafile=str(ca))
    if client is not None:
        ctx.load_cert_chain(str(client[0]), str(client[1]))
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=timeout)
    try:
        conn.request("GET", path, headers={"authorization": "Bearer cluster-test-token"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"{}")
    finally:
        conn.close()


def refused(port, ca, client=None):
    """True when the TLS port will not serve this client (handshake or first read fails)."""
    try:
        rest(port, "/api/v1/cluster", ca, client)
    except (ssl.SSLError, ConnectionError, http.client.HTTPException, OSError):
        return True
    return False


def ctl(cp, *args, tls=None, timeout=90):
    tls_args = []
    if tls is not None:
        pem, key = tls["admin"]
        tls_args = ["--tls-ca", str(tls["ca"]), "--tls-cert", str(pem), "--tls-key", str(key)]
    return subprocess.run(
        [NEREID_BIN, "ctl", "--control-plane", cp.grpc_addr, "--token-file", str(cp.token_file),
         *tls_args, *args], capture_output=True, text=True, timeout=timeout)


def test_a_tls_cluster_serves_its_peers_and_refuses_everyone_else(tmp_path, pki):
    token = write_token(tmp_path)
    cp = ControlPlaneNode(1, tmp_path, token, extra=tls_flags(pki, "cp"))
    cp.token_file = token
    worker = WorkerProcess("w1", tmp_path, token, [cp.grpc_addr])
    worker.args += tls_flags(pki, "worker")
    router = RouterProcess(tmp_path, token, [cp.grpc_addr], extra=tls_flags(pki, "router"))
    repo = gen_models.write_repository(tmp_path / "repo", "example")
    try:
        cp.spawn()

        def leader_known():
            cp.check_alive()
            try:
                code, body = rest(cp.http_port, "/api/v1/cluster", pki["ca"], pki["admin"])
            except (ssl.SSLError, OSError):
                return None
            return code == 200 and body.get("leader_id")
        wait_until(leader_known, 20, "the TLS control plane elects itself")
        for p in (worker, router):
            p.spawn()
        for p in (worker, router):
            p.wait_live()

        # ctl over mutual TLS: the worker registered over TLS, so the deploy places a replica.
        out = ctl(cp, "models", "deploy", "simple", "--source", f"file://{repo / 'simple'}",
                  "--replicas", "1", "--memory", "64Mi", "--wait", "--timeout", "30", tls=pki)
        assert out.returncode == 0, (out.stdout, out.stderr, cp.log_tail(), worker.log_tail())

        # Inference through the router, which reaches the worker's gRPC port over mutual TLS.
        client = httpclient.InferenceServerClient(router.http_url)
        wait_until(lambda: client.is_model_ready("simple"), 20, "the router sees simple ready")
        inputs, total = simple_inputs(httpclient)  # a = arange(16), b = 3 everywhere
        result = client.infer("simple", inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), total)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), total - 6)  # a - b

        # A plaintext gRPC client gets no HTTP/2 from the control plane's gRPC port (a TLS
        # alert or a closed connection, never the server's SETTINGS frame).
        with socket.create_connection(("127.0.0.1", cp.grpc_port), timeout=5) as raw:
            raw.sendall(H2_PREFACE + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
            try:
                first = raw.recv(64)
            except ConnectionResetError:
                first = b""
        assert first == b"" or first[0] == 0x15, first

        # Certificates: another CA's is refused, as is none, on the REST and the worker's gRPC
        # port; the cluster's own passes.
        assert refused(cp.http_port, pki["ca"], pki["stranger"])
        assert refused(cp.http_port, pki["ca"])
        assert not refused(cp.http_port, pki["ca"], pki["admin"])
        with socket.create_connection(("127.0.0.1", worker.grpc_port), timeout=5) as raw:
            ctx = ssl.create_default_context(cafile=str(pki["ca"]))
            ctx.set_alpn_protocols(["h2"])
            ctx.load_cert_chain(str(pki["stranger"][0]), str(pki["stranger"][1]))
            with pytest.raises((ssl.SSLError, ConnectionError)):
                with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                    tls.sendall(H2_PREFACE)
                    assert tls.recv(64) == b""

        # ctl without --tls-ca: refused, and told which flags to pass.
        out = ctl(cp, "models", "list", timeout=30)
        assert out.returncode == 1, (out.stdout, out.stderr)
        assert "--tls-ca" in out.stderr, out.stderr
        out = ctl(cp, "models", "list", tls=pki, timeout=30)
        assert out.returncode == 0 and "simple" in out.stdout, (out.stdout, out.stderr)
        # A client certificate is refused when its key is missing: a usage error.
        out = subprocess.run([NEREID_BIN, "ctl", "--control-plane", cp.grpc_addr,
                              "--tls-ca", str(pki["ca"]), "--tls-cert", str(pki["admin"][0]),
                              "models", "list"], capture_output=True, text=True, timeout=30)
        assert out.returncode == 2 and "--tls-cert needs --tls-key" in out.stderr, out.stderr
    finally:
        for p in (router, worker, cp):
            p.kill()


def test_three_tls_control_plane_nodes_elect_replicate_and_forward(tmp_path, pki):
    """Raft between peers, and a write sent to a follower (forwarded to the leader), over TLS."""
    token = write_token(tmp_path)
    ports = {i: free_port() for i in (1, 2, 3)}
    nodes = [ControlPlaneNode(i, tmp_path, token, peers=ports,
                              extra=[*tls_flags(pki, "cp"), "--election-timeout-ms", "300",
                                     "--raft-heartbeat-ms", "50"])
             for i in (1, 2, 3)]
    repo = gen_models.write_repository(tmp_path / "repo", "example")
    try:
        for n in nodes:
            n.spawn()
            n.token_file = token

        def agreed_leader():
            ids = set()
            for n in nodes:
                n.check_alive()
                try:
                    code, body = rest(n.http_port, "/api/v1/cluster", pki["ca"], pki["admin"])
                except (ssl.SSLError, OSError):
                    return None
                if code != 200 or not body.get("leader_id"):
                    return None
                ids.add(body["leader_id"])
            return ids.pop() if len(ids) == 1 else None
        leader_id = wait_until(agreed_leader, 20, "three TLS nodes agree on a leader")
        follower = next(n for n in nodes if n.node_id != leader_id)
        out = ctl(follower, "models", "deploy", "simple", "--source",
                  f"file://{repo / 'simple'}", "--replicas", "1", "--memory", "64Mi", tls=pki,
                  timeout=30)
        assert out.returncode == 0, (out.stdout, out.stderr, follower.log_tail())

        def everywhere():
            for n in nodes:
                code, body = rest(n.http_port, "/api/v1/models/simple", pki["ca"], pki["admin"])
                if code != 200:
                    return False
            return True
        wait_until(everywhere, 10, "the write replicated to every node")
    finally:
        for n in nodes:
            n.kill()


def test_a_partial_cluster_tls_set_is_refused_naming_the_missing_flag(tmp_path, pki):
    pem, key = pki["cp"]
    out = subprocess.run(
        [NEREID_BIN, "control-plane", "--data-dir", str(tmp_path / "d"), "--insecure-no-auth",
         "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0",
         "--cluster-tls-cert", str(pem), "--cluster-tls-key", str(key)],
        capture_output=True, text=True, timeout=30)
    assert out.returncode != 0
    assert "--cluster-tls-ca missing" in out.stderr, out.stderr
