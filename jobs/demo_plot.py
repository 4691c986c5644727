#!/usr/bin/env python3
"""Renders the demo's result: axial, coronal and sagittal slices of the MRI
with the predicted labels over it (and the reference outline), plus the loss
curve from metrics.jsonl. Usage:
    demo_plot.py SCAN.nii.gz PRED.nii.gz REF.nii.gz LABELMAP.txt METRICS.jsonl OUT.png \
        [PATCH_image.nii PATCH_label.nii]
REF is mapped through LABELMAP (source_value target_class per line). The
optional PATCH pair (`tessera bench io --dump-patch`) adds a panel with the
middle axial slice of an augmented training patch and its labels."""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import nibabel as nib
import numpy as np

scan, pred, ref, lmap, metrics, out = sys.argv[1:7]
patch = sys.argv[7:9] if len(sys.argv) >= 9 else None
img = np.asarray(nib.load(scan).dataobj, dtype=np.float32)
prd = np.asarray(nib.load(pred).dataobj).astype(np.int32)
raw = np.asarray(nib.load(ref).dataobj).astype(np.int64)
table = {}
for line in open(lmap):
    line = line.split("#")[0].split()
    if len(line) >= 2:
        table[int(line[0])] = int(line[1])
lab = np.vectorize(lambda v: table.get(int(v), 0))(raw)
steps, loss, dsteps, dice = [], [], [], []
for line in open(metrics):
    m = json.loads(line)
    if "dice" in m:
        dsteps.append(m["step"])
        dice.append(m["dice"])
    else:
        steps.append(m["step"])
        loss.append(m["loss"])

colors = np.array([[0, 0, 0, 0], [1.0, 0.35, 0.1, 0.45], [0.1, 0.6, 1.0, 0.6], [0.2, 0.9, 0.2, 0.5]])
cx, cy, cz = [s // 2 for s in img.shape]
cz = int(img.shape[2] * 0.42)  # an axial slice through cerebrum and cerebellum
views = [("axial", img[:, :, cz].T, prd[:, :, cz].T, lab[:, :, cz].T),
         ("coronal", img[:, cy - 30, :].T, prd[:, cy - 30, :].T, lab[:, cy - 30, :].T),
         ("sagittal", img[cx - 20, :, :].T, prd[cx - 20, :, :].T, lab[cx - 20, :, :].T)]
fig, ax = plt.subplots(1, 5 if patch else 4, figsize=(22.5 if patch else 18, 4.8))
for a, (name, im, pr, lb) in zip(ax, views):
    a.imshow(im, cmap="gray", origin="lower")
    a.imshow(colors[np.clip(pr, 0, 3)], origin="lower")
    a.contour(lb, levels=[0.5, 1.5], colors=["white", "yellow"], linewidths=0.6, origin="lower")
    a.set_title(f"{name}: prediction (colour), AAL reference (lines)")
    a.axis("off")
a = ax[3]
a.plot(steps, loss, label="training loss")
a.set_xlabel("step")
a.set_ylabel("loss (CE + Dice)")
if dice:
    a2 = a.twinx()
    d = np.array(dice, dtype=float)
    for k, nm in ((1, "cerebrum"), (2, "cerebellum")):
        if d.shape[1] > k:
            a2.plot(dsteps, d[:, k], "o--", label=f"Dice {nm}")
    a2.set_ylim(0, 1)
    a2.set_ylabel("Dice (whole volume)")
    a2.legend(loc="center right")
a.legend(loc="upper right")
a.set_title("learning curve")
if patch:
    # NIfTI (x, y, z, t) = tessera (W, H, D, C): the middle axial (D) slice, channel 0
    pim = np.asarray(nib.load(patch[0]).dataobj, dtype=np.float32)
    plb = np.asarray(nib.load(patch[1]).dataobj).astype(np.int32)
    if pim.ndim == 4:
        pim = pim[..., 0]
    z = pim.shape[2] // 2
    a = ax[4]
    a.imshow(pim[:, :, z].T, cmap="gray", origin="lower")
    a.imshow(colors[np.clip(plb[:, :, z].T, 0, 3)], origin="lower")
    a.set_title("an augmented training patch (labels in colour)")
    a.axis("off")
fig.tight_layout()
fig.savefig(out, dpi=90)
print(f"wrote {out}")
