#!/bin/sh
# Every layout computes what one rank computes (issue [12]): one training
# step's gradients, batch-norm buffers and loss on a layout against one
# rank's from the same initial weights, tensor by tensor relative to each
# tensor's scale (tests/train/lib_grads.sh, grad_compare.py): norms (batch
# synchronised, group, instance) x models (plain, residual encoder, deep
# supervision) x layouts (sp 2 along D, H and W; sp 4 as 4,1,1, 2,2,1 and
# 1,2,2; sp 8 as 2,2,2; dp 2 x sp 2; pp 2; pp 2 x sp 2; dp 2 x pp 2 x sp 2),
# boxes 1, 2 and 3 voxels thick at the deepest level, bf16 against bf16,
# activation checkpointing, ZeRO-1, fp16; a deliberately broken halo must be
# caught; and
# `tessera infer` under sp gives one rank's probabilities.
# make check runs a subset that touches every norm, model, layout, thickness,
# precision and checkpointing at least once; TS_GRAD_MATRIX=full (jobs/check.sh)
# runs the whole product.
. "$TS_SRCDIR/tests/train/lib_train.sh"
ts_tmpdir grads
if [ -z "$TS_PY" ]; then
    ts_skip "gradient equivalence" "no python3 with h5py and numpy (tests/train/grad_compare.py reads the dumps)"
    ts_finish
fi
full=${TS_GRAD_MATRIX:-quick}

ts_synth 4 32 11
ts_ini g.ini -model.norm model.sync_bn=true model.res_blocks=1,2,2,2 train.steps=1 -train.momentum -train.log_every \
    train.warmup_steps=0 ckpt.every=0
B=1e-4   # fp32: gradients within 1e-4 of each tensor's scale
B16=1e-2 # bf16 against bf16

model_args() { # plain | resenc | ds
    case $1 in
    plain) echo "" ;;
    resenc) echo "model.arch=resenc" ;;
    ds) echo "model.deep_supervision=true model.channels=4,8,16,32 data.patch=32" ;;
    esac
}

# refs NAME ARGS...: the three references a layout may need: NAME (batch 2),
# NAME-p (batch 1, 2 accumulated: the pipeline's 2 micro-batches of 1),
# NAME-q (batch 2, 2 accumulated: dp 2 x pp 2 with micro-batches of 1)
refs() {
    _rn=$1
    shift
    grad_ref "$_rn" "$@"
    grad_ref "$_rn-p" "$@" train.batch=1 train.accum=2
    grad_ref "$_rn-q" "$@" train.accum=2
}
# layout K BOUND NAME: the layout NAME against K's references
layout() {
    _lk=$1 _lb=$2
    case $3 in
    sp2d) grad_eq "$_lk" 2 "$_lb" parallel.sp=2 parallel.sp_dims=2,1,1 ;;
    sp2h) grad_eq "$_lk" 2 "$_lb" parallel.sp=2 parallel.sp_dims=1,2,1 ;;
    sp2w) grad_eq "$_lk" 2 "$_lb" parallel.sp=2 parallel.sp_dims=1,1,2 ;;
    sp4d) grad_eq "$_lk" 4 "$_lb" parallel.sp=4 parallel.sp_dims=4,1,1 ;;
    sp4dh) grad_eq "$_lk" 4 "$_lb" parallel.sp=4 parallel.sp_dims=2,2,1 ;;
    sp4hw) grad_eq "$_lk" 4 "$_lb" parallel.sp=4 parallel.sp_dims=1,2,2 ;;
    sp8) grad_eq "$_lk" 8 "$_lb" parallel.sp=8 parallel.sp_dims=2,2,2 ;;
    dp2sp2) grad_eq "$_lk" 4 "$_lb" parallel.sp=2 train.batch=1 ;;
    pp2) grad_eq "$_lk-p" 2 "$_lb" parallel.pp=2 parallel.microbatches=2 train.accum=1 ;;
    pp2sp2) grad_eq "$_lk-p" 4 "$_lb" parallel.pp=2 parallel.microbatches=2 train.accum=1 parallel.sp=2 ;;
    dp2pp2sp2) grad_eq "$_lk-q" 8 "$_lb" parallel.pp=2 parallel.microbatches=2 train.batch=1 train.accum=1 \
        parallel.sp=2 ;;
    esac
}
LAYOUTS="sp2d sp2h sp2w sp4d sp4dh sp4hw sp8 dp2sp2 pp2 pp2sp2 dp2pp2sp2"

