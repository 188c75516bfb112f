"""The device half of scripts/gpu_check.sh (issues 19 and 39), run on the GPU machine.

Each step is recorded in OUT/gpu_check.json (ok / error / skipped with the reason / figures),
summed up in OUT/gpu_check.md; a failing step does not stop the others. The JSON's top level
also carries "ratio_vs_inprocess": {"onnxruntime_backend", "python_backend", "pytorch_backend"}
(best served rows/s / best in-process rows/s of the same model on the same device, this run).

Sections (--sections, all by default):
  torch      env (nvidia-smi, torch, CUDA); models: a TorchScript MLP made here (1024 -> 8192 x 4
             -> 1024, FP32, about 0.45 GFLOP a row); py_gpu / ts_gpu: it in a Python model and as
             a TorchScript model on KIND_GPU; py_auto / ts_auto: without instance_group
             (KIND_AUTO must pick the GPU); cuda_shm: tritonclient with CUDA shared memory (CuPy
             IPC handles); metrics: nv_gpu_*; inprocess: the MLP in process on the GPU (host in,
             host out, as served); bench: the served models, batch sweep x concurrency
  ort        gpu_ort.py: the same MLP as ONNX on ONNX Runtime's CUDA provider (onnxruntime-gpu,
             carried in parts by scripts/gpu_carry.sh), KIND_GPU and KIND_AUTO, TensorRT
             attempted, served vs in-process onnxruntime-gpu
  python     gpu_python.py: Python instances on one GPU: 1, 2, 2 under CUDA MPS, 2 in one stub
  cluster    gpu_placement.py: worker GPU report, GPU placement, measured GPU memory, and a
             second model that does not fit beside the first

--dry-run-cpu runs every section's logic on a CPU-only machine: ONNX Runtime on the CPU stands
in for CUDA (KIND_CPU), the Python model is the MLP in NumPy, the torch steps and MPS are
skipped with their reason, and the sizes shrink (--width/--hidden/--seconds... still apply);
with --onnxruntime-gpu-library it also probes onnxruntime-gpu's library on the CPU
(gpu_ort.probe_gpu_library).
"""

import argparse
import base64
import json
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np

import gpu_ort
import gpu_placement
import gpu_python
from gpu_lib import (IN, OUT, RESULTS, S, Nereid, best, group, grpc_client, infer, inprocess,
                     instance_groups, model_config, ratio, skip, step, sweep)

TORCH_STEPS = ("models", "py_gpu", "ts_gpu", "ts_auto", "py_auto", "cuda_shm", "metrics",
               "inprocess", "bench")
PY_COUNT = {"n": 2}  # instances of py_gpu (--py-count)


@step("env")
def env():
    smi = shutil.which("nvidia-smi")
    info = {"gpu": subprocess.run([smi, "--query-gpu=name,memory.total,driver_version",
                                   "--format=csv,noheader"], capture_output=True,
                                  text=True).stdout.strip() if smi else "no nvidia-smi",
            "python": sys.version.split()[0], "dry_run": S.dry}
    if not S.dry:
        import torch
        info.update(torch=torch.__version__, cuda=torch.version.cuda,
                    cuda_available=torch.cuda.is_available())
    return info


def torch_mlp():
    import torch
    torch.manual_seed(0)
    layers = [torch.nn.Linear(S.width, S.hidden), torch.nn.ReLU()]
    for _ in range(3):
        layers += [torch.nn.Linear(S.hidden, S.hidden), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(S.hidden, S.width)).eval()


@step("models")
def make_models(repo, mlp):
    import torch
    scripted = torch.jit.script(mlp)
    for name, header in [("ts_gpu", 'platform: "pytorch_libtorch"'), ("py_gpu", 'backend: "python"'),
                         ("ts_auto", 'platform: "pytorch_libtorch"'), ("py_auto", 'backend: "python"')]:
        (repo / name / "1").mkdir(parents=True)
        scripted.save(str(repo / name / "1" / "model.pt"))
        count = PY_COUNT["n"] if name == "py_gpu" else 2
        grp = "" if name.endswith("_auto") else group(count)
        (repo / name / "config.pbtxt").write_text(model_config(name, header, grp))
    for name in ("py_gpu", "py_auto"):
        (repo / name / "1" / "model.py").write_text(gpu_python.PY_MODEL)
    return {"repo": str(repo)}


