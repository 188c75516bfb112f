"""The router under faults, over real processes on 127.0.0.1: steady load from `nereid-loadtest`
through the router loses no request when a worker or the control-plane leader is SIGKILLed or a
worker hangs (SIGSTOP: its requests are hedged to the other worker), a restarted worker rejoins
and takes traffic again, and every step of a sequence reaches the worker that got its start while
the sequences spread over two workers."""

import importlib.util
import os
import signal
import threading
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from cluster_util import (LoadtestRun, RouterProcess, WorkerProcess, inference_count, leader_of,
                          model_body, node_status, wait_replicas)
from nereid_util import ROOT, gen_models, wait_until
from test_cluster import start_control_plane, stop_all

_spec = importlib.util.spec_from_file_location("gen_sequence_models",
                                               ROOT / "scripts/gen_sequence_models.py")
gen_sequence_models = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen_sequence_models)

READY = "REPLICA_STATE_READY"


def ready_nodes(r):
    return sorted(x["node"] for x in r if x["state"] == READY)


def start_cluster(workdir, n_control_planes, router_extra=()):
    """Control plane, two workers and a router, all told every control-plane address."""
    token, cps = start_control_plane(workdir, n=n_control_planes)
    addrs = [cp.grpc_addr for cp in cps]
    workers = [WorkerProcess(f"w{i}", workdir, token, addrs) for i in (1, 2)]
    router = RouterProcess(workdir, token, addrs, extra=router_extra)
    leader_of(cps)
    for p in [*workers, router]:
        p.spawn()
    for p in [*workers, router]:
        p.wait_live()
    return cps, workers, router


def deploy_on_both(cp, workers, name, source):
    code, body = cp.api("POST", "/api/v1/models", model_body(name, source, replicas=2))
    assert code == 200, (code, body)
    wait_replicas(cp, name, lambda r: ready_nodes(r) == sorted(w.node_id for w in workers),
                  "a ready replica on each worker")


def wait_load_flowing(load, workers, model):
    """Until the workers' inference counts grow under `load` (its measurement has begun)."""
    before = sum(inference_count(w, model) for w in workers if w.alive())

    def grew():
        assert load.running(), f"{load.name} ended early\n{load.out_path.read_text()}"
        return sum(inference_count(w, model) for w in workers if w.alive()) > before + 10
    wait_until(grew, 10, f"{load.name}: load through the router", interval_s=0.05)


def assert_no_failed_request(level, what):
    """Whole-run counts: every request the load generator sent, to the last one in flight."""
    assert level["errors_total"] == 0, (
        f"{what}: {level['errors_total']} failed request(s) of {level['requests_total']}; "
        f"first errors: {level['first_errors']}\n{level['output']}")
    assert level["requests_total"] > 0, level