if [ "$full" = full ]; then
    for norm in batch group instance; do
        for m in plain resenc ds; do
            refs "$norm-$m" model.norm=$norm $(model_args $m)
            for l in $LAYOUTS; do layout "$norm-$m" $B $l; done
            # activation checkpointing (every level recomputed) on the split and the pipeline
            ck=model.checkpoint_levels=0,1,2
            [ $m = ds ] && ck=model.checkpoint_levels=0,1,2,3
            grad_eq "$norm-$m" 2 $B parallel.sp=2 $ck
            grad_eq "$norm-$m" 4 $B parallel.sp=2 train.batch=1 $ck
            grad_eq "$norm-$m-p" 2 $B parallel.pp=2 parallel.microbatches=2 train.accum=1 $ck
            # bf16 against bf16
            refs "$norm-$m-bf16" model.norm=$norm $(model_args $m) train.precision=bf16
            for l in sp2d sp4dh dp2sp2 pp2sp2; do layout "$norm-$m-bf16" $B16 $l; done
        done
        # ZeRO-1 (sharded optimizer state) and fp16 (loss scaling) on dp 2 x sp 2 and sp 2
        grad_eq "$norm-plain" 4 $B parallel.sp=2 train.batch=1 parallel.zero=1
        grad_ref "$norm-fp16" model.norm=$norm train.precision=fp16
        grad_eq "$norm-fp16" 2 $B parallel.sp=2
        grad_eq "$norm-fp16" 4 $B parallel.sp=2 train.batch=1
        # the deepest level's box 1, 2 (above) and 3 voxels thick along the split axis
        for t in 8 24; do
            grad_ref "$norm-D$t" model.norm=$norm data.patch=$t,16,16
            grad_eq "$norm-D$t" 2 $B parallel.sp=2 parallel.sp_dims=2,1,1
            grad_ref "$norm-H$t" model.norm=$norm data.patch=16,$t,16
            grad_eq "$norm-H$t" 2 $B parallel.sp=2 parallel.sp_dims=1,2,1
            grad_ref "$norm-W$t" model.norm=$norm data.patch=16,16,$t
            grad_eq "$norm-W$t" 2 $B parallel.sp=2 parallel.sp_dims=1,1,2
        done
    done
else
    # every norm along each axis; every layout, model, thickness, precision and checkpointing at least once
    for norm in batch group instance; do
        refs "$norm" model.norm=$norm
        for l in sp2d sp2h sp2w; do layout "$norm" $B $l; done
    done
    layout batch $B sp4hw
    layout group $B sp4d
    layout instance $B sp4dh
    layout instance $B sp8
    layout batch $B dp2sp2
    layout instance $B pp2
    layout group $B pp2sp2
    layout batch $B dp2pp2sp2
    grad_ref instance-resenc model.norm=instance model.arch=resenc
    grad_eq instance-resenc 2 $B parallel.sp=2
    grad_ref batch-resenc model.norm=batch model.arch=resenc
    grad_eq batch-resenc 4 $B parallel.sp=2 train.batch=1
    grad_ref group-ds model.norm=group $(model_args ds)
    grad_eq group-ds 2 $B parallel.sp=2
    grad_eq group-ds 4 $B parallel.sp=4 parallel.sp_dims=2,2,1
    grad_ref instance-D8 model.norm=instance data.patch=8,16,16
    grad_eq instance-D8 2 $B parallel.sp=2 parallel.sp_dims=2,1,1
    grad_ref instance-D24 model.norm=instance data.patch=24,16,16
    grad_eq instance-D24 2 $B parallel.sp=2 parallel.sp_dims=2,1,1
    grad_ref instance-bf16 model.norm=instance train.precision=bf16
    grad_eq instance-bf16 2 $B16 parallel.sp=2
    grad_ref batch-bf16 model.norm=batch train.precision=bf16
    grad_eq batch-bf16 4 $B16 parallel.sp=2 train.batch=1
    grad_eq instance 2 $B parallel.sp=2 model.checkpoint_levels=0,1,2
    grad_eq group 4 $B parallel.sp=2 train.batch=1 parallel.zero=1
    grad_ref instance-fp16 model.norm=instance train.precision=fp16
    grad_eq instance-fp16 2 $B parallel.sp=2
    grad_eq group-p 2 $B parallel.pp=2 parallel.microbatches=2 train.accum=1 model.checkpoint_levels=0,1
