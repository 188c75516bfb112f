"""Rebalancing end to end: models placed while one worker is registered move, make-before-break,
to a second worker that joins later, while a client keeps inferring through the router (0 failed
requests) and every model keeps a ready replica (docs/cluster.md, "Rebalancing")."""

import threading
import time

import numpy as np
import pytest
import tritonclient.http as httpclient

from cluster_util import RouterProcess, WorkerProcess, leader_of, model_body
from nereid_util import gen_models, wait_until
from test_cluster import start_control_plane, stop_all

READY = "REPLICA_STATE_READY"
UNLOADING = "REPLICA_STATE_UNLOADING"
MODELS = [f"simple{i}" for i in range(6)]


@pytest.fixture
def example_repo(tmp_path_factory):
    return gen_models.write_repository(tmp_path_factory.mktemp("rebalance_repo"), "example")


def infer(client, model, a, b):
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"),
              httpclient.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer(model, inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)


class ClientLoop(threading.Thread):
    """Infers through the router, round-robin over the models, until stopped; keeps failures."""

    def __init__(self, url):
        super().__init__(daemon=True)
        self.client = httpclient.InferenceServerClient(url, network_timeout=10)
        self.stop_event = threading.Event()
        self.requests = 0
        self.failures = []

    def run(self):
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        b = np.ones((1, 16), dtype=np.int32)
        while not self.stop_event.is_set():
            model = MODELS[self.requests % len(MODELS)]
            try:
                infer(self.client, model, a, b)
            except Exception as e:  # every failure counts, whatever its kind
                self.failures.append(f"{model}: {e}")
            self.requests += 1


def hosts(cp):
    """Per model, the (node, state) of each replica, from one snapshot of the placement table.

    One read, not one per model: reads per model straddle the moment a move ends and the next
    begins, and would see more moves in flight than the budget ever allowed."""
    code, body = cp.api("GET", "/api/v1/placements?consistency=linearizable")
    assert code == 200, (code, body)
    per_model = {m: [] for m in MODELS}
    for r in body.get("replicas", []):
        if r["model"] in per_model:
            per_model[r["model"]].append((r["node"], r["state"]))
    for reps in per_model.values():
        reps.sort()
    return per_model


def test_a_worker_that_joins_late_receives_replicas_without_failed_requests(tmp_path,
                                                                             example_repo):
    token, cps = start_control_plane(tmp_path, n=1, extra=["--rebalance-max-moves", "2"])
    cp = cps[0]
    w1 = WorkerProcess("w1", tmp_path, token, [cp.grpc_addr])
    w2 = WorkerProcess("w2", tmp_path, token, [cp.grpc_addr])
    router = RouterProcess(tmp_path, token, [cp.grpc_addr])
    loop = None
    try:
        leader_of(cps)
        for p in (w1, router):
            p.spawn()
        for p in (w1, router):
            p.wait_live()
        wait_until(lambda: len(cp.api("GET", "/api/v1/nodes")[1].get("nodes", [])) == 1, 30,
                   "w1 registered")
        for name in MODELS:
            code, body = cp.api("POST", "/api/v1/models",
                                model_body(name, example_repo / "simple"))
            assert code == 200, (code, body)
        wait_until(lambda: all(h == [("w1", READY)] for h in hosts(cp).values()), 60,
                   "every model ready on w1")
        loop = ClientLoop(router.http_url)
        loop.start()
        wait_until(lambda: loop.requests >= len(MODELS), 30, "the router serves every model")

        # w2 joins: moves start, at most 2 in flight; every model keeps a ready replica.
        # (wait_until keeps polling through exceptions: invariants are collected, then checked.)
        observed, violations = [], []
        w2.spawn()
        t0 = time.monotonic()

        def spread():
            h = hosts(cp)
            observed.append(h)
            for model, reps in h.items():
                if not any(state == READY for _, state in reps):
                    violations.append(f"{model} without a ready replica: {h}")
                if len(reps) > 2:
                    violations.append(f"{model}: more than a move's two replicas: {h}")
            settled = all(len(reps) == 1 and reps[0][1] == READY for reps in h.values())
            per_node = {"w1": 0, "w2": 0}
            for reps in h.values():
                per_node[reps[0][0]] += 1
            return per_node if settled and per_node["w1"] == per_node["w2"] else None

        per_node = wait_until(spread, 90, "the models spread over both workers")
        elapsed = time.monotonic() - t0
        assert violations == [], violations[:3]
        # A move counts until its old replica is told to unload (docs/cluster.md, "Budget"):
        # a replica already UNLOADING beside its replacement is a move that is over.
        moving = [sum(len([r for r in reps if r[1] != UNLOADING]) == 2 for reps in h.values())
                  for h in observed]
        assert max(moving) <= 2, f"more moves in flight than the budget: {moving}"
        assert per_node == {"w1": 3, "w2": 3}, per_node

        # Settled: nothing moves any more (no flapping).
        final = hosts(cp)
        end = time.monotonic() + 2
        while time.monotonic() < end:
            assert hosts(cp) == final

        loop.stop_event.set()
        loop.join(timeout=30)
        assert loop.requests > len(MODELS), loop.requests
        assert loop.failures == [], (f"{len(loop.failures)} of {loop.requests} requests failed "
                                     f"during the moves: {loop.failures[:5]}")

        moved = next(m for m in MODELS if final[m][0][0] == "w2")
        code, explained = cp.api("GET", f"/api/v1/models/{moved}/placement")
        assert code == 200, (code, explained)
        reason = explained["replicas"][0]["placement_reason"]
        assert reason.startswith("rebalancing: a replica moves from w1 to w2"), reason
        rules = [(d["action"], d["rule"]) for rec in explained.get("history", [])
                 for d in rec.get("decisions", [])]
        assert ("add", "Rebalance") in rules and ("remove", "Rebalance") in rules, rules
        print(f"spread 3/3 in {elapsed:.1f}s, {loop.requests} requests, 0 failed")
    finally:
        if loop is not None:
            loop.stop_event.set()
        stop_all([router, w1, w2, *cps])
