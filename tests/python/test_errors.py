"""Bad requests over HTTP (raw stdlib calls) and gRPC: status codes and messages that name the
model, tensor or field. The last test checks the server still serves afterwards."""

import json

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from nereid_util import assert_http_error, http_json, http_raw, managed_server

ONES16 = [1] * 16


def simple_json(in0=None, in1=None, **over):
    body = {"inputs": [
        {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": in0 or ONES16},
        {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": in1 or ONES16},
    ]}
    body.update(over)
    return body


def post_infer(server, model, body, headers=None, version=None):
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
    return http_json(server.http_url, "POST", path, body, headers)


def binary_request(header, *chunks, header_len=None):
    h = json.dumps(header).encode()
    body = h + b"".join(chunks)
    hl = len(h) if header_len is None else header_len
    return body, {"Inference-Header-Content-Length": str(hl),
                  "Content-Type": "application/octet-stream"}


def binary_simple_header(size0=64, size1=64):
    return {"inputs": [
        {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32",
         "parameters": {"binary_data_size": size0}},
        {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32",
         "parameters": {"binary_data_size": size1}}]}


RAW16 = np.ones(16, np.int32).tobytes()


def test_good_request_baseline(server):
    status, body = post_infer(server, "simple", simple_json())
    assert status == 200, body
    assert body["outputs"][0]["data"] == [2] * 16


def test_unknown_model(server):
    r = post_infer(server, "no_such_model", simple_json())
    assert_http_error(r, 404, "no_such_model")


def test_unknown_version(server):
    r = post_infer(server, "simple", simple_json(), version="7")
    assert_http_error(r, 404, "simple", "7")


def test_wrong_shape(server):
    body = simple_json()
    body["inputs"][0]["shape"] = [1, 8]
    body["inputs"][0]["data"] = [1] * 8
    assert_http_error(post_infer(server, "simple", body), 400, "INPUT0", "simple")


def test_wrong_datatype(server):
    body = simple_json()
    body["inputs"][1]["datatype"] = "FP32"
    assert_http_error(post_infer(server, "simple", body), 400, "INPUT1", "simple")


def test_wrong_element_count_json(server):
    """Data that does not fill the shape: Triton 2.51's code and words (test_triton_diff)."""
    body = simple_json(in0=[1] * 15)
    assert_http_error(post_infer(server, "simple", body), 500,
                      "Unable to parse 'data': Shape does not match true shape of 'data' field")


def test_missing_and_unknown_input(server):
    body = simple_json()
    del body["inputs"][1]
    assert_http_error(post_infer(server, "simple", body), 400, "INPUT1", "simple")
    body = simple_json()
    body["inputs"][1]["name"] = "NOPE"
    assert_http_error(post_infer(server, "simple", body), 400, "NOPE", "simple")


def test_unknown_output(server):
    body = simple_json(outputs=[{"name": "BOGUS_OUT"}])
    assert_http_error(post_infer(server, "simple", body), 400, "BOGUS_OUT")


def test_batch_too_large(server):
    body = simple_json()
    for i in body["inputs"]:
        i["shape"], i["data"] = [9, 16], [1] * 144
    assert_http_error(post_infer(server, "simple", body), 400, "simple")


def test_fp16_in_json_rejected(server):
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP16",
                        "data": [1.0, 2.0]}]}
    assert_http_error(post_infer(server, "identity_fp16", body), 400)


def test_malformed_json(server):
    """A body that is not JSON: 500 with Triton 2.51's prefix (test_triton_diff); JSON that is
    not an object: a 400 that says so."""
    status, _, data = http_raw(server.http_url, "POST", "/v2/models/simple/infer",
                               b'{"inputs": [ {"name": ', {"Content-Type": "application/json"})
    assert_http_error((status, data), 500, "failed to parse the request JSON buffer: ")
    status, _, data = http_raw(server.http_url, "POST", "/v2/models/simple/infer", b"[1, 2]")
    assert_http_error((status, data), 400)


def test_wrong_field_type(server):
    body = simple_json()
    body["inputs"][0]["shape"] = "1,16"
    assert_http_error(post_infer(server, "simple", body), 400, "shape")


