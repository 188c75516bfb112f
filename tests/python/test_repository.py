"""Repository API: index, explicit load/unload, load overrides (config and files), refusal in
the default `none` control mode."""

import asyncio
import json

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
from tritonclient.utils import InferenceServerException

from nereid_util import assert_http_error, gen_models, http_json


def index_by_name(entries):
    out = {}
    for e in entries:
        out.setdefault(e["name"], []).append(e)
    return out


def check_index(entries):
    idx = index_by_name(entries)
    assert idx["identity_fp32"] == [{"name": "identity_fp32", "version": "1", "state": "READY"}], \
        idx["identity_fp32"]
    assert sorted(e["version"] for e in idx["versioned_all"]) == ["1", "2", "3"]
    assert all(e["state"] == "READY" for e in idx["versioned_all"])
    for broken, needle in gen_models.BROKEN_MODELS.items():
        assert broken in idx, f"{broken} missing from index"
        states = {e.get("state") for e in idx[broken]}
        assert states == {"UNAVAILABLE"}, (broken, idx[broken])
        reason = " ".join(e.get("reason", "") for e in idx[broken])
        assert reason.strip(), f"{broken}: UNAVAILABLE without a reason"
        assert needle.lower() in reason.lower(), (broken, reason)


def test_index_none_mode(server, http_client, grpc_client):
    status, entries = http_json(server.http_url, "POST", "/v2/repository/index")
    assert status == 200 and isinstance(entries, list)
    check_index(entries)
    assert http_client.get_model_repository_index() == entries
    g = grpc_client.get_model_repository_index(as_json=True)["models"]
    assert {m["name"] for m in g} == {e["name"] for e in entries}
    ready = http_json(server.http_url, "POST", "/v2/repository/index", {"ready": True})[1]
    assert ready and all(e["state"] == "READY" for e in ready)
    assert not set(gen_models.BROKEN_MODELS) & {e["name"] for e in ready}


def test_load_unload_refused_in_none_mode(server, http_client, grpc_client):
    for action in ("load", "unload"):
        r = http_json(server.http_url, "POST", f"/v2/repository/models/simple/{action}", {})
        assert_http_error(r, 503)
    with pytest.raises(InferenceServerException) as e:
        http_client.load_model("simple")
    assert e.value.status() == "503"
    with pytest.raises(InferenceServerException) as e:
        grpc_client.unload_model("simple")
    assert e.value.status() == "StatusCode.UNAVAILABLE"
    assert http_client.is_model_ready("simple"), "refused unload must leave the model serving"


# ---------------------------------------------------------------------------------------------
# explicit mode


@pytest.fixture
def ex_http(explicit_server):
    c = httpclient.InferenceServerClient(explicit_server.http_url, network_timeout=60)
    yield c
    c.close()


@pytest.fixture
def ex_grpc(explicit_server):
    c = grpcclient.InferenceServerClient(explicit_server.grpc_url)
    yield c
    c.close()


def infer_identity(client, model, arr, dtype):
    mod = httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient
    i = mod.InferInput("INPUT0", list(arr.shape), dtype)
    i.set_data_from_numpy(arr)
    return client.infer(model, [i])


def test_explicit_index(explicit_server, ex_http):
    check_index(ex_http.get_model_repository_index())


def test_unload_then_load(ex_http, ex_grpc):
    x = np.arange(6, dtype=np.int16).reshape(2, 3)
    np.testing.assert_array_equal(infer_identity(ex_http, "identity_int16", x, "INT16")
                                  .as_numpy("OUTPUT0"), x)
    ex_http.unload_model("identity_int16")
    assert not ex_http.is_model_ready("identity_int16")
    with pytest.raises(InferenceServerException) as e:
        infer_identity(ex_http, "identity_int16", x, "INT16")
    assert "identity_int16" in e.value.message()
    entry = index_by_name(ex_http.get_model_repository_index())["identity_int16"]
    assert {e["state"] for e in entry} == {"UNAVAILABLE"}, entry
    ex_grpc.load_model("identity_int16")
    assert ex_grpc.is_model_ready("identity_int16")
    np.testing.assert_array_equal(infer_identity(ex_grpc, "identity_int16", x, "INT16")
                                  .as_numpy("OUTPUT0"), x)


def test_aio_load_unload(explicit_server):
    async def run():
        h = httpaio.InferenceServerClient(explicit_server.http_url)
        g = grpcaio.InferenceServerClient(explicit_server.grpc_url)
        try:
            await g.unload_model("identity_uint16")
            assert not await h.is_model_ready("identity_uint16")
            await h.load_model("identity_uint16")
            assert await g.is_model_ready("identity_uint16")
        finally:
            await h.close()
            await g.close()

    asyncio.run(asyncio.wait_for(run(), 90))


