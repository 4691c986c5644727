"""Compares two training runs of the same config on different grids
(tests/train/spatial.sh): the loss of every step (metrics.jsonl) within a
relative tolerance, and every parameter and buffer of the last checkpoint
within 1e-4 of the tensor's largest value (floored at 1e-3 of the largest
parameter); and asserts that training moved the weights away from the
initial ones (init.h5 from `tessera model init`). RUN may hold only the
later steps (a run resumed from a checkpoint): its steps are compared.
usage: compare_runs.py REF_RUN RUN INIT.h5 STEP [LOSS_RTOL [WEIGHT_TOL]]"""
import sys

import h5py
import numpy as np

from run_metrics import losses

ref, run, init, step = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
rtol = float(sys.argv[5]) if len(sys.argv) > 5 else 1e-5
wtol = float(sys.argv[6]) if len(sys.argv) > 6 else 1e-4


la, lb = losses(ref), losses(run)
assert sorted(la) == list(range(1, step + 1)) and lb and step in lb and set(lb) <= set(la), (sorted(la), sorted(lb))
worst_loss = max(abs(la[s] - lb[s]) / max(abs(la[s]), 1e-30) for s in lb)
a = h5py.File(ref + "/ckpt/step-%d/state.h5" % step, "r")
b = h5py.File(run + "/ckpt/step-%d/state.h5" % step, "r")
w0 = h5py.File(init, "r")
names = []
a["params"].visit(lambda n: names.append(n) if isinstance(a["params"][n], h5py.Dataset) else None)
floats = [n for n in names if a["params"][n].dtype.kind == "f"]
largest = max(np.abs(np.asarray(a["params"][n], np.float64)).max() for n in floats)
worst, moved = 0.0, 0.0
for n in floats:
    x = np.asarray(a["params"][n], np.float64)
    y = np.asarray(b["params"][n], np.float64)
    assert x.shape == y.shape, n
    scale = max(np.abs(x).max(), 1e-3 * largest)
    worst = max(worst, np.abs(x - y).max() / scale)
    if n in w0["params"] and not n.endswith("running_var") and not n.endswith("running_mean"):
        moved = max(moved, np.abs(x - np.asarray(w0["params"][n], np.float64)).max() / scale)
print("%d tensors: weights differ by at most %.2e of their scale, loss by %.2e relative over %d steps; training moved "
      "the weights by up to %.2e of their scale" % (len(floats), worst, worst_loss, len(lb), moved))
assert len(floats) > 10
assert worst <= wtol, "weights differ"
assert worst_loss <= rtol, "losses differ"
assert moved > 1e-3, "the weights did not move"
