#!/usr/bin/env bash
# The GPU check of issue 19: the one script a session with a GPU machine runs. NEVER RUN YET: it
# was written on a machine without a GPU; expect to fix small things on its first run.
#
#   bash scripts/gpu_check.sh prepare      # here (Rust toolchain, .venv): fills .gpu/ (ignored)
#   then one device call (the `run` tool), carrying .gpu:
#     command: bash scripts/gpu_check.sh device      carry: [".gpu"]      timeout_s: 540
#
# What travels (64 MiB per call, working tree included): .gpu/nereid.xz (stripped, no libtorch:
# the Python backend and CUDA shared memory), .gpu/nereid-torch.xz (stripped, PyTorch backend;
# linked against the torch 2.13 libtorch of .venv, tried against the device's own torch libs and
# reported as not loadable when their ABI differs), .gpu/site/ (tritonclient's pure-Python gRPC
# client and utils, out of the wheel in .venv/wheels; the device has grpcio, protobuf, numpy,
# torch, CuPy and pytest), the TorchScript test model, the Python test files (they travel with
# the working tree).
#
# On the device (scripts/gpu_check.py does the work; results in $OUT/gpu_check.json and
# $OUT/gpu_check.md, server logs in $OUT/logs.tar.gz):
#   1. nvidia-smi, the device's torch and CUDA versions
#   2. pytest tests/python/test_dlpack.py (torch CPU and CUDA DLPack through real stubs)
#   3. a TorchScript model on KIND_GPU (nereid-torch, when it loads), a Python/torch model on
#      KIND_GPU (nereid), tritonclient over CUDA shared memory (CuPy allocations, IPC handles)
#   4. the worker GPU report (nereid worker's registration capacity through a stub control
#      plane is out of reach here; the script reads nv_gpu_* from /metrics instead)
#   5. the nv_gpu_* metrics
#   6. in-process torch on the GPU vs the same model served, batch sweep 1..256, concurrency
#      1/8/32 (tritonclient gRPC threads)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
GPU_DIR="$ROOT/.gpu"

prepare() {
    cd "$ROOT"
    grep -qs '^/.gpu/$' .git/info/exclude || echo '/.gpu/' >>.git/info/exclude
    rm -rf "$GPU_DIR" && mkdir -p "$GPU_DIR/site" "$GPU_DIR/models"
    local libtorch
    libtorch="$(cat .venv/libtorch-path)"
    # The PyTorch backend build (what `make build` makes), then one without it: the device's
    # torch is not the 2.13 libtorch this binary links, so the plain one carries the rest.
    LIBTORCH="$libtorch" cargo build --release --features nereid/torch -p nereid
    strip -o "$GPU_DIR/nereid-torch" target/release/nereid
    cargo build --release -p nereid --target-dir target/gpu-plain
    strip -o "$GPU_DIR/nereid" target/gpu-plain/release/nereid
    xz -T0 -6 -f "$GPU_DIR/nereid-torch" "$GPU_DIR/nereid"
    # tritonclient's Python packages (no perf_analyzer binaries, no HTTP client deps).
    local wheel
    wheel=$(ls .venv/wheels/tritonclient-*.whl | head -1)
    python3 - "$wheel" "$GPU_DIR/site" <<'PY'
import sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        rel = name.split("purelib/", 1)[1] if "purelib/" in name else None
        if rel and rel.startswith("tritonclient/") and not rel.startswith("tritonclient/http"):
            target = f"{out}/{rel}"
            import os
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "wb") as f:
                f.write(z.read(name))
PY
    cp -r tests/models/pytorch/mlp_script "$GPU_DIR/models/"
    du -sh "$GPU_DIR"
    echo "prepared $GPU_DIR; now: run(command='bash scripts/gpu_check.sh device', carry=['.gpu'])"
}

device() {
    cd "$ROOT"
    OUT=${OUT:-$ROOT/.gpu/out}
    mkdir -p "$OUT" /tmp/gpu
    xz -dc "$GPU_DIR/nereid.xz" >/tmp/gpu/nereid && chmod +x /tmp/gpu/nereid
    xz -dc "$GPU_DIR/nereid-torch.xz" >/tmp/gpu/nereid-torch && chmod +x /tmp/gpu/nereid-torch
    export PYTHONPATH="$GPU_DIR/site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
    export GRPC_ENABLE_FORK_SUPPORT=false
    nvidia-smi | tee "$OUT/nvidia-smi.txt" || true
    # The device's libtorch, for nereid-torch (it fails to start if the ABI differs: reported).
    local torch_lib
    torch_lib=$(python3 -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
    set +e
    NEREID_BIN=/tmp/gpu/nereid timeout 150 python3 -m pytest tests/python/test_dlpack.py -q -x \
        -p no:cacheprovider 2>&1 | tee "$OUT/test_dlpack.txt"
    LD_LIBRARY_PATH="$torch_lib" timeout 330 python3 scripts/gpu_check.py \
        --nereid /tmp/gpu/nereid --nereid-torch /tmp/gpu/nereid-torch \
        --models "$GPU_DIR/models" --out "$OUT" 2>&1 | tee "$OUT/gpu_check.txt"
    set -e
    tar -czf "$OUT/logs.tar.gz" -C /tmp gpu/logs 2>/dev/null || true
}

case "${1:-}" in
    prepare) prepare ;;
    device) device ;;
    *) echo "usage: $0 prepare|device" >&2; exit 2 ;;
esac
