#!/bin/sh
# spatial parallelism in the loader on 2 ranks: every rank's box of every patch
# bit for bit the whole patch's, its share of the bytes, errors on every rank
. "$TS_SRCDIR/tests/mpi/lib.sh"
d=$(mktemp -d "${TMPDIR:-/tmp}/ts-io.XXXXXX") || exit 1
trap 'rm -rf "$d"' EXIT
ts_mpirun 2 "$TS_BUILDDIR/tests/io/test_subbox" "$d"