def test_load_with_config_override(ex_http, ex_grpc):
    cfg = ex_http.get_model_config("identity_uint8")
    assert cfg["max_batch_size"] == 8
    override = {"name": "identity_uint8", "backend": "onnxruntime", "max_batch_size": 2,
                "input": [{"name": "INPUT0", "data_type": "TYPE_UINT8", "dims": [-1]}],
                "output": [{"name": "OUTPUT0", "data_type": "TYPE_UINT8", "dims": [-1]}]}
    ex_http.load_model("identity_uint8", config=json.dumps(override))
    try:
        assert ex_http.get_model_config("identity_uint8")["max_batch_size"] == 2
        assert ex_grpc.get_model_config("identity_uint8").config.max_batch_size == 2
        ok = np.ones((2, 4), np.uint8)
        np.testing.assert_array_equal(infer_identity(ex_http, "identity_uint8", ok, "UINT8")
                                      .as_numpy("OUTPUT0"), ok)
        with pytest.raises(InferenceServerException) as e:
            infer_identity(ex_http, "identity_uint8", np.ones((3, 4), np.uint8), "UINT8")
        assert e.value.status() == "400"
    finally:
        ex_http.load_model("identity_uint8")  # reload from the repository
    assert ex_http.get_model_config("identity_uint8")["max_batch_size"] == 8


def versioned_config(name):
    return json.dumps({
        "name": name, "platform": "onnxruntime_onnx", "max_batch_size": 8,
        "input": [{"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [-1]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [-1]}]})


def test_load_with_file_override(ex_http, ex_grpc):
    x = np.array([[1, 2, 3]], np.int32)
    np.testing.assert_array_equal(infer_identity(ex_http, "versioned", x, "INT32")
                                  .as_numpy("OUTPUT0"), x + 3)
    ex_http.load_model("versioned", config=versioned_config("versioned"),
                       files={"file:1/model.onnx": gen_models.add_const_onnx(100)})
    try:
        res = infer_identity(ex_http, "versioned", x, "INT32")
        np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), x + 100)
        assert res.get_response()["model_version"] == "1"
        # The same over gRPC (raw bytes, not base64).
        ex_grpc.load_model("versioned", config=versioned_config("versioned"),
                           files={"file:1/model.onnx": gen_models.add_const_onnx(7)})
        np.testing.assert_array_equal(infer_identity(ex_grpc, "versioned", x, "INT32")
                                      .as_numpy("OUTPUT0"), x + 7)
    finally:
        ex_http.load_model("versioned")
    np.testing.assert_array_equal(infer_identity(ex_http, "versioned", x, "INT32")
                                  .as_numpy("OUTPUT0"), x + 3)


@pytest.mark.parametrize("key", ["file:1/../../x", "file:../model.onnx", "file:/tmp/abs.onnx"])
def test_file_override_path_traversal_refused(explicit_server, ex_http, ex_grpc, key):
    body = {"parameters": {"config": versioned_config("versioned_latest2"),
                           key: "YWJj"}}  # base64 of "abc"
    r = http_json(explicit_server.http_url, "POST",
                  "/v2/repository/models/versioned_latest2/load", body)
    assert_http_error(r, 400)
    with pytest.raises(InferenceServerException) as e:
        ex_grpc.load_model("versioned_latest2", config=versioned_config("versioned_latest2"),
                           files={key: b"abc"})
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert ex_http.is_model_ready("versioned_latest2"), "a refused load must not unload"


def test_file_override_requires_config(explicit_server):
    body = {"parameters": {"file:1/model.onnx": "YWJj"}}
    r = http_json(explicit_server.http_url, "POST",
                  "/v2/repository/models/versioned_latest2/load", body)
    assert_http_error(r, 400)


def test_load_unknown_and_broken(explicit_server, ex_http):
    with pytest.raises(InferenceServerException) as e:
        ex_http.load_model("no_such_model")
    # Triton 2.51 answers 500 here (test_triton_diff.py).
    assert e.value.status() == "500" and "no_such_model" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        ex_http.load_model("broken_config")
    assert e.value.status() == "400" and "broken_config" in e.value.message(), e.value
    assert "not_a_config_field" in e.value.message()
    assert ex_http.is_server_live() and ex_http.is_model_ready("simple")
