#!/usr/bin/env bash
# Server CPU time per inference (`make bench`, after scripts/bench.sh): `nereid serve` on the
# benchmark models `identity` and `mlp_large` under `nereid-loadtest` at concurrency 1 and 32,
# over gRPC and HTTP. Around each level it reads the server process's utime+stime from
# /proc/PID/stat and the model's inference count from its statistics, and reports
#
#     server CPU µs per inference = (utime+stime after − before) ÷ inferences in the level
#
# with infer/s and p50 from the load generator. CPU time per inference is the figure that holds
# on a shared machine: other work slows the server down, but costs it little CPU of its own.
#
# With NEREID_BASELINE set, a second server runs that binary on the same models at the same
# time (idle while the other is measured), the levels alternate between the two (the order
# flips each repeat), and the summary gives both figures and the ratio new ÷ baseline.
#
# usage: scripts/bench_cpu.sh [OUT_DIR]        (default OUT_DIR: target/bench)
#
# Writes OUT_DIR/cpu.json (every run, the medians, ratios, machine, commands), OUT_DIR/cpu.md
# (the table printed on stdout) and OUT_DIR/cpu/ (model repository, raw tool output, server
# logs, commands.txt). Progress goes to stderr. About 2.5 minutes alone, 5 with a baseline.
#
# Settings (environment):
#   NEREID              server binary measured              (default target/release/nereid)
#   NEREID_BASELINE     server binary to compare with       (default: none)
#   LOADTEST            load generator                      (default target/release/nereid-loadtest)
#   PYTHON              Python 3 with numpy and onnx        (default .venv/bin/python)
#   BENCH_CPU_SECS      measured seconds per level          (default 4)
#   BENCH_CPU_WARMUP    warm-up seconds per level           (default 1)
#   BENCH_CPU_REPEATS   runs of every level per binary; the summary takes the median (default 3)

set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${1:-target/bench}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
DIR=$OUT/cpu
RAW=$DIR/raw
MODELS=$DIR/models

NEW_BIN=$(realpath -e "${NEREID:-$ROOT/target/release/nereid}" 2>/dev/null || echo "${NEREID:-target/release/nereid}")
BASE_BIN=
[[ -n ${NEREID_BASELINE:-} ]] && BASE_BIN=$(realpath -e "$NEREID_BASELINE" 2>/dev/null || echo "$NEREID_BASELINE")
LOADTEST=${LOADTEST:-$ROOT/target/release/nereid-loadtest}
PY=${PYTHON:-$ROOT/.venv/bin/python}
SECS=${BENCH_CPU_SECS:-4}
WARMUP=${BENCH_CPU_WARMUP:-1}
REPEATS=${BENCH_CPU_REPEATS:-3}

for f in "$NEW_BIN" ${BASE_BIN:+"$BASE_BIN"} "$LOADTEST" "$PY"; do
    if [[ ! -x $f ]]; then
        echo "error: $f is missing; run 'make bench' (or 'make build')" >&2
        exit 1
    fi
done
CORES=$(nproc)
TICKS=$(getconf CLK_TCK)
export BENCH_LOAD_START
BENCH_LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)

rm -rf "$DIR" "$OUT/cpu.json" "$OUT/cpu.md"
mkdir -p "$RAW" "$MODELS"
: >"$DIR/commands.txt"

COMMANDS=$DIR/commands.txt
# shellcheck source=scripts/bench_lib.sh
source "$ROOT/scripts/bench_lib.sh"

# The servers: label -> pid / HTTP / gRPC address. "new" is $NEREID, "baseline" $NEREID_BASELINE.
declare -A PID_OF HTTP_OF GRPC_OF
stop_all() {
    local label
    for label in "${!PID_OF[@]}"; do
        stop_pid "${PID_OF[$label]}"
    done
}
trap stop_all EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------------------------------------
say "generating the benchmark models; serving identity and mlp_large from $MODELS"
run "$PY" scripts/gen_bench_models.py "$DIR/all_models" >&2
cp -r "$DIR/all_models/identity" "$DIR/all_models/mlp_large" "$MODELS/"

LABELS=(new)
[[ -n $BASE_BIN ]] && LABELS=(baseline new)
for label in "${LABELS[@]}"; do
    NEREID=$NEW_BIN
    [[ $label == baseline ]] && NEREID=$BASE_BIN
    start_serve "$MODELS" "$DIR/server_$label.log" /v2/health/ready
    PID_OF[$label]=$SERVER_PID
    HTTP_OF[$label]=$HTTP
    GRPC_OF[$label]=$GRPC
    SERVER_PID=
