#!/bin/sh
# The dataset fingerprint, preprocessing in convert and data.norm = ct
# (issue [11]): convert --crop nonzero --spacing with a non-integer factor
# resamples images as SciPy's cubic B-spline (or trilinear), an anisotropic
# scan's coarse axis by nearest voxel (nnU-Net's separate z), records the
# crop box, the scan's shape and spacing and the exact grid spacing, keeps
# a smooth label map (>= 97 % of the scan's voxels against their nearest
# stored voxel), and the foreground intensity statistics equal NumPy's over
# the cropped scans before resampling (nnU-Net's); --spacing median follows nnU-Net's target spacing rule, also on
# an anisotropic set; plan-data prints it and a patch and batch; CT
# normalisation of training patches equals NumPy's clip and z-score, and
# infer applies it with the training dataset's statistics; bad
# input (an unknown modality, data.norm = ct on a dataset without the
# statistics) is an error naming the value or file on every rank.
. "$TS_SRCDIR/tests/mpi/lib.sh"
. "$TS_SRCDIR/tests/io/lib_io.sh"
TESSERA="$TS_BUILDDIR/tessera"
export OMP_NUM_THREADS=1
d=$(mktemp -d "${TMPDIR:-/tmp}/ts-fp.XXXXXX") || exit 1
trap 'rm -rf "$d"' EXIT
if [ -z "$TS_PY" ]; then
    ts_skip "fingerprint and preprocessing" "no python3 with h5py, nibabel and numpy"
    ts_finish
    exit $?
fi
py() { "$TS_PY" "$TS_SRCDIR/tests/io/fingerprint_check.py" "$@"; }
ts_step "synthetic scans: set a (3 scans near 1 mm), set b (3 scans of 4..6 mm along k)" \
    "$TS_PY" "$TS_SRCDIR/tests/io/fingerprint_make.py" "$d"
pa="--image $d/aimg0.nii.gz --label $d/alab0.nii.gz --image $d/aimg1.nii.gz --label $d/alab1.nii.gz"
pa="$pa --image $d/aimg2.nii.gz --label $d/alab2.nii.gz"
pb="--image $d/bimg0.nii.gz --label $d/blab0.nii.gz --image $d/bimg1.nii.gz --label $d/blab1.nii.gz"
pb="$pb --image $d/bimg2.nii.gz --label $d/blab2.nii.gz"
# shellcheck disable=SC2086
ts_step "convert set a on 2 ranks: --crop nonzero --spacing 1.37,0.83,1.61 --modality CT" \
    ts_mpirun 2 "$TESSERA" convert nifti $pa --crop nonzero --spacing 1.37,0.83,1.61 --modality CT --out "$d/a.h5"
ts_step "crop box, shapes, spacings, origin, labels and foreground statistics = NumPy's" \
    py convert "$d/a.h5" 1.37,0.83,1.61 "$d/aimg0.nii.gz" "$d/alab0.nii.gz" "$d/aimg1.nii.gz" "$d/alab1.nii.gz" \
    "$d/aimg2.nii.gz" "$d/alab2.nii.gz"
ts_step "stored images = SciPy's cubic B-spline (order 3) at the new voxel centres, background kept 0" \
    py image "$d/a.h5" "$d/aimg0.nii.gz" "$d/aimg1.nii.gz" "$d/aimg2.nii.gz"
# shellcheck disable=SC2086
ts_step "the same on 1 rank" \
    ts_mpirun 1 "$TESSERA" convert nifti $pa --crop nonzero --spacing 1.37,0.83,1.61 --modality CT --out "$d/a1.h5"
ts_check "the fingerprint does not depend on the number of ranks" "$TS_PY" -c "
import h5py, numpy as np
with h5py.File('$d/a.h5', 'r') as f, h5py.File('$d/a1.h5', 'r') as g:
    a, b = f['fingerprint'], g['fingerprint']
    assert sorted(a.attrs) == sorted(b.attrs) and sorted(a) == sorted(b)
    for k in a.attrs:
        assert np.array_equal(np.asarray(a.attrs[k]), np.asarray(b.attrs[k])), k
    for k in a:
        assert np.array_equal(a[k][...], b[k][...]), k"
