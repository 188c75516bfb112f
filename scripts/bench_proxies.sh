#!/usr/bin/env bash
# Router versus nginx and haproxy (`make bench`, after scripts/bench_router.sh): what `nereid
# router` costs next to two general-purpose proxies doing the same hop in front of the same
# worker. Per CPU layout it starts a one-node control plane, one worker, a router, nginx and
# haproxy on free 127.0.0.1 ports (nginx and haproxy from their own configs in a temporary
# directory, in the foreground; scripts/setup_bench_proxies.sh installs them if missing),
# registers the `identity` and `mlp_large` benchmark models (scripts/gen_bench_models.py), then
# for each model × protocol × concurrency runs one `nereid-loadtest` closed-loop level straight
# at the worker and one through each proxy, in an order rotated from one configuration to the
# next so that drift in the machine's load does not always fall on the same target.
# Per proxy it reports the throughput ratio to direct, the p50 added, and the proxy's CPU time
# per request: utime + stime from /proc/PID/stat around each run (the router process; nginx's
# worker processes, not its idle master; the haproxy process), divided by every request the
# load generator sent in that run (warm-up included, as is the CPU time).
#
# Layouts (BENCH_PROXY_LAYOUTS):
#   pinned    every proxy on BENCH_PROXY_CPUS (default 0), the worker on BENCH_WORKER_CPUS
#             (default 1), started under `taskset -c`; one thread of work per proxy: the router
#             its default one runtime thread, nginx `worker_processes 1`, haproxy `nbthread 1`
#   unpinned  nothing pinned; each proxy with its defaults: the router one runtime thread
#             (`--threads 1`), nginx `worker_processes auto`, haproxy one thread per core
# The load generator and the control plane are never pinned. The stack is restarted per layout.
#
# nginx: HTTP `proxy_pass` to an `upstream` with `keepalive 64` (HTTP/1.1, `Connection ""`);
# gRPC `grpc_pass grpc://` to an `upstream` (same keep-alive) from a `listen PORT http2`
# (cleartext HTTP/2) server. haproxy: `mode http`, `http-reuse always`; gRPC frontend
# `bind ... proto h2` to a backend `server ... proto h2`.
#
# usage: scripts/bench_proxies.sh [OUT_DIR]        (default OUT_DIR: target/bench)
#
# Writes OUT_DIR/proxies.json (every run, the per-configuration figures, machine, commands),
# OUT_DIR/proxies.md (the table printed on stdout) and OUT_DIR/proxies/ (raw tool output under
# raw/, every process's log and the nginx / haproxy configs per layout, commands.txt). Progress
# goes to stderr. About 5 minutes on 2 cores with the defaults, 9 with BENCH_PROXY_ROUNDS=2.
#
# Settings (environment):
#   NEREID                    server binary        (default target/release/nereid)
#   LOADTEST                  load generator       (default target/release/nereid-loadtest)
#   PYTHON                    Python with onnx and numpy (default .venv/bin/python)
#   BENCH_PROXY_SECS          measured seconds of each run, after 1 s of warm-up   (default 3)
#   BENCH_INTERVAL_MS         measurement window within it                         (default 1000)
#   BENCH_PROXY_ROUNDS        runs per target and configuration (medians)          (default 1)
#   BENCH_PROXY_MODELS        models to measure                   (default "identity mlp_large")
#   BENCH_PROXY_PROTOCOLS     protocols to measure                (default "grpc http")
#   BENCH_PROXY_CONCURRENCIES closed-loop concurrencies           (default "1 32")
#   BENCH_PROXY_LAYOUTS       CPU layouts, see above              (default "pinned unpinned")
#   BENCH_PROXY_CPUS          taskset CPU list of the proxies in the pinned layout (default 0)
#   BENCH_WORKER_CPUS         taskset CPU list of the worker in the pinned layout  (default 1)
#   BENCH_ROUTER_ARGS         extra `nereid router` flags, e.g. "--threads 1"       (default none)
#   NEREID_BASELINE           another `nereid` binary (an older build): its router runs beside
#                             the first as the target `baseline` (same flags, same CPUs, the same
#                             worker), so both routers are compared in one run (default none)
#   BENCH_PROXY_PERF          1 (or dwarf, for binaries without frame pointers): `perf record -g`
#                             (`--call-graph dwarf`) the router during its runs, into
#                             OUT_DIR/proxies/raw/NAME.perf.data; syscalls: `perf stat` of its
#                             system calls, into NAME.syscalls.txt (CPU figures then include
#                             perf's own overhead; for finding costs, not for the table).
#                             dwarf needs line tables: build with `cargo build --profile
#                             profiling` (release plus line tables) and point NEREID there
# Quick check (under a minute):
#   BENCH_PROXY_MODELS=identity BENCH_PROXY_PROTOCOLS=grpc BENCH_PROXY_LAYOUTS=pinned \
#       BENCH_PROXY_SECS=2 scripts/bench_proxies.sh /tmp/proxies-quick

