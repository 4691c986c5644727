#!/bin/sh
# Acceptance 1: Colin27 (ch2) with the AAL atlas grouped by a label map, converted
# on 2 ranks; the dataset is read back by h5dump and cross-checked with h5py and
# nibabel (voxels, probes, class histogram of the mapped atlas, statistics, geometry).
. "$TS_SRCDIR/tests/mpi/lib.sh"
. "$TS_SRCDIR/tests/io/lib_io.sh"
T=/usr/share/mricron/templates
if [ ! -f "$T/ch2.nii.gz" ] || [ ! -f "$T/aal.nii.gz" ]; then
    echo "1..0 # SKIP mricron-data is not installed ($T)"; exit 0
fi
d=$(mktemp -d "${TMPDIR:-/tmp}/ts-io.XXXXXX") || exit 1
trap 'rm -rf "$d"' EXIT
tessera="$TS_BUILDDIR/tessera"
for map in aal-3class aal-hemispheres; do
    m="$TS_SRCDIR/configs/labelmaps/$map.txt"
    ts_step "convert ch2 + aal with $map on 2 ranks" \
        ts_mpirun 2 "$tessera" convert nifti --image "$T/ch2.nii.gz" --label "$T/aal.nii.gz" \
        --label-map "$m" --out "$d/$map.h5"
    ts_check "$map: the dataset exists, no temporary left" [ -f "$d/$map.h5" ] && [ ! -e "$d/$map.h5.partial" ]
    ts_step "$map: h5dump reads the schema" sh -c "h5dump -H '$d/$map.h5' >/dev/null"
    ts_check "$map: h5dump shows the format attribute" \
        sh -c "h5dump -a /format '$d/$map.h5' | grep -q tessera-dataset"
    if [ -n "$TS_PY" ]; then
        ts_step "$map: h5py/nibabel cross-check" "$TS_PY" "$TS_SRCDIR/tests/io/check_nifti.py" "$d/$map.h5" \
            "$T/ch2.nii.gz" "$T/aal.nii.gz" "$m"
    else
        ts_skip "$map: h5py/nibabel cross-check" "no python3 with h5py, nibabel, numpy (Debian: python3-h5py python3-nibabel)"
    fi
done
ts_finish
