#!/usr/bin/env bash
# PyTorch backend benchmark (`make bench`, after scripts/bench.sh): the TorchScript MLP
# (FP32 [-1,256] -> 1024 -> 1024 -> 256, ReLU; the shape of the ONNX bench's mlp_large) run
# in-process through tch, then served by `nereid serve` (platform pytorch_libtorch, dynamic
# batching, one KIND_CPU instance) under `nereid-loadtest` with batch-1 requests at
# concurrency 1 and 32 over gRPC and HTTP. The model is traced from Rust
# (`inprocess_torch write-model`), so no Python torch is needed.
#
# usage: scripts/bench_torch.sh [OUT_DIR]        (default OUT_DIR: target/bench)
#
# Writes OUT_DIR/torch.json (everything measured, ratios, machine, commands), OUT_DIR/torch.md
# (the table printed on stdout) and OUT_DIR/torch/ (model repository, raw tool output,
# server.log, commands.txt). Progress goes to stderr. About 1.5 minutes on 2 cores.
#
# Settings (environment):
#   NEREID              server binary            (default target/release/nereid)
#   LOADTEST            load generator           (default target/release/nereid-loadtest)
#   INPROC_TORCH        in-process baseline      (default target/release/examples/inprocess_torch)
#   PYTHON              Python 3 for ports and the summary (default .venv/bin/python, else python3)
#   BENCH_INTERVAL_MS   measurement window of the load tests      (default 2000)
#   BENCH_MAX_TRIALS    most windows per level                    (default 4)
#   BENCH_INPROC_SECS   seconds per batch size, in-process        (default 3)
#   BENCH_TORCH_PROTOCOLS  protocols to measure                   (default "grpc http")
#   BENCH_TORCH_THREADS libtorch intra-op threads of the served model (INTRA_OP_THREAD_COUNT) and
#                       of the in-process rows the ratios use (default 1: the load generator
#                       shares the cores, and a 2-thread libtorch pool on a busy 2-core machine
#                       stalls for whole scheduler slices); the in-process baseline is also run
#                       at libtorch's default (one thread per core) for reference

set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${1:-target/bench}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
DIR=$OUT/torch
RAW=$DIR/raw
MODELS=$DIR/models

NEREID=${NEREID:-$ROOT/target/release/nereid}
LOADTEST=${LOADTEST:-$ROOT/target/release/nereid-loadtest}
INPROC=${INPROC_TORCH:-$ROOT/target/release/examples/inprocess_torch}
PY=${PYTHON:-$ROOT/.venv/bin/python}
[[ -x $PY ]] || PY=$(command -v python3)
INTERVAL_MS=${BENCH_INTERVAL_MS:-2000}
MAX_TRIALS=${BENCH_MAX_TRIALS:-4}
INPROC_SECS=${BENCH_INPROC_SECS:-3}
PROTOCOLS=${BENCH_TORCH_PROTOCOLS:-grpc http}
THREADS=${BENCH_TORCH_THREADS:-1}

for f in "$NEREID" "$LOADTEST" "$INPROC" "$PY"; do
    if [[ ! -x $f ]]; then
        echo "error: $f is missing; run 'make bench' (or 'make build' and the cargo builds it lists)" >&2
        exit 1
    fi
done
CORES=$(nproc)
export BENCH_LOAD_START
BENCH_LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)

rm -rf "$DIR" "$OUT/torch.json" "$OUT/torch.md"
mkdir -p "$RAW" "$MODELS/mlp_torch/1"
: >"$DIR/commands.txt"
FAILED=()

COMMANDS=$DIR/commands.txt
# shellcheck source=scripts/bench_lib.sh
source "$ROOT/scripts/bench_lib.sh"

trap stop_serve EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------------------------------------
say "tracing the TorchScript MLP into $MODELS/mlp_torch/1/model.pt"
run "$INPROC" write-model "$MODELS/mlp_torch/1/model.pt" 2>&1 | sed 's/^/    /' >&2
cat >"$MODELS/mlp_torch/config.pbtxt" <<'EOF'
name: "mlp_torch"
platform: "pytorch_libtorch"
max_batch_size: 32
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 256 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 256 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
dynamic_batching { }
parameters { key: "INTRA_OP_THREAD_COUNT" value: { string_value: "@THREADS@" } }
EOF
sed -i "s/@THREADS@/$THREADS/" "$MODELS/mlp_torch/config.pbtxt"

