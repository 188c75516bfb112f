"""A worker that comes back never drops work it accepted, over real processes on 127.0.0.1: one
control plane, two workers and a router; a Python model that takes 200 ms a request, with a
replica on each worker, under steady load from `nereid-loadtest` through the router. One worker
is SIGSTOPped until the control plane declares it down and drops its replica, then SIGCONTed: it
learns its replica is gone and unloads it (draining the requests it had accepted; new ones get
UNAVAILABLE, which the router retries on the other worker), and the control plane places a
replica on it again. No request of the load fails, and requests sent straight to the stopped
worker are answered or refused retryably (503), never dropped."""

import os
import signal
import textwrap
import threading

import pytest

from cluster_util import LoadtestRun, inference_count, leader_of, node_status, wait_replicas
from nereid_util import http_raw, wait_until
from test_cluster import stop_all
from test_router_faults import (assert_no_failed_request, deploy_on_both, ready_nodes,
                                start_cluster, wait_load_flowing)

MODEL = "slow_identity"

CONFIG = textwrap.dedent(f"""\
    name: "{MODEL}"
    backend: "python"
    max_batch_size: 8
    input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }} ]
    output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }} ]
    instance_group [ {{ count: 2 kind: KIND_CPU }} ]
    """)

MODEL_PY = textwrap.dedent("""\
    import time

    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            time.sleep(0.2)
            return [
                pb_utils.InferenceResponse([pb_utils.Tensor(
                    "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
                for r in requests
            ]
    """)


def write_model(root):
    model = root / MODEL
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(CONFIG)
    (model / "1" / "model.py").write_text(MODEL_PY)
    return model


def direct_requests(worker, n):
    """`n` inference requests straight to `worker` over HTTP (not through the router, which
    would cancel them once it hedged), each on its own thread. Returns a function that waits for
    them (bounded) and gives each one's (status, body); status None: no answer."""
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32",
                        "data": [float(i) for i in range(16)]}]}
    results = [None] * n

    def one(i):
        try:
            status, _, data = http_raw(worker.http_url, "POST", f"/v2/models/{MODEL}/infer", body,
                                       {"Content-Type": "application/json"}, timeout=60)
            results[i] = (status, data.decode(errors="replace"))
        except OSError as e:
            results[i] = (None, repr(e))

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()

    def wait():
        for t in threads:
            t.join(timeout=90)
        return results
    return wait


def assert_answered_or_retryable(results):
    """Each request the worker got is answered (200) or refused retryably: 503 while its model
    unloads, or, once unloaded, 404 "Request for unknown model" (a router retries both)."""
    for i, (status, body) in enumerate(results):
        assert status == 200 or status == 503 or (
            status == 404 and "Request for unknown model" in body), (i, status, body)


@pytest.mark.timeout(180)
def test_a_worker_back_from_a_stop_drains_its_replica_and_fails_no_request(tmp_path):
    source = write_model(tmp_path / "repo")
    cps, workers, router = start_cluster(tmp_path, 1)
    cp = leader_of(cps)
    victim, survivor = workers
    load = None
    stopped = False
    try:
        deploy_on_both(cp, workers, MODEL, source)
        load = LoadtestRun(tmp_path, "load_worker_drain", router.grpc_url, MODEL,
                           concurrency=4, duration_s=30.0).start()
        wait_until(lambda: load.running() and inference_count(victim, MODEL) > 4
                   and inference_count(survivor, MODEL) > 4, 30,
                   "the router sends the load to both workers", interval_s=0.05)

        # Hung with requests queued and running (from the router, and straight from a client):
        # the control plane declares it down and drops its replica (nowhere else to place it:
        # the survivor already holds one).
        served = inference_count(victim, MODEL)
        direct = direct_requests(victim, 8)
        wait_until(lambda: inference_count(victim, MODEL) > served + 2, 10,
                   f"{victim.node_id} working on the direct requests", interval_s=0.02)
        os.kill(victim.proc.pid, signal.SIGSTOP)
        stopped = True
        wait_until(lambda: node_status(cp, victim.node_id) == "NODE_STATUS_DOWN", 30,
                   f"{victim.node_id} declared down")
        wait_replicas(cp, MODEL, lambda r: [x["node"] for x in r] == [survivor.node_id],
                      f"the replica on {victim.node_id} dropped", deadline_s=30)
        served = inference_count(survivor, MODEL)
        wait_until(lambda: inference_count(survivor, MODEL) > served + 20, 15,
                   "the survivor serves alone while the other worker hangs", interval_s=0.05)
        assert load.running(), "the load outlasts the stop"

        # Back: it unloads the replica it lost (draining what it had accepted), then gets a
        # replica again once the control plane sees it up.
        os.kill(victim.proc.pid, signal.SIGCONT)
        stopped = False
        wait_until(lambda: "model unloaded" in victim.log_path.read_text(errors="replace"), 30,
                   f"{victim.node_id} unloads the replica it lost")
        wait_replicas(cp, MODEL,
                      lambda r: ready_nodes(r) == sorted(w.node_id for w in workers),
                      f"a ready replica on {victim.node_id} again", deadline_s=60)
        assert_answered_or_retryable(direct())
        assert load.running(), "the load outlasts the return and the reload"
        wait_load_flowing(load, [victim], MODEL)
        assert_no_failed_request(load.result(), "worker SIGSTOPped, declared down, SIGCONTed")
    finally:
        if stopped:
            os.kill(victim.proc.pid, signal.SIGCONT)
        if load is not None:
            load.stop()
        stop_all([router, *workers, *cps])
