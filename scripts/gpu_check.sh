#!/usr/bin/env bash
# The GPU check of issues 19 and 39: the one script a session with a GPU machine runs.
#
#   bash scripts/gpu_check.sh prepare      # here (Rust toolchain, .venv): fills .gpu/ (ignored)
#   bash scripts/gpu_carry.sh              # here: onnxruntime-gpu in parts (.gpu-ort/, ignored)
#                                          # and the exact run calls, printed
#   then the device calls it printed, back to back: one per part
#   (`bash scripts/gpu_parts.sh take .gpu-ort/pNN`), the last one with the check:
#     command: bash scripts/gpu_parts.sh take .gpu-ort/pNN && bash scripts/gpu_check.sh device
#     carry: [".gpu-ort/pNN", ".gpu"]      timeout_s: 600
#   bash scripts/gpu_check.sh dry          # here: the check's logic on the CPU (--dry-run-cpu)
#
# What travels (64 MiB per call, working tree included): .gpu/nereid.xz (stripped, no libtorch:
# the Python backend, ONNX Runtime and CUDA shared memory) with .gpu/libnereid_stub_core.so.xz
# (the Python stub's compiled core, put beside it), .gpu/libnereid_torch_backend.so.xz
# (stripped, the PyTorch backend library built against the device's torch version, run with the
# device's torch libraries; beside a copy of the binary it makes `nereid-torch`), .gpu/site/
# (tritonclient's pure-Python gRPC client and utils, out of the wheel in .venv/wheels, and
# python-rapidjson; the device has grpcio, protobuf, numpy, torch, CuPy and pytest), the
# onnxruntime-gpu parts (unpacked to /tmp/nereid-gpu/ort/site by scripts/gpu_parts.sh) and the
# scripts (they travel with the working tree). Test models are made on the device.
#
# On the device scripts/gpu_check.py does the work (its docstring lists the steps; results in
# $OUT/gpu_check.json and $OUT/gpu_check.md, server logs in $OUT/logs.tar.gz): the torch section
# of issue 19, ONNX Runtime's CUDA provider (gpu_ort.py), Python instances with and without MPS
# (gpu_python.py) and GPU placement (gpu_placement.py), each served-vs-in-process sweep feeding
# the JSON's ratio_vs_inprocess. DLPACK=1 also runs tests/python/test_dlpack.py first (it passed
# on the H100; off by default to keep the call short). Extra arguments go to gpu_check.py
# (--sections, --no-bench, --py-shared-param KEY=VALUE, sizes).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
GPU_DIR="$ROOT/.gpu"

# The device's torch (KINDS.md): the PyTorch backend is built against exactly this libtorch.
DEVICE_TORCH=2.11.0
DEVICE_TCH=0.24.0   # the tch release made for torch 2.11 (tch 0.26, the project's, is for 2.13)

