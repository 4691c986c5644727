#!/usr/bin/env python3
"""Independent checks of `tessera infer` over several scans (tests/train/infer.sh):
NumPy/SciPy computations of what src/infer/infer*.c and mirror.c produce.

    infer_ref.py make H5 DIR            scans, labels and flipped copies from a dataset
    infer_ref.py mirror DIR PROB FLIPDIR  PROB (mirror=xyz) = mean of the 8 flipped predictions flipped back
    infer_ref.py same PROB_A PROB_B     two probability maps agree (1e-5)
    infer_ref.py geometry IN OUT        each mask of OUT has the geometry of its scan in IN
    infer_ref.py metrics METRICS LABELDIR TOL   the metrics file against NumPy/SciPy
    infer_ref.py keep RAW KEPT CLASSES  KEPT = RAW with the largest component of CLASSES kept (something removed)
    infer_ref.py decide RAWDIR LABELDIR PP.json   the decision against NumPy/SciPy
    infer_ref.py applied RAWDIR PPDIR PP.json     PPDIR = RAWDIR post-processed by the decision
    infer_ref.py pplabels RAWDIR OUTDIR [foreground]  references = RAWDIR's masks with every class's (or
                                         the whole foreground's) largest component kept: validation labels
                                         on which the post-processing must help

Exits non-zero with a message on a mismatch."""
import glob
import json
import math
import os
import sys

import numpy as np
import nibabel as nib
from scipy import ndimage

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import surface_ref  # noqa: E402  (HD95 and NSD with SciPy's distance transform)

K = 3
FLIPS = [(m & 1, m & 2, m & 4) for m in range(8)]  # z, y, x of tessera's bits D=1, H=2, W=4


def load(p):
    return np.asarray(nib.load(p).dataobj)


def flip_xyz(a, m):
    """flip a NIfTI-ordered array (x, y, z, ...) as tessera's mask m (bit 1 D=z, 2 H=y, 4 W=x)"""
    if m & 1:
        a = a[:, :, ::-1]
    if m & 2:
        a = a[:, ::-1]
    if m & 4:
        a = a[::-1]
    return a


def make(h5, d):
    import h5py
    f = h5py.File(h5, "r")
    for sub in ("scans", "labels", "flips", "single"):
        os.makedirs(f"{d}/{sub}", exist_ok=True)
    rot = np.array([[0.0, -1.1, 0, 12], [0.9, 0, 0, -3], [0, 0, 1.4, 5], [0, 0, 0, 1]])
    cases = [("a", 0, np.diag([1.2, 0.9, 1.1, 1]), (slice(None),) * 3),
             ("b", 1, rot, (slice(None),) * 3),
             ("c_0000", 2, np.diag([0.8, 1.0, 2.0, 1]), (slice(1, 18), slice(0, 20), slice(2, 19)))]
    for name, i, aff, crop in cases:
        img = np.asarray(f[f"samples/{i:06d}/image"])[0][crop].transpose(2, 1, 0).astype(np.float32)
        lab = np.asarray(f[f"samples/{i:06d}/label"])[crop].transpose(2, 1, 0).astype(np.uint8)
        nib.save(nib.Nifti1Image(img, aff), f"{d}/scans/{name}.nii.gz")
        # the reference of c_0000 is named as nnU-Net names it (no channel suffix)
        nib.save(nib.Nifti1Image(lab, aff), f"{d}/labels/{name.replace('_0000', '')}.nii.gz")
        if name == "b":
            nib.save(nib.Nifti1Image(img, aff), f"{d}/single/b.nii.gz")
            for m in range(8):
                nib.save(nib.Nifti1Image(np.ascontiguousarray(flip_xyz(img, m)), aff), f"{d}/flips/f{m}.nii.gz")


def mirror(prob, flipdir):
    p = load(prob)
    ref = np.mean([flip_xyz(load(f"{flipdir}/f{m}.nii.gz"), m) for m in range(8)], axis=0)
    plain = load(f"{flipdir}/f0.nii.gz")
    err, moved = np.abs(p - ref).max(), np.abs(p - plain).max()
    print(f"mirror=xyz vs mean of 8 flipped predictions: max error {err:.2e}; vs unmirrored: {moved:.3e}")
    assert p.shape == plain.shape and err < 1e-5, "mirrored probabilities are not the mean of the flips"
    assert moved > 1e-3, "mirroring changed nothing"


def same(a, b):
    x, y = load(a), load(b)
    err = np.abs(x.astype(np.float64) - y).max()
    print(f"{a} vs {b}: max difference {err:.2e}")
    assert x.shape == y.shape and err < 1e-5


