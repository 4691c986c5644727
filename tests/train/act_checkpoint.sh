#!/bin/sh
# Activation checkpointing (model.checkpoint_levels; issue [9]) end to end:
# training with levels recomputed gives bit-identical losses, weights and
# first-step gradients to training without (and the weights moved), on 1 rank (batch and group
# norm; train.precision bf16 and fp16), on dp = 2 x sp = 2 (batch norm: the
# recomputation exchanges the halos and sums the statistics over the
# spatial group again) and on
# dp = 2 x pp = 2 (1F1B, the cut inside a checkpointed level); `bench step
# --compare-checkpoint` on sp = 2 finds bit-identical gradients and less
# activation memory; so do deep supervision (1 rank, fp32 and bf16,
# dp 2 x sp 2, dp 2 x pp 2) and the residual encoder (1 rank with batch
# norm and fp16, dp 2 x sp 2, dp 2 x pp 2 cut inside a checkpointed
# level); bad level lists (out of range, duplicate, not a number) fail on
# every rank naming the key, before any work.
. "$TS_SRCDIR/tests/train/lib_train.sh"
ts_tmpdir actckpt
ts_synth 4 20 5
ts_ini a.ini -model.norm train.steps=3
same_loss=0 same_weights=0 # bit-identical
# and the first step's gradients of every run with checkpointing bit-identical to those of the run without
dump_grads=yes grad_bound=0
for norm in batch group; do
    ts_step "initial weights ($norm norm)" "$TESSERA" model init "$d/a.ini" model.norm=$norm --out "$d/init-$norm.h5" --seed 0
    run 1 "$norm-1" model.norm=$norm
    run 1 "$norm-1-ck01" model.norm=$norm model.checkpoint_levels=0,1
    ts_check "the start line names the checkpointed levels" \
        sh -c "printf '%s\n' \"\$0\" | grep -q 'activation checkpointing: levels 0,1 recomputed in backward'" "$ts_out"
    same "$norm-1" "$norm-1-ck01" init="init-$norm.h5"
    grads "$norm-1" "$norm-1-ck01"
done
# mixed precision: the recomputation uses the same low-precision convolutions (fp16: with loss scaling)
for prec in bf16 fp16; do
    run 1 "$prec-1" train.precision=$prec
    run 1 "$prec-1-ck01" train.precision=$prec model.checkpoint_levels=0,1
    same "$prec-1" "$prec-1-ck01" init=init-batch.h5
    grads "$prec-1" "$prec-1-ck01"
done
# dp = 2 x sp = 2: every level recomputed
run 4 dp2sp2 parallel.dp=2 parallel.sp=2
run 4 dp2sp2-ckall parallel.dp=2 parallel.sp=2 model.checkpoint_levels=all
same dp2sp2 dp2sp2-ckall init=init-batch.h5
grads dp2sp2 dp2sp2-ckall
# dp = 2 x pp = 2, 1F1B: the cut between enc1's convolutions, inside checkpointed level 1 (its first norm's
# output leaves stage 0); both stages recompute levels while other micro-batches are in flight
pp="parallel.dp=2 parallel.pp=2 parallel.microbatches=2 parallel.schedule=1f1b parallel.pp_cut=enc1.conv2"
run 4 dp2pp2 $pp
run 4 dp2pp2-ck01 $pp model.checkpoint_levels=0,1
same dp2pp2 dp2pp2-ck01 init=init-batch.h5
grads dp2pp2 dp2pp2-ck01
# the benchmark's side-by-side comparison on a spatial split
# compare NP NAME LEVELS WHAT ARGS...: `bench step --compare-checkpoint LEVELS` (32^3, 1 step) on NP ranks: the
# report says bit-identical, and its JSON has less than 0.8 of the activations without, equal to the memory plan
compare() {
    _np=$1 _name=$2 _lv=$3 _what=$4
    shift 4
    ts_step "bench step --compare-checkpoint $_lv, $_what: gradients bit-identical" \
        ts_mpirun "$_np" "$TESSERA" bench step "$d/a.ini" "$@" data.patch=32 --compare-checkpoint "$_lv" --steps 1 \
        --warmup 0 --rounds 1 --json "$d/$_name.json"
    ts_check "$_what: its report says bit-identical" \
        sh -c "printf '%s\n' \"\$0\" | grep -q 'same weights bit-identical'" "$ts_out"
    if [ -n "$TS_PY" ]; then
        ts_step "$_what: activations with levels $_lv below those without, as the memory plan says" "$TS_PY" -c "
import json; c = json.load(open('$d/$_name.json'))['checkpoint_compare']
print(c['levels_a'], c['act_bytes_a'], c['levels_b'], c['act_bytes_b'], c['act_reduction'])
assert c['levels_a'] == 'none' and c['levels_b'] == '$_lv' and c['grads_identical']
assert c['act_bytes_b'] < 0.8 * c['act_bytes_a']
assert c['plan_bytes_a'] == c['act_bytes_a'] and c['plan_bytes_b'] == c['act_bytes_b']"
    else
        ts_skip "$_what: bench step JSON" "no python3"
    fi
}
compare 2 cmp 0,1 "plain UNet3D on sp = 2" parallel.sp=2
# deep supervision (nnU-Net's instance norm and leaky ReLU, 4 levels): its heads read the decoder blocks'
# outputs, which checkpointing keeps; bit-identical on 1 rank (fp32, bf16), dp 2 x sp 2 and dp 2 x pp 2
ds="model.deep_supervision=true model.channels=4,8,16,32 model.norm=instance model.act=leaky_relu"
# shellcheck disable=SC2086
ts_step "initial weights (deep supervision)" "$TESSERA" model init "$d/a.ini" $ds --out "$d/init-ds.h5" --seed 0
for prec in fp32 bf16; do
    # shellcheck disable=SC2086
    run 1 "ds-$prec" $ds train.precision=$prec
    # shellcheck disable=SC2086
    run 1 "ds-$prec-ck" $ds train.precision=$prec model.checkpoint_levels=0,1,2
    same "ds-$prec" "ds-$prec-ck" init=init-ds.h5
    grads "ds-$prec" "ds-$prec-ck"
