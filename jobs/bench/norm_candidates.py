#!/usr/bin/env python3
"""Where grey matter lands under candidate normalisations, on Colin27 and on
its skull-stripped version (docs/medical.md, "Why this mask"): for each
mask, the scan is z-scored with the mean and std over the mask, and grey
matter's (AAL labels inside the BET mask) mean +- std is printed for both.
A normalisation that keeps the two close lets a model trained on one
segment the other.

    norm_candidates.py [TEMPLATES]   (default /usr/share/mricron/templates)
"""
import sys

import nibabel as nib
import numpy as np

t = (sys.argv[1] if len(sys.argv) > 1 else "/usr/share/mricron/templates") + "/"
x = np.asarray(nib.load(t + "ch2.nii.gz").dataobj, dtype=np.float64)
b = np.asarray(nib.load(t + "ch2bet.nii.gz").dataobj, dtype=np.float64)
gm = (np.asarray(nib.load(t + "aal.nii.gz").dataobj) > 0) & (b != 0)


def zscore(v, m):
    z = (v - v[m].mean()) / v[m].std()
    return z[gm].mean(), z[gm].std()


def robust(v, m):
    q = np.percentile(v[m], [25, 50, 75])
    z = (v - q[1]) / ((q[2] - q[0]) / 1.349)
    return z[gm].mean(), z[gm].std()


candidates = [
    ("all voxels (image)", lambda v: np.ones(v.shape, bool), zscore),
    ("non-zero voxels (nnU-Net MRI)", lambda v: v != 0, zscore),
    ("voxels above the mean (foreground)", lambda v: v > v.mean(), zscore),
    ("above the mean over the voxels above the mean", lambda v: v > v[v > v.mean()].mean(), zscore),
    ("above half the mean over the first mask", lambda v: v > 0.5 * v[v > v.mean()].mean(), zscore),
    ("median and IQR over voxels above the mean", lambda v: v > v.mean(), robust),
]
print("| statistics over | scan | stripped scan |\n| --- | --- | --- |")
for name, mask, stat in candidates:
    s1, s2 = stat(x, mask(x)), stat(b, mask(b))
    print(f"| {name} | {s1[0]:+.2f} ± {s1[1]:.2f} | {s2[0]:+.2f} ± {s2[1]:.2f} |")
