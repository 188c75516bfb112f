"""Python backend DLPack, served: `pb_utils.Tensor.from_dlpack` / `to_dlpack` inside real stubs.

- `dl_numpy`  NumPy as producer and consumer: an input read through `__dlpack__` is the input's
              own memory (no copy), outputs made from a producer and from a bare capsule.
- `dl_fake_gpu` returns a tensor whose DLPack device is CUDA (host memory labelled kDLCUDA):
              it stays a GPU tensor in the stub, and leaving the stub needs the CUDA driver; on
              a host without one the request fails naming the output and the driver.
- `dl_torch`  (only where `import torch` works, e.g. the GPU machine of scripts/gpu_check.sh;
              the dev venv has libtorch but no importable torch) reads its input with
              `torch.utils.dlpack.from_dlpack(in.to_dlpack())` without a copy and returns
              `Tensor.from_dlpack("y", torch.utils.dlpack.to_dlpack(t))`.
- `dl_cuda`   (only where torch sees a GPU) KIND_GPU: the input moved to its GPU, the output
              a CUDA torch tensor that stays on the GPU in the stub (`is_cpu()` False, the same
              device memory back through `to_dlpack`) and is copied to the host once when sent.
"""

import ctypes
import json
import textwrap

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from nereid_util import managed_server


def torch_or_none():
    try:
        import torch
        return torch
    except Exception:  # noqa: BLE001 - a torch wheel without its CUDA libraries raises OSError
        return None


def cuda_driver_present():
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


TORCH = torch_or_none()

MODELS = {
    "dl_numpy": """
        import numpy as np
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                out = []
                for r in requests:
                    t = pb_utils.get_input_tensor_by_name(r, "x")
                    view = np.from_dlpack(t)
                    shared = view.ctypes.data == t.as_numpy().ctypes.data
                    doubled = view * 2
                    y = pb_utils.Tensor.from_dlpack("y", doubled)
                    kept = y.as_numpy().ctypes.data == doubled.ctypes.data
                    z = pb_utils.Tensor.from_dlpack("z", pb_utils.Tensor("tmp", doubled + 1).to_dlpack())
                    flags = pb_utils.Tensor("flags", np.array([shared, kept, y.is_cpu()]))
                    out.append(pb_utils.InferenceResponse([y, z, flags]))
                return out
        """,
    "dl_fake_gpu": """
        import numpy as np
        import nereid_dlpack
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                out = []
                for r in requests:
                    x = pb_utils.get_input_tensor_by_name(r, "x").as_numpy() * 2
                    capsule = nereid_dlpack.export(x, x.ctypes.data, (2, 0), list(x.shape), "FP32")
                    y = pb_utils.Tensor.from_dlpack("y", capsule)
                    assert not y.is_cpu() and y.__dlpack_device__() == (2, 0)
                    out.append(pb_utils.InferenceResponse([y]))
                return out
        """,
    "dl_bf16": """
        import numpy as np
        import nereid_dlpack
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                out = []
                for r in requests:
                    t_in = pb_utils.get_input_tensor_by_name(r, "x")
                    capsule = t_in.to_dlpack()
                    assert nereid_dlpack.capsule_datatype(capsule) == "BF16"
                    y = pb_utils.Tensor.from_dlpack("y", capsule)
                    assert y.triton_dtype() == 14 and y.is_cpu()
                    out.append(pb_utils.InferenceResponse([y]))
                return out
        """,
    "dl_torch_bf16": """
        import torch
        import torch.utils.dlpack
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                out = []
                for r in requests:
                    t = torch.utils.dlpack.from_dlpack(pb_utils.get_input_tensor_by_name(r, "x").to_dlpack())
                    assert t.dtype == torch.bfloat16, t.dtype
                    y = pb_utils.Tensor.from_dlpack("y", torch.utils.dlpack.to_dlpack(t * 2))
                    out.append(pb_utils.InferenceResponse([y]))
                return out
        """,
    "dl_torch": """
        import numpy as np
        import torch
        import torch.utils.dlpack
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                out = []
                for r in requests:
                    t_in = pb_utils.get_input_tensor_by_name(r, "x")
                    t = torch.utils.dlpack.from_dlpack(t_in.to_dlpack())
                    shared = t.data_ptr() == t_in.as_numpy().ctypes.data
                    y = pb_utils.Tensor.from_dlpack("y", torch.utils.dlpack.to_dlpack(t * 2))
                    z = pb_utils.Tensor.from_dlpack("z", t + 1)
                    flags = pb_utils.Tensor("flags", np.array([shared, y.is_cpu(), z.is_cpu()]))
                    out.append(pb_utils.InferenceResponse([y, z, flags]))
                return out
        """,
    "dl_cuda": """
        import json
        import numpy as np
        import torch
        import torch.utils.dlpack
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def initialize(self, args):
                assert args["model_instance_kind"] == "GPU", args
                self.device = "cuda:" + args["model_instance_device_id"]

            def execute(self, requests):
                out = []
                for r in requests:
                    t_in = pb_utils.get_input_tensor_by_name(r, "x")
                    t = torch.utils.dlpack.from_dlpack(t_in.to_dlpack()).to(self.device)
                    y_gpu = t * 2
                    y = pb_utils.Tensor.from_dlpack("y", y_gpu)
                    back = torch.utils.dlpack.from_dlpack(y.to_dlpack())
                    try:
                        y.as_numpy()
                        numpy_error = ""
                    except pb_utils.TritonModelException as e:
                        numpy_error = str(e)
                    z = pb_utils.Tensor.from_dlpack("z", torch.utils.dlpack.to_dlpack(t + 1))
                    flags = pb_utils.Tensor("flags", np.array([
                        not y.is_cpu(), y.__dlpack_device__()[0] == 2,
                        back.data_ptr() == y_gpu.data_ptr(), back.is_cuda,
                        numpy_error == "Tensor is stored in GPU and cannot be converted to NumPy.",
                        not z.is_cpu()]))
                    out.append(pb_utils.InferenceResponse([y, z, flags]))
                return out
        """,
}

