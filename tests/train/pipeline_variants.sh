#!/bin/sh
# Pipeline parallelism with nnU-Net's model variants: the residual encoder
# (model.arch = resenc: each level cut into two units, the stem and blocks
# but the last, then the last block), deep supervision (the heads ds{l}'s
# logits travel to the last stage, where every loss term is computed, and
# their gradients back) and both train on pp = 2 (gpipe and 1f1b, the auto
# cut and cuts inside the encoder and between a ds{l} head and the loss),
# pp = 3, pp = 4, pp 2 x sp 2 and dp 2 x pp 2 to the per-step losses, the
# weights and the first step's gradients (tensor by tensor) of one rank
# accumulating the same micro-batches, for instance
# and batch norm; training moved the weights; evaluation through the stages
# gives the Dice of one rank. Activation checkpointing of the variants, with
# pipeline stages too: tests/train/act_checkpoint.sh.
. "$TS_SRCDIR/tests/train/lib_train.sh"
ts_tmpdir ppvariants
ts_synth 8 16 5
# 4 levels (deep supervision needs them); level 1 has one residual block, so its enc1.conv1 unit is empty
ts_ini v.ini model.channels=4,8,8,16 -model.norm -model.groups model.act=leaky_relu model.res_blocks=1,1,2,2 \
    train.steps=3
dump_grads=yes # every equivalence is also checked on the first step's gradients, tensor by tensor
for v in resenc ds resenc-ds; do
    case $v in
    resenc) a="model.arch=resenc" cut=enc2.conv2 ;;
    ds) a="model.deep_supervision=true" cut=dec0.conv1 ;;
    resenc-ds) a="model.arch=resenc model.deep_supervision=true" cut=enc1.conv2 ;;
    esac
    for norm in instance batch; do
        k=$v-$norm
        # shellcheck disable=SC2086
        ts_step "$k: initial weights" "$TESSERA" model init "$d/v.ini" $a model.norm=$norm --out "$d/init-$k.h5" --seed 0
        same_init=init-$k.h5
        # shellcheck disable=SC2086
        run 1 "$k-1" $a model.norm=$norm train.accum=2
        # shellcheck disable=SC2086
        run 2 "$k-pp2-1f1b" $a model.norm=$norm parallel.pp=2 parallel.microbatches=2 parallel.schedule=1f1b
        same "$k-1" "$k-pp2-1f1b"
        grads "$k-1" "$k-pp2-1f1b"
        # shellcheck disable=SC2086
        run 2 "$k-pp2-gpipe" $a model.norm=$norm parallel.pp=2 parallel.microbatches=2 parallel.schedule=gpipe \
            parallel.pp_cut=$cut
        same "$k-1" "$k-pp2-gpipe"
        grads "$k-1" "$k-pp2-gpipe"
    done
done
# cuts inside the residual encoder's levels (after the stem, before a level's last block, around the
# empty enc1.conv1) and between the ds1 head and the loss; 3 and 4 stages
run 1 resenc-ds-instance-m4 model.arch=resenc model.deep_supervision=true model.norm=instance train.accum=4
run 3 resenc-ds-pp3 model.arch=resenc model.deep_supervision=true model.norm=instance parallel.pp=3 \
    parallel.microbatches=4 parallel.schedule=1f1b parallel.pp_cut=enc0.conv2,dec0.conv1
same resenc-ds-instance-m4 resenc-ds-pp3 init=init-resenc-ds-instance.h5
grads resenc-ds-instance-m4 resenc-ds-pp3
run 4 resenc-ds-pp4 model.arch=resenc model.deep_supervision=true model.norm=instance parallel.pp=4 \
    parallel.microbatches=4 parallel.schedule=gpipe parallel.pp_cut=enc1.conv1,enc3.conv2,dec1.conv2
same resenc-ds-instance-m4 resenc-ds-pp4 init=init-resenc-ds-instance.h5
grads resenc-ds-instance-m4 resenc-ds-pp4
run 4 resenc-ds-pp4-1f1b model.arch=resenc model.deep_supervision=true model.norm=instance parallel.pp=4 \
    parallel.microbatches=4 parallel.schedule=1f1b parallel.pp_cut=enc2.conv2,dec1.conv1,dec0.conv2
same resenc-ds-instance-m4 resenc-ds-pp4-1f1b init=init-resenc-ds-instance.h5
grads resenc-ds-instance-m4 resenc-ds-pp4-1f1b
# stages over spatial splits (the strided convs' halos inside a stage) and replicas of pipelines
run 4 resenc-ds-pp2sp2 model.arch=resenc model.deep_supervision=true model.norm=instance parallel.pp=2 \
    parallel.sp=2 parallel.microbatches=2 parallel.pp_cut=enc2.conv2
same resenc-ds-instance-1 resenc-ds-pp2sp2 init=init-resenc-ds-instance.h5
grads resenc-ds-instance-1 resenc-ds-pp2sp2
export TESSERA_RANKS_PER_NODE=2 # two fake nodes of two ranks
run 4 resenc-ds-dp2pp2 model.arch=resenc model.deep_supervision=true model.norm=batch model.sync_bn=true \
    parallel.pp=2 parallel.microbatches=2 train.batch=1 parallel.pp_cut=dec0.conv1
unset TESSERA_RANKS_PER_NODE
same resenc-ds-batch-1 resenc-ds-dp2pp2 init=init-resenc-ds-batch.h5
grads resenc-ds-batch-1 resenc-ds-dp2pp2
dump_grads=

# the final evaluation through the stages (level-0 head) gives the Dice of one rank
run 1 ev-1 model.arch=resenc model.deep_supervision=true eval.final=true eval.max_volumes=2
run 2 ev-pp2 model.arch=resenc model.deep_supervision=true eval.final=true eval.max_volumes=2 parallel.pp=2 \
    parallel.microbatches=1 parallel.schedule=gpipe
if [ -n "$TS_PY" ]; then
    ts_step "resenc-ds: evaluation through 2 stages gives the Dice of 1 rank" "$TS_PY" -c "
import json
def dice(r): return [json.loads(l)['dice'] for l in open('$d/' + r + '/metrics.jsonl') if 'dice' in json.loads(l)]
a, b = dice('ev-1'), dice('ev-pp2'); print(a, b); assert len(a) == 1 and a == b"
else
    ts_skip "resenc-ds: evaluation through 2 stages" "no python3 with h5py"
fi
ts_finish
