"""Network partitions of a real cluster (3 control-plane nodes, 2 workers, a router), each
process in a network namespace of its own joined to one bridge (netns_util.py): the control-plane
leader cut off from the other control-plane nodes, a worker cut off from the control plane but
not from the router, and each healed. Inference runs through the router and writes go to the
management API all along; every scenario counts failed inferences and lost writes and asserts
what docs/cluster.md ("Partitions") documents.

Needs root and `ip netns` (skipped with the reason otherwise); `make test-partitions` runs it
(marker `partitions`, left out of `make test-python`)."""

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import netns_util
from cluster_util import AUTH, TOKEN, Process, model_body
from nereid_util import NEREID_BIN, gen_models, http_json, http_raw, wait_until

pytestmark = pytest.mark.partitions

HEARTBEAT_MS = 200
HEARTBEAT_TIMEOUT_MS = 1500
RAFT_HEARTBEAT_MS = 100
ELECTION_TIMEOUT_MS = 500
CP_GRPC, CP_HTTP, HTTP, GRPC, METRICS = 7000, 7080, 8000, 8001, 8002
READY = "REPLICA_STATE_READY"
NODE_UP = "NODE_STATUS_UP"


class NsProcess(Process):
    """A nereid subcommand run with `ip netns exec` in node `name`'s namespace."""

    def __init__(self, net, name, workdir, args):
        super().__init__(name, workdir, args)
        self.args = [*net.exec_prefix(name), *self.args]
        self.addr = net.nodes[name]


class ControlPlane(NsProcess):
    def __init__(self, net, node_id, workdir, token, peers):
        self.node_id = node_id
        name = f"cp{node_id}"
        addr = net.nodes[name]
        self.grpc_addr, self.http_addr = f"{addr}:{CP_GRPC}", f"{addr}:{CP_HTTP}"
        super().__init__(net, name, workdir, [
            "control-plane", "--node-id", str(node_id),
            "--listen", self.grpc_addr, "--http-listen", self.http_addr,
            "--data-dir", str(Path(workdir) / f"{name}-data"),
            "--auth-token-file", str(token), "--peers", peers,
            "--heartbeat-interval-ms", str(HEARTBEAT_MS),
            "--heartbeat-timeout-ms", str(HEARTBEAT_TIMEOUT_MS),
            "--raft-heartbeat-ms", str(RAFT_HEARTBEAT_MS),
            "--election-timeout-ms", str(ELECTION_TIMEOUT_MS),
            "--log-verbose", "1"])

    def api(self, method, path, body=None, timeout=10):
        self.check_alive()
        code, _, data = http_raw(self.http_addr, method, path, body, AUTH, timeout=timeout)
        try:
            return code, json.loads(data) if data else None
        except ValueError:
            return code, data

    def status(self):
        code, body = self.api("GET", "/api/v1/cluster", timeout=5)
        assert code == 200, (self.name, code, body)
        return body

    def model_names(self, consistency="local"):
        code, body = self.api("GET", f"/api/v1/models?consistency={consistency}")
        assert code == 200, (self.name, code, body)
        return {m["model"]["name"] for m in body.get("models", [])}

    def replicas(self, model):
        code, body = self.api("GET", f"/api/v1/models/{model}?consistency=linearizable")
        assert code == 200, (self.name, code, body)
        return body.get("replicas", [])

    def node_status(self, node_id):
        code, body = self.api("GET", f"/api/v1/nodes/{node_id}?consistency=linearizable")
        assert code == 200, (self.name, code, body)
        return body["node"]["status"]


