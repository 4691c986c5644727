#!/bin/sh
# topology, nonblocking, bad input on 4 ranks in fake nodes of 2
. "$TS_SRCDIR/tests/mpi/lib.sh"
TESSERA_RANKS_PER_NODE=2 ts_mpirun 4 "$TS_BUILDDIR/tests/coll/test_coll_misc"
