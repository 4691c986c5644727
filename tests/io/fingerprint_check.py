"""Checks of tests/io/fingerprint.sh against NumPy: argv = mode, files."""
import sys
import h5py
import nibabel as nib
import numpy as np

mode = sys.argv[1]


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-12)


def target_spacing(sp, sh):
    """nnU-Net's rule (ExperimentPlanner.determine_fullres_target_spacing)."""
    t = np.percentile(sp, 50, axis=0)
    size = np.percentile(sh, 50, axis=0)
    w = int(np.argmax(t))
    o = [d for d in range(3) if d != w]
    if t[w] > 3 * max(t[o]) and size[w] * 3 < min(size[o]):
        s = np.percentile(sp[:, w], 10)
        if s < max(t[o]):
            s = max(t[o]) + 1e-5
        t[w] = s
    return t


if mode == 'convert':  # DATA.h5 TARGET_X,Y,Z img0 lab0 img1 lab1 ...
    path, tgt = sys.argv[2], [float(v) for v in sys.argv[3].split(',')][::-1]
    pairs = list(zip(sys.argv[4::2], sys.argv[5::2]))
    allv, agree = [], []
    with h5py.File(path, 'r') as f:
        fp = f['fingerprint']
        assert list(fp.attrs['modalities']) == ['CT'], fp.attrs['modalities']
        assert fp.attrs['crop_nonzero'] == 1 and fp.attrs['label_resampling'] == 'linear'
        assert np.allclose(fp.attrs['target_spacing'], tgt)
        for i, (ip, lp) in enumerate(pairs):
            g = f['samples/%06d' % i]
            im = nib.load(ip)
            x = np.asarray(im.dataobj, dtype=np.float32).transpose(2, 1, 0)  # D, H, W
            lab = np.asarray(nib.load(lp).dataobj).transpose(2, 1, 0).astype(np.uint8)
            sp = np.array(im.header.get_zooms()[:3][::-1], dtype=np.float64)
            nz = np.argwhere(x != 0)
            box = np.concatenate([nz.min(0), nz.max(0) + 1])
            assert list(g.attrs['crop_box']) == list(box) == list(fp['crop_box'][i]), (g.attrs['crop_box'], box)
            assert list(g.attrs['shape_original']) == list(x.shape) == list(fp['shape_original'][i])
            assert np.allclose(g.attrs['spacing_original'], sp) and np.allclose(fp['spacing_original'][i], sp)
            cn = box[3:] - box[:3]
            assert list(fp['shape_cropped'][i]) == list(cn)
            want = np.maximum(1, np.floor(cn * sp / np.array(tgt) + 0.5)).astype(int)
            st = g['label'].shape
            assert list(st) == list(want) == list(fp['shape'][i]), (st, want)
            # a non-integer factor on every axis, the exact grid spacing recorded
            r = cn / want
            assert all(abs(v - round(v)) > 0.01 for v in r), r
            assert np.allclose(g.attrs['spacing'], sp * r) and np.allclose(fp['spacing'][i], sp * r)
            # the stored origin is the cropped scan's, moved half a coarse voxel less half a fine one
            A = im.affine
            want_t = A[:3, 3] + A[:3, :3] @ (box[:3][::-1] + (r[::-1] - 1) / 2)
            assert np.allclose(g.attrs['sform'][:3, 3], want_t, atol=1e-6), (g.attrs['sform'], want_t)
            # labels preserved: each voxel of the cropped scan against its nearest stored voxel
            lc = lab[box[0]:box[3], box[1]:box[4], box[2]:box[5]]
            idx = [np.clip(np.floor((np.arange(n) + 0.5) / rr).astype(int), 0, m - 1) for n, rr, m in zip(cn, r, st)]
            back = g['label'][...][np.ix_(*idx)]
            agree.append((back == lc).mean())
            # nothing labelled lay outside the crop
            assert lc.sum() == lab.sum()
            # the foreground statistics are over the cropped scan before resampling, as nnU-Net's
            xc = x[box[0]:box[3], box[1]:box[4], box[2]:box[5]].astype(np.float64)
            allv.append(xc[lc > 0])
        v = np.concatenate(allv)
        assert fp.attrs['foreground_voxels'] == v.size == fp.attrs['intensity_sampled']
        worst = max(rel(fp.attrs['intensity_mean'][0], v.mean()), rel(fp.attrs['intensity_std'][0], v.std()),
                    rel(fp.attrs['intensity_min'][0], v.min()), rel(fp.attrs['intensity_max'][0], v.max()))
        pw = max(rel(a, b) for a, b in zip(fp.attrs['intensity_percentiles'][0], np.percentile(v, [0.5, 50, 99.5])))
    print('label agreement per sample', ['%.4f' % a for a in agree], 'statistics rel. diff', worst, 'percentiles', pw)
    assert min(agree) >= 0.97 and worst < 1e-9 and pw < 1e-6

