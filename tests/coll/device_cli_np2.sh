#!/bin/sh
# `tessera bench coll --device gpu` where no GPU can be used (a build
# without CUDA, or no GPU visible): a clear error on every rank and a
# non-zero exit, not a hang or a crash. Skipped where a GPU is visible:
# device_*.sh test the GPU paths there.
. "$TS_SRCDIR/tests/cli/tap.sh"
export TESSERA_EXIT_GRACE=20

ts_mpirun 1 "$TESSERA" info >"$tmpdir/info.txt" 2>&1
if grep -q "^GPU 0:" "$tmpdir/info.txt"; then
    echo "1..0 # SKIP a GPU is visible here"
    exit 0
fi
for algo in "" "--algo hierarchical" "--algo auto"; do
    # shellcheck disable=SC2086 # $algo is two words or none
    ts_mpirun 2 "$TESSERA" bench coll --device gpu --check $algo --max-bytes 64 --repeat 1 --time-ms 1 \
        >"$tmpdir/out.txt" 2>&1
    st=$?
    n=$(grep -cE "error \(rank [01]\).*(no GPU visible to this rank|this build has no CUDA)" "$tmpdir/out.txt")
    [ "$st" -ne 0 ] && [ "$st" -ne 124 ] && [ "$st" -ne 137 ] && [ "$n" -eq 2 ]
    ok $? "bench coll --device gpu ${algo:-(every GPU algorithm)} without a GPU: exit $st, the reason on $n of 2 ranks"
done
TESSERA_RANKS_PER_NODE=1 ts_mpirun 2 "$TESSERA" bench coll --device gpu --max-bytes 64 --repeat 1 --time-ms 1 \
    >"$tmpdir/out.txt" 2>&1
st=$?
n=$(grep -cE "error \(rank [01]\).*(no GPU visible to this rank|this build has no CUDA)" "$tmpdir/out.txt")
[ "$st" -ne 0 ] && [ "$st" -ne 124 ] && [ "$st" -ne 137 ] && [ "$n" -eq 2 ]
ok $? "... on 2 faked nodes (TESSERA_RANKS_PER_NODE=1): exit $st, the reason on $n of 2 ranks"
done_testing
