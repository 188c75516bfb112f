#!/usr/bin/env bash
# Router hop benchmark (`make bench`, after scripts/bench.sh): what `nereid router` adds to a
# request. Starts a one-node control plane, one worker and a router on free 127.0.0.1 ports,
# registers the `identity` and `mlp_large` benchmark models (scripts/gen_bench_models.py), then
# for each model × protocol × concurrency runs `nereid-loadtest` straight at the worker and
# through the router, alternating (direct, router, router, direct, ...) so both see the same
# machine noise.
# Target: ≤ 100 µs p50 added and ≤ 10 % throughput lost through the router.
#
# usage: scripts/bench_router.sh [OUT_DIR]        (default OUT_DIR: target/bench)
#
# Writes OUT_DIR/router-hop.json (every run, the paired figures, machine, commands),
# OUT_DIR/router-hop.md (the table printed on stdout) and OUT_DIR/router-hop/ (raw tool output,
# the three processes' logs, commands.txt). Progress goes to stderr. About 6 minutes on 2 cores.
#
# Settings (environment):
#   NEREID                  server binary        (default target/release/nereid)
#   LOADTEST                load generator       (default target/release/nereid-loadtest)
#   PYTHON                  Python with onnx and numpy (default .venv/bin/python)
#   BENCH_INTERVAL_MS       measurement window of each load test          (default 2000)
#   BENCH_MAX_TRIALS        most windows per run                          (default 5)
#   BENCH_ROUTER_ROUNDS     direct/router pairs per configuration         (default 2)
#   BENCH_ROUTER_PROTOCOLS  protocols to measure                          (default "grpc http")
#   BENCH_ROUTER_MODELS     models to measure                             (default "identity mlp_large")
#   BENCH_ROUTER_CPUS       taskset CPU list for the router (e.g. 0)      (default: unpinned)
#   BENCH_WORKER_CPUS       taskset CPU list for the worker (e.g. 1)      (default: unpinned)
# The load generator and the control plane are never pinned. Layouts the router-hop table reports:
#   BENCH_ROUTER_CPUS=0 BENCH_WORKER_CPUS=1   the router on its own core, the worker on the other
#   BENCH_ROUTER_CPUS=1 BENCH_WORKER_CPUS=0   the same, swapped
#   (neither set)                             all unpinned

set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${1:-target/bench}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
DIR=$OUT/router-hop
RAW=$DIR/raw

NEREID=${NEREID:-$ROOT/target/release/nereid}
LOADTEST=${LOADTEST:-$ROOT/target/release/nereid-loadtest}
PY=${PYTHON:-$ROOT/.venv/bin/python}
INTERVAL_MS=${BENCH_INTERVAL_MS:-2000}
MAX_TRIALS=${BENCH_MAX_TRIALS:-5}
ROUNDS=${BENCH_ROUTER_ROUNDS:-2}
read -r -a PROTOCOLS <<<"${BENCH_ROUTER_PROTOCOLS:-grpc http}"
read -r -a MODELS <<<"${BENCH_ROUTER_MODELS:-identity mlp_large}"
ROUTER_CPUS=${BENCH_ROUTER_CPUS:-}
WORKER_CPUS=${BENCH_WORKER_CPUS:-}
export BENCH_LAYOUT="router on CPUs ${ROUTER_CPUS:-any}, worker on CPUs ${WORKER_CPUS:-any}, load generator unpinned"
CONCURRENCIES=(1 32)
READY_SECS=120

for f in "$PY" "$NEREID" "$LOADTEST"; do
    if [[ ! -x $f ]]; then
        echo "error: $f is missing; run 'make bench' (or set NEREID, LOADTEST, PYTHON)" >&2
        exit 1
    fi
done
if [[ -n $ROUTER_CPUS$WORKER_CPUS ]] && ! command -v taskset >/dev/null; then
    echo "error: BENCH_ROUTER_CPUS / BENCH_WORKER_CPUS need taskset (util-linux)" >&2
    exit 1