elif mode == 'spacing':  # DATA.h5: the target spacing rule over the fingerprint = NumPy's, and what convert used
    with h5py.File(sys.argv[2], 'r') as f:
        fp = f['fingerprint']
        t = target_spacing(fp['spacing_original'][...], fp['shape_cropped'][...])
        print('target (D, H, W)', t, 'stored', fp.attrs['target_spacing'])
        assert np.allclose(fp.attrs['target_spacing'], t, rtol=1e-12)
        if len(sys.argv) > 3:  # the anisotropic set: D from the 10th percentile, not the median
            assert abs(t[0] - np.percentile(fp['spacing_original'][:, 0], 10)) < 1e-12 and t[0] < 5 - 0.5, t
    print('%.6g %.6g %.6g' % tuple(t))

elif mode == 'ct':  # DATA.h5 DUMPDIR: every dumped patch = a box of a sample's CT-normalised image
    import glob
    with h5py.File(sys.argv[2], 'r') as f:
        fp = f['fingerprint']
        m, s = fp.attrs['intensity_mean'][0], fp.attrs['intensity_std'][0]
        lo, hi = fp.attrs['intensity_percentiles'][0][[0, 2]]
        vols = []
        for k in sorted(f['samples']):
            x = f['samples/' + k + '/image'][0]
            vols.append(((np.clip(x, np.float32(lo), np.float32(hi)) - np.float32(m)) * np.float32(1 / s)))
    n = 0
    clipped = 0
    for p in sorted(glob.glob(sys.argv[3] + '/patch-*_image.nii')):
        y = np.asarray(nib.load(p).dataobj, dtype=np.float32)
        y = y.reshape(y.shape[:3]).transpose(2, 1, 0)
        best = np.inf
        for v in vols:
            for a in range(v.shape[0] - y.shape[0] + 1):
                for b in range(v.shape[1] - y.shape[1] + 1):
                    for c in range(v.shape[2] - y.shape[2] + 1):
                        d = np.abs(v[a:a + y.shape[0], b:b + y.shape[1], c:c + y.shape[2]] - y).max()
                        best = min(best, d)
        assert best < 1e-5, (p, best)
        clipped += int((y == np.float32((np.float32(lo) - np.float32(m)) * np.float32(1 / s))).sum())
        n += 1
    print('patches', n, 'clipped voxels at the 0.5 percentile', clipped)
    assert n > 0 and clipped > 0
elif mode == 'mixed':  # DATA.h5 DUMPDIR: data.norm = ct,foreground on a CT + MR dataset
    # channel 0 of every dumped patch is a box of NumPy's clip to the
    # dataset's foreground [p0.5, p99.5] and z-score with its foreground
    # mean/std (channel 0's); channel 1, the same box, the z-score with the
    # sample's own mean/std over its voxels above its mean
    import glob
    with h5py.File(sys.argv[2], 'r') as f:
        fp = f['fingerprint']
        m, s = fp.attrs['intensity_mean'][0], fp.attrs['intensity_std'][0]
        lo, hi = fp.attrs['intensity_percentiles'][0][[0, 2]]
        vols = []
        for k in sorted(f['samples']):
            x = f['samples/' + k + '/image'][...].astype(np.float32)
            c0 = (np.clip(x[0], np.float32(lo), np.float32(hi)) - np.float32(m)) * np.float32(1 / s)
            mr = x[1][x[1] > x[1].mean(dtype=np.float64)].astype(np.float64)
            c1 = (x[1] - np.float32(mr.mean())) * np.float32(1 / mr.std())
            vols.append((c0, c1))
    n = 0
    for p in sorted(glob.glob(sys.argv[3] + '/patch-*_image.nii')):
        y = np.asarray(nib.load(p).dataobj, dtype=np.float32)
        assert y.ndim == 4 and y.shape[3] == 2, (p, y.shape)
        y = y.transpose(3, 2, 1, 0)
        best, where = np.inf, None
        for i, (v, _) in enumerate(vols):
            for a in range(v.shape[0] - y.shape[1] + 1):
                for b in range(v.shape[1] - y.shape[2] + 1):
                    for c in range(v.shape[2] - y.shape[3] + 1):
                        d = np.abs(v[a:a + y.shape[1], b:b + y.shape[2], c:c + y.shape[3]] - y[0]).max()
                        if d < best:
                            best, where = d, (i, a, b, c)
        assert best < 1e-5, (p, best)
        i, a, b, c = where
        v1 = vols[i][1][a:a + y.shape[1], b:b + y.shape[2], c:c + y.shape[3]]
        d1 = np.abs(v1 - y[1]).max()
        assert d1 < 1e-4, (p, 'channel 1 (foreground z-score)', d1)
        n += 1
    print('patches', n, 'each channel by its own mode')
    assert n > 0
