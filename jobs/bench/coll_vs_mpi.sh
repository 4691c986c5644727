#!/bin/bash
# Side-by-side allreduce benchmark: tessera's automatic choice against
# MPICH's MPI_Allreduce (the `mpi` algorithm) in one `bench coll` run, so
# the ratio is fair on a noisy machine. Prints the table that
# docs/performance.md quotes and the worst and 64 MiB ratios.
#   jobs/bench/coll_vs_mpi.sh [RANKS] [REPEAT] [extra bench options...]
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
tessera=${TESSERA:-$here/build/tessera}
np=${1:-2}
rep=${2:-9}
shift $(( $# >= 2 ? 2 : $# )) || true
out=$(mktemp)
trap 'rm -f "$out"' EXIT
mpiexec.mpich -n "$np" "$tessera" bench coll --algo auto,mpi --min-bytes 8 --max-bytes 64M \
    --repeat "$rep" --json "$out" "$@"
/usr/bin/python3 - "$out" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
by = {}
for e in d:
    by.setdefault(e["bytes"], {})[e["algo"]] = e
print("\n| bytes | auto algbw GB/s | mpi algbw GB/s | auto / mpi |")
print("| ---: | ---: | ---: | ---: |")
worst = None
for b in sorted(by):
    a, m = by[b]["auto"], by[b]["mpi"]
    r = m["time_us"] / a["time_us"]
    worst = r if worst is None else min(worst, r)
    print(f"| {b} | {a['algbw_GBps']:.3f} | {m['algbw_GBps']:.3f} | {r:.2f} |")
big = max(by)
print(f"\nworst auto/mpi ratio: {worst:.2f}; at {big} bytes: {by[big]['mpi']['time_us'] / by[big]['auto']['time_us']:.2f}")
PY
