"""The device half of scripts/gpu_check.sh (issue 19), run on the GPU machine.

Each step is recorded in OUT/gpu_check.json (ok / error / figures) and summed up in
OUT/gpu_check.md; a failing step does not stop the others.

  env        nvidia-smi's GPU, torch and CUDA versions
  models     a TorchScript MLP made here with the device's torch (1024 -> 8192 x 4 -> 1024,
             FP32: about 0.45 GFLOP a row, so a batch of 256 keeps the GPU busy for
             milliseconds while each request carries only 1 MiB in and out)
  py_gpu     the MLP in a Python model on KIND_GPU (torch on cuda:<device id>, outputs returned
             as CUDA tensors through Tensor.from_dlpack), served by `nereid` (no libtorch)
  ts_gpu     the same file as a TorchScript model on KIND_GPU, served by `nereid-torch` (the
             PyTorch backend), if that binary starts against the device's libtorch
  cuda_shm   tritonclient gRPC with inputs and outputs in CUDA shared memory (CuPy buffers,
             their IPC handles registered with CudaSharedMemoryRegister)
  metrics    the nv_gpu_* lines of /metrics
  cluster    a control plane and a worker: the worker's GPU report (NVML) as the control
             plane shows it, the Python model deployed with `resources.gpus` placed on a GPU,
             and the GPU memory the worker measured for the replica
  bench      in-process torch on the GPU (host input -> GPU -> host output, as served) vs the
             served models, batch 1..256 at concurrency 1, 8 and 32
"""

import argparse
import base64
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import traceback
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests/python"))
from nereid_util import free_port, loopback_listen_args  # noqa: E402

RESULTS = {}
BATCHES = [1, 8, 32, 128, 256]
CONCURRENCY = [1, 8, 32]
SECONDS = 1.5
WIDTH = 1024
HIDDEN = 8192

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


GPU_COUNT = {"ts_gpu": 2, "py_gpu": 2}  # instances per model on GPU 0 (--py-count changes py_gpu)


def config(name, platform_or_backend, group=None):
    """`group` None: `KIND_GPU` on GPU 0, GPU_COUNT instances; empty: no instance_group, so the
    server resolves KIND_AUTO."""
    if group is None:
        group = f"instance_group [ {{ kind: KIND_GPU count: {GPU_COUNT[name]} gpus: [ 0 ] }} ]\n"
    return (f'name: "{name}"\n{platform_or_backend}\nmax_batch_size: 256\n'
            f'input [ {{ name: "INPUT__0" data_type: TYPE_FP32 dims: [ {WIDTH} ] }} ]\n'
            f'output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ {WIDTH} ] }} ]\n'
            'dynamic_batching { max_queue_delay_microseconds: 200 }\n' + group)


def step(name):
    def wrap(fn):
        def run(*a, **k):
            started = time.monotonic()
            try:
                value = fn(*a, **k)
                RESULTS[name] = {"ok": True, **(value or {})}
            except Exception as e:  # noqa: BLE001 - every step is reported, none stops the rest
                RESULTS[name] = {"ok": False, "error": f"{type(e).__name__}: {e}",
                                 "trace": traceback.format_exc()[-3000:]}
            RESULTS[name]["seconds"] = round(time.monotonic() - started, 1)
            print(f"== {name}: {json.dumps(RESULTS[name])[:1500]}", flush=True)
            return RESULTS[name]
        return run
    return wrap


