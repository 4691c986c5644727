#!/bin/sh
# Normalisation per modality (issue [11], nnU-Net's per-channel scheme):
# on a dataset of CT + MR scans (convert --modality CT,MR), plan-data
# proposes data.norm = ct,foreground; with it every training patch's CT
# channel is NumPy's clip to the dataset's foreground 0.5/99.5 percentiles
# and z-score, and its MR channel the z-score over the sample's voxels above
# its mean; training and inference run with it on 2 ranks; a list of the
# wrong length, dataset inside a list or an unknown mode is an error naming
# data.norm (and the file) on every rank.
. "$TS_SRCDIR/tests/mpi/lib.sh"
. "$TS_SRCDIR/tests/io/lib_io.sh"
TESSERA="$TS_BUILDDIR/tessera"
export OMP_NUM_THREADS=1
d=$(mktemp -d "${TMPDIR:-/tmp}/ts-normmod.XXXXXX") || exit 1
trap 'rm -rf "$d"' EXIT
if [ -z "$TS_PY" ]; then
    ts_skip "normalisation per modality" "no python3 with h5py, nibabel and numpy"
    ts_finish
    exit $?
fi
ts_step "3 synthetic scans, 2 channels (CT-like, MR-like) along t" "$TS_PY" - "$d" <<'PY'
import sys
import numpy as np
import nibabel as nib
out = sys.argv[1]
rng = np.random.default_rng(11)
for i, sh in enumerate([(26, 22, 20), (24, 24, 18), (22, 26, 20)]):
    x, y, z = np.meshgrid(*[np.arange(n, dtype=np.float64) for n in sh], indexing='ij')
    r = np.sqrt((x - sh[0] / 2 + 0.3) ** 2 + (y - sh[1] / 2 - 0.6) ** 2 + (z - sh[2] / 2) ** 2)
    lab = ((r < 6).astype(np.uint8) + (r < 3)).astype(np.uint8)
    body = r < 9
    ct = np.where(body, 20 + 40 * lab + rng.normal(0, 15, sh), -1000 + rng.normal(0, 5, sh))
    ct[body & (rng.random(sh) < 0.02)] = 1800.0  # bone-like outliers for the clipping
    mr = np.where(body, (300 + 150 * lab + rng.normal(0, 30, sh)) * (1 + 0.3 * i), rng.normal(5, 2, sh) ** 2)
    img = np.stack([ct, mr], axis=3).astype(np.float32)
    A = np.diag([1.0, 1.0, 1.0, 1.0])
    nib.save(nib.Nifti1Image(img, A), '%s/img%d.nii.gz' % (out, i))
    nib.save(nib.Nifti1Image(lab, A), '%s/lab%d.nii.gz' % (out, i))
PY
ts_step "convert on 2 ranks with --modality CT,MR" \
    ts_mpirun 2 "$TESSERA" convert nifti --image "$d/img0.nii.gz" --label "$d/lab0.nii.gz" \
    --image "$d/img1.nii.gz" --label "$d/lab1.nii.gz" --image "$d/img2.nii.gz" --label "$d/lab2.nii.gz" \
    --modality CT,MR --out "$d/m.h5"
ts_check "plan-data proposes data.norm = ct,foreground" \
    sh -c "'$TESSERA' plan-data '$d/m.h5' model.channels=4,8 | grep -q '^  data.norm = ct,foreground$'"
cat >"$d/c.ini" <<INI
[data]
path = $d/m.h5
patch = 8,8,8
norm = ct, foreground
augment = false
fg_fraction = 0.5
[model]
channels = 4,8
classes = 3
in_channels = 2
[train]
batch = 2
seed = 3
INI
mkdir -p "$d/dump"
ts_step "bench io --dump-patch with data.norm = ct, foreground" \
    ts_mpirun 1 "$TESSERA" bench io "$d/c.ini" --dump-patch "$d/dump"
ts_step "every patch: channel 0 NumPy's CT clip and z-score, channel 1 the foreground z-score" \
    "$TS_PY" "$TS_SRCDIR/tests/io/fingerprint_check.py" mixed "$d/m.h5" "$d/dump"
ts_step "train 3 steps with it on 2 ranks" \
    ts_mpirun 2 "$TESSERA" train "$d/c.ini" train.steps=3 eval.final=false run.dir="$d/run"
ts_step "infer a raw scan with it on 2 ranks (CT channel with the training dataset's statistics)" \
    ts_mpirun 2 "$TESSERA" infer "$d/c.ini" checkpoint="$d/run" input="$d/img1.nii.gz" output="$d/mask.nii.gz"
ts_check "the mask has the scan's grid" "$TS_PY" -c "
import nibabel as nib
a, m = nib.load('$d/img1.nii.gz'), nib.load('$d/mask.nii.gz')
assert m.shape == a.shape[:3], (m.shape, a.shape)"
ts_fails_on_all "three modes for 2 channels: an error naming data.norm and the file on both ranks" \
    "data.norm lists 3 modes (one per channel) but $d/m.h5 has 2 channel(s)" 2 \
    ts_mpirun 2 "$TESSERA" train "$d/c.ini" data.norm=ct,foreground,image train.steps=1 run.dir="$d/bad1"
ts_fails_on_all "dataset inside a list: an error naming data.norm on both ranks" \
    "dataset applies to every channel" 2 \
    ts_mpirun 2 "$TESSERA" train "$d/c.ini" data.norm=ct,dataset train.steps=1 run.dir="$d/bad2"
ts_fails_on_all "an unknown mode: an error naming it on both ranks" \
    "data.norm = 'ct,zscore' has 'zscore', not one of image|dataset|none|foreground|ct" 2 \
    ts_mpirun 2 "$TESSERA" train "$d/c.ini" data.norm=ct,zscore train.steps=1 run.dir="$d/bad3"
ts_fails_on_all "infer with three modes for a scan of 2 channels: an error naming the scan on both ranks" \
    "img1.nii.gz: 2 channel(s), data.norm lists 3 modes" 2 \
    ts_mpirun 2 "$TESSERA" infer "$d/c.ini" data.norm=ct,foreground,image checkpoint="$d/run" \
    input="$d/img1.nii.gz" output="$d/bad.nii.gz"
ts_check "nothing written by the failed runs" [ ! -e "$d/bad.nii.gz" ] && [ ! -e "$d/bad1/ckpt" ]
ts_finish