# ---------------------------------------------------------------------------------------------
INPROC_THREADS=("$THREADS")
[[ $THREADS != "$CORES" ]] && INPROC_THREADS+=("$CORES")
say "in-process libtorch baseline: batches 1,8,32, ${INPROC_SECS}s each, intra-op threads ${INPROC_THREADS[*]}"
run "$INPROC" run "$MODELS/mlp_torch/1/model.pt" 1,8,32 "$INPROC_SECS" "${INPROC_THREADS[@]}" \
    >"$RAW/inprocess.jsonl"

# ---------------------------------------------------------------------------------------------
start_serve "$MODELS" "$DIR/server.log" /v2/models/mlp_torch/ready

stats() { # FILE: mlp_torch's statistics
    curl -sf "http://$HTTP/v2/models/mlp_torch/stats" >"$1" || echo '{}' >"$1"
}

# loadtest PROTOCOL CONCURRENCY: one level of batch-1 requests, statistics around it.
loadtest() {
    local proto=$1 conc=$2 name="${1}_c$2" url=$HTTP
    [[ $proto == grpc ]] && url=$GRPC
    say "nereid-loadtest mlp_torch, $proto, concurrency $conc"
    stats "$RAW/$name.stats_before.json"
    if ! run "$LOADTEST" -q -m mlp_torch -i "$proto" -u "$url" --concurrency-range "$conc" \
        -p "$INTERVAL_MS" -r "$MAX_TRIALS" --json "$RAW/$name.json" >"$RAW/$name.txt" 2>&1; then
        echo "warning: $name failed:" >&2
        tail -n 5 "$RAW/$name.txt" >&2
        FAILED+=("$name")
    fi
    stats "$RAW/$name.stats_after.json"
}

# Warm-up, not recorded: in the first runs of this script, the first batch-1 level after the
# model loaded ran at ~24 ms per request (one scheduler slice) until a batched level had run;
# so one short level at concurrency 32 (mixed batch sizes), then one at 1, before measuring.
say "warm-up (not recorded): concurrency 32, then 1"
for c in 32 1; do
    run "$LOADTEST" -q -m mlp_torch -i grpc -u "$GRPC" --concurrency-range "$c" -p 1000 -r 2 \
        >"$RAW/warmup_c$c.txt" 2>&1 || true
done

for proto in $PROTOCOLS; do
    for c in 1 32; do
        loadtest "$proto" "$c"
    done
done

stop_serve
say "server stopped; writing $OUT/torch.json"

# ---------------------------------------------------------------------------------------------
"$PY" - "$OUT" "$CORES" "$INTERVAL_MS" "$MAX_TRIALS" "$THREADS" "${FAILED[@]}" <<'EOF' | tee "$OUT/torch.md"
import json, os, platform, subprocess, sys, time
from pathlib import Path

out, cores, interval_ms, max_trials = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
threads = int(sys.argv[5])
failed = sys.argv[6:]
raw = out / "torch" / "raw"


def load_json(path, default):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return default


def model_stats(path):
    s = (load_json(path, {}).get("model_stats") or [{}])[0]
    return int(s.get("inference_count", 0)), int(s.get("execution_count", 0))


rows = []
for line in (raw / "inprocess.jsonl").read_text().splitlines():
    if line.strip().startswith("{"):
        rows.append(json.loads(line))
# The ratios compare with the in-process rows at the served model's thread count.
inproc = {r["batch"]: r for r in rows if r["threads"] == threads}

runs = {}
for path in sorted(raw.glob("*.stats_before.json")):
    name = path.name[: -len(".stats_before.json")]
    proto, conc = name.split("_c")
    levels = load_json(raw / f"{name}.json", [])
    level = levels[0] if levels else {}
    i0, e0 = model_stats(raw / f"{name}.stats_before.json")
    i1, e1 = model_stats(raw / f"{name}.stats_after.json")
    runs[name] = {
        "protocol": proto, "concurrency": int(conc), "ok": bool(levels) and name not in failed,
        "throughput": level.get("throughput"), "p50_us": level.get("p50_us"),
        "p99_us": level.get("p99_us"), "client_cpu_percent": level.get("client_cpu_percent"),
        "errors": level.get("errors"), "first_error": level.get("first_error"),
        "stable": level.get("stable"),
        "server_avg_batch": round((i1 - i0) / (e1 - e0), 2) if e1 > e0 else None,
    }


def ratio(a, b):
    return round(a / b, 3) if a and b else None


