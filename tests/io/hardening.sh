#!/bin/sh
# Input hardening (issue [8]), on 2 ranks: headers that do not match their
# file, non-finite voxels at conversion and in a dataset, size arguments that
# would wrap around, and paths too long for their buffers. Each must fail on
# every rank with a message naming the file, key or argument (or, for
# --nan-to, convert with a warning naming the file and the count), without a
# crash. Inputs are made by tests/io/mkbad (no external data needed).
. "$TS_SRCDIR/tests/mpi/lib.sh"
. "$TS_SRCDIR/tests/io/lib_io.sh"
d=$(mktemp -d "${TMPDIR:-/tmp}/ts-hard.XXXXXX") || exit 1
trap 'rm -rf "$d"' EXIT
tessera="$TS_BUILDDIR/tessera"
mkbad="$TS_BUILDDIR/tests/io/mkbad"
export OMP_NUM_THREADS=1

ts_step "make the NIfTI inputs (8^3 float image, uint8 label; images with 3 non-finite voxels)" sh -c "
    '$mkbad' image '$d/img.nii' 8 0 && '$mkbad' label '$d/lab.nii' 8 &&
    '$mkbad' image '$d/nan3.nii' 8 3 && '$mkbad' image '$d/nan3.nii.gz' 8 3"
ts_step "the intact pair converts" \
    ts_mpirun 2 "$tessera" convert nifti --image "$d/img.nii" --label "$d/lab.nii" --out "$d/ok.h5"
hdr=$(( 352 ))
vox=$(( 8 * 8 * 8 * 4 ))

# --- NIfTI headers that do not describe their file ---
cp "$d/img.nii" "$d/far.nii" && "$mkbad" vox-offset "$d/far.nii" 100000
ts_fails_on_all "vox_offset beyond the end of the file: refused naming the file" \
    "$d/far.nii: vox_offset 100000 lies beyond the end of the file ($((hdr + vox)) bytes)" 2 \
    ts_mpirun 2 "$tessera" convert nifti --image "$d/far.nii" --label "$d/lab.nii" --out "$d/x.h5"
cp "$d/img.nii" "$d/inhdr.nii" && "$mkbad" vox-offset "$d/inhdr.nii" 200
ts_fails_on_all "vox_offset inside the header: refused naming the file" \
    "$d/inhdr.nii: the header's vox_offset 200 is not a byte offset after the header" 2 \
    ts_mpirun 2 "$tessera" convert nifti --image "$d/inhdr.nii" --label "$d/lab.nii" --out "$d/x.h5"
cp "$d/img.nii" "$d/frac.nii" && "$mkbad" vox-offset "$d/frac.nii" 352.5
ts_fails_on_all "fractional vox_offset: refused naming the file" \
    "$d/frac.nii: the header's vox_offset 352.5 is not a byte offset" 2 \
    ts_mpirun 2 "$tessera" convert nifti --image "$d/frac.nii" --label "$d/lab.nii" --out "$d/x.h5"
cp "$d/img.nii" "$d/long.nii" && head -c 100 /dev/zero >>"$d/long.nii"
ts_fails_on_all "100 bytes more than the header describes: refused naming the file" \
    "$d/long.nii: 100 bytes follow the voxel data" 2 \
    ts_mpirun 2 "$tessera" convert nifti --image "$d/long.nii" --label "$d/lab.nii" --out "$d/x.h5"
cp "$d/img.nii" "$d/later.nii" && "$mkbad" vox-offset "$d/later.nii" 400
ts_fails_on_all "vox_offset 48 bytes late (the file is short by as much): refused naming the file" \
    "$d/later.nii: truncated" 2 \
    ts_mpirun 2 "$tessera" convert nifti --image "$d/later.nii" --label "$d/lab.nii" --out "$d/x.h5"
ts_check "no output left by the refused conversions" [ ! -e "$d/x.h5" ]

# --- non-finite voxels ---
for f in nan3.nii nan3.nii.gz; do
    ts_fails_on_all "$f with 3 non-finite voxels: refused, naming the file and the count" \
        "$d/$f: 3 non-finite voxels (NaN or Inf), the first is voxel (i=" 2 \
        ts_mpirun 2 "$tessera" convert nifti --image "$d/img.nii" --label "$d/lab.nii" --image "$d/$f" \
        --label "$d/lab.nii" --out "$d/x.h5"