fi
if ! "$NEREID" router --help >/dev/null 2>&1; then
    echo "error: $NEREID has no 'router' subcommand; rebuild it (cargo build --release)" >&2
    exit 1
fi
export BENCH_LOAD_START
BENCH_LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
TICK=$(getconf CLK_TCK)

rm -rf "$DIR" "$OUT/router-hop.json" "$OUT/router-hop.md"
mkdir -p "$RAW"
: >"$DIR/commands.txt"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/nereid-bench-router.XXXXXX")
FAILED=()
PIDS=()
LOADTEST_PID=

COMMANDS=$DIR/commands.txt
# shellcheck source=scripts/bench_lib.sh
source "$ROOT/scripts/bench_lib.sh"

# Stops every process this script started (a running load test, then router, worker, control plane),
# SIGTERM then SIGKILL after 10 s, and removes the scratch directory.
cleanup() {
    local i
    if [[ -n $LOADTEST_PID ]]; then
        kill -TERM "$LOADTEST_PID" 2>/dev/null || true
        wait "$LOADTEST_PID" 2>/dev/null || true
        LOADTEST_PID=
    fi
    for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
        stop_pid "${PIDS[i]}"
    done
    PIDS=()
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# start NAME ARGS...: runs `nereid ARGS...` in the background, log in DIR/NAME.log; the router
# and the worker under `taskset -c` when their CPU list is set (taskset execs, so $! is nereid).
start() {
    local name=$1 pin=()
    shift
    case $name in
        router) [[ -n $ROUTER_CPUS ]] && pin=(taskset -c "$ROUTER_CPUS") ;;
        worker) [[ -n $WORKER_CPUS ]] && pin=(taskset -c "$WORKER_CPUS") ;;
    esac
    LOG_SUFFIX=" &" log_cmd "${pin[@]}" "$NEREID" "$@"
    "${pin[@]}" "$NEREID" "$@" >"$DIR/$name.log" 2>&1 &
    PIDS+=($!)
    eval "${name^^}_PID=$!"
}

replica_failure() { # MODEL: the reason of a failed replica of MODEL (control plane), if any
    curl -sf --max-time 2 -H "authorization: Bearer $TOKEN" \
        "http://127.0.0.1:$CP_HTTP_PORT/api/v1/models/$1" |
        grep -o '"failure_reason": *"[^"]\+"' | head -n 1 || true
}

