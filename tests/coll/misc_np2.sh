#!/bin/sh
# topology, registered buffers, nonblocking, bad input on 2 ranks
. "$TS_SRCDIR/tests/mpi/lib.sh"
ts_mpirun 2 "$TS_BUILDDIR/tests/coll/test_coll_misc"
