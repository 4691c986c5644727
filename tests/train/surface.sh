#!/bin/sh
# HD95 and NSD of src/infer/surface.c against SciPy's distance transform on
# synthetic shapes (tests/train/surface_ref.py; issue [11] acceptance 3).
. "$TS_SRCDIR/tests/mpi/lib.sh"
py=${TS_PYTHON:-/usr/bin/python3}
if ! "$py" -c 'import numpy, scipy.ndimage' 2>/dev/null; then
    echo "1..0 # SKIP $py has no numpy/scipy (Debian: python3-scipy)"
    exit 0
fi
d=$(mktemp -d "${TMPDIR:-/tmp}/tessera-surface.XXXXXX")
trap 'rm -rf "$d"' EXIT
"$py" "$TS_SRCDIR/tests/train/surface_ref.py" make "$d" || { echo "not ok 1 - surface_ref.py make"; exit 1; }
"$TS_BUILDDIR/tests/train/test_surface" "$d" >"$d/out.txt" || { echo "1..1"; echo "not ok 1 - test_surface $d failed"; exit 1; }
"$py" "$TS_SRCDIR/tests/train/surface_ref.py" check "$d" "$d/out.txt"
