#!/bin/sh
# tessera infer replays the preprocessing the training dataset records
# (issue [11]): scans converted with --crop nonzero and a non-integer
# --spacing, a tiny model trained on them; inferring on a raw scan crops
# and resamples it as convert did and writes the mask on the scan's grid
# and affine, background outside the crop box, equal (>= 99.9 % of voxels)
# to the mask predicted on the stored sample and put back by hand (also
# with data.norm = dataset, and for --crop nonzero --downsample 2 with
# downsample=2); a dataset without preprocessing, and
# preprocess=none, give the masks of a run without data.path bit for bit; probabilities= are put back
# as nnU-Net exports them (each class linear, background 1 outside the crop box); a mismatched
# downsample=, a missing data.path and a bad preprocess= fail on every rank.
. "$TS_SRCDIR/tests/train/lib_train.sh"
if [ -z "$TS_PY" ]; then
    echo "1..0 # SKIP no python3 with h5py, nibabel and numpy"
    exit 0
fi
py() { "$TS_PY" "$TS_SRCDIR/tests/train/infer_prep.py" "$@"; }
ts_tmpdir infer-prep

ts_step "3 scans with a zero background around an off-centre head, 3 classes" py make "$d"
pairs="--image $d/img0.nii.gz --label $d/lab0.nii.gz --image $d/img1.nii.gz --label $d/lab1.nii.gz
       --image $d/img2.nii.gz --label $d/lab2.nii.gz"
# shellcheck disable=SC2086
ts_step "convert --crop nonzero --spacing 1.37,1.21,1.53 (non-integer factors)" \
    ts_mpirun 1 "$TESSERA" convert nifti $pairs --crop nonzero --spacing 1.37,1.21,1.53 --out "$d/p.h5"
# shellcheck disable=SC2086
ts_step "convert the same scans without preprocessing" ts_mpirun 1 "$TESSERA" convert nifti $pairs --out "$d/plain.h5"
ts_ini i.ini model.channels=4,8 model.norm=instance -model.groups data.patch=8 train.steps=40 train.loss=ce \
    -train.log_every
ts_step "train 40 steps on the preprocessed dataset" \
    ts_mpirun 1 "$TESSERA" train "$d/i.ini" data.path="$d/p.h5" run.dir="$d/run"
I="$TESSERA infer $d/i.ini checkpoint=$d/run"

# the preprocessing replayed: the mask on the scan's grid
ts_step "infer the raw scan 0 with data.path = the preprocessed dataset and label=, 2 ranks" \
    ts_mpirun 2 $I data.path="$d/p.h5" input="$d/img0.nii.gz" output="$d/m0.nii.gz" label="$d/lab0.nii.gz"
ts_check "the run says what it replayed and the grid it predicted on" sh -c "
    printf '%s\n' \"\$1\" | grep -q '^preprocessing of $d/p.h5 replayed: crop to the non-zero box, resampled to 1.37 x 1.21 x 1.53 mm (x, y, z)$' &&
    printf '%s\n' \"\$1\" | grep -q 'infer: \[1/1\] .*img0.nii.gz (46x40x30) -> .*m0.nii.gz (predicted preprocessed: [0-9]*x[0-9]*x[0-9]*)' &&
    [ -s '$d/m0.metrics.json' ]" sh "$ts_out"
ts_step "the preprocessed sample 0 of the dataset written as NIfTI" py stored "$d/p.h5" 0 "$d/pre0.nii.gz"
ts_step "infer it as it is (preprocess=none)" \
    ts_mpirun 1 $I data.path="$d/p.h5" preprocess=none input="$d/pre0.nii.gz" output="$d/q0.nii.gz"
ts_step "mask: the scan's dimensions and affine, 0 outside the crop box, = the stored sample's put back (>= 99.9 %)" \
    py check "$d/img0.nii.gz" "$d/m0.nii.gz" "$d/p.h5" 0 "$d/q0.nii.gz"
ts_step "probabilities= with the preprocessing replayed (2 ranks), and of the stored sample as it is" sh -c "
    timeout -k 10 300 $MPIEXEC -n 2 $I data.path='$d/p.h5' input='$d/img0.nii.gz' output='$d/mp.nii.gz' probabilities='$d/pp.nii.gz' &&
    timeout -k 10 300 $MPIEXEC -n 1 $I data.path='$d/p.h5' preprocess=none input='$d/pre0.nii.gz' output='$d/qp.nii.gz' \
        probabilities='$d/qpp.nii.gz'"
ts_step "probabilities: the stored sample's put back (each class linear, background 1 outside the box; 1e-5)" \
    py probs "$d/img0.nii.gz" "$d/pp.nii.gz" "$d/p.h5" 0 "$d/qpp.nii.gz" "$d/mp.nii.gz"
