"""Triton's own perf_analyzer (from the tritonclient wheel) drives the server over HTTP and gRPC."""

import os
import re
import subprocess

import pytest

from nereid_util import ROOT, http_json

PERF_ANALYZER = os.environ.get("PERF_ANALYZER", str(ROOT / ".venv/perf_analyzer"))


def run_perf(args):
    if not os.access(PERF_ANALYZER, os.X_OK):
        pytest.skip(f"{PERF_ANALYZER} missing (run scripts/setup.sh)")
    # A loose stability criterion: this checks protocol compatibility, not timing, and shared
    # CI machines are too noisy for perf_analyzer's default 10%.
    cmd = [PERF_ANALYZER, "-m", "simple", "--measurement-interval", "1000",
           "--concurrency-range", "1:2", "--stability-percentage", "500", *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    out = p.stdout + p.stderr
    assert p.returncode == 0, f"{' '.join(cmd)} exited {p.returncode}\n{out}"
    assert re.search(r"Throughput: [0-9.]+ infer/sec", out), out
    assert "Concurrency: 1," in out and "Concurrency: 2," in out, out
    # perf_analyzer read the server-side statistics endpoint too.
    assert re.search(r"Successful request count: [1-9]", out), out
    errors = [l for l in out.splitlines() if re.search(r"\berror\b|failed", l, re.I)]
    assert not errors, "\n".join(errors)
    return out


@pytest.mark.timeout(150)
def test_perf_analyzer_http(server):
    run_perf(["-u", server.http_url])


@pytest.mark.timeout(150)
def test_perf_analyzer_grpc(server):
    run_perf(["-i", "grpc", "-u", server.grpc_url])


@pytest.mark.timeout(150)
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perf_analyzer_system_shared_memory(server, protocol):
    """perf_analyzer registers its own regions, sends every tensor through them and unregisters
    them at the end."""
    url = server.http_url if protocol == "http" else server.grpc_url
    run_perf(["-i", protocol, "-u", url, "--shared-memory", "system",
              "--output-shared-memory-size", "1024"])
    # It cleaned up after itself through the unregister endpoint.
    assert http_json(server.http_url, "GET", "/v2/systemsharedmemory/status") == (200, [])