def near(mask_a, mask_b, prob_a, prob_b):
    """two engines' predictions: masks equal in at least 99.9 % of voxels, probabilities within 1e-4 of their scale"""
    x, y = load(mask_a), load(mask_b)
    p, q = load(prob_a).astype(np.float64), load(prob_b).astype(np.float64)
    agree = float(np.mean(x == y)) if x.shape == y.shape and x.size else 0.0
    rel = float(np.abs(p - q).max() / max(np.abs(p).max(), 1e-30)) if p.shape == q.shape and p.size else math.inf
    print(f"masks agree in {agree:.6f} of {x.size} voxels; probabilities max relative difference {rel:.2e}")
    assert agree >= 0.999 and rel <= 1e-4 and np.abs(p).max() > 0


def geometry(ind, outd):
    n = 0
    for p in sorted(glob.glob(f"{ind}/*.nii.gz")):
        a, m = nib.load(p), nib.load(f"{outd}/{os.path.basename(p)}")
        ha, hm = a.header, m.header
        ok = (m.shape == a.shape and np.allclose(m.affine, a.affine, atol=1e-5)
              and np.allclose(hm.get_zooms(), ha.get_zooms()) and int(hm["sform_code"]) == int(ha["sform_code"])
              and int(hm["qform_code"]) == int(ha["qform_code"]) and m.get_data_dtype() == np.uint8)
        print(os.path.basename(p), m.shape, hm.get_zooms(), "ok" if ok else "MISMATCH")
        assert ok
        n += 1
    assert n == 3


def dice(p, r, k):
    tp, s = ((p == k) & (r == k)).sum(), (p == k).sum() + (r == k).sum()
    return 2 * tp / s if s else math.nan


def close(a, b, tol):
    if a is None:
        return not math.isfinite(b)
    return math.isfinite(b) and abs(a - b) <= tol


def metrics(path, labeldir, tol):
    j = json.load(open(path))
    assert j["format"] == "tessera-metrics-1" and abs(j["nsd_tolerance_mm"] - tol) < 1e-12
    per = {"dice": [], "hd95_mm": [], "nsd": [], "fg": []}
    for s in j["scans"]:
        p = load(s["output"])
        r = load(s["label"])
        assert os.path.dirname(s["label"]) == labeldir.rstrip("/"), s["label"]
        sp = nib.load(s["input"]).header.get_zooms()[:3]
        assert np.allclose(s["spacing_mm"], sp)
        row = {"dice": [], "hd95_mm": [], "nsd": []}
        for k in range(K):
            d = dice(p, r, k)
            if (p == k).any() and (r == k).any():
                hd, nsd = surface_ref.metrics(p, r, sp, tol, k)
            else:
                hd = math.nan if not (p == k).any() and not (r == k).any() else math.inf
                nsd = math.nan if math.isnan(hd) else 0.0
            vox = min(sp)
            assert close(s["dice"][k], d, 1e-9), (s["input"], k, s["dice"][k], d)
            assert close(s["hd95_mm"][k], hd, 1e-6 * max(1, hd) if math.isfinite(hd) else 0), (s["input"], k, hd)
            assert close(s["nsd"][k], nsd, 1e-9), (s["input"], k, s["nsd"][k], nsd)
            row["dice"].append(d), row["hd95_mm"].append(hd), row["nsd"].append(nsd)
            print(f"{os.path.basename(s['input'])} class {k}: Dice {d:.4f} HD95 {hd:.3f} mm NSD {nsd:.4f} "
                  f"(tessera {s['dice'][k]}, {s['hd95_mm'][k]}, {s['nsd'][k]}; voxel {vox} mm)")
        for key in row:
            per[key].append(row[key])
        fg = [x for x in row["dice"][1:] if not math.isnan(x)]
        per["fg"].append(sum(fg) / len(fg) if fg else math.nan)
    for key in ("dice", "hd95_mm", "nsd"):
        a = np.array(per[key], dtype=np.float64)
        for k in range(K):
            v = a[:, k][np.isfinite(a[:, k])]
            st = j["summary"][key]
            assert st["n"][k] == len(v), (key, k)
            if len(v):
                sd = float(np.std(v, ddof=1)) if len(v) > 1 else 0.0
                assert close(st["mean"][k], float(v.mean()), 1e-9) and close(st["std"][k], sd, 1e-9), (key, k)
    fg = np.array(per["fg"])
    f = j["summary"]["foreground_mean_dice"]
    assert close(f["mean"], float(np.nanmean(fg)), 1e-9) and close(f["std"], float(np.nanstd(fg, ddof=1)), 1e-9)
    assert j["summary"]["scans"] == len(j["scans"]) == 3
    print("summary: foreground mean Dice", f["mean"], "+-", f["std"], "over", f["n"], "scans")


