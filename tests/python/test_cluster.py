"""Cluster mode over real processes on 127.0.0.1: a 3-node Raft control plane that survives a
SIGKILLed leader and a full restart, workers that follow placement (spread, fail-over after the
heartbeat timeout, make-before-break drain), and the management API's errors and auth."""

import json
import subprocess
import time

import numpy as np
import pytest
import tritonclient.http as httpclient

from cluster_util import (AUTH, HEARTBEAT_TIMEOUT_MS, ControlPlaneNode, WorkerProcess, leader_of,
                          model_body, replicas, wait_replicas, write_token)
from nereid_util import NEREID_BIN, free_port, gen_models, http_json, wait_until


@pytest.fixture
def cluster_dir(tmp_path):
    return tmp_path


@pytest.fixture
def example_repo(tmp_path_factory):
    return gen_models.write_repository(tmp_path_factory.mktemp("cluster_repo"), "example")


def start_control_plane(workdir, n=3, extra=()):
    token = write_token(workdir)
    ports = {i: free_port() for i in range(1, n + 1)}
    nodes = [ControlPlaneNode(i, workdir, token, peers=ports if n > 1 else None, extra=extra)
             for i in range(1, n + 1)]
    for node in nodes:
        node.spawn()
    return token, nodes


def stop_all(processes):
    for p in processes:
        p.kill()


def model_names(node, consistency="linearizable"):
    code, body = node.api("GET", f"/api/v1/models?consistency={consistency}")
    assert code == 200, (code, body)
    return sorted(m["model"]["name"] for m in body.get("models", []))


def test_three_nodes_keep_every_committed_write_through_leader_kill_and_restart(
        cluster_dir, example_repo):
    token, nodes = start_control_plane(cluster_dir)
    try:
        leader = leader_of(nodes)
        source = example_repo / "simple"
        written = []
        for i in range(5):
            name = f"m{i}"
            code, body = leader.api("POST", "/api/v1/models", model_body(name, source))
            assert code == 200, (code, body)
            written.append(name)
        follower = next(n for n in nodes if n is not leader)
        code, body = follower.api("POST", "/api/v1/models", model_body("via_follower", source))
        assert code == 200, f"a follower forwards writes to the leader: {code} {body}"
        written.append("via_follower")
        for n in nodes:
            wait_until(lambda n=n: model_names(n, "local") == sorted(written), 10,
                       f"node {n.node_id} applied every write")

        old_term = leader.status()["term"]
        leader.kill()
        survivors = [n for n in nodes if n is not leader]
        # During the election a follower still answers reads of the leader's soft state from
        # its own state (docs/ctl.md), whether it knows no leader or the dead one.
        for n in survivors:
            for path in ("/api/v1/nodes", "/api/v1/models/m0/placement"):
                code, body = n.api("GET", path)
                assert code == 200, ("a follower answers reads during an election", path, code, body)
        new_leader = leader_of(survivors)
        assert new_leader is not leader
        assert new_leader.status()["term"] > old_term
        for name in ("after_kill_1", "after_kill_2"):
            target = survivors[0] if survivors[0] is not new_leader else survivors[1]
            code, body = target.api("POST", "/api/v1/models", model_body(name, source))
            assert code == 200, (code, body)
            written.append(name)
        assert model_names(new_leader) == sorted(written), "nothing committed was lost"

        leader.spawn()
        wait_until(lambda: model_names(leader, "local") == sorted(written), 30,
                   "the restarted node caught up")

        revision = new_leader.status()["revision"]
        for n in nodes:
            n.kill()
        for n in nodes:
            n.spawn()
        leader = leader_of(nodes)
        assert model_names(leader) == sorted(written), "state intact after a full restart"
        assert leader.status()["revision"] >= revision
        code, body = leader.api("DELETE", "/api/v1/models/m0")
        assert code == 200, (code, body)
        assert "m0" not in model_names(leader)
    finally:
        stop_all(nodes)


def infer_simple(url):
    client = httpclient.InferenceServerClient(url)
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.ones((1, 16), dtype=np.int32)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"),
              httpclient.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer("simple", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)


