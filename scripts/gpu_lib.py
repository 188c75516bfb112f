"""The GPU check's harness (scripts/gpu_check.py and its sections gpu_ort.py, gpu_python.py,
gpu_placement.py): the run's settings, the recorded steps, a `nereid serve` process, and the
served throughput sweep that every served-vs-in-process comparison uses.

Each step lands in RESULTS[name] as {"ok": true, ...figures} or {"ok": false, "error", "trace"};
a step that cannot run here is {"ok": null, "skipped": reason}. A failing step never stops the
others.
"""

import json
import os
import subprocess
import sys
import threading
import time
import traceback
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests/python"))
from nereid_util import free_port, loopback_listen_args  # noqa: E402

RESULTS = {}
IN, OUT = "INPUT__0", "OUTPUT__0"


@dataclass
class Settings:
    """What one run measures. The defaults fit the device budget (about 8 minutes for the
    whole check on an H100/H200); --dry-run-cpu shrinks them to seconds on a CPU."""
    width: int = 1024          # the MLP's input and output width
    hidden: int = 8192         # its hidden width (3 hidden layers)
    batches: list = field(default_factory=lambda: [1, 8, 32, 128, 256])
    concurrency: list = field(default_factory=lambda: [1, 8, 32])
    seconds: float = 1.5       # per measured cell
    py_batches: list = field(default_factory=lambda: [32, 128, 256])  # the Python section's
    py_concurrency: list = field(default_factory=lambda: [8, 32])
    dry: bool = False          # --dry-run-cpu: the CPU stands in for the GPU
    work: Path = Path("/tmp/gpu")

    @property
    def logs(self):
        return self.work / "logs"

    @property
    def gpu_kind(self):
        """The instance kind the GPU sections ask for (KIND_CPU stands in on a dry run)."""
        return "KIND_CPU" if self.dry else "KIND_GPU"


S = Settings()


def step(name):
    def wrap(fn):
        def run(*a, **k):
            started = time.monotonic()
            try:
                value = fn(*a, **k)
                RESULTS[name] = {"ok": True, **(value or {})}
            except SystemExit:
                RESULTS[name] = {"ok": False, "error": "stopped by the check's time limit",
                                 "seconds": round(time.monotonic() - started, 1)}
                raise
            except Exception as e:  # noqa: BLE001 - every step is reported, none stops the rest
                RESULTS[name] = {"ok": False, "error": f"{type(e).__name__}: {e}",
                                 "trace": traceback.format_exc()[-3000:]}
            RESULTS[name]["seconds"] = round(time.monotonic() - started, 1)
            print(f"== {name}: {json.dumps(RESULTS[name])[:1500]}", flush=True)
            return RESULTS[name]
        return run
    return wrap


def skip(name, reason):
    """Records that step `name` did not run here, and why."""
    RESULTS[name] = {"ok": None, "skipped": reason}
    print(f"== {name}: skipped: {reason}", flush=True)
    return RESULTS[name]


def model_config(name, header, group, extra=""):
    """A config for the MLP. `group`: an instance_group line, or "" (KIND_AUTO)."""
    return (f'name: "{name}"\n{header}\nmax_batch_size: 256\n'
            f'input [ {{ name: "{IN}" data_type: TYPE_FP32 dims: [ {S.width} ] }} ]\n'
            f'output [ {{ name: "{OUT}" data_type: TYPE_FP32 dims: [ {S.width} ] }} ]\n'
            'dynamic_batching { max_queue_delay_microseconds: 200 }\n' + group + extra)


def group(count, kind=None):
    kind = kind or S.gpu_kind
    gpus = " gpus: [ 0 ]" if kind == "KIND_GPU" else ""
    return f"instance_group [ {{ kind: {kind} count: {count}{gpus} }} ]\n"


