"""Replacing the router under load without an outage, over real processes on 127.0.0.1: router A
and router B share the HTTP, gRPC and metrics ports (`--reuse-port`); once B is ready, A gets
SIGTERM, closes its listeners, tells its clients to go away (HTTP/2 GOAWAY, HTTP/1.1
`Connection: close`) and finishes what it has, while the load generators reconnect to B. Not
one request fails, on either protocol, and B serves the load after A has exited."""

import http.client
import time

import pytest

from cluster_util import (LoadtestRun, RouterProcess, WorkerProcess, inference_count, leader_of,
                          since)
from nereid_util import gen_models, http_raw, wait_until
from test_cluster import start_control_plane, stop_all
from test_router_faults import (assert_no_failed_request, deploy_on_both, run_simple,
                                wait_load_flowing)

LOAD_S = 12.0


def answered_by(router, name, path):
    """GET `path` and the server metadata over one new connection to `router`'s HTTP port:
    the status of `path` when router `name` answered (the kernel picks a listener per
    connection), else None."""
    conn = http.client.HTTPConnection("127.0.0.1", router.http_port, timeout=2)
    try:
        conn.request("GET", "/v2")
        response = conn.getresponse()
        body = response.read()
        if response.status != 200 or f'"name":"{name}"' not in body.decode().replace(" ", ""):
            return None
        conn.request("GET", path)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def router_successes(router):
    """`nereid_router_requests_total{outcome="success"}` summed over models, from the metrics
    port (whichever router listens on it)."""
    code, _, body = http_raw(f"127.0.0.1:{router.metrics_port}", "GET", "/metrics", timeout=2)
    assert code == 200, code
    total = 0
    for line in body.decode().splitlines():
        if line.startswith("nereid_router_requests_total{") and 'outcome="success"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.mark.timeout(150)
def test_a_router_is_replaced_under_load_without_a_failed_request(tmp_path):
    repo = gen_models.write_repository(tmp_path / "repo", "example")
    token, cps = start_control_plane(tmp_path, n=1)
    addrs = [cp.grpc_addr for cp in cps]
    workers = [WorkerProcess(f"w{i}", tmp_path, token, addrs) for i in (1, 2)]
    old = RouterProcess(tmp_path, token, addrs, name="router_a",
                        extra=["--reuse-port", "--id", "router_a"])
    new = RouterProcess(tmp_path, token, addrs, name="router_b",
                        extra=["--reuse-port", "--id", "router_b"],
                        ports=(old.http_port, old.grpc_port, old.metrics_port))
    loads = []
    try:
        leader = leader_of(cps)
        for p in [*workers, old]:
            p.spawn()
        for p in [*workers, old]:
            p.wait_live()
        deploy_on_both(leader, workers, "simple", repo / "simple")
        wait_until(lambda: run_simple(old), 30, "router A routes to the model")

        loads = [LoadtestRun(tmp_path, f"handover_{protocol}", url, "simple",
                             protocol=protocol, concurrency=8, duration_s=LOAD_S).start()
                 for protocol, url in (("http", old.http_url), ("grpc", old.grpc_url))]
        for load in loads:
            wait_load_flowing(load, workers, "simple")

        # B binds A's ports while A serves, and is ready once its routing table has the model.
        new.spawn()
        wait_until(lambda: new.check_alive() or
                   answered_by(new, "router_b", "/v2/models/simple/ready") == 200,
                   30, "router B ready on the shared ports", interval_s=0.05)

        t0 = time.monotonic()
        assert old.stop(deadline_s=30) == 0, old.log_tail()
        exit_took = since(t0)
        for load in loads:
            assert load.running(), f"{load.name} ended before router A exited ({exit_took})"
        new.check_alive()

        # Only B listens now: the load goes on through it.
        at_exit = sum(inference_count(w, "simple") for w in workers)
        b_at_exit = router_successes(new)
        wait_until(lambda: all(load.running() for load in loads) and
                   sum(inference_count(w, "simple") for w in workers) > at_exit + 100,
                   LOAD_S, "the load through router B after A exited", interval_s=0.05)
        for load in loads:
            assert_no_failed_request(load.result(), f"{load.name}: router A replaced by B "
                                                    f"(A exited {exit_took} after SIGTERM)")
        assert router_successes(new) > b_at_exit + 100, "B served the load after A exited"
        print(f"router A exited {exit_took} after SIGTERM")
    finally:
        for load in loads:
            load.stop()
        stop_all([new, old, *workers, *cps])
