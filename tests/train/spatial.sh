#!/bin/sh
# Spatial parallelism end to end (issue [5] acceptance 1, 2, 4, 5): training
# on sp = 2, sp = 4 (4,1,1 and 2,2,1) and dp 2 x sp 2 gives the weights,
# the per-step losses and the first step's gradients (tensor by tensor,
# tests/train/lib_grads.sh) of one rank, for batch (synchronised), group and
# instance norm, with augmentation on; the layout is printed and written;
# evaluation and `tessera infer` with sp = 2 give the masks and Dice of
# sp = 1; activation memory per rank with sp = 4 at 128^3 against sp = 1;
# run.mem_limit_mb refuses a 192^3 patch on one rank and trains it with
# sp = 4 under the same limit; bad grids fail on every rank before any work.
. "$TS_SRCDIR/tests/train/lib_train.sh"
ts_tmpdir spatial
ts_synth 4 20 5
ts_ini s.ini -model.norm train.steps=3
dump_grads=yes # every equivalence is also checked on the first step's gradients, tensor by tensor
for norm in batch group instance; do
    ts_step "initial weights ($norm norm)" "$TESSERA" model init "$d/s.ini" model.norm=$norm --out "$d/init-$norm.h5" --seed 0
    same_init=init-$norm.h5
    run 1 "$norm-1" model.norm=$norm
    run 2 "$norm-sp2" model.norm=$norm parallel.sp=2
    same "$norm-1" "$norm-sp2"
    grads "$norm-1" "$norm-sp2"
    run 4 "$norm-sp4" model.norm=$norm parallel.sp=4 parallel.sp_dims=4,1,1
    same "$norm-1" "$norm-sp4"
    grads "$norm-1" "$norm-sp4"
    run 4 "$norm-sp22" model.norm=$norm parallel.sp=4 parallel.sp_dims=2,2,1
    same "$norm-1" "$norm-sp22"
    grads "$norm-1" "$norm-sp22"
    case $norm in # height and width split (W faces); all three (edges and corners) on 8 ranks
    batch) run 4 "$norm-sp122" model.norm=$norm parallel.sp=4 parallel.sp_dims=1,2,2
           same "$norm-1" "$norm-sp122"
           grads "$norm-1" "$norm-sp122" ;;
    group) run 8 "$norm-sp222" model.norm=$norm parallel.sp=8 parallel.sp_dims=2,2,2
           same "$norm-1" "$norm-sp222"
           grads "$norm-1" "$norm-sp222" ;;
    esac
    export TESSERA_RANKS_PER_NODE=2 # two fake nodes of two ranks
    run 4 "$norm-dp2sp2" model.norm=$norm parallel.sp=2 train.batch=1 model.sync_bn=true
    unset TESSERA_RANKS_PER_NODE
    dp2out=$ts_out
    same "$norm-1" "$norm-dp2sp2"
    grads "$norm-1" "$norm-dp2sp2"
done
dump_grads=
# the layout: printed at start, written to the run directory
ts_check "layout printed: dp 2 x pp 1 x sp 2 on 2 (fake) nodes, spatial groups within one node" \
    sh -c "printf '%s\n' \"\$0\" | grep -q 'dp 2 x pp 1 x sp 2 on 2 nodes (spatial groups are consecutive ranks, each within one node'" "$dp2out"
if [ -n "$TS_PY" ]; then
    ts_step "grid.json: 4 ranks on 2 nodes, sp 2 as 2x1x1, boxes of 8x16x16 at depth 0 and 8" "$TS_PY" -c "