def test_binary_good_then_truncated(server):
    body, hdrs = binary_request(binary_simple_header(), RAW16, RAW16)
    status, _, data = http_raw(server.http_url, "POST", "/v2/models/simple/infer", body, hdrs)
    assert status == 200, data
    # binary_data_size larger than what remains.
    body, hdrs = binary_request(binary_simple_header(), RAW16, RAW16[:40])
    status, _, data = http_raw(server.http_url, "POST", "/v2/models/simple/infer", body, hdrs)
    assert_http_error((status, data), 400, "INPUT1")
    # Inference-Header-Content-Length larger than the body.
    body, hdrs = binary_request(binary_simple_header(), RAW16, RAW16, header_len=100000)
    status, _, data = http_raw(server.http_url, "POST", "/v2/models/simple/infer", body, hdrs)
    assert_http_error((status, data), 400)
    # Not a number.
    hdrs["Inference-Header-Content-Length"] = "abc"
    status, _, data = http_raw(server.http_url, "POST", "/v2/models/simple/infer", body, hdrs)
    assert_http_error((status, data), 400)


def test_binary_size_mismatch_and_leftover(server):
    # binary_data_size disagrees with the shape (60 bytes for 16 INT32).
    body, hdrs = binary_request(binary_simple_header(60, 68), RAW16[:60], RAW16 + b"\0" * 4)
    status, _, data = http_raw(server.http_url, "POST", "/v2/models/simple/infer", body, hdrs)
    assert_http_error((status, data), 400, "INPUT0")
    # Extra bytes after the last input.
    body, hdrs = binary_request(binary_simple_header(), RAW16, RAW16, b"extra")
    status, _, data = http_raw(server.http_url, "POST", "/v2/models/simple/infer", body, hdrs)
    assert_http_error((status, data), 400, "simple")


def test_two_data_sources_rejected(server):
    header = binary_simple_header()
    header["inputs"][0]["data"] = ONES16
    body, hdrs = binary_request(header, RAW16, RAW16)
    status, _, data = http_raw(server.http_url, "POST", "/v2/models/simple/infer", body, hdrs)
    assert_http_error((status, data), 400)


def test_unknown_route_and_wrong_method(server):
    for path in ("/v3/models", "/v2/models/simple/bogus", "/nothing", "/v2/health/sick"):
        status, _, data = http_raw(server.http_url, "GET", path)
        assert status == 404, (path, data)
        assert "error" in json.loads(data), (path, data)
    for method, path in (("GET", "/v2/models/simple/infer"), ("POST", "/v2/health/live"),
                         ("DELETE", "/v2"), ("GET", "/v2/repository/index"),
                         ("PUT", "/v2/models/simple/config")):
        status, _, data = http_raw(server.http_url, method, path, b"" if method != "GET" else None)
        assert status == 405, (method, path, status, data)
        assert "error" in json.loads(data), (method, path, data)


def test_error_content_type(server):
    body = json.dumps(simple_json()).encode()
    status, hdrs, _ = http_raw(server.http_url, "POST", "/v2/models/nope/infer", body)
    assert status == 404
    assert hdrs.get("content-type", "").startswith("application/json"), hdrs
    status, hdrs, _ = http_raw(server.http_url, "POST", "/v2/models/simple/infer", b"{")
    assert status == 500  # as Triton: the request JSON does not parse
    assert hdrs.get("content-type", "").startswith("application/json"), hdrs


def test_unknown_model_checked_before_body(server):
    """Triton looks the model up (CheckTransactionPolicy) before it parses the body."""
    status, _, data = http_raw(server.http_url, "POST", "/v2/models/nope/infer", b"{}")
    assert_http_error((status, data), 404, "nope")
    status, _, data = http_raw(server.http_url, "POST", "/v2/models/nope/infer", b"not json")
    assert_http_error((status, data), 404, "nope")


def test_reserved_triton_parameter(server):
    r = post_infer(server, "simple", simple_json(parameters={"triton_foo": 1}))
    assert_http_error(r, 400, "triton_")


# ---------------------------------------------------------------------------------------------
# gRPC


def grpc_input(name, arr, dtype):
    i = grpcclient.InferInput(name, list(arr.shape), dtype)
    i.set_data_from_numpy(arr)
    return i


def grpc_expect(client, code, model, inputs, *needles, **kw):
    with pytest.raises(InferenceServerException) as e:
        client.infer(model, inputs, **kw)
    assert e.value.status() == f"StatusCode.{code}", e.value
    for n in needles:
        assert n in e.value.message(), (n, e.value.message())