class Serving(NsProcess):
    """A worker or the router: KServe v2 on the node's address."""

    def __init__(self, net, name, workdir, args):
        addr = net.nodes[name]
        self.http_url = f"{addr}:{HTTP}"
        super().__init__(net, name, workdir, [
            *args, "--http-port", str(HTTP), "--grpc-port", str(GRPC),
            "--metrics-port", str(METRICS), "--http-address", addr, "--grpc-address", addr,
            "--metrics-address", addr, "--log-verbose", "1"])

    def wait_live(self, deadline_s=60):
        def live():
            self.check_alive()
            return http_raw(self.http_url, "GET", "/v2/health/live", timeout=2)[0] == 200
        wait_until(live, deadline_s, f"{self.name} live")

    def model_ready(self, model):
        return http_raw(self.http_url, "GET", f"/v2/models/{model}/ready", timeout=5)[0] == 200


class Cluster:
    def __init__(self, net, workdir):
        self.net = net
        token = Path(workdir) / "token"
        token.write_text(TOKEN + "\n")
        for i in (1, 2, 3):
            net.add_node(f"cp{i}", 10 + i)
        for i in (1, 2):
            net.add_node(f"w{i}", 20 + i)
        net.add_node("router", 31)
        peers = ",".join(f"{i}={net.nodes[f'cp{i}']}:{CP_GRPC}" for i in (1, 2, 3))
        self.cps = [ControlPlane(net, i, workdir, token, peers) for i in (1, 2, 3)]
        cp_addrs = ",".join(cp.grpc_addr for cp in self.cps)
        self.workers = [
            Serving(net, f"w{i}", workdir, [
                "worker", "--control-plane", cp_addrs, "--node-id", f"w{i}",
                "--advertise-host", net.nodes[f"w{i}"], "--auth-token-file", str(token),
                "--heartbeat-interval-ms", str(HEARTBEAT_MS),
                "--work-dir", str(Path(workdir) / f"w{i}-work")])
            for i in (1, 2)]
        self.router = Serving(net, "router", workdir, [
            "router", "--control-plane", cp_addrs, "--auth-token-file", str(token)])

    def processes(self):
        return [self.router, *self.workers, *self.cps]

    def leader(self, among=None, deadline_s=30):
        """The node of `among` that every node of `among` names as leader."""
        among = among or self.cps

        def agreed():
            ids = {cp.status().get("leader_id") for cp in among}
            if len(ids) != 1 or not next(iter(ids)):
                return None
            leader_id = ids.pop()
            return next((cp for cp in among if cp.node_id == leader_id), None)
        return wait_until(agreed, deadline_s, f"a leader agreed by {[c.name for c in among]}")


def simple_request():
    a = np.arange(16, dtype=np.int32)
    return {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "INT32",
                        "data": a.tolist()},
                       {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32",
                        "data": a.tolist()}]}, (a + a).tolist()


class Background:
    """Threads running `step` in the bridge namespace until stopped; counts what they saw."""

    def __init__(self, net, name, step, threads=1):
        self.net, self.name, self.step = net, name, step
        self.stop_event = threading.Event()
        self.lock = threading.Lock()
        self.ok, self.failed, self.errors = 0, 0, []
        self.threads = [threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True)
                        for i in range(threads)]
        for t in self.threads:
            t.start()

    def _run(self):
        self.net.enter_thread()
        while not self.stop_event.is_set():
            try:
                error = self.step()
            except Exception as e:  # noqa: BLE001 - counted and reported by the test
                error = repr(e)
            with self.lock:
                if error is None:
                    self.ok += 1
                else:
                    self.failed += 1
                    if len(self.errors) < 5:
                        self.errors.append(error)

    def counts(self):
        with self.lock:
            return self.ok, self.failed

    def stop(self):
        self.stop_event.set()
        for t in self.threads:
            t.join(timeout=30)
        assert not any(t.is_alive() for t in self.threads), f"{self.name} threads still run"
        return self.ok, self.failed, list(self.errors)


def inference_load(net, router, model, threads=2):
    body, expected = simple_request()

    def step():
        code, data = http_json(router.http_url, "POST", f"/v2/models/{model}/infer", body)
        if code != 200:
            return f"HTTP {code}: {data}"
        got = next(o["data"] for o in data["outputs"] if o["name"] == "OUTPUT0")
        return None if got == expected else f"wrong OUTPUT0 {got}"
    return Background(net, f"infer-{model}", step, threads)


