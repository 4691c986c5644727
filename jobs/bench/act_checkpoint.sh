#!/bin/bash
# Activation checkpointing (model.checkpoint_levels; issue [9] acceptance 2):
# `tessera bench step --compare-checkpoint` on configs/unet3d-small.ini
# (4 levels, 16,32,64,128 channels, batch norm, batch 2, 64^3 patches), 1
# rank, without checkpointing (A) and with the two top levels recomputed
# (B: levels 0,1, the 64^3 and 32^3 levels, whose activations dominate),
# alternated rounds B, A, B, A ... in one process: one step of each from the
# same weights first (gradients compared bit for bit), then the timed
# rounds. Prints the machine's load before and after, per variant the
# median step wall and CPU time, the activation bytes (bench's act_bytes,
# as the memory plan predicts them) and the peak RSS, and the ratios B/A
# (of the medians, and the median of the per-round ratios).
#   jobs/bench/act_checkpoint.sh [ROUNDS] [STEPS] [THREADS] [LEVELS]
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
tessera=${TESSERA:-$here/build/tessera}
rounds=${1:-3}
steps=${2:-3}
threads=${3:-1}
levels=${4:-0,1}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=$threads
echo "load before: $(uptime)"
mpiexec.mpich -n 1 "$tessera" bench step "$here/configs/unet3d-small.ini" --compare-checkpoint "$levels" \
    --rounds "$rounds" --steps "$steps" --warmup 1 --json "$tmp/cmp.json"
echo "load after: $(uptime)"
/usr/bin/python3 - "$tmp/cmp.json" "$threads" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))["checkpoint_compare"]
mib = 1 / 1048576
print(f"OMP_NUM_THREADS={sys.argv[2]}, {c['rounds']} rounds x {c['steps']} timed steps per variant")
print("| model.checkpoint_levels | step (median) | CPU time (median) | activations (act_bytes) | recompute scratch | peak RSS |")
print("| --- | ---: | ---: | ---: | ---: | ---: |")
print(f"| {c['levels_a']} | {c['step_ms_a']:.0f} ms | {c['cpu_ms_a']:.0f} ms | {c['act_bytes_a'] * mib:.1f} MiB | - | {c['peak_rss_mb_a']:.1f} MiB |")
print(f"| {c['levels_b']} | {c['step_ms_b']:.0f} ms | {c['cpu_ms_b']:.0f} ms | {c['act_bytes_b'] * mib:.1f} MiB | "
      f"{c['scratch_bytes_b'] * mib:.1f} MiB | {c['peak_rss_mb_b']:.1f} MiB |")
print(f"| B/A | x{c['step_ratio']:.3f} | x{c['cpu_ratio']:.3f} | {1 - c['act_reduction']:.3f} "
      f"({-100 * c['act_reduction']:+.1f} %) | | {1 - c['rss_reduction']:.3f} ({-100 * c['rss_reduction']:+.1f} %) |")
print(f"median over rounds of each round's B/A: x{c['round_step_ratio']:.3f} wall, x{c['round_cpu_ratio']:.3f} CPU")
print("gradients of one step from the same weights:", "bit-identical" if c["grads_identical"] else "DIFFER")
PY
