#!/bin/sh
# the spatial augmentation (rotation, zoom, elastic) against what it must
# equal: plain crops, rot90 crops, voxel picks; draws and their counts
. "$TS_SRCDIR/tests/mpi/lib.sh"
d=$(mktemp -d "${TMPDIR:-/tmp}/ts-io.XXXXXX") || exit 1
trap 'rm -rf "$d"' EXIT
ts_mpirun 1 "$TS_BUILDDIR/tests/io/test_augment_spatial" "$d"