class Writes:
    """Deploys of zero-replica models (names `<prefix>-<n>`) sent round-robin to `targets`;
    `acked` are the names the API acknowledged (200), `refused` those it did not (an error or
    no answer within `timeout_s`)."""

    def __init__(self, net, prefix, source, timeout_s=8):
        self.prefix, self.source, self.timeout_s = prefix, source, timeout_s
        self.targets = []
        self.acked, self.refused = [], []
        self.n = 0
        self.bg = Background(net, f"writes-{prefix}", self._step)

    def _step(self):
        targets = list(self.targets)
        if not targets:
            time.sleep(0.05)
            return None
        self.n += 1
        name, cp = f"{self.prefix}-{self.n}", targets[self.n % len(targets)]
        body = model_body(name, self.source, replicas=0)
        try:
            code, _ = cp.api("POST", "/api/v1/models", body, timeout=self.timeout_s)
        except OSError as e:
            code = repr(e)
        (self.acked if code == 200 else self.refused).append((name, cp.name, code))
        time.sleep(0.05)
        return None

    def stop(self):
        self.bg.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    reason = netns_util.unavailable_reason()
    if reason:
        pytest.skip(f"partition tests need network namespaces: {reason}")
    netns_util.remove_leftovers()
    workdir = tmp_path_factory.mktemp("partitions")
    repo = gen_models.write_repository(workdir / "repo", "example")
    net = netns_util.Network()
    c = None
    try:
        c = Cluster(net, workdir)
        c.repo = repo
        net.enter()  # the test's main thread talks to the nodes from the bridge namespace
        for p in c.cps:
            p.spawn()
        leader = c.leader()
        for p in [*c.workers, c.router]:
            p.spawn()
        for p in [*c.workers, c.router]:
            p.wait_live()
        for name, source, n in (("simple", repo / "simple", 2), ("solo", repo / "simple", 1)):
            code, body = leader.api("POST", "/api/v1/models", model_body(name, source, n))
            assert code == 200, (code, body)
        for model, n in (("simple", 2), ("solo", 1)):
            wait_until(lambda m=model, n=n: ready_nodes(c.leader(), m) and
                       len(ready_nodes(c.leader(), m)) == n, 60, f"{model}: {n} ready")
        # The router has both simple replicas in its table once requests reach both workers.
        load = inference_load(net, c.router, "simple")
        try:
            wait_until(lambda: all(inference_count(w, "simple") > 0 for w in c.workers), 30,
                       "the router sends to both workers")
        finally:
            load.stop()
        yield c
    finally:
        net.heal_all()
        if c is not None:
            for p in c.processes():
                p.kill()
        net.close()


def ready_nodes(cp, model):
    return sorted(r["node"] for r in cp.replicas(model) if r["state"] == READY)


def inference_count(server, model):
    code, body = http_json(server.http_url, "GET", f"/v2/models/{model}/stats")
    if code != 200:
        return 0
    return sum(s.get("inference_count", 0) for s in body.get("model_stats", []))


def assert_converged(c, leader):
    """Every node follows `leader`, has applied the same models, both workers are up, and each
    model has exactly its requested replicas, Ready, on distinct nodes."""
    for cp in c.cps:
        wait_until(lambda cp=cp: cp.status().get("leader_id") == leader.node_id, 30,
                   f"{cp.name} follows cp{leader.node_id}")
    expected = leader.model_names("linearizable")
    for cp in c.cps:
        wait_until(lambda cp=cp: cp.model_names() == expected, 30, f"{cp.name} caught up")
    for w in c.workers:
        wait_until(lambda w=w: leader.node_status(w.name) == NODE_UP, 30, f"{w.name} up")
    for model, n in (("simple", 2), ("solo", 1)):
        wait_until(lambda m=model, n=n: len(ready_nodes(leader, m)) == n and
                   len(leader.replicas(m)) == n, 60, f"{model}: exactly {n} ready replica(s)")
        nodes = [r["node"] for r in leader.replicas(model)]
        assert len(set(nodes)) == len(nodes), f"{model}: two replicas on one node: {nodes}"