def torch_reference(repo):
    import torch
    model = torch.jit.load(str(repo / "py_gpu" / "1" / "model.pt")).cuda().eval()

    def run(x):
        with torch.inference_mode():
            return model(torch.from_numpy(x).cuda()).cpu().numpy()
    return run


def served(server, reference, model):
    server.ready(model)
    x = np.random.default_rng(1).standard_normal((4, S.width), dtype=np.float32)
    np.testing.assert_allclose(infer(grpc_client(server.grpc), model, x), reference(x),
                               rtol=1e-3, atol=1e-3)
    return {"instance_group": instance_groups(server, model)}


served_python = step("py_gpu")(served)
served_torch = step("ts_gpu")(served)


def resolved_to_gpu(server, reference, model):
    """A config without instance_group (KIND_AUTO) is served on the GPU, as Triton does."""
    result = served(server, reference, model)
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
    c = grpc_client(server.grpc)
    x = np.random.default_rng(2).standard_normal((8, S.width), dtype=np.float32)
    d_in = cp.asarray(x)
    d_out = cp.zeros_like(d_in)
    nbytes = x.nbytes
    for name, buf in [("gpu_in", d_in), ("gpu_out", d_out)]:
        handle = bytes(cp.cuda.runtime.ipcGetMemHandle(buf.data.ptr))
        c.register_cuda_shared_memory(name, base64.b64encode(handle), 0, nbytes)
    status = c.get_cuda_shared_memory_status(as_json=True)
    inp = grpcclient.InferInput(IN, list(x.shape), "FP32")
    inp.set_shared_memory("gpu_in", nbytes)
    out = grpcclient.InferRequestedOutput(OUT)
    out.set_shared_memory("gpu_out", nbytes)
    c.infer(model, [inp], outputs=[out], client_timeout=60)
    cp.cuda.runtime.deviceSynchronize()
    y = cp.asnumpy(d_out)
    np.testing.assert_allclose(y, infer(c, model, x), rtol=1e-4, atol=1e-4)
    c.unregister_cuda_shared_memory()
    return {"status": status}


@step("metrics")
def metrics(server):
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics}/metrics", timeout=10).read()
    lines = [line for line in text.decode().splitlines() if line.startswith("nv_gpu")]
    if not lines:
        raise RuntimeError("no nv_gpu_* metrics")
    return {"lines": lines[:40]}


@step("inprocess")
def measure_inprocess(repo, weights):
    """The MLP in process, host input -> device -> host output as served: torch on the GPU,
    or (dry run) the Python model's NumPy arithmetic on the CPU."""
    if S.dry:
        mlp = gpu_python.numpy_mlp(weights)
        xs = {b: np.random.default_rng(3).standard_normal((b, S.width), dtype=np.float32)
              for b in S.batches}
        return {"engine": "numpy", "rates": inprocess(lambda b: mlp(xs[b]))}
    import torch
    model = torch.jit.load(str(repo / "py_gpu" / "1" / "model.pt")).cuda().eval()
    xs = {b: torch.randn(b, S.width).pin_memory() for b in S.batches}

    def run(b):
        with torch.inference_mode():
            model(xs[b].cuda(non_blocking=True)).cpu()
    return {"engine": "torch", "rates": inprocess(run)}


def best_inprocess():
    r = RESULTS.get("inprocess", {})
    return max(r["rates"].values()) if r.get("ok") else None


@step("bench")
def bench(servers):
    rows = [row for label, (server, name) in servers.items() for row in sweep(label, server, name)]
    return {"served": rows, "ratio_best_served_to_best_inprocess": {
        label: ratio(best(rows, label), best_inprocess()) for label in servers}}