set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${1:-target/bench}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
DIR=$OUT/proxies
RAW=$DIR/raw

NEREID=${NEREID:-$ROOT/target/release/nereid}
LOADTEST=${LOADTEST:-$ROOT/target/release/nereid-loadtest}
PY=${PYTHON:-$ROOT/.venv/bin/python}
SECS=${BENCH_PROXY_SECS:-3}
INTERVAL_MS=${BENCH_INTERVAL_MS:-1000}
ROUNDS=${BENCH_PROXY_ROUNDS:-1}
read -r -a MODELS <<<"${BENCH_PROXY_MODELS:-identity mlp_large}"
read -r -a PROTOCOLS <<<"${BENCH_PROXY_PROTOCOLS:-grpc http}"
read -r -a CONCURRENCIES <<<"${BENCH_PROXY_CONCURRENCIES:-1 32}"
read -r -a LAYOUTS <<<"${BENCH_PROXY_LAYOUTS:-pinned unpinned}"
PROXY_CPUS=${BENCH_PROXY_CPUS:-0}
WORKER_CPUS=${BENCH_WORKER_CPUS:-1}
PERF=${BENCH_PROXY_PERF:-}
read -r -a ROUTER_ARGS <<<"${BENCH_ROUTER_ARGS:-}"
BASELINE=${NEREID_BASELINE:-}
TARGETS=(direct router nginx haproxy)
[[ -n $BASELINE ]] && TARGETS+=(baseline)
READY_SECS=120

for f in "$PY" "$NEREID" "$LOADTEST" ${BASELINE:+"$BASELINE"}; do
    if [[ ! -x $f ]]; then
        echo "error: $f is missing; run 'make bench' (or set NEREID, LOADTEST, PYTHON)" >&2
        exit 1
    fi
done
for layout in "${LAYOUTS[@]}"; do
    case $layout in
        pinned)
            if ! command -v taskset >/dev/null; then
                echo "error: the pinned layout needs taskset (util-linux)" >&2
                exit 1
            fi
            ;;
        unpinned) ;;
        *)
            echo "error: BENCH_PROXY_LAYOUTS: unknown layout '$layout' (pinned, unpinned)" >&2
            exit 1
            ;;
    esac
done
if ! "$NEREID" router --help >/dev/null 2>&1; then
    echo "error: $NEREID has no 'router' subcommand; rebuild it (cargo build --release)" >&2
    exit 1
fi
bash "$ROOT/scripts/setup_bench_proxies.sh"
PATH=$PATH:/usr/sbin:/sbin
NGINX=$(command -v nginx)
HAPROXY=$(command -v haproxy)
export BENCH_LOAD_START BENCH_NGINX_VERSION BENCH_HAPROXY_VERSION
BENCH_LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
BENCH_NGINX_VERSION=$("$NGINX" -v 2>&1)
BENCH_HAPROXY_VERSION=$("$HAPROXY" -v 2>&1 | head -n 1)
TICK=$(getconf CLK_TCK)

