#!/usr/bin/env bash
# Nereid benchmark (`make bench`): in-process ONNX Runtime baseline, then `nereid serve` under
# `nereid-loadtest` (and one perf_analyzer cross-check) on the benchmark model repository.
#
# usage: scripts/bench.sh [OUT_DIR]        (default OUT_DIR: target/bench)
#
# Expects the release binaries (`make bench` builds them first):
#   target/release/nereid  target/release/nereid-loadtest  target/release/examples/inprocess_ort
# and the venv of `make setup` (.venv/bin/python, .venv/ort-lib-path, .venv/perf_analyzer).
#
# Writes OUT_DIR/results.json (everything measured), OUT_DIR/summary.md (the table printed on
# stdout), OUT_DIR/commands.txt (every command, in order), OUT_DIR/raw/ (each tool's own
# output) and OUT_DIR/server.log. Progress goes to stderr. Runs in about 5 minutes on 2 cores.
#
# Settings (environment):
#   BENCH_INTERVAL_MS   measurement window of the load tests      (default 2000)
#   BENCH_MAX_TRIALS    most windows per level                    (default 5)
#   BENCH_INPROC_SECS   seconds per batch size, in-process MLP    (default 3)
#   BENCH_RESNET_SECS   seconds per batch size, in-process ResNet (default 4)
#   BENCH_SKIP_PA=1     skip the perf_analyzer cross-check

set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${1:-target/bench}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
RAW=$OUT/raw

PY=$ROOT/.venv/bin/python
NEREID=$ROOT/target/release/nereid
LOADTEST=$ROOT/target/release/nereid-loadtest
INPROC=$ROOT/target/release/examples/inprocess_ort
RTT=$ROOT/target/release/examples/rtt_floor
PA=$ROOT/.venv/perf_analyzer
INTERVAL_MS=${BENCH_INTERVAL_MS:-2000}
MAX_TRIALS=${BENCH_MAX_TRIALS:-5}
INPROC_SECS=${BENCH_INPROC_SECS:-3}
RESNET_SECS=${BENCH_RESNET_SECS:-4}

for f in "$PY" "$NEREID" "$LOADTEST" "$INPROC" "$RTT" "$ROOT/.venv/ort-lib-path"; do
    if [[ ! -e $f ]]; then
        echo "error: $f is missing; run 'make bench' (or 'make build' and the cargo builds it lists)" >&2
        exit 1
    fi
done
ORT_LIB=$(cat "$ROOT/.venv/ort-lib-path")
CORES=$(nproc)
export BENCH_LOAD_START
BENCH_LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)

rm -rf "$RAW" "$OUT/results.json" "$OUT/summary.md"
mkdir -p "$RAW"
: >"$OUT/commands.txt"
FAILED=()

COMMANDS=$OUT/commands.txt
# shellcheck source=scripts/bench_lib.sh
source "$ROOT/scripts/bench_lib.sh"

trap stop_serve EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------------------------------------
say "generating the benchmark models in $OUT/models"
run "$PY" scripts/gen_bench_models.py "$OUT/models" >&2
MODELS=$OUT/models

# ---------------------------------------------------------------------------------------------
say "in-process ONNX Runtime baseline: mlp_large (batches 1,8,32, ${INPROC_SECS}s each, $CORES threads)"
run "$INPROC" "$ORT_LIB" "$MODELS/mlp_large/1/model.onnx" x 256 1,8,32 "$INPROC_SECS" "$CORES" \
    >"$RAW/inprocess_mlp_large.jsonl"
say "in-process ONNX Runtime baseline: resnet50 (batches 1,8, ${RESNET_SECS}s each, 2 threads)"
run "$INPROC" "$ORT_LIB" "$MODELS/resnet50/1/model.onnx" data 3,224,224 1,8 "$RESNET_SECS" 2 \
    >"$RAW/inprocess_resnet50.jsonl"

# ---------------------------------------------------------------------------------------------
start_serve "$MODELS" "$OUT/server.log" /v2/health/ready

stats() { # MODEL FILE: the model's statistics (GET /v2/models/MODEL/stats)
    curl -sf "http://$HTTP/v2/models/$1/stats" >"$2" || echo '{}' >"$2"
}

