#!/bin/sh
# Acceptance 3: bad input, on 2 ranks. Each case must fail on every rank with
# a message naming the problem and the file, leave no output file (and no
# temporary), and leave an existing dataset at the output path untouched.
# NIfTI side (tessera convert): truncated .nii and .nii.gz, garbage header,
# image/label grid mismatch, label values missing from the map, NaN voxels.
# HDF5 side (tessera bench io): truncated file, corrupted chunk (Fletcher-32),
# missing dataset, wrong dtype, wrong shape.
. "$TS_SRCDIR/tests/mpi/lib.sh"
. "$TS_SRCDIR/tests/io/lib_io.sh"
T=/usr/share/mricron/templates
if [ ! -f "$T/ch2.nii.gz" ] || [ ! -f "$T/aal.nii.gz" ]; then
    echo "1..0 # SKIP mricron-data is not installed ($T)"; exit 0
fi
d=$(mktemp -d "${TMPDIR:-/tmp}/ts-io.XXXXXX") || exit 1
trap 'rm -rf "$d"' EXIT
tessera="$TS_BUILDDIR/tessera"
mkbad="$TS_BUILDDIR/tests/io/mkbad"
K="$d/Task"
ts_step "make NIfTI inputs" "$TS_BUILDDIR/tests/io/mkmsd" "$T" "$K"
I0="$K/imagesTr/colin_000.nii.gz" L0="$K/labelsTr/colin_000.nii.gz"
I1="$K/imagesTr/colin_001.nii" L1="$K/labelsTr/colin_001.nii"
I4="$K/imagesTr/colin_004.nii.gz" L4="$K/labelsTr/colin_004.nii.gz"
out="$d/out.h5"
ts_step "a good conversion to the output path" \
    ts_mpirun 2 "$tessera" convert nifti --image "$I0" --label "$L0" --image "$I4" --label "$L4" --out "$out"
cksum "$out" > "$d/good.sum"

# the inputs
size1=$(wc -c < "$I1")
head -c $((size1 / 2)) "$I1" > "$d/trunc.nii"
size0=$(wc -c < "$I0")
head -c $((size0 / 2)) "$I0" > "$d/trunc.nii.gz"
head -c 1000 /dev/urandom > "$d/garbage.nii"
printf '0 0 background\n1 1 cerebrum\n' > "$d/two.txt"
grep -v '^45 ' "$TS_SRCDIR/configs/labelmaps/aal-3class.txt" > "$d/no45.txt"
"$mkbad" nan "$I0" "$d/nan.nii.gz" >/dev/null 2>&1

# convert_fails DESC TEXT ARGS...: fails on both ranks with TEXT; the old output is intact, nothing new
convert_fails() {
    _desc=$1; _text=$2; shift 2
    ts_fails_on_all "$_desc" "$_text" 2 ts_mpirun 2 "$tessera" convert nifti "$@" --out "$out"
    ts_check "$_desc: the existing dataset is untouched, no temporary left" \
        sh -c "cksum '$out' | cmp -s - '$d/good.sum' && ! ls '$d' | grep -q partial"
}
convert_fails "truncated .nii" "$d/trunc.nii: truncated" \
    --image "$I0" --label "$L0" --image "$d/trunc.nii" --label "$L1"
convert_fails "truncated .nii.gz" "$d/trunc.nii.gz" \
    --image "$I4" --label "$L4" --image "$d/trunc.nii.gz" --label "$L0"
ts_check "truncated .nii.gz: the message says truncated" sh -c "printf '%s' \"\$1\" | grep -q truncated" _ "$ts_out"
convert_fails "garbage header" "$d/garbage.nii: not a NIfTI file" \
    --image "$d/garbage.nii" --label "$L0" --image "$I4" --label "$L4"
convert_fails "image/label grid mismatch" "grid mismatch: image $I0 is 40 x 48 x 36, label $L1 is 32 x 40 x 44" \
    --image "$I4" --label "$L4" --image "$I0" --label "$L1"
convert_fails "label value missing from the map" "label value 2 at voxel" \
    --image "$I0" --label "$L0" --image "$I4" --label "$L4" --label-map "$d/two.txt"
convert_fails "AAL value 45 missing from the map (full atlas)" "$T/aal.nii.gz: label value 45 at voxel" \
    --image "$T/ch2.nii.gz" --label "$T/aal.nii.gz" --label-map "$d/no45.txt"
convert_fails "NaN voxels" "$d/nan.nii.gz: 1 non-finite voxel (NaN or Inf), the first is voxel (i=" \
    --image "$I4" --label "$L4" --image "$d/nan.nii.gz" --label "$L0"
ts_fails_on_all "a missing input file" "cannot open" 2 \
    ts_mpirun 2 "$tessera" convert nifti --image "$d/none.nii.gz" --label "$L0" --out "$d/x.h5"
ts_check "no output for a missing input" [ ! -e "$d/x.h5" ]
ts_fails_on_all "msd: a folder without dataset.json" "dataset.json" 2 \
    ts_mpirun 2 "$tessera" convert msd "$d" --out "$d/x.h5" --shards 2
ts_check "no manifest or shard left behind" sh -c "! ls '$d' | grep -q '^x'"

# HDF5 side, read through bench io
ts_step "synth a dataset to damage" "$tessera" synth --out "$d/good.h5" --count 4 --size 20 --chunk 8
for c in trunc corrupt drop dtype shape; do cp "$d/good.h5" "$d/$c.h5"; done
head -c $(($(wc -c < "$d/good.h5") / 2)) "$d/good.h5" > "$d/trunc.h5"
"$mkbad" corrupt-chunk "$d/corrupt.h5" >/dev/null
"$mkbad" drop-label "$d/drop.h5"
"$mkbad" label-dtype "$d/dtype.h5"
"$mkbad" label-shape "$d/shape.h5"
printf '[data]\npatch = 8\n[train]\nbatch = 2\n' > "$d/io.ini"
bench_fails() {
    ts_fails_on_all "$1" "$2" 2 ts_mpirun 2 "$tessera" bench io "$d/io.ini" "data.path=$d/$3" --steps 2 --repeat 1
}
ts_step "bench io reads the intact dataset" \
    ts_mpirun 2 "$tessera" bench io "$d/io.ini" "data.path=$d/good.h5" --steps 2 --repeat 1
bench_fails "HDF5 file truncated" "cannot open dataset $d/trunc.h5 (HDF5: truncated file" trunc.h5
bench_fails "corrupted chunk (Fletcher-32)" "$d/corrupt.h5: /samples/000001/image: Fletcher-32 checksum mismatch" corrupt.h5
bench_fails "missing dataset" "$d/drop.h5: dataset /samples/000001/label (sample 'synth_000001') is missing" drop.h5
bench_fails "wrong dtype" "$d/dtype.h5: /samples/000001/label must be uint8" dtype.h5
bench_fails "wrong shape" "$d/shape.h5: /samples/000001/label has extent 21 in dimension 0, the index says 20" shape.h5
bench_fails "not an HDF5 file" "$d/trunc.nii is not an HDF5 file" trunc.nii
ts_step "synth a sharded dataset" "$tessera" synth --out "$d/sh.h5" --count 4 --size 12 --shards 2
rm -f "$d/sh-shard-00001-of-00002.h5"
bench_fails "a shard file is missing" "cannot open shard $d/sh-shard-00001-of-00002.h5: No such file" sh.h5
ts_finish