class Nereid:
    def __init__(self, binary, repo, logs, name):
        self.http, self.grpc, self.metrics = free_port(), free_port(), free_port()
        self.log = open(Path(logs) / f"{name}.log", "wb")
        args = [binary, "serve", "--model-repository", str(repo), "--allow-client-shm=true",
                *loopback_listen_args(self.http, self.grpc, self.metrics)]
        env = dict(os.environ, NEREID_PYTHON=sys.executable)
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, env=env)

    def ready(self, model, deadline_s=120):
        end = time.monotonic() + deadline_s
        url = f"http://127.0.0.1:{self.http}/v2/models/{model}/ready"
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}")
            try:
                if urllib.request.urlopen(url, timeout=2).status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{model} not ready in {deadline_s}s")

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@step("env")
def env():
    import torch
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                          "--format=csv,noheader"], capture_output=True, text=True).stdout
    return {"gpu": smi.strip(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "cuda_available": torch.cuda.is_available()}


@step("models")
def make_models(repo):
    import torch
    torch.manual_seed(0)
    layers = [torch.nn.Linear(WIDTH, HIDDEN), torch.nn.ReLU()]
    for _ in range(3):
        layers += [torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU()]
    mlp = torch.nn.Sequential(*layers, torch.nn.Linear(HIDDEN, WIDTH))
    scripted = torch.jit.script(mlp.eval())
    for name, header in [("ts_gpu", 'platform: "pytorch_libtorch"'), ("py_gpu", 'backend: "python"'),
                         ("ts_auto", 'platform: "pytorch_libtorch"'), ("py_auto", 'backend: "python"')]:
        (repo / name / "1").mkdir(parents=True)
        scripted.save(str(repo / name / "1" / "model.pt"))
        group = "" if name.endswith("_auto") else None
        (repo / name / "config.pbtxt").write_text(config(name, header, group))
    for name in ("py_gpu", "py_auto"):
        (repo / name / "1" / "model.py").write_text(PY_MODEL)
    return {"repo": str(repo)}


def client(server):
    return grpc_client(server.grpc)


def grpc_client(port):
    import tritonclient.grpc as grpcclient
    return grpcclient.InferenceServerClient(f"127.0.0.1:{port}")


def infer(c, model, x):
    import tritonclient.grpc as grpcclient
    inp = grpcclient.InferInput("INPUT__0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return c.infer(model, [inp], client_timeout=60).as_numpy("OUTPUT__0")


def reference(repo, x):
    import torch  # every model file is the same module
    model = torch.jit.load(str(repo / "py_gpu" / "1" / "model.pt")).cuda().eval()
    with torch.inference_mode():
        return model(torch.from_numpy(x).cuda()).cpu().numpy()


def served(server, repo, model):
    server.ready(model)
    x = np.random.default_rng(1).standard_normal((4, WIDTH), dtype=np.float32)
    c = client(server)
    y = infer(c, model, x)
    np.testing.assert_allclose(y, reference(repo, x), rtol=1e-3, atol=1e-3)
    cfg = c.get_model_config(model, as_json=True)["config"]["instance_group"]
    return {"instance_group": cfg}


served_python = step("py_gpu")(served)
served_torch = step("ts_gpu")(served)


def resolved_to_gpu(server, repo, model):
    """A config without instance_group (KIND_AUTO) is served on the GPU, as Triton does."""
    result = served(server, repo, model)
    kinds = {g["kind"] for g in result["instance_group"]}
    if kinds != {"KIND_GPU"}:
        raise RuntimeError(f"KIND_AUTO resolved to {kinds}, not KIND_GPU")
    return result


auto_python = step("py_auto")(resolved_to_gpu)
auto_torch = step("ts_auto")(resolved_to_gpu)


@step("cuda_shm")
def cuda_shm(server, model):
    import cupy as cp
    import tritonclient.grpc as grpcclient
    # Plain cudaMalloc per buffer (no pool): an IPC handle names a whole allocation, and the
    # server opens it at its base address.
    cp.cuda.set_allocator(None)
    c = client(server)
    x = np.random.default_rng(2).standard_normal((8, WIDTH), dtype=np.float32)
    d_in = cp.asarray(x)
    d_out = cp.zeros_like(d_in)
    nbytes = x.nbytes
    for name, buf in [("gpu_in", d_in), ("gpu_out", d_out)]:
        handle = bytes(cp.cuda.runtime.ipcGetMemHandle(buf.data.ptr))
        c.register_cuda_shared_memory(name, base64.b64encode(handle), 0, nbytes)
    status = c.get_cuda_shared_memory_status(as_json=True)
    inp = grpcclient.InferInput("INPUT__0", list(x.shape), "FP32")
    inp.set_shared_memory("gpu_in", nbytes)
    out = grpcclient.InferRequestedOutput("OUTPUT__0")
    out.set_shared_memory("gpu_out", nbytes)
    c.infer(model, [inp], outputs=[out], client_timeout=60)
    cp.cuda.runtime.deviceSynchronize()
    y = cp.asnumpy(d_out)
    with_plain = infer(c, model, x)
    np.testing.assert_allclose(y, with_plain, rtol=1e-4, atol=1e-4)
    c.unregister_cuda_shared_memory()
    return {"status": status}


@step("metrics")
def metrics(server):
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics}/metrics", timeout=10).read()
    lines = [l for l in text.decode().splitlines() if l.startswith("nv_gpu")]
    if not lines:
        raise RuntimeError("no nv_gpu_* metrics")
    return {"lines": lines[:40]}


def throughput(server, model, batch, concurrency):
    x = np.random.default_rng(3).standard_normal((batch, WIDTH), dtype=np.float32)
    counts = [0] * concurrency
    stop = time.monotonic() + SECONDS

    def work(i):
        c = client(server)
        while time.monotonic() < stop:
            infer(c, model, x)
            counts[i] += batch
        c.close()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(concurrency)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.monotonic() - start)


