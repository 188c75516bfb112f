"""TLS on the KServe v2 ports: Triton's `--grpc-use-ssl*` flags and Nereid's `--http-use-ssl*`.

Certificates are made per test run with the `openssl` command: a CA, a server certificate for
127.0.0.1/localhost signed by it, a client certificate, and a second, unrelated CA. Clients are
tritonclient's gRPC and HTTP clients and Python's `ssl` module; each check opens new
connections, bounded by timeouts.
"""

import http.client
import os
import socket
import ssl
import subprocess

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from nereid_util import Server, gen_models, http_raw, wait_until

OPENSSL = "/usr/bin/openssl"


def _openssl(*args):
    subprocess.run([OPENSSL, *map(str, args)], check=True, capture_output=True, timeout=60)


def make_ca(d, name):
    key, pem = d / f"{name}.key", d / f"{name}.pem"
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", key)
    _openssl("req", "-x509", "-key", key, "-out", pem, "-days", "2", "-subj", f"/CN={name}")
    return pem, key


def make_leaf(d, name, ca):
    """A certificate for 127.0.0.1 and localhost signed by `ca` (pem, key); returns (pem, key)."""
    key, csr, pem, ext = (d / f"{name}.key", d / f"{name}.csr", d / f"{name}.pem",
                          d / f"{name}.ext")
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", key)
    _openssl("req", "-new", "-key", key, "-out", csr, "-subj", f"/CN={name}")
    ext.write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    _openssl("x509", "-req", "-in", csr, "-CA", ca[0], "-CAkey", ca[1], "-CAcreateserial",
             "-out", pem, "-days", "2", "-extfile", ext)
    return pem, key


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    ca = make_ca(d, "ca")
    other_ca = make_ca(d, "other_ca")
    return {
        "dir": d,
        "ca": ca,
        "other_ca": other_ca,
        "server": make_leaf(d, "server", ca),
        "client": make_leaf(d, "client", ca),
        "stranger": make_leaf(d, "stranger", other_ca),
    }


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return gen_models.write_repository(tmp_path_factory.mktemp("repo_tls"), "example")


def ssl_context(ca_pem, client=None):
    ctx = ssl.create_default_context(cafile=str(ca_pem))
    if client is not None:
        ctx.load_cert_chain(str(client[0]), str(client[1]))
    return ctx