done
ts_check "no output left" [ ! -e "$d/x.h5" ]
ts_step "--nan-to 0: converts" ts_mpirun 2 "$tessera" convert nifti --image "$d/img.nii" --label "$d/lab.nii" \
    --image "$d/nan3.nii.gz" --label "$d/lab.nii" --nan-to 0 --out "$d/fixed.h5"
ts_check "... with a warning naming the file and the count" sh -c \
    "printf '%s\n' \"\$1\" | grep -qF '$d/nan3.nii.gz: 3 non-finite voxels (NaN or Inf) replaced by 0 (--nan-to)'" _ "$ts_out"
if [ -n "$TS_PY" ]; then
    ts_step "... the stored image is finite, with 0 where the NaN and Inf were" "$TS_PY" -c "
import h5py, numpy as np, sys
with h5py.File(sys.argv[1], 'r') as f:
    names = [n.decode() if isinstance(n, bytes) else n for n in f['index']['name']]
    ims = [f['samples/%06d/image' % i][...] for i in range(len(names))]
for im in ims: assert np.isfinite(im).all()
nv = 512
bad = sorted(((k * 7 + nv // 3) % nv) for k in range(3))
flat = [im.reshape(-1) for im in ims]
ref = np.arange(nv) % 5
# one of the two samples is the repaired one: zeros at the bad voxels, the pattern elsewhere
hit = [i for i, v in enumerate(flat) if all(v[b] == 0 and ref[b] != 0 for b in bad if ref[b] != 0)]
assert hit, 'no sample has 0 at the replaced voxels'
print('replaced voxels', bad, 'are 0 in sample', hit)
" "$d/fixed.h5"
else
    ts_skip "... the stored image is finite" "no python3 with h5py, numpy"
fi
ts_fails_on_all "--nan-to nan is refused" "--nan-to 'nan' must be a finite float32 number" 2 \
    ts_mpirun 2 "$tessera" convert nifti --image "$d/img.nii" --label "$d/lab.nii" --nan-to nan --out "$d/x.h5"

# the dataset reader: a NaN written into a dataset behind the converter's back
ts_step "synth a dataset; a NaN in the middle of every image" sh -c \
    "'$tessera' synth --out '$d/syn.h5' --count 4 --size 12 --chunk 4 && '$mkbad' image-nan '$d/syn.h5'"
printf '[data]\npatch = 12\n[train]\nbatch = 2\n' >"$d/io.ini"
ts_fails_on_all "the dataset reader refuses non-finite voxels, naming the file and sample" \
    "$d/syn.h5: /samples/0000" 2 \
    ts_mpirun 2 "$tessera" bench io "$d/io.ini" "data.path=$d/syn.h5" --steps 2 --repeat 1
ts_check "... and says non-finite" sh -c "printf '%s\n' \"\$1\" | grep -q 'non-finite voxel'" _ "$ts_out"

# --- size arguments that would wrap around ---
ts_fails_on_all "bench coll --max-bytes 2^63: a clear error, no crash" "--max-bytes 9223372036854775808" 2 \
    ts_mpirun 2 "$tessera" bench coll --max-bytes 9223372036854775808
ts_fails_on_all "bench coll --max-bytes 2^64: out of range" "--max-bytes '18446744073709551616' is not a size" 2 \
    ts_mpirun 2 "$tessera" bench coll --max-bytes 18446744073709551616
ts_fails_on_all "bench coll --min-bytes -1" "--min-bytes" 2 \
    ts_mpirun 2 "$tessera" bench coll --min-bytes -1 --max-bytes 1024

# --- paths too long for their buffers: refused naming the key (run.dir: tests/train/faults.sh) ---
long=$d/$(printf 'p%.0s' $(seq 1 600)).h5
ts_fails_on_all "data.path of 600+ characters: refused naming the key" "the dataset path (data.path) is" 2 \
    ts_mpirun 2 "$tessera" bench io "$d/io.ini" "data.path=$long" --steps 1 --repeat 1
ts_finish