def torch_section(a, repo, box, serve):
    """The issue-19 steps. The model file and the in-process rates always (the other sections
    use them); the servers only when `serve`. Fills box with the MLP's weights and reference."""
    if S.dry:
        for name in TORCH_STEPS:
            if name != "inprocess":
                skip(name, "dry run on the CPU: torch on a GPU")
        box["weights"] = gpu_ort.mlp_weights()
        box["reference"] = gpu_python.numpy_mlp(box["weights"])
        measure_inprocess(repo, box["weights"])
        return
    mlp = torch_mlp()
    box["weights"] = gpu_ort.mlp_weights(mlp)
    if not make_models(repo, mlp)["ok"]:
        return
    box["reference"] = torch_reference(repo)
    measure_inprocess(repo, None)
    if not serve:
        return
    plain = Nereid(a.nereid, repo, "nereid")
    torch_server = Nereid(a.nereid_torch, repo, "nereid_torch") if a.nereid_torch else None
    servers = {}
    try:
        if served_python(plain, box["reference"], "py_gpu")["ok"]:
            servers["python_backend"] = (plain, "py_gpu")
            cuda_shm(plain, "py_gpu")
            metrics(plain)
        if torch_server and served_torch(torch_server, box["reference"], "ts_gpu")["ok"]:
            servers["pytorch_backend"] = (torch_server, "ts_gpu")
        if torch_server:
            auto_torch(torch_server, box["reference"], "ts_auto")
        auto_python(plain, box["reference"], "py_auto")
        if a.bench_only:
            servers = {k: v for k, v in servers.items() if k == a.bench_only}
        if servers and not a.no_bench:
            bench(servers)
    finally:
        plain.stop()
        if torch_server:
            torch_server.stop()


def ratios():
    """Best served / best in-process of each backend's model, this run (None: not measured)."""
    b = RESULTS.get("bench", {})
    torch_ratio = b["ratio_best_served_to_best_inprocess"].get("pytorch_backend") \
        if b.get("ok") else None
    py_best, py_where = gpu_python.best_of_run()
    return {"onnxruntime_backend": gpu_ort.ratio_of_run(),
            "python_backend": ratio(py_best, best_inprocess()),
            "pytorch_backend": torch_ratio}, py_where


def markdown(out, rv, py_where):
    lines = ["# GPU check", "", f"device: {RESULTS.get('env', {}).get('gpu', '?')}", ""]
    for name, r in RESULTS.items():
        state = "ok" if r.get("ok") else (f"skipped: {r['skipped']}" if r.get("ok") is None
                                           else f"FAILED: {r['error']}")
        lines.append(f"- {name}: {state}")
    lines += ["", f"ratio_vs_inprocess (best served / best in-process): {json.dumps(rv)}"
              f" (Python's best from {py_where})", ""]
    for name in ("inprocess", "bench", "ort_bench", "py_1", "py_2", "py_2_mps", "py_2_shared"):
        r = RESULTS.get(name, {})
        if not r.get("ok"):
            continue
        if "rates" in r or "inprocess" in r:
            rates = r.get("rates") or r["inprocess"]
            lines += [f"{name} in-process rows/s by batch: {json.dumps(rates)}", ""]
        rows = r.get("served", [])
        if rows:
            batches = sorted({x["batch"] for x in rows})
            lines += [f"| {name}: server | concurrency | " + " | ".join(f"batch {x}" for x in batches)
                      + " |", "| --- | --- |" + " --- |" * len(batches)]
            for label in sorted({x["server"] for x in rows}):
                for conc in sorted({x["concurrency"] for x in rows}):
                    cells = [str(x["infer_per_sec"]) for x in rows
                             if x["server"] == label and x["concurrency"] == conc]
                    lines.append(f"| {label} | {conc} | " + " | ".join(cells) + " |")
            lines.append("")
    (out / "gpu_check.md").write_text("\n".join(lines) + "\n")


