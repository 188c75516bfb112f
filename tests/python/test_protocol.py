"""Wire details of the HTTP binary-data extension, compression, gRPC streaming and the
client-shared-memory default, checked byte for byte where Triton fixes them."""

import gzip
import json
import queue
import zlib

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from nereid_util import assert_http_error, http_json, http_raw

X16 = np.arange(16, dtype=np.int32)


def simple_binary_request(outputs=None, params=None):
    header = {"inputs": [
        {"name": n, "shape": [1, 16], "datatype": "INT32", "parameters": {"binary_data_size": 64}}
        for n in ("INPUT0", "INPUT1")]}
    if outputs is not None:
        header["outputs"] = outputs
    if params:
        header["parameters"] = params
    h = json.dumps(header).encode()
    return h + X16.tobytes() + (X16 * 2).tobytes(), {"Inference-Header-Content-Length": str(len(h))}


def split_binary_response(hdrs, body):
    assert hdrs.get("content-type") == "application/octet-stream", hdrs
    n = int(hdrs["inference-header-content-length"])
    assert int(hdrs["content-length"]) == len(body)
    return json.loads(body[:n]), body[n:]


def test_binary_response_layout(server):
    body, hdrs = simple_binary_request(outputs=[
        {"name": "OUTPUT1", "parameters": {"binary_data": True}},
        {"name": "OUTPUT0", "parameters": {"binary_data": False}}])
    status, rh, data = http_raw(server.http_url, "POST", "/v2/models/simple/infer", body, hdrs)
    assert status == 200, data
    header, tail = split_binary_response(rh, data)
    assert header["model_name"] == "simple" and header["model_version"] == "1"
    outs = {o["name"]: o for o in header["outputs"]}
    assert outs["OUTPUT1"]["parameters"]["binary_data_size"] == 64
    assert "data" not in outs["OUTPUT1"]
    assert outs["OUTPUT0"]["data"] == (X16 * 3).tolist()
    assert outs["OUTPUT0"]["shape"] == [1, 16] and outs["OUTPUT0"]["datatype"] == "INT32"
    np.testing.assert_array_equal(np.frombuffer(tail, np.int32), X16 - X16 * 2)


def test_request_level_binary_data_output(server):
    body, hdrs = simple_binary_request(params={"binary_data_output": True})
    status, rh, data = http_raw(server.http_url, "POST", "/v2/models/simple/infer", body, hdrs)
    assert status == 200, data
    header, tail = split_binary_response(rh, data)
    sizes = [o["parameters"]["binary_data_size"] for o in header["outputs"]]
    assert sizes == [64, 64] and len(tail) == 128
    # Binary outputs follow in the order the JSON header lists them.
    order = [o["name"] for o in header["outputs"]]
    got = dict(zip(order, (np.frombuffer(tail[:64], np.int32), np.frombuffer(tail[64:], np.int32))))
    np.testing.assert_array_equal(got["OUTPUT0"], X16 * 3)
    np.testing.assert_array_equal(got["OUTPUT1"], -X16)


def test_json_only_response(server):
    status, rh, data = http_raw(server.http_url, "POST", "/v2/models/simple/infer",
                                json.dumps({"inputs": [
                                    {"name": n, "shape": [1, 16], "datatype": "INT32",
                                     "data": X16.tolist()} for n in ("INPUT0", "INPUT1")]}).encode())
    assert status == 200
    assert rh.get("content-type", "").startswith("application/json"), rh
    assert "inference-header-content-length" not in rh
    body = json.loads(data)
    assert "id" not in body  # no id in the request: none in the response
    assert body["outputs"][0]["data"] == (X16 * 2).tolist()


def test_raw_binary_request(server):
    """Inference-Header-Content-Length: 0 -> the body is the single input's raw bytes."""
    x = np.array([1.5, -2.0, 3.25, 0.0], np.float32)
    status, rh, data = http_raw(server.http_url, "POST", "/v2/models/identity_fp32/infer",
                                x.tobytes(), {"Inference-Header-Content-Length": "0"})
    assert status == 200, data
    header, tail = split_binary_response(rh, data)
    assert header["outputs"][0]["shape"] == [1, 4], header
    np.testing.assert_array_equal(np.frombuffer(tail, np.float32), x)


