#!/bin/sh
# train.conv = winograd (issue [17]; docs/engine.md, "Winograd convolution"):
# one training step's gradients, batch-norm buffers and loss against
# train.conv = direct's from the same initial weights, tensor by tensor
# relative to each tensor's scale (tests/train/lib_grads.sh; forward,
# input and weight gradients through Winograd where they qualify), on a plain
# batch-norm U-Net (and one with 8 channels at its first level) and on nnU-Net's variant (residual encoder, deep
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
# 8 channels at the first level: its 16 -> 8 decoder convolution and the 8 -> 16 one's input gradient
# through the few-output-channel driver (src/nn/winograd_narrow.c)
grad_ref few model.channels=8,16,32
grad_eq few 1 1e-4 train.conv=winograd
# bf16: the forward and input gradient with bf16 products where 64+ channels in and out. bf16's own
# rounding moves this model's deep gradients by up to about 0.25 of their scale from fp32's, so the
# check is relative to it: per weight, bf16 Winograd's distance from the fp32 gradient within 2x the
# direct bf16 kernels' distance, and their median ratio within 1.3 (1.03 seen; the layers' own
# bounds against double are tests/nn/test_winograd's); and not the direct bf16 bits (it ran)
ts_step "bf16 one step, direct kernels" _grad_run 1 bfd train.precision=bf16 model.init="$d/init-plain.h5"
ts_step "bf16 one step, train.conv = winograd" _grad_run 1 bfw train.precision=bf16 train.conv=winograd \
    model.init="$d/init-plain.h5"
ts_step "bf16 Winograd's gradients as near fp32's as the direct bf16 kernels' (per weight within 2x, median 1.3x)" \
    "$TS_PY" -c "
import h5py, numpy as np
def read(p):
    with h5py.File(p, 'r') as f:
        t = {}
        f['params'].visititems(lambda n, o: t.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) else None)
        return t
r, a, b = read('$d/g-ref-plain.h5'), read('$d/g-bfd.h5'), read('$d/g-bfw.h5')
rat, worst = [], (0, '')
for n in sorted(r):
    if not n.endswith('weight'):
        continue
    x = r[n].astype(np.float64)
    s = np.abs(x).max()
    ed, ew = np.abs(a[n] - x).max() / s, np.abs(b[n] - x).max() / s
    assert s > 0 and ed > 0, n
    rat.append(ew / ed)
    worst = max(worst, (ew / ed, '%s: Winograd %.3g, direct %.3g of its scale' % (n, ew, ed)))
same = all(np.array_equal(a[n], b[n]) for n in a)
print('%d weights; ratio median %.3f, largest %.3f (%s); %s the direct bits' % (len(rat), np.median(rat), worst[0], worst[1], 'EQUAL to' if same else 'not'))
assert len(rat) > 10 and worst[0] <= 2 and np.median(rat) <= 1.3 and not same"
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
