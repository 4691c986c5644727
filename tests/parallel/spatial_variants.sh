#!/bin/sh
# Spatial parallelism with nnU-Net's model variants: the residual encoder
# (model.arch = resenc: stem, residual blocks, stride-2 3x3x3 convs and
# 1x1x1 strided skips), deep supervision (1x1x1 heads ds{l} with their
# losses against the labels sampled per box) and both train on sp = 2,
# sp = 4 (2,2,1 and 1,2,2: D, H and W faces, edges), sp = 8 (2,2,2:
# corners) and dp 2 x sp 2 to the per-step losses and the weights of one
# rank, for instance and batch norm; training moved the weights; the final
# evaluation with sp = 2 gives the Dice of sp = 1 (pipeline stages, also
# over spatial splits: tests/train/pipeline_variants.sh).
. "$TS_SRCDIR/tests/mpi/lib.sh"
. "$TS_SRCDIR/tests/io/lib_io.sh"
TESSERA="$TS_BUILDDIR/tessera"
export TESSERA_EXIT_GRACE=20 OMP_NUM_THREADS=1
unset TESSERA_FAULT TESSERA_RANKS_PER_NODE
d=$(mktemp -d "${TMPDIR:-/tmp}/tessera-spvariants.XXXXXX")
trap 'rm -rf "$d"' EXIT

ts_step "synthetic dataset: 4 samples of 20^3, 3 classes" \
    ts_mpirun 2 "$TESSERA" synth --out "$d/syn.h5" --count 4 --size 20 --classes 3 --seed 5
# 4 levels (deep supervision needs them): boxes are multiples of 2^3 = 8 voxels per edge
cat >"$d/v.ini" <<'INI'
[model]
channels = 4,8,8,16
classes = 3
act = leaky_relu
res_blocks = 1,2,2,1
[data]
patch = 16
[train]
batch = 2
steps = 3
lr = 0.05
momentum = 0.9
loss = ce+dice
deterministic = true
log_every = 1
[eval]
final = false
INI
ini=$d/v.ini
. "$TS_SRCDIR/tests/train/lib_train.sh"
for v in resenc ds resenc-ds; do
    case $v in
    resenc) a="model.arch=resenc" ;;
    ds) a="model.deep_supervision=true" ;;
    resenc-ds) a="model.arch=resenc model.deep_supervision=true" ;;
    esac
    for norm in instance batch; do
        k=$v-$norm
        # shellcheck disable=SC2086
        ts_step "$k: initial weights" "$TESSERA" model init "$d/v.ini" $a model.norm=$norm --out "$d/init-$k.h5" --seed 0
        # shellcheck disable=SC2086
        run 1 "$k-1" $a model.norm=$norm
        # shellcheck disable=SC2086
        run 2 "$k-sp2" $a model.norm=$norm parallel.sp=2
        same "$k-1" "$k-sp2" "$k"
        # shellcheck disable=SC2086
        run 4 "$k-sp221" $a model.norm=$norm parallel.sp=4 parallel.sp_dims=2,2,1
        same "$k-1" "$k-sp221" "$k"
    done
done
# H and W split (W faces), all three (corners), and replicas of split samples
# shellcheck disable=SC2086
run 4 resenc-ds-instance-sp122 model.arch=resenc model.deep_supervision=true model.norm=instance parallel.sp=4 \
    parallel.sp_dims=1,2,2
same resenc-ds-instance-1 resenc-ds-instance-sp122 resenc-ds-instance
run 8 resenc-ds-batch-sp222 model.arch=resenc model.deep_supervision=true model.norm=batch parallel.sp=8 \
    parallel.sp_dims=2,2,2
same resenc-ds-batch-1 resenc-ds-batch-sp222 resenc-ds-batch
export TESSERA_RANKS_PER_NODE=2 # two fake nodes of two ranks
run 4 resenc-ds-batch-dp2sp2 model.arch=resenc model.deep_supervision=true model.norm=batch parallel.sp=2 \
    train.batch=1 model.sync_bn=true
unset TESSERA_RANKS_PER_NODE
same resenc-ds-batch-1 resenc-ds-batch-dp2sp2 resenc-ds-batch

# the final evaluation (level-0 head, windows split over the group) gives the Dice of one rank
run 1 ev-1 model.arch=resenc model.deep_supervision=true eval.final=true eval.max_volumes=2
run 2 ev-sp2 model.arch=resenc model.deep_supervision=true eval.final=true eval.max_volumes=2 parallel.sp=2
if [ -n "$TS_PY" ]; then
    ts_step "resenc-ds: evaluation with sp = 2 gives the Dice of sp = 1 (within 1e-6)" "$TS_PY" -c "
import json
def dice(r): return [json.loads(l)['dice'] for l in open('$d/' + r + '/metrics.jsonl') if 'dice' in json.loads(l)]
a, b = dice('ev-1'), dice('ev-sp2'); print(a, b); assert len(a) == 1 and len(b) == 1
assert all(abs(x - y) <= 1e-6 for x, y in zip(a[0], b[0])) and len(a[0]) == len(b[0])"
else
    ts_skip "resenc-ds: evaluation with sp = 2" "no python3 with h5py"
fi

ts_finish
