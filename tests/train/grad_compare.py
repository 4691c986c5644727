"""The gradient-equivalence check (docs/parallelism.md, "Equal to one rank"):
compares two train.dump_grads files of the same step from the same initial
weights, one of them usually from one rank. Per parameter, the largest
difference relative to the reference gradient's own largest value,
max |a - b| / max |a|, must be within BOUND. A bias whose reference gradient
is analytically zero (a conv bias feeding a batch or instance norm, which
removes it; detected as max |a| < 1e-4 x max |a| of its layer's weight) is
compared absolutely: max |b| <= BOUND x max |a| of the weight. Buffers
(batch norm's running statistics after the step) are compared relative to
their own scale, num_batches_tracked exactly, the loss relative to itself.
And something must have happened: the reference loss is finite and every
weight's gradient is nonzero. Prints the worst tensors.
usage: grad_compare.py REF.h5 RUN.h5 [BOUND [LOSS_BOUND]]"""
import sys

import h5py
import numpy as np

ref_path, run_path = sys.argv[1], sys.argv[2]
bound = float(sys.argv[3]) if len(sys.argv) > 3 else 1e-4
loss_bound = float(sys.argv[4]) if len(sys.argv) > 4 else bound


def read(path):
    with h5py.File(path, "r") as f:
        t = {}
        f["params"].visititems(lambda n, o: t.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) else None)
        return t, float(f["loss"][()]), int(f["step"][()])


a, la, sa = read(ref_path)
b, lb, sb = read(run_path)
bad = []
if sorted(a) != sorted(b):
    sys.exit("not ok: the files hold different tensors: only in %s: %s; only in %s: %s"
             % (ref_path, sorted(set(a) - set(b))[:5], run_path, sorted(set(b) - set(a))[:5]))
if sa != sb:
    bad.append("the files are of different steps (%d, %d)" % (sa, sb))
if not np.isfinite(la) or la <= 0:
    bad.append("the reference loss is %r: nothing was computed" % la)
rows = []
for name in sorted(a):
    x, y = a[name], b[name]
    if x.shape != y.shape:
        bad.append("%s: shapes %s and %s" % (name, x.shape, y.shape))
        continue
    if name.endswith("num_batches_tracked"):
        if not np.array_equal(x, y):
            bad.append("%s: %s against %s" % (name, x, y))
        continue
    x = x.astype(np.float64)
    y = y.astype(np.float64)
    if not np.all(np.isfinite(y)):
        bad.append("%s: not finite" % name)
        continue
    scale, how = np.abs(x).max(), "rel"
    wname = name[: -len("bias")] + "weight"
    if name.endswith(".bias") and wname in a and "running" not in name:
        wmax = np.abs(a[wname]).max()
        if scale < 1e-4 * wmax:  # analytically zero: absolute, at the scale of its layer's weight gradient
            scale, how = wmax, "abs"
    if name.endswith(".weight") and "running" not in name and scale == 0:
        bad.append("%s: the reference gradient is zero (nothing computed)" % name)
        continue
    err = np.abs(x - y).max() / scale if scale > 0 else np.abs(y).max()
    rows.append((err, name, how, scale))
rows.sort(reverse=True)
lerr = abs(la - lb) / abs(la) if la else abs(lb)
print("loss %.9g against %.9g: %.2e (bound %.0e)" % (la, lb, lerr, loss_bound))
if not lerr <= loss_bound:
    bad.append("loss differs by %.2e of itself" % lerr)
for err, name, how, scale in rows[:5]:
    print("  %-34s %.2e %s (scale %.3g)" % (name, err, how, scale))
over = [r for r in rows if not r[0] <= bound]
for err, name, how, scale in over:
    bad.append("%s: %.2e of its scale (%s) > %.0e" % (name, err, how, bound))
print("%d tensors compared, worst %s at %.2e (bound %.0e)" % (len(rows), rows[0][1] if rows else "-",
                                                               rows[0][0] if rows else 0, bound))
if bad:
    for m in bad[:20]:
        print("not ok:", m)
    sys.exit(1)