@pytest.mark.timeout(120)
def test_leader_cut_off_from_the_other_control_plane_nodes(cluster):
    c = cluster
    old = c.leader()
    majority = [cp for cp in c.cps if cp is not old]
    load = inference_load(c.net, c.router, "simple")
    writes = Writes(c.net, "maj", c.repo / "simple")
    minority_writes = []
    try:
        writes.targets = majority
        wait_until(lambda: writes.acked and load.counts()[0] > 10, 20, "writes and inference")
        old_term = old.status()["term"]
        t0 = time.monotonic()
        for cp in majority:
            c.net.cut(old.name, cp.name)
        new = c.leader(among=majority)
        elected_s = time.monotonic() - t0
        assert new is not old
        assert new.status()["term"] > old_term
        # Read once the cut holds: a write in flight when it began may still have been applied.
        old_revision = old.status()["revision"]
        # The old leader cannot commit: a write sent to it is not acknowledged, and it applies
        # nothing (its revision stays) for as long as the cut lasts.
        for i in range(2):
            name = f"min-{i}"
            try:
                code, body = old.api("POST", "/api/v1/models",
                                     model_body(name, c.repo / "simple", replicas=0), timeout=8)
            except OSError as e:
                code, body = repr(e), None
            minority_writes.append((name, code, body))
            assert code != 200, f"the cut-off old leader acknowledged {name}: {body}"
        old_view = old.status()
        # The majority keeps both workers up (their heartbeats reach it) and simple's replicas.
        acked_before = len(writes.acked)
        wait_until(lambda: len(writes.acked) > acked_before + 5, 20, "writes on the majority")
        for w in c.workers:
            assert new.node_status(w.name) == NODE_UP, f"{w.name} declared down during the cut"
        assert ready_nodes(new, "simple") == ["w1", "w2"]
        assert old.status()["revision"] == old_revision, "the minority applied a write"
        served_during_cut = load.counts()
        c.net.heal_all()
        t_heal = time.monotonic()
        writes.stop()  # the nodes must agree on a final set of models
        assert_converged(c, new)
        converged_s = time.monotonic() - t_heal
    finally:
        c.net.heal_all()
        writes.stop()
        ok, failed, errors = load.stop()
    names = new.model_names("linearizable")
    lost = [w for w in writes.acked if w[0] not in names]
    leaked = [w for w in minority_writes if w[0] in names]
    print(f"\nleader cut: new leader cp{new.node_id} after {elected_s:.1f}s; "
          f"old leader during the cut: {old_view}; inferences ok {ok} failed {failed} "
          f"(during cut: {served_during_cut}); writes acked {len(writes.acked)} "
          f"refused {len(writes.refused)} {writes.refused[:3]}; minority writes "
          f"{minority_writes}; converged {converged_s:.1f}s after heal")
    assert failed == 0, f"{failed} failed inference(s) of {ok + failed}: {errors}"
    assert not lost, f"acknowledged writes lost: {lost}"
    assert not leaked, f"writes the minority took appear after healing: {leaked}"


def placement_invariant(cp, seen):
    """No model has more replicas in the registry than it asked for, nor two on one node; the
    most seen of each is kept in `seen`."""
    for model, n in (("simple", 2), ("solo", 1)):
        nodes = [r["node"] for r in cp.replicas(model)]
        assert len(nodes) <= n and len(set(nodes)) == len(nodes), f"{model}: {nodes}"
        seen[model] = max(seen.get(model, 0), len(nodes))


