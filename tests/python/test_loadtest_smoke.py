"""A short smoke run of `nereid-loadtest` against the server, over HTTP and gRPC, closed and
open loop: it must finish, report throughput and count no errors."""

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LOADTEST = os.environ.get("NEREID_LOADTEST_BIN", str(ROOT / "target/release/nereid-loadtest"))


def run(args, tmp_path):
    out = tmp_path / "result.json"
    p = subprocess.run([LOADTEST, *args, "--json", str(out), "-q", "--fail-on-errors"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(out.read_text())


def rows(result):
    return result if isinstance(result, list) else result.get("rows", result.get("results", [result]))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_closed_loop(server, protocol, tmp_path):
    url = server.http_url if protocol == "http" else server.grpc_url
    result = run(["-m", "simple", "-i", protocol, "-u", url, "--concurrency-range", "1:2:1",
                  "-p", "500", "-r", "3", "--warmup-secs", "0"], tmp_path)
    levels = rows(result)
    assert [level["level"]["concurrency"] for level in levels] == [1, 2], result
    for level in levels:
        assert level["errors"] == 0 and level["requests"] > 0, level
        assert level["throughput"] > 0, level


def test_open_loop_poisson(server, tmp_path):
    result = run(["-m", "mlp", "-i", "grpc", "-u", server.grpc_url, "--request-rate-range", "200:200:1",
                  "--request-distribution", "poisson", "-p", "500", "-r", "3", "--warmup-secs", "0"],
                 tmp_path)
    levels = rows(result)
    assert len(levels) == 1 and levels[0]["errors"] == 0 and levels[0]["requests"] > 0, result
