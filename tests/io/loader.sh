#!/bin/sh
# patches, augmentation, normalisation and the prefetching loader (one rank)
. "$TS_SRCDIR/tests/mpi/lib.sh"
d=$(mktemp -d "${TMPDIR:-/tmp}/ts-io.XXXXXX") || exit 1
trap 'rm -rf "$d"' EXIT
ts_mpirun 1 "$TS_BUILDDIR/tests/io/test_loader" "$d"