# loadtest NAME MODEL PROTOCOL CONCURRENCY [extra flags]: one level, statistics around it.
loadtest() {
    local name=$1 model=$2 proto=$3 conc=$4
    shift 4
    local url=$HTTP
    [[ $proto == grpc ]] && url=$GRPC
    say "nereid-loadtest $name (model $model, $proto, concurrency $conc)"
    stats "$model" "$RAW/$name.stats_before.json"
    if ! run "$LOADTEST" -q -m "$model" -i "$proto" -u "$url" --concurrency-range "$conc" \
        -p "$INTERVAL_MS" -r "$MAX_TRIALS" --json "$RAW/$name.json" "$@" >"$RAW/$name.txt" 2>&1; then
        echo "warning: $name failed:" >&2
        tail -n 5 "$RAW/$name.txt" >&2
        FAILED+=("$name")
    fi
    stats "$model" "$RAW/$name.stats_after.json"
}

say "latency floor: 64-byte TCP ping-pong over loopback, then gRPC ServerLive (no inference)"
run "$RTT" "$GRPC" 20000 >"$RAW/rtt_floor.jsonl" || FAILED+=(rtt_floor)

for model in mlp_large mlp_large_nobatch; do
    for proto in grpc http; do
        for c in 1 8 32; do
            loadtest "${model}_${proto}_c$c" "$model" "$proto" "$c"
        done
    done
done
for proto in grpc http; do
    for c in 1 32; do
        loadtest "mlp_large_fss_${proto}_c$c" mlp_large_fss "$proto" "$c"
    done
done
for c in 1 16; do
    loadtest "identity_grpc_c$c" identity grpc "$c"
done
for c in 1 8; do
    loadtest "resnet50_grpc_c$c" resnet50 grpc "$c" --warmup-secs 2
done

if [[ ${BENCH_SKIP_PA:-0} != 1 && -x $PA ]]; then
    say "perf_analyzer cross-check: mlp_large, gRPC, concurrency 1 and 32"
    if ! run "$PA" -m mlp_large -i grpc -u "$GRPC" --concurrency-range 1:32:31 \
        --measurement-interval 2000 --stability-percentage 50 -f "$RAW/perf_analyzer.csv" \
        >"$RAW/perf_analyzer.txt" 2>&1; then
        echo "warning: perf_analyzer failed:" >&2
        tail -n 5 "$RAW/perf_analyzer.txt" >&2
        FAILED+=(perf_analyzer)
    fi
fi

# 4 MiB tensors in and out: client system shared memory against the tensors on the wire, both
# with perf_analyzer (nereid-loadtest has no shared-memory mode), gRPC, concurrency 1.
if [[ ${BENCH_SKIP_PA:-0} != 1 && -x $PA ]]; then
    for mode in none system; do
        say "perf_analyzer identity_large, 4 MiB FP32 tensor, gRPC, --shared-memory $mode"
        if ! run "$PA" -m identity_large -i grpc -u "$GRPC" --shape INPUT0:1048576 \
            --shared-memory "$mode" --output-shared-memory-size 4194304 --concurrency-range 1 \
            --measurement-interval 2000 --stability-percentage 50 \
            -f "$RAW/perf_analyzer_shm_$mode.csv" >"$RAW/perf_analyzer_shm_$mode.txt" 2>&1; then
            echo "warning: perf_analyzer --shared-memory $mode failed:" >&2
            tail -n 5 "$RAW/perf_analyzer_shm_$mode.txt" >&2
            FAILED+=("perf_analyzer_shm_$mode")
        fi
    done
fi

stop_serve
say "server stopped; writing $OUT/results.json"

# ---------------------------------------------------------------------------------------------
"$PY" - "$OUT" "$CORES" "$INTERVAL_MS" "$MAX_TRIALS" "${FAILED[@]}" <<'EOF' | tee "$OUT/summary.md"
import csv, json, os, platform, subprocess, sys, time
from pathlib import Path

out, cores, interval_ms, max_trials = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
failed = sys.argv[5:]
raw = out / "raw"


def load_json(path, default):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return default


def jsonl(path):
    rows = []
    if path.exists():
        for line in path.read_text().splitlines():
            line = line.strip()
            if line.startswith("{"):
                rows.append(json.loads(line))
    return rows


