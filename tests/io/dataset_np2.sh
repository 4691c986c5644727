#!/bin/sh
# dataset writer and reader on 2 rank(s): one file, shards, boxes, collective slabs
. "$TS_SRCDIR/tests/mpi/lib.sh"
d=$(mktemp -d "${TMPDIR:-/tmp}/ts-io.XXXXXX") || exit 1
trap 'rm -rf "$d"' EXIT
ts_mpirun 2 "$TS_BUILDDIR/tests/io/test_dataset" "$d"
