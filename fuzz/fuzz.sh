#!/usr/bin/env bash
# Builds and runs the fuzz targets on the stable toolchain (no cargo-fuzz, no nightly):
# libfuzzer-sys links libFuzzer, and RUSTFLAGS add the sanitizer-coverage instrumentation that
# `cargo fuzz --sanitizer none` would. `--target <host>` keeps the flags off build scripts and
# proc macros, as cargo-fuzz does.
#
#   fuzz/fuzz.sh build [all|light]          instrumented release build of every target, or of
#                                           the light ones (nereid-proto, nereid-frontend and
#                                           the router's two scanners, compiled in from their
#                                           source files; what `make fuzz-smoke` builds)
#   fuzz/fuzz.sh run SECONDS [all|light|TARGET...]
#                                           each target (default: all) for SECONDS, one line of
#                                           summary each; exit status 1 if any target crashed
#
# A run reads the seeds in fuzz/corpus/<target>/ and grows fuzz/target/corpus/<target>/ (kept
# between runs, not committed); a crashing input is saved in fuzz/artifacts/<target>/ and its
# log in fuzz/target/logs/<target>.log. docs/fuzzing.md has the details.
set -euo pipefail
cd "$(dirname "$0")"

LIGHT=(http_infer_body grpc_infer_request model_config_text router_wire_scan router_http_scan)
ALL=("${LIGHT[@]}" model_config python_stub_frames management_rest)
HOST=$(rustc -vV | sed -n 's/^host: //p')
BIN_DIR=target/$HOST/release

# Not --locked: fuzz/Cargo.lock pins what it holds (copied from the main lock), and a dependency
# one of the crates gains later is added to it instead of failing `make test`.
build() {
    RUSTFLAGS="-Cpasses=sancov-module \
-Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
-Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares \
--cfg fuzzing ${RUSTFLAGS:-}" \
        cargo build --release --target "$HOST" --bins "$@"
}

# run_one TARGET SECONDS: prints "<target>: runs=N crashes=C ..."; returns 1 on a crash.
run_one() {
    local target=$1 seconds=$2
    local bin=$BIN_DIR/$target log=target/logs/$target.log
    if [[ ! -x $bin ]]; then
        echo "fuzz.sh: $bin is missing; run 'fuzz/fuzz.sh build' first" >&2
        return 2
    fi
    mkdir -p "target/corpus/$target" "artifacts/$target" target/logs
    local dict=() status=0
    [[ -f dicts/$target.dict ]] && dict=(-dict="dicts/$target.dict")
    "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -error_exitcode=77 \
        -print_final_stats=1 -artifact_prefix="artifacts/$target/" "${dict[@]}" \
        "target/corpus/$target" "corpus/$target" >"$log" 2>&1 || status=$?
    local runs crashed=0 artifact=""
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    [[ -z $runs ]] && runs=$(grep -oE '^#[0-9]+' "$log" | tail -n 1 | tr -d '#')
    if [[ $status -ne 0 ]]; then
        crashed=1
        artifact=$(sed -n 's/.*Test unit written to //p' "$log" | tail -n 1)
    fi
    local corpus
    corpus=$(find "target/corpus/$target" -type f | wc -l)
    echo "fuzz $target: runs=${runs:-0} crashes=$crashed seconds=$seconds corpus=$corpus${artifact:+ artifact=fuzz/$artifact log=fuzz/$log}"
    return "$crashed"
}

case ${1:-} in
    build)
        case ${2:-all} in
            all) build ;;
            light) build --no-default-features ;;
            *) echo "usage: fuzz.sh build [all|light]" >&2; exit 2 ;;
        esac
        ;;
    run)
        seconds=${2:?usage: fuzz.sh run SECONDS [all|light|TARGET...]}
        shift 2
        targets=("${ALL[@]}")
        case ${1:-all} in
            all) ;;
            light) targets=("${LIGHT[@]}") ;;
            *) targets=("$@") ;;
        esac
        failed=0
        for target in "${targets[@]}"; do
            run_one "$target" "$seconds" || failed=1
        done
        exit "$failed"
        ;;
    *)
        echo "usage: fuzz.sh build [all|light] | run SECONDS [all|light|TARGET...]" >&2
        exit 2
        ;;
esac
