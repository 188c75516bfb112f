"""The response cache (`--cache-config local,size=N`, `response_cache { enable: true }`) through
Triton's clients: hits skip the backend (the statistics' execution count does not move), the
statistics and `nv_cache_*` metrics count hits and misses, a small cache evicts the least
recently used answer, identical concurrent requests each execute while they miss (no
single-flight, as in Triton), a reload never serves an answer of the model it replaced, and the
models Triton refuses (decoupled, sequence) fail to load with Triton's message."""

import re
import threading

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from nereid_util import Server, http_json, http_raw

# Three entries of an FP32 [1, 4] answer fit (each: 16 data bytes, name, shape, 128 overhead).
CACHE_BYTES = 600
DELAY_MS = 300


def identity(name, extra="", max_batch=32, delay_ms=0):
    params = (f'parameters {{ key: "execute_delay_ms" value: {{ string_value: "{delay_ms}" }} }}\n'
              if delay_ms else "")
    return (f'name: "{name}"\nbackend: "identity"\nmax_batch_size: {max_batch}\n'
            'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
            'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
            "instance_group [ { kind: KIND_CPU, count: 1 } ]\n" + params + extra)


CACHE_ON = "response_cache { enable: true }\n"

PY_ADD = """import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() + {add})])
            for r in requests]
"""

ENSEMBLE = """name: "cached_ensemble"
platform: "ensemble"
max_batch_size: 32
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [ { model_name: "plain" model_version: -1
  input_map { key: "INPUT0" value: "IN" } output_map { key: "OUTPUT0" value: "OUT" } } ] }
response_cache { enable: true }
"""


def write_repo(repo):
    models = {
        "cached": identity("cached", CACHE_ON),
        "cached_slow": identity("cached_slow", CACHE_ON + "dynamic_batching { }\n",
                                delay_ms=DELAY_MS),
        "plain": identity("plain"),
        "cached_ensemble": ENSEMBLE,
        "cached_decoupled": identity("cached_decoupled", CACHE_ON
                                     + "model_transaction_policy { decoupled: true }\n", 0),
        "cached_sequence": identity("cached_sequence", CACHE_ON + "sequence_batching { }\n", 0),
        "cached_py": ('name: "cached_py"\nbackend: "python"\nmax_batch_size: 8\n'
                      'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
                      'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
                      + CACHE_ON),
    }
    for name, config in models.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(config)
    (repo / "cached_py" / "1" / "model.py").write_text(PY_ADD.format(add=1))
    return repo


@pytest.fixture(scope="module")
def cache_server(tmp_path_factory):
    repo = write_repo(tmp_path_factory.mktemp("cache_repo"))
    server = Server(repo, tmp_path_factory.mktemp("cache_logs"),
                    ["--model-control-mode", "explicit", "--load-model", "*",
                     f"--cache-config=local,size={CACHE_BYTES}"], name="server_cache").start()
    server.repo_dir = repo
    yield server
    server.stop()


@pytest.fixture
def client(cache_server):
    c = httpclient.InferenceServerClient(cache_server.http_url, concurrency=32,
                                         network_timeout=60)
    yield c
    c.close()


def infer(client, model, x, input_name="INPUT0", output_name="OUTPUT0"):
    i = httpclient.InferInput(input_name, list(x.shape), "FP32")
    i.set_data_from_numpy(x)
    return client.infer(model, [i]).as_numpy(output_name)


def stats(client, model):
    [s] = client.get_inference_statistics(model)["model_stats"]
    i = s["inference_stats"]
    return {"success": i["success"]["count"], "hit": i["cache_hit"]["count"],
            "miss": i["cache_miss"]["count"], "exec": s["execution_count"],
            "inferences": s["inference_count"], "compute": i["compute_infer"]["count"]}


def metric(server, name, model=None):
    status, _, body = http_raw(f"127.0.0.1:{server.metrics_port}", "GET", "/metrics")
    assert status == 200
    labels = f'{{model="{model}",version="1"}}' if model else ""
    m = re.search(rf"^{name}{re.escape(labels)} (\S+)$", body.decode(), re.M)
    assert m, f"{name}{labels} not in metrics"
    return float(m.group(1))


