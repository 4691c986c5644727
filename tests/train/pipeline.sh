#!/bin/sh
# Pipeline parallelism end to end (issue [6] acceptance 1, 3, 4): training
# on pp = 2 (gpipe and 1f1b, 2 and 4 micro-batches), pp = 3, dp 2 x pp 2,
# pp 2 x sp 2 and dp 2 x pp 2 x sp 2 gives the weights, per-step losses and
# first step's gradients (tensor by tensor) of one rank accumulating the same
# micro-batches; the cut is printed and written; a checkpoint written at
# dp 2 x pp 2 resumes on 1 rank, on sp 2 and on pp 2 x sp 2 and continues as
# the uninterrupted run (the resumed runs' first gradients equal too); bad pipelines fail
# on every rank before any work.
. "$TS_SRCDIR/tests/train/lib_train.sh"
ts_tmpdir pipeline
ts_synth 8 20 6
ts_ini p.ini model.norm=batch -model.groups model.sync_bn=true train.steps=3
dump_grads=yes # every equivalence is also checked on the first step's gradients, tensor by tensor
ts_step "initial weights" "$TESSERA" model init "$d/p.ini" --out "$d/init.h5" --seed 0
ts_step "initial weights (group norm)" "$TESSERA" model init "$d/p.ini" model.norm=group model.groups=2 --out "$d/init-gn.h5" \
    --seed 0
# one rank accumulating M micro-batches of 2 samples (batch norm per micro-batch)
run 1 one-m2 train.accum=2
run 1 one-m4 train.accum=4
run 1 one-m4-gn train.accum=4 model.norm=group model.groups=2
run 2 pp2-1f1b-m2 parallel.pp=2 parallel.microbatches=2 parallel.schedule=1f1b
pp2out=$ts_out
same one-m2 pp2-1f1b-m2
grads one-m2 pp2-1f1b-m2
run 2 pp2-gpipe-m2 parallel.pp=2 parallel.microbatches=2 parallel.schedule=gpipe
same one-m2 pp2-gpipe-m2
grads one-m2 pp2-gpipe-m2
run 2 pp2-1f1b-m4 parallel.pp=2 parallel.microbatches=4 parallel.schedule=1f1b parallel.pp_cut=enc2
same one-m4 pp2-1f1b-m4
grads one-m4 pp2-1f1b-m4
run 2 pp2-gpipe-m4 parallel.pp=2 parallel.microbatches=4 parallel.schedule=gpipe parallel.pp_cut=dec0.conv2
same one-m4 pp2-gpipe-m4
grads one-m4 pp2-gpipe-m4
run 3 pp3-m4 parallel.pp=3 parallel.microbatches=4
same one-m4 pp3-m4
grads one-m4 pp3-m4
run 3 pp3-skip parallel.pp=3 parallel.microbatches=4 parallel.pp_cut=enc1,dec1
same one-m4 pp3-skip
grads one-m4 pp3-skip
run 3 pp3-halves parallel.pp=3 parallel.microbatches=4 parallel.pp_cut=enc0.conv2,enc2.conv2 model.norm=group model.groups=2
same one-m4-gn pp3-halves init=init-gn.h5
grads one-m4-gn pp3-halves
export TESSERA_RANKS_PER_NODE=2
run 4 dp2pp2 parallel.pp=2 parallel.microbatches=2 train.batch=1
same one-m2 dp2pp2
grads one-m2 dp2pp2
unset TESSERA_RANKS_PER_NODE
run 4 pp2sp2 parallel.pp=2 parallel.sp=2 parallel.microbatches=2
same one-m2 pp2sp2
grads one-m2 pp2sp2
run 8 dp2pp2sp2 parallel.pp=2 parallel.sp=2 parallel.microbatches=2 train.batch=1
same one-m2 dp2pp2sp2
grads one-m2 dp2pp2sp2
ts_check "the cut and each stage's estimated time are printed" \
    sh -c "printf '%s\n' \"\$0\" | grep -q 'pipeline stage 1: .*estimated .* ms per micro-batch'" "$pp2out"
if [ -n "$TS_PY" ]; then
    ts_step "pipeline.json and perf.json: the cut, the stages' busy and idle time, the bubble next to (P-1)/(M+P-1)" \
        "$TS_PY" -c "
import json
c = json.load(open('$d/pp3-skip/pipeline.json')); p = json.load(open('$d/pp3-skip/perf.json'))
print(c); print(p['pipeline'])
assert [s['units'] for s in c['stage']] == ['enc0.conv1,enc0.conv2', 'enc1.conv1,enc1.conv2,enc2.conv1,enc2.conv2', 'dec1.conv1,dec1.conv2,dec0.conv1,dec0.conv2,head'] and abs(c['bubble_formula'] - 2 / 6) < 1e-5
st = p['pipeline']['stage']
assert len(st) == 3 and all(s['busy_s'] > 0 and s['span_s'] >= s['busy_s'] and 0 <= s['bubble'] < 1 for s in st)
assert abs(p['pipeline']['bubble_formula'] - 2 / 6) < 1e-5 and p['grid'] == {'dp': 1, 'pp': 3, 'sp': 1}"
fi

