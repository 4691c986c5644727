#!/bin/bash
# Weak scaling of data-parallel training steps: `tessera bench step` on 1
# rank and on N ranks (same per-rank batch, 1 OpenMP thread per rank),
# alternated ROUNDS times in one run; prints the medians and the ratio
# (issue [4]: 2 ranks >= 1.8x 1 rank, goal 1.9x).
#   jobs/bench/dp_scaling.sh [CONFIG] [ROUNDS] [N] [key=value ...]
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
tessera=${TESSERA:-$here/build/tessera}
cfg=${1:-$here/configs/unet3d-small.ini}
rounds=${2:-3}
n=${3:-2}
shift $(( $# >= 3 ? 3 : $# )) || true
steps=${STEPS:-4}
warmup=${WARMUP:-1}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1
for r in $(seq 1 "$rounds"); do
    mpiexec.mpich -n 1 "$tessera" bench step "$cfg" --steps "$steps" --warmup "$warmup" --json "$tmp/one.$r.json" "$@" >/dev/null
    mpiexec.mpich -n "$n" "$tessera" bench step "$cfg" --steps "$steps" --warmup "$warmup" --json "$tmp/many.$r.json" "$@" >/dev/null
    echo "round $r done" >&2
done
/usr/bin/python3 - "$tmp" "$rounds" "$n" <<'PY'
import json, statistics, sys
d, rounds, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
one = [json.load(open(f"{d}/one.{r}.json")) for r in range(1, rounds + 1)]
many = [json.load(open(f"{d}/many.{r}.json")) for r in range(1, rounds + 1)]
print("| round | 1 rank samples/s | %d ranks samples/s | ratio | %d-rank comm exposed / total ms per step |" % (n, n))
print("| ---: | ---: | ---: | ---: | ---: |")
for r, (a, b) in enumerate(zip(one, many), 1):
    print(f"| {r} | {a['samples_per_s']:.3f} | {b['samples_per_s']:.3f} | {b['samples_per_s'] / a['samples_per_s']:.2f} | "
          f"{b['comm_exposed_ms']:.1f} / {b['comm_total_ms']:.1f} |")
m1 = statistics.median(x["samples_per_s"] for x in one)
mn = statistics.median(x["samples_per_s"] for x in many)
print(f"\nmedian: 1 rank {m1:.3f} samples/s, {n} ranks {mn:.3f} samples/s, ratio {mn / m1:.2f}")
PY
