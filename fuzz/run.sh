#!/usr/bin/env bash
# Runs kvtier's fuzz targets with cargo-fuzz (libFuzzer) on the stable toolchain.
#
#   fuzz/run.sh [-t SECONDS] [-j JOBS] [--smoke] [--no-cmin] [TARGET...]
#
#   -t SECONDS  time budget per target (default 600)
#   -j JOBS     targets run at once (default 1; each uses one core)
#   --smoke     CI mode: fuzz a throwaway copy of fuzz/seeds/<target> (nothing is kept) and
#               skip minimisation; .ci/run uses `--smoke -t 20 -j 2`
#   --no-cmin   keep the corpus as it grew (long runs minimise it with `cargo fuzz cmin`)
#   TARGET...   targets to run (default: all of `cargo fuzz list`)
#
# Long runs grow fuzz/corpus/<target> (git-ignored) from fuzz/seeds/<target>, then minimise it.
# Each target's libFuzzer log goes to fuzz/artifacts/logs/<target>.log (git-ignored), and a
# summary table (executions, cov, ft, corpus) is printed at the end. Any crash, panic, timeout
# (-timeout=10 per input) or out-of-memory fails the script, after printing the reproducer's
# path and bytes (hex); replay one with `RUSTC_BOOTSTRAP=1 cargo fuzz run <target> <path>`.
set -euo pipefail
cd "$(dirname "$0")"

secs=600
jobs=1
smoke=0
cmin=1
targets=()
while [ $# -gt 0 ]; do
    case "$1" in
        -t) secs="$2"; shift 2 ;;
        -j) jobs="$2"; shift 2 ;;
        --smoke) smoke=1; cmin=0; shift ;;
        --no-cmin) cmin=0; shift ;;
        -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
        *) targets+=("$1"); shift ;;
    esac
done

# cargo-fuzz passes -Z flags (sanitizers, coverage); RUSTC_BOOTSTRAP lets stable accept them.
export RUSTC_BOOTSTRAP="${RUSTC_BOOTSTRAP:-1}"
if [ ${#targets[@]} -eq 0 ]; then
    mapfile -t targets < <(cargo fuzz list)
fi

echo "building ${#targets[@]} fuzz targets"
cargo fuzz build

mkdir -p artifacts/logs
work=""
if [ "$smoke" = 1 ]; then
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' EXIT
fi

# One target: fuzz for $secs from its seeds; returns libFuzzer's exit status.
fuzz_one() {
    local t="$1" corpus
    if [ "$smoke" = 1 ]; then
        corpus="$work/$t"
        mkdir -p "$corpus"
        cp -r "seeds/$t/." "$corpus/" 2>/dev/null || true
        set -- "$corpus"
    else
        corpus="corpus/$t"
        mkdir -p "$corpus"
        set -- "$corpus" "seeds/$t"
    fi
    cargo fuzz run "$t" "$@" -- -max_total_time="$secs" -timeout=10 -print_final_stats=1 \
        >"artifacts/logs/$t.log" 2>&1
}

# Prints the reproducer of a failed target: its path, its bytes in hex, the panic message.
report_crash() {
    local t="$1" path
    echo "!! $t FAILED (log: fuzz/artifacts/logs/$t.log)"
    grep -E "panicked at|^thread '|ERROR: libFuzzer|SUMMARY" "artifacts/logs/$t.log" | head -5 || true
    path="$(sed -n 's/.*Test unit written to \(\S*\).*/\1/p' "artifacts/logs/$t.log" | tail -1)"
    if [ -n "$path" ] && [ -f "$path" ]; then
        case "$path" in /*) ;; *) path="$PWD/$path" ;; esac
        echo "reproducer: $path ($(wc -c <"$path") bytes)"
        echo "hex: $(od -An -v -tx1 "$path" | tr -d ' \n')"
        echo "replay: RUSTC_BOOTSTRAP=1 cargo fuzz run $t $path"
    else
        tail -20 "artifacts/logs/$t.log"
    fi
}

failed=()
pids=()
names=()
wait_one() {
    local pid="${pids[0]}" t="${names[0]}"
    pids=("${pids[@]:1}")
    names=("${names[@]:1}")
    if wait "$pid"; then
        echo "ok  $t"
    else
        report_crash "$t"
        failed+=("$t")
    fi
}
for t in "${targets[@]}"; do
    echo "fuzzing $t for ${secs} s"
    fuzz_one "$t" &
    pids+=($!)
    names+=("$t")
    if [ ${#pids[@]} -ge "$jobs" ]; then
        wait_one
    fi
done
while [ ${#pids[@]} -gt 0 ]; do
    wait_one
done

if [ "$cmin" = 1 ]; then
    for t in "${targets[@]}"; do
        cargo fuzz cmin "$t" "corpus/$t" >"artifacts/logs/$t.cmin.log" 2>&1 || echo "cmin of $t failed (see fuzz/artifacts/logs/$t.cmin.log)"
    done
fi

printf '\n%-20s %14s %8s %8s %8s\n' target executions cov ft corpus
for t in "${targets[@]}"; do
    log="artifacts/logs/$t.log"
    execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)"
    last="$(grep -E '(DONE|pulse|NEW|REDUCE) +cov:' "$log" | tail -1)"
    cov="$(sed -n 's/.*cov: \([0-9]*\).*/\1/p' <<<"$last")"
    ft="$(sed -n 's/.*ft: \([0-9]*\).*/\1/p' <<<"$last")"
    if [ "$smoke" = 1 ]; then
        n="-"
    else
        n="$(find "corpus/$t" -type f | wc -l)"
    fi
    printf '%-20s %14s %8s %8s %8s\n' "$t" "${execs:--}" "${cov:--}" "${ft:--}" "$n"
done

if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzzing failed: ${failed[*]}"
    exit 1
fi
echo "fuzzing clean: ${#targets[@]} targets, ${secs} s each"