@pytest.mark.timeout(150)
def test_load_through_the_router_survives_worker_and_leader_kills(tmp_path):
    repo = gen_models.write_repository(tmp_path / "repo", "example")
    cps, workers, router = start_cluster(tmp_path, 3)
    loads = []
    try:
        deploy_on_both(leader_of(cps), workers, "simple", repo / "simple")
        # The router has both replicas in its table once requests through it reach both.
        wait_until(lambda: run_simple(router) and all(inference_count(w, "simple") > 0
                                                      for w in workers),
                   30, "the router sends to both workers")

        # 1. SIGKILL a worker mid-load: its in-flight requests are retried on the other one.
        victim, survivor = workers
        load = LoadtestRun(tmp_path, "load_worker_kill", router.grpc_url, "simple").start()
        loads.append(load)
        wait_load_flowing(load, workers, "simple")
        victim.kill()
        assert load.running(), "the worker was killed mid-load"
        served_before = inference_count(survivor, "simple")
        assert_no_failed_request(load.result(), "worker SIGKILLed mid-load")
        assert inference_count(survivor, "simple") > served_before, "the survivor took the load"

        # 2. SIGKILL the control-plane leader mid-load: the router serves from its table while
        # the survivors elect a new leader.
        leader = leader_of(cps)
        load = LoadtestRun(tmp_path, "load_leader_kill", router.http_url, "simple",
                           protocol="http", duration_s=7.5).start()
        loads.append(load)
        wait_load_flowing(load, workers, "simple")
        leader.kill()
        assert load.running(), "the leader was killed mid-load"
        survivors = [cp for cp in cps if cp is not leader]
        new_leader = leader_of(survivors)
        assert load.running(), "the load outlasts the election (the whole leaderless time)"
        assert_no_failed_request(load.result(), "control-plane leader SIGKILLed mid-load")

        # 3. The killed worker restarts with the same node id and work dir: the new leader
        # sees it up and places the missing replica on it (no other node can hold it).
        victim.spawn()
        victim.wait_live()
        wait_until(lambda: node_status(new_leader, victim.node_id) == "NODE_STATUS_UP", 30,
                   f"{victim.node_id} up again")
        wait_replicas(new_leader, "simple",
                      lambda r: ready_nodes(r) == sorted(w.node_id for w in workers),
                      f"a ready replica on {victim.node_id} again", deadline_s=60)
        # ... and takes traffic: its own count grows while load goes only through the router.
        served_before = inference_count(victim, "simple")
        load = LoadtestRun(tmp_path, "load_rejoin", router.grpc_url, "simple").start()
        loads.append(load)
        wait_until(lambda: load.running() and
                   inference_count(victim, "simple") > served_before + 10,
                   load.duration_s, f"{victim.node_id} serving requests from the router",
                   interval_s=0.05)
        assert_no_failed_request(load.result(), "after the worker rejoined")

        # The load generator does count failures: both workers die mid-load.
        load = LoadtestRun(tmp_path, "load_all_dead", router.grpc_url, "simple").start()
        loads.append(load)
        wait_load_flowing(load, workers, "simple")
        for w in workers:
            w.kill()
        level = load.result()
        assert level["errors_total"] > 0 and level["first_errors"], level
    finally:
        for load in loads:
            load.stop()
        stop_all([router, *workers, *cps])


def router_hedges(router, model):
    """The router's `nereid_router_hedges_total` for `model`."""
    url = "http://127.0.0.1:{}/metrics".format(router.metrics_port)
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    series = 'nereid_router_hedges_total{{model="{}"}} '.format(model)
    return sum(float(line[len(series):]) for line in text.splitlines() if line.startswith(series))


# The hung-worker test's attempt timeout floor: well under the hang it holds (the heartbeat
# timeout and more), so a bound at the hang's length tells hedged requests from hostages.
HEDGE_FLOOR_MS = 200


@pytest.mark.timeout(120)
def test_a_hung_worker_does_not_hold_requests_hostage(tmp_path):
    """Correctness, not speed: no request fails, and none waits out the whole hang. The worker
    stays stopped until the control plane has marked it down and the other worker has served
    more, so the hang outlasts both ways a stalled attempt is hedged (the attempt timeout, here
    at least HEDGE_FLOOR_MS, and the mark-down); the load's slowest request must be faster than
    the time the worker was held stopped."""
    repo = gen_models.write_repository(tmp_path / "repo", "example")
    cps, workers, router = start_cluster(tmp_path, 1,
                                         router_extra=("--hedge-floor-ms", str(HEDGE_FLOOR_MS)))
    load = None
    victim, survivor = workers
    stopped = False
    try:
        cp = leader_of(cps)
        deploy_on_both(cp, workers, "simple", repo / "simple")
        wait_until(lambda: run_simple(router) and all(inference_count(w, "simple") > 0
                                                      for w in workers),
                   30, "the router sends to both workers")
        load = LoadtestRun(tmp_path, "load_worker_stop", router.grpc_url, "simple",
                           duration_s=8.0).start()
        wait_load_flowing(load, workers, "simple")
        # The attempt timeout follows the model's p99 once the router has seen 100 requests
        # (the ceiling before): let the load pass that first.
        base = sum(inference_count(w, "simple") for w in workers)
        wait_until(lambda: sum(inference_count(w, "simple") for w in workers) > base + 200, 10,
                   "the router saw enough requests to time attempts", interval_s=0.05)
        stopped_at = time.monotonic()
        os.kill(victim.proc.pid, signal.SIGSTOP)
        stopped = True
        # Requests sent to the hung worker are hedged to the other one (at the attempt timeout,
        # or when the control plane marks the node down), and the other one keeps serving.
        wait_until(lambda: router_hedges(router, "simple") > 0, 15, "a stalled attempt hedged",
                   interval_s=0.05)
        wait_until(lambda: node_status(cp, victim.node_id) != "NODE_STATUS_UP", 15,
                   f"{victim.node_id} marked down", interval_s=0.05)
        served = inference_count(survivor, "simple")
        wait_until(lambda: inference_count(survivor, "simple") > served + 50, 10,
                   "the survivor serves while the other worker hangs", interval_s=0.05)
        os.kill(victim.proc.pid, signal.SIGCONT)
        stopped = False
        held_us = (time.monotonic() - stopped_at) * 1e6
        assert load.running(), "the load outlasts the hang"
        level = load.result()
        assert_no_failed_request(level, "worker SIGSTOPped mid-load")
        assert level["max_us"] < held_us, (
            f"a request waited {level['max_us'] / 1e6:.2f}s, the whole {held_us / 1e6:.2f}s "
            f"hang (p99 {level['p99_us'] / 1e6:.3f}s): held hostage, not hedged\n{level['output']}")
    finally:
        if stopped:
            os.kill(victim.proc.pid, signal.SIGCONT)
        if load is not None:
            load.stop()
        stop_all([router, *workers, *cps])


