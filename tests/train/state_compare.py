"""Compares two training runs' losses and whole checkpointed state
(tests/train/gpu_state.sh): every step's loss (metrics.jsonl) within TOL
relative, and every parameter, buffer and optimizer-state tensor of the
checkpoint of step STEP within TOL of that tensor's own largest value
(integer tensors equal). Asserts that there are more than 20 float tensors
and that the optimizer state is among them (something happened). With
--differ it checks the opposite: some tensor or loss beyond TOL (a
comparison that can fail). usage: state_compare.py RUN_A RUN_B STEP TOL [--differ]"""
import sys

import h5py
import numpy as np

from run_metrics import losses

a, b, step, tol = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
differ = "--differ" in sys.argv[5:]


la, lb = losses(a), losses(b)
assert step in la and step in lb, (sorted(la), sorted(lb))
common = sorted(set(la) & set(lb))
# a skipped step's loss is null in both (a non-finite loss)
assert all((la[s] is None) == (lb[s] is None) for s in common), "a loss is null in one run only"
common = [s for s in common if la[s] is not None]
worst_loss = max(abs(la[s] - lb[s]) / max(abs(la[s]), 1e-30) for s in common)
A = h5py.File(a + "/ckpt/step-%d/state.h5" % step, "r")
B = h5py.File(b + "/ckpt/step-%d/state.h5" % step, "r")
names = []
A.visit(lambda n: names.append(n) if isinstance(A[n], h5py.Dataset) and n.split("/")[0] in ("params", "optim") else None)
worst, nf, nopt, ints_equal = (0.0, ""), 0, 0, True
for n in names:
    x, y = np.asarray(A[n]), np.asarray(B[n])
    assert x.shape == y.shape, n
    if x.dtype.kind != "f":
        ints_equal = ints_equal and np.array_equal(x, y)
        continue
    s = np.abs(x.astype(np.float64)).max() if x.size else 0.0
    if s == 0:
        continue
    nf += 1
    nopt += n.startswith("optim/")
    worst = max(worst, (np.abs(x.astype(np.float64) - y).max() / s, n))
print("%d float tensors (%d of the optimizer state): the worst differs by %.2e of its scale (%s); losses of %d steps "
      "by %.2e relative at most; integer tensors %s" % (nf, nopt, worst[0], worst[1], len(common), worst_loss,
                                                      "equal" if ints_equal else "DIFFER"))
assert nf > 20 and nopt > 0, "too few tensors compared"
far = worst[0] > tol or worst_loss > tol or not ints_equal
if differ:
    assert far, "the runs agree within %g (expected them to differ)" % tol
else:
    assert not far, "the runs differ beyond %g" % tol
