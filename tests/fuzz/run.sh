#!/bin/bash
# Builds the libFuzzer targets (`make fuzz`: clang, ASan, UBSan) and runs each
# for SECONDS on its seed corpus (docs/testing.md). Run it in a configured
# build directory:
#   tests/fuzz/run.sh SECONDS [TARGET...]      (../tests/fuzz/run.sh from build/)
# TARGET is config, nifti, dataset or json (default: all four, one after the
# other). The growing corpus is kept in fuzz-build/corpus/<target>/, crashes
# in fuzz-build/findings/<target>/ (add them to tests/fuzz/regressions/<target>/
# once fixed). One summary line per target: executions per second, coverage,
# corpus size. Exit status: 0 when no target found anything, 1 when one did,
# 77 when the targets cannot be built (no clang or libFuzzer; the reason is
# printed), 1 as well when clang with libFuzzer works and the targets do not
# compile (the code's failure, not the machine's).
set -u
secs=${1:?usage: tests/fuzz/run.sh SECONDS [TARGET...]}
shift
targets=${*:-config nifti dataset json}
src=$(cd "$(dirname "$0")/../.." && pwd)
[ -f Makefile ] && grep -q '^fuzz:' Makefile || { echo "run.sh: run it in a configured build directory" >&2; exit 2; }

log=fuzz-build/build.log
mkdir -p fuzz-build
# the tool first: clang linking an empty fuzz target with the sanitizers. Without it the targets
# cannot be built (skipped, 77); with it, targets that do not compile are the code's failure (1)
probe=fuzz-build/probe
printf '#include <stddef.h>\n#include <stdint.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n' >"$probe.c"
if ! clang -fsanitize=fuzzer,address,undefined "$probe.c" -o "$probe" >"$probe.log" 2>&1; then
    echo "fuzz targets cannot be built: no clang with libFuzzer here (clang -fsanitize=fuzzer on an empty target failed):"
    head -3 "$probe.log"
    exit 77
fi
if ! make fuzz >"$log" 2>&1; then
    echo "not ok: the fuzz targets do not compile (clang with libFuzzer works here); log: $log"
    grep -E 'error|undefined reference' "$log" | head -5
    exit 1
fi

export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$src/tests/sanitizers/lsan.supp:print_suppressions=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
found=0
for t in $targets; do
    bin=fuzz-build/fuzz_$t
    [ -x "$bin" ] || { echo "run.sh: no target $t" >&2; exit 2; }
    corpus=fuzz-build/corpus/$t
    findings=fuzz-build/findings/$t
    mkdir -p "$corpus" "$findings"
    dict=()
    [ -f "$src/tests/fuzz/dict/$t.dict" ] && dict=(-dict="$src/tests/fuzz/dict/$t.dict")
    # -malloc_limit_mb: one allocation above 2 GiB is a finding (a header
    # alone must not make a reader allocate what the file does not hold)
    # seed folders that exist (git keeps no empty folder: a target without
    # regressions has none in a fresh clone, and libFuzzer stops on a missing one)
    seeds=()
    for dir in "$src/tests/fuzz/corpus/$t" "$src/tests/fuzz/regressions/$t"; do
        [ -d "$dir" ] && seeds+=("$dir")
    done
    # FUZZ_SEED and FUZZ_RUNS (jobs/check.sh): a fixed seed and a fixed
    # number of inputs, so a run is the same sequence on any machine speed
    fixed=()
    [ -n "${FUZZ_SEED:-}" ] && fixed+=(-seed="$FUZZ_SEED")
    [ -n "${FUZZ_RUNS:-}" ] && fixed+=(-runs="$FUZZ_RUNS")
    nice -n 10 "$bin" "${fixed[@]}" -max_total_time="$secs" -timeout=30 -rss_limit_mb=4096 -malloc_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix="$findings/" "${dict[@]}" \
        "$corpus" "${seeds[@]}" >"fuzz-build/$t.log" 2>&1
    rc=$?
    last=$(grep -E '^#[0-9]+' "fuzz-build/$t.log" | tail -1)
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "fuzz-build/$t.log")
    speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "fuzz-build/$t.log")
    cov=$(printf '%s\n' "$last" | sed -n 's/.* cov: \([0-9]*\).*/\1/p')
    ft=$(printf '%s\n' "$last" | sed -n 's/.* ft: \([0-9]*\).*/\1/p')
    corp=$(printf '%s\n' "$last" | sed -n 's/.* corp: \([0-9]*\/[0-9a-zA-Z]*\).*/\1/p')
    if [ $rc -eq 0 ]; then
        echo "fuzz_$t: ${secs} s, ${runs:-?} inputs, ${speed:-?} exec/s, cov ${cov:-?}, ft ${ft:-?}, corpus ${corp:-?}: no finding"
    else
        found=1
        echo "fuzz_$t: FINDING (exit $rc) after ${runs:-?} inputs; input in $findings/, log fuzz-build/$t.log:"
        grep -E '^(==[0-9]+==ERROR|SUMMARY|FUZZ PROPERTY|.*runtime error)' "fuzz-build/$t.log" | head -5
    fi
done
exit $found