# shellcheck disable=SC2086
ts_step "convert set b with 2 shards: --crop nonzero --spacing median --label-resample nearest" \
    ts_mpirun 2 "$TESSERA" convert nifti $pb --crop nonzero --spacing median --label-resample nearest --shards 2 \
    --out "$d/b.h5"
ts_step "set b: the target spacing is nnU-Net's rule, the anisotropic axis at its 10th percentile" \
    py spacing "$d/b.h5" aniso
pbi="$d/bimg0.nii.gz $d/bimg1.nii.gz $d/bimg2.nii.gz"
# shellcheck disable=SC2086
ts_step "set b: the anisotropic axis (D, 4-6 mm against 1 mm) by nearest voxel, the others cubic (= SciPy)" \
    py image "$d/b.h5" $pbi
# shellcheck disable=SC2086
ts_step "convert set b with --image-resample linear --anisotropic-axis same" \
    ts_mpirun 1 "$TESSERA" convert nifti $pb --crop nonzero --spacing median --image-resample linear \
    --anisotropic-axis same --out "$d/bl.h5"
# shellcheck disable=SC2086
ts_step "its images = SciPy's trilinear (order 1) on every axis" py image "$d/bl.h5" $pbi
ts_check "the two conversions of set b differ (the options took effect)" "$TS_PY" -c "
import h5py, numpy as np
with h5py.File('$d/b.h5', 'r') as f, h5py.File('$d/bl.h5', 'r') as g:
    assert f['fingerprint'].attrs['image_resampling'] == 'cubic' and g['fingerprint'].attrs['image_resampling'] == 'linear'
    assert not np.array_equal(f['samples/000001/image'][...], g['samples/000001/image'][...])"
want=$(py spacing "$d/b.h5" aniso | tail -n 1)
ts_step "plan-data on set b prints that spacing, a patch and a batch" \
    sh -c "'$TESSERA' plan-data '$d/b.h5' model.channels=4,8,16 --mem-mb 2000 >'$d/plan.txt'"
cat "$d/plan.txt" | sed 's/^/# /'
ts_check "plan-data: target spacing $want, anisotropic D" \
    grep -q "target spacing: $(echo "$want" | sed 's/ / x /g') mm (D, H, W); anisotropic: D" "$d/plan.txt"
ts_check "plan-data: data.patch in multiples of 4 (3 levels), batch >= 2" \
    grep -Eq "^  data.patch = ([0-9]*[048]),([0-9]*[048]),([0-9]*[048])$" "$d/plan.txt"
ts_check "plan-data: a smaller budget gives a smaller patch or batch" sh -c "
    '$TESSERA' plan-data '$d/b.h5' model.channels=4,8,16 --mem-mb 2000 | grep -E 'patch|batch =' >'$d/p1'
    '$TESSERA' plan-data '$d/b.h5' model.channels=4,8,16 --mem-mb 150 | grep -E 'patch|batch =' >'$d/p2'
    ! cmp -s '$d/p1' '$d/p2'"
ts_step "plan-data on set a without model.channels proposes nnU-Net's topology for its patch" \
    sh -c "'$TESSERA' plan-data '$d/a.h5' --mem-mb 4000 >'$d/plan-a.txt'"
ts_check "the topology: 32 features doubling (at most 320), a level per pooling that keeps >= 4 voxels per axis" \
    "$TS_PY" -c "
import re
t = open('$d/plan-a.txt').read()
p = [int(v) for v in re.search(r'data.patch = ([0-9,]+)', t).group(1).split(',')]
ch = [int(v) for v in re.search(r'model.channels = ([0-9,]+)', t).group(1).split(',')]
L = len(ch)
print('patch', p, 'channels', ch)
assert ch == [min(32 << l, 320) for l in range(L)] and ('model with %d levels' % L) in t
assert all(e % (1 << (L - 1)) == 0 and e >> (L - 1) >= 4 for e in p) and min(p) >> L <= 4 and L >= 2"
ts_check "with model.channels given, plan-data keeps it and proposes none" \
    sh -c "! grep -q 'model.channels =' '$d/plan.txt' && grep -q 'model with 3 levels' '$d/plan.txt'"