done

# inferences LABEL MODEL: the model's inference_count on that server.
inferences() {
    curl -sf "http://${HTTP_OF[$1]}/v2/models/$2/stats" |
        "$PY" -c 'import json,sys; print(json.load(sys.stdin)["model_stats"][0]["inference_count"])'
}

FAILED=()
# level LABEL MODEL PROTOCOL CONCURRENCY REPEAT: one measured level on one server.
level() {
    local label=$1 model=$2 proto=$3 conc=$4 rep=$5
    local name="${label}_${model}_${proto}_c${conc}_r${rep}" url=${HTTP_OF[$1]} pid=${PID_OF[$1]}
    [[ $proto == grpc ]] && url=${GRPC_OF[$1]}
    say "$label: $model, $proto, concurrency $conc (repeat $rep)"
    local inf0 inf1 cpu0 cpu1 t0 t1
    inf0=$(inferences "$label" "$model")
    cpu0=$(cpu_ticks "$pid")
    t0=$(date +%s%N)
    if ! run "$LOADTEST" -q -m "$model" -i "$proto" -u "$url" --concurrency-range "$conc" \
        --warmup-secs "$WARMUP" --duration-secs "$SECS" -p 1000 \
        --json "$RAW/$name.json" >"$RAW/$name.txt" 2>&1; then
        echo "warning: $name failed:" >&2
        tail -n 5 "$RAW/$name.txt" >&2
        FAILED+=("$name")
    fi
    cpu1=$(cpu_ticks "$pid")
    t1=$(date +%s%N)
    inf1=$(inferences "$label" "$model")
    printf '{"label":"%s","model":"%s","protocol":"%s","concurrency":%d,"repeat":%d,"cpu_ticks":%d,"inferences":%d,"wall_ns":%d}\n' \
        "$label" "$model" "$proto" "$conc" "$rep" $((cpu1 - cpu0)) $((inf1 - inf0)) \
        $((t1 - t0)) >>"$RAW/cpu.jsonl"
}

