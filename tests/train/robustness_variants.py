#!/usr/bin/env python3
"""Variants of a scan that keep its anatomy but change the image (issue [11]
acceptance 1): each written as NIfTI with the input's geometry, so the same
reference labels apply.

    robustness_variants.py SCAN OUTDIR [--brain BRAIN_ONLY_SCAN] [--seed N]

Variants (names are the files' stems):
  original      the scan as it is
  scale_offset  2.5 x + 300 (another scanner's intensity units)
  gamma         gamma 1.6 on the [min, max] range (another contrast)
  contrast      (x - mean) x 0.6 + mean (flatter contrast)
  noise         Gaussian noise, sigma = 8 % of the foreground's std
  blur          Gaussian blur, sigma 1.2 voxels
  lowres        every 2nd voxel along each axis, then trilinear back
  brain_only    the skull-stripped scan (background exactly 0), when
                --brain names it (Colin27: ch2bet.nii.gz)
"""
import argparse
import os

import nibabel as nib
import numpy as np
from scipy import ndimage


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("scan")
    ap.add_argument("outdir")
    ap.add_argument("--brain")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    os.makedirs(a.outdir, exist_ok=True)
    img = nib.load(a.scan)
    x = np.asarray(img.dataobj, dtype=np.float32)
    rng = np.random.default_rng(a.seed)
    fg = x > np.percentile(x, 50)
    lo, hi = float(x.min()), float(x.max())
    v = {
        "original": x,
        "scale_offset": 2.5 * x + 300,
        "gamma": lo + (hi - lo) * ((x - lo) / (hi - lo)) ** 1.6,
        "contrast": (x - x.mean()) * 0.6 + x.mean(),
        "noise": x + rng.normal(0, 0.08 * float(x[fg].std()), x.shape).astype(np.float32),
        "blur": ndimage.gaussian_filter(x, 1.2),
        "lowres": ndimage.zoom(x[::2, ::2, ::2], [n / m for n, m in zip(x.shape, x[::2, ::2, ::2].shape)], order=1),
    }
    if a.brain:
        b = np.asarray(nib.load(a.brain).dataobj, dtype=np.float32)
        if b.shape != x.shape:
            raise SystemExit(f"{a.brain}: shape {b.shape} differs from {a.scan}'s {x.shape}")
        v["brain_only"] = b
    for name, y in v.items():
        assert y.shape == x.shape, name
        out = nib.Nifti1Image(y.astype(np.float32), img.affine, img.header)
        out.set_data_dtype(np.float32)
        nib.save(out, f"{a.outdir}/{name}.nii.gz")
        print(f"{name}: mean {float(y.mean()):.1f} std {float(y.std()):.1f} -> {a.outdir}/{name}.nii.gz")


if __name__ == "__main__":
    main()
