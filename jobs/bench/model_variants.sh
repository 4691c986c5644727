#!/bin/bash
# What nnU-Net's model variants cost per training step (docs/engine.md):
# `tessera bench step` of configs/unet3d-small.ini with instance norm and
# leaky ReLU at PATCH^3 (default 64), batch 2, one rank, one thread, for
#   plain   model.arch = unet
#   ds      model.deep_supervision = true
#   resenc  model.arch = resenc, model.res_blocks = RES (default 1,3,4,6:
#           nnU-Net ResEnc M's first four levels)
# in ROUNDS (default 3) alternated rounds (the order rotates every round);
# prints the process CPU time per step of each run, the medians and the
# ratios to plain (single-thread CPU time: the figure a loaded machine
# changes least), the parameter counts, and the load before and after.
#   jobs/bench/model_variants.sh [ROUNDS]
# TESSERA (default build/tessera), PATCH, RES, BSTEPS (timed steps, 3), WARMUP (1).
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
tessera=${TESSERA:-$here/build/tessera}
rounds=${1:-3}
patch=${PATCH:-64}
res=${RES:-1,3,4,6}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
[ -x "$tessera" ] || { echo "model_variants.sh: no tessera binary at $tessera (set TESSERA=...)" >&2; exit 1; }
cfg=$here/configs/unet3d-small.ini
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) cores)"
bench() { # bench NAME ROUND KEY=VALUE...
    local name=$1 r=$2
    shift 2
    OMP_NUM_THREADS=1 mpiexec.mpich -n 1 "$tessera" bench step "$cfg" data.patch="$patch" train.batch=2 \
        model.norm=instance model.act=leaky_relu "$@" --steps "${BSTEPS:-3}" --warmup "${WARMUP:-1}" \
        --json "$tmp/$name.$r.json" >"$tmp/$name.$r.log"
}
variants=(plain ds resenc)
run_variant() {
    case $1 in
    plain) bench plain "$2" model.arch=unet ;;
    ds) bench ds "$2" model.deep_supervision=true ;;
    resenc) bench resenc "$2" model.arch=resenc model.res_blocks="$res" ;;
    esac
}
for r in $(seq 1 "$rounds"); do
    for k in 0 1 2; do run_variant "${variants[$(((k + r) % 3))]}" "$r"; done
    echo "round $r done" >&2
done
for v in plain ds resenc; do
    case $v in
    plain) a="model.arch=unet" ;;
    ds) a="model.deep_supervision=true" ;;
    resenc) a="model.arch=resenc model.res_blocks=$res" ;;
    esac
    # shellcheck disable=SC2086
    "$tessera" model init "$cfg" model.norm=instance $a --out "$tmp/$v.h5" >/dev/null 2>&1
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
/usr/bin/python3 - "$tmp" "$rounds" "$patch" "$res" <<'PY'
import json, statistics, sys
import h5py, numpy as np
d, rounds, patch, res = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
names = ("plain", "ds", "resenc")
j = {v: [json.load(open(f"{d}/{v}.{r}.json")) for r in range(1, rounds + 1)] for v in names}
params = {}
for v in names:
    with h5py.File(f"{d}/{v}.h5", "r") as f:
        params[v] = sum(int(np.prod(f["params"][k].shape)) for k in f["params"]
                        if not k.endswith(("running_mean", "running_var", "num_batches_tracked")))
print(f"configs/unet3d-small.ini, instance norm + leaky ReLU, patch {patch}^3, batch 2, 1 thread, resenc blocks {res}")
print("| variant | parameters | CPU ms/step per round | median | ratio to plain |")
print("| --- | ---: | --- | ---: | ---: |")
base = statistics.median(x["cpu_ms"] for x in j["plain"])
for v in names:
    m = statistics.median(x["cpu_ms"] for x in j[v])
    print(f"| {v} | {params[v]} | {', '.join('%.0f' % x['cpu_ms'] for x in j[v])} | {m:.0f} | {m / base:.2f} |")
PY
