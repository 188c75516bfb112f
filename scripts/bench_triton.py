#!/usr/bin/env python3
"""Nereid versus the real Triton server (2.51.0, `make triton-ref`) on the same Python-backend
models, measured by Triton's own perf_analyzer in one run.

For each model (identity FP32[16], add_sub INT32[4], a 1 MiB FP32 tensor), protocol (gRPC,
HTTP) and concurrency (1, 8, 32), perf_analyzer runs against Nereid, then Triton, back to back
(interleaved, so a busy neighbour on a shared machine hits both alike). Besides throughput and
latency, each server's CPU time per inference: utime+stime of the server process and its
children (the Python stubs), read from /proc before and after the level, divided by the
inferences the server's statistics counted in that time, in all and split into server + stubs. That figure holds on a shared machine;
throughput does not.

usage: scripts/bench_triton.py [OUT_DIR]    (default target/bench; writes triton.json there and
                                             prints a Markdown table)
env:   NEREID_BIN (default target/release/nereid), NEREID_TRITON (default
       .venv-triton/tritonserver), BENCH_TRITON_INTERVAL_MS (perf_analyzer's measurement
       window, default 2000), BENCH_TRITON_CONCURRENCY (default "1 8 32"),
       BENCH_TRITON_MODELS (default "identity_fp32 add_sub identity_large").
"""

import csv
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests/python"))
sys.path.insert(0, str(ROOT / "scripts"))

import gen_python_models  # noqa: E402
from bench_footprint import descendants  # noqa: E402
from nereid_util import http_raw  # noqa: E402
from triton_util import start_pair  # noqa: E402

PA = ROOT / ".venv/perf_analyzer"
INTERVAL_MS = int(os.environ.get("BENCH_TRITON_INTERVAL_MS", "2000"))
CONCURRENCY = [int(c) for c in os.environ.get("BENCH_TRITON_CONCURRENCY", "1 8 32").split()]
MODELS = os.environ.get("BENCH_TRITON_MODELS", "identity_fp32 add_sub identity_large").split()
# perf_analyzer's input shape for models with variable dimensions.
SHAPES = {"identity_large": ["--shape", "INPUT0:262144"]}
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    """utime+stime of `pid` in seconds (0 once it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def tree_cpu_seconds(pid):
    """utime+stime of `pid` itself and of every live descendant (the Python stubs), in seconds."""
    return cpu_seconds(pid), sum(cpu_seconds(child) for child in descendants(pid))


def inference_count(server, model):
    _, _, body = http_raw(server.http_url, "GET", f"/v2/models/{model}/stats")
    return sum(s["inference_count"] for s in json.loads(body)["model_stats"])


def perf_analyzer(server, model, protocol, concurrency, work):
    """One level; on a busy machine perf_analyzer may find no stable window: one retry with
    longer windows, then the level is reported as unstable (None) and the run goes on."""
    for interval, trials in ((INTERVAL_MS, 6), (INTERVAL_MS * 2, 10)):
        result = perf_analyzer_once(server, model, protocol, concurrency, work, interval, trials)
        if result is not None:
            return result
    return None


def perf_analyzer_once(server, model, protocol, concurrency, work, interval, trials):
    url = server.grpc_url if protocol == "grpc" else server.http_url
    out = work / f"{server.name}-{model}-{protocol}-{concurrency}.csv"
    cmd = [str(PA), "-m", model, "-i", protocol, "-u", url,
           "--concurrency-range", str(concurrency), "--measurement-interval", str(interval),
           "--stability-percentage", "50", "--max-trials", str(trials), "-f", str(out),
           *SHAPES.get(model, [])]
    cpu0, n0 = tree_cpu_seconds(server.proc.pid), inference_count(server, model)
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    cpu1, n1 = tree_cpu_seconds(server.proc.pid), inference_count(server, model)
    if run.returncode != 0:
        print(f"warning: perf_analyzer failed on {server.name}: {' '.join(cmd)}\n"
              f"{run.stdout[-600:]}{run.stderr[-600:]}", file=sys.stderr)
        return None
    with open(out) as f:
        row = next(csv.DictReader(f))
    return {
        "throughput": float(row["Inferences/Second"]),
        "p50_us": int(row["p50 latency"]),
        "p99_us": int(row["p99 latency"]),
        "cpu_us_per_inference": (sum(cpu1) - sum(cpu0)) * 1e6 / max(1, n1 - n0),
        "server_cpu_us_per_inference": (cpu1[0] - cpu0[0]) * 1e6 / max(1, n1 - n0),
        "stub_cpu_us_per_inference": (cpu1[1] - cpu0[1]) * 1e6 / max(1, n1 - n0),
        "inferences": n1 - n0,
        "command": " ".join(cmd).replace(str(ROOT) + "/", ""),
    }


def main():
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "target/bench")
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench_triton_"))
    repo = gen_python_models.write_repository(work / "repo", MODELS)
    nereid, triton = start_pair(repo, work)
    rows = []
    try:
        for model in MODELS:
            for protocol in ("grpc", "http"):
                for c in CONCURRENCY:
                    row = {"model": model, "protocol": protocol, "concurrency": c}
                    for server in (nereid, triton):
                        print(f"==> {server.name} {model} {protocol} c={c}", file=sys.stderr)
                        row[server.name] = perf_analyzer(server, model, protocol, c, work)
                    rows.append(row)
    finally:
        for s in (nereid, triton):
            s.stop()
    (out_dir / "triton.json").write_text(json.dumps(rows, indent=2))
    print("\n## Nereid versus Triton 2.51 (Python backend, perf_analyzer)\n")
    print("| model | protocol | concurrency | Nereid infer/s | Triton infer/s | ratio | "
          "Nereid p50 µs | Triton p50 µs | Nereid CPU µs/inf | Triton CPU µs/inf | "
          "Nereid server + stub µs | Triton server + stub µs |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        n, t = r["nereid"], r["triton"]
        if n is None or t is None:
            print(f"| {r['model']} | {r['protocol']} | {r['concurrency']} | unstable |  |  |  |"
                  "  |  |  |  |  |")
            continue
        print(f"| {r['model']} | {r['protocol']} | {r['concurrency']} | {n['throughput']:.0f} | "
              f"{t['throughput']:.0f} | {n['throughput'] / t['throughput']:.2f} | {n['p50_us']} | "
              f"{t['p50_us']} | {n['cpu_us_per_inference']:.0f} | "
              f"{t['cpu_us_per_inference']:.0f} | {split(n)} | {split(t)} |")


def split(result):
    """`server + stubs` CPU µs per inference."""
    return f"{result['server_cpu_us_per_inference']:.0f} + {result['stub_cpu_us_per_inference']:.0f}"


if __name__ == "__main__":
    main()
