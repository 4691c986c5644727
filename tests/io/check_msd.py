"""Cross-checks a tessera dataset converted from an MSD task folder against
its NIfTI files with h5py and nibabel only: opens the manifest (samples
through its external links to the shards), compares every image (4-D,
modalities as channels) and label voxel for voxel, and the per-case sums
and class counts in expected.txt (computed by mkmsd from the sources).
usage: check_msd.py DATA.h5 TASK_DIR SHARDS"""
import json
import os
import sys
import h5py
import nibabel as nib
import numpy as np

data, task, shards = sys.argv[1], sys.argv[2], int(sys.argv[3])
failed = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failed.append(what)


js = json.load(open(os.path.join(task, 'dataset.json')))
expected = {}
for line in open(os.path.join(task, 'expected.txt')):
    p = line.split()
    expected[p[0]] = [float(x) for x in p[1:]]
with h5py.File(data, 'r') as f:
    n = int(f.attrs['num_samples'])
    check(n == len(js['training']), 'num_samples %d' % n)
    check(int(f.attrs['shards']) == shards and (shards == 1 or len(f.attrs['shard_files']) == shards),
          '%d shard(s)' % shards)
    check(list(f.attrs['channel_names']) == [js['modality'][str(c)] for c in range(len(js['modality']))],
          'channel names from modality')
    check(list(f.attrs['class_names']) == [js['labels'][str(k)] for k in range(len(js['labels']))],
          'class names from labels')
    idx = f['index'][...]
    for i, e in enumerate(js['training']):
        name = os.path.basename(e['image']).split('.nii')[0]
        g = f['samples/%06d' % i]          # through the external link into the shard
        check(idx[i]['name'].decode() == name and g.attrs['name'] == name, 'sample %d is %s' % (i, name))
        im = g['image'][...]
        lb = g['label'][...]
        ni = np.asarray(nib.load(os.path.join(task, e['image'])).get_fdata(), dtype=np.float64)
        nl = np.asarray(nib.load(os.path.join(task, e['label'])).dataobj)
        check(im.shape == (ni.shape[3],) + ni.shape[2::-1], '%s: shape %s' % (name, im.shape))
        check(np.array_equal(im.astype(np.float64), ni.transpose(3, 2, 1, 0)), '%s: image voxels' % name)
        check(np.array_equal(lb, nl.transpose(2, 1, 0)), '%s: label voxels' % name)
        ex = expected[name]
        check(list(im.shape[1:]) == ex[0:3], '%s: size as made' % name)
        sums = [float(im[c].astype(np.float64).sum()) for c in range(2)]
        check(np.allclose(sums, ex[3:5], rtol=0, atol=0.51), '%s: channel sums %s' % (name, sums))
        check(np.bincount(lb.ravel(), minlength=3).tolist() == [int(x) for x in ex[5:8]],
              '%s: class counts' % name)
        check(np.allclose(g.attrs['sform'], nib.load(os.path.join(task, e['image'])).header.get_sform()),
              '%s: sform' % name)
sys.exit(1 if failed else 0)
