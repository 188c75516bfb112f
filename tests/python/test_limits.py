"""Request-level resource limits: `--max-request-inputs`, `--max-request-outputs`,
`--max-tensor-elements` (checked on the declared shape before any data is read, the same check
for HTTP and gRPC), `--grpc-max-message-size` and `--grpc-stream-buffer`. A request beyond a
limit gets HTTP 400 / gRPC INVALID_ARGUMENT naming the limit, the flag and the value seen, and
the server keeps serving.
"""

import queue
import subprocess

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from nereid_util import NEREID_BIN, assert_http_error, http_json, http_raw, managed_server

LIMITS = ["--max-request-inputs", "2", "--max-request-outputs", "2",
          "--max-tensor-elements", "1000", "--grpc-max-message-size", str(1 << 20),
          "--grpc-stream-buffer", "4"]
TOO_MANY_INPUTS = "request has 3 inputs; the server accepts at most 2 (--max-request-inputs)"
TOO_MANY_OUTPUTS = ("request asks for 3 outputs; the server accepts at most 2 "
                    "(--max-request-outputs)")


def too_many_elements(shape, count):
    dims = ",".join(str(d) for d in shape)
    return (f"input 'INPUT0' for model 'identity_fp32' has {count} elements (shape [{dims}]); "
            "the server accepts at most 1000 per tensor (--max-tensor-elements)")


@pytest.fixture(scope="module")
def limited(test_repo, tmp_path_factory):
    yield from managed_server(test_repo, tmp_path_factory.mktemp("logs"), LIMITS,
                              "server_limits")


def simple_inputs(module, extra=0):
    inputs = []
    for name in ["INPUT0", "INPUT1"] + [f"EXTRA{i}" for i in range(extra)]:
        i = module.InferInput(name, [1, 16], "INT32")
        i.set_data_from_numpy(np.ones((1, 16), np.int32))
        inputs.append(i)
    return inputs


def simple_json(extra_inputs=0, outputs=None):
    names = ["INPUT0", "INPUT1"] + [f"EXTRA{i}" for i in range(extra_inputs)]
    body = {"inputs": [{"name": n, "shape": [1, 16], "datatype": "INT32", "data": [1] * 16}
                       for n in names]}
    if outputs is not None:
        body["outputs"] = [{"name": n} for n in outputs]
    return body


def fp32_json(shape, data):
    return {"inputs": [{"name": "INPUT0", "shape": shape, "datatype": "FP32", "data": data}]}


def still_serving(server):
    status, body = http_json(server.http_url, "POST", "/v2/models/simple/infer", simple_json())
    assert status == 200 and body["outputs"][0]["data"] == [2] * 16, body
    c = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        result = c.infer("simple", simple_inputs(grpcclient))
        assert (result.as_numpy("OUTPUT0") == 2).all()
    finally:
        c.close()


def grpc_raw_infer(server, request):
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as e:
            stub.ModelInfer(request, timeout=30)
    return e.value.code(), e.value.details()


def fp32_grpc(shape, data):
    return service_pb2.ModelInferRequest(
        model_name="identity_fp32",
        inputs=[service_pb2.ModelInferRequest.InferInputTensor(
            name="INPUT0", datatype="FP32", shape=shape)],
        raw_input_contents=[np.asarray(data, np.float32).tobytes()])


def test_at_the_limits_requests_pass(limited):
    body = simple_json(outputs=["OUTPUT0", "OUTPUT1"])
    status, answer = http_json(limited.http_url, "POST", "/v2/models/simple/infer", body)
    assert status == 200 and len(answer["outputs"]) == 2, answer
    status, answer = http_json(limited.http_url, "POST", "/v2/models/identity_fp32/infer",
                               fp32_json([1, 1000], [1.0] * 1000))
    assert status == 200 and answer["outputs"][0]["shape"] == [1, 1000], answer


def test_too_many_inputs(limited):
    answer = http_json(limited.http_url, "POST", "/v2/models/simple/infer", simple_json(1))
    assert answer[1] == {"error": TOO_MANY_INPUTS}
    assert_http_error(answer, 400, TOO_MANY_INPUTS)
    with httpclient.InferenceServerClient(limited.http_url) as c:
        with pytest.raises(InferenceServerException) as e:
            c.infer("simple", simple_inputs(httpclient, extra=1))
        assert e.value.status() == "400" and e.value.message() == TOO_MANY_INPUTS
    c = grpcclient.InferenceServerClient(limited.grpc_url)
    try:
        with pytest.raises(InferenceServerException) as e:
            c.infer("simple", simple_inputs(grpcclient, extra=1))
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert e.value.message() == TOO_MANY_INPUTS
    finally:
        c.close()
    still_serving(limited)