# wait_for WHAT CURL_ARGS...: polls until curl succeeds, a started process exits, or READY_SECS.
# With CHECK_MODEL set, also stops when a replica of that model failed to load.
wait_for() {
    local what=$1 pid failure
    shift
    local deadline=$((SECONDS + READY_SECS))
    until curl -sf -o /dev/null --max-time 2 "$@"; do
        if [[ -n ${CHECK_MODEL:-} ]]; then
            failure=$(replica_failure "$CHECK_MODEL")
            if [[ -n $failure ]]; then
                echo "error: $CHECK_MODEL failed to load: $failure" >&2
                exit 1
            fi
        fi
        for pid in "${PIDS[@]}"; do
            if ! kill -0 "$pid" 2>/dev/null; then
                echo "error: a process exited while waiting for $what; the ends of the logs:" >&2
                tail -n 5 "$DIR"/*.log >&2
                exit 1
            fi
        done
        if ((SECONDS > deadline)); then
            echo "error: $what not ready after $READY_SECS s; see $DIR/*.log" >&2
            exit 1
        fi
        sleep 0.2
    done
}

# ---------------------------------------------------------------------------------------------
say "generating the benchmark models; registering ${MODELS[*]}"
log_cmd "$PY" scripts/gen_bench_models.py "$WORK/all"
"$PY" scripts/gen_bench_models.py "$WORK/all" >&2
mkdir -p "$WORK/models"
for m in "${MODELS[@]}"; do
    mv "$WORK/all/$m" "$WORK/models/$m"
done
rm -rf "$WORK/all"
head -c 24 /dev/urandom | base64 | tr -d '/+=' >"$WORK/token"
TOKEN=$(cat "$WORK/token")

read -r CP_PORT CP_HTTP_PORT W_HTTP W_GRPC W_METRICS R_HTTP R_GRPC R_METRICS < <(free_ports 8)
CP=127.0.0.1:$CP_PORT

say "starting the control plane ($CP), one worker (gRPC :$W_GRPC) and the router (gRPC :$R_GRPC); logs in $DIR"
start cp control-plane --node-id 1 --listen "$CP" --http-listen "127.0.0.1:$CP_HTTP_PORT" \
    --data-dir "$WORK/cp" --auth-token-file "$WORK/token" --model-repository "$WORK/models"
wait_for "the control plane" -H "authorization: Bearer $TOKEN" "http://127.0.0.1:$CP_HTTP_PORT/api/v1/cluster"
start worker worker --control-plane "$CP" --node-id bench-worker --auth-token-file "$WORK/token" \
    --work-dir "$WORK/worker" --http-address 127.0.0.1 --http-port "$W_HTTP" \
    --grpc-address 127.0.0.1 --grpc-port "$W_GRPC" --metrics-address 127.0.0.1 --metrics-port "$W_METRICS"
start router router --control-plane "$CP" --auth-token-file "$WORK/token" \
    --http-address 127.0.0.1 --http-port "$R_HTTP" --grpc-address 127.0.0.1 --grpc-port "$R_GRPC" \
    --metrics-address 127.0.0.1 --metrics-port "$R_METRICS"
for m in "${MODELS[@]}"; do
    CHECK_MODEL=$m wait_for "model $m on the worker" "http://127.0.0.1:$W_HTTP/v2/models/$m/ready"
    wait_for "model $m on the router" "http://127.0.0.1:$R_HTTP/v2/models/$m/ready"
done
say "the router reports ${MODELS[*]} ready"

# loadtest NAME MODEL PROTOCOL CONCURRENCY TARGET: one closed-loop run against the worker
# (TARGET direct) or the router; records both processes' CPU time around it.
loadtest() {
    local name=$1 model=$2 proto=$3 conc=$4 target=$5 url
    case $target/$proto in
        direct/grpc) url=127.0.0.1:$W_GRPC ;;
        direct/http) url=127.0.0.1:$W_HTTP ;;
        router/grpc) url=127.0.0.1:$R_GRPC ;;
        router/http) url=127.0.0.1:$R_HTTP ;;
    esac
    say "nereid-loadtest $name"
    local w0 r0 t0 w1 r1 t1
    w0=$(cpu_ticks "$WORKER_PID") r0=$(cpu_ticks "$ROUTER_PID") t0=$(date +%s.%N)
    local cmd=("$LOADTEST" -q -m "$model" -i "$proto" -u "$url" --concurrency-range "$conc"
        -p "$INTERVAL_MS" -r "$MAX_TRIALS" --json "$RAW/$name.json")
    log_cmd "${cmd[@]}"
    # In the background and waited for, so that SIGTERM/SIGINT stop the script at once.
    "${cmd[@]}" >"$RAW/$name.txt" 2>&1 &
    LOADTEST_PID=$!
    if ! wait "$LOADTEST_PID"; then
        echo "warning: $name failed:" >&2
        tail -n 5 "$RAW/$name.txt" >&2
        FAILED+=("$name")
    fi
    LOADTEST_PID=
    w1=$(cpu_ticks "$WORKER_PID") r1=$(cpu_ticks "$ROUTER_PID") t1=$(date +%s.%N)
    awk -v t0="$t0" -v t1="$t1" -v w=$((w1 - w0)) -v r=$((r1 - r0)) -v hz="$TICK" 'BEGIN {
        printf "{\"wall_s\": %.3f, \"worker_cpu_s\": %.3f, \"router_cpu_s\": %.3f}\n", t1 - t0, w / hz, r / hz
    }' >"$RAW/$name.cpu.json"
}

for model in "${MODELS[@]}"; do
    for proto in "${PROTOCOLS[@]}"; do
        for c in "${CONCURRENCIES[@]}"; do
            for ((round = 1; round <= ROUNDS; round++)); do
                # ABBA order: odd rounds start direct, even rounds start through the router.
                order=(direct router)
                ((round % 2 == 0)) && order=(router direct)
                for target in "${order[@]}"; do
                    loadtest "${model}_${proto}_c${c}_${target}_r${round}" "$model" "$proto" "$c" "$target"
                done
            done
        done
    done
done

cleanup
say "processes stopped; writing $OUT/router-hop.json"

# ---------------------------------------------------------------------------------------------
"$PY" - "$OUT" "$INTERVAL_MS" "$MAX_TRIALS" "$ROUNDS" "${FAILED[@]}" <<'EOF' | tee "$OUT/router-hop.md"
import json, os, platform, statistics, subprocess, sys, time
from pathlib import Path

out, interval_ms, max_trials, rounds = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
failed = sys.argv[5:]
raw = out / "router-hop" / "raw"
TARGET_P50_US, TARGET_LOST_PCT = 100, 10


def load(path):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


runs = {}
for path in sorted(raw.glob("*.cpu.json")):
    name = path.name[: -len(".cpu.json")]
    model, proto, conc, target, rnd = name.rsplit("_", 4)
    levels = load(raw / f"{name}.json") or []
    level = levels[0] if levels else {}
    cpu = load(path) or {}
    tput = level.get("throughput")
    # Requests over the whole invocation (warm-up included), estimated from the measured rate.
    approx_requests = tput * cpu["wall_s"] if tput and cpu.get("wall_s") else None
    runs[name] = {
        "model": model, "protocol": proto, "concurrency": int(conc[1:]), "target": target,
        "round": int(rnd[1:]), "ok": bool(levels) and name not in failed,
        "throughput": tput, "p50_us": level.get("p50_us"), "p99_us": level.get("p99_us"),
        "avg_us": level.get("avg_us"), "errors": level.get("errors"), "first_error": level.get("first_error"),
        "stable": level.get("stable"), "windows": level.get("windows"),
        "client_cpu_percent": level.get("client_cpu_percent"), **cpu,
        "router_cpu_us_per_request": round(cpu["router_cpu_s"] * 1e6 / approx_requests, 1)
        if approx_requests and target == "router" else None,
        "worker_cpu_us_per_request": round(cpu["worker_cpu_s"] * 1e6 / approx_requests, 1)
        if approx_requests else None,
    }


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


rows = []
for key in sorted({(r["model"], r["protocol"], r["concurrency"]) for r in runs.values()},
                  key=lambda k: (k[0], k[1], k[2])):
    sel = {t: [r for r in runs.values() if (r["model"], r["protocol"], r["concurrency"]) == key
               and r["target"] == t and r["ok"]] for t in ("direct", "router")}
    d = {f: med([r[f] for r in sel["direct"]]) for f in ("throughput", "p50_us", "p99_us", "worker_cpu_us_per_request")}
    r = {f: med([x[f] for x in sel["router"]])
         for f in ("throughput", "p50_us", "p99_us", "worker_cpu_us_per_request", "router_cpu_us_per_request")}
    added = r["p50_us"] - d["p50_us"] if r["p50_us"] is not None and d["p50_us"] is not None else None
    lost = 100 * (1 - r["throughput"] / d["throughput"]) if r["throughput"] and d["throughput"] else None
    # Per round: the pair's own difference, to show how much of the median is noise.
    pairs = []
    for rnd in range(1, rounds + 1):
        a = next((x for x in sel["direct"] if x["round"] == rnd), None)
        b = next((x for x in sel["router"] if x["round"] == rnd), None)
        if a and b:
            pairs.append({"round": rnd, "added_p50_us": b["p50_us"] - a["p50_us"],
                          "throughput_lost_percent": round(100 * (1 - b["throughput"] / a["throughput"]), 1)})
    rows.append({
        "model": key[0], "protocol": key[1], "concurrency": key[2],
        "runs": {"direct": len(sel["direct"]), "router": len(sel["router"])},
        "direct": d, "router": r, "added_p50_us": added,
        "throughput_lost_percent": round(lost, 1) if lost is not None else None, "pairs": pairs,
        "meets_p50_target": added is not None and added <= TARGET_P50_US,
        "meets_throughput_target": lost is not None and lost <= TARGET_LOST_PCT,
        "all_stable": all(x["stable"] for x in sel["direct"] + sel["router"]),
    })

commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
dirty = bool(subprocess.run(["git", "--no-optional-locks", "status", "--porcelain", "--untracked-files=no"],
                            capture_output=True, text=True).stdout.strip())
cpu_name = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
machine = {"cpu": cpu_name, "cores": os.cpu_count(), "kernel": platform.release(),
           "load_average_at_start": [float(x) for x in os.environ.get("BENCH_LOAD_START", "0 0 0").split()],
           "load_average_at_end": os.getloadavg(), "commit": commit + ("-dirty" if dirty else ""),
           "layout": os.environ.get("BENCH_LAYOUT", ""),
           "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
commands = (out / "router-hop" / "commands.txt").read_text().splitlines()
results = {"machine": machine,
           "settings": {"measurement_interval_ms": interval_ms, "max_trials": max_trials, "rounds": rounds},
           "targets": {"added_p50_us_max": TARGET_P50_US, "throughput_lost_percent_max": TARGET_LOST_PCT},
           "commands": commands, "rows": rows, "runs": runs, "failed": failed}
(out / "router-hop.json").write_text(json.dumps(results, indent=2) + "\n")


def fmt(v, digits=0):
    return "n/a" if v is None else f"{v:,.{digits}f}"


print(f"# Router hop ({machine['date']}, commit {machine['commit']}, {cpu_name}, {machine['cores']} cores)\n")
print(f"Layout: {machine['layout']}. Medians of {rounds} run(s) each way, direct and router runs alternating; "
      f"target ≤ {TARGET_P50_US} µs p50 added, ≤ {TARGET_LOST_PCT} % throughput lost.\n")
print("| model | protocol | conc. | p50 µs direct | p50 µs router | p50 added µs | p99 µs direct | p99 µs router "
      "| infer/s direct | infer/s router | throughput lost | router CPU µs/req | per-pair added µs / lost % | targets |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
for row in rows:
    d, r = row["direct"], row["router"]
    pairs = "; ".join(f"{p['added_p50_us']:+} / {p['throughput_lost_percent']:+.1f}" for p in row["pairs"])
    verdict = ", ".join([("p50 met" if row["meets_p50_target"] else "p50 MISSED"),
                         ("tput met" if row["meets_throughput_target"] else "tput MISSED")])
    if not row["all_stable"]:
        verdict += " (some runs unstable)"
    print(f"| {row['model']} | {row['protocol']} | {row['concurrency']} | {fmt(d['p50_us'])} | {fmt(r['p50_us'])} "
          f"| {fmt(row['added_p50_us'])} | {fmt(d['p99_us'])} | {fmt(r['p99_us'])} | {fmt(d['throughput'], 1)} "
          f"| {fmt(r['throughput'], 1)} | {fmt(row['throughput_lost_percent'], 1)} % "
          f"| {fmt(r['router_cpu_us_per_request'])} | {pairs} | {verdict} |")
print(f"\nClient, router and worker share the machine's {machine['cores']} cores, so the router's CPU is taken from "
      f"the worker and the client. Load average (1, 5, 15 min) at the start: "
      f"{', '.join(f'{x:.2f}' for x in machine['load_average_at_start'])}; at the end: "
      f"{', '.join(f'{x:.2f}' for x in machine['load_average_at_end'])}.")
if failed:
    print(f"\nFAILED: {', '.join(failed)}")
EOF

if ((${#FAILED[@]})); then
    echo "error: some runs failed: ${FAILED[*]}" >&2
    exit 1
fi
say "done: $OUT/router-hop.json, $OUT/router-hop.md"
