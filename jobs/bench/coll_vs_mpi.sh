#!/bin/bash
# Side-by-side allreduce benchmark: tessera's automatic choice against
# MPICH's MPI_Allreduce (the `mpi` algorithm) in one `bench coll` run per
# buffer kind, so the ratio is fair on a noisy machine; RUNS runs of each
# kind, alternating: plain buffers (malloc'ed, what a user's own array is)
# and --registered buffers (in tessera's shared window: no copy in or out).
# Prints, per size, the ratio auto / mpi (mpi time over auto time) as the
# median and the range over the runs, for each kind, and the worst median
# and the 64 MiB medians.
#   jobs/bench/coll_vs_mpi.sh [RANKS] [REPEAT] [extra bench options...]   (RUNS, default 3)
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
tessera=${TESSERA:-$here/build/tessera}
np=${1:-2}
rep=${2:-9}
runs=${RUNS:-3}
shift $(( $# >= 2 ? 2 : $# )) || true
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "$np ranks, $runs runs of each buffer kind, $rep repetitions per size; load $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq 1 "$runs"); do
    for kind in plain registered; do
        opt=()
        [ "$kind" = registered ] && opt=(--registered)
        mpiexec.mpich -n "$np" "$tessera" bench coll --algo auto,mpi --min-bytes 8 --max-bytes 64M \
            --repeat "$rep" --json "$out/$kind.$r.json" "${opt[@]}" "$@" >/dev/null
    done
done
/usr/bin/python3 - "$out" "$runs" <<'PY'
import json, statistics, sys
out, runs = sys.argv[1], int(sys.argv[2])
ratio = {}  # kind -> bytes -> [ratios]
mpibw = {}
for kind in ("plain", "registered"):
    for r in range(1, runs + 1):
        by = {}
        for e in json.load(open(f"{out}/{kind}.{r}.json")):
            by.setdefault(e["bytes"], {})[e["algo"]] = e
        for b, d in by.items():
            ratio.setdefault(kind, {}).setdefault(b, []).append(d["mpi"]["time_us"] / d["auto"]["time_us"])
            mpibw.setdefault(kind, {}).setdefault(b, []).append(d["mpi"]["algbw_GBps"])
def cell(v):
    return f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})"
print("\n| bytes | plain: auto / mpi, median (range) | registered: auto / mpi, median (range) | mpi algbw GB/s, median |")
print("| ---: | ---: | ---: | ---: |")
for b in sorted(ratio["plain"]):
    print(f"| {b} | {cell(ratio['plain'][b])} | {cell(ratio['registered'][b])} | {statistics.median(mpibw['plain'][b]):.3f} |")
big = max(ratio["plain"])
for kind in ("plain", "registered"):
    med = {b: statistics.median(v) for b, v in ratio[kind].items()}
    w = min(med, key=med.get)
    print(f"{kind}: worst median auto/mpi {med[w]:.2f} at {w} bytes; at {big} bytes median {med[big]:.2f} "
          f"(range {min(ratio[kind][big]):.2f}-{max(ratio[kind][big]):.2f} over {runs} runs)")
PY
