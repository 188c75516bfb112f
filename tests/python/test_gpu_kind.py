"""Instance group kinds on this GPU-less machine (no NVML, CPU-only ONNX Runtime and libtorch).

- `py_gpu`     Python, KIND_GPU: loads (a Python model decides itself whether it uses the GPU);
               `initialize` sees model_instance_kind "GPU" and device id "0", as in Triton.
- `py_auto`    Python, no instance_group (KIND_AUTO): CPU, device id "0".
- `onnx_auto`  ONNX, no instance_group: KIND_CPU with ONNX Runtime's CPU count of 2, READY.
- `onnx_gpu`   ONNX, KIND_GPU: fails to load naming CUDAExecutionProvider and onnxruntime-gpu.
- `onnx_trt`   ONNX, KIND_GPU with a `tensorrt` accelerator: names TensorrtExecutionProvider.
- `onnx_bogus` ONNX, KIND_GPU with an unknown accelerator: Triton's message.
- `onnx_mixed` ONNX, a KIND_CPU group that loads and a KIND_GPU group that cannot: the version
               is not READY (every instance must take its device).
No model here ever ran on a GPU.
"""

import json
import textwrap

import numpy as np
import pytest
import tritonclient.http as httpclient

from nereid_util import gen_models, http_json, managed_server

ECHO_ARGS = textwrap.dedent("""
    import json
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            self.seen = json.dumps({k: args[k] for k in (
                "model_instance_kind", "model_instance_device_id", "model_instance_name")})

        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor(
                "seen", np.array([self.seen.encode()], dtype=np.object_))]) for _ in requests]
    """)


def py_config(name, groups):
    return textwrap.dedent(f"""
        name: "{name}"
        backend: "python"
        input [ {{ name: "x" data_type: TYPE_FP32 dims: [ 1 ] }} ]
        output [ {{ name: "seen" data_type: TYPE_STRING dims: [ 1 ] }} ]
        """) + groups


def onnx(repo, name, extra=""):
    gen_models.write_model(repo, name, {1: gen_models.scale_onnx(2.0)},
                           gen_models.config_text(name, 8, [("x", "FP32", [4])],
                                                  [("y", "FP32", [4])], extra))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("gpu_kind_repo")
    for name, groups in [("py_gpu", "instance_group [ { kind: KIND_GPU } ]\n"), ("py_auto", "")]:
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(ECHO_ARGS)
        (repo / name / "config.pbtxt").write_text(py_config(name, groups))
    onnx(repo, "onnx_auto")
    onnx(repo, "onnx_gpu", "instance_group [ { kind: KIND_GPU } ]\n")
    accelerator = ("optimization { execution_accelerators { gpu_execution_accelerator "
                   "[ { name: \"%s\" } ] } }\n")
    onnx(repo, "onnx_trt", "instance_group [ { kind: KIND_GPU } ]\n" + accelerator % "tensorrt")
    onnx(repo, "onnx_bogus", "instance_group [ { kind: KIND_GPU } ]\n" + accelerator % "bogus")
    onnx(repo, "onnx_mixed", "instance_group [ { kind: KIND_CPU }, { kind: KIND_GPU } ]\n")
    args = ["--model-control-mode", "explicit", "--load-model", "*"]
    yield from managed_server(repo, tmp_path_factory.mktemp("logs"), args, "server_gpu_kind")


def seen(server, model):
    client = httpclient.InferenceServerClient(server.http_url)
    inp = httpclient.InferInput("x", [1], "FP32")
    inp.set_data_from_numpy(np.zeros(1, dtype=np.float32))
    out = client.infer(model, [inp]).as_numpy("seen")
    return json.loads(out[0])


def model_config(server, model):
    status, config = http_json(server.http_url, "GET", f"/v2/models/{model}/config")
    assert status == 200, config
    return config


def index_row(server, name):
    status, rows = http_json(server.http_url, "POST", "/v2/repository/index", {})
    assert status == 200
    return next(r for r in rows if r["name"] == name)


def test_python_kind_gpu_instance_sees_gpu_and_device_id(server):
    assert seen(server, "py_gpu") == {"model_instance_kind": "GPU",
                                      "model_instance_device_id": "0",
                                      "model_instance_name": "py_gpu_0_0"}
    group = model_config(server, "py_gpu")["instance_group"][0]
    assert (group["kind"], group["gpus"], group["count"]) == ("KIND_GPU", [0], 1)


def test_kind_auto_stays_on_the_cpu_without_gpus(server):
    assert seen(server, "py_auto") == {"model_instance_kind": "CPU",
                                       "model_instance_device_id": "0",
                                       "model_instance_name": "py_auto_0"}
    for model, count in [("py_auto", 1), ("onnx_auto", 2)]:
        group = model_config(server, model)["instance_group"][0]
        assert (group["kind"], group["count"]) == ("KIND_CPU", count)
        assert not group.get("gpus")
    assert index_row(server, "onnx_auto")["state"] == "READY"


@pytest.mark.parametrize("model, provider", [
    ("onnx_gpu", "KIND_GPU (GPU 0) needs ONNX Runtime's CUDAExecutionProvider"),
    ("onnx_trt", "execution accelerator 'tensorrt' needs ONNX Runtime's TensorrtExecutionProvider"),
])
def test_onnx_kind_gpu_without_onnxruntime_gpu_fails_naming_the_provider(server, model, provider):
    row = index_row(server, model)
    assert row["state"] == "UNAVAILABLE"
    assert f"model '{model}' instance '{model}_0_0': {provider}" in row["reason"], row["reason"]
    assert "onnxruntime-gpu" in row["reason"]


def test_onnx_unknown_accelerator_is_refused_as_triton(server):
    row = index_row(server, "onnx_bogus")
    assert row["state"] == "UNAVAILABLE"
    assert "unknown Execution Accelerator 'bogus' is requested" in row["reason"], row["reason"]


def test_a_version_is_ready_only_if_every_instance_took_its_device(server):
    row = index_row(server, "onnx_mixed")
    assert row["state"] == "UNAVAILABLE"
    assert "instance 'onnx_mixed_1_0': KIND_GPU (GPU 0) needs" in row["reason"], row["reason"]
    status, _ = http_json(server.http_url, "GET", "/v2/models/onnx_mixed/ready")
    assert status != 200
