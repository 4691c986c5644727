#!/bin/bash
# Several ranks on one node with OMP_NUM_THREADS unset (docs/scaling.md,
# "Ranks sharing a node"): `tessera bench step` on N ranks (data parallel)
# as tessera launches them by default (each rank bound to its share of the
# CPUs, that many threads), with TESSERA_BIND=none (every rank a thread per
# CPU: the node oversubscribed N times), and with TESSERA_BIND=none and
# OMP_NUM_THREADS = CPUs / N (the threads right, nothing bound), the three
# alternated ROUNDS times in one run; prints samples/s per round and the
# medians' ratios.
#   jobs/bench/bind.sh [CONFIG] [ROUNDS] [N] [key=value ...]
# default CONFIG: configs/unet3d-small.ini at its 64^3, train.batch=2 per rank
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
tessera=${TESSERA:-$here/build/tessera}
mpiexec=${MPIEXEC:-mpiexec.mpich}
cfg=${1:-$here/configs/unet3d-small.ini}
rounds=${2:-3}
n=${3:-2}
shift $(( $# >= 3 ? 3 : $# )) || true
steps=${STEPS:-4}
warmup=${WARMUP:-1}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
unset OMP_NUM_THREADS
cpus=$(nproc)
per=$(( cpus / n > 0 ? cpus / n : 1 ))
run() { # MODE ROUND ENV...
    local m=$1 r=$2
    shift 2
    env "$@" "$mpiexec" -n "$n" "$tessera" bench step "$cfg" --steps "$steps" --warmup "$warmup" \
        --json "$tmp/$m.$r.json" "${args[@]}" >/dev/null
}
args=("$@")
for r in $(seq 1 "$rounds"); do
    run auto "$r" X=1
    run oversub "$r" TESSERA_BIND=none
    run threads "$r" TESSERA_BIND=none OMP_NUM_THREADS=$per
    echo "round $r done" >&2
done
/usr/bin/python3 - "$tmp" "$rounds" "$n" "$cpus" <<'PY'
import json, statistics, sys
d, rounds, n, cpus = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
modes = {"auto": "default (bound shares)", "oversub": "TESSERA_BIND=none", "threads": "TESSERA_BIND=none, OMP_NUM_THREADS=%d" % max(1, cpus // n)}
med = {}
for m, name in modes.items():
    v = [json.load(open("%s/%s.%d.json" % (d, m, r))) for r in range(1, rounds + 1)]
    s = [x["samples_per_s"] for x in v]
    med[m] = statistics.median(s)
    print("%-40s samples/s %s  median %.3f  (%d threads per rank)" % (name, " ".join("%.3f" % x for x in s), med[m], v[0]["threads"]))
print("%d ranks on %d CPUs: default / oversubscribed %.2fx, default / threads set unbound %.2fx"
      % (n, cpus, med["auto"] / med["oversub"], med["auto"] / med["threads"]))
PY