def keep_largest(a, classes, foreground=False):
    """the largest 26-connected component of the whole foreground (first, when foreground), then of each class"""
    a = a.copy()
    for k in (["fg"] if foreground else []) + list(classes):
        lab, n = ndimage.label(a > 0 if k == "fg" else a == k, structure=np.ones((3, 3, 3)))
        if n > 1:
            sizes = ndimage.sum(np.ones_like(lab), lab, index=range(1, n + 1))
            a[(lab > 0) & (lab != 1 + int(np.argmax(sizes)))] = 0
    return a


def keep(raw, kept, classes):
    r, k = load(raw), load(kept)
    ref = keep_largest(r, [int(c) for c in classes.split(",")])
    print(f"voxels removed: {int((r != k).sum())} (SciPy: {int((r != ref).sum())})")
    assert (k == ref).all() and (r != k).any(), "keep_largest does not match SciPy's, or removed nothing"


def pplabels(rawdir, outd, what="classes"):
    os.makedirs(outd, exist_ok=True)
    for p in sorted(glob.glob(f"{rawdir}/*.nii.gz")):
        m = nib.load(p)
        a = np.asarray(m.dataobj)
        if what == "foreground":  # and a class-1 corner the masks do not have
            lab = keep_largest(a, [], True)
            assert (a[:2, :2, :2] == 0).all(), p
            lab[:2, :2, :2] = 1
        else:
            lab = keep_largest(a, range(1, K))
        nib.save(nib.Nifti1Image(lab, m.affine), f"{outd}/{os.path.basename(p).replace('_0000', '')}")


def nanmean(rows):
    with np.errstate(all="ignore"):
        return np.array([np.nanmean(c) if np.isfinite(c).any() else math.nan for c in np.array(rows).T])


def decide(rawdir, labeldir, pp, expect=""):
    """nnU-Net's determine_postprocessing: the whole foreground first (kept if it raises the mean over the
    classes of their mean Dice), then each class on what that left (kept if it raises the class's mean Dice)"""
    j = json.load(open(pp))
    raws = sorted(glob.glob(f"{rawdir}/*.nii.gz"))
    pairs = []
    for p in raws:
        name = os.path.basename(p).replace("_0000", "")
        pairs.append((load(p), load(f"{labeldir}/{name}")))
    raw = nanmean([[dice(a, r, k) for k in range(K)] for a, r in pairs])
    fgd = nanmean([[dice(keep_largest(a, [], True), r, k) for k in range(K)] for a, r in pairs])
    f0, f1 = np.mean(raw[1:]), np.mean(fgd[1:])  # nnU-Net's foreground_mean: NaN if a class has no Dice
    keep_fg = bool(f1 > f0)
    w0 = fgd if keep_fg else raw
    w1 = nanmean([[dice(keep_largest(a, [k], keep_fg), r, k) for k in range(K)] for a, r in pairs])
    chosen = [k for k in range(1, K) if w1[k] > w0[k]]
    print("foreground step: mean over the classes", f0, "->", f1, "keep:", keep_fg, "; tessera:",
          j["keep_largest_foreground"])
    print("mean Dice without", w0, "with", w1, "-> keep", chosen, "; tessera:", j["keep_largest"])
    assert j["format"] == "tessera-postprocess-1" and j["classes"] == K and j["scans"] == len(raws) == 3
    assert j["keep_largest_foreground"] == keep_fg and j["keep_largest"] == chosen
    assert close(j["foreground_mean_dice_without"], f0, 1e-9) and close(j["foreground_mean_dice_with"], f1, 1e-9)
    assert all(close(j["mean_dice_without"][k], w0[k], 1e-9) and close(j["mean_dice_with"][k], w1[k], 1e-9)
               for k in range(1, K))
    assert f1 != f0 or any(w1[k] != w0[k] for k in range(1, K)), "the post-processing changed no Dice: nothing to decide"
    if expect:
        want = [c for c in expect.split(",") if c]
        assert keep_fg == ("foreground" in want), f"expected the foreground step: {'foreground' in want}"
        assert chosen == [int(c) for c in want if c != "foreground"], f"expected to keep {expect}"


def applied(rawdir, ppdir, pp):
    j = json.load(open(pp))
    classes, fg = j["keep_largest"], j["keep_largest_foreground"]
    n = 0
    for p in sorted(glob.glob(f"{rawdir}/*.nii.gz")):
        a, b = load(p), load(f"{ppdir}/{os.path.basename(p)}")
        assert (keep_largest(a, classes, fg) == b).all(), p
        n += int((a != b).sum())
    print(f"decision: foreground {fg}, classes {classes} applied: {n} voxels changed")
    assert (n > 0) == (bool(classes) or fg)


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "metrics":
        metrics(args[0], args[1], float(args[2]))
    else:
        {"make": make, "mirror": mirror, "same": same, "geometry": geometry, "keep": keep, "decide": decide,
         "applied": applied, "pplabels": pplabels, "near": near}[cmd](*args)
