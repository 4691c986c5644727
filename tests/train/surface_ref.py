#!/usr/bin/env python3
"""Independent check of tessera's HD95 and NSD (src/infer/surface.c) with
SciPy's Euclidean distance transform on synthetic shapes: smooth random
blobs (thresholded Gaussian-filtered noise), spheres against ellipsoids,
anisotropic spacings, several tolerances.

    surface_ref.py make DIR       writes DIR/cases.txt and the label maps
    surface_ref.py check DIR OUT  compares OUT (test_surface DIR's lines)

Prints TAP; exits non-zero on a mismatch beyond one voxel's size (HD95) or
beyond 1e-6 (NSD: both sides count voxels by the same rule)."""
import sys

import numpy as np
from scipy import ndimage


def cases(rng):
    out = []
    for i in range(6):
        n = tuple(int(v) for v in rng.integers(24, 48, 3))
        sp = tuple(float(v) for v in rng.choice([0.5, 0.8, 1.0, 1.5, 3.0], 3))
        fields = [ndimage.gaussian_filter(rng.standard_normal(n), 3.0) for _ in range(2)]
        pred = (fields[0] > 0.02).astype(np.uint8) * 2
        ref = (0.7 * fields[0] + 0.3 * fields[1] > 0.0).astype(np.uint8) * 2
        out.append((f"blob{i}", pred, ref, sp, float(rng.choice([0.7, 1.3, 2.5])), 2))
    z, y, x = np.mgrid[:40, :36, :32]
    sp = (2.0, 1.0, 0.75)
    sph = (((z - 20) * sp[0]) ** 2 + ((y - 18) * sp[1]) ** 2 + ((x - 16) * sp[2]) ** 2 <= 12 ** 2).astype(np.uint8)
    ell = (((z - 21) * sp[0] / 1.2) ** 2 + ((y - 17) * sp[1]) ** 2 + ((x - 15) * sp[2] / 0.8) ** 2 <= 12 ** 2)
    out.append(("sphere_ellipsoid", sph, ell.astype(np.uint8), sp, 1.0, 1))
    edge = np.zeros((20, 20, 20), np.uint8)
    edge[:, :10, :] = 1  # touches the volume's border: the border counts as surface
    edge2 = np.zeros_like(edge)
    edge2[:, :13, 2:] = 1
    out.append(("border", edge, edge2, (1.0, 1.0, 1.0), 2.0, 1))
    return out


def surface(m):
    st = ndimage.generate_binary_structure(3, 1)
    return m & ~ndimage.binary_erosion(m, structure=st, border_value=0)


def metrics(pred, ref, sp, tol, cls):
    sp_, sr = surface(pred == cls), surface(ref == cls)
    dtr = ndimage.distance_transform_edt(~sr, sampling=sp)
    dtp = ndimage.distance_transform_edt(~sp_, sampling=sp)
    a, b = dtr[sp_], dtp[sr]
    hd = max(np.percentile(a, 95), np.percentile(b, 95))
    nsd = ((a <= tol).sum() + (b <= tol).sum()) / (len(a) + len(b))
    return hd, nsd


def main():
    mode, d = sys.argv[1], sys.argv[2]
    cs = cases(np.random.default_rng(20261130))
    if mode == "make":
        with open(f"{d}/cases.txt", "w") as f:
            for name, p, r, sp, tol, cls in cs:
                p.astype(np.uint8).tofile(f"{d}/{name}.pred.raw")
                r.astype(np.uint8).tofile(f"{d}/{name}.ref.raw")
                f.write(f"{name} {p.shape[0]} {p.shape[1]} {p.shape[2]} {sp[0]} {sp[1]} {sp[2]} {tol} {cls}\n")
        return 0
    got = {}
    for line in open(sys.argv[3]):
        name, hd, nsd = line.split()
        got[name] = (float(hd), float(nsd))
    print(f"1..{len(cs)}")
    bad = 0
    for i, (name, p, r, sp, tol, cls) in enumerate(cs, 1):
        hd, nsd = metrics(p, r, sp, tol, cls)
        g = got.get(name)
        ok = g is not None and abs(g[0] - hd) <= max(sp) and abs(g[1] - nsd) <= 1e-6
        bad += not ok
        print(f"{'' if ok else 'not '}ok {i} - {name} {p.shape} spacing {sp} tol {tol}: HD95 tessera "
              f"{g[0] if g else 'missing'} scipy {hd:.6f} (|diff| <= {max(sp)}), NSD tessera "
              f"{g[1] if g else 'missing'} scipy {nsd:.6f}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
