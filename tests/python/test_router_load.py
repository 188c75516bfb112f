"""The router balances long streams on what workers report, not only on its own counts.

Two workers serve `tiny_llm` (tests/python/test_openai.py's generator: one instance, so a
worker runs one generation at a time and queues the rest). Long `/v1/completions` streams sent
straight to worker w1, past the router, queue work there that the router never counted. New
streams through the router then go to w2: every stream the router opens asks its worker for the
ORCA load report, and choice weighs the work a worker reports from elsewhere. At most one
stream may go to w1 first (the router has no report from a worker before it opens a stream
there); with the router's own counts alone half of them would. The router's answers carry the
`endpoint-load-metrics` header with the chosen worker's figures.
"""

import http.client
import json
import re
import subprocess
import urllib.request

import pytest

from cluster_util import RouterProcess, WorkerProcess, leader_of
from nereid_util import NEREID_BIN, wait_until
from test_cluster import start_control_plane, stop_all
from test_openai import write_repo

HELD = 3  # streams held on w1 past the router
ROUTED = 4  # new streams through the router


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("router_load")
    repo = write_repo(tmp / "repo")
    token, cps = start_control_plane(tmp, n=1)
    workers = [WorkerProcess(f"w{i}", tmp, token, [cps[0].grpc_addr]) for i in (1, 2)]
    router = RouterProcess(tmp, token, [cps[0].grpc_addr])
    try:
        leader_of(cps)
        for p in (*workers, router):
            p.spawn()
        for p in (*workers, router):
            p.wait_live()
        out = subprocess.run(
            [NEREID_BIN, "ctl", "--control-plane", cps[0].grpc_addr, "--token-file", str(token),
             "models", "deploy", "tiny_llm", "--source", f"file://{repo / 'tiny_llm'}",
             "--replicas", "2", "--memory", "64Mi", "--wait", "--timeout", "90"],
            capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, (out.stdout, out.stderr)

        def both_ready():
            return all(
                http_status(w, "GET", "/v2/models/tiny_llm/ready") == 200 for w in workers)

        wait_until(both_ready, 60, "tiny_llm ready on both workers")
        wait_until(lambda: http_status(router, "GET", "/v2/models/tiny_llm/ready") == 200, 30,
                   "the router sees tiny_llm ready")
        yield workers, router
    finally:
        stop_all([router, *workers, *cps])


def http_status(server, method, path):
    host, port = server.http_url.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    try:
        conn.request(method, path)
        return conn.getresponse().status
    except OSError:
        return None
    finally:
        conn.close()


def send_stream(server, prompt, headers=None):
    """Sends a streamed completion to `server` and returns its connection without waiting for
    an answer (a queued generation sends its headers with its first token); the generation
    goes on until the connection is closed."""
    host, port = server.http_url.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("POST", "/v1/completions",
                 json.dumps({"model": "tiny_llm", "prompt": prompt, "stream": True,
                             "max_tokens": 2000}),
                 {"Content-Type": "application/json", **(headers or {})})
    return conn


def scrape(port, metric):
    """`metric`'s tiny_llm series on the /metrics at `port`, by their `node` label ("" when
    none), summed."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    found = {}
    for labels, value in re.findall(rf'^{metric}\{{([^}}]*)\}} (\S+)$', text, re.M):
        if 'model="tiny_llm"' in labels:
            node = re.search(r'node="([^"]*)"', labels)
            key = node.group(1) if node else ""
            found[key] = found.get(key, 0) + int(float(value))
    return found


def pending(worker):
    """The worker's `nv_inference_pending_request_count` for tiny_llm."""
    return sum(scrape(worker.metrics_port, "nv_inference_pending_request_count").values())


def routed(router):
    """Streams the router has outstanding on each node."""
    return scrape(router.metrics_port, "nereid_router_replica_in_flight")


def test_new_streams_avoid_the_worker_with_work_from_elsewhere(cluster):
    (w1, w2), router = cluster
    conns = []
    try:
        for i in range(HELD):
            conns.append(send_stream(w1, "slow held"))
        # One generation runs, the others wait in w1's queue.
        wait_until(lambda: pending(w1) == HELD - 1, 30, "the held streams queued on w1")
        for i in range(1, ROUTED + 1):
            conns.append(send_stream(router, "slow routed"))

            # Each routed stream reached its worker (so the router has its report) before the
            # next: queued on w1 or w2, or the one running on w2.
            def arrived():
                on = routed(router)
                running = 1 if on.get("w2", 0) > 0 else 0
                return (sum(on.values()) == i
                        and pending(w1) - (HELD - 1) + pending(w2) + running == i)

            wait_until(arrived, 30, f"routed stream {i} reached a worker")
        on = routed(router)
        # w2 took all but at most one: the router's counts alone would send w1 half of them.
        assert on.get("w1", 0) <= 1, on
        assert on.get("w2", 0) >= ROUTED - 1, on
    finally:
        for conn in conns:
            conn.close()


def test_the_router_answers_the_orca_header_with_a_workers_figures(cluster):
    _, router = cluster
    host, port = router.http_url.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request("POST", "/v1/completions",
                     json.dumps({"model": "tiny_llm", "prompt": "a b", "stream": True,
                                 "max_tokens": 2}),
                     {"Content-Type": "application/json",
                      "endpoint-load-metrics-format": "text"})
        resp = conn.getresponse()
        assert resp.status == 200
        report = resp.getheader("endpoint-load-metrics")
        assert re.fullmatch(
            r"TEXT named_metrics\.pending_requests=\d+, named_metrics\.in_flight_requests=\d+",
            report or ""), report
        assert b"data: [DONE]" in resp.read()
    finally:
        conn.close()
    # Without the request header, no report.
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request("POST", "/v1/completions",
                     json.dumps({"model": "tiny_llm", "prompt": "a b", "max_tokens": 2}),
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200
        assert resp.getheader("endpoint-load-metrics") is None
        resp.read()
    finally:
        conn.close()