def test_grpc_errors(grpc_client):
    ok = np.ones((1, 16), np.int32)
    good = [grpc_input("INPUT0", ok, "INT32"), grpc_input("INPUT1", ok, "INT32")]
    grpc_expect(grpc_client, "NOT_FOUND", "no_such_model", good, "no_such_model")
    grpc_expect(grpc_client, "NOT_FOUND", "simple", good, "simple", model_version="9")
    bad_shape = [grpc_input("INPUT0", np.ones((1, 8), np.int32), "INT32"), good[1]]
    grpc_expect(grpc_client, "INVALID_ARGUMENT", "simple", bad_shape, "INPUT0")
    bad_type = [good[0], grpc_input("INPUT1", np.ones((1, 16), np.float32), "FP32")]
    grpc_expect(grpc_client, "INVALID_ARGUMENT", "simple", bad_type, "INPUT1")
    grpc_expect(grpc_client, "INVALID_ARGUMENT", "simple", good[:1], "INPUT1")
    grpc_expect(grpc_client, "INVALID_ARGUMENT", "simple", good, "triton_",
                parameters={"triton_x": 1})
    big = [grpc_input(n, np.ones((9, 16), np.int32), "INT32") for n in ("INPUT0", "INPUT1")]
    grpc_expect(grpc_client, "INVALID_ARGUMENT", "simple", big, "simple")


def test_grpc_raw_errors(server):
    with grpc.insecure_channel(server.grpc_url) as ch:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(ch)

        def call(req):
            with pytest.raises(grpc.RpcError) as e:
                stub.ModelInfer(req, timeout=30)
            return e.value

        # Raw bytes of the wrong size for the shape.
        req = service_pb2.ModelInferRequest(model_name="simple")
        for n in ("INPUT0", "INPUT1"):
            req.inputs.add(name=n, datatype="INT32", shape=[1, 16])
        req.raw_input_contents.extend([RAW16, RAW16[:60]])
        err = call(req)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "INPUT1" in err.details()
        # Typed contents and raw contents mixed.
        req = service_pb2.ModelInferRequest(model_name="simple")
        t0 = req.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 16])
        t0.contents.int_contents.extend(ONES16)
        req.inputs.add(name="INPUT1", datatype="INT32", shape=[1, 16])
        req.raw_input_contents.extend([RAW16, RAW16])
        assert call(req).code() == grpc.StatusCode.INVALID_ARGUMENT
        # Wrong typed-contents count.
        req = service_pb2.ModelInferRequest(model_name="simple")
        for n in ("INPUT0", "INPUT1"):
            req.inputs.add(name=n, datatype="INT32", shape=[1, 16]).contents.int_contents.extend(
                [1] * 15)
        assert call(req).code() == grpc.StatusCode.INVALID_ARGUMENT
        # Unknown model in metadata / config calls.
        for rpc, msg in ((stub.ModelMetadata, service_pb2.ModelMetadataRequest(name="zz")),
                         (stub.ModelConfig, service_pb2.ModelConfigRequest(name="zz"))):
            with pytest.raises(grpc.RpcError) as e:
                rpc(msg, timeout=30)
            assert e.value.code() == grpc.StatusCode.NOT_FOUND and "zz" in e.value.details()


# ---------------------------------------------------------------------------------------------
# Oversized body: its own server with a 1 MiB limit.


@pytest.fixture(scope="module")
def small_server(test_repo, tmp_path_factory):
    yield from managed_server(test_repo, tmp_path_factory.mktemp("logs"),
                        ["--http-max-input-size", str(1 << 20)], "server_small_input")


def test_oversized_body(small_server):
    n = (2 << 20) // 4  # 2 MiB of FP32
    header = {"inputs": [{"name": "INPUT0", "shape": [1, n], "datatype": "FP32",
                          "parameters": {"binary_data_size": n * 4}}]}
    body, hdrs = binary_request(header, np.zeros(n, np.float32).tobytes())
    status, _, data = http_raw(small_server.http_url, "POST",
                               "/v2/models/identity_fp32/infer", body, hdrs)
    assert status == 400, (status, data[:200])
    assert "error" in json.loads(data)
    # Under the limit still works, and the server is fine.
    small = {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32",
                         "data": [1, 2, 3, 4]}]}
    status, body = http_json(small_server.http_url, "POST", "/v2/models/identity_fp32/infer",
                             small)
    assert status == 200 and body["outputs"][0]["data"] == [1, 2, 3, 4]


def test_zz_server_healthy_after_errors(server, grpc_client):
    assert http_raw(server.http_url, "GET", "/v2/health/ready")[0] == 200
    test_good_request_baseline(server)
    ok = np.full((1, 16), 2, np.int32)
    res = grpc_client.infer("simple", [grpc_input("INPUT0", ok, "INT32"),
                                       grpc_input("INPUT1", ok, "INT32")])
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), ok * 2)
