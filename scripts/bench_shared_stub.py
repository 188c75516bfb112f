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

usage: scripts/bench_shared_stub.py [--nereid PATH] [--counts 2,4,8] [--runs N] [--imports MOD]
Python models run on NEREID_PYTHON (default: this repository's .venv/bin/python).
"""

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


def write_repository(path, count, shared, imports):
    model = path / "identity"
    (model / "1").mkdir(parents=True)
    config = [gen_python_models.identity("TYPE_FP32", "4", 0),
              f"instance_group [ {{ count: {count} kind: KIND_CPU }} ]"]
    if shared:
        config.append(SHARED)
    (model / "config.pbtxt").write_text("\n".join(config) + "\n")
    source = "".join(f"import {name}\n" for name in imports) + gen_python_models.IDENTITY
    (model / "1" / "model.py").write_text(source)


def measure(binary, count, shared, imports, workdir):
    repo = Path(tempfile.mkdtemp(dir=workdir))
    write_repository(repo / "repo", count, shared, imports)
    http, grpc, metrics = free_port(), free_port(), free_port()
    env = dict(os.environ)
    env.setdefault("NEREID_PYTHON", str(ROOT / ".venv/bin/python"))
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
    a = parser.parse_args(argv)
    imports = [m for m in a.imports.split(",") if m]
    counts = [int(c) for c in a.counts.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="nereid-shared-bench-") as workdir:
        for count in counts:
            runs = {False: [], True: []}
            for _ in range(a.runs):
                for shared in (False, True):
                    runs[shared].append(measure(a.nereid, count, shared, imports, workdir))
            rows.append((count, {s: {k: statistics.median(r[k] for r in runs[s]) for k in runs[s][0]}
                                 for s in runs}))
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