done
# shellcheck disable=SC2086
run 4 ds-sp $ds parallel.sp=2
# shellcheck disable=SC2086
run 4 ds-sp-ck $ds parallel.sp=2 model.checkpoint_levels=all
same ds-sp ds-sp-ck init=init-ds.h5
grads ds-sp ds-sp-ck
# shellcheck disable=SC2086
run 4 ds-pp $ds parallel.pp=2 parallel.microbatches=2 train.batch=1 parallel.pp_cut=dec1.conv2
# shellcheck disable=SC2086
run 4 ds-pp-ck $ds parallel.pp=2 parallel.microbatches=2 train.batch=1 parallel.pp_cut=dec1.conv2 \
    model.checkpoint_levels=0,1,2
same ds-pp ds-pp-ck init=init-ds.h5
grads ds-pp ds-pp-ck
# shellcheck disable=SC2086
compare 1 cmp-ds 0,1,2 "deep supervision" $ds
# nnU-Net's residual encoder (with deep supervision): a checkpointed level keeps each block's output and
# recomputes its convs, first norm and skip; batch norm's running statistics are left alone by the
# recomputation; on 1 rank (batch norm, fp16), dp 2 x sp 2 (batch norm summed over the group again) and
# dp 2 x pp 2 with the cut between the blocks of checkpointed level 1
res="$ds model.arch=resenc model.res_blocks=1,2,2,2"
# shellcheck disable=SC2086
ts_step "initial weights (residual encoder, batch norm)" "$TESSERA" model init "$d/a.ini" $res model.norm=batch \
    --out "$d/init-res.h5" --seed 0
# shellcheck disable=SC2086
ts_step "initial weights (residual encoder, instance norm)" "$TESSERA" model init "$d/a.ini" $res \
    --out "$d/init-resi.h5" --seed 0
# shellcheck disable=SC2086
run 1 res-1 $res model.norm=batch
# shellcheck disable=SC2086
run 1 res-1-ck $res model.norm=batch model.checkpoint_levels=0,1
same res-1 res-1-ck init=init-res.h5
grads res-1 res-1-ck
# shellcheck disable=SC2086
run 1 res-fp16 $res train.precision=fp16
# shellcheck disable=SC2086
run 1 res-fp16-ck $res train.precision=fp16 model.checkpoint_levels=all
same res-fp16 res-fp16-ck init=init-resi.h5
grads res-fp16 res-fp16-ck
# shellcheck disable=SC2086
run 4 res-sp $res model.norm=batch parallel.sp=2
# shellcheck disable=SC2086
run 4 res-sp-ck $res model.norm=batch parallel.sp=2 model.checkpoint_levels=all
same res-sp res-sp-ck init=init-res.h5
grads res-sp res-sp-ck
# shellcheck disable=SC2086
run 4 res-pp $res parallel.pp=2 parallel.microbatches=2 train.batch=1 parallel.pp_cut=enc1.conv2
# shellcheck disable=SC2086
run 4 res-pp-ck $res parallel.pp=2 parallel.microbatches=2 train.batch=1 parallel.pp_cut=enc1.conv2 \
    model.checkpoint_levels=0,1,2
same res-pp res-pp-ck init=init-resi.h5
grads res-pp res-pp-ck
# shellcheck disable=SC2086
compare 1 cmp-res 0,1,2 "residual encoder" $res
# bad values: every rank fails before any work, naming the key
dump_grads=
for bad in 9 -1 x 1,1; do
    ts_fails_on_all "model.checkpoint_levels=$bad refused on both ranks" "model.checkpoint_levels = '$bad'" 2 \
        train_run 2 bad model.checkpoint_levels=$bad
done
ts_finish
