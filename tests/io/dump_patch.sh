#!/bin/sh
# issue [11] acceptance 5: every augmentation (flips, rotations, rotation,
# zoom and elastic deformation, gamma, intensity scale and shift, noise) is
# deterministic for a seed and the same whatever the number of ranks:
# `tessera bench io --dump-patch` writes the first batch's patches (named by
# stream position) on 1 rank, on 2 data-parallel ranks, on a spatial group
# of 2 (split along D, then along H) and on 2 x 2; every file must be
# byte for byte the 1-rank one. Also: the augmentation did something, and
# another seed gives other patches.
. "$TS_SRCDIR/tests/mpi/lib.sh"
. "$TS_SRCDIR/tests/io/lib_io.sh"
d=$(mktemp -d "${TMPDIR:-/tmp}/ts-io.XXXXXX") || exit 1
trap 'rm -rf "$d"' EXIT
tessera="$TS_BUILDDIR/tessera"
ts_step "synth a dataset (5 phantoms of 20^3, 2 channels)" \
    "$tessera" synth --out "$d/s.h5" --count 5 --size 20 --channels 2 --chunk 8
cat > "$d/c.ini" <<INI
[data]
path = $d/s.h5
patch = 16,12,12
fg_fraction = 0.5
rot_p = 1
zoom_p = 1
elastic_p = 1
elastic_points = 5
elastic_disp = 3
noise_p = 1
gamma = 0.5
[train]
seed = 7
INI
files="000000 000001 000002 000003"
dump() { # NAME NP ARGS...: dump the first batch of positions 0..3 into $d/NAME
    _n=$1; _np=$2; shift 2
    mkdir -p "$d/$_n"
    ts_step "dump on $_np rank(s): $*" ts_mpirun "$_np" "$tessera" bench io "$d/c.ini" --dump-patch "$d/$_n" "$@"
}
same() { # NAME: every file equals the 1-rank one
    _ok=1
    for p in $files; do
        for k in image label; do
            cmp -s "$d/one/patch-${p}_$k.nii" "$d/$1/patch-${p}_$k.nii" || { _ok=0; echo "# $1: patch-${p}_$k.nii differs or is missing"; }
        done
    done
    ts_check "$1: the 4 patches (image and label) are byte for byte the 1-rank ones" [ $_ok = 1 ]
}
dump one 1 train.batch=4
ts_check "1 rank: 8 files written" [ "$(ls "$d/one" | wc -l)" -eq 8 ]
dump dp2 2 train.batch=2
same dp2
dump sp2 2 train.batch=4 parallel.sp=2
same sp2
dump sp2h 2 train.batch=4 parallel.sp=2 parallel.sp_dims=1,2,1
same sp2h
dump dp2sp2 4 train.batch=2 parallel.sp=2 parallel.sp_dims=1,1,2
same dp2sp2
dump again 1 train.batch=4
same again
# something happened: without augmentation, or with another seed, other patches
dump plain 1 train.batch=4 data.augment=false
diff_all() { # NAME: every image differs from the 1-rank one
    _ok=1
    for p in $files; do cmp -s "$d/one/patch-${p}_image.nii" "$d/$1/patch-${p}_image.nii" && _ok=0; done
    ts_check "$1: every image differs from the augmented one" [ $_ok = 1 ]
}
diff_all plain
dump seed 1 train.batch=4 train.seed=8
diff_all seed
# bad input: an error on every rank before any work, naming the key or the file
ts_fails_on_all "data.zoom_min above data.zoom_max" "data.zoom_min (1.5)" 2 \
    ts_mpirun 2 "$tessera" bench io "$d/c.ini" --dump-patch "$d/one" data.zoom_min=1.5 data.zoom_max=1.2
ts_fails_on_all "a dump folder that does not exist" "--dump-patch $d/nodir is not a writable directory" 2 \
    ts_mpirun 2 "$tessera" bench io "$d/c.ini" --dump-patch "$d/nodir" parallel.sp=2
if [ -n "$TS_PY" ]; then
    ts_step "the files: 12x12x16 with 2 channels (float32) and labels 0..2 (uint8)" \
        "$TS_PY" -c "
import nibabel as nib, numpy as np, sys
d = sys.argv[1]
for p in ['000000', '000001', '000002', '000003']:
    im = nib.load(f'{d}/one/patch-{p}_image.nii'); lb = nib.load(f'{d}/one/patch-{p}_label.nii')
    assert im.shape == (12, 12, 16, 2) and im.get_data_dtype() == np.float32, im.shape
    assert lb.shape == (12, 12, 16) and lb.get_data_dtype() == np.uint8, lb.shape
    x = np.asarray(lb.dataobj); assert x.max() <= 2 and np.isfinite(np.asarray(im.dataobj)).all()
print('ok')
" "$d"
else
    ts_skip "the files' shapes" "no Python with nibabel"
fi
ts_finish
