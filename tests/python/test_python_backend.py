"""Python backend end to end: Triton `model.py` files in stub processes, and their faults.

One explicit-mode server on a repository written here:
- `py_add_one`      FP32 x -> y = x + 1, echoes request id and parameters it saw as strings;
- `py_bad_syntax`   model.py with a syntax error: the load fails with the Python traceback;
- `py_raises`       execute raises for negative input: that request fails, the next succeeds;
- `py_crash`        execute kills its own stub (SIGKILL) on input 666: the request fails, the
                    model goes UNAVAILABLE, comes back READY by itself, other models keep serving;
- `py_crash_init`   initialize SIGKILLs its stub the first time (a marker file remembers): the
                    load fails with the reason, a second load succeeds.
"""

import json
import textwrap
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from nereid_util import http_json, managed_server, wait_until

PB = "import triton_python_backend_utils as pb_utils\nimport numpy as np\n"

ADD_ONE = PB + textwrap.dedent("""
    class TritonPythonModel:
        def initialize(self, args):
            self.name = args["model_name"]
            self.instance = args["model_instance_name"]

        def execute(self, requests):
            out = []
            for r in requests:
                x = pb_utils.get_input_tensor_by_name(r, "x").as_numpy()
                seen = json.dumps({"id": r.request_id(), "parameters": json.loads(r.parameters()),
                                   "model": self.name, "instance": self.instance})
                out.append(pb_utils.InferenceResponse([
                    pb_utils.Tensor("y", (x + 1).astype(np.float32)),
                    pb_utils.Tensor("seen", np.array([[seen.encode()]] * len(x), dtype=np.object_)),
                ]))
            return out
    """).replace("class TritonPythonModel", "import json\n\nclass TritonPythonModel", 1)

RAISES = PB + textwrap.dedent("""
    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for r in requests:
                x = pb_utils.get_input_tensor_by_name(r, "x").as_numpy()
                if (x < 0).any():
                    raise ValueError(f"negative input {x.min()} is not allowed")
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", x + 1)]))
            return out
    """)

CRASH = PB + textwrap.dedent("""
    import os, signal

    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for r in requests:
                x = pb_utils.get_input_tensor_by_name(r, "x").as_numpy()
                if (x == 666).any():
                    os.kill(os.getpid(), signal.SIGKILL)
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", x + 1)]))
            return out
    """)

CRASH_INIT = PB + textwrap.dedent("""
    import os, signal

    class TritonPythonModel:
        def initialize(self, args):
            marker = os.path.join(args["model_repository"], "crashed_once")
            if not os.path.exists(marker):
                open(marker, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)

        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor(
                "y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy() + 1)]) for r in requests]
    """)


def config(name, extra_outputs=""):
    return textwrap.dedent(f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 8
        input [ {{ name: "x" data_type: TYPE_FP32 dims: [ 4 ] }} ]
        output [ {{ name: "y" data_type: TYPE_FP32 dims: [ 4 ] }}{extra_outputs} ]
        instance_group [ {{ count: 1 kind: KIND_CPU }} ]
        dynamic_batching {{ }}
        """)


MODELS = {
    "py_add_one": (ADD_ONE, config("py_add_one", ', { name: "seen" data_type: TYPE_STRING dims: [ 1 ] }')),
    "py_bad_syntax": (PB + "class TritonPythonModel:\n    def execute(self, requests)\n        return []\n",
                      config("py_bad_syntax")),
    "py_raises": (RAISES, config("py_raises")),
    "py_crash": (CRASH, config("py_crash")),
    "py_crash_init": (CRASH_INIT, config("py_crash_init")),
}


@pytest.fixture(scope="module")
def py_server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("py_repo")
    for name, (code, cfg) in MODELS.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(code)
        (repo / name / "config.pbtxt").write_text(cfg)
    args = ["--model-control-mode", "explicit", "--load-model", "*"]
    yield from managed_server(repo, tmp_path_factory.mktemp("logs"), args, "server_python")


def infer(client_mod, url, model, x, **kw):
    client = client_mod.InferenceServerClient(url)
    inp = client_mod.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return client.infer(model, [inp], **kw)


def index_row(server, name):
    status, rows = http_json(server.http_url, "POST", "/v2/repository/index", {})
    assert status == 200
    return next(r for r in rows if r["name"] == name)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_add_one_and_request_fields(py_server, protocol):
    client_mod = httpclient if protocol == "http" else grpcclient
    url = py_server.http_url if protocol == "http" else py_server.grpc_url
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    r = infer(client_mod, url, "py_add_one", x, request_id="req-7", parameters={"color": "red"})
    np.testing.assert_array_equal(r.as_numpy("y"), x + 1)
    seen = json.loads(r.as_numpy("seen")[0][0])
    assert seen == {"id": "req-7", "parameters": {"color": "red"}, "model": "py_add_one",
                    "instance": "py_add_one_0_0"}


def test_syntax_error_fails_the_load_with_the_traceback(py_server):
    row = index_row(py_server, "py_bad_syntax")
    assert row["state"] == "UNAVAILABLE"
    assert "SyntaxError" in row["reason"], row
    assert "model.py" in row["reason"], row
    status, body = http_json(py_server.http_url, "POST", "/v2/repository/models/py_bad_syntax/load", {})
    assert status == 400 and "SyntaxError" in body["error"], body


def test_execute_that_raises_fails_only_that_request(py_server):
    with pytest.raises(InferenceServerException, match="negative input"):
        infer(httpclient, py_server.http_url, "py_raises", -np.ones((1, 4), np.float32))
    r = infer(httpclient, py_server.http_url, "py_raises", np.ones((1, 4), np.float32))
    np.testing.assert_array_equal(r.as_numpy("y"), np.full((1, 4), 2, np.float32))


def test_stub_killed_mid_execute_recovers(py_server):
    with pytest.raises(InferenceServerException, match="not healthy"):
        infer(httpclient, py_server.http_url, "py_crash", np.full((1, 4), 666, np.float32))
    # Other models keep serving while the stub restarts.
    r = infer(httpclient, py_server.http_url, "py_add_one", np.zeros((1, 4), np.float32))
    np.testing.assert_array_equal(r.as_numpy("y"), np.ones((1, 4), np.float32))
    client = httpclient.InferenceServerClient(py_server.http_url)
    wait_until(lambda: client.is_model_ready("py_crash"), 60, "py_crash ready again")
    r = infer(httpclient, py_server.http_url, "py_crash", np.ones((1, 4), np.float32))
    np.testing.assert_array_equal(r.as_numpy("y"), np.full((1, 4), 2, np.float32))


def test_stub_killed_during_load_then_reload_succeeds(py_server):
    row = index_row(py_server, "py_crash_init")
    assert row["state"] == "UNAVAILABLE", row
    assert "py_crash_init" in row["reason"], row
    client = httpclient.InferenceServerClient(py_server.http_url)
    assert client.is_server_live()
    client.load_model("py_crash_init")
    assert client.is_model_ready("py_crash_init")
    r = infer(httpclient, py_server.http_url, "py_crash_init", np.ones((2, 4), np.float32))
    np.testing.assert_array_equal(r.as_numpy("y"), np.full((2, 4), 2, np.float32))
