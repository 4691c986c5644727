#!/bin/sh
# train.conv = winograd (issue [17]; docs/engine.md, "Winograd convolution"):
# one training step's gradients, batch-norm buffers and loss against
# train.conv = direct's from the same initial weights, tensor by tensor
# relative to each tensor's scale (tests/train/lib_grads.sh; forward,
# input and weight gradients through Winograd where they qualify), on a plain
# batch-norm U-Net and on nnU-Net's variant (residual encoder, deep
# supervision, instance norm, leaky ReLU) with activation checkpointing;
# and not bit-identical to them (the Winograd convolutions ran). With a
# spatial split (parallel.sp = 2) the split layers stay direct and the
# gradients still match. bench step says the kernels; a bad value is
# refused naming the key.
. "$TS_SRCDIR/tests/train/lib_train.sh"
ts_tmpdir winograd
if [ -z "$TS_PY" ]; then
    ts_skip "Winograd training gradients" "no python3 with h5py and numpy (tests/train/grad_compare.py reads the dumps)"
    ts_finish
fi
ts_synth 4 32 13
ts_ini w.ini model.channels=16,32,64 model.norm=batch -model.groups data.patch=32 train.batch=1 train.steps=1 \
    -train.momentum -train.log_every train.warmup_steps=0 ckpt.every=0
grad_ref plain
grad_eq plain 1 1e-4 train.conv=winograd
_grad_case plain 1 0 differ train.conv=winograd
grad_eq plain 2 1e-4 train.conv=winograd parallel.sp=2
grad_ref nn model.norm=instance model.act=leaky_relu model.arch=resenc model.res_blocks=1,2,2,2 \
    model.deep_supervision=true model.channels=16,32,32,64 data.patch=32 train.batch=1
grad_eq nn 1 1e-4 train.conv=winograd model.checkpoint_levels=all
_grad_case nn 1 0 differ train.conv=winograd

ts_step "bench step with train.conv = winograd" ts_mpirun 1 "$TESSERA" bench step "$d/w.ini" train.conv=winograd \
    --steps 1 --warmup 0
ts_check "bench step says the Winograd kernels" sh -c \
    'printf "%s\n" "$1" | grep -q "convolution kernels: fp32; train.conv = winograd"' _ "$ts_out"
ts_fails_on_all "train.conv = fft" "train.conv" 2 ts_mpirun 2 "$TESSERA" train "$d/w.ini" data.path="$d/syn.h5" \
    run.dir="$d/bad" train.conv=fft
ts_check "the refused run wrote nothing" [ ! -e "$d/bad" ]
ts_finish