@step("cluster")
def cluster(repo, logs):
    from cluster_util import ControlPlaneNode, WorkerProcess, model_body, wait_replicas, \
        write_token
    from nereid_util import wait_until
    work = Path("/tmp/gpu/cluster")
    shutil.rmtree(work, ignore_errors=True)  # a fresh control plane each run (no old state)
    work.mkdir(parents=True)
    token = write_token(work)
    cp = ControlPlaneNode(1, work, token).spawn()
    worker = WorkerProcess("gpu-worker", work, token, [cp.grpc_addr]).spawn()
    try:
        wait_until(lambda: cp.api("GET", "/api/v1/nodes")[1].get("nodes"), 60, "worker registered")
        node = cp.api("GET", "/api/v1/nodes/gpu-worker")[1]
        body = model_body("py_gpu", repo / "py_gpu", replicas=1, memory=2 << 30)
        body["resources"].update({"gpus": 1, "gpu_memory_bytes": 8 << 30})
        code, answer = cp.api("POST", "/api/v1/models", body)
        if code != 200:
            raise RuntimeError(f"deploy: {code} {answer}")
        ready = wait_replicas(cp, "py_gpu",
                              lambda r: any(x["state"] == "REPLICA_STATE_READY" for x in r),
                              "a ready replica", deadline_s=120)
        placement = cp.api("GET", "/api/v1/models/py_gpu/placement")[1]
        # The measured GPU memory arrives with the next heartbeat after the load.
        measured = wait_until(
            lambda: [r for r in cp.api("GET", "/api/v1/models/py_gpu")[1].get("replicas", [])
                     if int(r.get("measured_gpu_memory_bytes", 0))], 30, "measured GPU memory")
        x = np.random.default_rng(4).standard_normal((2, WIDTH), dtype=np.float32)
        y = infer(grpc_client(worker.grpc_port), "py_gpu", x)
        np.testing.assert_allclose(y, reference(repo, x), rtol=1e-3, atol=1e-3)
        return {"node": node, "replicas": ready, "placement": placement, "measured": measured}
    finally:
        for p in (worker, cp):
            p.stop()
            shutil.copy(p.log_path, logs)


