"""Request parameters of Python models, from a client and through BLS, against Triton 2.51.

- `py_params` answers with the parameters its request carried (as JSON in OUT).
- `py_params_bls` calls `py_params` through BLS with request parameters of its own and answers
  with what the callee saw.

The same repository runs on Nereid and on the real Triton 2.51; what each model saw must be equal.
(Response parameters are not compared: Triton 2.51's `InferenceResponse` takes none.)
"""

import json
import textwrap
from pathlib import Path

import pytest

from nereid_util import http_json

PARAMS = textwrap.dedent("""
    import json
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for r in requests:
                seen = json.loads(r.parameters())
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array(
                    [json.dumps(seen, sort_keys=True).encode()], dtype=np.object_))]))
            return out
    """)

PARAMS_BLS = textwrap.dedent("""
    import json
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for r in requests:
                call = pb_utils.InferenceRequest(
                    model_name="py_params", requested_output_names=["OUT"],
                    inputs=[pb_utils.get_input_tensor_by_name(r, "IN")],
                    parameters={"via": "bls", "depth": 1, "flag": False})
                response = call.exec()
                if response.has_error():
                    raise pb_utils.TritonModelException(response.error().message())
                inner = pb_utils.get_output_tensor_by_name(response, "OUT").as_numpy()[0].decode()
                answer = {"callee_saw": json.loads(inner)}
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor(
                    "OUT", np.array([json.dumps(answer, sort_keys=True).encode()],
                                    dtype=np.object_))]))
            return out
    """)


def config(name):
    return textwrap.dedent(f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 0
        input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
        output [ {{ name: "OUT" data_type: TYPE_STRING dims: [ 1 ] }} ]
        instance_group [ {{ count: 1 kind: KIND_CPU }} ]
        """)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from triton_util import TRITON_BIN, start_pair
    if not Path(TRITON_BIN).exists():
        pytest.skip(f"{TRITON_BIN} missing: run `make triton-ref`")
    work = tmp_path_factory.mktemp("params_diff")
    repo = work / "repo"
    for name, code in (("py_params", PARAMS), ("py_params_bls", PARAMS_BLS)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(code)
        (repo / name / "config.pbtxt").write_text(config(name))
    servers = start_pair(repo, work)
    yield servers
    for s in servers:
        s.stop()


def answer(server, model):
    body = {"inputs": [{"name": "IN", "shape": [1], "datatype": "INT32", "data": [1]}],
            "parameters": {"client": "yes", "n": 7, "b": True}}
    status, result = http_json(server.http_url, "POST", f"/v2/models/{model}/infer", body)
    assert status == 200, result
    out = next(o for o in result["outputs"] if o["name"] == "OUT")
    return json.loads(out["data"][0])


@pytest.mark.parametrize("model", ["py_params", "py_params_bls"])
def test_request_parameters_reach_models_as_in_triton(pair, model):
    nereid, triton = pair
    ours, theirs = answer(nereid, model), answer(triton, model)
    assert ours == theirs, (ours, theirs)
    if model == "py_params":
        assert ours == {"client": "yes", "n": 7, "b": True}, ours
    else:
        assert ours == {"callee_saw": {"via": "bls", "depth": 1, "flag": False}}, ours
