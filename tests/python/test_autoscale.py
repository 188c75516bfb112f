"""Autoscaling on load end to end: a 1-control-plane, 2-worker cluster serves a slow identity
model (50 ms per request, one instance, so requests queue on the worker); `nereid ctl models
autoscale` sets min 1, max 2 and a target of 2 requests in flight per replica with short windows;
`nereid-loadtest` keeps 8 requests in flight, the leader sees them in the workers' heartbeats and
adds the second replica; the load stops and the count comes back to min. The placement
explanation names each change and its reason."""

import json
import subprocess
import time

import pytest

from cluster_util import (LoadtestRun, WorkerProcess, leader_of, model_body, replicas, since,
                          wait_replicas)
from nereid_util import NEREID_BIN, gen_models, wait_until
from test_cluster import start_control_plane, stop_all

READY = "REPLICA_STATE_READY"


def ready(r):
    return [x for x in r if x["state"] == READY]


def ctl(cp, token, *args):
    out = subprocess.run([NEREID_BIN, "ctl", "--control-plane", cp.grpc_addr,
                          "--token-file", str(token), "--output", "json", *args],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def autoscale(cp):
    code, body = cp.api("GET", "/api/v1/models/slow/placement")
    assert code == 200, (code, body)
    return body.get("autoscale", {})


@pytest.mark.timeout(90)
def test_replicas_follow_load_up_to_max_and_back_to_min(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    source = gen_models.write_identity(
        repo, "slow", gen_models.identity_backend_config("slow", 0, delay_ms=50))
    token, cps = start_control_plane(tmp_path, n=1)
    cp = cps[0]
    workers = [WorkerProcess(f"w{i}", tmp_path, token, [cp.grpc_addr]) for i in (1, 2)]
    procs = [*cps, *workers]
    load = None
    try:
        leader_of(cps)
        for w in workers:
            w.spawn()
        for w in workers:
            w.wait_live()
        wait_until(lambda: len(cp.api("GET", "/api/v1/nodes")[1].get("nodes", [])) == 2, 30,
                   "both workers registered")
        code, body = cp.api("POST", "/api/v1/models", model_body("slow", source, replicas=1))
        assert code == 200, (code, body)
        first = wait_replicas(cp, "slow", lambda r: len(ready(r)) == 1, "one ready replica")
        status = ctl(cp, token, "models", "autoscale", "slow", "--min", "1", "--max", "2",
                     "--target-inflight", "2", "--up-window", "1s", "--down-window", "2s",
                     "--cooldown", "1s", "--max-step", "1")
        assert status["policy"]["target_in_flight"] == 2, status
        assert status["replicas"] == 1, status
        # Idle: the autoscaler holds at min and says why.
        wait_until(lambda: "below" in autoscale(cp).get("latest", "")
                   or "no load sample" in autoscale(cp).get("latest", ""), 10,
                   "the autoscaler evaluating the idle model")
        assert len(replicas(cp, "slow")) == 1

        host = next(w for w in workers if w.node_id == ready(first)[0]["node"])
        load = LoadtestRun(tmp_path, "load", host.grpc_url, "slow", concurrency=8,
                           duration_s=30).start()
        t0 = time.monotonic()
        wait_replicas(cp, "slow", lambda r: len(ready(r)) == 2, "scaled up to 2 ready replicas",
                      deadline_s=20)
        up = autoscale(cp)
        assert up["replicas"] == 2, up
        assert up["last_change"].startswith("scale up 1 -> 2"), up
        print(f"scaled up after {since(t0)}: {up['last_change']}")
        # At max under load: holds, never above max.
        wait_until(lambda: "max_replicas 2" in autoscale(cp).get("latest", ""), 10,
                   "the autoscaler holding at max")
        assert len([x for x in replicas(cp, "slow") if x["state"] != "REPLICA_STATE_UNLOADING"]) == 2

        load.stop()
        t1 = time.monotonic()
        wait_replicas(cp, "slow", lambda r: len(r) == 1 and len(ready(r)) == 1,
                      "scaled back down to 1 replica", deadline_s=20)
        down = autoscale(cp)
        assert down["replicas"] == 1, down
        assert down["last_change"].startswith("scale down 2 -> 1"), down
        print(f"scaled down after {since(t1)}: {down['last_change']}")
        history = cp.api("GET", "/api/v1/models/slow/placement")[1].get("history", [])
        rules = [d.get("rule") for rec in history for d in rec.get("decisions", [])]
        assert rules.count("Autoscale") == 2, history

        # Off: back to the floor, the explanation has no autoscaling any more.
        off = ctl(cp, token, "models", "autoscale", "slow", "--off")
        assert "policy" not in off and off["replicas"] == 1, off
        assert autoscale(cp) == {}
    finally:
        if load is not None:
            load.stop()
        stop_all(procs)