import json; g = json.load(open('$d/instance-dp2sp2/grid.json'))
print(g['grid'], g['sp_dims'], [(r['node'], r['d'], r['s'], r['box_lo'], r['box_size']) for r in g['rank']])
assert g['grid'] == {'dp': 2, 'pp': 1, 'sp': 2} and g['sp_dims'] == [2, 1, 1] and g['nodes'] == 2 and g['sp_within_node']
assert [r['box_lo'][0] for r in g['rank']] == [0, 8, 0, 8] and all(r['box_size'] == [8, 16, 16] for r in g['rank'])
assert [r['node'] for r in g['rank']] == [0, 0, 1, 1] and [r['d'] for r in g['rank']] == [0, 0, 1, 1]"
    ts_step "perf.json: halo exchange measured (exposed and hidden time, bytes), box and grid" "$TS_PY" -c "
import json; p = json.load(open('$d/batch-sp4/perf.json')); h = p['halo']
print(p['grid'], p['box'], h)
assert p['grid']['sp'] == 4 and p['box'] == [4, 16, 16] and h['bytes'] > 0 and h['exposed_s'] + h['hidden_s'] > 0"
fi

# evaluation and inference on the split give the masks of one rank
run 1 ev-1 eval.final=true eval.max_volumes=2
run 2 ev-sp2 eval.final=true eval.max_volumes=2 parallel.sp=2
if [ -n "$TS_PY" ]; then
    ts_step "evaluation with sp = 2: the Dice of sp = 1" "$TS_PY" -c "
import json
def dice(r): return [json.loads(l)['dice'] for l in open('$d/' + r + '/metrics.jsonl') if 'dice' in json.loads(l)]
a, b = dice('ev-1'), dice('ev-sp2'); print(a, b); assert len(a) == 1 and a == b"
    # the scan: a phantom (sample 1 of the dataset, D x H x W -> NIfTI's x, y, z), cropped to 19x20x17
    "$TS_PY" -c "
import h5py, nibabel as nib, numpy as np
x = np.asarray(h5py.File('$d/syn.h5', 'r')['samples/000001/image'])[0, 1:18, :20, :19].transpose(2, 1, 0)
nib.save(nib.Nifti1Image(x.astype(np.float32), np.diag([1.2, 0.9, 1.1, 1])), '$d/scan.nii.gz')"
    ts_step "infer, 1 rank" ts_mpirun 1 "$TESSERA" infer "$d/s.ini" checkpoint="$d/ev-1" input="$d/scan.nii.gz" \
        output="$d/m1.nii.gz" probabilities="$d/p1.nii.gz"
    ts_step "infer, sp = 2" ts_mpirun 2 "$TESSERA" infer "$d/s.ini" checkpoint="$d/ev-1" input="$d/scan.nii.gz" \
        output="$d/m2.nii.gz" parallel.sp=2
    ts_step "infer, dp 2 x sp 2 (2,1,1)" ts_mpirun 4 "$TESSERA" infer "$d/s.ini" checkpoint="$d/ev-1" \
        input="$d/scan.nii.gz" output="$d/m4.nii.gz" parallel.sp=2
    ts_step "the masks of sp = 2 and dp 2 x sp 2 are those of one rank but at ties (top two classes within 1e-5)" "$TS_PY" -c "
import nibabel as nib, numpy as np
m = [np.asarray(nib.load('$d/m%d.nii.gz' % k).dataobj) for k in (1, 2, 4)]
p = np.sort(np.asarray(nib.load('$d/p1.nii.gz').dataobj), axis=-1)
tie = p[..., -1] - p[..., -2] <= 1e-5
print([int((x != m[0]).sum()) for x in m], 'voxels differ of', m[0].size, '(near ties:', int(tie.sum()), '); classes',
      np.unique(m[0]), '; probabilities sum to 1:', float(np.abs(p.sum(-1) - 1).max()))
assert p.shape == m[0].shape + (3,) and np.abs(p.sum(-1) - 1).max() < 1e-5
assert all(((x == m[0]) | tie).all() for x in m) and len(np.unique(m[0])) > 1"
else
    ts_skip "evaluation and inference on the split" "no python3 with h5py and nibabel"
fi

