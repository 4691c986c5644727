#!/bin/sh
# io units: Fletcher-32 against HDF5's filter, label maps, NIfTI round trips
. "$TS_SRCDIR/tests/mpi/lib.sh"
d=$(mktemp -d "${TMPDIR:-/tmp}/ts-io.XXXXXX") || exit 1
trap 'rm -rf "$d"' EXIT
ts_mpirun 1 "$TS_BUILDDIR/tests/io/test_units" "$d"
