"""The PyTorch backend through tritonclient, over HTTP and gRPC: the TorchScript models of
tests/models/pytorch (scripted and traced, an MLP, a small conv net, two-in/two-out bound by
forward() argument names, a dict input, every shared datatype, BYTES as List[str]) give PyTorch's own outputs
(stored in expected.json); dynamic batching joins concurrent requests; an ensemble runs an ONNX
step then a TorchScript step; bad inputs get 400 / INVALID_ARGUMENT and the server keeps
serving; a KIND_GPU instance group fails to load with its reason on this GPU-less machine;
libtorch is mapped into the server only when the first PyTorch model loads."""

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from nereid_util import ROOT, gen_models, http_raw, managed_server

MODELS = ROOT / "tests/models/pytorch"
FIXTURES = ["mlp_script", "conv_trace", "add_sub_script", "types_script", "dict_script",
            "strings_script"]
MODULES = {"http": httpclient, "grpc": grpcclient}
NUMPY = {"BOOL": np.bool_, "UINT8": np.uint8, "INT8": np.int8, "INT16": np.int16,
         "INT32": np.int32, "INT64": np.int64, "FP16": np.float16, "FP32": np.float32,
         "FP64": np.float64, "BF16": np.float32, "BYTES": np.object_}


def expected(name):
    return json.loads((MODELS / name / "expected.json").read_text())


def array(spec):
    data = spec["data"]
    if spec["datatype"] == "BYTES":
        data = [s.encode() for s in data]
    return np.array(data, dtype=NUMPY[spec["datatype"]]).reshape(spec["shape"])


@pytest.fixture(scope="module")
def torch_repo(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo_pytorch")
    for name in FIXTURES:
        shutil.copytree(MODELS / name, repo / name, ignore=shutil.ignore_patterns("expected.json"))
    # The MLP again, asking for a GPU this machine does not have.
    gpu = repo / "mlp_gpu"
    shutil.copytree(MODELS / "mlp_script", gpu, ignore=shutil.ignore_patterns("expected.json"))
    text = (gpu / "config.pbtxt").read_text()
    (gpu / "config.pbtxt").write_text(
        text.replace('"mlp_script"', '"mlp_gpu"').replace("KIND_CPU", "KIND_GPU"))
    # The MLP again, waiting up to 100 ms to fill a batch: concurrent requests join
    # deterministically, however fast the model runs.
    slow = repo / "mlp_batched"
    shutil.copytree(MODELS / "mlp_script", slow, ignore=shutil.ignore_patterns("expected.json"))
    text = (slow / "config.pbtxt").read_text()
    (slow / "config.pbtxt").write_text(text.replace('"mlp_script"', '"mlp_batched"').replace(
        "max_queue_delay_microseconds: 500", "max_queue_delay_microseconds: 100000"))
    # An ONNX step (x * 2) feeding the TorchScript MLP.
    gen_models.write_model(repo, "onnx_double", {1: gen_models.scale_onnx(2.0)},
                           gen_models.config_text("onnx_double", 8, [("x", "FP32", [4])],
                                                  [("y", "FP32", [4])]))
    (repo / "onnx_then_torch" / "1").mkdir(parents=True)
    (repo / "onnx_then_torch" / "config.pbtxt").write_text(gen_models.ensemble_config(
        "onnx_then_torch", 8, [("IN", "FP32", [4])], [("OUT", "FP32", [3])], [
            ("onnx_double", {"x": "IN"}, {"y": "DOUBLED"}),
            ("mlp_script", {"INPUT__0": "DOUBLED"}, {"OUTPUT__0": "OUT"}),
        ]))
    return repo


@pytest.fixture(scope="module")
def torch_server(torch_repo, tmp_path_factory):
    yield from managed_server(torch_repo, tmp_path_factory.mktemp("logs"), [], "server_pytorch")


@pytest.fixture(params=["http", "grpc"])
def client(request, torch_server):
    if request.param == "http":
        c = httpclient.InferenceServerClient(torch_server.http_url, network_timeout=60,
                                             concurrency=16)
    else:
        c = grpcclient.InferenceServerClient(torch_server.grpc_url)
    c.proto = request.param
    yield c
    c.close()


def infer(client, model, inputs, outputs=None):
    """inputs: {name: (datatype, array)}; returns the result."""
    mod = MODULES[client.proto]
    tensors = []
    for name, (datatype, value) in inputs.items():
        t = mod.InferInput(name, list(value.shape), datatype)
        t.set_data_from_numpy(value)
        tensors.append(t)
    requested = None if outputs is None else [mod.InferRequestedOutput(o) for o in outputs]
    return client.infer(model, tensors, outputs=requested)


def infer_many(client, model, inputs_list):
    """Sends every request at once (HTTP: async_infer on the client's connection pool; gRPC:
    one thread each) and returns the results in order."""
    if client.proto == "http":
        pending = []
        for inputs in inputs_list:
            tensors = []
            for name, (datatype, value) in inputs.items():
                t = httpclient.InferInput(name, list(value.shape), datatype)
                t.set_data_from_numpy(value)
                tensors.append(t)
            pending.append(client.async_infer(model, tensors))
        return [p.get_result() for p in pending]
    with ThreadPoolExecutor(16) as pool:
        return list(pool.map(lambda inputs: infer(client, model, inputs), inputs_list))


def fixture_inputs(name):
    return {k: (v["datatype"], array(v)) for k, v in expected(name)["inputs"].items()}


def assert_matches(result, name, spec):
    got = result.as_numpy(name)
    want = array(spec)
    assert list(got.shape) == spec["shape"], name
    if spec["datatype"] in ("FP16", "FP32", "FP64", "BF16"):
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64),
                                   rtol=1e-5, atol=1e-6, err_msg=name)
    else:
        np.testing.assert_array_equal(got, want, err_msg=name)


