#!/bin/sh
# Is the loader fast enough for training? Runs `tessera bench step CONFIG`
# (what one training process consumes, samples/s) and `tessera bench io`
# with the same [data] and [train] sections on a synthetic dataset of 64
# samples of 64^3 (the loader: patches, augmentation, prefetch thread), first
# one after the other, then the loader again while bench step computes on the
# same cores; prints the samples/s of each and the ratios (goal: >= 5).
#   jobs/bench/loader_vs_step.sh [CONFIG] [LOADER_STEPS]
# Environment: TESSERA (default build/tessera), DIR (scratch, default a
# temporary folder), MPIEXEC (default mpiexec.mpich).
set -eu
here=$(cd "$(dirname "$0")/../.." && pwd)
tessera=${TESSERA:-$here/build/tessera}
cfg=${1:-$here/configs/unet3d-small.ini}
steps=${2:-200}
mpiexec=${MPIEXEC:-mpiexec.mpich}
if [ -n "${DIR:-}" ]; then
    dir=$DIR
    mkdir -p "$dir"
else
    dir=$(mktemp -d "${TMPDIR:-/tmp}/ts-io-step.XXXXXX")
    trap 'rm -rf "$dir"' EXIT
fi
data=$dir/synth64.h5
[ -f "$data" ] || "$mpiexec" -n 1 "$tessera" synth --out "$data" --count 64 --size 64 --seed 1
num() { tr -d ' \t\n' < "$1" | sed "s/.*\"$2\":\([0-9.e+-]*\).*/\1/"; }

"$mpiexec" -n 1 "$tessera" bench step "$cfg" --json "$dir/step.json" > "$dir/step.out"
cat "$dir/step.out"
"$mpiexec" -n 1 "$tessera" bench io "$cfg" "data.path=$data" --steps "$steps" --json "$dir/io.json" > "$dir/io.out"
cat "$dir/io.out"
# the loader again, while a training step computes on the same cores
"$mpiexec" -n 1 "$tessera" bench step "$cfg" --steps 3 --warmup 0 > /dev/null 2>&1 &
bg=$!
sleep 5
"$mpiexec" -n 1 "$tessera" bench io "$cfg" "data.path=$data" --steps "$steps" --json "$dir/io_busy.json" > "$dir/io_busy.out"
wait "$bg" || true
step=$(num "$dir/step.json" samples_per_s)
io=$(num "$dir/io.json" samples_per_s)
busy=$(num "$dir/io_busy.json" samples_per_s)
awk -v s="$step" -v i="$io" -v b="$busy" 'BEGIN {
    printf "bench step consumes %.3f samples/s\n", s
    printf "loader alone      %.1f samples/s = %.0fx\n", i, i / s
    printf "loader with bench step running on the same cores: %.1f samples/s = %.0fx\n", b, b / s }'