def peer_certificate(port, ca_pem, client=None, timeout=10):
    """DER of the certificate a new TLS connection to `port` is shown (raises if refused)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as raw:
        with ssl_context(ca_pem, client).wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            return tls.getpeercert(binary_form=True)


def https_live(port, ca_pem, client=None, timeout=10):
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=timeout,
                                       context=ssl_context(ca_pem, client))
    try:
        conn.request("GET", "/v2/health/live")
        return conn.getresponse().status
    finally:
        conn.close()


class TlsServer(Server):
    """`nereid serve` whose HTTP port speaks TLS: readiness is probed over HTTPS."""

    def __init__(self, repo, workdir, extra_args, ca_pem, client=None, name="tls"):
        super().__init__(repo, workdir, extra_args, name=name)
        self.ca_pem, self.client = ca_pem, client

    def start(self):
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.args, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=self.environment())

        def live():
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited with {self.proc.returncode}\n"
                                     f"{self.log_tail()}")
            return https_live(self.http_port, self.ca_pem, self.client, timeout=2) == 200

        try:
            wait_until(live, 60, f"{self.name} live over HTTPS")
        except BaseException:
            self.kill()
            raise
        return self


def tls_flags(pki, mutual=False, cert=None):
    cert = cert or pki["server"]
    flags = []
    for port in ("grpc", "http"):
        flags += [f"--{port}-use-ssl-mutual" if mutual else f"--{port}-use-ssl",
                  f"--{port}-server-cert", str(cert[0]), f"--{port}-server-key", str(cert[1])]
        if mutual:
            flags += [f"--{port}-root-cert", str(pki["ca"][0])]
    return flags


def started(repo, tmp_path, pki, flags, client=None, name="tls"):
    return TlsServer(repo, tmp_path, flags, pki["ca"][0], client=client, name=name).start()


def stop(server):
    rc = server.stop()
    assert rc == 0, f"exit {rc}\n{server.log_tail()}"


def simple_inputs(module):
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    inputs = [module.InferInput("INPUT0", [1, 16], "INT32"),
              module.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs, a + b


def grpc_client(server, ca_pem, client=None):
    return grpcclient.InferenceServerClient(
        server.grpc_url, ssl=True, root_certificates=str(ca_pem),
        private_key=None if client is None else str(client[1]),
        certificate_chain=None if client is None else str(client[0]),
        # A channel of its own: no connection shared with another test's client.
        channel_args=[("grpc.use_local_subchannel_pool", 1)])


def grpc_infer(server, ca_pem, client=None):
    c = grpc_client(server, ca_pem, client)
    try:
        inputs, expected = simple_inputs(grpcclient)
        result = c.infer("simple", inputs, client_timeout=20)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), expected)
    finally:
        c.close()


def http_infer(server, ca_pem, client=None):
    c = httpclient.InferenceServerClient(
        server.http_url, ssl=True, network_timeout=20, connection_timeout=10,
        ssl_context_factory=lambda: ssl_context(ca_pem, client))
    try:
        inputs, expected = simple_inputs(httpclient)
        result = c.infer("simple", inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), expected)
    finally:
        c.close()


def test_grpc_and_https_serve_tritonclient(repo, tmp_path, pki):
    server = started(repo, tmp_path, pki, tls_flags(pki))
    try:
        grpc_infer(server, pki["ca"][0])
        http_infer(server, pki["ca"][0])
    finally:
        stop(server)


def test_a_client_trusting_another_ca_is_refused(repo, tmp_path, pki):
    server = started(repo, tmp_path, pki, tls_flags(pki))
    try:
        with pytest.raises(InferenceServerException):
            grpc_infer(server, pki["other_ca"][0])
        with pytest.raises(ssl.SSLCertVerificationError):
            peer_certificate(server.http_port, pki["other_ca"][0])
        with pytest.raises(ssl.SSLCertVerificationError):
            peer_certificate(server.grpc_port, pki["other_ca"][0])
    finally:
        stop(server)


def test_plaintext_clients_are_refused_and_the_server_keeps_serving(repo, tmp_path, pki):
    server = started(repo, tmp_path, pki, tls_flags(pki))
    try:
        with pytest.raises((OSError, http.client.HTTPException)):
            http_raw(server.http_url, "GET", "/v2/health/live", timeout=10)
        plain = grpcclient.InferenceServerClient(
            server.grpc_url, channel_args=[("grpc.use_local_subchannel_pool", 1)])
        try:
            with pytest.raises(InferenceServerException):
                plain.is_server_live(client_timeout=10)
        finally:
            plain.close()
        grpc_infer(server, pki["ca"][0])
        http_infer(server, pki["ca"][0])
    finally:
        stop(server)


def test_mutual_tls_requires_a_client_certificate_signed_by_the_root(repo, tmp_path, pki):
    server = started(repo, tmp_path, pki, tls_flags(pki, mutual=True), client=pki["client"])
    try:
        grpc_infer(server, pki["ca"][0], pki["client"])
        http_infer(server, pki["ca"][0], pki["client"])
        for who in (None, pki["stranger"]):
            with pytest.raises(InferenceServerException):
                grpc_infer(server, pki["ca"][0], who)
            # TLS 1.3: the server's refusal of the client certificate arrives after the
            # client's handshake ends, so it shows on the first read.
            with pytest.raises((ssl.SSLError, OSError, http.client.HTTPException)):
                https_live(server.http_port, pki["ca"][0], who)
        http_infer(server, pki["ca"][0], pki["client"])
    finally:
        stop(server)


def test_a_replaced_certificate_is_served_without_restart(repo, tmp_path, pki):
    live = tmp_path / "live"
    live.mkdir()
    cert, key = live / "server.pem", live / "server.key"
    cert.write_bytes(pki["server"][0].read_bytes())
    key.write_bytes(pki["server"][1].read_bytes())
    server = started(repo, tmp_path, pki, tls_flags(pki, cert=(cert, key)))
    try:
        first = peer_certificate(server.grpc_port, pki["ca"][0])
        # A new certificate from another CA, swapped in the way a secret mount does: new
        # files renamed over the old ones.
        new_ca = make_ca(tmp_path, "rotated_ca")
        new = make_leaf(tmp_path, "rotated", new_ca)
        for src, dst in ((new[0], cert), (new[1], key)):
            tmp = dst.with_suffix(".tmp")
            tmp.write_bytes(src.read_bytes())
            os.replace(tmp, dst)
        for port in (server.grpc_port, server.http_port):
            seen = wait_until(lambda p=port: peer_certificate(p, new_ca[0]), 15,
                              f"port {port} showing the new certificate")
            assert seen != first
            with pytest.raises(ssl.SSLCertVerificationError):
                peer_certificate(port, pki["ca"][0])
        grpc_infer(server, new_ca[0])
    finally:
        stop(server)


@pytest.mark.parametrize("flags, expected", [
    (["--grpc-use-ssl", "--grpc-server-cert", "{missing}", "--grpc-server-key", "{key}"],
     "--grpc-server-cert '{missing}': cannot read the file"),
    (["--http-use-ssl", "--http-server-cert", "{cert}", "--http-server-key", "{cert}"],
     "--http-server-key '{cert}': holds no usable PEM private key"),
    (["--grpc-use-ssl-mutual", "--grpc-server-cert", "{cert}", "--grpc-server-key", "{key}"],
     "--grpc-use-ssl-mutual needs --grpc-root-cert"),
])
def test_bad_tls_files_stop_startup_naming_the_flag(repo, tmp_path, pki, flags, expected):
    values = {"missing": tmp_path / "nope.pem", "cert": pki["server"][0], "key": pki["server"][1]}
    flags = [f.format(**values) for f in flags]
    server = Server(repo, tmp_path, flags, name="bad_tls")
    proc = subprocess.run(server.args, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert expected.format(**values) in proc.stderr, proc.stderr
    # Nothing was bound: the HTTP port is still free.
    with socket.socket() as s:
        s.bind(("127.0.0.1", server.http_port))