@pytest.mark.parametrize("model", FIXTURES)
def test_outputs_match_pytorch(client, model):
    exp = expected(model)
    result = infer(client, model, fixture_inputs(model))
    for name, spec in exp["outputs"].items():
        assert_matches(result, name, spec)


def test_outputs_by_name_and_index(client):
    """add_sub_script binds inputs by forward(a, b) names; SUM__0/DIFF__1 by index."""
    exp = expected("add_sub_script")
    result = infer(client, "add_sub_script", fixture_inputs("add_sub_script"), ["DIFF__1"])
    assert_matches(result, "DIFF__1", exp["outputs"]["DIFF__1"])
    assert result.as_numpy("SUM__0") is None


def test_metadata_and_config(client):
    meta = client.get_model_metadata("mlp_script")
    config = client.get_model_config("mlp_script")
    if client.proto == "grpc":
        platform, backend = meta.platform, config.config.backend
        inputs = [i.name for i in meta.inputs]
    else:
        platform, backend = meta["platform"], config["backend"]
        inputs = [i["name"] for i in meta["inputs"]]
    assert (platform, backend, inputs) == ("pytorch_libtorch", "pytorch", ["INPUT__0"])


def test_concurrent_requests_are_batched(client, torch_server):
    exp = expected("mlp_script")
    rows = array(exp["inputs"]["INPUT__0"])
    want = array(exp["outputs"]["OUTPUT__0"])
    stats_before = executions(client, "mlp_batched")
    n = 48
    results = infer_many(client, "mlp_batched",
                         [{"INPUT__0": ("FP32", rows[i % len(rows)][None, :])} for i in range(n)])
    for i, result in enumerate(results):
        np.testing.assert_allclose(result.as_numpy("OUTPUT__0")[0], want[i % len(rows)],
                                   rtol=1e-5, atol=1e-6)
    requests, batches = (a - b for a, b in zip(executions(client, "mlp_batched"), stats_before))
    assert requests == n
    assert batches < n, f"{n} concurrent requests took {batches} executions"


def as_json(client, call, *args):
    return call(*args, as_json=True) if client.proto == "grpc" else call(*args)


def executions(client, model):
    s = as_json(client, client.get_inference_statistics, model)["model_stats"][0]
    return int(s["inference_count"]), int(s["execution_count"])


def test_ensemble_mixes_onnx_and_torchscript(client):
    x = np.array([[0.5, -1.0, 2.0, 0.25], [1.0, 1.0, -3.0, 0.0]], dtype=np.float32)
    out = infer(client, "onnx_then_torch", {"IN": ("FP32", x)}).as_numpy("OUT")
    direct = infer(client, "mlp_script", {"INPUT__0": ("FP32", x * 2)}).as_numpy("OUTPUT__0")
    np.testing.assert_allclose(out, direct, rtol=1e-6)
    assert out.shape == (2, 3)