OUTPUTS = {
    "dl_numpy": ["y", "z", "flags"],
    "dl_fake_gpu": ["y"],
    "dl_bf16": ["y"],
    "dl_torch_bf16": ["y"],
    "dl_torch": ["y", "z", "flags"],
    "dl_cuda": ["y", "z", "flags"],
}


def config(name):
    tensor_type = "TYPE_BF16" if name.endswith("bf16") else "TYPE_FP32"
    outputs = []
    for out in OUTPUTS[name]:
        dtype = "TYPE_BOOL" if out == "flags" else tensor_type
        outputs.append(f'{{ name: "{out}" data_type: {dtype} dims: [ -1 ] }}')
    group = "instance_group [ { kind: KIND_GPU count: 1 } ]\n" if name == "dl_cuda" else ""
    return (f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n'
            f'input [ {{ name: "x" data_type: {tensor_type} dims: [ -1 ] }} ]\n'
            f'output [ {", ".join(outputs)} ]\n' + group)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("dlpack_repo")
    names = ["dl_numpy", "dl_fake_gpu", "dl_bf16"]
    if TORCH is not None:
        names += ["dl_torch", "dl_torch_bf16"]
        if TORCH.cuda.is_available():
            names.append("dl_cuda")
    for name in names:
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(textwrap.dedent(MODELS[name]))
        (repo / name / "config.pbtxt").write_text(config(name))
    args = ["--model-control-mode", "explicit", "--load-model", "*"]
    yield from managed_server(repo, tmp_path_factory.mktemp("logs"), args, "server_dlpack")


def infer(server, model, x, datatype="FP32"):
    """gRPC (tritonclient.grpc needs only grpcio and protobuf, which the GPU machine has). BF16
    goes in and comes out as float32 arrays, as tritonclient converts it."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        inp = grpcclient.InferInput("x", list(x.shape), datatype)
        inp.set_data_from_numpy(x)
        result = client.infer(model, [inp], client_timeout=60)
        return {name: result.as_numpy(name) for name in OUTPUTS[model]}
    finally:
        client.close()


def test_numpy_producers_and_consumers_share_memory(server):
    x = np.arange(5, dtype=np.float32)
    out = infer(server, "dl_numpy", x)
    np.testing.assert_array_equal(out["y"], x * 2)
    np.testing.assert_array_equal(out["z"], x * 2 + 1)
    # The input through __dlpack__ is the input itself; the output keeps the producer's memory.
    assert out["flags"].tolist() == [True, True, True]


def test_bf16_goes_through_dlpack_in_the_stub(server):
    # Values BF16 holds exactly, so the bits come back as sent.
    x = np.array([1.0, -2.5, 0.0, 3.0e10, -1.0e-3], dtype=np.float32)
    x = (x.view(np.uint32) & 0xFFFF0000).view(np.float32)
    out = infer(server, "dl_bf16", x, "BF16")
    np.testing.assert_array_equal(out["y"], x)


@pytest.mark.skipif(TORCH is None, reason="torch cannot be imported in this Python")
def test_torch_computes_on_bf16_inputs_and_returns_bf16(server):
    x = np.array([1.0, -2.5, 0.5, 96.0], dtype=np.float32)
    out = infer(server, "dl_torch_bf16", x, "BF16")
    np.testing.assert_array_equal(out["y"], x * 2)


@pytest.mark.skipif(cuda_driver_present(), reason="the refusal of a host without the CUDA driver")
def test_a_gpu_output_without_the_cuda_driver_fails_naming_it(server):
    with pytest.raises(InferenceServerException) as e:
        infer(server, "dl_fake_gpu", np.ones(3, dtype=np.float32))
    message = str(e.value)
    assert "cannot copy GPU tensor 'y' to the host" in message, message
    assert "libcuda.so.1" in message, message


@pytest.mark.skipif(TORCH is None, reason="torch cannot be imported in this Python")
def test_torch_reads_inputs_and_returns_outputs_without_copies(server):
    x = np.linspace(-1, 1, 7, dtype=np.float32)
    out = infer(server, "dl_torch", x)
    np.testing.assert_allclose(out["y"], x * 2)
    np.testing.assert_allclose(out["z"], x + 1)
    assert out["flags"].tolist() == [True, True, True]


@pytest.mark.skipif(TORCH is None or not TORCH.cuda.is_available(), reason="no GPU for torch")
def test_cuda_tensors_stay_on_the_gpu_until_sent(server):
    x = np.arange(1024, dtype=np.float32)
    out = infer(server, "dl_cuda", x)
    np.testing.assert_allclose(out["y"], x * 2)
    np.testing.assert_allclose(out["z"], x + 1)
    assert out["flags"].tolist() == [True] * 6, json.dumps(out["flags"].tolist())
