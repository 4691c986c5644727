"""NumPy/nibabel side of tests/train/infer_prep.sh: argv = mode, arguments.
make OUT: scans (a head of non-zero voxels off-centre in a zero background,
smooth nested-sphere labels of 3 classes) with their labels;
stored DATA.h5 I OUT.nii.gz: sample I of a dataset (its preprocessed image
and geometry) as NIfTI; check SCAN MASK [DATA.h5 I PRE_MASK]: the mask on
the scan's grid and affine, 0 outside the scan's non-zero box, foreground
inside, and (with the rest) equal on >= 99.9 % of the voxels to the mask
predicted on the stored sample put back by hand (resampled to the crop box
as io/resample.c does, one-hot linear or nearest as the dataset's labels
were, or each voxel repeated F times for --downsample F, then placed at
the box)."""
import sys
import h5py
import nibabel as nib
import numpy as np

mode = sys.argv[1]


def save(arr, A, path):
    h = nib.Nifti1Image(arr, A)
    h.set_sform(A, 1)
    h.set_qform(A, 1)
    nib.save(h, path)


def taps(n_in, n_out):
    """io/resample.c: output voxel o samples the input at (o + 0.5) n_in / n_out - 0.5, clamped."""
    x = np.clip((np.arange(n_out) + 0.5) * n_in / n_out - 0.5, 0, n_in - 1)
    a = np.floor(x).astype(int)
    return a, np.minimum(a + 1, n_in - 1), x - a


def resample_labels(lab, out, nearest):
    """ts_resample_labels: nearest, or one-hot linear (each class's indicator
    trilinear, the largest weight; a tie to the smaller class)."""
    t = [taps(n, m) for n, m in zip(lab.shape, out)]
    if nearest:
        return lab[np.ix_(*[np.where(w >= 0.5, b, a) for a, b, w in t])]
    ws = []
    for k in range(int(lab.max()) + 1):
        v = (lab == k).astype(np.float64)
        for ax, (a, b, w) in enumerate(t):
            sh = [1, 1, 1]
            sh[ax] = -1
            v = np.take(v, a, axis=ax) * (1 - w).reshape(sh) + np.take(v, b, axis=ax) * w.reshape(sh)
        ws.append(v)
    return np.argmax(np.stack(ws), axis=0).astype(lab.dtype)


if mode == 'make':
    out = sys.argv[2]
    rng = np.random.default_rng(5)
    scans = [((46, 40, 30), (0.7, 0.8, 1.1)), ((42, 44, 28), (0.75, 0.8, 1.15)), ((48, 38, 32), (0.7, 0.85, 1.05))]
    for i, (sh, sp) in enumerate(scans):
        x, y, z = np.meshgrid(*[np.arange(n, dtype=np.float64) for n in sh], indexing='ij')
        c = np.array(sh) * np.array([0.58, 0.45, 0.55])
        r = np.sqrt(((x - c[0]) * sp[0]) ** 2 + ((y - c[1]) * sp[1]) ** 2 + ((z - c[2]) * sp[2]) ** 2)
        lab = ((r < 7).astype(np.uint8) + (r < 3.5)).astype(np.uint8)
        head = r < 10.5
        img = np.where(head, 40 + 60 * lab + rng.normal(0, 5, sh), 0).astype(np.float32)
        A = np.diag(list(sp) + [1.0])
        A[:3, 3] = [-10.5, 4.0, 2.25]
        save(img, A, '%s/img%d.nii.gz' % (out, i))
        save(lab, A, '%s/lab%d.nii.gz' % (out, i))

elif mode == 'stored':
    path, i, out = sys.argv[2], int(sys.argv[3]), sys.argv[4]
    with h5py.File(path, 'r') as f:
        g = f['samples/%06d' % i]
        img = g['image'][0].astype(np.float32).transpose(2, 1, 0)  # D, H, W -> x, y, z
        save(img, np.asarray(g.attrs['sform'], dtype=np.float64), out)

