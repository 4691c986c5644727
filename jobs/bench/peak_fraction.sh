#!/bin/bash
# How close the engine runs to this CPU's measured limits (issue [17];
# docs/performance.md, "The machine's limits"), in one invocation:
#   jobs/bench/peak_fraction.sh [OUT]    (environment: TESSERA, THREADS (default 2), STEPS, WARMUP, NNUNET=0 skips it)
# 1. tessera bench peak: fp32 FMA, bf16 VDPBF16PS, AMX tile and triad limits;
# 2. tessera bench step --peak --profile, 1 rank: the small UNet3D at 64^3
#    batch 2 in fp32 and in bf16, and nnU-Net's 3d_fullres model
#    (configs/nnunet-3d-fullres.ini) at 128^3 batch 1 in fp32 and bf16; the
#    fp32 ones also with train.conv = winograd (FLOP counted as direct
#    ones); where bf16 runs on AMX tiles, the small bf16 step also with
#    TESSERA_BF16_ISA=avx512bf16 (VDPBF16PS alone);
# and prints each step's GFLOP/s (the cost model's FLOP) as a fraction of
# the measured peak of its precision, with the per-kind roofline table, and
# the roofline plot of the steps ($OUT/roofline.png, jobs/scaling/report).
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
tessera=${TESSERA:-$here/build/tessera}
mpiexec=${MPIEXEC:-mpiexec.mpich}
out=${1:-$(mktemp -d /tmp/tessera-peak.XXXXXX)}
mkdir -p "$out" || exit 1
export OMP_NUM_THREADS=${THREADS:-2}
steps=${STEPS:-5}
warm=${WARMUP:-2}
echo "== $(date -u +%H:%M:%S) UTC, $OMP_NUM_THREADS threads, results in $out"
"$mpiexec" -n 1 "$tessera" bench peak --seconds 4 --json "$out/peak.json" || exit 1
step() { # NAME CONFIG ARGS...
    local name=$1 cfg=$2; shift 2
    echo "== $name"
    "$mpiexec" -n 1 "$tessera" bench step "$cfg" "$@" --peak --profile --json "$out/$name.json" || exit 1
}
step small-fp32 "$here/configs/unet3d-small.ini" --steps "$steps" --warmup "$warm"
step small-fp32-winograd "$here/configs/unet3d-small.ini" train.conv=winograd --steps "$steps" --warmup "$warm"
step small-bf16 "$here/configs/unet3d-small.ini" train.precision=bf16 --steps "$steps" --warmup "$warm"
# where the bf16 kernels run on AMX tiles: the same step on VDPBF16PS alone, side by side
amx=$("$here/build/tests/nn/test_layers" isa 2>/dev/null || true)
if [ "$amx" = amx ]; then
    TESSERA_BF16_ISA=avx512bf16 step small-bf16-vdpbf16ps "$here/configs/unet3d-small.ini" train.precision=bf16 --steps "$steps" --warmup "$warm"
fi
if [ "${NNUNET:-1}" != 0 ]; then
    step nnunet-fp32 "$here/configs/nnunet-3d-fullres.ini" train.batch=1 --steps 2 --warmup 1
    step nnunet-fp32-winograd "$here/configs/nnunet-3d-fullres.ini" train.batch=1 train.conv=winograd --steps 2 --warmup 1
    step nnunet-bf16 "$here/configs/nnunet-3d-fullres.ini" train.batch=1 train.precision=bf16 --steps 2 --warmup 1
fi
python3 - "$out" <<'PY'
import json, os, sys
d = sys.argv[1]
for n in ("small-fp32", "small-fp32-winograd", "small-bf16", "small-bf16-vdpbf16ps", "nnunet-fp32", "nnunet-fp32-winograd",
          "nnunet-bf16"):
    p = os.path.join(d, n + ".json")
    if not os.path.exists(p):
        continue
    j = json.load(open(p))
    print(f"{n}: {j['step_ms']:.1f} ms a step, {j['flop_per_step'] / 1e9:.1f} GFLOP, {j['gflops']:.1f} GFLOP/s = "
          f"{j['fraction_of_peak']:.3f} of the measured {j['peak_kind']} peak ({j['peak_gflops']:.1f} GFLOP/s); "
          f"profile sums to {j['profile_sum_over_step']:.3f} of the step")
PY
# the roofline of the steps (jobs/scaling/report --roofline; needs matplotlib)
steps=()
for n in small-fp32 small-fp32-winograd small-bf16 small-bf16-vdpbf16ps nnunet-fp32 nnunet-fp32-winograd nnunet-bf16; do
    [ -f "$out/$n.json" ] && steps+=("$out/$n.json")
done
"$here/jobs/scaling/report" --roofline "${steps[@]}" --out "$out" --title "steps against this CPU's peaks" ||
    echo "(no roofline plot: jobs/scaling/report needs python3-matplotlib)"
