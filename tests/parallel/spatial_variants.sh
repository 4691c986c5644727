#!/bin/sh
# Spatial parallelism with nnU-Net's model variants: the residual encoder
# (model.arch = resenc: stem, residual blocks, stride-2 3x3x3 convs and
# 1x1x1 strided skips), deep supervision (1x1x1 heads ds{l} with their
# losses against the labels sampled per box) and both train on sp = 2,
# sp = 4 (2,2,1 and 1,2,2: D, H and W faces, edges), sp = 8 (2,2,2:
# corners) and dp 2 x sp 2 to the per-step losses, the weights and the
# first step's gradients (tensor by tensor) of one rank, for instance and
# batch norm; training moved the weights; the final
# evaluation with sp = 2 gives the Dice of sp = 1 (pipeline stages, also
# over spatial splits: tests/train/pipeline_variants.sh).
. "$TS_SRCDIR/tests/train/lib_train.sh"
ts_tmpdir spvariants
ts_synth 4 20 5
# 4 levels (deep supervision needs them): boxes are multiples of 2^3 = 8 voxels per edge
ts_ini v.ini model.channels=4,8,8,16 -model.norm -model.groups model.act=leaky_relu model.res_blocks=1,2,2,1 \
    train.steps=3
dump_grads=yes # every equivalence is also checked on the first step's gradients, tensor by tensor
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
        same_init=init-$k.h5
        # shellcheck disable=SC2086
        run 1 "$k-1" $a model.norm=$norm
        # shellcheck disable=SC2086
        run 2 "$k-sp2" $a model.norm=$norm parallel.sp=2
        same "$k-1" "$k-sp2"
        grads "$k-1" "$k-sp2"
        # shellcheck disable=SC2086
        run 4 "$k-sp221" $a model.norm=$norm parallel.sp=4 parallel.sp_dims=2,2,1
        same "$k-1" "$k-sp221"
        grads "$k-1" "$k-sp221"
    done
done
# H and W split (W faces), all three (corners), and replicas of split samples
# shellcheck disable=SC2086
run 4 resenc-ds-instance-sp122 model.arch=resenc model.deep_supervision=true model.norm=instance parallel.sp=4 \
    parallel.sp_dims=1,2,2
same resenc-ds-instance-1 resenc-ds-instance-sp122 init=init-resenc-ds-instance.h5
grads resenc-ds-instance-1 resenc-ds-instance-sp122
run 8 resenc-ds-batch-sp222 model.arch=resenc model.deep_supervision=true model.norm=batch parallel.sp=8 \
    parallel.sp_dims=2,2,2
same resenc-ds-batch-1 resenc-ds-batch-sp222 init=init-resenc-ds-batch.h5
grads resenc-ds-batch-1 resenc-ds-batch-sp222
export TESSERA_RANKS_PER_NODE=2 # two fake nodes of two ranks
run 4 resenc-ds-batch-dp2sp2 model.arch=resenc model.deep_supervision=true model.norm=batch parallel.sp=2 \
    train.batch=1 model.sync_bn=true
unset TESSERA_RANKS_PER_NODE
same resenc-ds-batch-1 resenc-ds-batch-dp2sp2 init=init-resenc-ds-batch.h5
grads resenc-ds-batch-1 resenc-ds-batch-dp2sp2
dump_grads=

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