for rep in $(seq "$REPEATS"); do
    order=("${LABELS[@]}")
    ((rep % 2 == 0 && ${#LABELS[@]} == 2)) && order=(new baseline)
    for model in identity mlp_large; do
        for proto in grpc http; do
            for c in 1 32; do
                for label in "${order[@]}"; do
                    level "$label" "$model" "$proto" "$c" "$rep"
                done
            done
        done
    done
done

stop_all
say "servers stopped; writing $OUT/cpu.json"

# ---------------------------------------------------------------------------------------------
"$PY" - "$OUT" "$CORES" "$TICKS" "$SECS" "$REPEATS" "$NEW_BIN" "$BASE_BIN" "${FAILED[@]}" <<'EOF' | tee "$OUT/cpu.md"
import json, os, platform, re, statistics, subprocess, sys, time
from pathlib import Path

out, cores, ticks, secs, repeats = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
binaries = {"new": sys.argv[6], "baseline": sys.argv[7] or None}
failed = sys.argv[8:]
raw = out / "cpu" / "raw"

runs = []
for line in (raw / "cpu.jsonl").read_text().splitlines():
    r = json.loads(line)
    name = f"{r['label']}_{r['model']}_{r['protocol']}_c{r['concurrency']}_r{r['repeat']}"
    try:
        lt = json.loads((raw / f"{name}.json").read_text())[0]
    except (OSError, ValueError, IndexError):
        lt = {}
    r["ok"] = bool(lt) and name not in failed and r["inferences"] > 0
    r["cpu_us_per_infer"] = r["cpu_ticks"] * 1e6 / ticks / r["inferences"] if r["inferences"] else None
    r["wall_s"] = r.pop("wall_ns") / 1e9
    r["server_cpu_percent"] = 100.0 * r["cpu_ticks"] / ticks / r["wall_s"] if r["wall_s"] else None
    r["throughput"] = lt.get("throughput")
    r["p50_us"] = lt.get("p50_us")
    r["p99_us"] = lt.get("p99_us")
    r["client_cpu_percent"] = lt.get("client_cpu_percent")
    r["errors_total"] = lt.get("errors_total")
    runs.append(r)

levels = []
for model in ("identity", "mlp_large"):
    for proto in ("grpc", "http"):
        for conc in (1, 32):
            levels.append((model, proto, conc))


def median(label, level, key):
    vals = [r[key] for r in runs if r["ok"] and r["label"] == label
            and (r["model"], r["protocol"], r["concurrency"]) == level and r[key] is not None]
    return statistics.median(vals) if vals else None


labels = ["baseline", "new"] if binaries["baseline"] else ["new"]
summary = []
for level in levels:
    row = {"model": level[0], "protocol": level[1], "concurrency": level[2]}
    for label in labels:
        row[label] = {k: median(label, level, k) for k in
                      ("cpu_us_per_infer", "throughput", "p50_us", "server_cpu_percent", "client_cpu_percent")}
    if binaries["baseline"]:
        b, n = row["baseline"], row["new"]
        row["ratio_new_over_baseline"] = {
            k: round(n[k] / b[k], 3) if n[k] and b[k] else None
            for k in ("cpu_us_per_infer", "throughput", "p50_us")}
    summary.append(row)

commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
dirty = bool(subprocess.run(["git", "--no-optional-locks", "status", "--porcelain", "--untracked-files=no"],
                            capture_output=True, text=True).stdout.strip())
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
machine = {"cpu": cpu, "cores": cores, "kernel": platform.release(),
           "load_average_at_start": [float(x) for x in os.environ.get("BENCH_LOAD_START", "0 0 0").split()],
           "load_average_at_end": os.getloadavg(), "commit": commit + ("-dirty" if dirty else ""),
           "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
commands = (out / "cpu" / "commands.txt").read_text().splitlines()
(out / "cpu.json").write_text(json.dumps(
    {"machine": machine, "binaries": binaries,
     "settings": {"seconds_per_level": secs, "repeats": repeats, "clock_ticks_per_second": ticks},
     "commands": commands, "summary": summary, "runs": runs, "failed": failed}, indent=2) + "\n")


def fmt(v, digits=0):
    return "n/a" if v is None else f"{v:,.{digits}f}"


print(f"# Server CPU per inference ({machine['date']}, commit {machine['commit']}, {cpu}, {cores} cores)\n")
for label in labels:
    print(f"- {label if binaries['baseline'] else 'server'}: `{binaries[label]}`")
print(f"\nMedian of {repeats} runs per level, {secs:g} s each (after a warm-up); server CPU is utime+stime of "
      f"the server process ({ticks} ticks/s) over the level ÷ the model's inference count over the level.\n")
print("Commands, in order (first occurrence of each shape):\n\n```sh")
seen = set()
for c in commands:
    key = re.sub(r" (-u|--json) \S+", "", c)
    if key not in seen:
        seen.add(key)
        print(c)
print("```\n")
if binaries["baseline"]:
    print("| model | protocol | conc. | CPU µs/infer baseline | CPU µs/infer new | ratio | infer/s baseline | infer/s new | ratio | p50 µs baseline | p50 µs new | ratio |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in summary:
        b, n, q = row["baseline"], row["new"], row["ratio_new_over_baseline"]
        print(f"| {row['model']} | {row['protocol']} | {row['concurrency']} "
              f"| {fmt(b['cpu_us_per_infer'], 1)} | {fmt(n['cpu_us_per_infer'], 1)} | {fmt(q['cpu_us_per_infer'], 3)} "
              f"| {fmt(b['throughput'])} | {fmt(n['throughput'])} | {fmt(q['throughput'], 3)} "
              f"| {fmt(b['p50_us'])} | {fmt(n['p50_us'])} | {fmt(q['p50_us'], 3)} |")
else:
    print("| model | protocol | conc. | server CPU µs/infer | infer/s | p50 µs | server CPU % | client CPU % |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for row in summary:
        n = row["new"]
        print(f"| {row['model']} | {row['protocol']} | {row['concurrency']} | {fmt(n['cpu_us_per_infer'], 1)} "
              f"| {fmt(n['throughput'])} | {fmt(n['p50_us'])} | {fmt(n['server_cpu_percent'])} "
              f"| {fmt(n['client_cpu_percent'])} |")
print(f"\nLoad average (1, 5, 15 min) at the start: "
      f"{', '.join(f'{x:.2f}' for x in machine['load_average_at_start'])}; at the end: "
      f"{', '.join(f'{x:.2f}' for x in machine['load_average_at_end'])}.")
if failed:
    print(f"\nFAILED: {', '.join(failed)}")
EOF

if ((${#FAILED[@]})); then
    echo "error: some measurements failed: ${FAILED[*]}" >&2
    exit 1
fi
say "done: $OUT/cpu.json, $OUT/cpu.md"