@pytest.mark.timeout(120)
def test_worker_cut_off_from_the_control_plane_but_not_the_router(cluster):
    c = cluster
    leader = c.leader()
    assert_converged(c, leader)
    victim_id = ready_nodes(leader, "solo")[0]
    victim = next(w for w in c.workers if w.name == victim_id)
    survivor = next(w for w in c.workers if w is not victim)
    load = inference_load(c.net, c.router, "simple")
    solo = inference_load(c.net, c.router, "solo", threads=1)
    writes = Writes(c.net, "wrk", c.repo / "simple")
    seen = {}
    try:
        writes.targets = list(c.cps)
        wait_until(lambda: writes.acked and load.counts()[0] > 10, 20, "writes and inference")
        served_by_victim = inference_count(victim, "simple")
        t0 = time.monotonic()
        for cp in c.cps:
            c.net.cut(victim.name, cp.name)
        # Documented rule: silent for --heartbeat-timeout-ms, the worker is declared down, its
        # replicas are dropped and placed again on the up nodes, one per node.
        wait_until(lambda: leader.node_status(victim.name) != NODE_UP, 15,
                   f"{victim.name} declared down")
        down_s = time.monotonic() - t0
        wait_until(lambda: ready_nodes(leader, "solo") == [survivor.name], 30,
                   f"solo replaced on {survivor.name}")
        replaced_s = time.monotonic() - t0
        # Until it reaches the control plane again the cut-off worker keeps serving what it has.
        assert victim.model_ready("solo") and victim.model_ready("simple")
        assert inference_count(victim, "simple") > served_by_victim, (
            "the router kept sending to the cut-off worker until it was declared down")
        holds_until = time.monotonic() + 2
        while time.monotonic() < holds_until:
            placement_invariant(leader, seen)
            assert ready_nodes(leader, "simple") == [survivor.name]
        solo_during_cut = solo.counts()
        c.net.heal_all()
        t_heal = time.monotonic()
        wait_until(lambda: leader.node_status(victim.name) == NODE_UP, 30,
                   f"{victim.name} registered again")
        writes.stop()  # the nodes must agree on a final set of models
        assert_converged(c, leader)
        placement_invariant(leader, seen)
        assert ready_nodes(leader, "solo") == [survivor.name], "solo is not moved back"
        wait_until(lambda: not victim.model_ready("solo"), 30,
                   f"{victim.name} unloaded the solo replica it no longer holds")
        converged_s = time.monotonic() - t_heal
    finally:
        c.net.heal_all()
        writes.stop()
        solo_counts = solo.stop()
        ok, failed, errors = load.stop()
    names = leader.model_names("linearizable")
    lost = [w for w in writes.acked if w[0] not in names]
    print(f"\nworker cut: {victim.name} down after {down_s:.1f}s, solo ready on "
          f"{survivor.name} after {replaced_s:.1f}s; simple inferences ok {ok} failed {failed}; "
          f"solo ok/failed {solo_counts[:2]} (during cut {solo_during_cut}) {solo_counts[2]}; "
          f"writes acked {len(writes.acked)} refused {len(writes.refused)}; most replicas "
          f"seen {seen}; converged {converged_s:.1f}s after heal")
    assert down_s >= HEARTBEAT_TIMEOUT_MS / 1000 - HEARTBEAT_MS / 1000, (
        f"{victim.name} declared down {down_s:.1f}s after the cut, before the heartbeat timeout")
    assert failed == 0, f"{failed} failed inference(s) of {ok + failed}: {errors}"
    assert not lost, f"acknowledged writes lost: {lost}"
    # solo had one replica, on the cut-off worker: between the drop and its replacement's Ready
    # the router has no ready replica and says so; before and after, every request succeeds.
    assert solo_counts[0] > 0 and solo.failed == solo_during_cut[1], solo_counts
    assert all("has no ready replica" in e for e in solo_counts[2]), solo_counts[2]