elif mode == 'check':
    scan, mask = nib.load(sys.argv[2]), nib.load(sys.argv[3])
    x = np.asarray(scan.dataobj, dtype=np.float32).transpose(2, 1, 0)  # D, H, W
    m = np.asarray(mask.dataobj).transpose(2, 1, 0)
    assert m.shape == x.shape, (m.shape, x.shape)
    assert np.allclose(mask.affine, scan.affine, atol=1e-6), (mask.affine, scan.affine)
    assert np.allclose(mask.header.get_zooms()[:3], scan.header.get_zooms()[:3])
    nz = np.argwhere(x != 0)
    box = np.concatenate([nz.min(0), nz.max(0) + 1])
    inside = np.zeros(m.shape, bool)
    inside[box[0]:box[3], box[1]:box[4], box[2]:box[5]] = True
    assert not inside.all(), 'the crop box is the whole scan: nothing tested'
    out_fg, in_fg = int((m[~inside] != 0).sum()), int((m[inside] != 0).sum())
    print('crop box', list(box), 'foreground voxels outside', out_fg, 'inside', in_fg)
    assert out_fg == 0 and in_fg > 0
    if len(sys.argv) > 4:
        with h5py.File(sys.argv[4], 'r') as f:
            g = f['samples/%06d' % int(sys.argv[5])]
            assert list(g.attrs['crop_box']) == list(box), (g.attrs['crop_box'], box)
            nearest = f['fingerprint'].attrs['label_resampling'] == 'nearest'
            down = int(f['fingerprint'].attrs['downsample'])
            if down > 1:  # the stored grid starts at the crop box's corner, its voxels F times larger
                A = scan.affine.copy()
                A[:3, 3] += A[:3, :3] @ (box[:3][::-1] + (down - 1) / 2.0)
                A[:3, :3] *= down
                assert np.allclose(g.attrs['sform'], A, atol=1e-6), (g.attrs['sform'], A)
        q = np.asarray(nib.load(sys.argv[6]).dataobj).transpose(2, 1, 0)
        cn = box[3:] - box[:3]
        back = np.zeros_like(m)
        if down > 1:  # convert --downsample F: ts_resample_up_labels repeats each coarse voxel F times
            up = q.repeat(down, 0).repeat(down, 1).repeat(down, 2)[:cn[0], :cn[1], :cn[2]]
        else:
            r = cn / np.array(q.shape)
            assert all(abs(v - 1) > 0.01 for v in r), ('resampled by a factor on every axis', r)
            up = resample_labels(q, cn, nearest)
        back[box[0]:box[3], box[1]:box[4], box[2]:box[5]] = up
        agree = (back == m).mean()
        fg = (back != 0) | (m != 0)
        print('agreement with the stored sample predicted and put back by hand: %.5f of the voxels, %.4f of the '
              'foreground' % (agree, (back == m)[fg].mean()))
        assert agree >= 0.999
elif mode == 'probs':  # SCAN PROBS DATA.h5 I PRE_PROBS: PROBS = PRE_PROBS (predicted on stored sample I) put back
    from scipy import ndimage as ndi
    scan, pr = nib.load(sys.argv[2]), nib.load(sys.argv[3])
    x = np.asarray(scan.dataobj, dtype=np.float32).transpose(2, 1, 0)  # D, H, W
    p = np.asarray(pr.dataobj, dtype=np.float64).transpose(3, 2, 1, 0)  # K, D, H, W
    q = np.asarray(nib.load(sys.argv[6]).dataobj, dtype=np.float64).transpose(3, 2, 1, 0)
    assert p.shape[1:] == x.shape and p.shape[0] == q.shape[0], (p.shape, x.shape, q.shape)
    assert np.allclose(pr.affine, scan.affine, atol=1e-6)
    with h5py.File(sys.argv[4], 'r') as f:
        g = f['samples/%06d' % int(sys.argv[5])]
        box = np.asarray(g.attrs['crop_box'])
        assert int(f['fingerprint'].attrs['downsample']) <= 1
        sp = np.asarray(g.attrs['spacing_original'])
        assert sp.max() / sp.min() <= 3, 'an anisotropic scan: this check resamples every axis linearly'
    cn = box[3:] - box[:3]
    # nnU-Net's export: each class linearly (scipy order 1 at the voxel centres, clamped), background 1 outside
    pos = np.meshgrid(*[np.clip((np.arange(m) + 0.5) * n / m - 0.5, 0, n - 1) for n, m in zip(q.shape[1:], cn)],
                      indexing='ij')
    want = np.zeros_like(p)
    want[0] = 1
    for k in range(q.shape[0]):
        want[k, box[0]:box[3], box[1]:box[4], box[2]:box[5]] = ndi.map_coordinates(q[k], pos, order=1)
    err = np.abs(p - want).max()
    s = p.sum(0)
    print('probabilities put back: max difference %.3g, sums in [%.6f, %.6f], box' % (err, s.min(), s.max()),
          list(box))
    assert err < 1e-5 and np.abs(s - 1).max() < 1e-5
    outside = np.ones(x.shape, bool)
    outside[box[0]:box[3], box[1]:box[4], box[2]:box[5]] = False
    assert outside.any() and (p[0][outside] == 1).all()
    m = np.asarray(nib.load(sys.argv[7]).dataobj).transpose(2, 1, 0)
    agree = (p.argmax(0) == m).mean()
    print('the mask (labels resampled one-hot linear) = the probabilities\' argmax on %.5f of the voxels' % agree)
    assert agree >= 0.99
else:
    sys.exit('unknown mode ' + mode)
