#!/bin/sh
# data.norm = foreground (issue [11] acceptance 2, second half): the
# per-sample, per-channel mean and std over the foreground mask (the
# channel's voxels above its mean) that the writer stores match a NumPy
# computation on the stored images; a dataset written before them is an
# error naming the file on every rank when the mode is asked for; training
# with it and the nnU-Net intensity augmentations runs, also over a spatial
# group.
. "$TS_SRCDIR/tests/mpi/lib.sh"
. "$TS_SRCDIR/tests/io/lib_io.sh"
TESSERA="$TS_BUILDDIR/tessera"
export OMP_NUM_THREADS=1
d=$(mktemp -d "${TMPDIR:-/tmp}/ts-fgnorm.XXXXXX") || exit 1
trap 'rm -rf "$d"' EXIT

ts_step "synthetic dataset: 3 samples of 16x12x20, 2 channels, 2 ranks" \
    ts_mpirun 2 "$TESSERA" synth --out "$d/syn.h5" --count 3 --size 16,12,20 --channels 2 --classes 3 --seed 5
if [ -n "$TS_PY" ]; then
    ts_step "foreground mean/std of every sample and channel = NumPy's over the voxels above the mean (1e-9)" \
        "$TS_PY" - "$d/syn.h5" <<'PY'
import sys
import h5py
import numpy as np
with h5py.File(sys.argv[1], 'r') as f:
    fm, fs = f['stats/fg_mean'][...], f['stats/fg_std'][...]
    n = int(f.attrs['num_samples'])
    assert fm.shape == fs.shape == (n, 2), fm.shape
    worst = 0.0
    for i in range(n):
        g = f['samples/%06d' % i]
        x = g['image'][...].astype(np.float64)
        for c in range(x.shape[0]):
            v = x[c]
            m = v[v > v.mean()]
            assert 0 < m.size < v.size
            want = (m.mean(), m.std())
            for got in ((fm[i, c], fs[i, c]), (g.attrs['fg_mean'][c], g.attrs['fg_std'][c])):
                for a, b in zip(got, want):
                    worst = max(worst, abs(a - b) / abs(b))
            # and it is not the statistics over all voxels
            assert abs(fm[i, c] - v.mean()) > 0.1 * v.std()
    print('samples', n, 'worst relative difference', worst)
    assert worst < 1e-9
PY
    ts_step "an older dataset: the same without /stats/fg_mean and fg_std" "$TS_PY" -c "
import shutil, h5py
shutil.copy('$d/syn.h5', '$d/old.h5')
with h5py.File('$d/old.h5', 'r+') as f:
    del f['stats/fg_mean'], f['stats/fg_std']"
else
    ts_skip "foreground statistics against NumPy" "no python3 with h5py and numpy"
    ts_skip "an older dataset" "no python3 with h5py"
fi
cat >"$d/t.ini" <<'INI'
[model]
channels = 4,8
in_channels = 2
classes = 3
norm = batch
sync_bn = true
[data]
patch = 12
norm = foreground
noise_p = 0.1
brightness_p = 0.15
contrast_p = 0.15
gamma_inv_p = 0.1
blur_p = 0.2
lowres_p = 0.25
[train]
batch = 2
steps = 2
lr = 0.1
loss = ce
log_every = 1
[eval]
final = false
INI
if [ -f "$d/old.h5" ]; then
    ts_fails_on_all "data.norm = foreground on the older dataset: an error naming it on both ranks" \
        "$d/old.h5 has no foreground statistics" 2 \
        ts_mpirun 2 "$TESSERA" train "$d/t.ini" data.path="$d/old.h5" run.dir="$d/old"
fi
ts_step "train 2 steps with data.norm = foreground and the intensity augmentations, 2 ranks" \
    ts_mpirun 2 "$TESSERA" train "$d/t.ini" data.path="$d/syn.h5" run.dir="$d/dp"
ts_step "the same over a spatial group (parallel.sp = 2)" \
    ts_mpirun 2 "$TESSERA" train "$d/t.ini" data.path="$d/syn.h5" run.dir="$d/sp" parallel.sp=2 train.batch=1
ts_check "both wrote a checkpoint" [ -d "$d/dp/ckpt" ] && [ -d "$d/sp/ckpt" ]
ts_finish