rm -rf "$DIR" "$OUT/proxies.json" "$OUT/proxies.md"
mkdir -p "$RAW"
: >"$DIR/commands.txt"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/nereid-bench-proxies.XXXXXX")
FAILED=()
PIDS=()
NGINX_WORKERS=()
LOADTEST_PID=
BASELINE_PID=

COMMANDS=$DIR/commands.txt
# shellcheck source=scripts/bench_lib.sh
source "$ROOT/scripts/bench_lib.sh"

# Stops the processes of the current layout (a running load test, then haproxy, nginx, router,
# worker, control plane), SIGTERM then SIGKILL after 10 s each. nginx's master stops its workers;
# any left after a SIGKILL of the master are killed too.
stop_layout() {
    local i pid
    if [[ -n $LOADTEST_PID ]]; then
        kill -TERM "$LOADTEST_PID" 2>/dev/null || true
        wait "$LOADTEST_PID" 2>/dev/null || true
        LOADTEST_PID=
    fi
    for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
        stop_pid "${PIDS[i]}"
    done
    for pid in "${NGINX_WORKERS[@]}"; do
        kill -KILL "$pid" 2>/dev/null || true
    done
    PIDS=()
    NGINX_WORKERS=()
}
cleanup() {
    stop_layout
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# start NAME PIN ARGS...: runs ARGS in the background (under `taskset -c PIN` when PIN is set;
# taskset execs, so $! is the program), log in DIR/LAYOUT-NAME.log; sets NAME_PID.
start() {
    local name=$1 pin=()
    [[ -n $2 ]] && pin=(taskset -c "$2")
    shift 2
    LOG_SUFFIX=" &" log_cmd "${pin[@]}" "$@"
    "${pin[@]}" "$@" >"$DIR/$LAYOUT-$name.log" 2>&1 &
    PIDS+=($!)
    eval "${name^^}_PID=$!"
}

# wait_until WHAT COMMAND...: polls COMMAND (every 0.2 s) until it succeeds, a started process
# exits, or READY_SECS pass.
wait_until() {
    local what=$1 pid
    shift
    local deadline=$((SECONDS + READY_SECS))
    until "$@" >/dev/null 2>&1; do
        for pid in "${PIDS[@]}"; do
            if ! kill -0 "$pid" 2>/dev/null; then
                echo "error: a process exited while waiting for $what; the ends of the logs:" >&2
                tail -n 5 "$DIR/$LAYOUT"-*.log >&2
                exit 1
            fi
        done
        if ((SECONDS > deadline)); then
            echo "error: $what not ready after $READY_SECS s; see $DIR/$LAYOUT-*.log" >&2
            exit 1
        fi
        sleep 0.2
    done
}

http_ok() { curl -sf -o /dev/null --max-time 2 "$@"; }

# grpc_live HOST:PORT: a gRPC ServerLive call over cleartext HTTP/2 (an empty message: five zero
# bytes of gRPC framing) answers 200 with grpc-status 0.
grpc_live() {
    local headers
    headers=$(printf '\0\0\0\0\0' | curl -s --http2-prior-knowledge --max-time 2 -o /dev/null -D - -X POST \
        -H 'content-type: application/grpc' -H 'te: trailers' --data-binary @- \
        "http://$1/inference.GRPCInferenceService/ServerLive") || return 1
    [[ $headers == *"HTTP/2 200"* && $headers == *"grpc-status: 0"* ]]
}

# children PID: the PIDs of PID's child processes.
children() {
    local f line ppid
    for f in /proc/[0-9]*/stat; do
        { line=$(<"$f"); } 2>/dev/null || continue
        read -r _ ppid _ <<<"${line##*) }"
        if [[ $ppid == "$1" ]]; then
            f=${f#/proc/}
            echo "${f%/stat}"
        fi
    done
}

# write_nginx_conf FILE: nginx's config for this layout (HTTP and gRPC servers, upstreams).
# Requests and responses here are a few KiB, well inside the in-memory buffers, so nginx never
# writes a temporary file; the temp paths point into its own directory anyway.
write_nginx_conf() {
    local d=$WORK/nginx-$LAYOUT
    mkdir -p "$d/tmp"
    cat >"$1" <<EOF
# scripts/bench_proxies.sh, layout $LAYOUT
worker_processes $([[ $LAYOUT == pinned ]] && echo 1 || echo auto);
daemon off;
pid $d/nginx.pid;
error_log $DIR/$LAYOUT-nginx-error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $d/tmp/body;
    proxy_temp_path $d/tmp/proxy;
    fastcgi_temp_path $d/tmp/fastcgi;
    uwsgi_temp_path $d/tmp/uwsgi;
    scgi_temp_path $d/tmp/scgi;
    client_body_buffer_size 1m;
    client_max_body_size 64m;
    # Client connections stay open for the whole run (the default closes one after 1000 requests).
    keepalive_requests 100000000;
    upstream worker_http {
        server 127.0.0.1:$W_HTTP;
        keepalive 64;
        keepalive_requests 100000000;
    }
    upstream worker_grpc {
        server 127.0.0.1:$W_GRPC;
        keepalive 64;
        keepalive_requests 100000000;
    }
    server {
        listen 127.0.0.1:$N_HTTP;
        location / {
            proxy_pass http://worker_http;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
    server {
        listen 127.0.0.1:$N_GRPC http2;
        location / {
            grpc_pass grpc://worker_grpc;
        }
    }
}
EOF
}

# write_haproxy_conf FILE: haproxy's config for this layout.
write_haproxy_conf() {
    cat >"$1" <<EOF
# scripts/bench_proxies.sh, layout $LAYOUT
global
$([[ $LAYOUT == pinned ]] && echo "    nbthread 1")
    pidfile $WORK/haproxy-$LAYOUT.pid
    maxconn 4096
defaults
    mode http
    timeout connect 5s
    timeout client 60s
    timeout server 60s
frontend http_in
    bind 127.0.0.1:$H_HTTP
    default_backend worker_http
backend worker_http
    http-reuse always
    server worker 127.0.0.1:$W_HTTP
frontend grpc_in
    bind 127.0.0.1:$H_GRPC proto h2
    default_backend worker_grpc
backend worker_grpc
    http-reuse always
    server worker 127.0.0.1:$W_GRPC proto h2
EOF
}

# loadtest NAME MODEL PROTOCOL CONCURRENCY TARGET: one closed-loop run against the worker
# (TARGET direct) or a proxy; records every server process's CPU time around it.
loadtest() {
    local name=$1 model=$2 proto=$3 conc=$4 target=$5
    local url=127.0.0.1:${PORTS[$target/$proto]}
    say "nereid-loadtest $name"
    local w0 r0 n0 h0 b0 t0 w1 r1 n1 h1 b1 t1
    w0=$(cpu_ticks "$WORKER_PID") r0=$(cpu_ticks "$ROUTER_PID") n0=$(cpu_ticks "${NGINX_WORKERS[@]}")
    h0=$(cpu_ticks "$HAPROXY_PID") b0=$(cpu_ticks ${BASELINE_PID:+"$BASELINE_PID"}) t0=$(date +%s.%N)
    local cmd=("$LOADTEST" -q -m "$model" -i "$proto" -u "$url" --concurrency-range "$conc"
        --warmup-secs 1 --duration-secs "$SECS" -p "$INTERVAL_MS" --json "$RAW/$name.json")
    log_cmd "${cmd[@]}"
    # In the background and waited for, so that SIGTERM/SIGINT stop the script at once.
    "${cmd[@]}" >"$RAW/$name.txt" 2>&1 &
    LOADTEST_PID=$!
    local perf_pid=
    if [[ -n $PERF && $target == router ]]; then
        if [[ $PERF == syscalls ]]; then
            perf stat -e 'syscalls:sys_enter_*' -p "$ROUTER_PID" -o "$RAW/$name.syscalls.txt" >/dev/null 2>&1 &
        else
            local graph=(-g)
            [[ $PERF == dwarf ]] && graph=(--call-graph dwarf,16384)
            perf record -q -F 999 "${graph[@]}" -p "$ROUTER_PID" -o "$RAW/$name.perf.data" >/dev/null 2>&1 &
        fi
        perf_pid=$!
    fi
    if ! wait "$LOADTEST_PID"; then
        echo "warning: $name failed:" >&2
        tail -n 5 "$RAW/$name.txt" >&2
        FAILED+=("$name")
    fi
    LOADTEST_PID=
    if [[ -n $perf_pid ]]; then
        kill -INT "$perf_pid" 2>/dev/null || true
        wait "$perf_pid" || true
    fi
    w1=$(cpu_ticks "$WORKER_PID") r1=$(cpu_ticks "$ROUTER_PID") n1=$(cpu_ticks "${NGINX_WORKERS[@]}")
    h1=$(cpu_ticks "$HAPROXY_PID") b1=$(cpu_ticks ${BASELINE_PID:+"$BASELINE_PID"}) t1=$(date +%s.%N)
    awk -v t0="$t0" -v t1="$t1" -v w=$((w1 - w0)) -v r=$((r1 - r0)) -v n=$((n1 - n0)) -v h=$((h1 - h0)) \
        -v b=$((b1 - b0)) -v hz="$TICK" 'BEGIN {
        printf "{\"wall_s\": %.3f, \"worker_cpu_s\": %.3f, \"router_cpu_s\": %.3f, \"nginx_cpu_s\": %.3f, \"haproxy_cpu_s\": %.3f, \"baseline_cpu_s\": %.3f}\n",
            t1 - t0, w / hz, r / hz, n / hz, h / hz, b / hz
    }' >"$RAW/$name.cpu.json"
}

# run_layout: starts the stack for $LAYOUT, measures every configuration, stops the stack.
run_layout() {
    local proxy_pin='' worker_pin='' m model proto c round i k target
    if [[ $LAYOUT == pinned ]]; then
        proxy_pin=$PROXY_CPUS worker_pin=$WORKER_CPUS
    fi
    local CP_PORT CP_HTTP_PORT W_HTTP W_GRPC W_METRICS R_HTTP R_GRPC R_METRICS N_HTTP N_GRPC H_HTTP H_GRPC
    local B_HTTP B_GRPC B_METRICS
    read -r CP_PORT CP_HTTP_PORT W_HTTP W_GRPC W_METRICS R_HTTP R_GRPC R_METRICS N_HTTP N_GRPC H_HTTP H_GRPC \
        B_HTTP B_GRPC B_METRICS < <(free_ports 15)
    local CP=127.0.0.1:$CP_PORT
    declare -gA PORTS=([direct/grpc]=$W_GRPC [direct/http]=$W_HTTP [router/grpc]=$R_GRPC [router/http]=$R_HTTP
        [nginx/grpc]=$N_GRPC [nginx/http]=$N_HTTP [haproxy/grpc]=$H_GRPC [haproxy/http]=$H_HTTP
        [baseline/grpc]=$B_GRPC [baseline/http]=$B_HTTP)

    say "layout $LAYOUT: proxies on CPUs ${proxy_pin:-any}, worker on CPUs ${worker_pin:-any}; logs in $DIR"
    echo "# layout $LAYOUT" >>"$COMMANDS"
    start cp '' "$NEREID" control-plane --node-id 1 --listen "$CP" --http-listen "127.0.0.1:$CP_HTTP_PORT" \
        --data-dir "$WORK/cp-$LAYOUT" --auth-token-file "$WORK/token" --model-repository "$WORK/models"
    wait_until "the control plane" http_ok -H "authorization: Bearer $TOKEN" \
        "http://127.0.0.1:$CP_HTTP_PORT/api/v1/cluster"
    start worker "$worker_pin" "$NEREID" worker --control-plane "$CP" --node-id bench-worker \
        --auth-token-file "$WORK/token" --work-dir "$WORK/worker-$LAYOUT" \
        --http-address 127.0.0.1 --http-port "$W_HTTP" --grpc-address 127.0.0.1 --grpc-port "$W_GRPC" \
        --metrics-address 127.0.0.1 --metrics-port "$W_METRICS"
    start router "$proxy_pin" "$NEREID" router --control-plane "$CP" --auth-token-file "$WORK/token" \
        --http-address 127.0.0.1 --http-port "$R_HTTP" --grpc-address 127.0.0.1 --grpc-port "$R_GRPC" \
        --metrics-address 127.0.0.1 --metrics-port "$R_METRICS" "${ROUTER_ARGS[@]}"
    if [[ -n $BASELINE ]]; then
        start baseline "$proxy_pin" "$BASELINE" router --control-plane "$CP" --auth-token-file "$WORK/token" \
            --http-address 127.0.0.1 --http-port "$B_HTTP" --grpc-address 127.0.0.1 --grpc-port "$B_GRPC" \
            --metrics-address 127.0.0.1 --metrics-port "$B_METRICS" "${ROUTER_ARGS[@]}"
    fi
    write_nginx_conf "$DIR/$LAYOUT-nginx.conf"
    start nginx "$proxy_pin" "$NGINX" -p "$WORK/nginx-$LAYOUT" -e "$DIR/$LAYOUT-nginx-error.log" \
        -c "$DIR/$LAYOUT-nginx.conf"
    write_haproxy_conf "$DIR/$LAYOUT-haproxy.cfg"
    start haproxy "$proxy_pin" "$HAPROXY" -db -f "$DIR/$LAYOUT-haproxy.cfg"

    for m in "${MODELS[@]}"; do
        wait_until "model $m on the worker" http_ok "http://127.0.0.1:$W_HTTP/v2/models/$m/ready"
        for target in "${TARGETS[@]:1}"; do
            wait_until "model $m through $target (HTTP)" http_ok "http://127.0.0.1:${PORTS[$target/http]}/v2/models/$m/ready"
        done
    done
    for target in "${TARGETS[@]}"; do
        wait_until "gRPC through $target" grpc_live "127.0.0.1:${PORTS[$target/grpc]}"
    done
    mapfile -t NGINX_WORKERS < <(children "$NGINX_PID")
    if ((${#NGINX_WORKERS[@]} == 0)); then
        echo "error: nginx (pid $NGINX_PID) has no worker processes; see $DIR/$LAYOUT-nginx-error.log" >&2
        exit 1
    fi
    say "layout $LAYOUT: ${MODELS[*]} ready direct and through the router, nginx (${#NGINX_WORKERS[@]} worker(s)) and haproxy"

    # The order of the targets rotates by one from each configuration (and round) to the next.
    i=0
    for model in "${MODELS[@]}"; do
        for proto in "${PROTOCOLS[@]}"; do
            for c in "${CONCURRENCIES[@]}"; do
                for ((round = 1; round <= ROUNDS; round++)); do
                    for ((k = 0; k < ${#TARGETS[@]}; k++)); do
                        target=${TARGETS[(i + k) % ${#TARGETS[@]}]}
                        loadtest "${LAYOUT}_${model}_${proto}_c${c}_${target}_r${round}" "$model" "$proto" "$c" "$target"
                    done
                    i=$((i + 1))
                done
            done
        done
    done
    stop_layout
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

for LAYOUT in "${LAYOUTS[@]}"; do
    run_layout
done

cleanup
say "processes stopped; writing $OUT/proxies.json"

# ---------------------------------------------------------------------------------------------
BENCH_PROXY_CPUS=$PROXY_CPUS BENCH_WORKER_CPUS=$WORKER_CPUS \
    "$PY" - "$OUT" "$SECS" "$INTERVAL_MS" "$ROUNDS" "${FAILED[@]}" <<'EOF' | tee "$OUT/proxies.md"
import json, os, platform, statistics, subprocess, sys, time
from pathlib import Path

out, secs, interval_ms, rounds = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
failed = sys.argv[5:]
raw = out / "proxies" / "raw"
PROXIES = ("router", "nginx", "haproxy")


def load(path):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


runs = {}
if any(raw.glob("*_baseline_r*.cpu.json")):
    PROXIES += ("baseline",)
for path in sorted(raw.glob("*.cpu.json")):
    name = path.name[: -len(".cpu.json")]
    layout, rest = name.split("_", 1)
    model, proto, conc, target, rnd = rest.rsplit("_", 4)
    levels = load(raw / f"{name}.json") or []
    level = levels[0] if levels else {}
    cpu = load(path) or {}
    sent = level.get("requests_total")
    per_req = {f"{p}_cpu_us_per_request": round(cpu[f"{p}_cpu_s"] * 1e6 / sent, 1) if sent and f"{p}_cpu_s" in cpu
               else None for p in ("worker",) + PROXIES}
    runs[name] = {
        "layout": layout, "model": model, "protocol": proto, "concurrency": int(conc[1:]), "target": target,
        "round": int(rnd[1:]), "ok": bool(levels) and name not in failed and not level.get("errors_total"),
        "throughput": level.get("throughput"), "p50_us": level.get("p50_us"), "p99_us": level.get("p99_us"),
        "requests_total": sent, "errors_total": level.get("errors_total"), "first_errors": level.get("first_errors"),
        "stable": level.get("stable"), "client_cpu_percent": level.get("client_cpu_percent"), **cpu, **per_req,
    }


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


rows = []
keys = {(r["layout"], r["model"], r["protocol"], r["concurrency"]) for r in runs.values()}
layout_order = {"pinned": 0, "unpinned": 1}
for key in sorted(keys, key=lambda k: (layout_order.get(k[0], 9), k[1], k[2] != "grpc", k[3])):
    sel = {t: [r for r in runs.values() if (r["layout"], r["model"], r["protocol"], r["concurrency"]) == key
               and r["target"] == t and r["ok"]] for t in ("direct",) + PROXIES}
    direct = {"throughput": med([r["throughput"] for r in sel["direct"]]),
              "p50_us": med([r["p50_us"] for r in sel["direct"]]),
              "p99_us": med([r["p99_us"] for r in sel["direct"]]),
              "worker_cpu_us_per_request": med([r["worker_cpu_us_per_request"] for r in sel["direct"]])}
    row = {"layout": key[0], "model": key[1], "protocol": key[2], "concurrency": key[3],
           "runs": {t: len(v) for t, v in sel.items()}, "direct": direct}
    for p in PROXIES:
        tput = med([r["throughput"] for r in sel[p]])
        p50 = med([r["p50_us"] for r in sel[p]])
        row[p] = {"throughput": tput, "p50_us": p50, "p99_us": med([r["p99_us"] for r in sel[p]]),
                  "throughput_ratio": round(tput / direct["throughput"], 3) if tput and direct["throughput"] else None,
                  "added_p50_us": p50 - direct["p50_us"] if p50 is not None and direct["p50_us"] is not None else None,
                  "cpu_us_per_request": med([r[f"{p}_cpu_us_per_request"] for r in sel[p]]),
                  "worker_cpu_us_per_request": med([r["worker_cpu_us_per_request"] for r in sel[p]])}
    row["all_stable"] = all(r["stable"] for v in sel.values() for r in v)
    rows.append(row)

commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
dirty = bool(subprocess.run(["git", "--no-optional-locks", "status", "--porcelain", "--untracked-files=no"],
                            capture_output=True, text=True).stdout.strip())
cpu_name = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
machine = {"cpu": cpu_name, "cores": os.cpu_count(), "kernel": platform.release(),
           "load_average_at_start": [float(x) for x in os.environ.get("BENCH_LOAD_START", "0 0 0").split()],
           "load_average_at_end": os.getloadavg(), "commit": commit + ("-dirty" if dirty else ""),
           "nginx": os.environ.get("BENCH_NGINX_VERSION", ""), "haproxy": os.environ.get("BENCH_HAPROXY_VERSION", ""),
           "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
layouts = {
    "pinned": f"proxy (router / nginx worker_processes 1 / haproxy nbthread 1) on CPU {os.environ['BENCH_PROXY_CPUS']}, "
              f"worker on CPU {os.environ['BENCH_WORKER_CPUS']}, load generator and control plane unpinned",
    "unpinned": "nothing pinned; each proxy with its defaults: router one runtime thread, "
                "nginx worker_processes auto, haproxy one thread per core",
}
commands = (out / "proxies" / "commands.txt").read_text().splitlines()
results = {"machine": machine,
           "settings": {"measured_secs": secs, "warmup_secs": 1, "measurement_interval_ms": interval_ms,
                        "rounds": rounds},
           "layouts": {k: v for k, v in layouts.items() if any(r["layout"] == k for r in rows)},
           "commands": commands, "rows": rows, "runs": runs, "failed": failed}
(out / "proxies.json").write_text(json.dumps(results, indent=2) + "\n")


def fmt(v, digits=0, sign=False):
    return "n/a" if v is None else f"{v:+,.{digits}f}" if sign else f"{v:,.{digits}f}"


print(f"# Router versus nginx and haproxy ({machine['date']}, commit {machine['commit']}, {cpu_name}, "
      f"{machine['cores']} cores)\n")
print(f"{machine['nginx']}; {machine['haproxy']}. Medians of {rounds} run(s) per target, {secs} s measured "
      f"after 1 s of warm-up, targets in rotating order. Per proxy: throughput ÷ direct, p50 added (µs), "
      f"the proxy's CPU µs per request.")
for layout in results["layouts"]:
    print(f"\n**{layout}**: {layouts[layout]}.\n")
    print("| model | protocol | conc. | direct infer/s | direct p50 µs "
          + "".join(f"| {p} ratio | {p} +p50 µs | {p} CPU µs/req " for p in PROXIES) + "|")
    print("|---|---|---:|---:|---:" + "|---:|---:|---:" * len(PROXIES) + "|")
    for row in (r for r in rows if r["layout"] == layout):
        cells = [row["model"], row["protocol"], str(row["concurrency"]),
                 fmt(row["direct"]["throughput"]), fmt(row["direct"]["p50_us"])]
        for p in PROXIES:
            x = row[p]
            cells += [fmt(x["throughput_ratio"], 2) + ("×" if x["throughput_ratio"] is not None else ""),
                      fmt(x["added_p50_us"], sign=True), fmt(x["cpu_us_per_request"])]
        print("| " + " | ".join(cells) + " |")
print(f"\nClient, proxies and worker share the machine's {machine['cores']} cores. Load average (1, 5, 15 min) "
      f"at the start: {', '.join(f'{x:.2f}' for x in machine['load_average_at_start'])}; at the end: "
      f"{', '.join(f'{x:.2f}' for x in machine['load_average_at_end'])}.")
unstable = [f"{r['layout']}/{r['model']}/{r['protocol']}/c{r['concurrency']}" for r in rows if not r["all_stable"]]
if unstable:
    print(f"\nNot stable within 10 % over the last 3 windows (noise): {', '.join(unstable)}.")
errored = [n for n, r in runs.items() if r["errors_total"]]
if errored:
    print(f"\nRuns with failed requests (left out of the medians): {', '.join(errored)}.")
if failed:
    print(f"\nFAILED: {', '.join(failed)}")
EOF

if ((${#FAILED[@]})); then
    echo "error: some runs failed: ${FAILED[*]}" >&2
    exit 1
fi
say "done: $OUT/proxies.json, $OUT/proxies.md"