ts_check "plan-data on set a proposes data.norm = ct (every channel CT)" \
    sh -c "'$TESSERA' plan-data '$d/a.h5' | grep -q '^  data.norm = ct$'"
cat >"$d/c.ini" <<INI
[data]
path = $d/a.h5
patch = 8,8,8
norm = ct
augment = false
fg_fraction = 0.5
[train]
batch = 2
seed = 3
INI
mkdir -p "$d/dump"
ts_step "bench io --dump-patch with data.norm = ct" ts_mpirun 1 "$TESSERA" bench io "$d/c.ini" --dump-patch "$d/dump"
ts_step "every patch is a box of NumPy's clip to [p0.5, p99.5] and z-score with the foreground mean/std" \
    py ct "$d/a.h5" "$d/dump"
ts_step "train 2 steps with data.norm = ct on 2 ranks" \
    ts_mpirun 2 "$TESSERA" train "$d/c.ini" model.channels=4,8 model.classes=3 train.steps=2 eval.final=false \
    run.dir="$d/run"
ts_step "infer with data.norm = ct on 2 ranks (the training dataset's statistics)" \
    ts_mpirun 2 "$TESSERA" infer "$d/c.ini" model.channels=4,8 model.classes=3 checkpoint="$d/run" \
    input="$d/aimg1.nii.gz" output="$d/mask.nii.gz"
ts_check "the mask has the scan's grid" "$TS_PY" -c "
import nibabel as nib, numpy as np
a, m = nib.load('$d/aimg1.nii.gz'), nib.load('$d/mask.nii.gz')
assert m.shape == a.shape and np.allclose(m.affine, a.affine, atol=1e-5)"
ts_step "a dataset without the statistics (/fingerprint removed)" "$TS_PY" -c "
import shutil, h5py
shutil.copy('$d/a.h5', '$d/old.h5')
with h5py.File('$d/old.h5', 'r+') as f:
    del f['fingerprint']"
ts_fails_on_all "data.norm = ct on it: an error naming the file on both ranks" \
    "$d/old.h5 has no foreground intensity statistics" 2 \
    ts_mpirun 2 "$TESSERA" train "$d/c.ini" data.path="$d/old.h5" model.channels=4,8 model.classes=3 \
    train.steps=2 eval.final=false run.dir="$d/old"
ts_fails_on_all "infer with data.norm = ct and it as data.path: an error naming it on both ranks" \
    "$d/old.h5 has no foreground intensity statistics" 2 \
    ts_mpirun 2 "$TESSERA" infer "$d/c.ini" data.path="$d/old.h5" model.channels=4,8 model.classes=3 \
    checkpoint="$d/run" input="$d/aimg1.nii.gz" output="$d/mask2.nii.gz"
ts_fails_on_all "plan-data on it: an error naming the file" "$d/old.h5 has no fingerprint" 2 \
    ts_mpirun 2 "$TESSERA" plan-data "$d/old.h5"
# shellcheck disable=SC2086
ts_fails_on_all "convert --modality PET: an error naming the value on both ranks" "modality 'PET' is not known" 2 \
    ts_mpirun 2 "$TESSERA" convert nifti $pa --modality PET --out "$d/bad.h5"
# shellcheck disable=SC2086
ts_fails_on_all "convert --modality CT,MR for one channel" "names 2 modalities for 1 channel" 2 \
    ts_mpirun 2 "$TESSERA" convert nifti $pa --modality CT,MR --out "$d/bad.h5"
# shellcheck disable=SC2086
ts_fails_on_all "convert --image-resample quintic: an error naming the value on both ranks" \
    "image-resample quintic (cubic, linear)" 2 \
    ts_mpirun 2 "$TESSERA" convert nifti $pa --spacing 1,1,1 --image-resample quintic --out "$d/bad.h5"
ts_check "no output left behind" [ ! -e "$d/bad.h5" ]
ts_finish
