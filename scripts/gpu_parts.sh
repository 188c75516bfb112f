#!/usr/bin/env bash
# The device half of scripts/gpu_carry.sh: gathers onnxruntime-gpu's parts on the GPU machine.
#
#   bash scripts/gpu_parts.sh take .gpu-ort/pNN   # one call per part (the folder carried)
#   bash scripts/gpu_parts.sh status              # which parts arrived
#   bash scripts/gpu_parts.sh unpack              # checks the sha256, unpacks (take does it
#                                                 # by itself once every part is there)
#
# Parts go to $NEREID_GPU_DIR/ort/ (/tmp/nereid-gpu/ort/ by default), which outlives a call
# only while the machine stays warm. Unpacked, the package is $NEREID_GPU_DIR/ort/site/
# (an installed `onnxruntime`, the onnxruntime-gpu wheel's files): put it first on PYTHONPATH
# for the Python API, and point --onnxruntime-library at its capi/libonnxruntime.so.*.
# `unpack` prints that library's path last. Decompression uses `zstd` where the machine has
# it, else Python's zstandard from the wheel carried with each part.
set -euo pipefail
BASE=${NEREID_GPU_DIR:-/tmp/nereid-gpu}
ORT=$BASE/ort

log() { echo "gpu_parts: $*" >&2; }

field() { sed -n "s/^$1 //p" "$ORT/manifest"; }

take() {
    local src=${1:?usage: take DIR}
    [ -f "$src/manifest" ] || { log "$src has no manifest (was it carried?)"; exit 1; }
    mkdir -p "$ORT"
    if [ -f "$ORT/manifest" ] && [ "$(field sha256)" != "$(sed -n 's/^sha256 //p' "$src/manifest")" ]; then
        log "parts of another file were here: starting again"
        rm -rf "${ORT:?}"/*
    fi
    # mv, not cp: the carried copy stays in the repository there until the machine goes back.
    mv -f "$src"/ort.tar.zst.* "$ORT/"
    cp -f "$src"/manifest "$src"/*.whl "$ORT/" 2>/dev/null || true
    status
    if [ "$(have)" -eq "$(field parts)" ]; then
        unpack
    fi
}

have() { find "$ORT" -maxdepth 1 -name 'ort.tar.zst.[0-9][0-9]' | wc -l; }

status() {
    [ -f "$ORT/manifest" ] || { echo "no parts in $ORT"; return 0; }
    echo "parts in $ORT: $(have) of $(field parts):" \
        "$(cd "$ORT" && ls ort.tar.zst.[0-9][0-9] 2>/dev/null | sed 's/ort.tar.zst.//' | tr '\n' ' ')"
}

library() { ls "$ORT"/site/onnxruntime/capi/libonnxruntime.so.* 2>/dev/null | head -1; }

unpack() {
    [ -f "$ORT/manifest" ] || { log "no parts in $ORT"; exit 1; }
    local n expected got
    n=$(field parts)
    if [ "$(have)" -eq 0 ] && [ -f "$ORT/unpacked" ] && [ -n "$(library)" ]; then
        log "already unpacked into $ORT/site"
        library
        return 0
    fi
    if [ "$(have)" -ne "$n" ]; then
        status
        log "missing parts (the machine went back between calls?): send every part again"
        exit 1
    fi
    expected=$(field sha256)
    got=$(cat "$ORT"/ort.tar.zst.[0-9][0-9] | sha256sum | cut -d' ' -f1)
    if [ "$got" != "$expected" ]; then
        log "sha256 $got, expected $expected: a part is damaged; send them again"
        exit 1
    fi
    rm -rf "$ORT/site"
    if command -v zstd >/dev/null && [ -z "${NEREID_GPU_NO_ZSTD:-}" ]; then
        cat "$ORT"/ort.tar.zst.[0-9][0-9] | zstd -dc | tar -C "$ORT" -xf -
    else
        log "no zstd here: decompressing with Python's zstandard"
        local py=${PYTHON:-python3}
        "$py" -m pip install -q --no-index --no-deps --no-compile --target "$ORT/zstd" \
            "$ORT"/zstandard-*.whl
        cat "$ORT"/ort.tar.zst.[0-9][0-9] | PYTHONPATH="$ORT/zstd" "$py" -c '
import sys, zstandard
zstandard.ZstdDecompressor().copy_stream(sys.stdin.buffer, sys.stdout.buffer)' |
            tar -C "$ORT" -xf -
    fi
    # The parts are no longer needed; the unpacked package is what the check uses.
    rm -f "$ORT"/ort.tar.zst.[0-9][0-9]
    echo "$n" >"$ORT/unpacked"
    log "unpacked onnxruntime-gpu $(field version) into $ORT/site"
    library
}

case "${1:-}" in
    take) shift; take "$@" ;;
    status) status ;;
    unpack) unpack ;;
    library) library ;;
    *) echo "usage: $0 take DIR|status|unpack|library" >&2; exit 2 ;;
esac
