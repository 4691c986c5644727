#!/bin/sh
# The nnU-Net model variants (issue [11]): the residual encoder
# (model.arch = resenc), deep supervision and both, with instance norm and
# leaky ReLU, train the synthetic task data parallel (the loss decreases,
# the weights move, 2 ranks = 1 rank with the same global batch (losses,
# weights and the first step's gradients tensor by tensor), a killed
# run resumes bit for bit), evaluate at the end, and what the variants
# refuse (fewer res_blocks than levels, deep supervision with 3 levels)
# is refused on every rank, naming the key, before any work; `tessera plan`
# marks every layout trainable; spatial splits:
# tests/parallel/spatial_variants.sh; pipeline stages:
# tests/train/pipeline_variants.sh.
. "$TS_SRCDIR/tests/train/lib_train.sh"
ts_tmpdir medmodel
ts_synth 8 16 5
ts_ini m.ini model.channels=4,8,8,16 model.norm=instance -model.groups model.act=leaky_relu model.res_blocks=1,2,2,1 \
    train.steps=10 ckpt.every=5 ckpt.keep=5
# decreases RUN: the mean loss of the last 3 steps is below that of the first 3, and the weights moved
decreases() {
    if [ -z "$TS_PY" ]; then
        ts_skip "$1: the loss decreases" "no python3 with h5py"
        return
    fi
    ts_step "$1: the loss decreases (mean of steps 8-10 < 0.9 x mean of steps 1-3) and the weights moved" \
        "$TS_PY" -c "
import json, h5py, numpy as np
l = {}
for line in open('$d/$1/metrics.jsonl'):
    m = json.loads(line)
    if 'loss' in m and 'dice' not in m: l[m['step']] = m['loss']
a, b = np.mean([l[s] for s in (1, 2, 3)]), np.mean([l[s] for s in (8, 9, 10)])
print('loss', [round(l[s], 4) for s in sorted(l)]); assert b < 0.9 * a, (a, b)
p = h5py.File('$d/$1/ckpt/step-10/state.h5', 'r')['params']; i = h5py.File('$d/init-$2.h5', 'r')['params']
assert sorted(p) == sorted(i), 'checkpoint and weights file name the same tensors'
moved = max(float(np.abs(np.asarray(p[n]) - np.asarray(i[n])).max()) for n in i if 'num_batches' not in n)
print('largest weight change', moved); assert moved > 1e-3"
}
dump_grads=yes # resenc-ds's first step's gradients are compared with 1 rank's below
for v in resenc ds resenc-ds; do
    case $v in
    resenc) args="model.arch=resenc" ;;
    ds) args="model.deep_supervision=true" ;;
    resenc-ds) args="model.arch=resenc model.deep_supervision=true" ;;
    esac
    # shellcheck disable=SC2086
    ts_step "$v: initial weights (tessera model init)" "$TESSERA" model init "$d/m.ini" $args --out "$d/init-$v.h5" --seed 0
    # shellcheck disable=SC2086
    run 2 "$v" $args
    decreases "$v" "$v"
done
if [ -n "$TS_PY" ]; then
    ts_step "the variants' parameter names: stem, residual blocks with skip projections, ds heads" "$TS_PY" -c "
import h5py
n = lambda v: set(h5py.File('$d/init-' + v + '.h5', 'r')['params'])
r, s, b = n('resenc'), n('ds'), n('resenc-ds')
for k in ('stem.conv.weight', 'enc0.block0.conv1.weight', 'enc1.block0.skip.conv.weight', 'enc1.block1.norm2.bias',
          'enc3.block0.skip.norm.weight', 'dec0.conv2.weight', 'head.weight'):
    assert k in r and k in b, k
assert 'enc0.block0.skip.conv.weight' not in r and 'enc1.block1.skip.conv.weight' not in r
assert 'ds1.weight' in s and 'ds1.weight' in b and 'ds2.weight' not in s and 'ds1.weight' not in r
assert 'enc0.conv1.weight' in s and 'stem.conv.weight' not in s"
fi
# data parallel: 2 ranks x batch 2 = 1 rank x batch 4. The losses agree to ~1e-8; the weights within 1e-3 of
# their scale: the biases of the instance norms of the residual stack stay small (their scale) and take
# float32 noise from the different summation order of their gradients (seen: 4e-4 for enc1.block1.norm2.bias)
run 1 resenc-ds-1 model.arch=resenc model.deep_supervision=true train.batch=4
dump_grads=
if [ -n "$TS_PY" ]; then
    ts_step "resenc-ds: 2 ranks = 1 rank with the same global batch (losses 1e-6, weights 1e-3, and they moved)" \
        "$TS_PY" "$TS_SRCDIR/tests/train/compare_runs.py" "$d/resenc-ds-1" "$d/resenc-ds" "$d/init-resenc-ds.h5" 10 \
        1e-6 1e-3
fi
grads resenc-ds-1 resenc-ds
# kill-and-resume
TESSERA_FAULT=kill:rank=1:step=7 ts_step_fails "resenc-ds: rank 1 killed at step 7" \
    train_run 2 kr model.arch=resenc model.deep_supervision=true
run 2 kr model.arch=resenc model.deep_supervision=true
ts_step "resenc-ds: kill at step 7 and resume = the uninterrupted run, bit for bit" \
    sh -c "h5diff '$d/resenc-ds/ckpt/step-10/state.h5' '$d/kr/ckpt/step-10/state.h5' /params /params &&
           h5diff '$d/resenc-ds/ckpt/step-10/state.h5' '$d/kr/ckpt/step-10/state.h5' /optim /optim"
# evaluation (sliding window, Dice) and inference take the full-resolution head
run 2 ev model.arch=resenc model.deep_supervision=true train.steps=2 eval.final=true
ts_check "resenc-ds: the final evaluation wrote per-class Dice" grep -q '"dice"' "$d/ev/metrics.jsonl"
# what the variants cannot take: refused on every rank, naming the key
bad() { # bad DESC TEXT ARGS...
    _desc=$1 _text=$2
    shift 2
    ts_fails_on_all "$_desc: refused on both ranks" "$_text" 2 train_run 2 bad "$@"
}
bad "deep supervision with 3 levels" "model.deep_supervision" model.deep_supervision=true model.channels=4,8,16
bad "resenc with fewer model.res_blocks entries than levels" "model.res_blocks" model.arch=resenc model.res_blocks=1,2
ts_check "no run directory was made by the refused runs" [ ! -e "$d/bad/metrics.jsonl" ]
# tessera plan marks no layout as not trainable: the variants train with spatial splits
# (tests/parallel/spatial_variants.sh) and pipeline stages (tests/train/pipeline_variants.sh)
ts_step "tessera plan, resenc on 2 ranks: runs" "$TESSERA" plan "$d/m.ini" model.arch=resenc --nodes 1 --ranks-per-node 2
ts_check "tessera plan, resenc: pp=2 and sp=2 listed, none marked not trainable, dp=2 recommended" sh -c "
    printf '%s\n' \"\$1\" | grep -q 'dp=1 pp=1 sp=2' && printf '%s\n' \"\$1\" | grep -q 'dp=1 pp=2 sp=1' &&
    ! printf '%s\n' \"\$1\" | grep -q 'not trainable' &&
    printf '%s\n' \"\$1\" | grep -q '^recommended: parallel.dp=2 parallel.pp=1 parallel.sp=1'" sh "$ts_out"
ts_finish
