#!/bin/bash
# The main job of the README, on a fresh Debian 12 machine as root:
# installs what is missing, builds tessera, converts the Colin27 T1 MRI and
# the AAL atlas (Debian's mricron-data) into a dataset with 3 classes
# (background, cerebrum, cerebellum), trains a UNet3D on 2 ranks for a few
# minutes, predicts the whole volume with sliding windows, prints the
# per-class Dice and writes a PNG with the prediction over the MRI and the
# learning curve. Everything goes to runs/demo/ in the checkout.
#   bash jobs/demo.sh [section.key=value ...]   (overrides for configs/demo.ini)
set -euo pipefail
cd "$(dirname "$0")/.."
top=$(pwd)
run=$top/runs/demo
templates=/usr/share/mricron/templates

packages=(
    build-essential autoconf automake libtool pkg-config
    mpich libmpich-dev libhdf5-mpich-dev hdf5-tools libopenblas-dev
    libnifti2-dev libniftiio-dev libinih-dev libcjson-dev zlib1g-dev
    libpapi-dev mricron-data python3 python3-numpy python3-nibabel python3-matplotlib
)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "== installing: ${missing[*]}"
    [ "$(id -u)" -eq 0 ] || { echo "jobs/demo.sh: installing packages needs root: ${missing[*]}" >&2; exit 1; }
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q && apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

echo "== build"
if [ ! -x build/tessera ]; then
    ./bootstrap >/dev/null
    mkdir -p build
    (cd build && ../configure -q MPICC=mpicc.mpich MPIEXEC=mpiexec.mpich)
fi
make -C build -j"$(nproc)" tessera >/dev/null
tessera=$top/build/tessera
mpirun=(mpiexec.mpich -n 2)
export OMP_NUM_THREADS=1   # 2 ranks x 1 thread on the 2 cores

start=$(date +%s)
rm -rf "$run"
mkdir -p "$run"
echo "== convert: Colin27 T1 + AAL atlas at 2 mm -> $run/ch2-aal3.h5 (classes: background, cerebrum, cerebellum)"
"${mpirun[@]}" "$tessera" convert nifti --image "$templates/ch2.nii.gz" --label "$templates/aal.nii.gz" \
    --label-map configs/labelmaps/aal-3class.txt --downsample 2 --out "$run/ch2-aal3.h5"

echo "== train: 2 ranks, data parallel (configs/demo.ini)"
"${mpirun[@]}" "$tessera" train configs/demo.ini data.path="$run/ch2-aal3.h5" run.dir="$run" "$@"

echo "== infer: the whole 1 mm scan (predicted at 2 mm, labels back on the 1 mm grid), windows split over 2 ranks,"
echo "   test-time mirroring over the 3 axes and each class's largest connected component kept (nnU-Net's"
echo "   inference defaults; docs/medical.md)"
"${mpirun[@]}" "$tessera" infer configs/demo.ini checkpoint="$run" input="$templates/ch2.nii.gz" downsample=2 \
    output="$run/ch2-pred.nii.gz" label="$templates/aal.nii.gz" label_map=configs/labelmaps/aal-3class.txt \
    mirror=xyz keep_largest=all "$@" | tee "$run/infer.txt"

echo "== picture (with an augmented training patch: rotation and zoom drawn for it, written by bench io --dump-patch)"
mkdir -p "$run/patch"
mpiexec.mpich -n 1 "$tessera" bench io configs/demo.ini data.path="$run/ch2-aal3.h5" train.batch=1 \
    data.rot_p=1 data.zoom_p=1 --dump-patch "$run/patch"
/usr/bin/python3 jobs/demo_plot.py "$templates/ch2.nii.gz" "$run/ch2-pred.nii.gz" "$templates/aal.nii.gz" \
    configs/labelmaps/aal-3class.txt "$run/metrics.jsonl" "$run/demo.png" \
    "$run/patch/patch-000000_image.nii" "$run/patch/patch-000000_label.nii"

echo
echo "demo finished in $(( $(date +%s) - start )) s (after the build)"
grep -E "^(Dice|HD95|NSD|foreground)" "$run/infer.txt"
echo "run directory: $run"
echo "picture:       $run/demo.png"
