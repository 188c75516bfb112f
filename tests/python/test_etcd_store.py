"""The control plane on etcd (`--store etcd`), over real processes on 127.0.0.1: a real etcd
(Debian's etcd-server, installed by scripts/setup.sh), two stateless control-plane processes,
two workers and a router. A model deployed with `ctl` serves through the router; SIGKILLing the
elected control plane under load fails no inference and loses no acknowledged write; SIGKILLing
etcd and starting it again on the same data dir and port, the cluster resumes (writes succeed,
the router kept serving throughout). Over TLS (etcd with --client-cert-auth, certificates from
scripts/make_certs.sh): a control plane with --etcd-ca/--etcd-cert/--etcd-key serves a model
through a worker and the router; one trusting the wrong CA, or one without a client certificate,
exits naming the endpoint and the cause."""

import shutil
import ssl
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from cluster_util import (ControlPlaneNode, LoadtestRun, Process, RouterProcess, WorkerProcess,
                          inference_count, leader_of, wait_replicas, write_token)
from nereid_util import NEREID_BIN, ROOT, free_port, gen_models, wait_until
from test_cluster import infer_simple, model_names, stop_all
from test_router_faults import assert_no_failed_request, ready_nodes, wait_load_flowing

ETCD_BIN = shutil.which("etcd")
pytestmark = pytest.mark.skipif(
    ETCD_BIN is None, reason="no etcd binary (scripts/setup.sh installs Debian's etcd-server)")
PREFIX = "/nereid-e2e"
LEASE_TTL_S = 2


