#!/usr/bin/env python3
"""Footprint of Nereid beside the real Triton server (2.51.0, `make triton-ref`): time to ready,
memory and shutdown on Python-backend model repositories (the reference Triton has only the
Python backend).

Repositories (generated here; each model an FP32 [4] identity `model.py` from
scripts/gen_python_models.py with its config.pbtxt, no batching, KIND_CPU):
  empty  no model
  5      5 models, 1 instance each
  8x10   8 models, 10 instances in all (2 models with 2 instances, 6 with 1)
  50     50 models, 1 instance each

For each repository, run and server (interleaved: run 1 Nereid then Triton, run 2 ..., so a busy
neighbour on a shared machine hits both alike), on a fresh copy of the repository and free
127.0.0.1 ports, both started with the same loopback flags and nothing else:
  - time to ready: process start until GET /v2/health/ready answers 200 (polled every 20 ms);
  - then PSS of the main process and of the whole process tree (main + all descendants: the
    Python stubs), from /proc/PID/smaps_rollup; RSS (VmRSS) and thread count of the main
    process; with the empty repository, the largest mappings of the main process (by RSS, from
    /proc/PID/smaps, grouped by file: [heap], libtorch_cpu.so, anonymous memory ...; printed
    for the empty repository and the largest one measured, all in the JSON);
  - then SIGTERM to the main process and the time until it exits (bounded).
Reported: the median of the runs. Prints a Markdown table and writes footprint.json and
footprint.md to the output folder.

usage: scripts/bench_footprint.py [--nereid PATH] [--triton PATH] [--out DIR] [--runs N]
                                  [--repos empty,5,8x10,50]
Nereid's Python models run on NEREID_PYTHON (default: this repository's .venv/bin/python, which
has numpy).
"""

import argparse
import ctypes
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests/python"))

import gen_python_models  # noqa: E402
from nereid_util import free_port, http_json, http_raw  # noqa: E402

REPOS = {
    "empty": [],
    "5": [1] * 5,
    "8x10": [2, 2] + [1] * 6,
    "50": [1] * 50,
}
REPO_LABELS = {
    "empty": "empty",
    "5": "5 models",
    "8x10": "8 models, 10 instances",
    "50": "50 models",
}
SERVERS = ("nereid", "triton")
POLL_S = 0.020
TOP_MAPPINGS = 5
MIB = 1024 * 1024

# Every process this script started (main pids; each leads its own process group).
STARTED = []


def write_repository(path, counts):
    """One FP32 [4] identity model per entry of `counts` (its instance count)."""
    path.mkdir(parents=True)
    for i, count in enumerate(counts):
        model = path / f"identity_{i:02d}"
        (model / "1").mkdir(parents=True)
        config = "\n".join([
            gen_python_models.identity("TYPE_FP32", "4", 0),
            f"instance_group [ {{ count: {count} kind: KIND_CPU }} ]",
        ])
        (model / "config.pbtxt").write_text(config + "\n")
        (model / "1" / "model.py").write_text(gen_python_models.IDENTITY)
    return path


def _child_setup():
    """In the child: its own process group (so leftovers can be killed as a group) and SIGKILL if
    this script dies."""
    os.setsid()
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def kill_group(pid):
    """SIGKILL to the process group a started server leads (the server and its stubs)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def descendants(pid):
    """The live descendants of `pid` (any depth)."""
    children = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def smaps_rollup_kb(pid, field):
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def status_field(pid, field):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return None


def mappings_by_file(pid):
    """RSS and PSS (KiB) of the main process's mappings, summed per file name ([heap], [stack],
    a library's base name; "[anon]" for anonymous memory without a name)."""
    totals = {}
    name = None
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        first = line.split(None, 5)
        if first and "-" in first[0] and not first[0].endswith(":"):
            path = first[5].strip() if len(first) > 5 else ""
            if not path:
                name = "[anon]"
            elif path.startswith("["):
                name = path.split(":")[0] + ("]" if ":" in path else "")
            else:
                name = os.path.basename(path.replace(" (deleted)", ""))
            totals.setdefault(name, {"rss_kb": 0, "pss_kb": 0})
        elif name is not None and first and first[0] in ("Rss:", "Pss:"):
            key = "rss_kb" if first[0] == "Rss:" else "pss_kb"
            totals[name][key] += int(first[1])
    return totals