fi

# a deliberately broken halo (one face's exchange dropped): the harness must catch it
p=
[ "$full" = full ] && p=-plain
TESSERA_TEST_SKIP_HALO=D- grad_ne instance$p 2 parallel.sp=2 parallel.sp_dims=2,1,1
TESSERA_TEST_SKIP_HALO=W+ grad_ne batch$p 4 parallel.sp=4 parallel.sp_dims=1,2,2

# tessera infer under sp: the probabilities of one rank (a model trained 40 steps, so that they say something)
"$TS_PY" -c "
import h5py, nibabel as nib, numpy as np
x = np.asarray(h5py.File('$d/syn.h5', 'r')['samples/000001/image'])[0, 1:27, :30, :29].transpose(2, 1, 0)
nib.save(nib.Nifti1Image(x.astype(np.float32), np.diag([1.2, 0.9, 1.1, 1])), '$d/scan.nii.gz')"
for norm in batch instance; do
    ts_step "a model to predict with ($norm norm, 40 steps)" train_run 2 "inf-$norm" model.norm=$norm train.steps=40 \
        train.lr=0.1 train.momentum=0.9
    ts_step "infer ($norm norm), 1 rank" ts_mpirun 1 "$TESSERA" infer "$ini" model.norm=$norm checkpoint="$d/inf-$norm" \
        input="$d/scan.nii.gz" output="$d/m-$norm-1.nii.gz" probabilities="$d/p-$norm-1.nii.gz"
    for lay in "2 2,1,1" "2 1,2,1" "2 1,1,2" "4 2,2,1"; do
        set -- $lay
        ts_step "infer ($norm norm), sp $1 as $2" ts_mpirun "$1" "$TESSERA" infer "$ini" model.norm=$norm \
            checkpoint="$d/inf-$norm" input="$d/scan.nii.gz" output="$d/m.nii.gz" probabilities="$d/p.nii.gz" \
            parallel.sp="$1" parallel.sp_dims="$2"
        ts_step "... its probabilities are one rank's (per class within 1e-5), and so is its mask" "$TS_PY" -c "
import nibabel as nib, numpy as np
a = np.asarray(nib.load('$d/p-$norm-1.nii.gz').dataobj); b = np.asarray(nib.load('$d/p.nii.gz').dataobj)
ma = np.asarray(nib.load('$d/m-$norm-1.nii.gz').dataobj); mb = np.asarray(nib.load('$d/m.nii.gz').dataobj)
err = [float(np.abs(a[..., k] - b[..., k]).max()) for k in range(a.shape[-1])]
spread = [float(a[..., k].max() - a[..., k].min()) for k in range(a.shape[-1])]
print('per class: difference', err, 'range of the probabilities', spread, '; mask voxels differing', int((ma != mb).sum()),
      'of', ma.size, 'classes', np.unique(ma))
assert a.shape == b.shape and a.shape[-1] == 3 and max(err) <= 1e-5 and (ma == mb).all() and min(spread) > 0.1"
    done
done
ts_finish