def x_of(seed):
    return np.full((1, 4), float(seed), dtype=np.float32) + np.arange(4, dtype=np.float32)


def test_hit_skips_the_backend_and_is_counted(cache_server, client):
    before = stats(client, "cached")
    x = x_of(1000)
    np.testing.assert_array_equal(infer(client, "cached", x), x)
    after_miss = stats(client, "cached")
    np.testing.assert_array_equal(infer(client, "cached", x), x)
    after_hit = stats(client, "cached")
    assert after_miss["miss"] == before["miss"] + 1
    assert after_miss["exec"] == before["exec"] + 1
    assert after_hit["hit"] == before["hit"] + 1
    assert after_hit["exec"] == after_miss["exec"], "a hit does not execute"
    assert after_hit["inferences"] == after_miss["inferences"]
    assert after_hit["success"] == after_miss["success"] + 1, "a hit is a success"
    assert after_hit["compute"] == after_miss["compute"]
    # gRPC hits the same entry.
    g = grpcclient.InferenceServerClient(cache_server.grpc_url)
    i = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    i.set_data_from_numpy(x)
    np.testing.assert_array_equal(g.infer("cached", [i]).as_numpy("OUTPUT0"), x)
    g.close()
    assert stats(client, "cached")["hit"] == after_hit["hit"] + 1
    # A model without response_cache never uses it.
    infer(client, "plain", x)
    infer(client, "plain", x)
    assert stats(client, "plain")["hit"] == 0 and stats(client, "plain")["miss"] == 0


def test_metrics(cache_server, client):
    x = x_of(2000)
    infer(client, "cached", x)
    infer(client, "cached", x)
    s = stats(client, "cached")
    assert metric(cache_server, "nv_cache_num_hits_per_model", "cached") == s["hit"]
    assert metric(cache_server, "nv_cache_num_misses_per_model", "cached") == s["miss"]
    assert metric(cache_server, "nv_cache_hit_duration_per_model", "cached") >= 0
    assert metric(cache_server, "nv_cache_miss_duration_per_model", "cached") >= 0
    assert metric(cache_server, "nv_inference_request_success", "cached") == s["success"]
    assert metric(cache_server, "nv_inference_exec_count", "cached") == s["exec"]
    assert metric(cache_server, "nv_cache_num_hits") >= s["hit"]
    assert metric(cache_server, "nv_cache_num_lookups") >= s["hit"] + s["miss"]
    assert 0 < metric(cache_server, "nv_cache_util") <= 1
    assert metric(cache_server, "nv_cache_num_entries") >= 1
    for name in ("nv_cache_num_misses", "nv_cache_num_evictions", "nv_cache_lookup_duration",
                 "nv_cache_insertion_duration"):
        metric(cache_server, name)
    _, _, body = http_raw(f"127.0.0.1:{cache_server.metrics_port}", "GET", "/metrics")
    assert 'nv_cache_num_hits_per_model{model="plain"' not in body.decode()


def test_small_cache_evicts_least_recently_used(cache_server, client):
    evictions = metric(cache_server, "nv_cache_num_evictions")
    a, b, c, d = (x_of(3000 + k) for k in range(4))
    for x in (a, b, c):
        infer(client, "cached", x)
    infer(client, "cached", a)  # hit: a is now the most recently used; b the least
    s0 = stats(client, "cached")
    infer(client, "cached", d)  # miss: b goes
    assert metric(cache_server, "nv_cache_num_evictions") > evictions
    infer(client, "cached", a)
    assert stats(client, "cached")["hit"] == s0["hit"] + 1, "a stayed"
    infer(client, "cached", b)
    s = stats(client, "cached")
    assert s["miss"] == s0["miss"] + 2 and s["exec"] == s0["exec"] + 2, "b was evicted"


