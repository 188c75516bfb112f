"""Health, readiness and metadata over HTTP, gRPC and both asyncio clients."""

import asyncio
import json

import tritonclient.grpc.aio as grpcaio
import tritonclient.http.aio as httpaio
from tritonclient.utils import InferenceServerException

from nereid_util import gen_models, http_json, http_raw

EXTENSIONS = {"model_repository", "binary_tensor_data", "model_configuration", "statistics"}


def test_health_http_raw(server):
    for path in ("/v2/health/live", "/v2/health/ready"):
        status, _, body = http_raw(server.http_url, "GET", path)
        assert status == 200, path
        assert body == b"", f"{path} body should be empty, got {body!r}"


def test_health_clients(http_client, grpc_client):
    assert http_client.is_server_live() and http_client.is_server_ready()
    assert grpc_client.is_server_live() and grpc_client.is_server_ready()


def test_server_metadata(server, http_client, grpc_client):
    status, md = http_json(server.http_url, "GET", "/v2")
    assert status == 200
    assert isinstance(md["name"], str) and md["name"]
    assert isinstance(md["version"], str) and md["version"]
    assert EXTENSIONS <= set(md["extensions"]), md["extensions"]
    assert http_client.get_server_metadata() == md
    g = grpc_client.get_server_metadata()
    assert g.name == md["name"] and g.version == md["version"]
    assert list(g.extensions) == md["extensions"]


def test_model_metadata_batching(server, http_client, grpc_client):
    status, md = http_json(server.http_url, "GET", "/v2/models/simple")
    assert status == 200
    assert md["name"] == "simple"
    assert md["versions"] == ["1"]
    assert md["platform"] == "onnxruntime_onnx"
    assert md["inputs"] == [
        {"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]},
        {"name": "INPUT1", "datatype": "INT32", "shape": [-1, 16]},
    ]
    assert md["outputs"] == [
        {"name": "OUTPUT0", "datatype": "INT32", "shape": [-1, 16]},
        {"name": "OUTPUT1", "datatype": "INT32", "shape": [-1, 16]},
    ]
    assert http_client.get_model_metadata("simple") == md
    g = grpc_client.get_model_metadata("simple")
    assert g.name == "simple" and list(g.versions) == ["1"]
    assert [(t.name, t.datatype, list(t.shape)) for t in g.inputs] == [
        ("INPUT0", "INT32", [-1, 16]), ("INPUT1", "INT32", [-1, 16])]


def test_model_metadata_nobatch_and_version(server):
    status, md = http_json(server.http_url, "GET", "/v2/models/nobatch_fp32/versions/1")
    assert status == 200
    assert md["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [2, 3]}]


def test_model_metadata_datatypes(http_client):
    for wire in gen_models.DTYPES:
        md = http_client.get_model_metadata(gen_models.identity_name(wire))
        assert md["inputs"][0]["datatype"] == wire, md
        assert md["inputs"][0]["shape"] == [-1, -1], md


def test_versions_in_metadata(http_client):
    for name, (_, served) in gen_models.VERSION_POLICIES.items():
        md = http_client.get_model_metadata(name)
        assert sorted(md["versions"], key=int) == [str(v) for v in served], (name, md)


def test_model_ready(server, http_client, grpc_client):
    assert http_raw(server.http_url, "GET", "/v2/models/simple/ready")[0] == 200
    assert http_raw(server.http_url, "GET", "/v2/models/simple/versions/1/ready")[0] == 200
    assert http_client.is_model_ready("mlp") and grpc_client.is_model_ready("mlp")
    assert http_client.is_model_ready("versioned_all", "2")
    assert grpc_client.is_model_ready("versioned_all", "1")
    # Versions not served by the policy and models that failed to load are not ready.
    assert not http_client.is_model_ready("versioned_specific1", "3")
    assert not grpc_ready(grpc_client, "versioned_specific1", "3")
    for broken in gen_models.BROKEN_MODELS:
        assert not http_client.is_model_ready(broken), broken
        assert not grpc_ready(grpc_client, broken), broken


def grpc_ready(client, name, version=""):
    """gRPC ModelReady: ready=false, or NOT_FOUND for a version that is not served."""
    try:
        return client.is_model_ready(name, version)
    except InferenceServerException as e:
        assert e.status() == "StatusCode.NOT_FOUND", e
        return False


def test_model_ready_unknown(server):
    """An unknown model or version is simply not ready, as in Triton 2.51 (test_triton_diff)."""
    for path in ("/v2/models/no_such_model/ready", "/v2/models/simple/versions/42/ready"):
        status, _, body = http_raw(server.http_url, "GET", path)
        assert (status, json.loads(body)) == (400, {"error": "Model version not ready"}), body


def test_aio_clients(server):
    async def run():
        h = httpaio.InferenceServerClient(server.http_url)
        g = grpcaio.InferenceServerClient(server.grpc_url)
        try:
            assert await h.is_server_live() and await h.is_server_ready()
            assert await g.is_server_live() and await g.is_server_ready()
            assert await h.is_model_ready("simple") and await g.is_model_ready("simple")
            assert (await h.get_server_metadata())["extensions"]
            assert (await h.get_model_metadata("mlp"))["inputs"][0]["shape"] == [-1, 4]
            gm = await g.get_model_metadata("mlp")
            assert list(gm.outputs[0].shape) == [-1, 3]
        finally:
            await h.close()
            await g.close()

    asyncio.run(asyncio.wait_for(run(), 60))
