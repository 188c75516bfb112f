"""Model control from Python (`pb_utils.load_model`, `unload_model`, `is_model_ready`).

A model `py_control` turns each request (ACTION, NAME, VERSION) into one of those calls and
answers with what it got: `{"ok": true, "ready": ...}` or `{"error": "<TritonModelException>"}`.
It runs on an explicit-mode server, where the calls act on the repository as the repository API
does, and on a `none`-mode server, where loads and unloads are refused with the server's words.
"""

import json
import textwrap

import numpy as np
import pytest
import tritonclient.http as httpclient

from nereid_util import PYTHON_IDENTITY_MODEL, http_json, managed_server

CONTROL = textwrap.dedent("""
    import json
    import triton_python_backend_utils as pb_utils
    import numpy as np

    def text(request, name):
        return pb_utils.get_input_tensor_by_name(request, name).as_numpy().reshape(-1)[0].decode()

    class TritonPythonModel:
        def initialize(self, args):
            self.dir = args["model_repository"]

        def execute(self, requests):
            out = []
            for r in requests:
                action, name, version = text(r, "ACTION"), text(r, "NAME"), text(r, "VERSION")
                try:
                    if action == "ready":
                        result = {"ok": True, "ready": pb_utils.is_model_ready(name, version)}
                    elif action == "load":
                        pb_utils.load_model(name)
                        result = {"ok": True}
                    elif action == "load_files":
                        with open(self.dir + "/identity.py", "rb") as f:
                            code = f.read()
                        config = json.dumps({
                            "name": name, "backend": "python", "max_batch_size": 0,
                            "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}],
                            "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [4]}]})
                        pb_utils.load_model(name, config=config, files={"file:1/model.py": code})
                        result = {"ok": True}
                    elif action == "unload":
                        pb_utils.unload_model(name)
                        result = {"ok": True}
                    else:
                        result = {"error": "unknown action " + action}
                except pb_utils.TritonModelException as e:
                    result = {"error": str(e)}
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor(
                    "RESULT", np.array([json.dumps(result).encode()], dtype=np.object_))]))
            return out
    """)

CONTROL_CONFIG = textwrap.dedent("""
    name: "py_control"
    backend: "python"
    max_batch_size: 0
    input [
      { name: "ACTION" data_type: TYPE_STRING dims: [ 1 ] },
      { name: "NAME" data_type: TYPE_STRING dims: [ 1 ] },
      { name: "VERSION" data_type: TYPE_STRING dims: [ 1 ] }
    ]
    output [ { name: "RESULT" data_type: TYPE_STRING dims: [ 1 ] } ]
    instance_group [ { count: 1 kind: KIND_CPU } ]
    """)


IDENTITY = PYTHON_IDENTITY_MODEL

IDENTITY_CONFIG = textwrap.dedent("""
    name: "ident"
    backend: "python"
    max_batch_size: 0
    input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
    output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
    instance_group [ { count: 1 kind: KIND_CPU } ]
    """)


def write_repo(repo):
    """Python models only, so that the reference Triton (Python backend alone) serves it too."""
    (repo / "py_control" / "1").mkdir(parents=True)
    (repo / "py_control" / "1" / "model.py").write_text(CONTROL)
    (repo / "py_control" / "config.pbtxt").write_text(CONTROL_CONFIG)
    # The code `load_files` uploads, kept beside the model (not a model of the repository).
    (repo / "py_control" / "identity.py").write_text(IDENTITY)
    (repo / "ident" / "1").mkdir(parents=True)
    (repo / "ident" / "1" / "model.py").write_text(IDENTITY)
    (repo / "ident" / "config.pbtxt").write_text(IDENTITY_CONFIG)
    return repo


@pytest.fixture(scope="module")
def explicit(tmp_path_factory):
    repo = write_repo(tmp_path_factory.mktemp("control_repo"))
    args = ["--model-control-mode", "explicit", "--load-model", "py_control"]
    yield from managed_server(repo, tmp_path_factory.mktemp("logs"), args, "server_control")


@pytest.fixture(scope="module")
def fixed(tmp_path_factory):
    repo = write_repo(tmp_path_factory.mktemp("control_repo_none"))
    yield from managed_server(repo, tmp_path_factory.mktemp("logs"), [], "server_control_none")


def control(server, action, name, version=""):
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
    inputs = []
    for input_name, value in (("ACTION", action), ("NAME", name), ("VERSION", version)):
        tensor = httpclient.InferInput(input_name, [1], "BYTES")
        tensor.set_data_from_numpy(np.array([value.encode()], dtype=np.object_))
        inputs.append(tensor)
    result = client.infer("py_control", inputs)
    return json.loads(result.as_numpy("RESULT")[0])


def served(server, name):
    status, rows = http_json(server.http_url, "POST", "/v2/repository/index", {})
    assert status == 200
    return [r["state"] for r in rows if r["name"] == name]


