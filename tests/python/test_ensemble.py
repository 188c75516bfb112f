"""Ensembles through tritonclient, over HTTP and gRPC, on the `ensemble` set of
scripts/gen_models.py: a two-step pipeline equals its steps called by hand, a diamond DAG, ensemble
traffic batched by a composing model (its statistics), every load-time error in the repository
index and in the load API's answer, explicit loads that bring composing models along,
`unload_dependents`, a composing model that goes away, metadata/config/statistics of an
ensemble. Runs two servers of its own: `none` mode and explicit mode (nothing loaded at start)."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from nereid_util import gen_models, managed_server

MODULES = {"http": httpclient, "grpc": grpcclient}
X = np.array([[1.0, -2.0, 3.5, 10.0], [0.25, 0.0, -7.0, 2.0]], dtype=np.float32)


@pytest.fixture(scope="module")
def ens_repo(tmp_path_factory):
    return gen_models.write_repository(tmp_path_factory.mktemp("repo_ensemble"), "ensemble")


@pytest.fixture(scope="module")
def ens_server(ens_repo, tmp_path_factory):
    yield from managed_server(ens_repo, tmp_path_factory.mktemp("logs"), [], "server_ensemble")


@pytest.fixture(scope="module")
def ens_explicit_server(ens_repo, tmp_path_factory):
    args = ["--model-control-mode", "explicit"]
    yield from managed_server(ens_repo, tmp_path_factory.mktemp("logs"), args,
                              "server_ensemble_explicit")


def make_client(proto, server):
    if proto == "http":
        c = httpclient.InferenceServerClient(server.http_url, network_timeout=60, concurrency=8)
    else:
        c = grpcclient.InferenceServerClient(server.grpc_url)
    c.proto = proto
    return c


@pytest.fixture(params=["http", "grpc"])
def client(request, ens_server):
    c = make_client(request.param, ens_server)
    yield c
    c.close()


@pytest.fixture(params=["http", "grpc"])
def ex_client(request, ens_explicit_server):
    c = make_client(request.param, ens_explicit_server)
    yield c
    c.close()


def infer(client, model, inputs, outputs=None, **kwargs):
    """inputs: {name: array}; returns the result object."""
    mod = MODULES[client.proto]
    tensors = []
    for name, array in inputs.items():
        t = mod.InferInput(name, list(array.shape), "FP32")
        t.set_data_from_numpy(array)
        tensors.append(t)
    requested = None if outputs is None else [mod.InferRequestedOutput(o) for o in outputs]
    return client.infer(model, tensors, outputs=requested, **kwargs)


def infer_many(client, model, inputs_list):
    """Sends every request at once (HTTP: async_infer on the client's connection pool; gRPC:
    one thread each) and returns the results in order."""
    if client.proto == "http":
        pending = []
        for inputs in inputs_list:
            tensors = []
            for name, array in inputs.items():
                t = httpclient.InferInput(name, list(array.shape), "FP32")
                t.set_data_from_numpy(array)
                tensors.append(t)
            pending.append(client.async_infer(model, tensors))
        return [p.get_result() for p in pending]
    with ThreadPoolExecutor(len(inputs_list)) as pool:
        return list(pool.map(lambda inputs: infer(client, model, inputs), inputs_list))


def ready(client, model):
    """is_model_ready, False for a model the server does not know (gRPC raises for those)."""
    try:
        return client.is_model_ready(model)
    except InferenceServerException:
        return False


def stats_of(client, model):
    if client.proto == "http":
        [entry] = client.get_inference_statistics(model)["model_stats"]
        return {"success": int(entry["inference_stats"]["success"]["count"]),
                "inference_count": int(entry.get("inference_count", 0)),
                "execution_count": int(entry.get("execution_count", 0))}
    [entry] = client.get_inference_statistics(model).model_stats
    return {"success": entry.inference_stats.success.count,
            "inference_count": entry.inference_count, "execution_count": entry.execution_count}


def index_of(client):
    if client.proto == "http":
        entries = client.get_model_repository_index()
    else:
        entries = client.get_model_repository_index(as_json=True).get("models", [])
    return {e["name"]: e for e in entries}


# ---------------------------------------------------------------------------------------------
# Inference


def test_pipeline_equals_its_steps_by_hand(client):
    r = infer(client, "ens_pipeline", {"IN": X})
    scaled = infer(client, "ens_scale", {"x": X}).as_numpy("y")
    by_hand = infer(client, "ens_addsub", {"INPUT0": scaled, "INPUT1": X})
    np.testing.assert_array_equal(r.as_numpy("SUM"), by_hand.as_numpy("OUTPUT0"))
    np.testing.assert_array_equal(r.as_numpy("DIFF"), by_hand.as_numpy("OUTPUT1"))
    np.testing.assert_array_equal(r.as_numpy("SUM"), 3 * X)
    assert r.as_numpy("SUM").dtype == np.float32 and r.as_numpy("SUM").shape == (2, 4)

    only = infer(client, "ens_pipeline", {"IN": X}, outputs=["DIFF"])
    assert only.as_numpy("SUM") is None, "only the requested output comes back"
    np.testing.assert_array_equal(only.as_numpy("DIFF"), X)


def test_diamond_joins_parallel_steps(client):
    before = stats_of(client, "ens_identity")["success"]
    r = infer(client, "ens_diamond", {"IN": X}, request_id="diamond-1")
    np.testing.assert_array_equal(r.as_numpy("SUM"), 3 * X)
    np.testing.assert_array_equal(r.as_numpy("DIFF"), X)
    response = r.get_response() if client.proto == "http" else r.get_response(as_json=True)
    assert response["id"] == "diamond-1"
    assert response["model_name"] == "ens_diamond"
    assert stats_of(client, "ens_identity")["success"] == before + 1


def test_composing_model_batches_ensemble_requests(client):
    n = 6
    slow_before = stats_of(client, "ens_slow")
    ens_before = stats_of(client, "ens_batched")
    values = [np.full((1, 4), i, dtype=np.float32) for i in range(n)]
    results = infer_many(client, "ens_batched", [{"IN": v} for v in values])
    for v, r in zip(values, results):
        np.testing.assert_array_equal(r.as_numpy("OUT"), v)
    slow, ens = stats_of(client, "ens_slow"), stats_of(client, "ens_batched")
    assert slow["inference_count"] - slow_before["inference_count"] == n
    executions = slow["execution_count"] - slow_before["execution_count"]
    assert executions < n, f"{n} concurrent ensemble requests took {executions} executions"
    assert ens["success"] - ens_before["success"] == n
    assert ens["inference_count"] - ens_before["inference_count"] == n


def test_step_error_keeps_its_status_and_names_the_step(client):
    # ens_loose takes IN of any size; its step (ens_identity) takes exactly 4 values.
    with pytest.raises(InferenceServerException) as e:
        infer(client, "ens_loose", {"IN": np.zeros((1, 3), np.float32)}, request_id="bad-7")
    expected = "400" if client.proto == "http" else "StatusCode.INVALID_ARGUMENT"
    assert e.value.status() == expected
    message = e.value.message()
    assert "ensemble 'ens_loose' step 0 (model 'ens_identity')" in message, message
    assert "[request id: bad-7]" in message, message
    assert "unexpected shape for input 'INPUT0' for model 'ens_identity'" in message, message


def test_metadata_config_and_statistics(client, ens_server):
    if client.proto == "http":
        meta = client.get_model_metadata("ens_pipeline")
        config = client.get_model_config("ens_pipeline")
    else:
        meta = client.get_model_metadata("ens_pipeline", as_json=True)
        config = client.get_model_config("ens_pipeline", as_json=True)["config"]
    assert meta["platform"] == "ensemble"
    assert [i["name"] for i in meta["inputs"]] == ["IN"]
    assert [int(d) for d in meta["inputs"][0]["shape"]] == [-1, 4]
    assert [o["name"] for o in meta["outputs"]] == ["SUM", "DIFF"]
    steps = config["ensemble_scheduling"]["step"]
    assert [s["model_name"] for s in steps] == ["ens_scale", "ens_addsub"]
    assert int(steps[0]["model_version"]) == -1
    assert not config.get("instance_group")
    infer(client, "ens_pipeline", {"IN": X})
    assert stats_of(client, "ens_pipeline")["success"] >= 1


# ---------------------------------------------------------------------------------------------
# Load-time errors


def test_every_load_error_is_in_the_index(client):
    index = index_of(client)
    for name in ("ens_pipeline", "ens_diamond", "ens_batched", "ens_loose"):
        assert index[name]["state"] == "READY", index[name]
    for name, needles in gen_models.BROKEN_ENSEMBLES.items():
        entry = index[name]
        assert entry["state"] == "UNAVAILABLE", entry
        for needle in needles:
            assert needle in entry.get("reason", ""), (name, needle, entry)
    with pytest.raises(InferenceServerException) as e:
        infer(client, "ens_bad_dtype", {"IN": X})
    assert "404" in e.value.status() or "NOT_FOUND" in e.value.status()


def test_every_load_error_is_in_the_load_answer(ens_explicit_server):
    c = httpclient.InferenceServerClient(ens_explicit_server.http_url, network_timeout=60)
    g = grpcclient.InferenceServerClient(ens_explicit_server.grpc_url)
    try:
        for name, needles in gen_models.BROKEN_ENSEMBLES.items():
            with pytest.raises(InferenceServerException) as e:
                c.load_model(name)
            assert e.value.status() == "400", (name, e.value)
            for needle in needles:
                assert needle in e.value.message(), (name, needle, e.value.message())
        with pytest.raises(InferenceServerException) as e:
            g.load_model("ens_bad_shape")
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert "shape mismatch" in e.value.message()
    finally:
        for name in ("ens_scale", "ens_addsub", "ens_identity", "ens_decoupled"):
            try:
                c.unload_model(name)
            except InferenceServerException:
                pass
        c.close()
        g.close()


# ---------------------------------------------------------------------------------------------
# Explicit mode: loading and unloading


def unload_quietly(client, *names):
    for name in names:
        try:
            client.unload_model(name)
        except InferenceServerException:
            pass


def test_load_brings_composing_models_and_unload_dependents_takes_them(ex_client):
    unload_quietly(ex_client, "ens_pipeline", "ens_scale", "ens_addsub")
    assert not ready(ex_client, "ens_scale")

    ex_client.load_model("ens_pipeline")
    for name in ("ens_pipeline", "ens_scale", "ens_addsub"):
        assert ready(ex_client, name), name
    result = infer(ex_client, "ens_pipeline", {"IN": X})
    np.testing.assert_array_equal(result.as_numpy("SUM"), 3 * X)

    ex_client.unload_model("ens_pipeline", unload_dependents=True)
    index = index_of(ex_client)
    for name in ("ens_pipeline", "ens_scale", "ens_addsub"):
        assert not ready(ex_client, name), name
        assert index[name]["state"] == "UNAVAILABLE" and index[name]["reason"] == "unloaded", \
            index[name]


def test_unload_without_dependents_keeps_composing_models(ex_client):
    ex_client.load_model("ens_pipeline")
    ex_client.unload_model("ens_pipeline")
    assert not ready(ex_client, "ens_pipeline")
    assert ready(ex_client, "ens_scale") and ready(ex_client, "ens_addsub")
    unload_quietly(ex_client, "ens_scale", "ens_addsub")


def test_missing_composing_model_fails_requests_until_it_is_back(ex_client):
    ex_client.load_model("ens_diamond")
    ex_client.unload_model("ens_identity")
    assert not ready(ex_client, "ens_diamond")
    entry = index_of(ex_client)["ens_diamond"]
    assert entry["state"] == "UNAVAILABLE" and "'ens_identity'" in entry["reason"], entry
    with pytest.raises(InferenceServerException) as e:
        infer(ex_client, "ens_diamond", {"IN": X})
    expected = "503" if ex_client.proto == "http" else "StatusCode.UNAVAILABLE"
    assert e.value.status() == expected
    assert "composing model 'ens_identity'" in e.value.message(), e.value.message()

    ex_client.load_model("ens_identity")
    assert ready(ex_client, "ens_diamond")
    np.testing.assert_array_equal(infer(ex_client, "ens_diamond", {"IN": X}).as_numpy("DIFF"), X)
    ex_client.unload_model("ens_diamond", unload_dependents=True)
    assert not ready(ex_client, "ens_identity")
