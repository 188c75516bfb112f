"""The GPU check's ONNX Runtime section (issue 39): ONNX Runtime's CUDA provider end to end.

  ort_env     the onnxruntime-gpu library the server is pointed at (--onnxruntime-library),
              the providers its Python API lists, and whether the TensorRT provider library
              loads (it needs TensorRT's libnvinfer; the reason is recorded when it does not)
  ort_gpu     the MLP as an ONNX model on KIND_GPU (count --ort-count on GPU 0): READY, outputs
              equal to CPU ONNX Runtime within TF32's tolerance
  ort_auto    the same model without instance_group: KIND_AUTO must resolve to KIND_GPU
  ort_trt     KIND_GPU with a `tensorrt` gpu_execution_accelerator: READY, or the load's reason
              (also on a dry run, where the CPU library's refusal is that reason)
  ort_bench   in-process onnxruntime-gpu (Python API, CUDAExecutionProvider, host numpy in and
              out as served) vs the served KIND_GPU model, batch sweep x concurrency

The ONNX file is the torch check's MLP itself (its weights, when torch is there) written with
onnx.helper as MatMul/Add/Relu, so every backend serves the same model. On --dry-run-cpu the CPU
ONNX Runtime stands in for CUDA: KIND_CPU instead of KIND_GPU, CPUExecutionProvider in process,
KIND_AUTO expected to resolve to KIND_CPU.
"""

import ctypes
import os
from pathlib import Path

import numpy as np

from gpu_lib import (IN, OUT, RESULTS, S, best, group, grpc_client, infer, inprocess,
                     instance_groups, model_config, ratio, skip, step, sweep)

HEADER = 'backend: "onnxruntime"'
TRT = ('optimization { execution_accelerators { gpu_execution_accelerator '
       '[ { name: "tensorrt" } ] } }\n')


def mlp_weights(torch_module=None, layers=3, seed=0):
    """[(W [in, out], b)] of the MLP: the torch module's when given, else seeded like
    torch.nn.Linear's default initialisation."""
    if torch_module is not None:
        return [(m.weight.detach().cpu().numpy().T.copy(), m.bias.detach().cpu().numpy())
                for m in torch_module.modules() if type(m).__name__ == "Linear"]
    rng = np.random.default_rng(seed)
    sizes = [S.width] + [S.hidden] * (layers + 1) + [S.width]
    out = []
    for a, b in zip(sizes, sizes[1:]):
        bound = 1.0 / np.sqrt(a)
        out.append((rng.uniform(-bound, bound, (a, b)).astype(np.float32),
                    rng.uniform(-bound, bound, b).astype(np.float32)))
    return out


