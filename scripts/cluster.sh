#!/usr/bin/env bash
# A local cluster on 127.0.0.1: 3 control-plane nodes, 2 workers and a router, with the example
# model repository registered. `up` starts it (state, logs and PIDs under .cluster/), `down`
# stops it by PID. NEREID selects the binary (default target/release/nereid).
set -euo pipefail

cd "$(dirname "$0")/.."
NEREID=${NEREID:-target/release/nereid}
REPO=${REPO:-docs/examples/model_repository}
DIR=.cluster
PEERS=1=127.0.0.1:7001,2=127.0.0.1:7002,3=127.0.0.1:7003
CONTROL_PLANE=127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003

start() { # name, args...
    local name=$1
    shift
    "$NEREID" "$@" >"$DIR/$name.log" 2>&1 &
    echo $! >"$DIR/$name.pid"
}

wait_http() { # url, what: polls until the URL answers, or a started process has exited
    for _ in $(seq 1 300); do
        if curl -fs -o /dev/null "$1" -H "authorization: Bearer $(cat "$DIR/token")" 2>/dev/null; then
            return 0
        fi
        for f in "$DIR"/*.pid; do
            if ! kill -0 "$(cat "$f")" 2>/dev/null; then
                local name
                name=$(basename "$f" .pid)
                echo "error: $name exited; the end of $DIR/$name.log:" >&2
                tail -5 "$DIR/$name.log" >&2
                down >/dev/null
                exit 1
            fi
        done
        sleep 0.2
    done
    echo "error: $2 did not come up; see $DIR/*.log" >&2
    down >/dev/null
    exit 1
}

up() {
    if compgen -G "$DIR/*.pid" >/dev/null; then
        echo "error: a cluster is already running (make cluster-down first)" >&2
        exit 1
    fi
    mkdir -p "$DIR"
    [ -s "$DIR/token" ] || head -c 24 /dev/urandom | base64 | tr -d '/+=' >"$DIR/token"
    local python=${NEREID_PYTHON:-$PWD/.venv/bin/python}
    export NEREID_PYTHON=$python
    for i in 1 2 3; do
        start "cp$i" control-plane --node-id "$i" --listen "127.0.0.1:700$i" \
            --http-listen "127.0.0.1:708$i" --peers "$PEERS" --data-dir "$DIR/cp$i" \
            --auth-token-file "$DIR/token" --model-repository "$REPO"
    done
    wait_http http://127.0.0.1:7081/api/v1/cluster "control plane"
    for w in 1 2; do
        start "worker$w" worker --control-plane "$CONTROL_PLANE" --node-id "worker-$w" \
            --auth-token-file "$DIR/token" --work-dir "$PWD/$DIR/worker$w" \
            --http-address 127.0.0.1 --http-port "810$w" --grpc-address 127.0.0.1 \
            --grpc-port "811$w" --metrics-address 127.0.0.1 --metrics-port "812$w"
    done
    start router router --control-plane "$CONTROL_PLANE" --auth-token-file "$DIR/token" \
        --http-address 127.0.0.1 --http-port 8000 --grpc-address 127.0.0.1 --grpc-port 8001 \
        --metrics-address 127.0.0.1 --metrics-port 8002
    wait_http http://127.0.0.1:8000/v2/health/live "router"
    cat <<MSG
Nereid cluster on 127.0.0.1 (logs and PIDs in $DIR/):
  router          HTTP http://127.0.0.1:8000  gRPC 127.0.0.1:8001  metrics :8002
  control plane   gRPC 127.0.0.1:7001-7003  REST http://127.0.0.1:7081-7083/api/v1
  workers         HTTP :8101, :8102  gRPC :8111, :8112
  admin token     $DIR/token
Try:
  export NEREID_CONTROL_PLANE=$CONTROL_PLANE NEREID_AUTH_TOKEN=\$(cat $DIR/token)
  $NEREID ctl models list
  curl -s localhost:8000/v2/models/simple
Stop it with: make cluster-down
MSG
}

down() {
    local pids=()
    for f in "$DIR"/*.pid; do
        [ -e "$f" ] || continue
        pids+=("$(cat "$f")")
        rm -f "$f"
    done
    if [ ${#pids[@]} -eq 0 ]; then
        echo "no cluster running"
        return 0
    fi
    kill -TERM "${pids[@]}" 2>/dev/null || true
    for _ in $(seq 1 150); do
        local alive=0
        for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
        [ $alive -eq 0 ] && break
        sleep 0.2
    done
    kill -KILL "${pids[@]}" 2>/dev/null || true
    echo "cluster stopped (state kept in $DIR/; remove it for a fresh cluster)"
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    *) echo "usage: $0 up|down" >&2; exit 2 ;;
esac
