#!/bin/sh
# The tessera command's collectives side: info, bench coll on 3 ranks with
# every listed algorithm and --check (issue [1] acceptance 4), JSON keys,
# --tune round trip, and bad input (errors on every rank, no hang).
. "$TS_SRCDIR/tests/cli/tap.sh"
export TESSERA_EXIT_GRACE=20

out="$tmpdir/info.txt"
ts_mpirun 2 "$TESSERA" info >"$out" 2>&1
ok $? "tessera info runs on 2 ranks"
grep -q "ranks per node:   2" "$out" && grep -q "MPICH" "$out"
ok $? "info shows ranks per node and the MPI library"
TESSERA_RANKS_PER_NODE=1 ts_mpirun 2 "$TESSERA" info >"$out" 2>&1
grep -q "nodes:            2 (faked" "$out"
ok $? "TESSERA_RANKS_PER_NODE fakes nodes"

ts_mpirun 3 "$TESSERA" bench coll --algo ring,tree,recursive_doubling,rabenseifner,shm,hierarchical,mpi --check \
    --max-bytes 4M --repeat 1 --time-ms 2 --json "$tmpdir/b.json" >"$tmpdir/bench.txt" 2>&1
ok $? "bench coll on 3 ranks, 7 algorithms, --check: exit 0"
rows=$(grep -cE '^ +[0-9]+ +[a-z_]+ ' "$tmpdir/bench.txt")
bad=$(awk '/^ +[0-9]+ +[a-z_]+ / && $6 != 0' "$tmpdir/bench.txt" | wc -l)
[ "$rows" -eq 77 ] && [ "$bad" -eq 0 ]
ok $? "77 rows (11 sizes 8 B..4 MiB x 7 algorithms), none wrong ($rows rows, $bad wrong)"
"${TS_PYTHON:-/usr/bin/python3}" - "$tmpdir/b.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
keys = {"op", "algo", "ranks", "bytes", "time_us", "algbw_GBps", "busbw_GBps", "wrong"}
assert len(d) == 77 and all(keys <= set(e) for e in d)
e = [x for x in d if x["algo"] == "ring" and x["bytes"] == 4 << 20][0]
assert e["ranks"] == 3 and e["wrong"] == 0
assert abs(e["busbw_GBps"] - e["algbw_GBps"] * 2 * 2 / 3) < 1e-9 * max(1, e["busbw_GBps"])
PY
ok $? "JSON has the keys tessera bench coll --json writes and busbw = algbw*2(p-1)/p"

for op in reduce_scatter allgather bcast; do
    ts_mpirun 3 "$TESSERA" bench coll --op $op --check --max-bytes 1M --repeat 1 --time-ms 2 >"$tmpdir/$op.txt" 2>&1
    ok $? "bench coll --op $op --check on 3 ranks"
done

ts_mpirun 2 "$TESSERA" bench coll --algo shm,mpi --max-bytes 64K --repeat 1 --time-ms 2 --tune "$tmpdir/t.json" >"$out" 2>&1
ok $? "bench coll --tune writes a table"
TESSERA_COLL_TUNING="$tmpdir/t.json" ts_mpirun 2 "$TESSERA" info >"$out" 2>&1
grep -q "by tuning" "$out"
ok $? "the tuning table is used by the automatic choice"
echo '{"entries": [{"op": "allreduce", "ranks": 2, "nodes": 1, "max_bytes": 10, "algo": "warp"}]}' >"$tmpdir/bad.json"
TESSERA_COLL_TUNING="$tmpdir/bad.json" ts_mpirun 2 "$TESSERA" info >"$out" 2>&1
st=$?
[ $st -ne 0 ] && [ "$(grep -c "error (rank .*bad.json: entry 0: unknown allreduce algorithm 'warp'" "$out")" -eq 2 ]
ok $? "a bad tuning table: error naming file and entry on both ranks"

# bad input: every rank reports, the job ends
ts_mpirun 2 "$TESSERA" bench coll --algo ring,nope >"$out" 2>&1
st=$?
[ $st -ne 0 ] && [ "$(grep -c "error (rank [01]).*unknown allreduce algorithm 'nope'" "$out")" -eq 2 ]
ok $? "unknown algorithm in --algo: error on both ranks"
TESSERA_COLL_ALLREDUCE=bogus ts_mpirun 2 "$TESSERA" info >"$out" 2>&1
st=$?
[ $st -ne 0 ] && [ "$(grep -c "error (rank [01]).*unknown allreduce algorithm 'bogus'" "$out")" -eq 2 ]
ok $? "unknown forced algorithm (TESSERA_COLL_ALLREDUCE): error on both ranks"
TESSERA_RANKS_PER_NODE=2 TESSERA_COLL_ALLREDUCE=hierarchical ts_mpirun 3 "$TESSERA" bench coll --algo auto --max-bytes 64 >"$out" 2>&1
st=$?
[ $st -ne 0 ] && [ "$(grep -c "error (rank [012]).*'hierarchical' (forced) cannot serve this call: it needs the same number of ranks on every node" "$out")" -eq 3 ]
ok $? "forced algorithm that cannot serve the call: error on all 3 ranks"
ts_mpirun 2 "$TESSERA" bench coll --dtype uint8 --algo ring --max-bytes 64 >"$out" 2>&1
st=$?
[ $st -ne 0 ] && [ "$(grep -c "error (rank [01]).*uint8 cannot be reduced" "$out")" -eq 2 ]
ok $? "unsupported dtype for a forced algorithm: error on both ranks"
ts_mpirun 2 "$TESSERA" frobnicate >"$out" 2>&1
st=$?
[ $st -ne 0 ] && [ "$(grep -c "error (rank [01]).*unknown command 'frobnicate'" "$out")" -eq 2 ]
ok $? "an unknown command: error on both ranks"
ts_mpirun 1 "$TESSERA" --help >"$out" 2>&1 && grep -q "not available yet in this version" "$out"
ok $? "--help lists what is not available yet"
done_testing