prepare() {
    cd "$ROOT"
    local exclude
    exclude=$(git rev-parse --git-path info/exclude)
    mkdir -p "$(dirname "$exclude")"
    grep -qsxF '/.gpu/' "$exclude" || echo '/.gpu/' >>"$exclude"
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
    # The Python stub's compiled core (PyO3, abi3: this machine's Python builds it, the
    # device's 3.12 imports it) goes beside the binary, where the server looks for it.
    (cd "$src" && CARGO_TARGET_DIR="$out" cargo build --release -p nereid -p nereid-stub-core)
    strip -o "$GPU_DIR/nereid" "$out/release/nereid"
    strip -o "$GPU_DIR/libnereid_stub_core.so" "$out/release/libnereid_stub_core.so"
    (cd "$src" && cargo update -q -p tch --precise "$DEVICE_TCH" &&
        LIBTORCH="$ROOT/$lt/torch" CARGO_TARGET_DIR="$out" \
            cargo build --release -p nereid-torch-backend)
    strip -o "$GPU_DIR/libnereid_torch_backend.so" "$out/release/libnereid_torch_backend.so"
    xz -T0 -6 -f "$GPU_DIR/libnereid_torch_backend.so" "$GPU_DIR/nereid" \
        "$GPU_DIR/libnereid_stub_core.so"
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
    # The Python stub's compiled core beside each binary (the server looks there first).
    xz -dc "$GPU_DIR/libnereid_stub_core.so.xz" >/tmp/gpu/libnereid_stub_core.so
    cp /tmp/gpu/libnereid_stub_core.so /tmp/gpu/torch/
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/gpu/pydeps \
        "$GPU_DIR"/wheels/*.whl
    # onnxruntime-gpu, if scripts/gpu_parts.sh unpacked its parts (scripts/gpu_carry.sh): its
    # package goes first on PYTHONPATH (the in-process benchmark) and its library to the server.
    local ort_site=/tmp/nereid-gpu/ort/site ort_args=()
    bash scripts/gpu_parts.sh status || true
    if [ -d "$ort_site/onnxruntime" ]; then
        ort_args=(--onnxruntime-library "$(bash scripts/gpu_parts.sh library)")
    else
        ort_site=
    fi
    export PYTHONPATH="${ort_site:+$ort_site:}$GPU_DIR/site:/tmp/gpu/pydeps${PYTHONPATH:+:$PYTHONPATH}"
    export PYTHONUNBUFFERED=1 GRPC_ENABLE_FORK_SUPPORT=false
    nvidia-smi | tee "$OUT/nvidia-smi.txt" || true
    # The device's libtorch (for nereid-torch's backend library) and the CUDA libraries of its
    # nvidia-* wheels (cuBLAS, cuDNN, ...: ONNX Runtime's CUDA provider NEEDs them).
    local torch_lib cuda_libs
    torch_lib=$(python3 -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
    cuda_libs=$(python3 - <<'PY'
import glob, os, sys
dirs = []
for site in sys.path:
    for lib in sorted(glob.glob(os.path.join(site, "nvidia", "**", "lib", "lib*.so*"), recursive=True)):
        dirs.append(os.path.dirname(lib))
print(":".join(dict.fromkeys(dirs)))
PY
)
    set +e
    if [ -n "${DLPACK:-}" ]; then
        NEREID_BIN=/tmp/gpu/nereid timeout 120 python3 -m pytest tests/python/test_dlpack.py -q -x \
            --noconftest -p no:cacheprovider 2>&1 | tee "$OUT/test_dlpack.txt"
    fi
    # Within one call (600 s at most): the check stops itself at 500 s, writing what it has.
    NEREID_BIN=/tmp/gpu/nereid LD_LIBRARY_PATH="$torch_lib:$cuda_libs" timeout 500 python3 \
        scripts/gpu_check.py --nereid /tmp/gpu/nereid --nereid-torch /tmp/gpu/torch/nereid-torch \
        ${ort_args[@]+"${ort_args[@]}"} --out "$OUT" "$@" 2>&1 | tee "$OUT/gpu_check.txt"
    set -e
    tar -czf "$OUT/logs.tar.gz" -C /tmp gpu/logs 2>/dev/null || true
}

# The check's logic on this CPU-only machine (every GPU step skipped or stood in for): the
# binary of target/release and the CPU ONNX Runtime of .venv. Results in target/gpu-dry/.
dry() {
    cd "$ROOT"
    local bin=/tmp/nereid-gpu-dry out=${OUT:-$ROOT/target/gpu-dry}
    mkdir -p "$bin" "$out"
    cp "${NEREID_DRY_BIN_DIR:-target/release}"/{nereid,libnereid_stub_core.so} "$bin/"
    local lib gpu_lib=()
    lib=$(ls .venv/lib/python3*/site-packages/onnxruntime/capi/libonnxruntime.so.* | head -1)
    # The parts of scripts/gpu_carry.sh, when made, go through scripts/gpu_parts.sh as on the
    # device (copies: `take` moves them); the library they give is probed on this CPU.
    if ls -d .gpu-ort/p[0-9][0-9] >/dev/null 2>&1; then
        local parts=/tmp/nereid-gpu-dry-ort/parts p
        rm -rf /tmp/nereid-gpu-dry-ort && mkdir -p "$parts" && cp -r .gpu-ort/p[0-9][0-9] "$parts/"
        for p in "$parts"/p[0-9][0-9]; do
            NEREID_GPU_DIR=/tmp/nereid-gpu-dry-ort bash scripts/gpu_parts.sh take "$p"
        done
        gpu_lib=(--onnxruntime-gpu-library "$(NEREID_GPU_DIR=/tmp/nereid-gpu-dry-ort bash scripts/gpu_parts.sh library)")
    fi
    NEREID_BIN=$bin/nereid PYTHONUNBUFFERED=1 timeout 600 .venv/bin/python scripts/gpu_check.py \
        --dry-run-cpu --nereid "$bin/nereid" --onnxruntime-library "$lib" --work /tmp/gpu-dry \
        ${gpu_lib[@]+"${gpu_lib[@]}"} --out "$out" "$@"
}

case "${1:-}" in
    prepare) prepare ;;
    device) shift; device "$@" ;;   # extra arguments go to gpu_check.py (e.g. --no-bench)
    dry) shift; dry "$@" ;;
    *) echo "usage: $0 prepare|device|dry" >&2; exit 2 ;;
esac
