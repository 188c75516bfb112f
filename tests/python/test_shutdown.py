"""Graceful shutdown: SIGTERM with idle clients connected ends the process with code 0."""

import http.client
import time

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from nereid_util import Server, gen_models, http_raw


def test_sigterm_with_idle_clients(tmp_path):
    repo = tmp_path / "repo"
    gen_models.write_repository(repo, "example")
    server = Server(repo, tmp_path, ["--exit-timeout-secs", "10"], name="server_shutdown").start()
    try:
        # An idle keep-alive HTTP connection and an idle gRPC channel, each used once.
        conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
        conn.request("GET", "/v2/health/ready")
        assert conn.getresponse().read() == b""
        g = grpcclient.InferenceServerClient(server.grpc_url)
        assert g.is_server_live()

        start = time.monotonic()
        rc = server.stop(deadline_s=30)
        elapsed = time.monotonic() - start
        assert rc == 0, f"exit code {rc}\n{server.log_tail()}"
        assert elapsed < 30
        # The server is gone: new connections are refused.
        try:
            status = http_raw(server.http_url, "GET", "/v2/health/live", timeout=2)[0]
            raise AssertionError(f"server still answering ({status}) after exit")
        except OSError:
            pass
        with pytest.raises(InferenceServerException):
            g.is_server_live()
        g.close()
        conn.close()
    finally:
        server.kill()


def test_exit_on_error_stops_startup_when_a_model_fails(test_repo, tmp_path):
    """With --exit-on-error (Triton's default), a model that fails to load fails startup."""
    from nereid_util import NEREID_BIN, free_port
    import subprocess
    args = [NEREID_BIN, "serve", "--model-repository", str(test_repo), "--exit-on-error",
            "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1",
            "--metrics-address", "127.0.0.1", "--http-port", str(free_port()),
            "--grpc-port", str(free_port()), "--metrics-port", str(free_port())]
    p = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    assert "--exit-on-error" in p.stderr, p.stderr[-2000:]
