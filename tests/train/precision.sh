#!/bin/sh
# Mixed precision (train.precision; issue [9]): a bad value is refused
# naming the key; fp16's dynamic loss scaling recovers from an injected
# overflow on 2 ranks (the step skipped on every rank, the weights unchanged
# by it, the scale halved, then doubled after growth_interval good steps,
# the weights moving again) and resumes with its scale; bf16 and fp16 train
# on dp 2 x sp 2 and dp 2 x pp 2 with losses and weights within the
# tolerances of docs/training.md of fp32 on the same grid, and so does
# nnU-Net's residual encoder with deep supervision (dp 2 x sp 2 and
# dp 2 x pp 2); inference follows train.precision.
. "$TS_SRCDIR/tests/train/lib_train.sh"
ts_tmpdir precision
ts_synth 8 20 7
ts_ini p.ini ckpt.every=6 ckpt.keep=0
# No gradient equivalence here: bf16 and fp16 change the arithmetic on purpose (compared with fp32 within
# tolerances below); each precision against one rank of the same precision, gradient by gradient, on
# sp, dp x sp and pp x sp: tests/train/grad_equiv.sh.

# --- bad values, refused on every rank before any step ---
ts_fails_on_all "train.precision = fp8: refused on every rank, naming the key" "train.precision" 2 \
    train_run 2 bad train.precision=fp8
ts_check "... and the values it takes" sh -c "printf '%s\n' \"\$0\" | grep -q 'fp32|bf16|fp16'" "$ts_out"
ts_fails_on_all "train.loss_scale with train.precision = bf16: refused, naming the key" "train.loss_scale" 2 \
    train_run 2 bad train.precision=bf16 train.loss_scale=1024

# --- fp16: an overflow injected on rank 1 at step 2 ---
ts_step "initial weights" "$TESSERA" model init "$d/p.ini" --out "$d/init.h5" --seed 0
export TESSERA_FAULT=overflow:rank=1:step=2
run 2 ov train.precision=fp16 train.loss_scale_growth_interval=2 ckpt.every=1
ts_check "... the overflow is reported: step skipped on every rank, loss scale halved to 32768" sh -c \
    "printf '%s\n' \"\$0\" | grep -q 'step 2: fp16 gradients overflowed on some rank: the optimizer step is skipped on every rank and the loss scale halves to 32768'" \
    "$ts_out"
ts_check "... and it is not a bad step (no non-finite-step message)" sh -c \
    "! printf '%s\n' \"\$0\" | grep -q 'non-finite loss or gradients'" "$ts_out"
if [ -n "$TS_PY" ]; then
    ts_step "... every rank skipped it (perf.json: 1 overflow step on every rank), and the scale is where the checkpoints say" \
        "$TS_PY" -c "
import json, h5py, numpy as np
p = json.load(open('$d/ov/perf.json'))['precision']; print(p)
assert p['mode'] == 'fp16' and p['overflow_steps_min'] == 1 and p['overflow_steps_max'] == 1
assert p['loss_scale_min'] == p['loss_scale_max'] == 131072
st = [h5py.File('$d/ov/ckpt/step-%d/state.h5' % s, 'r') for s in range(1, 7)]
sc = [(float(f['meta'].attrs['loss_scale']), int(f['meta'].attrs['loss_scale_good_steps'])) for f in st]
print('loss scale, good steps after steps 1..6:', sc)
# 65536 after step 1, halved by the overflow at step 2, doubled after steps 3 and 4 (interval 2)
assert sc == [(65536, 1), (32768, 0), (32768, 1), (65536, 0), (65536, 1), (131072, 0)]
P = [f['params'] for f in st]
names = [n for n in P[0] if P[0][n].dtype.kind == 'f']
same12 = all(np.array_equal(P[0][n], P[1][n]) for n in names)
moved23 = max(float(np.abs(np.asarray(P[2][n], np.float64) - np.asarray(P[1][n])).max()) for n in names)
moved56 = max(float(np.abs(np.asarray(P[5][n], np.float64) - np.asarray(P[4][n])).max()) for n in names)
print('step 2 left the weights as step 1 did:', same12, '; step 3 moved them by', moved23, ', step 6 by', moved56)
assert same12 and moved23 > 1e-4 and moved56 > 1e-4"
else
    ts_skip "overflow: perf.json and checkpoints" "no python3 with h5py"