def model_stats(path):
    s = load_json(path, {}).get("model_stats") or [{}]
    s = s[0]
    batches = {}
    for b in s.get("batch_stats", []):
        batches[int(b["batch_size"])] = int((b.get("compute_infer") or {}).get("count", 0))
    return int(s.get("inference_count", 0)), int(s.get("execution_count", 0)), batches


def batch_delta(name):
    i0, e0, b0 = model_stats(raw / f"{name}.stats_before.json")
    i1, e1, b1 = model_stats(raw / f"{name}.stats_after.json")
    di, de = i1 - i0, e1 - e0
    hist = {k: v - b0.get(k, 0) for k, v in b1.items() if v - b0.get(k, 0) > 0}
    return {"inference_count": di, "execution_count": de,
            "avg_batch": round(di / de, 2) if de > 0 else None,
            "batch_histogram": dict(sorted(hist.items()))}


inproc = {
    "mlp_large": {r["batch"]: r for r in jsonl(raw / "inprocess_mlp_large.jsonl")},
    "resnet50": {r["batch"]: r for r in jsonl(raw / "inprocess_resnet50.jsonl")},
}

runs = {}
for path in sorted(raw.glob("*.stats_before.json")):
    name = path.name[: -len(".stats_before.json")]
    model, rest = name.rsplit("_", 2)[0], name.rsplit("_", 2)[1:]
    proto, conc = rest[0], int(rest[1][1:])
    levels = load_json(raw / f"{name}.json", [])
    level = levels[0] if levels else {}
    runs[name] = {
        "model": model, "protocol": proto, "concurrency": conc,
        "ok": bool(levels) and name not in failed,
        "throughput": level.get("throughput"), "p50_us": level.get("p50_us"),
        "p99_us": level.get("p99_us"), "avg_us": level.get("avg_us"),
        "client_cpu_percent": level.get("client_cpu_percent"), "errors": level.get("errors"),
        "first_error": level.get("first_error"), "stable": level.get("stable"),
        "windows": level.get("windows"), "server": batch_delta(name),
    }

def pa_csv(path):
    rows = []
    if path.exists():
        with open(path) as f:
            for row in csv.DictReader(f):
                rows.append({"concurrency": int(row["Concurrency"]),
                             "throughput": float(row["Inferences/Second"]),
                             "p50_us": int(row["p50 latency"]), "p99_us": int(row["p99 latency"])})
    return rows


pa = pa_csv(raw / "perf_analyzer.csv")
# 4 MiB identity, gRPC c=1: tensors on the wire ("none") vs in client system shared memory.
pa_shm = {mode: (pa_csv(raw / f"perf_analyzer_shm_{mode}.csv") or [None])[0]
          for mode in ("none", "system")}


def tput(name):
    r = runs.get(name)
    return r["throughput"] if r and r["ok"] else None


def ratio(a, b):
    return round(a / b, 3) if a and b else None


def inproc_at(model, batch):
    """In-process throughput at `batch`: measured if it was (within 5%), else interpolated
    linearly between the measured neighbours, else the nearest measured batch below."""
    table = {b: r["infer_per_sec"] for b, r in inproc[model].items()}
    if not table or batch is None:
        return None, None, "no in-process figure"
    for b in table:
        if abs(b - batch) <= 0.05 * b:
            return table[b], table[b], f"measured at batch {b}"
    lo = max((b for b in table if b <= batch), default=None)
    hi = min((b for b in table if b >= batch), default=None)
    floor = table[lo] if lo is not None else None
    if lo is not None and hi is not None:
        value = table[lo] + (table[hi] - table[lo]) * (batch - lo) / (hi - lo)
        return value, floor, f"interpolated between batch {lo} and {hi}"
    if lo is not None:
        return floor, floor, f"nearest measured batch {lo} (below)"
    return table[hi], None, f"nearest measured batch {hi} (above)"


ratios = []


def add_ratio(label, num, den, note=""):
    ratios.append({"ratio": label, "value": ratio(num, den), "numerator": num, "denominator": den,
                   "note": note})


for proto in ("grpc", "http"):
    name = f"mlp_large_{proto}_c32"
    avg = runs.get(name, {}).get("server", {}).get("avg_batch")
    base, floor, how = inproc_at("mlp_large", avg)
    add_ratio(f"MLP {proto} c=32 batching / in-process at the formed batch", tput(name), base,
              f"average executed batch {avg}; in-process {how}")
    if floor is not None and floor != base:
        lo = max(b for b in inproc["mlp_large"] if b <= avg)
        add_ratio(f"MLP {proto} c=32 batching / in-process at batch {lo} (nearest measured below)",
                  tput(name), floor, f"average executed batch {avg}")
