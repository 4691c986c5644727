"""Synthetic scans for tests/io/fingerprint.sh: smooth nested-sphere labels
(3 classes) inside a non-zero head on a zero background, per-scan spacings;
set A (isotropic-ish, 3 scans) and set B (anisotropic along k: 4, 5, 6 mm;
in-plane 0.8-1.2 mm, so two of them are resampled in-plane too)."""
import sys
import numpy as np
import nibabel as nib

out = sys.argv[1]
rng = np.random.default_rng(3)
sets = {
    'a': [((34, 30, 26), (0.8, 0.9, 1.1)), ((30, 32, 24), (0.85, 0.8, 1.2)), ((36, 28, 28), (0.9, 0.95, 1.0))],
    'b': [((44, 40, 8), (0.8, 0.9, 4.0)), ((40, 44, 7), (1.0, 1.0, 5.0)), ((42, 42, 9), (1.2, 1.1, 6.0))],
}
for name, scans in sets.items():
    for i, (sh, sp) in enumerate(scans):
        x, y, z = np.meshgrid(*[np.arange(n, dtype=np.float64) for n in sh], indexing='ij')
        c = np.array(sh) / 2.0 + np.array([1.3, -0.7, 0.4])
        r = np.sqrt(((x - c[0]) * sp[0]) ** 2 + ((y - c[1]) * sp[1]) ** 2 + ((z - c[2]) * sp[2]) ** 2)
        lab = ((r < 8).astype(np.uint8) + (r < 4)).astype(np.uint8)
        head = r < 11.5
        img = np.where(head, 40 + 60 * lab + rng.normal(0, 6, sh), 0).astype(np.float32)
        img[head & (rng.random(sh) < 0.01)] = 900.0  # a few bright voxels for the clipping
        A = np.diag(list(sp) + [1.0])
        A[:3, 3] = [-12.5, 7.0, 3.25]
        for arr, kind in ((img, 'img'), (lab, 'lab')):
            h = nib.Nifti1Image(arr, A)
            h.set_sform(A, 1)
            h.set_qform(A, 1)
            nib.save(h, '%s/%s%s%d.nii.gz' % (out, name, kind, i))
