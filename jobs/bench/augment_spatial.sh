#!/bin/sh
# What the spatial augmentation (rotation, zoom) costs the loader: `tessera
# bench io` on one rank, loader in the caller's thread (data.prefetch = 0,
# one OpenMP thread), alternating rounds of three settings on the same
# dataset: spatial off (data.rot_p = data.zoom_p = 0), the defaults (0.2 and
# 0.2: 36 % of patches transformed), on for every patch (1 and 1), and on
# for every patch with nnU-Net's interpolation orders (data.aug_image =
# cubic, data.aug_label = linear); prints samples/s per round, then the
# medians and their ratios to "off".
# The loader runs on its own thread during training, so what matters is
# that it stays well above a training step's samples/s
# (jobs/bench/loader_vs_step.sh).
#   jobs/bench/augment_spatial.sh [CONFIG] [ROUNDS] [STEPS]   (default configs/demo.ini, 3, 20)
# Environment: TESSERA (default build/tessera), DIR (scratch, default a
# temporary folder), MPIEXEC (default mpiexec.mpich).
set -eu
here=$(cd "$(dirname "$0")/../.." && pwd)
tessera=${TESSERA:-$here/build/tessera}
cfg=${1:-$here/configs/demo.ini}
rounds=${2:-3}
steps=${3:-20}
mpiexec=${MPIEXEC:-mpiexec.mpich}
export OMP_NUM_THREADS=1
if [ -n "${DIR:-}" ]; then
    dir=$DIR
    mkdir -p "$dir"
else
    dir=$(mktemp -d "${TMPDIR:-/tmp}/ts-aug.XXXXXX")
    trap 'rm -rf "$dir"' EXIT
fi
data=$dir/synth96.h5
[ -f "$data" ] || "$mpiexec" -n 1 "$tessera" synth --out "$data" --count 8 --size 96,112,96 --seed 1 > /dev/null
num() { tr -d ' \t\n' < "$1" | sed "s/.*\"$2\":\([0-9.e+-]*\).*/\1/"; }
run() { # NAME KEYS...: one bench io run, samples/s appended to $dir/NAME
    n=$1; shift
    "$mpiexec" -n 1 "$tessera" bench io "$cfg" "data.path=$data" data.prefetch=0 --repeat 1 --steps "$steps" \
        --warmup 2 --json "$dir/$n.json" "$@" > /dev/null
    echo "$(num "$dir/$n.json" samples_per_s)" >> "$dir/$n"
}
echo "uptime: $(uptime)"
rm -f "$dir/off" "$dir/default" "$dir/all" "$dir/cubic"
r=1
while [ "$r" -le "$rounds" ]; do
    run off data.rot_p=0 data.zoom_p=0
    run default
    run all data.rot_p=1 data.zoom_p=1
    run cubic data.rot_p=1 data.zoom_p=1 data.aug_image=cubic data.aug_label=linear
    echo "round $r: off $(tail -n 1 "$dir/off"), default $(tail -n 1 "$dir/default"), all $(tail -n 1 "$dir/all")," \
        "all cubic $(tail -n 1 "$dir/cubic") samples/s"
    r=$((r + 1))
done
med() { sort -g "$dir/$1" | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
off=$(med off) def=$(med default) all=$(med all) cub=$(med cubic)
echo "median samples/s: off $off, default $def, all $all, all cubic $cub"
awk -v o="$off" -v d="$def" -v a="$all" -v c="$cub" \
    'BEGIN { printf "ratio to off: default %.2f, all %.2f, all cubic %.2f\n", d / o, a / o, c / o }'
echo "uptime: $(uptime)"