dump_grads=
# evaluation and inference through the stages
run 1 ev-1 eval.final=true eval.max_volumes=2
run 2 ev-pp2 eval.final=true eval.max_volumes=2 parallel.pp=2 parallel.microbatches=1 parallel.schedule=gpipe
if [ -n "$TS_PY" ]; then
    ts_step "evaluation through 2 stages: the Dice of 1 rank" "$TS_PY" -c "
import json
def dice(r): return [json.loads(l)['dice'] for l in open('$d/' + r + '/metrics.jsonl') if 'dice' in json.loads(l)]
a, b = dice('ev-1'), dice('ev-pp2'); print(a, b); assert len(a) == 1 and a == b"
    "$TS_PY" -c "
import h5py, nibabel as nib, numpy as np
x = np.asarray(h5py.File('$d/syn.h5', 'r')['samples/000002/image'])[0, 1:18, :20, :19].transpose(2, 1, 0)
nib.save(nib.Nifti1Image(x.astype(np.float32), np.diag([1.2, 0.9, 1.1, 1])), '$d/scan.nii.gz')"
    ts_step "infer, 1 rank" ts_mpirun 1 "$TESSERA" infer "$d/p.ini" checkpoint="$d/ev-1" input="$d/scan.nii.gz" \
        output="$d/m1.nii.gz"
    ts_step "infer through pp 2 x sp 2" ts_mpirun 4 "$TESSERA" infer "$d/p.ini" checkpoint="$d/ev-1" \
        input="$d/scan.nii.gz" output="$d/m4.nii.gz" parallel.pp=2 parallel.sp=2
    ts_step "the same mask" "$TS_PY" -c "
import nibabel as nib, numpy as np
a, b = (np.asarray(nib.load('$d/m%d.nii.gz' % k).dataobj) for k in (1, 4))
print(int((a != b).sum()), 'voxels differ; classes', np.unique(a)); assert (a == b).all() and len(np.unique(a)) > 1"
fi

# resharding: dp 2 x pp 2 for 2 steps, resumed elsewhere for 2 more, against 4 uninterrupted steps
# (the resumed runs start from the same checkpoint: their first step's, step 3's, gradients are compared too)
dump_grads=yes
run 4 rs-full parallel.pp=2 parallel.microbatches=2 train.batch=1 train.steps=4
run 4 rs-a parallel.pp=2 parallel.microbatches=2 train.batch=1 train.steps=2
run 1 rs-one train.accum=2 train.steps=4 ckpt.resume="$d/rs-a/ckpt/step-2"
same rs-full rs-one steps=4
run 2 rs-sp2 parallel.sp=2 train.accum=2 train.steps=4 ckpt.resume="$d/rs-a/ckpt/step-2"
same rs-full rs-sp2 steps=4
grads rs-one rs-sp2
run 4 rs-pp2sp2 parallel.pp=2 parallel.sp=2 parallel.microbatches=2 train.steps=4 ckpt.resume="$d/rs-a/ckpt/step-2"
same rs-full rs-pp2sp2 steps=4
grads rs-one rs-pp2sp2
dump_grads=

# bad pipelines: an error on every rank before any work
ts_fails_on_all "more stages than cut points" "layer units to cut between" 4 \
    ts_mpirun 4 "$TESSERA" train "$d/p.ini" run.dir="$d/e1" parallel.pp=4 parallel.microbatches=4 model.channels=4
ts_fails_on_all "fewer micro-batches than stages with 1f1b" "needs parallel.microbatches >= parallel.pp" 3 \
    ts_mpirun 3 "$TESSERA" train "$d/p.ini" run.dir="$d/e2" parallel.pp=3 parallel.microbatches=2
ts_fails_on_all "a grid that does not match the ranks" "does not divide the 4 ranks" 4 \
    ts_mpirun 4 "$TESSERA" train "$d/p.ini" run.dir="$d/e3" parallel.pp=3 parallel.microbatches=4
ts_fails_on_all "a cut naming no unit" "is not a unit of the model" 2 \
    ts_mpirun 2 "$TESSERA" train "$d/p.ini" run.dir="$d/e4" parallel.pp=2 parallel.microbatches=2 parallel.pp_cut=enc9
ts_fails_on_all "train.accum with a pipeline" "set parallel.microbatches = 2 instead" 2 \
    ts_mpirun 2 "$TESSERA" train "$d/p.ini" run.dir="$d/e5" parallel.pp=2 train.accum=2
ts_finish