def write_onnx(path, weights):
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    nodes, inits, x = [], [], IN
    for i, (w, b) in enumerate(weights):
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        last = i == len(weights) - 1
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"]),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], [OUT if last else f"a{i}"])]
        if not last:
            nodes.append(helper.make_node("Relu", [f"a{i}"], [f"h{i}"]))
        x = f"h{i}"
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", S.width]) for n in (IN, OUT)]
    graph = helper.make_graph(nodes, "mlp", io[:1], io[1:], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


@step("ort_models")
def make_models(repo, weights, count):
    """onnx_gpu (KIND_GPU), onnx_auto (no instance_group), onnx_trt (tensorrt accelerator)."""
    first = repo / "onnx_gpu" / "1" / "model.onnx"
    write_onnx(first, weights)
    for name, grp, extra in [("onnx_gpu", group(count), ""), ("onnx_auto", "", ""),
                             ("onnx_trt", group(1, "KIND_GPU"), TRT)]:
        (repo / name / "1").mkdir(parents=True, exist_ok=True)
        if name != "onnx_gpu":
            os.link(first, repo / name / "1" / "model.onnx")
        (repo / name / "config.pbtxt").write_text(model_config(name, HEADER, grp, extra))
    return {"file": str(first), "bytes": first.stat().st_size}


@step("ort_env")
def ort_env(library):
    import onnxruntime as ort
    capi = Path(ort.__file__).parent / "capi"
    info = {"library": str(library), "python_onnxruntime": ort.__version__,
            "python_package": str(capi.parent),
            "available_providers": ort.get_available_providers()}
    trt = capi / "libonnxruntime_providers_tensorrt.so"
    if not trt.exists():
        info["tensorrt"] = f"unavailable: {trt.name} is not in this onnxruntime package"
    else:
        try:
            ctypes.CDLL(str(trt))
            info["tensorrt"] = "its provider library loads"
        except OSError as e:
            info["tensorrt"] = f"unavailable: {e}"
    return info


def session(path, provider):
    import onnxruntime as ort
    providers = [("CUDAExecutionProvider", {"device_id": 0})] if provider == "cuda" \
        else ["CPUExecutionProvider"]
    s = ort.InferenceSession(str(path), providers=providers)
    if provider == "cuda" and "CUDAExecutionProvider" not in s.get_providers():
        raise RuntimeError(f"in-process ONNX Runtime fell back to {s.get_providers()}")
    return s


def check_outputs(server, model, path):
    """The served outputs against CPU ONNX Runtime: within 1e-2 of the outputs' largest
    magnitude (CUDA's FP32 matmuls use TF32 by default in ONNX Runtime)."""
    x = np.random.default_rng(1).standard_normal((4, S.width), dtype=np.float32)
    y = infer(grpc_client(server.grpc), model, x)
    ref = session(path, "cpu").run([OUT], {IN: x})[0]
    diff, scale = float(np.max(np.abs(y - ref))), float(np.max(np.abs(ref)))
    if not diff <= 1e-2 * scale:
        raise AssertionError(f"max |served - CPU ORT| = {diff}, outputs up to {scale}")
    return {"max_abs_diff": diff, "max_abs_output": scale}


def served_on_the_gpu(server, model, path, what):
    """`model` READY with every instance group of the GPU's kind, and its outputs right."""
    server.ready(model)
    groups = instance_groups(server, model)
    kinds = {g["kind"] for g in groups}
    if kinds != {S.gpu_kind}:
        raise RuntimeError(f"{what} {kinds}, not {S.gpu_kind}")
    return {"instance_group": groups, **check_outputs(server, model, path)}


@step("ort_gpu")
def served_gpu(server, path):
    return served_on_the_gpu(server, "onnx_gpu", path, "onnx_gpu runs on")


@step("ort_auto")
def served_auto(server, path):
    return served_on_the_gpu(server, "onnx_auto", path, "KIND_AUTO resolved to")


@step("ort_trt")
def served_trt(server, path):
    """The TensorRT provider: READY and right, or unavailable with the server's reason."""
    try:
        server.ready("onnx_trt", deadline_s=180)
    except RuntimeError as e:
        return {"available": False, "reason": str(e)}
    return {"available": True, **check_outputs(server, "onnx_trt", path)}


@step("ort_bench")
def bench(server, path):
    s = session(path, "cpu" if S.dry else "cuda")
    inputs = {b: np.random.default_rng(3).standard_normal((b, S.width), dtype=np.float32)
              for b in S.batches}
    rates = inprocess(lambda b: s.run([OUT], {IN: inputs[b]}))
    del s
    rows = sweep("onnxruntime_backend", server, "onnx_gpu")
    return {"inprocess": rates, "served": rows,
            "ratio_best_served_to_best_inprocess": ratio(best(rows), max(rates.values()))}


def run(nereid, repo, library, weights, count, server_factory):
    """The whole section. `server_factory(binary, repo, name, args)` starts a server."""
    if library is None:
        for name in ("ort_env", "ort_gpu", "ort_auto", "ort_trt", "ort_bench"):
            skip(name, "no onnxruntime-gpu library (its parts did not all reach this machine: "
                       "scripts/gpu_parts.sh status)")
        return
    ort_env(library)
    ort_repo = repo.parent / "ort_repo"
    if not make_models(ort_repo, weights, count)["ok"]:
        return
    path = ort_repo / "onnx_gpu" / "1" / "model.onnx"
    server = server_factory(nereid, ort_repo, "nereid_ort", ["--onnxruntime-library", str(library)])
    try:
        if served_gpu(server, path)["ok"]:
            served_auto(server, path)
            served_trt(server, path)
            bench(server, path)
        else:
            skip("ort_bench", "onnx_gpu did not load")
    finally:
        server.stop()


@step("ort_gpu_library")
def probe_gpu_library(nereid, repo, library, weights, server_factory):
    """Dry run with the carried onnxruntime-gpu library (put back together from its parts):
    Nereid loads it on this CPU-only machine, KIND_AUTO stays on the CPU (no GPU seen) and
    serves, and KIND_GPU gets as far as the CUDA provider library, refused with the loader's
    reason (no CUDA libraries here): what the GPU machine then runs, short of the GPU."""
    from nereid_util import wait_until
    probe = repo.parent / "ort_gpu_library_repo"
    write_onnx(probe / "g_auto" / "1" / "model.onnx", weights)
    (probe / "g_gpu" / "1").mkdir(parents=True)
    os.link(probe / "g_auto" / "1" / "model.onnx", probe / "g_gpu" / "1" / "model.onnx")
    for name, grp in [("g_auto", ""), ("g_gpu", group(1, "KIND_GPU"))]:
        (probe / name / "config.pbtxt").write_text(model_config(name, HEADER, grp))
    server = server_factory(nereid, probe, "nereid_ort_gpu_library",
                            ["--onnxruntime-library", str(library)])
    try:
        server.ready("g_auto")
        reason = wait_until(lambda: server.failed("g_gpu"), 60, "g_gpu refused")
        if "libonnxruntime_providers_cuda.so" not in reason:
            raise RuntimeError(f"KIND_GPU did not reach the CUDA provider: {reason}")
        return {"library": str(library), "kind_auto": instance_groups(server, "g_auto"),
                **check_outputs(server, "g_auto", probe / "g_auto" / "1" / "model.onnx"),
                "kind_gpu_refused": reason}
    finally:
        server.stop()


def ratio_of_run():
    b = RESULTS.get("ort_bench", {})
    return b.get("ratio_best_served_to_best_inprocess") if b.get("ok") else None
