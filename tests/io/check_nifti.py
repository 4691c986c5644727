"""Cross-checks a tessera dataset converted from NIfTI against the NIfTI
files, with h5py and nibabel only (no tessera code): voxels (whole arrays,
sums, probes), label classes through the label map (parsed here
independently), histogram, statistics and geometry attributes.
usage: check_nifti.py DATA.h5 IMAGE.nii.gz LABEL.nii.gz MAP.txt"""
import sys
import h5py
import nibabel as nib
import numpy as np

data, image, label, mapfile = sys.argv[1:5]
failed = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failed.append(what)


lut = {}
names = {}
for line in open(mapfile):
    line = line.split('#', 1)[0].split()
    if not line:
        continue
    src, dst = int(line[0]), int(line[1])
    lut[src] = dst
    if len(line) > 2 and dst not in names:
        names[dst] = ' '.join(line[2:])
K = max(lut.values()) + 1

img_n = nib.load(image)
vox = np.asarray(img_n.get_fdata(), dtype=np.float64)        # [x, y, z]
lab_raw = np.asarray(nib.load(label).dataobj).astype(np.int64)
mapped = np.vectorize(lambda v: lut[int(v)])(np.unique(lab_raw))
table = dict(zip(np.unique(lab_raw).tolist(), mapped.tolist()))
lab_map = np.zeros_like(lab_raw)
for s, t in table.items():
    lab_map[lab_raw == s] = t

with h5py.File(data, 'r') as f:
    check(f.attrs['format'] == 'tessera-dataset', 'root attribute format')
    check(int(f.attrs['num_samples']) == 1, 'one sample')
    g = f['samples/000000']
    im = g['image'][...]
    lb = g['label'][...]
    check(im.dtype == np.float32 and lb.dtype == np.uint8, 'dtypes float32 / uint8')
    nx, ny, nz = vox.shape
    check(im.shape == (1, nz, ny, nx) and lb.shape == (nz, ny, nx),
          'shapes %s %s = [1, %d, %d, %d]' % (im.shape, lb.shape, nz, ny, nx))
    tv = vox.transpose(2, 1, 0)
    check(np.array_equal(im[0].astype(np.float64), tv), 'image equals the NIfTI voxels everywhere')
    s_h5, s_ni = float(im.astype(np.float64).sum()), float(vox.sum())
    check(s_h5 == s_ni, 'image sum %.1f = NIfTI sum %.1f' % (s_h5, s_ni))
    probes = [(0, 0, 0), (nx - 1, ny - 1, nz - 1), (nx // 2, ny // 2, nz // 2), (nx // 4, 2 * ny // 3, nz // 3),
              (2 * nx // 3, ny // 5, 3 * nz // 4)]
    for (i, j, k) in probes:
        check(float(im[0, k, j, i]) == vox[i, j, k], 'probe (i=%d, j=%d, k=%d): %g' % (i, j, k, vox[i, j, k]))
    check(np.array_equal(lb, lab_map.transpose(2, 1, 0)), 'label equals the mapped atlas everywhere')
    hist = np.bincount(lb.ravel(), minlength=K)
    want = np.bincount(lab_map.ravel(), minlength=K)
    check(np.array_equal(hist, want), 'class histogram %s = mapped atlas %s' % (hist.tolist(), want.tolist()))
    check(np.array_equal(f['stats/class_voxels'][0], want), '/stats/class_voxels')
    check(np.array_equal(f.attrs['class_voxels'], want), 'root class_voxels')
    check(list(f.attrs['class_names'])[1:] == [names.get(k, '') for k in range(1, K)], 'class names from the map')
    check(np.allclose(g.attrs['mean'][0], vox.mean(), rtol=1e-12), 'mean %.6f' % vox.mean())
    check(np.allclose(g.attrs['std'][0], vox.std(), rtol=1e-9), 'std %.6f' % vox.std())
    fgv = vox[vox > vox.mean()]  # data.norm = foreground: the voxels above the mean
    check(np.allclose([g.attrs['fg_mean'][0], f['stats/fg_mean'][0, 0]], fgv.mean(), rtol=1e-9) and
          np.allclose([g.attrs['fg_std'][0], f['stats/fg_std'][0, 0]], fgv.std(), rtol=1e-9),
          'foreground mean %.6f std %.6f over %d voxels above the mean' % (fgv.mean(), fgv.std(), fgv.size))
    levels = f.attrs['percentile_levels']
    check(np.allclose(g.attrs['percentiles'][0], np.percentile(vox, levels), rtol=1e-6, atol=1e-6),
          'percentiles %s' % np.percentile(vox, levels).tolist())
    zooms = img_n.header.get_zooms()[:3]
    check(np.allclose(g.attrs['spacing'], zooms[::-1]), 'spacing (D, H, W) = pixdim (z, y, x)')
    check(np.allclose(g.attrs['sform'], img_n.header.get_sform()), 'sform = NIfTI sform')
    check(int(g.attrs['sform_code']) == int(img_n.header['sform_code']), 'sform_code')
    fg = g['foreground'][...]
    check(len(fg) > 0 and all(lb[tuple(c)] > 0 for c in fg[:200]), 'foreground coordinates are foreground')

sys.exit(1 if failed else 0)