def run_simple(router):
    """One request through the router (HTTP); True when it succeeded."""
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"),
              httpclient.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(a)
    result = httpclient.InferenceServerClient(router.http_url).infer("simple", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)
    return True


SEQUENCES = 8
STEPS = 10


def sequence_id(i):
    """uint64 ids for half the sequences, string ids for the other half."""
    return 9100 + i if i % 4 < 2 else f"faults-seq-{i}"


def seq_step(client, module, value, **seq):
    inp = module.InferInput("INPUT", [1, 1], "INT32")
    inp.set_data_from_numpy(np.full((1, 1), value, dtype=np.int32))
    return int(client.infer("seq_accum", [inp], **seq).as_numpy("OUTPUT")[0, 0])


@pytest.mark.timeout(90)
def test_sequences_keep_their_worker_through_the_router(tmp_path):
    repo = gen_sequence_models.write_repository(tmp_path / "repo")
    cps, workers, router = start_cluster(tmp_path, 1)
    try:
        deploy_on_both(cps[0], workers, "seq_accum", repo / "seq_accum")

        def one_step_sequence(n=[0]):
            n[0] += 1
            client = httpclient.InferenceServerClient(router.http_url)
            return seq_step(client, httpclient, 5, sequence_id=9000 + n[0], sequence_start=True,
                            sequence_end=True) == 5
        wait_until(lambda: one_step_sequence() and all(inference_count(w, "seq_accum") > 0
                                                       for w in workers),
                   30, "the router starts sequences on both workers")
        before = [inference_count(w, "seq_accum") for w in workers]

        # Every sequence runs in its own thread; a barrier makes them take each step together,
        # so the steps of all sequences interleave at the router.
        barrier = threading.Barrier(SEQUENCES, timeout=30)
        results = {}
        errors = []

        def run_sequence(i):
            try:
                if i % 2:
                    module, client = grpcclient, grpcclient.InferenceServerClient(router.grpc_url)
                else:
                    module = httpclient
                    client = httpclient.InferenceServerClient(router.http_url)
                got = []
                for step in range(STEPS):
                    barrier.wait()
                    got.append(seq_step(client, module, (i + 1) * (step + 1),
                                        sequence_id=sequence_id(i), sequence_start=step == 0,
                                        sequence_end=step == STEPS - 1))
                results[i] = got
            except Exception as e:  # noqa: BLE001 - reported by the main thread
                errors.append(f"sequence {sequence_id(i)}: {e!r}")
                barrier.abort()

        threads = [threading.Thread(target=run_sequence, args=(i,)) for i in range(SEQUENCES)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not errors, errors
        for i in range(SEQUENCES):
            expected = list(np.cumsum([(i + 1) * (step + 1) for step in range(STEPS)]))
            assert results[i] == expected, f"sequence {sequence_id(i)}: {results[i]} != {expected}"

        served = [inference_count(w, "seq_accum") - b for w, b in zip(workers, before)]
        assert sum(served) == SEQUENCES * STEPS, served
        assert all(s > 0 and s % STEPS == 0 for s in served), (
            f"each worker ran whole sequences, and both ran some: {served}")
    finally:
        stop_all([router, *workers, *cps])
