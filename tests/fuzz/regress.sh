#!/bin/sh
# make check: every fuzz target (tests/fuzz/fuzz_*.c) replays its seed corpus
# (tests/fuzz/corpus/<target>/) and every crasher found so far
# (tests/fuzz/regressions/<target>/) through the normal build. A crash or a
# failed property aborts the replay, which is a failure here.
. "$TS_SRCDIR/tests/mpi/lib.sh"
n=0
bad=0
for t in config nifti dataset json; do
    n=$((n + 1))
    out=$(timeout -k 10 "${TS_TEST_TIMEOUT:-300}" "$TS_BUILDDIR/tests/fuzz/replay_$t" \
        "$TS_SRCDIR/tests/fuzz/regressions/$t" "$TS_SRCDIR/tests/fuzz/corpus/$t" 2>&1)
    rc=$?
    printf '%s\n' "$out" | sed 's/^/# /' | tail -40
    runs=$(printf '%s\n' "$out" | grep -c '^ok ')
    plan=$(printf '%s\n' "$out" | sed -n 's/^1\.\.\([0-9]*\)$/\1/p' | head -1)
    if [ $rc -eq 0 ] && [ -n "$plan" ] && [ "$runs" -eq "$plan" ] && [ "$plan" -gt 0 ]; then
        echo "ok $n - fuzz_$t: $runs committed inputs (regressions and seeds) replayed without a crash"
    else
        echo "not ok $n - fuzz_$t: replay failed (exit $rc, $runs of ${plan:-?} inputs passed)"
        bad=1
    fi
done
echo "1..$n"
exit $bad