@step("bench")
def bench(repo, servers):
    import torch
    model = torch.jit.load(str(repo / "py_gpu" / "1" / "model.pt")).cuda().eval()
    inproc = {}
    for batch in BATCHES:
        x = torch.randn(batch, WIDTH).pin_memory()
        n, start = 0, time.monotonic()
        with torch.inference_mode():
            while time.monotonic() - start < SECONDS:
                model(x.cuda(non_blocking=True)).cpu()
                n += batch
        inproc[batch] = n / (time.monotonic() - start)
    rows = []
    for label, (server, name) in servers.items():
        for conc in CONCURRENCY:
            for batch in BATCHES:
                rows.append({"server": label, "concurrency": conc, "batch": batch,
                             "infer_per_sec": round(throughput(server, name, batch, conc), 1)})
    best_inproc = max(inproc.values())
    ratios = {label: max(r["infer_per_sec"] for r in rows if r["server"] == label) / best_inproc
              for label in servers}
    return {"inprocess": {str(b): round(v, 1) for b, v in inproc.items()}, "served": rows,
            "ratio_best_served_to_best_inprocess": {k: round(v, 3) for k, v in ratios.items()}}


def markdown(out):
    lines = ["# GPU check", "", f"device: {RESULTS.get('env', {}).get('gpu', '?')}", ""]
    for name, r in RESULTS.items():
        lines.append(f"- {name}: {'ok' if r['ok'] else 'FAILED: ' + r['error']}")
    b = RESULTS.get("bench", {})
    if b.get("ok"):
        lines += ["", "| server | concurrency | " + " | ".join(f"batch {x}" for x in BATCHES) + " |",
                  "| --- | --- |" + " --- |" * len(BATCHES)]
        lines.append("| in-process torch | 1 | " + " | ".join(
            str(b["inprocess"][str(x)]) for x in BATCHES) + " |")
        for label in sorted({r["server"] for r in b["served"]}):
            for conc in CONCURRENCY:
                cells = [str(r["infer_per_sec"]) for r in b["served"]
                         if r["server"] == label and r["concurrency"] == conc]
                lines.append(f"| {label} | {conc} | " + " | ".join(cells) + " |")
        lines += ["", f"best served / best in-process: {b['ratio_best_served_to_best_inprocess']}"]
    (out / "gpu_check.md").write_text("\n".join(lines) + "\n")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--nereid", required=True)
    p.add_argument("--nereid-torch", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--no-bench", action="store_true", help="skip the throughput sweep")
    p.add_argument("--py-count", type=int, default=2,
                   help="instances (stub processes) of the Python model on the GPU")
    p.add_argument("--bench-only", choices=["python_backend", "pytorch_backend"],
                   help="sweep one served model only")
    a = p.parse_args()
    GPU_COUNT["py_gpu"] = a.py_count
    out = Path(a.out)
    work = Path("/tmp/gpu")
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    repo = work / "repo"
    shutil.rmtree(repo, ignore_errors=True)
    env()
    make_models(repo)
    plain = Nereid(a.nereid, repo, logs, "nereid")
    torch_server = Nereid(a.nereid_torch, repo, logs, "nereid_torch")
    servers = {}
    try:
        if served_python(plain, repo, "py_gpu")["ok"]:
            servers["python_backend"] = (plain, "py_gpu")
            cuda_shm(plain, "py_gpu")
            metrics(plain)
        if served_torch(torch_server, repo, "ts_gpu")["ok"]:
            servers["pytorch_backend"] = (torch_server, "ts_gpu")
        auto_torch(torch_server, repo, "ts_auto")
        auto_python(torch_server, repo, "py_auto")
        if a.bench_only:
            servers = {k: v for k, v in servers.items() if k == a.bench_only}
        if servers and not a.no_bench:
            bench(repo, servers)
    finally:
        plain.stop()
        torch_server.stop()
    try:
        cluster(repo, logs)
    finally:
        (out / "gpu_check.json").write_text(json.dumps(RESULTS, indent=1))
        markdown(out)


if __name__ == "__main__":
    main()
