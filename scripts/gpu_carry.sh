#!/usr/bin/env bash
# Takes onnxruntime-gpu to the GPU machine in parts (issue 39): run here, before the device calls.
#
#   bash scripts/gpu_carry.sh            # fills .gpu-ort/ (ignored) and prints the run calls
#   bash scripts/gpu_carry.sh plan       # prints the run calls again (nothing downloaded)
#
# The GPU machine cannot reach a package registry and one `run` call carries 64 MiB, working
# tree included. onnxruntime-gpu (the version of the CPU library the project uses, for the
# device's Python 3.12) is a 255 MB wheel, 350 MB unpacked, of which its CUDA provider
# library is 284 MB. So:
#   1. pip downloads the wheel into .gpu-ort/wheel/ (once);
#   2. the wheel's files (an installed `onnxruntime` package: the Python API with its
#      libonnxruntime.so, and the CUDA, TensorRT and shared provider libraries beside it)
#      become one tar, compressed with zstd -19 (.gpu-ort/ort.tar.zst and its sha256);
#   3. that file is split into parts that each fit one call beside the working tree, each in
#      its own folder .gpu-ort/pNN/ with a manifest (the whole file's sha256, size and part
#      count); the last one also holds zstandard's wheel (the device decompresses with it if
#      it has no `zstd`);
#   4. the plan: one call per part (`scripts/gpu_parts.sh take` appends the part to
#      /tmp/nereid-gpu/ort/ on the device and, with the last part, checks the sha256 and
#      unpacks), the last part riding with the GPU check's own call when .gpu/ leaves room.
# The device keeps /tmp only while it stays warm (30 s after a call): make the calls one right
# after the other. `scripts/gpu_parts.sh status` there says which parts arrived.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
DIR=.gpu-ort
ORT_VERSION=$(sed -n 's/^ORT_VERSION=//p' scripts/setup.sh)
# One call: 64 MiB for the working tree and everything carried. MARGIN leaves room for files
# that appear in the tree between now and the calls.
LIMIT=$((64 << 20))
MARGIN=$((4 << 20))
PY=${PYTHON:-$ROOT/.venv/bin/python}
# The device's Python (KINDS.md: 3.12 on x86-64 manylinux).
PIP_TARGET=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)

log() { echo "gpu_carry: $*" >&2; }

exclude() {
    local file
    file=$(git rev-parse --git-path info/exclude)
    mkdir -p "$(dirname "$file")"
    grep -qsxF "/$DIR/" "$file" || echo "/$DIR/" >>"$file"
}

# Bytes a call spends on the working tree: tracked and untracked-not-ignored files, in
# allocated blocks (du's default), as the tool's limit may count them.
tree_bytes() {
    { git ls-files -z; git ls-files -z --others --exclude-standard; } |
        du --files0-from=- -c -B1 2>/dev/null | tail -1 | cut -f1
}

dir_bytes() { [ -e "$1" ] && du -s -B1 "$1" | cut -f1 || echo 0; }

build() {
    exclude
    mkdir -p "$DIR/wheel"
    local wheel
    wheel=$(ls "$DIR"/wheel/onnxruntime_gpu-"$ORT_VERSION"-*.whl 2>/dev/null | head -1 || true)
    if [ -z "$wheel" ]; then
        log "downloading onnxruntime-gpu $ORT_VERSION"
        "$PY" -m pip download -q "${PIP_TARGET[@]}" -d "$DIR/wheel" "onnxruntime-gpu==$ORT_VERSION"
        wheel=$(ls "$DIR"/wheel/onnxruntime_gpu-"$ORT_VERSION"-*.whl | head -1)
    fi
    local zwheel
    zwheel=$(ls "$DIR"/wheel/zstandard-*.whl 2>/dev/null | head -1 || true)
    if [ -z "$zwheel" ]; then
        "$PY" -m pip download -q "${PIP_TARGET[@]}" -d "$DIR/wheel" "zstandard==0.25.0"
        zwheel=$(ls "$DIR"/wheel/zstandard-*.whl | head -1)
    fi
    if [ ! -f "$DIR/ort.tar.zst" ] || [ "$wheel" -nt "$DIR/ort.tar.zst" ]; then
        local stage
        stage=$(mktemp -d)
        trap 'rm -rf "$stage"' RETURN
        log "unpacking $(basename "$wheel")"
        unzip -q "$wheel" -d "$stage/site"
        log "compressing with zstd -19 (minutes on two cores)"
        # Fixed names, owners and times: the same wheel gives the same file and sha256.
        tar -C "$stage" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -cf - site |
            zstd -q -19 -T0 -o "$DIR/ort.tar.zst.tmp" -f
        mv "$DIR/ort.tar.zst.tmp" "$DIR/ort.tar.zst"
    fi
    split_parts "$zwheel"
    plan
}