@pytest.mark.parametrize("algo", ["gzip", "deflate"])
def test_http_compression(http_client, algo):
    inputs = []
    for n in ("INPUT0", "INPUT1"):
        i = httpclient.InferInput(n, [1, 16], "INT32")
        i.set_data_from_numpy(X16.reshape(1, 16))
        inputs.append(i)
    res = http_client.infer("simple", inputs, request_compression_algorithm=algo,
                            response_compression_algorithm=algo)
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), (X16 * 2).reshape(1, 16))


def test_http_compressed_raw(server):
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 3], "datatype": "FP32",
                                   "data": [1, 2, 3]}]}).encode()
    status, rh, data = http_raw(server.http_url, "POST", "/v2/models/identity_fp32/infer",
                                gzip.compress(body), {"Content-Encoding": "gzip",
                                                      "Accept-Encoding": "deflate"})
    assert status == 200, data
    assert rh.get("content-encoding") == "deflate", rh
    try:
        plain = zlib.decompress(data)
    except zlib.error:
        plain = zlib.decompress(data, -zlib.MAX_WBITS)
    assert json.loads(plain)["outputs"][0]["data"] == [1, 2, 3]


@pytest.mark.parametrize("algo", ["gzip", "deflate"])
def test_grpc_compression(grpc_client, algo):
    """Compressed requests, as Triton accepts them (`grpc-encoding: gzip` or `deflate`)."""
    i = grpcclient.InferInput("x", [1, 4], "FP32")
    i.set_data_from_numpy(np.ones((1, 4), np.float32))
    res = grpc_client.infer("mlp", [i], compression_algorithm=algo)
    assert res.as_numpy("y").shape == (1, 3)


def test_grpc_stream_infer_serves_plain_models(server):
    """ModelStreamInfer on a model that is not decoupled: one response per request, each
    flagged final; a bad request answers on the stream and the stream stays usable."""
    results = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        for n in range(3):
            i = grpcclient.InferInput("INPUT0", [1, 3], "INT32")
            i.set_data_from_numpy(np.array([[n, n, n]], np.int32))
            client.async_stream_infer("versioned_all", [i], request_id=f"s{n}")
        bad = grpcclient.InferInput("NOPE", [1, 3], "INT32")
        bad.set_data_from_numpy(np.zeros((1, 3), np.int32))
        client.async_stream_infer("versioned_all", [bad], request_id="bad")
        ok, errors = {}, []
        for _ in range(4):
            result, error = results.get(timeout=30)
            if error is not None:
                errors.append(error.message())
                continue
            response = result.get_response()
            assert response.parameters["triton_final_response"].bool_param is True
            ok[response.id] = result.as_numpy("OUTPUT0").tolist()
        assert sorted(ok) == ["s0", "s1", "s2"]
        assert len(errors) == 1 and "NOPE" in errors[0], errors
    finally:
        client.stop_stream()
        client.close()
    assert grpcclient.InferenceServerClient(server.grpc_url).is_server_live()


def test_client_shared_memory_register_of_a_missing_key(server, grpc_client):
    """System shared memory is served (test_shared_memory.py); a key that names no shared memory
    object is the client's mistake. CUDA shared memory is served (no regions here; its
    registrations are in test_cuda_shared_memory.py)."""
    r = http_json(server.http_url, "POST", "/v2/systemsharedmemory/region/r0/register",
                  {"key": "/nereid_test_missing", "offset": 0, "byte_size": 64})
    assert_http_error(r, 400, "Unable to open shared memory region: '/nereid_test_missing'")
    with pytest.raises(InferenceServerException) as e:
        grpc_client.register_system_shared_memory("r0", "/nereid_test_missing", 64)
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    r = http_raw(server.http_url, "GET", "/v2/cudasharedmemory/status")
    assert r[0] == 200 and json.loads(r[2]) == [], r