ts_step "data.norm = dataset: the raw scan 0 with the preprocessing replayed, and the stored sample as it is" sh -c "
    timeout -k 10 300 $MPIEXEC -n 1 $I data.path='$d/p.h5' data.norm=dataset input='$d/img0.nii.gz' output='$d/md.nii.gz' &&
    timeout -k 10 300 $MPIEXEC -n 1 $I data.path='$d/p.h5' data.norm=dataset preprocess=none input='$d/pre0.nii.gz' output='$d/qd.nii.gz'"
ts_step "data.norm = dataset: the same agreement" py check "$d/img0.nii.gz" "$d/md.nii.gz" "$d/p.h5" 0 "$d/qd.nii.gz"

# convert --crop nonzero --downsample 2: the crop replayed, then downsample=2
# shellcheck disable=SC2086
ts_step "convert --crop nonzero --downsample 2" \
    ts_mpirun 1 "$TESSERA" convert nifti $pairs --crop nonzero --downsample 2 --out "$d/d2.h5"
ts_step "infer the raw scan 0 with it, downsample=2, and its stored sample 0 as it is" sh -c "
    timeout -k 10 300 $MPIEXEC -n 1 $I data.path='$d/d2.h5' downsample=2 input='$d/img0.nii.gz' output='$d/m2.nii.gz' &&
    '$TS_PY' '$TS_SRCDIR/tests/train/infer_prep.py' stored '$d/d2.h5' 0 '$d/pre2.nii.gz' &&
    timeout -k 10 300 $MPIEXEC -n 1 $I data.path='$d/d2.h5' preprocess=none input='$d/pre2.nii.gz' output='$d/q2.nii.gz'"
ts_step "the mask on the scan's grid, 0 outside the crop box, = the stored sample's repeated and put back" \
    py check "$d/img0.nii.gz" "$d/m2.nii.gz" "$d/d2.h5" 0 "$d/q2.nii.gz"
ts_fails_on_all "downsample=1 (the default) with it" "downsample=1 does not match data.path=$d/d2.h5 (converted at downsample 2)" 2 \
    ts_mpirun 2 $I data.path="$d/d2.h5" input="$d/img0.nii.gz" output="$d/e5.nii.gz"

# without recorded preprocessing: today's masks, bit for bit
ts_step "infer scans 1 and 2 without data.path" ts_mpirun 1 $I input="$d/img1.nii.gz,$d/img2.nii.gz" output="$d/n"
ts_step "... with data.path = the dataset without preprocessing" \
    ts_mpirun 1 $I data.path="$d/plain.h5" input="$d/img1.nii.gz,$d/img2.nii.gz" output="$d/pl"
ts_step "... with the preprocessed dataset and preprocess=none" \
    ts_mpirun 1 $I data.path="$d/p.h5" preprocess=none input="$d/img1.nii.gz,$d/img2.nii.gz" output="$d/pn"
ts_check "all three wrote the same masks, bit for bit, and nothing was replayed" sh -c "
    for s in img1 img2; do cmp '$d/n/'\$s.nii.gz '$d/pl/'\$s.nii.gz && cmp '$d/n/'\$s.nii.gz '$d/pn/'\$s.nii.gz || exit 1; done
    ! printf '%s\n' \"\$1\" | grep -q 'preprocessed\|replayed'" sh "$ts_out"
ts_step "... and with the preprocessing replayed they differ" \
    ts_mpirun 1 $I data.path="$d/p.h5" input="$d/img1.nii.gz" output="$d/m1.nii.gz"
ts_check "the replayed mask of scan 1 is not the unpreprocessed one" sh -c "! cmp -s '$d/m1.nii.gz' '$d/n/img1.nii.gz'"
ts_step "scan 1: the replayed mask on its grid, 0 outside its crop box" py check "$d/img1.nii.gz" "$d/m1.nii.gz"

# what does not go with it fails on every rank, naming the file
ts_fails_on_all "downsample=2 on a dataset converted at full resolution" "downsample=2 does not match data.path=$d/p.h5" 2 \
    ts_mpirun 2 $I data.path="$d/p.h5" input="$d/img0.nii.gz" output="$d/e2.nii.gz" downsample=2
ts_fails_on_all "a data.path that does not exist" "data.path=$d/none.h5: No such file" 2 \
    ts_mpirun 2 $I data.path="$d/none.h5" input="$d/img0.nii.gz" output="$d/e3.nii.gz"
ts_fails_on_all "preprocess=crop" "preprocess=crop: give dataset or none" 2 \
    ts_mpirun 2 $I input="$d/img0.nii.gz" output="$d/e4.nii.gz" preprocess=crop
ts_check "nothing was written by the failing runs" \
    [ ! -e "$d/e2.nii.gz" -a ! -e "$d/e3.nii.gz" -a ! -e "$d/e4.nii.gz" -a ! -e "$d/e5.nii.gz" ]
ts_finish
