#!/usr/bin/env python3
"""Memory of N Python-backend instances in separate stub processes vs one shared stub process
(model parameter SHARED_STUB_PROCESS, docs/python-backend.md#shared-stub-process).

For each instance count and each mode, a fresh `nereid serve` on a repository of one FP32 [4]
identity `model.py` (scripts/gen_python_models.py) with `count: N` KIND_CPU instances, optionally
importing a heavy module first (`--imports torch`: what a GPU model's stub loads). Once the
server is ready: the stub processes (the server's descendants), their PSS summed (from
/proc/PID/smaps_rollup: shared pages split between the processes that map them, so the sum is
what they cost together) and the server's own PSS. Runs are interleaved (separate, shared,
separate, ...) and the median is reported as a Markdown table.

`--throughput SECONDS` then measures what the GIL does to two instances sharing a process: the
same repository with `count: 2` whose `execute` does, before answering, either NumPy work that
releases the GIL (a 256 x 256 float64 matrix product, BLAS on one thread) or the same time's
worth of pure-Python work, served a process each and shared, under nereid-loadtest's closed loop
at concurrency 4 for SECONDS (inferences/s, the median of the runs).

usage: scripts/bench_shared_stub.py [--nereid PATH] [--counts 2,4,8] [--runs N] [--imports MOD]
                                    [--throughput SECONDS] [--loadtest PATH]
Python models run on NEREID_PYTHON (default: this repository's .venv/bin/python).
"""

import json

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests/python"))

import bench_footprint  # noqa: E402
import gen_python_models  # noqa: E402
from nereid_util import free_port, http_raw, loopback_listen_args  # noqa: E402

SHARED = 'parameters { key: "SHARED_STUB_PROCESS" value: { string_value: "true" } }'


# Work done in `execute` before the identity answer (on `self`, made once in `initialize`).
WORK = {
    "numpy (GIL released)": ("import numpy as np\n", "self.m = np.random.default_rng(0).random((256, 256))",
                             "for _ in range(40):\n                self.m @ self.m"),
    "pure Python (GIL held)": ("", "self.n = 600000", "sum(i * i for i in range(self.n))"),
}
WORK_MODEL = """{imports}import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        {setup}

    def execute(self, requests):
        out = []
        for request in requests:
            {work}
            out.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy())]))
        return out
"""


def write_repository(path, count, shared, imports, source=None):
    model = path / "identity"
    (model / "1").mkdir(parents=True)
    config = [gen_python_models.identity("TYPE_FP32", "4", 0),
              f"instance_group [ {{ count: {count} kind: KIND_CPU }} ]"]
    if shared:
        config.append(SHARED)
    (model / "config.pbtxt").write_text("\n".join(config) + "\n")
    if source is None:
        source = "".join(f"import {name}\n" for name in imports) + gen_python_models.IDENTITY
    (model / "1" / "model.py").write_text(source)


def measure(binary, count, shared, imports, workdir, source=None, loadtest=None, seconds=0):
    repo = Path(tempfile.mkdtemp(dir=workdir))
    write_repository(repo / "repo", count, shared, imports, source)
    http, grpc, metrics = free_port(), free_port(), free_port()
    env = dict(os.environ)
    env.setdefault("NEREID_PYTHON", str(ROOT / ".venv/bin/python"))
    for threads in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[threads] = "1"  # one core per execute: the instances are what runs in parallel
    args = [binary, "serve", "--model-repository", str(repo / "repo"),
            *loopback_listen_args(http, grpc, metrics)]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL, env=env, preexec_fn=bench_footprint._child_setup)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SystemExit(f"the server exited with {proc.returncode}")
            try:
                if http_raw(f"127.0.0.1:{http}", "GET", "/v2/health/ready", timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.05)
        else:
            raise SystemExit("the server was not ready within 300 s")
        if loadtest is not None:
            out = repo / "loadtest.json"
            subprocess.run([loadtest, "-u", f"127.0.0.1:{http}", "-m", "identity",
                            "--concurrency-range", "4", "--warmup-secs", "1",
                            "--duration-secs", str(seconds), "--json", str(out), "-q"],
                           check=True, stdout=subprocess.DEVNULL)
            return {"throughput": json.loads(out.read_text())[0]["throughput"]}
        stubs = bench_footprint.descendants(proc.pid)
        stub_pss = sum(bench_footprint.smaps_rollup_kb(p, "Pss") or 0 for p in stubs)
        server_pss = bench_footprint.smaps_rollup_kb(proc.pid, "Pss") or 0
        return {"processes": len(stubs), "stubs_kib": stub_pss, "server_kib": server_pss}
    finally:
        bench_footprint.kill_group(proc.pid)
        proc.wait(timeout=30)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nereid", default=os.environ.get("NEREID_BIN",
                                                           str(ROOT / "target/release/nereid")))
    parser.add_argument("--counts", default="2,4,8")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--imports", default="", help="modules model.py imports, comma-separated")
    parser.add_argument("--throughput", type=float, default=0,
                        help="also measure inferences/s for this many seconds per configuration")
    parser.add_argument("--loadtest", default=os.environ.get(
        "NEREID_LOADTEST_BIN", str(ROOT / "target/release/nereid-loadtest")))
    a = parser.parse_args(argv)
    imports = [m for m in a.imports.split(",") if m]
    counts = [int(c) for c in a.counts.split(",")]
    rows, speeds = [], []
    with tempfile.TemporaryDirectory(prefix="nereid-shared-bench-") as workdir:
        for work, (work_imports, setup, body) in WORK.items() if a.throughput else ():
            source = WORK_MODEL.format(imports=work_imports, setup=setup, work=body)
            runs = {False: [], True: []}
            for _ in range(a.runs):
                for shared in (False, True):
                    runs[shared].append(measure(a.nereid, 2, shared, [], workdir, source,
                                                a.loadtest, a.throughput)["throughput"])
            speeds.append((work, {s: statistics.median(runs[s]) for s in runs}))
        for count in counts:
            runs = {False: [], True: []}
            for _ in range(a.runs):
                for shared in (False, True):
                    runs[shared].append(measure(a.nereid, count, shared, imports, workdir))
            rows.append((count, {s: {k: statistics.median(r[k] for r in runs[s]) for k in runs[s][0]}
                                 for s in runs}))
    if speeds:
        print("| 2 instances, execute does | a process each | one shared process |")
        print("|---|---:|---:|")
        for work, by_mode in speeds:
            print(f"| {work} | {by_mode[False]:.0f} inf/s | {by_mode[True]:.0f} inf/s |")
        print()
    what = "identity model.py" + (" importing " + ", ".join(imports) if imports else "")
    print(f"| instances ({what}) | stub processes | stubs' PSS | server PSS |")
    print("|---|---|---|---|")
    for count, by_mode in rows:
        for shared in (False, True):
            m = by_mode[shared]
            mode = "one shared process" if shared else "a process each"
            print(f"| {count}, {mode} | {m['processes']:.0f} | {m['stubs_kib'] / 1024:.1f} MiB | "
                  f"{m['server_kib'] / 1024:.1f} MiB |")


if __name__ == "__main__":
    main()