def infer_identity(server, name):
    client = httpclient.InferenceServerClient(server.http_url)
    x = np.arange(4, dtype=np.float32)
    tensor = httpclient.InferInput("x", [4], "FP32")
    tensor.set_data_from_numpy(x)
    np.testing.assert_array_equal(client.infer(name, [tensor]).as_numpy("y"), x)


def test_a_model_loads_checks_and_unloads_another(explicit):
    assert control(explicit, "ready", "ident") == {"ok": True, "ready": False}
    assert control(explicit, "load", "ident") == {"ok": True}
    assert served(explicit, "ident") == ["READY"]
    assert control(explicit, "ready", "ident") == {"ok": True, "ready": True}
    assert control(explicit, "ready", "ident", "1") == {"ok": True, "ready": True}
    assert control(explicit, "ready", "ident", "2") == {"ok": True, "ready": False}
    infer_identity(explicit, "ident")
    assert control(explicit, "unload", "ident") == {"ok": True}
    assert control(explicit, "ready", "ident") == {"ok": True, "ready": False}
    assert served(explicit, "ident") == ["UNAVAILABLE"]


def test_a_model_loads_one_from_a_config_and_files(explicit):
    assert control(explicit, "load_files", "uploaded") == {"ok": True}
    assert control(explicit, "ready", "uploaded") == {"ok": True, "ready": True}
    infer_identity(explicit, "uploaded")
    assert control(explicit, "unload", "uploaded") == {"ok": True}


def test_errors_raise_in_the_model_with_the_servers_words(explicit):
    missing = control(explicit, "load", "no_such_model")
    assert "no_such_model" in missing["error"], missing
    assert control(explicit, "ready", "no_such_model") == {"ok": True, "ready": False}
    bad_version = control(explicit, "ready", "ident", "latest")
    assert "model_version 'latest' is not a number" in bad_version["error"], bad_version
    # The model keeps serving after its calls failed.
    assert control(explicit, "ready", "py_control") == {"ok": True, "ready": True}


def test_loads_and_unloads_need_explicit_mode(fixed):
    refused = control(fixed, "load", "ident")
    assert "explicit model load / unload is not allowed" in refused["error"], refused
    refused = control(fixed, "unload", "ident")
    assert "explicit model load / unload is not allowed" in refused["error"], refused
    assert control(fixed, "ready", "ident") == {"ok": True, "ready": True}


# ---------------------------------------------------------------------------------------------
# Differential: the real Triton (2.51) runs the same model on the same repository.


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from pathlib import Path

    from triton_util import TRITON_BIN, start_pair
    if not Path(TRITON_BIN).exists():
        pytest.skip(f"{TRITON_BIN} missing: run `make triton-ref`")
    work = tmp_path_factory.mktemp("control_diff")
    repo = write_repo(work / "repo")
    servers = start_pair(repo, work, ["--model-control-mode", "explicit", "--load-model", "py_control"])
    yield servers
    for s in servers:
        s.stop()


TRITON_ABORTED = "Triton aborted: boost::interprocess::lock_exception"


def control_oracle(triton, action, name, version=""):
    """`control` on the reference Triton; TRITON_ABORTED where Triton died of its known
    `lock_exception` abort during the step. Any other death is re-raised with Triton's log."""
    try:
        return control(triton, action, name, version)
    except OSError:
        died = triton.proc.poll() is not None
        if died and "boost::interprocess::lock_exception" in triton.log_tail(200_000):
            return TRITON_ABORTED
        raise


def test_same_answers_as_triton(pair):
    nereid, triton = pair
    steps = [("ready", "ident", ""), ("load", "ident", ""), ("ready", "ident", ""),
             ("ready", "ident", "1"), ("ready", "ident", "2"), ("unload", "ident", ""),
             ("ready", "ident", ""), ("load_files", "uploaded", ""), ("ready", "uploaded", ""),
             ("unload", "uploaded", ""), ("ready", "no_such_model", ""),
             ("load", "no_such_model", "")]
    for step in steps:
        ours, theirs = control(nereid, *step), control_oracle(triton, *step)
        if theirs is TRITON_ABORTED:
            # Triton 2.51's Python backend intermittently aborts (about 1 run in 20) while it
            # raises a failed `load_model` into the model; its answer to the step was a refusal.
            assert "error" in ours, (step, ours, theirs)
            break
        if "error" in theirs:
            # Both refuse; the wording is each server's own.
            assert "error" in ours, (step, ours, theirs)
        else:
            assert ours == theirs, (step, ours, theirs)


def test_version_strings_read_as_triton_reads_them(pair):
    """A gRPC model version is read as Triton reads it (leading digits; text after them is
    ignored), and one that is not a version is refused with Triton's own words."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    def ask(server, version):
        client = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            return ("ready", client.is_model_ready("py_control", model_version=version),
                    client.get_model_metadata("py_control", model_version=version).name)
        except InferenceServerException as e:
            return ("error", e.status(), e.message())

    nereid, triton = pair
    for version in ["abc", "-1", "1x", " 1", "99999999999999999999", "1"]:
        assert ask(nereid, version) == ask(triton, version), version