# Splits ort.tar.zst into as few parts as the calls can carry beside the working tree: full
# parts, and the last one what is left, with zstandard's wheel (for a device without `zstd`).
split_parts() {
    local zwheel=$1 total tree part wheel n sha
    total=$(stat -c %s "$DIR/ort.tar.zst")
    tree=$(tree_bytes)
    wheel=$(stat -c %s "$zwheel")
    part=$(( (LIMIT - tree - MARGIN - 4096) >> 20 << 20 ))
    [ "$part" -gt $((wheel + (8 << 20))) ] ||
        { log "the working tree ($tree bytes) leaves no room"; exit 1; }
    # The last part must leave room for the wheel: one more part if it would not.
    if [ $(( total % part )) -eq 0 ] || [ $(( total % part + wheel )) -gt "$part" ]; then
        part=$(( (total / (total / part + 1) + (1 << 20)) >> 20 << 20 ))
    fi
    sha=$(sha256sum "$DIR/ort.tar.zst" | cut -d' ' -f1)
    rm -rf "$DIR"/p[0-9][0-9]
    local tmp i=0 f d
    tmp=$(mktemp -d)
    split -b "$part" -d -a 2 "$DIR/ort.tar.zst" "$tmp/ort.tar.zst."
    n=$(ls "$tmp" | wc -l)
    for f in "$tmp"/ort.tar.zst.*; do
        d=$(printf '%s/p%02d' "$DIR" "$i")
        mkdir -p "$d"
        mv "$f" "$d/"
        printf 'sha256 %s\nbytes %s\nparts %s\nversion %s\n' "$sha" "$total" "$n" "$ORT_VERSION" \
            >"$d/manifest"
        i=$((i + 1))
    done
    rm -rf "$tmp"
    cp "$zwheel" "$d/"
    log "ort.tar.zst: $total bytes, sha256 $sha, $n parts of at most $part bytes (tree $tree)"
}

# The run calls, in order. The last part goes with the GPU check's call when it fits beside
# .gpu/ (made by `scripts/gpu_check.sh prepare`), else the check has a call of its own. The
# check runs even if a part is missing (its ONNX Runtime steps then say so).
plan() {
    local parts=("$DIR"/p[0-9][0-9]) tree gpu last
    [ -d "${parts[0]}" ] || { log "no parts yet: run bash scripts/gpu_carry.sh"; exit 1; }
    tree=$(tree_bytes)
    gpu=$(dir_bytes .gpu)
    if [ "$gpu" -eq 0 ]; then
        log "warning: .gpu/ is missing: run bash scripts/gpu_check.sh prepare first" \
            "(planned with its usual 14 MiB)"
        gpu=$((14 << 20))
    fi
    last=${parts[-1]}
    local n=${#parts[@]} k=0 p merged=0
    if [ $((tree + MARGIN + gpu + $(dir_bytes "$last"))) -le "$LIMIT" ]; then
        merged=1
    fi
    echo "# ${n} part(s); tree $((tree >> 20)) MiB, .gpu $((gpu >> 20)) MiB. Make the calls back to back:"
    echo "# the device keeps /tmp only while warm (30 s after each call)."
    for p in "${parts[@]}"; do
        k=$((k + 1))
        if [ "$k" -eq "$n" ] && [ "$merged" -eq 1 ]; then
            break
        fi
        echo "run(command=\"bash scripts/gpu_parts.sh take $p\", carry=[\"$p\"], timeout_s=120)"
    done
    if [ "$merged" -eq 1 ]; then
        echo "run(command=\"bash scripts/gpu_parts.sh take $last; bash scripts/gpu_check.sh device\", carry=[\"$last\", \".gpu\"], timeout_s=600)"
    else
        echo "run(command=\"bash scripts/gpu_check.sh device\", carry=[\".gpu\"], timeout_s=600)"
    fi
}

case "${1:-build}" in
    build) build ;;
    plan) plan ;;
    *) echo "usage: $0 [build|plan]" >&2; exit 2 ;;
esac