class EtcdProcess(Process):
    """One etcd member with its data under `workdir`; restartable on the same ports and data."""

    def __init__(self, workdir, certs=None):
        """`certs`: a make_certs.sh directory; etcd then serves clients over TLS with its
        127.0.0.1 certificate and demands client certificates signed by its CA."""
        self.client_port, peer_port = free_port(), free_port()
        self.certs = certs
        self.url = f"{'https' if certs else 'http'}://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{peer_port}"
        args = ["--name", "e2e", "--data-dir", str(Path(workdir) / "etcd-data"),
                "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"e2e={peer}"]
        if certs:
            args += ["--cert-file", str(certs / "127.0.0.1.pem"),
                     "--key-file", str(certs / "127.0.0.1.key"),
                     "--trusted-ca-file", str(certs / "ca.pem"), "--client-cert-auth"]
        super().__init__("etcd", workdir, args)
        self.args = [ETCD_BIN, *args]

    def wait_ready(self, deadline_s=30):
        context = None
        if self.certs:
            context = ssl.create_default_context(cafile=str(self.certs / "ca.pem"))
            context.load_cert_chain(self.certs / "client.pem", self.certs / "client.key")

        def healthy():
            self.check_alive()
            with urllib.request.urlopen(f"{self.url}/health", timeout=2, context=context) as r:
                return r.status == 200 and b'"true"' in r.read()
        wait_until(healthy, deadline_s, "etcd healthy", interval_s=0.05)


def deploy_with_ctl(cp, token, name, source, replicas):
    out = subprocess.run([NEREID_BIN, "ctl", "--control-plane", cp.grpc_addr, "--token-file",
                          str(token), "models", "deploy", name, "--source", f"file://{source}",
                          "--replicas", str(replicas)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, (out.stdout, out.stderr)


def unplaced_model(name, source):
    """A model that holds no replica (min 0): a write that loads nothing on the workers."""
    return {"name": name, "source": f"file://{source}", "config_override": f'{{"name": "{name}"}}',
            "version_policy": {"latest": {"num_versions": 1}}, "min_replicas": 0,
            "max_replicas": 1, "resources": {"memory_bytes": 64 << 20}}


def write_until_acknowledged(cps, body, deadline_s=30):
    """POSTs `body` to a live control plane until one acknowledges it; returns that node."""
    def attempt():
        for cp in cps:
            if cp.alive():
                code, _ = cp.api("POST", "/api/v1/models", body)
                if code == 200:
                    return cp
        return None
    return wait_until(attempt, deadline_s, f"a control plane to acknowledge {body['name']}",
                      interval_s=0.05)


@pytest.mark.timeout(170)
def test_two_stateless_control_planes_on_etcd_survive_leader_and_etcd_kills(tmp_path):
    repo = gen_models.write_repository(tmp_path / "repo", "example")
    etcd = EtcdProcess(tmp_path)
    etcd.spawn()
    etcd.wait_ready()
    token = write_token(tmp_path)
    store = ["--store", "etcd", "--etcd-endpoints", etcd.url, "--etcd-prefix", PREFIX,
             "--etcd-lease-ttl-secs", str(LEASE_TTL_S)]
    cps = [ControlPlaneNode(i, tmp_path, token, extra=store) for i in (1, 2)]
    addrs = [cp.grpc_addr for cp in cps]
    workers = [WorkerProcess(f"w{i}", tmp_path, token, addrs) for i in (1, 2)]
    router = RouterProcess(tmp_path, token, addrs)
    processes = [*cps, *workers, router, etcd]
    counts = {}
    try:
        for cp in cps:
            cp.spawn()
        leader = leader_of(cps)
        wait_until(lambda: {m["id"] for m in leader.status()["members"]} == {1, 2}, 10,
                   "both control-plane processes registered under the prefix")
        for p in [*workers, router]:
            p.spawn()
        for p in [*workers, router]:
            p.wait_live()

        deploy_with_ctl(cps[0], token, "simple", repo / "simple", replicas=2)
        wait_replicas(leader, "simple", lambda r: ready_nodes(r) == ["w1", "w2"],
                      "a ready replica on each worker")
        wait_until(lambda: infer_simple(router.http_url) is None
                   and all(inference_count(w, "simple") > 0 for w in workers),
                   30, "the router sends to both workers")

        # 1. SIGKILL the elected control plane under load; write through the other meanwhile.
        acknowledged = []
        load = LoadtestRun(tmp_path, "etcd_leader_kill", router.http_url, "simple",
                           protocol="http", duration_s=3 * LEASE_TTL_S + 2).start()
        wait_load_flowing(load, workers, "simple")
        old_term = leader.status()["term"]
        leader.kill()
        survivor = next(cp for cp in cps if cp is not leader)
        for i in range(5):
            write_until_acknowledged([survivor], unplaced_model(f"during{i}", repo / "simple"))
            acknowledged.append(f"during{i}")
        new_leader = leader_of([survivor])
        assert new_leader is survivor
        assert survivor.status()["term"] > old_term
        level = load.result()
        assert_no_failed_request(level, "elected control plane SIGKILLed mid-load")
        counts["leader_kill"] = (level["requests_total"], level["errors_total"])
        present = set(model_names(survivor))
        counts["writes"] = (len(acknowledged), len(set(acknowledged) - present))
        assert set(acknowledged) <= present, f"lost writes: {set(acknowledged) - present}"

        # The killed process comes back stateless and follows the elected one.
        leader.spawn()
        wait_until(lambda: set(acknowledged) <= set(model_names(leader, "local")), 30,
                   "the restarted control plane reads the state from etcd")
        assert leader_of(cps) is survivor

        # 2. SIGKILL etcd under load and start it again on the same data dir and port.
        load = LoadtestRun(tmp_path, "etcd_restart", router.http_url, "simple",
                           protocol="http", duration_s=6).start()
        wait_load_flowing(load, workers, "simple")
        etcd.kill()
        time.sleep(1)  # the outage under test: etcd is down for a second
        etcd.spawn()
        etcd.wait_ready()
        write_until_acknowledged(cps, unplaced_model("after_etcd_restart", repo / "simple"))
        acknowledged.append("after_etcd_restart")
        level = load.result()
        assert_no_failed_request(level, "etcd SIGKILLed and restarted mid-load")
        counts["etcd_restart"] = (level["requests_total"], level["errors_total"])
        resumed = leader_of(cps)
        assert set(acknowledged) <= set(model_names(resumed)), "every write survived"
        assert ready_nodes(resumed.api("GET", "/api/v1/models/simple?consistency="
                                       "linearizable")[1]["replicas"]) == ["w1", "w2"]
        infer_simple(router.http_url)
        print(f"etcd store: leader kill under load: {counts['leader_kill'][0]} inferences, "
              f"{counts['leader_kill'][1]} failed; writes during fail-over: "
              f"{counts['writes'][0]} acknowledged, {counts['writes'][1]} lost; etcd restart "
              f"under load: {counts['etcd_restart'][0]} inferences, "
              f"{counts['etcd_restart'][1]} failed")
    finally:
        stop_all(processes)


def test_a_control_plane_names_the_etcd_it_cannot_reach(tmp_path):
    token = write_token(tmp_path)
    dead = f"http://127.0.0.1:{free_port()}"
    out = subprocess.run([NEREID_BIN, "control-plane", "--auth-token-file", str(token),
                          "--listen", f"127.0.0.1:{free_port()}",
                          "--http-listen", f"127.0.0.1:{free_port()}",
                          "--store", "etcd", "--etcd-endpoints", dead],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert dead in out.stderr + out.stdout, (out.stdout, out.stderr)


def make_certs(directory, *names):
    subprocess.run(["bash", str(ROOT / "scripts" / "make_certs.sh"), str(directory), *names],
                   check=True, capture_output=True, timeout=60)
    return directory


@pytest.mark.timeout(90)
def test_a_control_plane_on_etcd_over_tls_serves_and_tls_mistakes_are_named(tmp_path):
    repo = gen_models.write_repository(tmp_path / "repo", "example")
    certs = make_certs(tmp_path / "certs", "127.0.0.1", "client")
    other = make_certs(tmp_path / "other-ca", "client")
    etcd = EtcdProcess(tmp_path, certs)
    etcd.spawn()
    token = write_token(tmp_path)
    tls = ["--store", "etcd", "--etcd-endpoints", etcd.url, "--etcd-prefix", PREFIX,
           "--etcd-ca", str(certs / "ca.pem"), "--etcd-cert", str(certs / "client.pem"),
           "--etcd-key", str(certs / "client.key")]
    cp = ControlPlaneNode(1, tmp_path, token, extra=tls)
    worker = WorkerProcess("w1", tmp_path, token, [cp.grpc_addr])
    router = RouterProcess(tmp_path, token, [cp.grpc_addr])
    processes = [cp, worker, router, etcd]
    try:
        etcd.wait_ready()
        # A CA that did not sign etcd's certificate, or no client certificate for etcd's
        # --client-cert-auth: start-up fails, naming the endpoint and the cause.
        plain = tls[:tls.index("--etcd-ca")]
        for flags, cause in [
                (["--etcd-ca", str(other / "ca.pem")], "not signed by a CA in --etcd-ca"),
                (["--etcd-ca", str(certs / "ca.pem")], "etcd refused the client certificate")]:
            out = subprocess.run([NEREID_BIN, "control-plane", "--auth-token-file", str(token),
                                  "--listen", f"127.0.0.1:{free_port()}",
                                  "--http-listen", f"127.0.0.1:{free_port()}", *plain, *flags],
                                 capture_output=True, text=True, timeout=60)
            assert out.returncode != 0
            assert etcd.url in out.stderr and cause in out.stderr, out.stderr

        cp.spawn()
        leader_of([cp])
        for p in (worker, router):
            p.spawn()
        for p in (worker, router):
            p.wait_live()
        deploy_with_ctl(cp, token, "simple", repo / "simple", replicas=1)
        wait_replicas(cp, "simple", lambda r: ready_nodes(r) == ["w1"], "a ready replica")
        wait_until(lambda: infer_simple(router.http_url) is None, 30,
                   "an inference through the router")
    finally:
        stop_all(processes)
