#!/bin/sh
# spatial plan and halo exchange on every Cartesian layout of 4 rank(s)
. "$TS_SRCDIR/tests/mpi/lib.sh"
ts_mpirun 4 "$TS_BUILDDIR/tests/parallel/test_spatial"