# memory: activations and gradients per rank at 128^3, batch 1
cat >"$d/m.ini" <<'INI'
[model]
channels = 16,32,64,128
classes = 4
[data]
patch = 128
[train]
batch = 1
INI
ts_step "bench step, 128^3, sp = 1" ts_mpirun 1 "$TESSERA" bench step "$d/m.ini" --steps 1 --warmup 0 --json "$d/b1.json"
ts_step "bench step, 128^3, sp = 4" ts_mpirun 4 "$TESSERA" bench step "$d/m.ini" parallel.sp=4 --steps 1 --warmup 0 \
    --json "$d/b4.json"
if [ -n "$TS_PY" ]; then
    ts_step "activation + gradient bytes per rank with sp = 4 <= 0.35 x sp = 1; the JSON names the grid" "$TS_PY" -c "
import json; a, b = json.load(open('$d/b1.json')), json.load(open('$d/b4.json'))
r = b['act_bytes'] / a['act_bytes']; print('sp=1 %.0f MiB, sp=4 %.0f MiB per rank: %.3f' % (a['act_bytes'] / 2**20, b['act_bytes'] / 2**20, r))
assert b['grid'] == {'dp': 1, 'pp': 1, 'sp': 4} and b['sp_dims'] == [4, 1, 1] and b['box'] == [32, 128, 128]
assert a['grid'] == {'dp': 1, 'pp': 1, 'sp': 1} and r <= 0.35"
fi
# run.mem_limit_mb: 192^3 over the limit on one rank, under it with sp = 4
cat >"$d/big.ini" <<'INI'
[model]
channels = 4,8
classes = 2
[data]
patch = 192
[train]
batch = 1
steps = 2
[eval]
final = false
[run]
mem_limit_mb = 700
INI
ts_fails_on_all "192^3 on one rank over run.mem_limit_mb = 700: refused at start, naming the estimate and a parallel.sp" \
    "parallel.sp = " 1 ts_mpirun 1 "$TESSERA" train "$d/big.ini" run.dir="$d/big1"
ts_check "... and the message gives the estimate" sh -c "printf '%s\n' \"\$0\" | grep -q 'run.mem_limit_mb = 700: this configuration needs about'" "$ts_out"
ts_step "192^3 with sp = 4 under the same limit trains" ts_mpirun 4 "$TESSERA" train "$d/big.ini" run.dir="$d/big4" \
    parallel.sp=4
if [ -n "$TS_PY" ]; then
    ts_step "... and no rank's peak resident memory exceeded the limit" "$TS_PY" -c "
import json; m = json.load(open('$d/big4/perf.json'))['memory']; print(m)
assert m['peak_rss_mb'] <= 700 and m['plan_mb'] <= 700 and m['limit_mb'] == 700"
fi

# bad grids: an error on every rank before any work
ts_fails_on_all "a patch that does not split evenly at every level" "does not split evenly at every level" 2 \
    ts_mpirun 2 "$TESSERA" train "$d/s.ini" run.dir="$d/e1" parallel.sp=2 parallel.sp_dims=2,1,1 data.patch=12,16,16
ts_fails_on_all "sp x dp not the number of ranks" "but the job has 4 ranks" 4 \
    ts_mpirun 4 "$TESSERA" train "$d/s.ini" run.dir="$d/e2" parallel.sp=2 parallel.dp=3
ts_fails_on_all "sp_dims whose product is not sp" "but parallel.sp = 2" 2 \
    ts_mpirun 2 "$TESSERA" train "$d/s.ini" run.dir="$d/e3" parallel.sp=2 parallel.sp_dims=2,2,1
ts_fails_on_all "a local box smaller than a level's halo" "smaller than a level's halo" 4 \
    ts_mpirun 4 "$TESSERA" train "$d/s.ini" run.dir="$d/e4" parallel.sp=4 parallel.sp_dims=4,1,1 model.channels=4,8,16,32
ts_fails_on_all "bench step refuses the grids train refuses" "but parallel.sp = 2" 2 \
    ts_mpirun 2 "$TESSERA" bench step "$d/s.ini" parallel.sp=2 parallel.sp_dims=1,1,1
ts_finish
