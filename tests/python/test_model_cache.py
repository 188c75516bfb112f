"""More models than memory, end to end: a control plane, two workers whose memory
(`--memory-capacity`) holds three 64 MiB replicas each, one pinned model (min_replicas 2, one
replica on each worker) and ten
cacheable ones (min_replicas 0, identity backend: it measures no C heap, so placement counts
the declared 64 MiB). tritonclient requests over all ten through the router, twice round, all
succeed: each model not loaded is activated, and the leader evicts the least recently used idle
replica to make room. Evictions show in the placement history and the leader's metrics, the
pinned replicas are never touched, and no node ever holds more than its capacity. A model that
fits a node but not beside its pinned replica gets a 503 that says why."""

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from cluster_util import RouterProcess, WorkerProcess, leader_of, model_body, wait_replicas
from nereid_util import free_port, gen_models, http_raw, wait_until
from test_cluster import start_control_plane, stop_all

MIB = 1 << 20
MODEL_MEMORY = 64 * MIB
# Three replicas per worker: with the pinned ones, four places for ten cacheable models.
CAPACITY = 3 * MODEL_MEMORY + 32 * MIB
CACHED = [f"c{i:02}" for i in range(10)]
READY = "REPLICA_STATE_READY"
UNLOADING = "REPLICA_STATE_UNLOADING"


def identity(repo, name):
    return gen_models.write_identity(repo, name, gen_models.identity_backend_config(name, 0))


def infer(client, model):
    x = np.arange(4, dtype=np.float32).reshape(4) + len(model)
    inp = httpclient.InferInput("INPUT0", [4], "FP32")
    inp.set_data_from_numpy(x)
    out = client.infer(model, [inp]).as_numpy("OUTPUT0")
    np.testing.assert_array_equal(out, x)


def placements(cp):
    code, body = cp.api("GET", "/api/v1/placements?consistency=linearizable")
    assert code == 200, (code, body)
    return body.get("replicas", [])


def check_capacity(cp):
    """Every node holds at most its capacity, counting what placement counts: each live
    replica's measured memory, else its model's declared figure."""
    used = {}
    for r in placements(cp):
        if r["state"] == UNLOADING:
            continue
        held = int(r.get("measured_memory_bytes", 0)) or MODEL_MEMORY
        used[r["node"]] = used.get(r["node"], 0) + held
    assert all(u <= CAPACITY for u in used.values()), used
    return used


def start_capped_cluster(workdir, residency_ms, capacity):
    """One control plane (eviction after `residency_ms`, metrics on a free port), two workers
    whose `--memory-capacity` is `capacity` bytes and a router, all live and the workers
    registered. Returns (control planes, workers, router, the control plane's metrics port);
    the caller stops them (stop_all)."""
    metrics_port = free_port()
    token, cps = start_control_plane(workdir, n=1, extra=[
        "--evict-min-residency-ms", str(residency_ms),
        "--allow-metrics", "--metrics-port", str(metrics_port),
        "--metrics-address", "127.0.0.1"])
    cp = cps[0]
    workers = [WorkerProcess(f"w{i}", workdir, token, [cp.grpc_addr]) for i in (1, 2)]
    for w in workers:
        w.args += ["--memory-capacity", str(capacity)]
    router = RouterProcess(workdir, token, [cp.grpc_addr])
    try:
        leader_of(cps)
        for p in (*workers, router):
            p.spawn()
        for p in (*workers, router):
            p.wait_live()
        wait_until(lambda: len(cp.api("GET", "/api/v1/nodes")[1].get("nodes", [])) == 2, 30,
                   "both workers registered")
    except BaseException:
        stop_all([router, *workers, *cps])
        raise
    return cps, workers, router, metrics_port


@pytest.mark.timeout(120)
def test_requests_over_more_models_than_memory_all_succeed_evicting_the_least_recently_used(
        tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    sources = {name: identity(repo, name) for name in ["pinned", *CACHED]}
    cps, workers, router, metrics_port = start_capped_cluster(tmp_path, 300, CAPACITY)
    cp = cps[0]
    procs = [*cps, *workers, router]
    try:
        code, body = cp.api("POST", "/api/v1/models",
                            model_body("pinned", sources["pinned"], replicas=2,
                                       memory=MODEL_MEMORY))
        assert code == 200, (code, body)
        pinned = wait_replicas(cp, "pinned",
                               lambda r: len([x for x in r if x["state"] == READY]) == 2,
                               "the pinned replicas ready")
        pinned_ids = sorted(r["id"] for r in pinned)
        for name in CACHED:
            body = model_body(name, sources[name], replicas=0, memory=MODEL_MEMORY)
            body["max_replicas"] = 1
            code, answer = cp.api("POST", "/api/v1/models", body)
            assert code == 200, (code, answer)

        client = httpclient.InferenceServerClient(router.http_url, network_timeout=60)
        wait_until(lambda: set(CACHED) <= {m["name"] for m in client.get_model_repository_index()},
                   30, "the router sees every model")
        for _ in range(2):
            for name in CACHED:
                infer(client, name)
                check_capacity(cp)
                infer(client, "pinned")
        live = [r for r in placements(cp) if r["state"] != UNLOADING]
        assert len(live) <= 6, live

        # The pinned replicas served throughout, never evicted.
        now = [r for r in placements(cp) if r["model"] == "pinned"]
        assert sorted((r["id"], r["state"]) for r in now) == [(i, READY) for i in pinned_ids], now

        # Evictions explained in the history of evicted and placed models alike.
        evicted, placed_after = 0, 0
        for name in CACHED:
            code, body = cp.api("GET", f"/api/v1/models/{name}/placement")
            assert code == 200, (code, body)
            for record in body.get("history", []):
                for d in record.get("decisions", []):
                    if d.get("rule") == "Evicted":
                        evicted += 1
                        assert d["explanation"].startswith("evicted to make room for c"), d
                    if "placed after evicting" in d.get("explanation", ""):
                        placed_after += 1
        assert evicted >= 10, evicted
        assert placed_after >= 10, placed_after
        assert not any(d.get("rule") == "Evicted"
                       for rec in cp.api("GET", "/api/v1/models/pinned/placement")[1]
                       .get("history", []) for d in rec.get("decisions", []))

        status, _, text = http_raw(f"127.0.0.1:{metrics_port}", "GET", "/metrics")
        assert status == 200
        text = text.decode()
        evictions = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                        if line.startswith("nereid_cache_evictions_total{"))
        assert evictions >= 10, text
        assert 'nereid_cache_evictions_total{model="pinned"}' not in text
        assert "nereid_cache_cold_start_seconds_count" in text

        # A model that fits an empty node, but no node once its pinned replica stays: 503, why.
        body = model_body("huge", sources["c00"], replicas=0, memory=CAPACITY - 32 * MIB)
        body["max_replicas"] = 1
        code, answer = cp.api("POST", "/api/v1/models", body)
        assert code == 200, (code, answer)
        x = np.zeros(4, dtype=np.float32)
        inp = httpclient.InferInput("INPUT0", [4], "FP32")
        inp.set_data_from_numpy(x)
        with pytest.raises(InferenceServerException) as refused:
            client.infer("huge", [inp])
        assert refused.value.status() == "503", refused.value
        message = refused.value.message()
        assert "model 'huge' cannot be loaded" in message, message
        assert "nothing can be evicted" in message, message
        assert "2 pinned" in message, message
        check_capacity(cp)
    finally:
        stop_all(procs)