for proto in ("grpc", "http"):
    name = f"mlp_large_fss_{proto}_c32"
    avg = runs.get(name, {}).get("server", {}).get("avg_batch")
    base, _, how = inproc_at("mlp_large", avg)
    add_ratio(f"MLP {proto} c=32 batching, force_spinning_stop / in-process at the formed batch",
              tput(name), base, f"average executed batch {avg}; in-process {how}")
for proto in ("grpc", "http"):
    add_ratio(f"MLP {proto} c=32 batching / no batching", tput(f"mlp_large_{proto}_c32"),
              tput(f"mlp_large_nobatch_{proto}_c32"))
for proto in ("grpc", "http"):
    add_ratio(f"MLP {proto} c=32 batching, force_spinning_stop / no batching",
              tput(f"mlp_large_fss_{proto}_c32"), tput(f"mlp_large_nobatch_{proto}_c32"))
for proto in ("grpc", "http"):
    one = inproc["mlp_large"].get(1, {}).get("infer_per_sec")
    add_ratio(f"MLP {proto} c=1 / in-process batch 1", tput(f"mlp_large_{proto}_c1"), one)
    add_ratio(f"MLP {proto} c=1, force_spinning_stop / in-process batch 1",
              tput(f"mlp_large_fss_{proto}_c1"), one)
r8 = inproc["resnet50"].get(8, {}).get("infer_per_sec")
add_ratio("ResNet-50 gRPC c=8 / in-process batch 8", tput("resnet50_grpc_c8"), r8,
          f"average executed batch {runs.get('resnet50_grpc_c8', {}).get('server', {}).get('avg_batch')}")
for p in pa:
    add_ratio(f"nereid-loadtest / perf_analyzer, MLP gRPC c={p['concurrency']}",
              tput(f"mlp_large_grpc_c{p['concurrency']}"), p["throughput"])

if pa_shm["none"] and pa_shm["system"]:
    add_ratio("4 MiB identity gRPC c=1: system shared memory / tensors on the wire (perf_analyzer)",
              pa_shm["system"]["throughput"], pa_shm["none"]["throughput"])

rtt = {r["what"]: r for r in jsonl(raw / "rtt_floor.jsonl")}

headline = {
    "identity_grpc_c1_p50_us": runs.get("identity_grpc_c1", {}).get("p50_us"),
    "identity_grpc_c16_infer_per_sec": tput("identity_grpc_c16"),
}

commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
dirty = bool(subprocess.run(["git", "--no-optional-locks", "status", "--porcelain", "--untracked-files=no"],
                            capture_output=True, text=True).stdout.strip())
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
machine = {"cpu": cpu, "cores": cores, "kernel": platform.release(),
           "load_average_at_start": [float(x) for x in os.environ.get("BENCH_LOAD_START", "0 0 0").split()],
           "load_average_at_end": os.getloadavg(), "commit": commit + ("-dirty" if dirty else ""),
           "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
commands = (out / "commands.txt").read_text().splitlines()
results = {"machine": machine, "settings": {"measurement_interval_ms": interval_ms, "max_trials": max_trials},
           "commands": commands, "inprocess": {m: list(v.values()) for m, v in inproc.items()},
           "loadtest": runs, "perf_analyzer": pa, "perf_analyzer_shared_memory": pa_shm, "latency_floor": rtt, "ratios": ratios, "headline": headline,
           "failed": failed}
(out / "results.json").write_text(json.dumps(results, indent=2) + "\n")


def fmt(v, digits=0):
    if v is None:
        return "n/a"
    return f"{v:,.{digits}f}"


print(f"# Nereid benchmark ({machine['date']}, commit {machine['commit']}, {cpu}, {cores} cores)\n")
print("Commands, in order:\n\n```sh")
print("\n".join(commands))
print("```\n")
print("## In-process ONNX Runtime (baseline)\n")
print("| model | batch | infer/s | p50 µs per run |")
print("|---|---:|---:|---:|")
for m, table in inproc.items():
    for b, r in sorted(table.items()):
        print(f"| {m} | {b} | {fmt(r['infer_per_sec'], 1)} | {fmt(r['p50_us'])} |")
print("\n## Through the server (nereid-loadtest, closed loop)\n")
print("| model | protocol | concurrency | infer/s | p50 µs | p99 µs | client CPU % | avg batch (server) | stable | errors |")
print("|---|---|---:|---:|---:|---:|---:|---:|---|---:|")
order = ["mlp_large", "mlp_large_fss", "mlp_large_nobatch", "identity", "resnet50"]
for name, r in sorted(runs.items(), key=lambda kv: (order.index(kv[1]["model"]) if kv[1]["model"] in order else 9,
                                                    kv[1]["protocol"], kv[1]["concurrency"])):
    if not r["ok"]:
        print(f"| {r['model']} | {r['protocol']} | {r['concurrency']} | FAILED (see raw/{name}.txt) | | | | | | |")
        continue
    print(f"| {r['model']} | {r['protocol']} | {r['concurrency']} | {fmt(r['throughput'], 1)} | {fmt(r['p50_us'])} "
          f"| {fmt(r['p99_us'])} | {fmt(r['client_cpu_percent'])} | {fmt(r['server']['avg_batch'], 2)} "
          f"| {'yes' if r['stable'] else 'NO'} | {r['errors']} |")
if pa:
    print("\n## perf_analyzer cross-check (mlp_large, gRPC)\n")
    print("| concurrency | infer/s | p50 µs | p99 µs |")
    print("|---:|---:|---:|---:|")
    for p in pa:
        print(f"| {p['concurrency']} | {fmt(p['throughput'], 1)} | {fmt(p['p50_us'])} | {fmt(p['p99_us'])} |")
if pa_shm["none"] or pa_shm["system"]:
    print("\n## 4 MiB tensors: system shared memory vs the wire (perf_analyzer, identity_large, gRPC, c=1)\n")
    print("| tensors | infer/s | p50 µs | p99 µs |")
    print("|---|---:|---:|---:|")
    for mode, label in (("none", "in the request and response"), ("system", "in client system shared memory")):
        p = pa_shm[mode]
        if p:
            print(f"| {label} | {fmt(p['throughput'], 1)} | {fmt(p['p50_us'])} | {fmt(p['p99_us'])} |")
        else:
            print(f"| {label} | FAILED (see raw/perf_analyzer_shm_{mode}.txt) | | |")
if rtt:
    print("\n## Latency floor of this machine (one request outstanding)\n")
    print("| path | p50 µs | p90 µs | p99 µs |")
    print("|---|---:|---:|---:|")
    labels = {"tcp_pingpong_64B": "64-byte TCP ping-pong over loopback, two threads",
              "grpc_server_live": "gRPC `ServerLive` to the server (tonic client, no inference)"}
    for what, r in rtt.items():
        print(f"| {labels.get(what, what)} | {fmt(r['p50_us'])} | {fmt(r['p90_us'])} | {fmt(r['p99_us'])} |")
print("\n## Ratios\n")
print("| ratio | value | numerator | denominator | note |")
print("|---|---:|---:|---:|---|")
for r in ratios:
    print(f"| {r['ratio']} | {fmt(r['value'], 2)} | {fmt(r['numerator'], 1)} | {fmt(r['denominator'], 1)} | {r['note']} |")
print(f"| identity gRPC c=1 p50 latency | {fmt(headline['identity_grpc_c1_p50_us'])} µs | | | |")
print(f"| identity gRPC c=16 throughput | {fmt(headline['identity_grpc_c16_infer_per_sec'], 1)} infer/s | | | |")
print(f"\nLoad generator and server share the machine's {cores} cores; figures are noisy on a shared machine. "
      f"Load average (1, 5, 15 min) at the start: {', '.join(f'{x:.2f}' for x in machine['load_average_at_start'])}; "
      f"at the end: {', '.join(f'{x:.2f}' for x in machine['load_average_at_end'])}.")
if failed:
    print(f"\nFAILED: {', '.join(failed)}")
EOF

if ((${#FAILED[@]})); then
    echo "error: some measurements failed: ${FAILED[*]}" >&2
    exit 1
fi
say "done: $OUT/results.json, $OUT/summary.md"