def holds_for(check, seconds):
    """Runs `check` (which asserts) again and again for `seconds`: an invariant over time."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        check()


def model_ready_on(worker, model):
    code, _ = http_json(worker.http_url, "GET", f"/v2/models/{model}/ready")
    return code == 200


def test_workers_follow_placement_fail_over_and_drain(cluster_dir, example_repo):
    token, cps = start_control_plane(cluster_dir, n=3)
    workers = []
    try:
        leader = leader_of(cps)
        # Workers and the API talk to a follower: registrations, heartbeats and reports are
        # forwarded to the leader, and reads of the leader's soft state are answered by it.
        cp = next(n for n in cps if n is not leader)
        others = [n.grpc_addr for n in cps if n is not cp]
        workers = [WorkerProcess(f"w{i}", cluster_dir, token, [cp.grpc_addr, *others])
                   for i in (1, 2, 3)]
        for w in workers:
            w.spawn()
        for w in workers:
            w.wait_live()
        wait_until(lambda: len(cp.api("GET", "/api/v1/nodes")[1].get("nodes", [])) == 3, 30,
                   "three workers registered")

        code, body = cp.api("POST", "/api/v1/models",
                            model_body("simple", example_repo / "simple", replicas=2))
        assert code == 200, (code, body)
        ready = wait_replicas(cp, "simple",
                              lambda r: sum(x["state"] == "REPLICA_STATE_READY" for x in r) == 2,
                              "two ready replicas")
        hosts = sorted(r["node"] for r in ready)
        assert len(set(hosts)) == 2, f"replicas spread over two nodes: {hosts}"
        # Replica memory is the C heap the load kept: the same model measures the same on
        # both workers (docs/cluster.md, "Replica memory").
        memory = sorted(int(r.get("measured_memory_bytes", 0)) for r in ready)
        assert memory[0] > 0 and (memory[1] - memory[0]) * 10 <= memory[1], memory
        by_id = {w.node_id: w for w in workers}
        for host in hosts:
            infer_simple(by_id[host].http_url)
        spare = next(w for w in workers if w.node_id not in hosts)
        assert not model_ready_on(spare, "simple"), "a worker serves only what it was assigned"

        # SIGKILL a worker: after the heartbeat timeout its replica is placed on the spare.
        victim = by_id[hosts[0]]
        t0 = time.monotonic()
        victim.kill()
        moved = wait_replicas(
            cp, "simple",
            lambda r: sorted(x["node"] for x in r if x["state"] == "REPLICA_STATE_READY")
            == sorted([hosts[1], spare.node_id]),
            "the dead worker's replica re-placed on the spare", deadline_s=60)
        assert time.monotonic() - t0 >= HEARTBEAT_TIMEOUT_MS / 1000 * 0.9
        assert all(x["node"] != victim.node_id for x in moved)
        code, node = cp.api("GET", f"/api/v1/nodes/{victim.node_id}")
        assert node["node"]["status"] == "NODE_STATUS_DOWN", node

        def heartbeat_reports_simple():
            code, alive = cp.api("GET", f"/api/v1/nodes/{spare.node_id}")
            assert code == 200 and alive["utilization"]["memory_total_bytes"] > 0, alive
            return ("simple", 1) in {(m["model"], m["version"])
                                     for m in alive["utilization"]["models"]}
        wait_until(heartbeat_reports_simple, 10, "the spare's heartbeat lists simple v1")
        infer_simple(spare.http_url)

        # The killed worker comes back: Up again, and it loads nothing it was not assigned.
        victim.spawn()
        victim.wait_live()
        wait_until(lambda: cp.api("GET", f"/api/v1/nodes/{victim.node_id}")[1]["node"]["status"]
                   == "NODE_STATUS_UP", 30, "the restarted worker is up")
        assert not model_ready_on(victim, "simple")

        # Drain: the replacement is READY before the drained replica leaves.
        drained = spare.node_id
        code, body = cp.api("POST", f"/api/v1/nodes/{drained}/drain")
        assert code == 200, (code, body)
        observations = []

        def drained_away():
            r = replicas(cp, "simple")
            observations.append(r)
            on_drained = [x for x in r if x["node"] == drained]
            if on_drained and on_drained[0]["state"] == "REPLICA_STATE_READY":
                return None
            ready_elsewhere = [x for x in r if x["node"] != drained
                               and x["state"] == "REPLICA_STATE_READY"]
            assert len(ready_elsewhere) >= 2, f"make-before-break violated: {r}"
            return not on_drained
        wait_until(drained_away, 60, "the drained node emptied", interval_s=0.05)
        assert sorted(x["node"] for x in replicas(cp, "simple")) == sorted(
            [hosts[1], victim.node_id])
        wait_until(lambda: not model_ready_on(spare, "simple"), 30, "the drained worker unloaded")

        code, explanation = cp.api("GET", "/api/v1/models/simple/placement")
        assert code == 200, explanation
        rules = {d["rule"] for rec in explanation["history"] for d in rec["decisions"]}
        assert {"NewModel", "NodeDown", "Drain"} <= rules, explanation

        # The control-plane leader dies: the new leader hears the workers' heartbeats (through
        # the followers they talk to) before its grace period ends, so no node goes down and
        # every ready replica stays ready.
        before = sorted((x["node"], x["state"]) for x in replicas(cp, "simple"))
        leader.kill()
        survivors = [n for n in cps if n is not leader]
        new_leader = leader_of(survivors)

        def all_up_and_ready():
            code, nodes = new_leader.api("GET", "/api/v1/nodes?consistency=linearizable")
            status = {n["node"]["id"]: n["node"]["status"] for n in nodes["nodes"]}
            assert all(s == "NODE_STATUS_UP" for s in status.values()), status
            now = sorted((x["node"], x["state"]) for x in replicas(new_leader, "simple"))
            assert now == before, (now, before)
        # Observed continuously until well past the new leader's grace period.
        holds_for(all_up_and_ready, 2 * HEARTBEAT_TIMEOUT_MS / 1000)

        # A worker stopped with SIGTERM tells the control plane it leaves before it exits: its
        # node is down as soon as the process is gone, not a heartbeat timeout later.
        leaving = by_id[hosts[1]]
        assert leaving.stop() == 0, f"{leaving.name} exits cleanly\n{leaving.log_tail()}"
        code, node = new_leader.api(
            "GET", f"/api/v1/nodes/{leaving.node_id}?consistency=linearizable")
        assert code == 200 and node["node"]["status"] == "NODE_STATUS_DOWN", (
            node, leaving.log_tail())
        assert "left the cluster" in leaving.log_tail(), leaving.log_tail()
        for p in workers + survivors:
            assert p.stop() in (0, None), f"{p.name} exits cleanly on SIGTERM\n{p.log_tail()}"
    finally:
        stop_all(workers + cps)


def test_management_api_auth_errors_and_ctl(cluster_dir, example_repo):
    token, cps = start_control_plane(cluster_dir, n=1,
                                     extra=["--model-repository", str(example_repo)])
    cp = cps[0]
    try:
        leader_of(cps)
        wait_until(lambda: model_names(cp) == ["identity_fp32_autocomplete", "mlp", "simple"], 20,
                   "the repository's models registered")

        code, body = cp.api("GET", "/api/v1/models", auth=False)
        assert code == 401 and "authorization" in body["error"].lower(), (code, body)
        code, body = http_json(cp.http_addr, "GET", "/api/v1/models", None,
                               {"authorization": "Bearer wrong"})
        assert code == 401, (code, body)
        code, body = cp.api("GET", "/api/v1/models/nope")
        assert code == 404 and "nope" in body["error"], (code, body)
        bad = model_body("bad", example_repo / "simple")
        bad["max_replicas"] = 0
        bad["min_replicas"] = 2
        code, body = cp.api("POST", "/api/v1/models", bad)
        assert code == 400 and "max_replicas" in body["error"], (code, body)
        code, body = cp.api("POST", "/api/v1/nodes/ghost/drain")
        assert code == 404 and "ghost" in body["error"], (code, body)

        ctl = [NEREID_BIN, "ctl", "--control-plane", cp.grpc_addr, "--token-file", str(token)]
        out = subprocess.run(ctl + ["models", "list", "--output", "json"], capture_output=True,
                             text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        listed = json.loads(out.stdout)
        assert sorted(m["model"]["name"] for m in listed["models"]) == [
            "identity_fp32_autocomplete", "mlp", "simple"]
        # A name that differs from the config's is refused before anything is written...
        deploy_again = ctl + ["models", "deploy", "again", "--source",
                              f"file://{example_repo / 'mlp'}", "--replicas", "1"]
        out = subprocess.run(deploy_again, capture_output=True, text=True, timeout=30)
        assert out.returncode == 1, (out.stdout, out.stderr)
        assert "names model 'mlp', but it is deployed as 'again'" in out.stderr, out.stderr
        assert "again" not in model_names(cp)
        # ...and accepted once renamed consistently.
        out = subprocess.run(deploy_again + ["--config-override", '{"name": "again"}'],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        assert "again" in model_names(cp)
        # --wait with no worker to place on: gives up at its timeout, saying what is ready.
        out = subprocess.run(ctl + ["models", "scale", "again", "--replicas", "1", "--wait",
                                    "--timeout", "1"], capture_output=True, text=True, timeout=30)
        assert out.returncode == 1, (out.stdout, out.stderr)
        assert "0 of 1 replicas ready" in out.stderr, out.stderr
        out = subprocess.run(ctl + ["cluster", "status"], capture_output=True, text=True,
                             timeout=30)
        assert out.returncode == 0 and "leader" in out.stdout.lower(), (out.stdout, out.stderr)
        out = subprocess.run([NEREID_BIN, "ctl", "--control-plane", cp.grpc_addr, "models",
                              "list"], capture_output=True, text=True, timeout=30,
                             env={"PATH": "/usr/bin:/bin"})
        assert out.returncode == 1 and "admin token" in out.stderr, out.stderr

        # A second node joins the running cluster: learner first, then voter; it serves the
        # state and forwards writes.
        joiner = ControlPlaneNode(2, cluster_dir, token, extra=["--join", cp.grpc_addr])
        cps.append(joiner.spawn())

        def two_voters():
            members = cp.status()["members"]
            return len(members) == 2 and all(m["voter"] for m in members)
        wait_until(two_voters, 30, "the joining node promoted to voter")
        wait_until(lambda: "again" in model_names(joiner, "local"), 20, "the new member caught up")
        code, body = joiner.api("POST", "/api/v1/models",
                                model_body("via_new_member", example_repo / "simple"))
        assert code == 200, (code, body)
        assert "via_new_member" in model_names(cp)
        for n in cps:
            assert n.stop() == 0, f"{n.name} exits cleanly on SIGTERM\n{n.log_tail()}"
    finally:
        stop_all(cps)


def test_an_ensemble_brings_its_composing_models_to_its_worker(cluster_dir, tmp_path_factory):
    repo = gen_models.write_repository(tmp_path_factory.mktemp("cluster_ens"), "ensemble")
    token, cps = start_control_plane(cluster_dir, n=1)
    cp = cps[0]
    worker = WorkerProcess("w1", cluster_dir, token, [cp.grpc_addr])
    try:
        leader_of(cps)
        worker.spawn()
        worker.wait_live()
        # The composing models are registered (their sources known) but not placed on their own.
        for name in ("ens_scale", "ens_addsub"):
            code, body = cp.api("POST", "/api/v1/models", model_body(name, repo / name, 0))
            assert code == 200, (code, body)
        code, body = cp.api("POST", "/api/v1/models",
                            model_body("ens_pipeline", repo / "ens_pipeline", 1))
        assert code == 200, (code, body)
        wait_replicas(cp, "ens_pipeline",
                      lambda r: [x["state"] for x in r] == ["REPLICA_STATE_READY"], "ready")
        client = httpclient.InferenceServerClient(worker.http_url)
        x = np.array([[1, 2, 3, 4]], dtype=np.float32)
        inp = httpclient.InferInput("IN", [1, 4], "FP32")
        inp.set_data_from_numpy(x)
        result = client.infer("ens_pipeline", [inp])
        np.testing.assert_allclose(result.as_numpy("SUM"), 3 * x)
        assert replicas(cp, "ens_scale") == [], "composing models get no replica of their own"

        code, body = cp.api("DELETE", "/api/v1/models/ens_pipeline")
        assert code == 200, (code, body)
        wait_until(lambda: not model_ready_on(worker, "ens_pipeline")
                   and not model_ready_on(worker, "ens_scale"), 30,
                   "the ensemble and the composing models it brought unloaded")
    finally:
        stop_all([worker, *cps])