def ints(text):
    return [int(x) for x in text.split(",")]


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nereid", required=True)
    p.add_argument("--nereid-torch", help="the binary beside the PyTorch backend library")
    p.add_argument("--onnxruntime-library", help="onnxruntime-gpu's libonnxruntime.so.* "
                   "(the ONNX Runtime section is skipped without it)")
    p.add_argument("--onnxruntime-gpu-library",
                   help="with --dry-run-cpu: onnxruntime-gpu's library, probed on the CPU")
    p.add_argument("--out", required=True)
    p.add_argument("--sections", default="torch,ort,python,cluster")
    p.add_argument("--dry-run-cpu", action="store_true",
                   help="CPU-only machine: ORT CPU stands in for CUDA, small sizes")
    p.add_argument("--no-bench", action="store_true", help="skip the torch throughput sweep")
    p.add_argument("--py-count", type=int, default=2,
                   help="instances (stub processes) of the torch section's Python model")
    p.add_argument("--bench-only", choices=["python_backend", "pytorch_backend"])
    p.add_argument("--ort-count", type=int, default=2, help="ONNX Runtime instances on GPU 0")
    p.add_argument("--py-shared-param", metavar="KEY=VALUE", default="SHARED_STUB_PROCESS=true",
                   help="the model parameter that hosts a model's instances in one stub "
                        "process ('' skips that configuration)")
    p.add_argument("--width", type=int)
    p.add_argument("--hidden", type=int)
    p.add_argument("--seconds", type=float, help="per measured cell")
    p.add_argument("--batches", type=ints)
    p.add_argument("--concurrency", type=ints)
    p.add_argument("--py-batches", type=ints)
    p.add_argument("--py-concurrency", type=ints)
    p.add_argument("--work", help="scratch folder (default /tmp/gpu)")
    a = p.parse_args()
    if a.dry_run_cpu:
        S.dry, S.width, S.hidden, S.seconds = True, 64, 256, 0.3
        S.batches, S.concurrency, S.py_batches, S.py_concurrency = [1, 8, 32], [1, 4], [8, 32], [4]
    for name in ("width", "hidden", "seconds", "batches", "concurrency", "py_batches",
                 "py_concurrency"):
        if getattr(a, name) is not None:
            setattr(S, name, getattr(a, name))
    if a.work:
        S.work = Path(a.work)
    PY_COUNT["n"] = a.py_count
    return a


def main():
    a = parse()
    # `timeout` stops the check with SIGTERM: unwind (servers stopped, the JSON written).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    S.logs.mkdir(parents=True, exist_ok=True)
    repo = S.work / "repo"
    for d in S.work.glob("*repo*"):
        shutil.rmtree(d, ignore_errors=True)
    repo.mkdir(parents=True)
    sections = set(a.sections.split(","))
    env()
    box = {}
    try:
        torch_section(a, repo, box, "torch" in sections)
        if "weights" not in box:
            raise RuntimeError("the MLP could not be made: see the models step")
        if "ort" in sections:
            library = Path(a.onnxruntime_library) if a.onnxruntime_library else None
            gpu_ort.run(a.nereid, repo, library, box["weights"], a.ort_count, Nereid)
            if S.dry and a.onnxruntime_gpu_library:
                gpu_ort.probe_gpu_library(a.nereid, repo, Path(a.onnxruntime_gpu_library),
                                          box["weights"], Nereid)
        # The Python model's source: the TorchScript file, or (dry run) the NumPy weights.
        source = box["weights"] if S.dry else repo / "py_gpu" / "1" / "model.pt"
        if "python" in sections:
            gpu_python.run(a.nereid, repo, source, a.py_shared_param, Nereid)
        if "cluster" in sections:
            model_dir = repo / "py_gpu"
            if S.dry:
                model_dir = S.work / "py_cluster" / "py_gpu"
                gpu_python.write_model(model_dir.parent, "py_gpu", 1, source)
            gpu_placement.run(a.nereid, repo, model_dir, box["reference"])
    finally:
        rv, py_where = ratios()
        doc = {"ratio_vs_inprocess": rv, "python_backend_best_from": py_where,
               "settings": {k: (str(v) if isinstance(v, Path) else v)
                            for k, v in vars(S).items()}, **RESULTS}
        (out / "gpu_check.json").write_text(json.dumps(doc, indent=1))
        markdown(out, rv, py_where)
        print(f"ratio_vs_inprocess: {json.dumps(rv)}", flush=True)


if __name__ == "__main__":
    main()