class Nereid:
    """`nereid serve` on free loopback ports, its log in S.logs/NAME.log."""

    def __init__(self, binary, repo, name, args=(), env=None):
        self.http, self.grpc, self.metrics = free_port(), free_port(), free_port()
        S.logs.mkdir(parents=True, exist_ok=True)
        self.log = open(S.logs / f"{name}.log", "wb")
        # --exit-on-error=false: a model that cannot load here (a TorchScript model without the
        # PyTorch backend library, TensorRT without its libraries) is recorded, not fatal.
        argv = [binary, "serve", "--model-repository", str(repo), "--allow-client-shm=true",
                "--exit-on-error=false", *loopback_listen_args(self.http, self.grpc, self.metrics),
                *args]
        env = dict(os.environ, NEREID_PYTHON=sys.executable, **(env or {}))
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, env=env)

    def url(self, path):
        return f"http://127.0.0.1:{self.http}{path}"

    def ready(self, model, deadline_s=120):
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}")
            try:
                if urllib.request.urlopen(self.url(f"/v2/models/{model}/ready"), timeout=2).status == 200:
                    return
            except OSError:
                pass
            reason = self.failed(model)
            if reason:
                raise RuntimeError(f"{model} failed to load: {reason}")
            time.sleep(0.2)
        raise RuntimeError(f"{model} not ready in {deadline_s}s")

    def failed(self, model):
        """The load failure the repository index reports for `model`, if it failed."""
        try:
            req = urllib.request.Request(self.url("/v2/repository/index"), data=b"{}", method="POST")
            rows = json.load(urllib.request.urlopen(req, timeout=5))
        except OSError:
            return None
        for row in rows:
            if row.get("name") == model and row.get("state") == "UNAVAILABLE" and row.get("reason"):
                return row["reason"]
        return None

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def grpc_client(port):
    import tritonclient.grpc as grpcclient
    return grpcclient.InferenceServerClient(f"127.0.0.1:{port}")


def infer(c, model, x):
    import tritonclient.grpc as grpcclient
    inp = grpcclient.InferInput(IN, list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return c.infer(model, [inp], client_timeout=60).as_numpy(OUT)


def instance_groups(server, model):
    return grpc_client(server.grpc).get_model_config(model, as_json=True)["config"]["instance_group"]


def throughput(server, model, batch, concurrency):
    """Rows per second of `concurrency` closed-loop gRPC clients sending `batch` rows each."""
    x = np.random.default_rng(3).standard_normal((batch, S.width), dtype=np.float32)
    counts = [0] * concurrency
    errors = []
    stop = time.monotonic() + S.seconds

    def work(i):
        c = grpc_client(server.grpc)
        try:
            while time.monotonic() < stop:
                infer(c, model, x)
                counts[i] += batch
        except Exception as e:  # noqa: BLE001 - reported by the caller
            errors.append(e)
        finally:
            c.close()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(concurrency)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return sum(counts) / (time.monotonic() - start)


def sweep(label, server, model, batches=None, concurrency=None):
    """Served rows/s for every (concurrency, batch) cell, as rows of the results."""
    return [{"server": label, "concurrency": conc, "batch": batch,
             "infer_per_sec": round(throughput(server, model, batch, conc), 1)}
            for conc in (concurrency or S.concurrency) for batch in (batches or S.batches)]


def inprocess(run_batch, batches=None):
    """Rows/s of `run_batch(batch)` (one host-in, host-out inference) in a loop, per batch."""
    rates = {}
    for batch in batches or S.batches:
        run_batch(batch)  # warm-up (allocations, kernel choice)
        n, start = 0, time.monotonic()
        while time.monotonic() - start < S.seconds:
            run_batch(batch)
            n += batch
        rates[str(batch)] = round(n / (time.monotonic() - start), 1)
    return rates


def best(rows, label=None):
    rates = [r["infer_per_sec"] for r in rows if label is None or r["server"] == label]
    return max(rates) if rates else None


def ratio(served, inproc):
    """Best served / best in-process, or None when either is missing."""
    if not served or not inproc:
        return None
    return round(served / inproc, 3)


def cuda_library_dirs():
    """The CUDA library folders of this Python's nvidia-* wheels (cuBLAS, cuDNN, ...)."""
    dirs = []
    for site in sys.path:
        base = Path(site) / "nvidia"
        if base.is_dir():
            dirs += sorted(str(p.parent) for p in base.glob("**/lib/lib*.so*"))
    return list(dict.fromkeys(dirs))