def error_of(client, model, inputs, outputs=None):
    with pytest.raises(InferenceServerException) as info:
        infer(client, model, inputs, outputs)
    return info.value


@pytest.mark.parametrize("case", ["datatype", "shape", "missing", "batch", "output"])
def test_bad_inputs_are_refused_and_the_server_keeps_serving(client, case):
    good = np.zeros((1, 4), dtype=np.float32)
    inputs, outputs, needle = {
        "datatype": ({"INPUT__0": ("FP64", good.astype(np.float64))}, None, "INPUT__0"),
        "shape": ({"INPUT__0": ("FP32", np.zeros((1, 5), dtype=np.float32))}, None, "INPUT__0"),
        "missing": ({}, None, "INPUT__0"),
        "batch": ({"INPUT__0": ("FP32", np.zeros((9, 4), dtype=np.float32))}, None, "batch"),
        "output": ({"INPUT__0": ("FP32", good)}, ["OUTPUT__7"], "OUTPUT__7"),
    }[case]
    e = error_of(client, "mlp_script", inputs, outputs)
    assert needle in e.message(), e.message()
    if client.proto == "http":
        assert e.status() == "400", e.status()
    else:
        assert e.status() == "StatusCode.INVALID_ARGUMENT", e.status()
    test_outputs_match_pytorch(client, "mlp_script")


def test_kind_gpu_fails_to_load_with_its_reason(client):
    assert not client.is_model_ready("mlp_gpu")
    index = as_json(client, client.get_model_repository_index)
    entries = index["models"] if client.proto == "grpc" else index
    entry = next(m for m in entries if m["name"] == "mlp_gpu")
    assert entry["state"] == "UNAVAILABLE"
    assert "KIND_GPU (GPU 0) requested, but libtorch cannot use CUDA here: " in entry["reason"]
    assert "use KIND_CPU" in entry["reason"]
    assert client.is_model_ready("mlp_script")


def test_bytes_that_a_list_of_strings_cannot_hold_are_refused(client):
    words = np.array([b"fine", b"nul\x00inside"], dtype=np.object_)
    e = error_of(client, "strings_script", {"INPUT__0": ("BYTES", words)})
    assert "input 'INPUT__0': element 1 is not UTF-8 text without NUL bytes" in e.message()
    assert e.status() in ("400", "StatusCode.INVALID_ARGUMENT"), e.status()
    test_outputs_match_pytorch(client, "strings_script")


def libtorch_mapped(pid):
    maps = Path(f"/proc/{pid}/maps").read_text()
    return "libtorch_cpu.so" in maps, "libnereid_torch_backend.so" in maps


def test_libtorch_is_loaded_only_when_a_pytorch_model_needs_it(tmp_path):
    """An ONNX-only server does not map libtorch; loading a TorchScript model maps it (the
    backend library, opened on that load) and the log says so."""
    repo = tmp_path / "repo"
    repo.mkdir()
    gen_models.write_model(repo, "onnx_double", {1: gen_models.scale_onnx(2.0)},
                           gen_models.config_text("onnx_double", 8, [("x", "FP32", [4])],
                                                  [("y", "FP32", [4])]))
    shutil.copytree(MODELS / "mlp_script", repo / "mlp_script",
                    ignore=shutil.ignore_patterns("expected.json"))
    args = ["--model-control-mode", "explicit", "--load-model", "onnx_double"]
    for server in managed_server(repo, tmp_path, args, "server_lazy_torch"):
        assert http_raw(server.http_url, "GET", "/v2/models/onnx_double/ready")[0] == 200
        assert libtorch_mapped(server.proc.pid) == (False, False)
        assert "loaded libtorch" not in server.log_path.read_text()
        status, _, body = http_raw(server.http_url, "POST", "/v2/repository/models/mlp_script/load")
        assert status == 200, body
        assert libtorch_mapped(server.proc.pid) == (True, True)
        assert "loaded libtorch (the PyTorch backend library)" in server.log_path.read_text()
