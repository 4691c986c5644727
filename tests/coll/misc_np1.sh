#!/bin/sh
# topology, registered buffers, nonblocking, bad input on 1 ranks
. "$TS_SRCDIR/tests/mpi/lib.sh"
ts_mpirun 1 "$TS_BUILDDIR/tests/coll/test_coll_misc"