def test_identical_concurrent_requests_each_execute_while_they_miss(cache_server, client):
    x = x_of(4000)
    before = stats(client, "cached_slow")
    pending = []
    for _ in range(32):
        i = httpclient.InferInput("INPUT0", [1, 4], "FP32")
        i.set_data_from_numpy(x)
        pending.append(client.async_infer("cached_slow", [i]))
    for p in pending:
        np.testing.assert_array_equal(p.get_result().as_numpy("OUTPUT0"), x)
    s = stats(client, "cached_slow")
    hits, misses = s["hit"] - before["hit"], s["miss"] - before["miss"]
    assert hits + misses == 32
    assert misses >= 1
    # Every miss was inferred (batched together while the first executed); hits were not.
    assert s["inferences"] - before["inferences"] == misses
    assert s["success"] - before["success"] == 32
    # Once one answer is in, the same request is a hit.
    infer(client, "cached_slow", x)
    assert stats(client, "cached_slow")["hit"] == s["hit"] + 1


def test_ensemble_caches_at_the_top_level(cache_server, client):
    x = x_of(5000)
    plain = stats(client, "plain")
    infer(client, "cached_ensemble", x, "IN", "OUT")
    np.testing.assert_array_equal(infer(client, "cached_ensemble", x, "IN", "OUT"), x)
    s = stats(client, "cached_ensemble")
    assert (s["hit"], s["miss"]) == (1, 1)
    assert stats(client, "plain")["exec"] == plain["exec"] + 1, "the hit ran no step"


def test_reload_never_serves_the_old_models_answer(cache_server, client):
    x = x_of(6000)
    np.testing.assert_array_equal(infer(client, "cached_py", x), x + 1)
    np.testing.assert_array_equal(infer(client, "cached_py", x), x + 1)
    assert stats(client, "cached_py")["hit"] == 1
    (cache_server.repo_dir / "cached_py" / "1" / "model.py").write_text(PY_ADD.format(add=2))
    client.load_model("cached_py")
    np.testing.assert_array_equal(infer(client, "cached_py", x), x + 2)
    s = stats(client, "cached_py")
    assert (s["hit"], s["miss"]) == (0, 1), "a new load starts with no cached answers"
    np.testing.assert_array_equal(infer(client, "cached_py", x), x + 2)


def test_decoupled_and_sequence_models_are_refused(cache_server):
    status, index = http_json(cache_server.http_url, "POST", "/v2/repository/index", {})
    assert status == 200
    reasons = {r["name"]: r.get("reason", "") for r in index}
    assert ("Response Cache does not currently support model cached_decoupled with 'decoupled' "
            "transaction policy. Please disable the response cache.") in reasons["cached_decoupled"]
    assert ("Response Cache does not currently support model cached_sequence with sequence "
            "batching scheduler. Please disable the response cache.") in reasons["cached_sequence"]


def test_without_cache_config_the_model_setting_is_ignored(tmp_path):
    repo = tmp_path / "repo"
    (repo / "cached" / "1").mkdir(parents=True)
    (repo / "cached" / "config.pbtxt").write_text(identity("cached", CACHE_ON))
    server = Server(repo, tmp_path, name="server_nocache").start()
    try:
        c = httpclient.InferenceServerClient(server.http_url)
        x = x_of(7000)
        infer(c, "cached", x)
        infer(c, "cached", x)
        s = stats(c, "cached")
        assert (s["hit"], s["miss"], s["exec"]) == (0, 0, 2)
        _, _, body = http_raw(f"127.0.0.1:{server.metrics_port}", "GET", "/metrics")
        assert "nv_cache" not in body.decode()
        c.close()
    finally:
        server.stop()


def test_bad_cache_config_stops_the_server(tmp_path):
    server = Server(tmp_path, tmp_path, ["--cache-config", "redis,host=x"], name="bad_cache")
    with pytest.raises(AssertionError) as e:
        server.start()
    assert "the 'redis' cache is not supported" in str(e.value)