elif mode == 'image':  # DATA.h5 img0 img1 ...: each stored image = SciPy's resampling of the cropped scan
    # scipy.ndimage.map_coordinates at the voxel centres of the new grid (align_corners=False, clamped to
    # the scan): order 3 (B-spline, mirror boundary) or 1 as /fingerprint says; on an anisotropic scan
    # (largest spacing > 3x the smallest, judged on the scan's spacing, else the target's, a single such
    # axis) that axis by the nearest voxel; a cubic voxel whose trilinear taps are all 0 is 0
    from scipy import ndimage as ndi

    def lowres_axis(sp):
        sp = np.asarray(sp, dtype=np.float64)
        if sp.max() / sp.min() <= 3:
            return None
        ax = np.flatnonzero(sp == sp.max())
        return int(ax[0]) if len(ax) == 1 else -1

    with h5py.File(sys.argv[2], 'r') as f:
        fp = f['fingerprint']
        cubic = fp.attrs['image_resampling'] == 'cubic'
        separate = int(fp.attrs['separate_anisotropic_axis']) == 1
        tgt = fp.attrs['target_spacing']
        seps, worst, shapes = [], 0.0, []
        for i, ip in enumerate(sys.argv[3:]):
            g = f['samples/%06d' % i]
            x = np.asarray(nib.load(ip).dataobj, dtype=np.float32).transpose(2, 1, 0).astype(np.float64)
            b = g.attrs['crop_box']
            x = x[b[0]:b[3], b[1]:b[4], b[2]:b[5]]
            got = g['image'][0].astype(np.float64)
            shapes.append((x.shape, got.shape))
            sep = None
            if separate:
                sep = lowres_axis(g.attrs['spacing_original'])
                if sep is None:
                    sep = lowres_axis(tgt)
                if sep == -1:
                    sep = None
            seps.append(sep)
            pos = [np.clip((np.arange(m) + 0.5) * n / m - 0.5, 0, n - 1) for n, m in zip(x.shape, got.shape)]
            if sep is not None:  # the nearest slices first; integer coordinates along that axis after
                t = pos[sep] - np.floor(pos[sep])
                near = np.minimum(np.floor(pos[sep]).astype(int) + (t >= 0.5), x.shape[sep] - 1)
                x = np.take(x, near, axis=sep)
                pos[sep] = np.arange(got.shape[sep], dtype=np.float64)
            want = ndi.map_coordinates(x, np.meshgrid(*pos, indexing='ij'), order=3 if cubic else 1, mode='mirror')
            if cubic:  # the zero background stays 0: OR of the non-zero indicator over the trilinear taps
                nz = (x != 0).astype(np.uint8)
                for a in range(3):
                    lo = np.floor(pos[a]).astype(int)
                    if a == sep:  # already the nearest slices: one tap
                        nz = np.take(nz, lo, axis=a)
                        continue
                    nz = np.maximum(np.take(nz, lo, axis=a), np.take(nz, np.minimum(lo + 1, x.shape[a] - 1), axis=a))
                want = np.where(nz > 0, want, 0.0)
                assert np.all(got[nz == 0] == 0)
            err = np.abs(got - want).max() / np.abs(want).max()
            worst = max(worst, err)
            assert err < 1e-5, (i, err)
    print('image resampling', 'cubic' if cubic else 'linear', 'separate axes', seps, 'max rel. error', worst,
          'shapes', shapes)
    if len(sys.argv) > 2 and separate and all(s is None for s in seps):
        print('note: no scan was anisotropic')
else:
    raise SystemExit('unknown mode ' + mode)
