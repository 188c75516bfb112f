"""Response parameters of Python models reach clients and BLS callers, as in newer Triton.

One server on a repository written here:
- `py_resp_params`  default mode: answers with `InferenceResponse(..., parameters={...})` built
                    from its input n (a string, an int and a bool);
- `py_resp_cached`  the same model with the response cache on: a hit keeps the parameters;
- `py_resp_stream`  decoupled: n responses, response i carrying {"index": i, "last": i == n-1}
                    (over gRPC `ModelStreamInfer` and HTTP `generate_stream`);
- `py_resp_bls`     calls `py_resp_params` through BLS and answers with what the callee's
                    `response.parameters()` said (a JSON string in OUT).
"""

import json
import queue
import textwrap

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from nereid_util import http_json, http_raw, managed_server

PB = "import json\nimport numpy as np\nimport triton_python_backend_utils as pb_utils\n"

DEFAULT = PB + textwrap.dedent("""
    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for r in requests:
                n = int(pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()[0])
                out.append(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUT", np.array([n * 2], dtype=np.int32))],
                    parameters={"note": f"n={n}", "n": n, "even": n % 2 == 0}))
            return out
    """)

STREAM = PB + textwrap.dedent("""
    class TritonPythonModel:
        def execute(self, requests):
            for r in requests:
                n = int(pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()[0])
                sender = r.get_response_sender()
                for i in range(n):
                    sender.send(pb_utils.InferenceResponse(
                        [pb_utils.Tensor("OUT", np.array([i], dtype=np.int32))],
                        parameters={"index": i, "last": i == n - 1}))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None
    """)

BLS = PB + textwrap.dedent("""
    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for r in requests:
                call = pb_utils.InferenceRequest(
                    model_name="py_resp_params", requested_output_names=["OUT"],
                    inputs=[pb_utils.get_input_tensor_by_name(r, "IN")])
                response = call.exec()
                if response.has_error():
                    raise pb_utils.TritonModelException(response.error().message())
                seen = json.loads(response.parameters())
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array(
                    [json.dumps(seen, sort_keys=True).encode()], dtype=np.object_))]))
            return out
    """)


def config(name, out_type, decoupled=False, cached=False):
    policy = "model_transaction_policy { decoupled: true }" if decoupled else ""
    cache = "response_cache { enable: true }" if cached else ""
    return textwrap.dedent(f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 0
        input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
        output [ {{ name: "OUT" data_type: {out_type} dims: [ 1 ] }} ]
        instance_group [ {{ count: 1 kind: KIND_CPU }} ]
        {policy}
        {cache}
        """)


MODELS = {
    "py_resp_params": (DEFAULT, config("py_resp_params", "TYPE_INT32")),
    "py_resp_cached": (DEFAULT, config("py_resp_cached", "TYPE_INT32", cached=True)),
    "py_resp_stream": (STREAM, config("py_resp_stream", "TYPE_INT32", decoupled=True)),
    "py_resp_bls": (BLS, config("py_resp_bls", "TYPE_STRING")),
}


@pytest.fixture(scope="module")
def resp_server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("resp_params_repo")
    for name, (code, cfg) in MODELS.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(code)
        (repo / name / "config.pbtxt").write_text(cfg)
    args = ["--cache-config", "local,size=1048576"]
    yield from managed_server(repo, tmp_path_factory.mktemp("logs"), args, "server_resp_params")


def int_input(module, n):
    inp = module.InferInput("IN", [1], "INT32")
    inp.set_data_from_numpy(np.array([n], dtype=np.int32))
    return inp


def grpc_parameters(parameters):
    """A gRPC response's parameters map as plain Python values."""
    return {k: getattr(v, v.WhichOneof("parameter_choice")) for k, v in parameters.items()}


def test_default_mode_parameters_reach_http_clients(resp_server):
    body = {"inputs": [{"name": "IN", "datatype": "INT32", "shape": [1], "data": [3]}]}
    status, answer = http_json(resp_server.http_url, "POST", "/v2/models/py_resp_params/infer",
                               body)
    assert status == 200, answer
    assert answer["outputs"][0]["data"] == [6]
    assert answer["parameters"] == {"note": "n=3", "n": 3, "even": False}


def test_default_mode_parameters_reach_grpc_clients(resp_server):
    client = grpcclient.InferenceServerClient(resp_server.grpc_url)
    result = client.infer("py_resp_params", [int_input(grpcclient, 4)], client_timeout=30)
    assert int(result.as_numpy("OUT")[0]) == 8
    assert grpc_parameters(result.get_response().parameters) == {
        "note": "n=4", "n": 4, "even": True}


def test_a_cached_response_keeps_its_parameters(resp_server):
    body = {"inputs": [{"name": "IN", "datatype": "INT32", "shape": [1], "data": [7]}]}
    answers = [http_json(resp_server.http_url, "POST", "/v2/models/py_resp_cached/infer", body)
               for _ in range(2)]
    status, stats = http_json(resp_server.http_url, "GET", "/v2/models/py_resp_cached/stats")
    assert status == 200, stats
    inference = stats["model_stats"][0]["inference_stats"]
    assert (inference["cache_miss"]["count"], inference["cache_hit"]["count"]) == (1, 1)
    for status, answer in answers:
        assert status == 200, answer
        assert answer["parameters"] == {"note": "n=7", "n": 7, "even": False}


def test_decoupled_responses_carry_their_own_parameters_over_grpc_stream(resp_server):
    client = grpcclient.InferenceServerClient(resp_server.grpc_url)
    results = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer("py_resp_stream", [int_input(grpcclient, 3)], request_id="s")
        got = []
        for _ in range(3):
            result, error = results.get(timeout=30)
            assert error is None, error
            params = grpc_parameters(result.get_response().parameters)
            # The gRPC frontend adds Triton's final-response flag; the model's keys are kept.
            params.pop("triton_final_response", None)
            got.append((int(result.as_numpy("OUT")[0]), params))
    finally:
        client.stop_stream()
    assert got == [
        (0, {"index": 0, "last": False}),
        (1, {"index": 1, "last": False}),
        (2, {"index": 2, "last": True}),
    ]


def test_decoupled_responses_carry_their_parameters_over_generate_stream(resp_server):
    status, _, body = http_raw(
        resp_server.http_url, "POST", "/v2/models/py_resp_stream/generate_stream",
        body=json.dumps({"IN": 2}).encode(), headers={"Content-Type": "application/json"})
    assert status == 200, body
    events = [json.loads(line[len(b"data: "):]) for line in body.split(b"\n\n")
              if line.startswith(b"data: ")]
    assert [(e["OUT"], e["index"], e["last"]) for e in events] == [(0, 0, False), (1, 1, True)]


def test_bls_callers_see_the_callee_response_parameters(resp_server):
    client = grpcclient.InferenceServerClient(resp_server.grpc_url)
    result = client.infer("py_resp_bls", [int_input(grpcclient, 5)], client_timeout=30)
    seen = json.loads(result.as_numpy("OUT")[0].decode())
    assert seen == {"note": "n=5", "n": 5, "even": False}
