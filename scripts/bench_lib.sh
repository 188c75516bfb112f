# Shell functions the bench scripts share (sourced, not run): logging every command, free
# loopback ports, CPU time of processes, stopping processes, and starting `nereid serve` with a
# bounded wait.
#
# The sourcing script sets ROOT (the repository), COMMANDS (its commands.txt) and PY (the venv's
# python) first.

say() { echo "==> $*" >&2; }

# Appends a command, shell-quoted, to $COMMANDS (paths relative to the repository).
log_cmd() {
    local line
    line=$(printf '%q ' "$@")
    line=${line% }
    line=${line//\\,/,}
    printf '%s%s\n' "${line//$ROOT\//}" "${LOG_SUFFIX:-}" >>"$COMMANDS"
}

# Runs a command after logging it.
run() {
    log_cmd "$@"
    "$@"
}

# free_ports N: N free TCP ports on 127.0.0.1, space-separated.
free_ports() {
    "$PY" - "$1" <<'PY'
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])
for s in socks:
    s.close()
PY
}

# cpu_ticks PID...: utime+stime of the processes (all their threads, live and exited), in clock
# ticks, summed.
cpu_ticks() {
    local pid total=0 line
    local -a f
    for pid in "$@"; do
        line=$(<"/proc/$pid/stat")
        # The command name may hold spaces; the fields after it start at field 3.
        read -r -a f <<<"${line##*) }"
        total=$((total + f[11] + f[12]))
    done
    echo "$total"
}

# stop_pid PID: SIGTERM, up to 10 s to exit, then SIGKILL.
stop_pid() {
    local pid=$1
    kill -0 "$pid" 2>/dev/null || return 0
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 50); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.2
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}

# The server start_serve started, if any; stop_serve (an EXIT trap) stops it.
SERVER_PID=
stop_serve() {
    if [[ -n $SERVER_PID ]]; then
        stop_pid "$SERVER_PID"
    fi
    SERVER_PID=
}

# start_serve MODELS LOG READY_PATH: starts `$NEREID serve` on free loopback ports, logging to
# LOG, and waits (at most 120 s) until READY_PATH answers over HTTP. Sets HTTP, GRPC (host:port)
# and SERVER_PID (stopped by stop_serve).
start_serve() {
    local models=$1 log=$2 ready=$3 http_port grpc_port metrics_port
    read -r http_port grpc_port metrics_port < <(free_ports 3)
    HTTP=127.0.0.1:$http_port
    GRPC=127.0.0.1:$grpc_port
    say "starting nereid on HTTP $HTTP, gRPC $GRPC (log: $log)"
    local serve=("$NEREID" serve --model-repository "$models"
        --http-address 127.0.0.1 --http-port "$http_port"
        --grpc-address 127.0.0.1 --grpc-port "$grpc_port"
        --metrics-address 127.0.0.1 --metrics-port "$metrics_port"
        --exit-on-error)
    # Client shared memory through the environment, not the flag, so a baseline binary older
    # than the flag (NEREID_BASELINE) starts too; it had shared memory on without asking.
    LOG_SUFFIX=" &" log_cmd NEREID_ALLOW_CLIENT_SHM=true "${serve[@]}"
    NEREID_ALLOW_CLIENT_SHM=true "${serve[@]}" >"$log" 2>&1 &
    SERVER_PID=$!
    local deadline=$((SECONDS + 120))
    until curl -sf -o /dev/null "http://$HTTP$ready"; do
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            echo "error: nereid exited before becoming ready; see $log:" >&2
            tail -n 20 "$log" >&2
            exit 1
        fi
        if ((SECONDS > deadline)); then
            echo "error: $ready not ready after 120 s; see $log" >&2
            exit 1
        fi
        sleep 0.2
    done
    say "nereid is ready"
}
