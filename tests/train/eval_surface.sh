#!/bin/sh
# Validation during training with nnU-Net's evaluation (issue [11]):
# eval.mirror = xyz and eval.surface = true give, at the end of training,
# the Dice (pooled over the volumes), HD95 and NSD (mean over the volumes)
# that `tessera infer mirror=xyz label=` gives with the same weights on the
# same scans, to 1e-6; also on a spatial group (parallel.sp = 2) and
# through 2 pipeline stages; metrics.jsonl holds them (null where not
# finite); without the keys the evaluation is the Dice of before, bit for
# bit; a bad eval.mirror is refused on every rank.
. "$TS_SRCDIR/tests/train/lib_train.sh"
if [ -z "$TS_PY" ]; then
    echo "1..0 # SKIP no python3 with h5py, nibabel and numpy"
    exit 0
fi
ts_tmpdir eval-surface

ts_step "3 scans with a zero background around an off-centre head, 3 classes" \
    "$TS_PY" "$TS_SRCDIR/tests/train/infer_prep.py" make "$d"
mkdir -p "$d/scans" "$d/labels"
for i in 0 1 2; do
    cp "$d/img$i.nii.gz" "$d/scans/s$i.nii.gz"
    cp "$d/lab$i.nii.gz" "$d/labels/s$i.nii.gz"
done
pairs="--image $d/img0.nii.gz --label $d/lab0.nii.gz --image $d/img1.nii.gz --label $d/lab1.nii.gz
       --image $d/img2.nii.gz --label $d/lab2.nii.gz"
# shellcheck disable=SC2086
ts_step "convert them" ts_mpirun 1 "$TESSERA" convert nifti $pairs --out "$d/s.h5"
# the dataset converted above, named in the config
ts_ini e.ini model.channels=4,8 model.norm=instance -model.groups data.path="$d/s.h5" data.patch=12 train.batch=1 \
    train.steps=40 train.loss=ce -train.log_every eval.final=true
# no validation split: the evaluation runs over the 3 training volumes
check() { # RUN_DIR PRED_DIR: the run's last eval line = infer's metrics (Dice pooled over the scans' voxels,
          # HD95 and NSD the means over the scans)
    "$TS_PY" -c "
import json
import nibabel as nib, numpy as np
ev = [json.loads(l) for l in open('$1/metrics.jsonl') if 'dice' in l][-1]
m = json.load(open('$2/metrics.json'))
K = 3
tp = np.zeros(K); fp = np.zeros(K); fn = np.zeros(K)
for s in m['scans']:
    p = np.asarray(nib.load(s['output']).dataobj); r = np.asarray(nib.load(s['label']).dataobj)
    for k in range(K):
        tp[k] += ((p == k) & (r == k)).sum(); fp[k] += ((p == k) & (r != k)).sum(); fn[k] += ((p != k) & (r == k)).sum()
dice = [2 * tp[k] / (2 * tp[k] + fp[k] + fn[k]) if tp[k] + fp[k] + fn[k] else -1 for k in range(K)]
def same(a, b):
    return (a is None and b is None) or (a is not None and b is not None and abs(a - b) <= 1e-6 * max(1, abs(b)))
print('training eval: dice', ev['dice'], 'hd95', ev['hd95_mm'], 'nsd', ev['nsd'])
print('infer:         dice', dice, 'hd95', m['summary']['hd95_mm']['mean'], 'nsd', m['summary']['nsd']['mean'])
assert all(abs(a - b) <= 1e-6 for a, b in zip(ev['dice'], dice)), 'Dice'
assert all(same(a, b) for a, b in zip(ev['hd95_mm'], m['summary']['hd95_mm']['mean'])), 'HD95'
assert all(same(a, b) for a, b in zip(ev['nsd'], m['summary']['nsd']['mean'])), 'NSD'
assert any(v is not None and v > 0 for v in ev['hd95_mm'][1:]), 'no finite HD95: nothing compared'
"
}
layout() { # NAME WHAT SETTINGS...: train with them, infer with its weights, compare
    name=$1 what=$2
    shift 2
    ts_step "train 40 steps on 2 ranks ($what) with eval.mirror = xyz, eval.surface = true" \
        ts_mpirun 2 "$TESSERA" train "$d/e.ini" run.dir="$d/$name" eval.mirror=xyz eval.surface=true "$@"
    printf '%s\n' "$ts_out" | grep "eval at step" | sed 's/^/# /'
    ts_check "$what: the eval line prints HD95 and NSD of the foreground classes" sh -c \
        "printf '%s\n' \"\$1\" | grep -Eq 'eval at step 40: Dice .*; HD95 mm [0-9.-]+ [0-9.-]+; NSD [0-9.-]+ [0-9.-]+'" \
        sh "$ts_out"
    ts_step "$what: infer the 3 scans with its final weights, mirror=xyz, label=" \
        ts_mpirun 2 "$TESSERA" infer "$d/e.ini" checkpoint="$d/$name" output="$d/$name-pred" mirror=xyz \
        input="$d/scans" label="$d/labels"
    ts_step "$what: metrics.jsonl's Dice, HD95 and NSD = infer's on the same scans (1e-6)" \
        check "$d/$name" "$d/$name-pred"
}
layout run "data parallel"
layout sp "a spatial group, parallel.sp = 2" parallel.sp=2
layout pp "2 pipeline stages, parallel.pp = 2" parallel.pp=2 parallel.schedule=gpipe
ts_step "without eval.mirror and eval.surface" \
    ts_mpirun 2 "$TESSERA" train "$d/e.ini" run.dir="$d/plain"
ts_check "its eval line has no HD95, its metrics no hd95_mm, and its Dice differs from the mirrored one" "$TS_PY" -c "
import json
a = [json.loads(l) for l in open('$d/plain/metrics.jsonl') if 'dice' in l][-1]
b = [json.loads(l) for l in open('$d/run/metrics.jsonl') if 'dice' in l][-1]
assert 'hd95_mm' not in a and 'nsd' not in a and a['dice'] != b['dice'], (a, b)"
ts_fails_on_all "eval.mirror = xq refused on every rank" "eval.mirror" 2 \
    ts_mpirun 2 "$TESSERA" train "$d/e.ini" run.dir="$d/bad" eval.mirror=xq
ts_finish
