"""The GPU check's Python-backend section (issue 39): what lets Python instances share a GPU.

On the H100 two instances of the Python MLP model (two stub processes, two CUDA contexts) did
18.6k rows/s at batch 128 where one did 53.2k: the GPU time-slices between processes. Each
configuration below is its own server with the model alone, swept over --py-batches x
--py-concurrency:

  py_1         count 1
  py_2         count 2 (two stub processes)
  py_2_mps     count 2 with the CUDA MPS daemon running (started here with its own pipe and
               log folders, stopped after), when nvidia-cuda-mps-control exists; recorded as
               unavailable with the reason otherwise
  py_2_shared  count 2 with --py-shared-param KEY=VALUE in the model's parameters (default
               SHARED_STUB_PROCESS=true: both instances in one stub process, one thread each;
               --py-shared-param '' skips it)
Each records stub_processes, the server's child processes once the model is ready.

On --dry-run-cpu the model is the same MLP in NumPy on KIND_CPU and MPS is skipped.
"""

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np

from gpu_lib import RESULTS, S, best, group, model_config, skip, step, sweep

HEADER = 'backend: "python"'

# The GPU model: the TorchScript MLP on the instance's GPU, outputs returned as CUDA tensors.
PY_MODEL = """
import numpy as np
import torch
import torch.utils.dlpack
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.device = "cuda:" + args["model_instance_device_id"]
        self.model = torch.jit.load(args["model_repository"] + "/1/model.pt").to(self.device).eval()

    def execute(self, requests):
        inputs = [torch.utils.dlpack.from_dlpack(pb_utils.get_input_tensor_by_name(r, "INPUT__0").to_dlpack())
                  for r in requests]
        sizes = [t.shape[0] for t in inputs]
        with torch.inference_mode():
            y = self.model(torch.cat(inputs).to(self.device, non_blocking=True))
        out, start = [], 0
        for n in sizes:
            part = y[start:start + n].contiguous()
            start += n
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor.from_dlpack("OUTPUT__0", part)]))
        return out
"""

# The dry run's model: the same MLP in NumPy, its weights beside it.
NUMPY_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        w = np.load(args["model_repository"] + "/1/weights.npz")
        self.layers = [(w[f"w{i}"], w[f"b{i}"]) for i in range(len(w.files) // 2)]

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT__0").as_numpy()
            for i, (w, b) in enumerate(self.layers):
                x = x @ w + b
                if i < len(self.layers) - 1:
                    x = np.maximum(x, 0)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT__0", x.astype(np.float32))]))
        return out
"""


def numpy_mlp(weights):
    """The in-process stand-in on a dry run: the NumPy model's own arithmetic."""
    def run(x):
        for i, (w, b) in enumerate(weights):
            x = x @ w + b
            if i < len(weights) - 1:
                x = np.maximum(x, 0)
        return x
    return run


def write_model(repo, name, count, source, extra=""):
    """A Python model directory. `source`: the TorchScript file (GPU) or the weights (dry)."""
    d = repo / name
    (d / "1").mkdir(parents=True, exist_ok=True)
    if S.dry:
        np.savez(d / "1" / "weights.npz", **{f"{k}{i}": a for i, (w, b) in enumerate(source)
                                           for k, a in (("w", w), ("b", b))})
        (d / "1" / "model.py").write_text(NUMPY_MODEL)
    else:
        shutil.copy(source, d / "1" / "model.pt")
        (d / "1" / "model.py").write_text(PY_MODEL)
    (d / "config.pbtxt").write_text(model_config(name, HEADER, group(count), extra))


class Mps:
    """The CUDA MPS control daemon for this check alone (its own pipe and log folders)."""

    def __init__(self):
        self.binary = shutil.which("nvidia-cuda-mps-control")
        base = S.work / "mps"
        self.env = {"CUDA_MPS_PIPE_DIRECTORY": str(base / "pipe"),
                    "CUDA_MPS_LOG_DIRECTORY": str(base / "log")}
        self.started = False

    def unavailable(self):
        if S.dry:
            return "dry run on the CPU"
        if not self.binary:
            return "nvidia-cuda-mps-control is not on this machine's PATH"
        return None

    def control(self, command):
        p = subprocess.run([self.binary], input=command + "\n", capture_output=True, text=True,
                           env=dict(os.environ, **self.env), timeout=20)
        return (p.stdout + p.stderr).strip()

    def start(self):
        for d in self.env.values():
            Path(d).mkdir(parents=True, exist_ok=True)
        p = subprocess.run([self.binary, "-d"], capture_output=True, text=True,
                           env=dict(os.environ, **self.env), timeout=20)
        if p.returncode != 0:
            raise RuntimeError(f"nvidia-cuda-mps-control -d: exit {p.returncode}: "
                               f"{(p.stdout + p.stderr).strip()}")
        self.started = True

    def log_tail(self):
        f = Path(self.env["CUDA_MPS_LOG_DIRECTORY"]) / "control.log"
        return f.read_text()[-1500:] if f.exists() else ""

    def stop(self):
        if self.started:
            self.control("quit")
            self.started = False


def child_processes(pid):
    """The processes whose parent is `pid` (the server's stubs), from /proc."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return sorted(found)


def measure(nereid, repo, name, count, source, server_factory, extra="", env=None, mps=None):
    """One configuration: its own repository and server, the model alone."""
    conf_repo = repo.parent / f"py_repo_{name}"
    shutil.rmtree(conf_repo, ignore_errors=True)
    write_model(conf_repo, name, count, source, extra)
    server = server_factory(nereid, conf_repo, f"nereid_{name}", [], env)
    try:
        server.ready(name, deadline_s=90)
        result = {"count": count, "stub_processes": len(child_processes(server.proc.pid)),
                  "served": sweep(name, server, name, S.py_batches, S.py_concurrency)}
        if mps is not None:
            # The MPS server the daemon started for the stubs, if they connected to it.
            result["mps_server_list"] = mps.control("get_server_list")
        result["best"] = best(result["served"])
        return result
    finally:
        server.stop()


def run(nereid, repo, source, shared_param, server_factory):
    """Every configuration as its own step (py_1, py_2, py_2_mps, py_2_shared)."""
    step("py_1")(measure)(nereid, repo, "py_1", 1, source, server_factory)
    step("py_2")(measure)(nereid, repo, "py_2", 2, source, server_factory)
    mps = Mps()
    why = mps.unavailable()
    if why:
        skip("py_2_mps", f"MPS unavailable: {why}")
    else:
        def with_mps():
            try:
                mps.start()
                result = measure(nereid, repo, "py_2_mps", 2, source, server_factory,
                                 env=mps.env, mps=mps)
                return {"mps_available": True, **result}
            except Exception as e:
                raise RuntimeError(f"{e}; MPS log: {mps.log_tail()}") from e
            finally:
                mps.stop()
        step("py_2_mps")(with_mps)()
    if shared_param:
        key, _, value = shared_param.partition("=")
        extra = f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}\n'
        step("py_2_shared")(measure)(nereid, repo, "py_2_shared", 2, source, server_factory, extra)
    else:
        skip("py_2_shared", "--py-shared-param is empty")


def best_of_run():
    """The best served Python rows/s of this section and of the torch bench, and where."""
    found = []
    for name in ("py_1", "py_2", "py_2_mps", "py_2_shared"):
        r = RESULTS.get(name, {})
        if r.get("ok") and r.get("best"):
            found.append((r["best"], name))
    b = RESULTS.get("bench", {})
    if b.get("ok"):
        rate = best(b["served"], "python_backend")
        if rate:
            found.append((rate, "bench"))
    return max(found) if found else (None, None)