def test_too_many_outputs(limited):
    outputs = ["OUTPUT0", "OUTPUT1", "OUTPUT0"]
    answer = http_json(limited.http_url, "POST", "/v2/models/simple/infer",
                       simple_json(outputs=outputs))
    assert_http_error(answer, 400, TOO_MANY_OUTPUTS)
    c = grpcclient.InferenceServerClient(limited.grpc_url)
    try:
        requested = [grpcclient.InferRequestedOutput(n) for n in ("OUTPUT0", "OUTPUT1", "X")]
        with pytest.raises(InferenceServerException) as e:
            c.infer("simple", simple_inputs(grpcclient), outputs=requested)
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert e.value.message() == TOO_MANY_OUTPUTS
    finally:
        c.close()
    still_serving(limited)


def test_too_many_tensor_elements_on_the_declared_shape(limited):
    url = limited.http_url
    # Refused on the shape alone: the data (too short, or absent) is never looked at.
    for shape, count in [([1, 1001], 1001), ([2, 1 << 40], 2 << 40)]:
        expected = too_many_elements(shape, count)
        assert_http_error(http_json(url, "POST", "/v2/models/identity_fp32/infer",
                                    fp32_json(shape, [1.0])), 400, expected)
        code, details = grpc_raw_infer(limited, fp32_grpc(shape, [1.0]))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and details == expected, details
    # A product that overflows 64 bits is an error of its own.
    huge = [1 << 62, 1 << 62]
    answer = http_json(url, "POST", "/v2/models/identity_fp32/infer", fp32_json(huge, [1.0]))
    assert_http_error(answer, 400, "overflows 64 bits", "--max-tensor-elements")
    code, details = grpc_raw_infer(limited, fp32_grpc(huge, [1.0]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT, details
    assert "overflows 64 bits" in details and "--max-tensor-elements" in details
    # A binary (tensor extension) input is checked before its bytes are sliced.
    header = b'{"inputs":[{"name":"INPUT0","shape":[1,1001],"datatype":"FP32",' \
             b'"parameters":{"binary_data_size":4004}}]}'
    status, _, data = http_raw(url, "POST", "/v2/models/identity_fp32/infer",
                               header + bytes(4004),
                               {"Inference-Header-Content-Length": str(len(header))})
    assert_http_error((status, data), 400, too_many_elements([1, 1001], 1001))
    still_serving(limited)


def test_limits_on_a_stream_answer_in_band_and_keep_it_open(limited):
    results = queue.Queue()
    c = grpcclient.InferenceServerClient(limited.grpc_url)
    try:
        c.start_stream(callback=lambda result, error: results.put((result, error)))
        c.async_stream_infer("simple", simple_inputs(grpcclient, extra=1))
        _, error = results.get(timeout=30)
        assert error is not None and TOO_MANY_INPUTS in str(error), error
        c.async_stream_infer("simple", simple_inputs(grpcclient))
        result, error = results.get(timeout=30)
        assert error is None and (result.as_numpy("OUTPUT0") == 2).all()
        c.stop_stream()
    finally:
        c.close()


def test_grpc_max_message_size(limited):
    n = (1 << 20) // 4 + 16  # a little over 1 MiB of FP32
    c = grpcclient.InferenceServerClient(limited.grpc_url)
    try:
        x = grpcclient.InferInput("INPUT0", [1, n], "FP32")
        x.set_data_from_numpy(np.zeros((1, n), np.float32))
        with pytest.raises(InferenceServerException) as e:
            c.infer("identity_fp32", [x])
        assert e.value.status() == "StatusCode.OUT_OF_RANGE", e.value
        assert f"the limit is: {1 << 20} bytes" in e.value.message(), e.value
    finally:
        c.close()
    still_serving(limited)


def test_defaults_accept_a_large_request(server):
    # The default element limit (INT32_MAX) and input count (1024) are far from everyday use.
    n = 100_000
    status, body = http_json(server.http_url, "POST", "/v2/models/identity_fp32/infer",
                             fp32_json([1, n], [0.5] * n))
    assert status == 200 and body["outputs"][0]["shape"] == [1, n]


@pytest.mark.parametrize("flag", ["--max-request-inputs", "--max-request-outputs",
                                  "--max-tensor-elements", "--grpc-max-message-size",
                                  "--grpc-stream-buffer"])
def test_zero_limits_are_refused_at_startup(test_repo, flag):
    proc = subprocess.run([NEREID_BIN, "serve", "--model-repository", str(test_repo),
                           "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0",
                           "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1",
                           "--metrics-address", "127.0.0.1", flag, "0"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert f"{flag} must be at least 1" in proc.stdout + proc.stderr