best = max(inproc.values(), key=lambda r: r["infer_per_sec"], default=None)
one = inproc.get(1, {})
ratios = []
for name, r in sorted(runs.items()):
    if not r["ok"]:
        continue
    if r["concurrency"] == 1:
        ratios.append({"ratio": f"{r['protocol']} c=1 / in-process batch 1, {threads} thread(s) (infer/s)",
                       "value": ratio(r["throughput"], one.get("infer_per_sec")),
                       "server": r["throughput"], "inprocess": one.get("infer_per_sec"),
                       "p50_added_us": (r["p50_us"] - one["p50_us"]) if one and r["p50_us"] is not None else None})
    else:
        ratios.append({"ratio": f"{r['protocol']} c={r['concurrency']} / best in-process batched "
                                f"(batch {best['batch'] if best else '?'}, {threads} thread(s)) (infer/s)",
                       "value": ratio(r["throughput"], best["infer_per_sec"] if best else None),
                       "server": r["throughput"], "inprocess": best["infer_per_sec"] if best else None,
                       "server_avg_batch": r["server_avg_batch"]})

commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
dirty = bool(subprocess.run(["git", "--no-optional-locks", "status", "--porcelain", "--untracked-files=no"],
                            capture_output=True, text=True).stdout.strip())
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
machine = {"cpu": cpu, "cores": cores, "kernel": platform.release(),
           "load_average_at_start": [float(x) for x in os.environ.get("BENCH_LOAD_START", "0 0 0").split()],
           "load_average_at_end": os.getloadavg(), "commit": commit + ("-dirty" if dirty else ""),
           "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
commands = (out / "torch" / "commands.txt").read_text().splitlines()
(out / "torch.json").write_text(json.dumps(
    {"machine": machine, "settings": {"measurement_interval_ms": interval_ms, "max_trials": max_trials,
                                      "intra_op_threads": threads},
     "commands": commands, "inprocess": rows, "loadtest": runs, "ratios": ratios,
     "failed": failed}, indent=2) + "\n")


def fmt(v, digits=0):
    return "n/a" if v is None else f"{v:,.{digits}f}"


print(f"# PyTorch backend benchmark ({machine['date']}, commit {machine['commit']}, {cpu}, {cores} cores)\n")
print("Commands, in order:\n\n```sh")
print("\n".join(commands))
print("```\n")
print("In-process libtorch (tch, `forward_ts` under no_grad, inputs prepared once):\n")
print("| batch | intra-op threads | infer/s | p50 µs per forward |")
print("|---:|---:|---:|---:|")
for r in sorted(rows, key=lambda r: (r["threads"] != threads, r["threads"], r["batch"])):
    b = r["batch"]
    print(f"| {b} | {r['threads']} | {fmt(r['infer_per_sec'], 1)} | {fmt(r['p50_us'])} |")
print(f"\nThrough `nereid serve` (nereid-loadtest, closed loop, batch-1 requests; INTRA_OP_THREAD_COUNT {threads}):\n")
print("| protocol | concurrency | infer/s | p50 µs | p99 µs | client CPU % | avg batch (server) | stable | errors |")
print("|---|---:|---:|---:|---:|---:|---:|---|---:|")
for name, r in sorted(runs.items(), key=lambda kv: (kv[1]["protocol"], kv[1]["concurrency"])):
    if not r["ok"]:
        print(f"| {r['protocol']} | {r['concurrency']} | FAILED (see torch/raw/{name}.txt) | | | | | | |")
        continue
    print(f"| {r['protocol']} | {r['concurrency']} | {fmt(r['throughput'], 1)} | {fmt(r['p50_us'])} | {fmt(r['p99_us'])} "
          f"| {fmt(r['client_cpu_percent'])} | {fmt(r['server_avg_batch'], 2)} | {'yes' if r['stable'] else 'NO'} | {r['errors']} |")
print("\nRatios (server ÷ in-process, same run):\n")
print("| ratio | value | server infer/s | in-process infer/s | p50 added µs | note |")
print("|---|---:|---:|---:|---:|---|")
for r in ratios:
    note = f"server avg batch {fmt(r['server_avg_batch'], 2)}" if "server_avg_batch" in r else ""
    print(f"| {r['ratio']} | {fmt(r['value'], 2)} | {fmt(r['server'], 1)} | {fmt(r['inprocess'], 1)} "
          f"| {fmt(r.get('p50_added_us'))} | {note} |")
print(f"\nLoad generator and server share the machine's {cores} cores. Load average (1, 5, 15 min) at the start: "
      f"{', '.join(f'{x:.2f}' for x in machine['load_average_at_start'])}; at the end: "
      f"{', '.join(f'{x:.2f}' for x in machine['load_average_at_end'])}.")
if failed:
    print(f"\nFAILED: {', '.join(failed)}")
EOF

if ((${#FAILED[@]})); then
    echo "error: some measurements failed: ${FAILED[*]}" >&2
    exit 1
fi
say "done: $OUT/torch.json, $OUT/torch.md"
