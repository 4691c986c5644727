#!/bin/bash
# Strong scaling of spatial parallelism: `tessera bench step` on one sample's
# volume with sp = 1 (1 rank) and sp = N (N ranks sharing every sample,
# parallel.sp_dims auto), same global batch, 1 OpenMP thread per rank,
# alternated ROUNDS times in one run; prints per round samples/s, the ratio,
# the halo exchange (exposed / hidden) and the spatial sums, then the
# medians (issue [5]: sp = 2 >= 1.7x sp = 1 at 128^3).
#   jobs/bench/sp_scaling.sh [CONFIG] [ROUNDS] [N] [key=value ...]
# default CONFIG: configs/unet3d-small.ini at data.patch=128, train.batch=1
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
tessera=${TESSERA:-$here/build/tessera}
cfg=${1:-$here/configs/unet3d-small.ini}
rounds=${2:-3}
n=${3:-2}
shift $(( $# >= 3 ? 3 : $# )) || true
[ $# -eq 0 ] && set -- data.patch=128 train.batch=1
steps=${STEPS:-2}
warmup=${WARMUP:-1}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1
for r in $(seq 1 "$rounds"); do
    mpiexec.mpich -n 1 "$tessera" bench step "$cfg" --steps "$steps" --warmup "$warmup" --json "$tmp/one.$r.json" "$@" >/dev/null
    mpiexec.mpich -n "$n" "$tessera" bench step "$cfg" --steps "$steps" --warmup "$warmup" --json "$tmp/sp.$r.json" \
        parallel.sp="$n" "$@" >/dev/null
    echo "round $r done" >&2
done
/usr/bin/python3 - "$tmp" "$rounds" "$n" <<'PY'
import json, statistics, sys
d, rounds, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
one = [json.load(open(f"{d}/one.{r}.json")) for r in range(1, rounds + 1)]
sp = [json.load(open(f"{d}/sp.{r}.json")) for r in range(1, rounds + 1)]
b = sp[0]
print(f"patch {'x'.join(str(x) for x in b['patch'])}, batch {b['batch']}, sp {n} as {'x'.join(str(x) for x in b['sp_dims'])} "
      f"(box {'x'.join(str(x) for x in b['box'])}), {b['threads']} thread per rank")
print(f"| round | sp=1 samples/s | sp={n} samples/s | ratio | halo exposed / hidden ms | spatial sums ms | "
      f"act+grad MiB per rank sp=1 / sp={n} |")
print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for r, (a, b) in enumerate(zip(one, sp), 1):
    print(f"| {r} | {a['samples_per_s']:.4f} | {b['samples_per_s']:.4f} | {b['samples_per_s'] / a['samples_per_s']:.2f} | "
          f"{b['halo_exposed_ms']:.1f} / {b['halo_hidden_ms']:.1f} | {b['spatial_sums_ms']:.1f} | "
          f"{a['act_bytes'] / 2**20:.0f} / {b['act_bytes'] / 2**20:.0f} |")
m1 = statistics.median(x["samples_per_s"] for x in one)
mn = statistics.median(x["samples_per_s"] for x in sp)
print(f"\nmedian: sp=1 {m1:.4f} samples/s, sp={n} {mn:.4f} samples/s, ratio {mn / m1:.2f}")
PY