fi
# resume: 3 steps, then to 6 from the step-3 checkpoint: the scale and the weights as in the run above
run 2 ovr train.precision=fp16 train.loss_scale_growth_interval=2 ckpt.every=1 train.steps=3
run 2 ovr train.precision=fp16 train.loss_scale_growth_interval=2 ckpt.every=1
ts_check "... resumed from step 3" sh -c "printf '%s\n' \"\$0\" | grep -q 'resumed from .*step-3 at step 3'" "$ts_out"
ts_step "... resumed = uninterrupted, bit for bit (parameters, optimizer state, loss scale and its good-step count)" \
    sh -c "h5diff '$d/ov/ckpt/step-6/state.h5' '$d/ovr/ckpt/step-6/state.h5' /params /params &&
           h5diff '$d/ov/ckpt/step-6/state.h5' '$d/ovr/ckpt/step-6/state.h5' /optim /optim &&
           [ \"\$(h5dump -a /meta/loss_scale '$d/ovr/ckpt/step-6/state.h5' | grep -c '131072')\" -ge 1 ] &&
           [ \"\$(h5dump -a /meta/loss_scale_good_steps '$d/ovr/ckpt/step-6/state.h5' | grep -cE '\(0\): 0')\" -ge 1 ]"
# a pipeline: the overflow on every rank at step 2 (the last stage's loss gradient, through the stages)
export TESSERA_FAULT=overflow:step=2
run 4 ovpp train.precision=fp16 parallel.pp=2 parallel.microbatches=2 train.batch=1
ts_check "... dp 2 x pp 2: the overflow is skipped on every rank and the scale halves" sh -c \
    "printf '%s\n' \"\$0\" | grep -q 'step 2: fp16 gradients overflowed on some rank: the optimizer step is skipped on every rank and the loss scale halves to 32768'" \
    "$ts_out"
unset TESSERA_FAULT

# --- bf16 and fp16 against fp32 on the same grid ---
# tolerances (docs/training.md): losses over 6 steps within 5e-3 (bf16) and 5e-4 (fp16) relative, weights
# within 0.1 and 0.03 of their scale; the precisions must change the arithmetic (not bit-identical to fp32)
near() { # near REF RUN LOSS_RTOL WEIGHT_TOL MODE [INIT]: from $d/INIT.h5 (default init)
    if [ -n "$TS_PY" ]; then
        ts_step "$2 = $1 within $3 (losses) and $4 (weights), weights moved, not identical to fp32, perf.json says $5" \
            sh -c "'$TS_PY' '$TS_SRCDIR/tests/train/compare_runs.py' '$d/$1' '$d/$2' '$d/${6:-init}.h5' 6 $3 $4 &&
                   ! h5diff -q '$d/$1/ckpt/step-6/state.h5' '$d/$2/ckpt/step-6/state.h5' /params /params &&
                   '$TS_PY' -c \"import json; p = json.load(open('$d/$2/perf.json'))['precision']; print(p); assert p['mode'] == '$5'\""
    else
        ts_skip "$2 = $1" "no python3 with h5py"
    fi
}
for g in sp pp; do
    if [ $g = sp ]; then grid="parallel.sp=2"; else grid="parallel.pp=2 parallel.microbatches=2 train.batch=1"; fi
    # shellcheck disable=SC2086
    run 4 $g-fp32 $grid
    # shellcheck disable=SC2086
    run 4 $g-bf16 $grid train.precision=bf16
    # shellcheck disable=SC2086
    run 4 $g-fp16 $grid train.precision=fp16
    near $g-fp32 $g-bf16 5e-3 0.1 bf16
    near $g-fp32 $g-fp16 5e-4 0.03 fp16
done

# --- nnU-Net's residual encoder with deep supervision (instance norm, leaky ReLU) in bf16 and fp16 ---
# Its losses meet the plain model's tolerances; its weights are compared within 0.15 (bf16) and 0.1 (fp16)
# of their scale: the worst tensors are instance-norm biases that start at 0 and are ~4e-4 after 6 steps
# (docs/training.md). A loss scale missing from the deep-supervision heads puts fp16 at 1.0 and 7e-2.
variant="model.arch=resenc model.res_blocks=1,2,2,2 model.deep_supervision=true model.channels=4,8,16,32
         model.norm=instance model.act=leaky_relu"
# shellcheck disable=SC2086
ts_step "initial weights of the residual encoder with deep supervision" \
    "$TESSERA" model init "$d/p.ini" $variant --out "$d/init-res.h5" --seed 0
# shellcheck disable=SC2086
run 4 rsp-fp32 parallel.sp=2 $variant
# shellcheck disable=SC2086
run 4 rsp-bf16 parallel.sp=2 $variant train.precision=bf16
# shellcheck disable=SC2086
run 4 rsp-fp16 parallel.sp=2 $variant train.precision=fp16
near rsp-fp32 rsp-bf16 5e-3 0.15 bf16 init-res
near rsp-fp32 rsp-fp16 5e-4 0.1 fp16 init-res
# shellcheck disable=SC2086
run 4 rpp-fp32 parallel.pp=2 parallel.microbatches=2 train.batch=1 $variant
# shellcheck disable=SC2086
run 4 rpp-bf16 parallel.pp=2 parallel.microbatches=2 train.batch=1 $variant train.precision=bf16
# shellcheck disable=SC2086
run 4 rpp-fp16 parallel.pp=2 parallel.microbatches=2 train.batch=1 $variant train.precision=fp16
near rpp-fp32 rpp-bf16 5e-3 0.15 bf16 init-res
near rpp-fp32 rpp-fp16 5e-4 0.1 fp16 init-res

# --- inference follows train.precision: bf16 and fp16 probabilities near fp32's, not equal ---
if [ -n "$TS_PY" ]; then
    ts_step "a 20x18x16 scan" "$TS_PY" -c "
import nibabel as nib, numpy as np
x = np.random.default_rng(3).normal(size=(20, 18, 16)).astype(np.float32)
nib.save(nib.Nifti1Image(x, np.eye(4)), '$d/scan.nii.gz')"
    for p in fp32 bf16 fp16; do
        ts_step "infer, train.precision = $p" ts_mpirun 1 "$TESSERA" infer "$d/p.ini" checkpoint="$d/sp-fp32" \
            input="$d/scan.nii.gz" output="$d/m-$p.nii.gz" probabilities="$d/pr-$p.nii.gz" train.precision=$p
    done
    ts_step "infer: bf16 and fp16 probabilities differ from fp32's (the precision took effect) by < 2e-2 and < 2e-3" \
        "$TS_PY" -c "
import nibabel as nib, numpy as np
p = {k: np.asarray(nib.load('$d/pr-%s.nii.gz' % k).dataobj, np.float64) for k in ('fp32', 'bf16', 'fp16')}
db, dh = np.abs(p['bf16'] - p['fp32']).max(), np.abs(p['fp16'] - p['fp32']).max()
print('largest probability difference: bf16', db, 'fp16', dh)
assert 0 < db < 2e-2 and 0 < dh < 2e-3"
else
    ts_skip "inference in bf16 and fp16" "no python3 with h5py and nibabel"
fi
ts_finish
