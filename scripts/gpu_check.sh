#!/usr/bin/env bash
# The GPU check of issue 19: the one script a session with a GPU machine runs.
#
#   bash scripts/gpu_check.sh prepare      # here (Rust toolchain, .venv): fills .gpu/ (ignored)
#   then one device call (the `run` tool), carrying .gpu:
#     command: bash scripts/gpu_check.sh device      carry: [".gpu"]      timeout_s: 540
#
# What travels (64 MiB per call, working tree included): .gpu/nereid.xz (stripped, no libtorch:
# the Python backend and CUDA shared memory), .gpu/libnereid_torch_backend.so.xz (stripped,
# the PyTorch backend library built against the device's torch version, run with the device's
# torch libraries; beside a copy of the binary it makes `nereid-torch`),
# .gpu/site/ (tritonclient's pure-Python gRPC client and utils, out of the wheel in
# .venv/wheels, and python-rapidjson; the device has grpcio, protobuf, numpy, torch, CuPy and
# pytest) and the Python
# test files (they travel with the working tree). Test models are made on the device.
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

# The device's torch (KINDS.md): the PyTorch backend is built against exactly this libtorch.
DEVICE_TORCH=2.11.0
DEVICE_TCH=0.24.0   # the tch release made for torch 2.11 (tch 0.26, the project's, is for 2.13)

prepare() {
    cd "$ROOT"
    grep -qs '^/.gpu/$' .git/info/exclude || echo '/.gpu/' >>.git/info/exclude
    rm -rf "$GPU_DIR" && mkdir -p "$GPU_DIR/site"
    # The binary of HEAD and its PyTorch backend library, built in a worktree
    # (target/gpu-torch/src) so the project's own target/ and lock file are untouched: the
    # binary alone is `nereid` (the Python backend, CUDA shared memory, metrics; no libtorch
    # needed), and beside libnereid_torch_backend.so it is `nereid-torch`, the library built
    # against the device's torch: the torch wheel's libtorch (headers and libraries only; its
    # CUDA part is opened at run time, see torch-backend/src/cuda.rs) and the tch release made
    # for it.
    local wheels=target/gpu-torch/wheels lt=target/gpu-torch/libtorch src=target/gpu-torch/src
    mkdir -p "$wheels"
    ls "$wheels"/torch-$DEVICE_TORCH-*.whl >/dev/null 2>&1 ||
        .venv/bin/python -m pip download --no-deps --only-binary=:all: "torch==$DEVICE_TORCH" -d "$wheels"
    if [ ! -f "$lt/torch/lib/libtorch_cpu.so" ]; then
        unzip -q -o "$wheels"/torch-$DEVICE_TORCH-*.whl 'torch/lib/*' 'torch/include/*' 'torch/share/*' -d "$lt"
    fi
    # libtorch_cpu needs libcudart/libcupti at link time, found through its RUNPATH
    # ($ORIGIN/../../nvidia/...): the CUDA runtime wheels `make setup` installed in .venv.
    ln -sfn "$(cd .venv/lib/python3*/site-packages && pwd)/nvidia" "$lt/nvidia"
    git worktree remove --force "$src" 2>/dev/null || rm -rf "$src"
    git worktree prune
    git worktree add --detach "$src" HEAD
    sed -i "s/^tch = \"=[0-9.]*\"/tch = \"=$DEVICE_TCH\"/" "$src/torch-backend/Cargo.toml"
    local out="$ROOT/target/gpu-torch/target"
    # Seeded once with a copy of the project's release dependencies (a plain copy, not links:
    # cargo rewrites some outputs in place), so only what differs is compiled.
    if [ ! -d "$out/release" ] && [ -d target/release/deps ]; then
        mkdir -p "$out/release" && cp -r target/release/{deps,build,.fingerprint} "$out/release/"
    fi
    (cd "$src" && CARGO_TARGET_DIR="$out" cargo build --release -p nereid)
    strip -o "$GPU_DIR/nereid" "$out/release/nereid"
    (cd "$src" && cargo update -q -p tch --precise "$DEVICE_TCH" &&
        LIBTORCH="$ROOT/$lt/torch" CARGO_TARGET_DIR="$out" \
            cargo build --release -p nereid-torch-backend)
    strip -o "$GPU_DIR/libnereid_torch_backend.so" "$out/release/libnereid_torch_backend.so"
    xz -T0 -6 -f "$GPU_DIR/libnereid_torch_backend.so" "$GPU_DIR/nereid"
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
    # tritonclient's one compiled dependency the device lacks, for its Python 3.12.
    .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        -d "$GPU_DIR/wheels" python-rapidjson
    du -sh "$GPU_DIR"
    echo "prepared $GPU_DIR; now: run(command='bash scripts/gpu_check.sh device', carry=['.gpu'])"
}

device() {
    cd "$ROOT"
    OUT=${OUT:-$ROOT/.gpu/out}
    mkdir -p "$OUT" /tmp/gpu
    xz -dc "$GPU_DIR/nereid.xz" >/tmp/gpu/nereid && chmod +x /tmp/gpu/nereid
    # nereid-torch: the same binary with the PyTorch backend library beside it, where it looks.
    mkdir -p /tmp/gpu/torch && cp /tmp/gpu/nereid /tmp/gpu/torch/nereid-torch
    xz -dc "$GPU_DIR/libnereid_torch_backend.so.xz" >/tmp/gpu/torch/libnereid_torch_backend.so
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/gpu/pydeps \
        "$GPU_DIR"/wheels/*.whl
    export PYTHONPATH="$GPU_DIR/site:/tmp/gpu/pydeps${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
    export GRPC_ENABLE_FORK_SUPPORT=false
    nvidia-smi | tee "$OUT/nvidia-smi.txt" || true
    # The device's libtorch, for nereid-torch's backend library (a TorchScript load fails, with
    # the loader's reason, if the ABI differs: reported).
    local torch_lib
    torch_lib=$(python3 -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
    set +e
    NEREID_BIN=/tmp/gpu/nereid timeout 120 python3 -m pytest tests/python/test_dlpack.py -q -x \
        --noconftest -p no:cacheprovider 2>&1 | tee "$OUT/test_dlpack.txt"
    NEREID_BIN=/tmp/gpu/nereid LD_LIBRARY_PATH="$torch_lib" timeout 300 python3 scripts/gpu_check.py \
        --nereid /tmp/gpu/nereid --nereid-torch /tmp/gpu/torch/nereid-torch \
        --out "$OUT" "$@" 2>&1 | tee "$OUT/gpu_check.txt"
    set -e
    tar -czf "$OUT/logs.tar.gz" -C /tmp gpu/logs 2>/dev/null || true
}

case "${1:-}" in
    prepare) prepare ;;
    device) shift; device "$@" ;;   # extra arguments go to gpu_check.py (e.g. --no-bench)
    *) echo "usage: $0 prepare|device" >&2; exit 2 ;;
esac
