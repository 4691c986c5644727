#!/bin/sh
# topology, registered buffers, nonblocking, bad input on 3 ranks
. "$TS_SRCDIR/tests/mpi/lib.sh"
ts_mpirun 3 "$TS_BUILDDIR/tests/coll/test_coll_misc"