def measure_one(kind, binary, repo_src, workdir, run, ready_timeout, exit_timeout,
                nereid_python):
    """Start one server on a fresh copy of the repository, measure it, stop it."""
    repo = workdir / f"repo_{kind}_{run}"
    shutil.copytree(repo_src, repo)
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    args = [binary]
    if kind == "nereid":
        args.append("serve")
    args += [
        "--model-repository", str(repo),
        "--http-port", str(http_port), "--grpc-port", str(grpc_port),
        "--metrics-port", str(metrics_port),
        "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1",
        "--metrics-address", "127.0.0.1",
    ]
    env = dict(os.environ)
    if kind == "nereid":
        env["NEREID_PYTHON"] = nereid_python
    log_path = workdir / f"{kind}_{run}.log"
    with open(log_path, "wb") as log:
        t0 = time.monotonic()
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, preexec_fn=_child_setup)
    STARTED.append(proc.pid)

    def fail(why):
        kill_group(proc.pid)
        proc.wait(timeout=10)
        tail = log_path.read_bytes()[-4000:].decode("utf-8", "replace")
        raise RuntimeError(f"{kind} ({' '.join(args)}): {why}\n--- log tail ---\n{tail}")

    try:
        deadline = t0 + ready_timeout
        while True:
            if proc.poll() is not None:
                fail(f"exited with {proc.returncode} before ready")
            try:
                if http_raw(f"127.0.0.1:{http_port}", "GET", "/v2/health/ready",
                            timeout=1.0)[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                fail(f"not ready within {ready_timeout}s")
            time.sleep(POLL_S)
        ready_s = time.monotonic() - t0

        pid = proc.pid
        tree = [pid] + descendants(pid)
        main_pss = smaps_rollup_kb(pid, "Pss")
        tree_pss = sum(smaps_rollup_kb(p, "Pss") or 0 for p in tree)
        result = {
            "ready_s": ready_s,
            "main_pss_kb": main_pss,
            "tree_pss_kb": tree_pss,
            "main_rss_kb": status_field(pid, "VmRSS"),
            "threads": status_field(pid, "Threads"),
            "processes": len(tree),
        }
        result["mappings"] = mappings_by_file(pid)
        # A sanity check, after the measurement: every model of the repository is READY.
        status, rows = http_json(f"127.0.0.1:{http_port}", "POST", "/v2/repository/index", {})
        rows = rows if status == 200 else []
        result["models_ready"] = sum(1 for r in rows if r.get("state") == "READY")

        t_term = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            result["exit_code"] = proc.wait(timeout=exit_timeout)
            result["exit_s"] = time.monotonic() - t_term
        except subprocess.TimeoutExpired:
            result["exit_code"] = None
            result["exit_s"] = None  # did not exit within exit_timeout: killed below
        return result
    finally:
        # The server and anything left of its process group (stubs).
        kill_group(proc.pid)
        if proc.poll() is None:
            proc.wait(timeout=10)
        shutil.rmtree(repo, ignore_errors=True)


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize(runs):
    keys = ("ready_s", "main_pss_kb", "tree_pss_kb", "main_rss_kb", "threads", "processes",
            "exit_s", "models_ready")
    summary = {k: median([r.get(k) for r in runs]) for k in keys}
    summary["exit_timeouts"] = sum(1 for r in runs if r.get("exit_s") is None)
    if any("mappings" in r for r in runs):
        names = set()
        for r in runs:
            names.update(r.get("mappings", {}))
        merged = {
            name: {
                "rss_kb": median([r["mappings"].get(name, {}).get("rss_kb", 0) for r in runs]),
                "pss_kb": median([r["mappings"].get(name, {}).get("pss_kb", 0) for r in runs]),
            }
            for name in names
        }
        top = sorted(merged.items(), key=lambda kv: -kv[1]["rss_kb"])[:TOP_MAPPINGS]
        summary["top_mappings"] = [{"name": n, **v} for n, v in top]
    return summary


def mib(kb):
    return "–" if kb is None else f"{kb / 1024:.1f}"


def secs(s):
    return "–" if s is None else f"{s:.2f}"


def ratio(a, b):
    return "–" if a is None or not b else f"{a / b:.2f}×"


def per_stub(summary):
    """(tree PSS - main PSS) / stub processes, from the medians; None without stubs."""
    stubs = (summary["processes"] or 1) - 1
    if not stubs or summary["tree_pss_kb"] is None or summary["main_pss_kb"] is None:
        return None
    return (summary["tree_pss_kb"] - summary["main_pss_kb"]) / stubs


def markdown(results, repos, runs):
    lines = [
        f"Medians of {runs} run(s). PSS and RSS in MiB; tree = main process + all descendants "
        "(Python stubs).",
        "",
        "| repository | server | ready (s) | main PSS | tree PSS | PSS per stub | main RSS "
        "| threads | processes | exit (s) |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for repo in repos:
        for kind in SERVERS:
            s = results[repo][kind]["summary"]
            exit_s = secs(s["exit_s"]) + (f" ({s['exit_timeouts']} timed out)"
                                          if s["exit_timeouts"] else "")
            lines.append(
                f"| {REPO_LABELS[repo]} | {kind} | {secs(s['ready_s'])} | {mib(s['main_pss_kb'])} "
                f"| {mib(s['tree_pss_kb'])} | {mib(per_stub(s))} | {mib(s['main_rss_kb'])} "
                f"| {s['threads']:.0f} "
                f"| {s['processes']:.0f} | {exit_s} |")
        n = results[repo]["nereid"]["summary"]
        t = results[repo]["triton"]["summary"]
        lines.append(
            f"| {REPO_LABELS[repo]} | **nereid / triton** | {ratio(n['ready_s'], t['ready_s'])} "
            f"| {ratio(n['main_pss_kb'], t['main_pss_kb'])} "
            f"| {ratio(n['tree_pss_kb'], t['tree_pss_kb'])} "
            f"| {ratio(per_stub(n), per_stub(t))} "
            f"| {ratio(n['main_rss_kb'], t['main_rss_kb'])} | | "
            f"| {ratio(n['exit_s'], t['exit_s'])} |")
    # The empty repository (the server alone) and the largest one (what models add).
    shown = [r for r in repos if r == "empty"]
    largest = max(repos, key=lambda r: sum(REPOS[r]))
    if largest not in shown:
        shown.append(largest)
    for repo in shown:
        lines += [
            "",
            f"Largest mappings of the main process, {REPO_LABELS[repo]} repository "
            "(by RSS, grouped by file; MiB):",
            "",
            "| server | mapping | RSS | PSS |",
            "|---|---|--:|--:|",
        ]
        for kind in SERVERS:
            for m in results[repo][kind]["summary"].get("top_mappings", []):
                lines.append(f"| {kind} | `{m['name']}` | {mib(m['rss_kb'])} "
                             f"| {mib(m['pss_kb'])} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nereid", default=str(ROOT / "target/release/nereid"))
    p.add_argument("--triton", default=os.environ.get(
        "NEREID_TRITON", str(ROOT / ".venv-triton/tritonserver")))
    p.add_argument("--out", default=str(ROOT / "target/bench"))
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--repos", default="empty,5,8x10,50",
                   help=f"comma-separated, of {','.join(REPOS)}")
    p.add_argument("--ready-timeout", type=float, default=300.0,
                   help="seconds a server may take to become ready (default 300)")
    p.add_argument("--exit-timeout", type=float, default=60.0,
                   help="seconds a server may take to exit after SIGTERM (default 60)")
    args = p.parse_args(argv)

    repos = [r for r in args.repos.split(",") if r]
    unknown = [r for r in repos if r not in REPOS]
    if unknown:
        p.error(f"unknown repositories {unknown}; known: {list(REPOS)}")
    binaries = {"nereid": os.path.abspath(args.nereid), "triton": os.path.abspath(args.triton)}
    for kind, path in binaries.items():
        if not os.access(path, os.X_OK):
            p.error(f"{kind} binary {path} missing (build it, or `make triton-ref`)")
    nereid_python = os.environ.get("NEREID_PYTHON") or str(ROOT / ".venv/bin/python")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    # SIGTERM to this script: unwind through the finally blocks (kill the servers, remove temp).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    results = {}
    try:
        with tempfile.TemporaryDirectory(prefix="nereid-footprint-") as tmp:
            tmp = Path(tmp)
            for repo in repos:
                src = write_repository(tmp / f"src_{repo}", REPOS[repo])
                per_server = {kind: [] for kind in SERVERS}
                for run in range(args.runs):
                    for kind in SERVERS:
                        r = measure_one(kind, binaries[kind], src, tmp, run,
                                        ready_timeout=args.ready_timeout,
                                        exit_timeout=args.exit_timeout,
                                        nereid_python=nereid_python)
                        per_server[kind].append(r)
                        print(f"[footprint] {REPO_LABELS[repo]}, run {run + 1}/{args.runs}, "
                              f"{kind}: ready {r['ready_s']:.2f}s, main PSS "
                              f"{mib(r['main_pss_kb'])} MiB, tree PSS {mib(r['tree_pss_kb'])} "
                              f"MiB, {r['models_ready']}/{len(REPOS[repo])} models ready, exit "
                              f"{secs(r['exit_s'])}s", file=sys.stderr, flush=True)
                results[repo] = {
                    "models": len(REPOS[repo]),
                    "instances": sum(REPOS[repo]),
                    **{kind: {"runs": per_server[kind], "summary": summarize(per_server[kind])}
                       for kind in SERVERS},
                }
    finally:
        for pid in STARTED:
            kill_group(pid)

    table = markdown(results, repos, args.runs)
    report = {
        "runs": args.runs,
        "nereid": binaries["nereid"],
        "triton": binaries["triton"],
        "nereid_python": nereid_python,
        "poll_ms": POLL_S * 1000,
        "repositories": results,
    }
    (out / "footprint.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "footprint.md").write_text(table)
    print(table)
    print(f"wrote {out / 'footprint.json'} and {out / 'footprint.md'}", file=sys.stderr)


if __name__ == "__main__":
    main()
